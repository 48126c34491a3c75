//! container-disk and virt-tail as KubeVirt v1.9.0 runs them (`kubevirt-launcher-image.md`
//! §1.2-1.3, §3.1-3.2): as uid 107 over kubelet-style emptyDirs (root-owned, group 107, mode 2777
//! setgid), container-disk statically linked inside an otherwise empty root (a `FROM scratch`
//! containerDisk image):
//! - container-disk: `--no-op` exits 0, bad options exit 1; `--copy-path P` holds `P.sock` (a
//!   connection's peer is the holder, as virt-handler's `SO_PEERCRED` reads it) until the socket
//!   is removed (exit 0) or SIGTERM (exit 0, socket gone); SIGINT kills it; a stale socket or a
//!   missing grand-parent directory exits 1; one missing directory level is made.
//! - virt-tail: waits for the log, writes complete lines only, follows appends, truncation and
//!   replacement, ignores unknown flags, exits 1 without `--logfile`, 0 on SIGTERM or SIGINT.
//!
//! Needs root (chroot, users). The static build is the image's (`scripts/build-companions`:
//! `-C target-feature=+crt-static`), in the dev profile and a target directory of its own.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

const QEMU_UID: u32 = 107;

/// The static container-disk, built once per test process as scripts/build-companions builds it
/// (same target and flags; dev profile, no cmd client).
fn static_container_disk() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("companions-static");
        let status = Command::new(env!("CARGO"))
            .args([
                "build",
                "--offline",
                "--quiet",
                "-p",
                "qlauncher-companions",
                "--no-default-features",
                "--bin",
                "container-disk",
                "--target",
                "x86_64-unknown-linux-gnu",
                "--target-dir",
            ])
            .arg(&target_dir)
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("CARGO_TARGET_DIR")
            .env("RUSTFLAGS", "-C target-feature=+crt-static")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo");
        assert!(status.success(), "static build of container-disk failed");
        target_dir.join("x86_64-unknown-linux-gnu/debug/container-disk")
    })
}

/// A kubelet emptyDir: root-owned, group 107, mode 2777.
fn empty_dir(path: &Path) {
    std::fs::create_dir_all(path).unwrap();
    std::os::unix::fs::chown(path, Some(0), Some(QEMU_UID)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o2777)).unwrap();
}

/// Runs as 107:107 (supplementary 107, as fsGroup gives), after `chroot(root)` when given, with
/// SIGINT and SIGTERM at their default actions as a container's process starts (a test run
/// started in the background of a shell inherits SIGINT ignored).
fn as_qemu(cmd: &mut Command, root: Option<PathBuf>) -> &mut Command {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            for sig in [
                nix::sys::signal::Signal::SIGINT,
                nix::sys::signal::Signal::SIGTERM,
            ] {
                nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl)?;
            }
            if let Some(root) = &root {
                nix::unistd::chroot(root.as_path())?;
                nix::unistd::chdir("/")?;
            }
            let gid = nix::unistd::Gid::from_raw(QEMU_UID);
            nix::unistd::setgroups(&[gid])?;
            nix::unistd::setgid(gid)?;
            nix::unistd::setuid(nix::unistd::Uid::from_raw(QEMU_UID))?;
            Ok(())
        })
    }
}

fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_until(what: &str, timeout: Duration, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "no {what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
}

fn is_static_elf(path: &Path) -> bool {
    // No PT_INTERP program header: no dynamic loader.
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF");
    let phoff = u64::from_le_bytes(bytes[32..40].try_into().unwrap()) as usize;
    let phentsize = u16::from_le_bytes([bytes[54], bytes[55]]) as usize;
    let phnum = u16::from_le_bytes([bytes[56], bytes[57]]) as usize;
    (0..phnum).all(|i| {
        let p = &bytes[phoff + i * phentsize..];
        u32::from_le_bytes(p[..4].try_into().unwrap()) != 3
    })
}

#[test]
fn container_disk_is_static_and_holds_its_socket_in_an_empty_root_as_uid_107() {
    let bin = static_container_disk();
    assert!(is_static_elf(bin), "{} has an interpreter", bin.display());
    let ldd = Command::new("ldd").arg(bin).output().unwrap();
    let ldd_text =
        String::from_utf8_lossy(&ldd.stdout).to_string() + &String::from_utf8_lossy(&ldd.stderr);
    assert!(
        ldd_text.contains("not a dynamic executable") || ldd_text.contains("statically linked"),
        "ldd: {ldd_text}"
    );

    // The containerDisk container: the image holds only a disk; the kubelet mounts
    // virt-bin-share-dir (the copied binary) at /usr/bin and container-disks at
    // /var/run/kubevirt/container-disks/<vmi-uid>. Here the same files, in place.
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("root");
    std::fs::create_dir_all(root.join("disk")).unwrap();
    std::fs::write(root.join("disk/disk.qcow2"), b"not really a disk").unwrap();
    empty_dir(&root.join("usr/bin"));
    std::fs::copy(bin, root.join("usr/bin/container-disk")).unwrap();
    let disks = root.join("var/run/kubevirt/container-disks/uid-1");
    empty_dir(&disks);

    let run = |args: &[&str]| {
        let mut cmd = Command::new("/usr/bin/container-disk");
        cmd.args(args).env_clear().stderr(Stdio::piped());
        as_qemu(&mut cmd, Some(root.clone()));
        cmd
    };
    // volume*-init: --no-op exits 0 at once.
    let out = run(&["--no-op"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stderr.is_empty());
    // Options as getopt_long reads them: an unknown one before --no-op exits 1.
    assert_eq!(
        run(&["--bogus", "--no-op"]).output().unwrap().status.code(),
        Some(1)
    );
    assert_eq!(run(&["--no-op=1"]).output().unwrap().status.code(), Some(1));
    assert_eq!(run(&["-c"]).output().unwrap().status.code(), Some(1));
    let long = format!("/var/run/{}", "x".repeat(100));
    let out = run(&["--copy-path", &long]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("error: copy path can not be longer than 102 characters"));

    // The holder: binds disk_0.sock, answers connections; the peer is the holder.
    let copy_path = "/var/run/kubevirt/container-disks/uid-1/disk_0";
    let mut holder = run(&["--copy-path", copy_path]).spawn().unwrap();
    let sock = disks.join("disk_0.sock");
    wait_until("disk_0.sock", Duration::from_secs(10), || sock.exists());
    assert_eq!(std::fs::metadata(&sock).unwrap().uid(), QEMU_UID);
    for _ in 0..3 {
        let conn = UnixStream::connect(&sock).unwrap();
        let cred = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials)
            .unwrap();
        assert_eq!(cred.pid() as u32, holder.id());
        assert_eq!(cred.uid(), QEMU_UID);
    }
    // A second holder on the same path: the stale socket makes bind fail, exit 1.
    let out = run(&["--copy-path", copy_path]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("failed to bind socket"),
        "{out:?}"
    );
    assert!(holder.try_wait().unwrap().is_none(), "the holder ended");
    // virt-launcher-monitor removes the sockets on exit: the holder ends with 0 within ~1 s.
    std::fs::remove_file(&sock).unwrap();
    let status = wait_exit(&mut holder, Duration::from_secs(5)).expect("holder still running");
    assert_eq!(status.code(), Some(0));

    // SIGTERM: socket unlinked, exit 0.
    let mut holder = run(&["--copy-path", copy_path]).spawn().unwrap();
    wait_until("disk_0.sock", Duration::from_secs(10), || sock.exists());
    signal(&holder, nix::sys::signal::Signal::SIGTERM);
    let status = wait_exit(&mut holder, Duration::from_secs(5)).expect("holder still running");
    assert_eq!(status.code(), Some(0));
    assert!(!sock.exists(), "SIGTERM left the socket");

    // SIGINT keeps its default action (the socket stays; the kubelet never sends it).
    let mut holder = run(&["--copy-path", copy_path]).spawn().unwrap();
    wait_until("disk_0.sock", Duration::from_secs(10), || sock.exists());
    signal(&holder, nix::sys::signal::Signal::SIGINT);
    let status = wait_exit(&mut holder, Duration::from_secs(5)).expect("holder still running");
    assert_eq!(status.signal(), Some(libc::SIGINT));
    std::fs::remove_file(&sock).unwrap();

    // One missing directory level is made (0777 less the umask); two are an error.
    let mut holder = run(&[
        "--copy-path",
        "/var/run/kubevirt/container-disks/uid-1/new/hp",
    ])
    .spawn()
    .unwrap();
    let made = disks.join("new/hp.sock");
    wait_until("new/hp.sock", Duration::from_secs(10), || made.exists());
    signal(&holder, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        wait_exit(&mut holder, Duration::from_secs(5))
            .unwrap()
            .code(),
        Some(0)
    );
    let out = run(&[
        "--copy-path",
        "/var/run/kubevirt/container-disks/uid-1/a/b/c",
    ])
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("failed to create disk directory"));
}

/// virt-tail's stdout, collected by a thread.
struct Tail {
    child: Child,
    out: Arc<Mutex<Vec<u8>>>,
}

impl Tail {
    fn start(args: &[&str]) -> Tail {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_virt-tail"));
        cmd.args(args)
            .env("VIRT_LAUNCHER_LOG_VERBOSITY", "2")
            .stdout(Stdio::piped());
        as_qemu(&mut cmd, None);
        let mut child = cmd.spawn().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = out.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Tail { child, out }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    fn wait_text(&self, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.text() != want {
            assert!(
                Instant::now() < deadline,
                "virt-tail wrote {:?}, want {want:?}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn vm_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

#[test]
fn virt_tail_follows_the_serial_console_log_and_ends_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let private = dir.path().join("private");
    empty_dir(&private);
    let uid_dir = private.join("uid-1");
    std::fs::create_dir(&uid_dir).unwrap();
    std::os::unix::fs::chown(&uid_dir, Some(QEMU_UID), Some(QEMU_UID)).unwrap();
    let log = uid_dir.join("virt-serial0-log");
    let log_arg = log.to_str().unwrap().to_string();

    // Started before the launcher made the file; an unknown flag (with its value) is ignored.
    let mut tail = Tail::start(&["--unknown", "value", "--logfile", &log_arg, "-v", "3"]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(tail.child.try_wait().unwrap().is_none(), "virt-tail ended");
    append(&log, "");
    append(&log, "SeaBIOS\r\nBooting from Hard Disk...\r\nparti");
    tail.wait_text("SeaBIOS\r\nBooting from Hard Disk...\r\n");
    append(&log, "al line\n");
    tail.wait_text("SeaBIOS\r\nBooting from Hard Disk...\r\npartial line\n");
    let mut expected = tail.text();
    for i in 0..500 {
        let line = format!("[{i:5}] a kernel message of some length for the console\n");
        append(&log, &line);
        expected.push_str(&line);
    }
    tail.wait_text(&expected);
    eprintln!("virt-tail VmRSS while following: {} kB", tail.vm_rss_kib());

    // Truncated: read again from the start.
    std::fs::write(&log, "after truncation\n").unwrap();
    expected.push_str("after truncation\n");
    tail.wait_text(&expected);
    // Replaced (renamed away, made anew): the new file from its start.
    std::fs::rename(&log, uid_dir.join("old-log")).unwrap();
    append(&uid_dir.join("old-log"), "written to the old file\n");
    std::fs::write(&log, "a new file\n").unwrap();
    expected.push_str("a new file\n");
    tail.wait_text(&expected);

    // SIGTERM: exit 0; an incomplete last line is not written.
    append(&log, "no newline yet");
    std::thread::sleep(Duration::from_millis(300));
    signal(&tail.child, nix::sys::signal::Signal::SIGTERM);
    let status =
        wait_exit(&mut tail.child, Duration::from_secs(5)).expect("virt-tail still running");
    assert_eq!(status.code(), Some(0));
    assert_eq!(tail.text(), expected);

    // SIGINT too.
    let mut again = Tail::start(&[&format!("--logfile={log_arg}")]);
    again.wait_text("a new file\n");
    signal(&again.child, nix::sys::signal::Signal::SIGINT);
    assert_eq!(
        wait_exit(&mut again.child, Duration::from_secs(5))
            .unwrap()
            .code(),
        Some(0)
    );
}

#[test]
fn virt_tail_flags_and_exit_codes() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_virt-tail"))
            .args(args)
            .output()
            .unwrap()
            .status
            .code()
    };
    assert_eq!(run(&[]), Some(1));
    assert_eq!(run(&["--logfile="]), Some(1));
    assert_eq!(run(&["--other", "x"]), Some(1));
    assert_eq!(run(&["-h"]), Some(0));
    assert_eq!(run(&["--v", "notanumber", "--logfile", "/x"]), Some(2));
}
