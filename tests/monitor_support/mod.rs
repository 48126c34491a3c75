//! Shared helpers of the monitor's process tests: start `qlauncher monitor` with a test launcher,
//! read its JSON log, and kill the whole process tree on drop.
#![allow(dead_code)]
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use qlauncher::monitor::procfs;

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_qlauncher")
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every descendant of `pid`, parents before children.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        for c in procfs::children(p) {
            out.push(c.pid);
            queue.push(c.pid);
        }
    }
    out
}

/// A running monitor (or any process) whose tree is killed on drop; stderr goes to a file.
pub struct Running {
    /// The process.
    pub child: Child,
    /// Where its stderr (the JSON log of monitor and launcher) goes.
    pub log: PathBuf,
}

impl Running {
    /// Starts `command` with stderr to `log`.
    pub fn start(mut command: Command, log: &Path) -> Self {
        let file = std::fs::File::create(log).expect("log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn");
        Self {
            child,
            log: log.to_path_buf(),
        }
    }

    /// The pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends a signal.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).expect("kill");
    }

    /// Waits up to `timeout` for the exit; `None` on timeout.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The log lines that are JSON objects.
    pub fn log_records(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The first record whose `msg` is `msg`.
    pub fn record(&self, msg: &str) -> Option<serde_json::Value> {
        self.log_records().into_iter().find(|r| r["msg"] == msg)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Only the current tree (pids are recycled quickly: never kill a remembered pid). The
        // monitor is still alive while its descendants are killed, so none escapes to init.
        if self.child.try_wait().ok().flatten().is_none() {
            for pid in descendants(self.pid()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A QEMU command line with no guest: it ignores the ACPI power button and just sits there.
pub fn idle_qemu_argv(qmp: &Path) -> Vec<String> {
    [
        "qemu-system-x86_64",
        "-S",
        "-accel",
        "tcg",
        "-nodefaults",
        "-display",
        "none",
        "-m",
        "64",
        "-name",
        "guest=default_testvmi,debug-threads=on",
        "-qmp",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("unix:{},server=on,wait=off", qmp.display())])
    .collect()
}

/// The `QLAUNCHER_TEST_QEMU` value for an idle QEMU with its QMP socket in `dir`.
pub fn test_qemu_spec(dir: &Path) -> String {
    let qmp = dir.join("qmp.sock");
    serde_json::json!({ "argv": idle_qemu_argv(&qmp), "qmp": qmp }).to_string()
}

/// Launcher flags that keep every directory under `dir` (nothing under /var/run).
pub fn launcher_flags(dir: &Path, extra: &[&str]) -> Vec<String> {
    let d = |s: &str| dir.join(s).display().to_string();
    let mut v = vec![
        "--name".into(),
        "testvmi".into(),
        "--namespace".into(),
        "default".into(),
        "--uid".into(),
        "1234".into(),
        "--kubevirt-share-dir".into(),
        d("share"),
        "--ephemeral-disk-dir".into(),
        d("ephemeral"),
        "--container-disk-dir".into(),
        d("share/container-disks"),
        "--hotplug-disk-dir".into(),
        d("share/hotplug-disks"),
        "--private-dir".into(),
        d("private"),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// The test guest's directory (`QLAUNCHER_GUEST_DIR`, default `/var/cache/qlauncher/guest`);
/// panics with the command to run when it is not built.
pub fn guest_dir() -> PathBuf {
    let dir = PathBuf::from(
        std::env::var("QLAUNCHER_GUEST_DIR")
            .unwrap_or_else(|_| "/var/cache/qlauncher/guest".to_string()),
    );
    assert!(
        dir.join("vmlinuz").exists() && dir.join("initrd.img").exists(),
        "the test guest is missing in {}: run scripts/build-guest",
        dir.display()
    );
    dir
}

/// The `QLAUNCHER_TEST_QEMU` value for the test guest booted from its kernel, serial to a file.
pub fn guest_qemu_spec(dir: &Path, serial: &Path) -> String {
    let guest = guest_dir();
    let qmp = dir.join("qmp.sock");
    let argv: Vec<String> = [
        "qemu-system-x86_64",
        "-machine",
        "q35",
        "-accel",
        "tcg",
        "-nodefaults",
        "-display",
        "none",
        "-m",
        "256",
        "-name",
        "guest=default_testvmi,debug-threads=on",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "-kernel".into(),
        guest.join("vmlinuz").display().to_string(),
        "-initrd".into(),
        guest.join("initrd.img").display().to_string(),
        "-append".into(),
        "console=ttyS0".into(),
        "-serial".into(),
        format!("file:{}", serial.display()),
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", qmp.display()),
    ])
    .collect();
    serde_json::json!({ "argv": argv, "qmp": qmp }).to_string()
}
