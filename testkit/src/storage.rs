//! Shared helpers of the storage integration tests: temporary directories, tmpfs mounts and the
//! real image tools (`qemu-img`, `qemu-io`, `isoinfo`, `blkid`), each guarded so it cleans up on
//! failure and is safe to run in parallel (names carry the pid and a counter).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A unique name stem: `<prefix>-<pid>-<n>`.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", crate::unique())
}

/// A temporary directory removed on drop (after clearing immutable flags set by a test).
pub struct Scratch {
    /// The directory.
    pub path: PathBuf,
}

impl Scratch {
    /// Creates `<tmp>/qlauncher-<prefix>-<pid>-<n>`.
    pub fn new(prefix: &str) -> Scratch {
        let path = std::env::temp_dir().join(unique(&format!("qlauncher-{prefix}")));
        std::fs::create_dir_all(&path).expect("create scratch dir");
        Scratch { path }
    }

    /// `<dir>/<rel>` (not created).
    pub fn join(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    /// Creates `rel` (a directory) and returns it.
    pub fn dir(&self, rel: &str) -> PathBuf {
        let dir = self.path.join(rel);
        std::fs::create_dir_all(&dir).expect("create dir");
        dir
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = Command::new("chattr")
            .arg("-R")
            .arg("-i")
            .arg(&self.path)
            .output();
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A tmpfs of `size` mounted on a fresh directory; unmounted and removed on drop.
pub struct Tmpfs {
    /// The mount point.
    pub path: PathBuf,
}

impl Tmpfs {
    /// A ramfs instead (no size limit, no O_DIRECT on any kernel).
    pub fn ramfs() -> Tmpfs {
        let path = std::env::temp_dir().join(unique("qlauncher-ramfs"));
        std::fs::create_dir_all(&path).expect("create mount point");
        let guard = Tmpfs { path };
        run(
            "mount",
            &["-t", "ramfs", "ramfs", guard.path.to_str().unwrap()],
        );
        guard
    }

    /// A tmpfs of `size` (`mount -o size=`, e.g. `4M`), mode 0755.
    pub fn new(size: &str) -> Tmpfs {
        let path = std::env::temp_dir().join(unique("qlauncher-tmpfs"));
        std::fs::create_dir_all(&path).expect("create mount point");
        let guard = Tmpfs { path };
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
                guard.path.to_str().unwrap(),
            ],
        );
        guard
    }

    /// Every name in the tmpfs, recursively, relative to its root.
    pub fn listing(&self) -> Vec<String> {
        let mut out = Vec::new();
        list(&self.path, &self.path, &mut out);
        out.sort();
        out
    }
}

fn list(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        out.push(path.strip_prefix(root).unwrap().display().to_string());
        if path.is_dir() {
            list(root, &path, out);
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).output();
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// A loop device over `file`; detached on drop.
pub struct LoopDevice {
    /// `/dev/loopN`.
    pub path: PathBuf,
}

impl LoopDevice {
    /// Attaches `file` read-only (`losetup -f --show -r`).
    pub fn new(file: &Path) -> LoopDevice {
        let out = run("losetup", &["-f", "--show", "-r", file.to_str().unwrap()]);
        LoopDevice {
            path: PathBuf::from(out.trim()),
        }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).output();
    }
}

/// Runs a tool, panics with its output unless it succeeds, returns its stdout.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = crate::process::output(&argv(program, args));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a tool and returns (success, stdout + stderr).
pub fn try_run(program: &str, args: &[&str]) -> (bool, String) {
    crate::process::try_run(&argv(program, args))
}

fn argv<'a>(program: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    std::iter::once(program)
        .chain(args.iter().copied())
        .collect()
}

/// `qemu-img info --output=json` as JSON.
pub fn qemu_img_info(path: &Path) -> serde_json::Value {
    let out = run(
        "qemu-img",
        &["info", "--output=json", "-U", path.to_str().unwrap()],
    );
    serde_json::from_str(&out).expect("qemu-img info json")
}

/// Asserts `qemu-img check` finds no errors.
pub fn assert_qemu_img_check_clean(path: &Path) {
    let out = run("qemu-img", &["check", path.to_str().unwrap()]);
    assert!(
        out.contains("No errors were found on the image."),
        "qemu-img check {}: {out}",
        path.display()
    );
}

/// Runs one `qemu-io` command on an image and asserts it reports no failure.
pub fn qemu_io(path: &Path, format: &str, command: &str) -> String {
    let out = run(
        "qemu-io",
        &["-f", format, "-c", command, path.to_str().unwrap()],
    );
    assert!(
        !out.contains("failed") && !out.contains("error"),
        "qemu-io {command:?} on {}: {out}",
        path.display()
    );
    out
}

/// A qcow2 image made by qemu-img (a test fixture, like a containerDisk built elsewhere).
pub fn qemu_img_create(path: &Path, size: &str, backing: Option<(&Path, &str)>) {
    let mut args = vec!["create", "-q", "-f", "qcow2"];
    let backing_str;
    if let Some((b, fmt)) = backing {
        backing_str = b.to_str().unwrap().to_string();
        args.extend(["-b", backing_str.as_str(), "-F", fmt]);
    }
    args.push(path.to_str().unwrap());
    if !size.is_empty() {
        args.push(size);
    }
    run("qemu-img", &args);
}

/// A qcow2 image of `size` whose header names `backing` (format `format`) as its backing file,
/// made without qemu-img opening the backing file (`-u`): an untrusted image as a user hands it
/// in (a backing file outside the roots, a relative climb, a protocol name).
pub fn qemu_img_create_unchecked(path: &Path, size: &str, backing: &str, format: &str) {
    let path = path.to_str().expect("UTF-8 path");
    run(
        "qemu-img",
        &[
            "create", "-q", "-f", "qcow2", "-u", "-b", backing, "-F", format, path, size,
        ],
    );
}

/// (mode & 0o7777, uid, gid) of a path.
pub fn mode_owner(path: &Path) -> (u32, u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).unwrap();
    (meta.mode() & 0o7777, meta.uid(), meta.gid())
}

/// The SHA-256 of the file at `path` as `sha256sum` prints it (lower-case hex): to show an image
/// is unchanged.
pub fn sha256(path: &Path) -> String {
    crate::run(&["sha256sum", &path.display().to_string()])
        .split_whitespace()
        .next()
        .expect("sha256sum prints the sum")
        .to_string()
}

/// Whether `needle` occurs anywhere in `haystack` (a marker the guest wrote, found in an image).
pub fn contains_bytes(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
