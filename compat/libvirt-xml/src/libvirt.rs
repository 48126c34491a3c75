//! Running libvirt's own tools on an exported domain: the schema check
//! (`virt-xml-validate FILE domain`, Debian package libvirt-clients + libxml2-utils) and the argv
//! libvirt would start QEMU with (`virsh -c 'qemu:///embed?root=DIR' domxml-to-native qemu-argv
//! FILE`, packages libvirt-clients + libvirt-daemon-driver-qemu; no daemon is involved).
//!
//! Two settings keep the embedded QEMU driver fast (0.1-0.3 s per call instead of a minute of
//! capability re-probing; measured here with libvirt 9.0 and QEMU 7.2): `DIR/etc/qemu.conf` sets
//! `user = "root"` and `group = "root"` (so the probe runs as a user that can open `/dev/kvm` and
//! its cached capabilities stay valid), and the same `DIR` is reused, so the capabilities cache
//! under `DIR/cache` is probed once (about 4 s) and then read. As root, `virsh` runs in fresh
//! network and mount namespaces (`unshare -n -m`): domxml-to-native opens taps for
//! `<interface type="ethernet">`, and hugepage domains need a hugetlbfs, mounted at
//! `DIR/hugepages` inside that namespace only. The privileged embedded driver also resolves its
//! compiled-in user and group `libvirt-qemu` before it reads `qemu.conf` ("Failed to parse user
//! 'libvirt-qemu'"); Debian's libvirt-daemon-system creates them, but we do not install the
//! daemon and do not add users to the host: inside the same mount namespace `/etc/passwd` and
//! `/etc/group` are bind-mounted over by copies (`DIR/etc/passwd`, `DIR/etc/group`) that add the
//! entries when the host lacks them, so a freshly installed machine needs nothing else.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::CompatError;

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

fn write(path: &Path, text: &str) -> Result<(), CompatError> {
    std::fs::write(path, text).map_err(|source| CompatError::WriteTemp {
        path: path.to_path_buf(),
        source,
    })
}

fn run(
    mut cmd: Command,
    program: &'static str,
    package: &'static str,
) -> Result<String, CompatError> {
    let out = cmd.output().map_err(|source| CompatError::SpawnTool {
        program,
        package,
        source,
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        // libvirt prefixes errors with info lines (version, hostname); keep the error lines.
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.contains(": info : ") && !l.contains(": warning : "))
            .collect();
        return Err(CompatError::ToolFailed {
            program,
            stderr: errors.join("\n").trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The user the privileged embedded QEMU driver resolves (Debian's `--with-qemu-user`); `nobody`'s
/// ids, since `qemu.conf` makes QEMU run as root anyway.
const LIBVIRT_QEMU_PASSWD: &str =
    "libvirt-qemu:x:65534:65534:libvirt embedded driver (qlauncher compare):/nonexistent:/usr/sbin/nologin";
/// Its group (Debian's `--with-qemu-group`).
const LIBVIRT_QEMU_GROUP: &str = "libvirt-qemu:x:65534:";

/// `db` (an `/etc/passwd` or `/etc/group` text) with `entry` appended unless an entry of the same
/// name is there.
fn with_entry(db: &str, entry: &str) -> String {
    let name = entry.split(':').next().unwrap_or_default();
    let mut out = db.to_string();
    if !db.lines().any(|l| l.split(':').next() == Some(name)) {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(entry);
        out.push('\n');
    }
    out
}

/// Writes `path` under a temporary name and renames it, so a concurrent `virsh` bind-mounting
/// it never sees a half-written file.
fn write_replacing(path: &Path, text: &str) -> Result<(), CompatError> {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}.{n}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    write(&tmp, text)?;
    std::fs::rename(&tmp, path).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        CompatError::WriteTemp {
            path: path.to_path_buf(),
            source,
        }
    })
}

/// A directory holding a domain XML file for the duration of one tool run; removed on drop.
struct TempXml {
    path: PathBuf,
}

impl TempXml {
    fn new(dir: &Path, xml: &str) -> Result<Self, CompatError> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("qlauncher-compat-{}-{n}.xml", std::process::id()));
        write(&path, xml)?;
        Ok(TempXml { path })
    }
}

impl Drop for TempXml {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Checks `xml` against libvirt's domain schema with `virt-xml-validate FILE domain`.
///
/// Errors: the tool is missing ([`CompatError::SpawnTool`]) or rejects the document
/// ([`CompatError::ToolFailed`] with its message).
pub fn validate(xml: &str) -> Result<(), CompatError> {
    let tmp = TempXml::new(&std::env::temp_dir(), xml)?;
    let mut cmd = Command::new("virt-xml-validate");
    cmd.arg(&tmp.path).arg("domain");
    run(cmd, "virt-xml-validate", "libvirt-clients libxml2-utils").map(|_| ())
}

/// An embedded QEMU driver root (`qemu:///embed?root=DIR`) set up for fast offline use.
#[derive(Debug)]
pub struct EmbedRoot {
    dir: PathBuf,
    remove: bool,
}

impl EmbedRoot {
    /// Uses (and keeps) `dir`, writing `etc/qemu.conf` there.
    pub fn keep(dir: &Path) -> Result<Self, CompatError> {
        Self::setup(dir, false)
    }

    /// Uses `dir` and removes it on drop (tests).
    pub fn temporary(dir: &Path) -> Result<Self, CompatError> {
        Self::setup(dir, true)
    }

    /// The default persistent root: `$XDG_CACHE_HOME/qlauncher-compat/libvirt-embed`, else
    /// `$HOME/.cache/...`, else `/var/tmp/qlauncher-compat-libvirt-embed`.
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
            return PathBuf::from(d).join("qlauncher-compat/libvirt-embed");
        }
        if let Some(h) = std::env::var_os("HOME") {
            return PathBuf::from(h).join(".cache/qlauncher-compat/libvirt-embed");
        }
        PathBuf::from("/var/tmp/qlauncher-compat-libvirt-embed")
    }

    fn setup(dir: &Path, remove: bool) -> Result<Self, CompatError> {
        let etc = dir.join("etc");
        let hugepages = dir.join("hugepages");
        for d in [&etc, &hugepages] {
            std::fs::create_dir_all(d).map_err(|source| CompatError::WriteTemp {
                path: d.to_path_buf(),
                source,
            })?;
        }
        let mut conf = String::from("user = \"root\"\ngroup = \"root\"\n");
        if is_root() {
            // Mounted privately for each virsh run (see `domxml_to_native`).
            conf.push_str(&format!("hugetlbfs_mount = \"{}\"\n", hugepages.display()));
        }
        write(&etc.join("qemu.conf"), &conf)?;
        if is_root() {
            for (file, entry) in [
                ("passwd", LIBVIRT_QEMU_PASSWD),
                ("group", LIBVIRT_QEMU_GROUP),
            ] {
                let host =
                    std::fs::read_to_string(Path::new("/etc").join(file)).unwrap_or_default();
                write_replacing(&etc.join(file), &with_entry(&host, entry))?;
            }
        }
        Ok(EmbedRoot {
            dir: dir.to_path_buf(),
            remove,
        })
    }

    /// The root directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// libvirt's QEMU argv for `xml`, without the environment assignments and the binary.
    ///
    /// Errors: `virsh` missing or failing (its error text, e.g. an unsupported configuration),
    /// or output that does not split into shell words.
    pub fn domxml_to_native(&self, xml: &str) -> Result<Vec<String>, CompatError> {
        let tmp = TempXml::new(&self.dir, xml)?;
        let uri = format!("qemu:///embed?root={}", self.dir.display());
        let mut cmd = if is_root() {
            // A private network namespace (domxml-to-native opens taps for ethernet
            // interfaces) and mount namespace with a hugetlbfs for hugepage domains. The paths
            // are passed as arguments, never spliced into the script.
            // `/etc/passwd` and `/etc/group` with `libvirt-qemu` (see the module docs), in this
            // mount namespace only.
            let mut c = Command::new("unshare");
            c.args(["-n", "-m", "sh", "-c"])
                .arg(
                    "mount -t hugetlbfs none \"$0\" 2>/dev/null; \
                     mount --bind \"$1\" /etc/passwd && mount --bind \"$2\" /etc/group || exit 125; \
                     shift 2; exec virsh \"$@\"",
                )
                .arg(self.dir.join("hugepages"))
                .arg(self.dir.join("etc/passwd"))
                .arg(self.dir.join("etc/group"));
            c
        } else {
            Command::new("virsh")
        };
        cmd.arg("-c")
            .arg(uri)
            .arg("domxml-to-native")
            .arg("qemu-argv")
            .arg(&tmp.path);
        let out = run(cmd, "virsh", "libvirt-clients libvirt-daemon-driver-qemu")?;
        let words = shlex::split(out.trim()).ok_or(CompatError::SplitArgv)?;
        Ok(words
            .into_iter()
            .skip_while(|w| !w.starts_with('/') && w.contains('='))
            .skip(1)
            .collect())
    }
}

impl Drop for EmbedRoot {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Attributes KubeVirt v1.9 (libvirt 11.10) writes that Debian 12's libvirt 9.0 schema does not
/// know yet, as (element, attribute): removed by [`for_libvirt9`] before validating here.
pub const NEWER_THAN_LIBVIRT9: &[(&str, &str)] = &[("blockio", "discard_granularity")];

/// Children KubeVirt v1.9 (libvirt 11.10) writes that Debian 12's libvirt 9.0 schema does not
/// know yet, as (parent, child): removed by [`for_libvirt9`] before validating here (the
/// Hyper-V TLB flush's `direct` and `extended`, `hv-tlbflush-direct`/`-ext`).
pub const NEWER_CHILDREN_THAN_LIBVIRT9: &[(&str, &str)] =
    &[("tlbflush", "direct"), ("tlbflush", "extended")];

/// `xml` adapted to Debian 12's libvirt 9.0, for its schema check and domxml-to-native: without
/// the [`NEWER_THAN_LIBVIRT9`] attributes and [`NEWER_CHILDREN_THAN_LIBVIRT9`] elements (one a
/// line, as [`crate::to_xml`] writes them), and `<maxMemory slots="0">` (virtio-mem only, which
/// libvirt 11 accepts) as `slots="1"` (libvirt 9.0 insists on DIMM slots).
pub fn for_libvirt9(xml: &str) -> String {
    let mut out = String::with_capacity(xml.len());
    let mut parent: Option<&str> = None;
    for line in xml.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if let Some(p) = parent {
            if trimmed.starts_with(&format!("</{p}>")) {
                parent = None;
            } else if NEWER_CHILDREN_THAN_LIBVIRT9
                .iter()
                .any(|(q, c)| *q == p && trimmed.starts_with(&format!("<{c} ")))
            {
                continue;
            }
        }
        if let Some((p, _)) = NEWER_CHILDREN_THAN_LIBVIRT9.iter().find(|(p, _)| {
            trimmed.starts_with(&format!("<{p} ")) && !trimmed.trim_end().ends_with("/>")
        }) {
            parent = Some(p);
        }
        let mut line = line.to_string();
        if line.trim_start().starts_with("<maxMemory ") {
            line = line.replace(" slots=\"0\"", " slots=\"1\"");
        }
        for (element, attr) in NEWER_THAN_LIBVIRT9 {
            if line.trim_start().starts_with(&format!("<{element} ")) {
                let needle = format!(" {attr}=\"");
                if let Some(start) = line.find(&needle) {
                    let rest = &line[start + needle.len()..];
                    if let Some(end) = rest.find('"') {
                        let cut = start + needle.len() + end + 1;
                        line.replace_range(start..cut, "");
                    }
                }
            }
        }
        out.push_str(&line);
    }
    out
}

/// The installed `qemu-system-x86_64`'s version (what libvirt probes), from `--version`.
pub fn installed_qemu() -> Option<qlauncher_core::cmdline::context::QemuVersion> {
    let out = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text.split_whitespace().nth(3)?;
    qlauncher_core::cmdline::context::QemuVersion::parse(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_libvirt_qemu_entry_is_added_once() {
        let host = "root:x:0:0:root:/root:/bin/bash";
        let added = with_entry(host, LIBVIRT_QEMU_PASSWD);
        assert_eq!(added, format!("{host}\n{LIBVIRT_QEMU_PASSWD}\n"));
        assert_eq!(with_entry(&added, LIBVIRT_QEMU_PASSWD), added);
        let own = "libvirt-qemu:x:64055:64055::/var/lib/libvirt:/usr/sbin/nologin\n";
        assert_eq!(with_entry(own, LIBVIRT_QEMU_PASSWD), own);
        assert_eq!(
            with_entry("", LIBVIRT_QEMU_GROUP),
            format!("{LIBVIRT_QEMU_GROUP}\n")
        );
    }
}
