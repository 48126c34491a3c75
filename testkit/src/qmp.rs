//! The qmp tests' QEMU: launched through [`crate::qemu_launch`] with a QMP listener handed over
//! as an fd, in a private temp dir, killed and reaped on drop; block-node queries.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use qlauncher::qmp::QmpClient;
use serde_json::Value;

pub use crate::names::short as unique;
use crate::qemu_launch::{
    bind_qmp_listener, launch, InheritFd, LaunchError, LaunchSpec, QemuProcess,
};

/// The QMP monitor fd number QEMU gets.
pub const MONITOR_FD: i32 = 3;

/// A paused q35 under TCG with 128 MiB, no default devices and no display.
pub fn machine_args() -> Vec<String> {
    [
        "-machine",
        "q35",
        "-accel",
        "tcg",
        "-m",
        "128",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-S",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Machine arguments for a hotplug-capable q35 without a guest ([`machine_args`] and
/// `-no-shutdown`): four root ports, virtio-scsi with an empty cdrom.
pub fn q35_args() -> Vec<String> {
    let mut a = machine_args();
    a.push("-no-shutdown".into());
    for (i, func) in (1..=4).zip(0..) {
        let mf = if func == 0 { ",multifunction=on" } else { "" };
        a.push("-device".into());
        a.push(format!(
            "pcie-root-port,port={},chassis={i},id=pci.{i},bus=pcie.0,addr=0x2.{func:#x}{mf}",
            0x10 + func
        ));
    }
    for s in [
        "-device",
        "virtio-scsi-pci,id=scsi0,bus=pci.4",
        "-device",
        "scsi-cd,bus=scsi0.0,scsi-id=0,lun=0,id=ua-cdrom",
    ] {
        a.push(s.into());
    }
    a
}

/// The QMP monitor on the inherited listener [`MONITOR_FD`] (libvirt's `charmonitor`).
pub fn monitor_args() -> Vec<String> {
    vec![
        "-chardev".to_string(),
        format!("socket,id=charmonitor,fd={MONITOR_FD},server=on,wait=off"),
        "-mon".to_string(),
        "chardev=charmonitor,id=monitor,mode=control".to_string(),
    ]
}

/// The launch of `/usr/bin/qemu-system-x86_64 ARGV` (which must hold [`monitor_args`]) with its
/// QMP listener bound at `<dir>/monitor.sock` and inherited as [`MONITOR_FD`], its log at
/// `<dir>/qemu.log`, `PATH` only, started (`cont`), 20 s to greet.
pub fn launch_spec(argv: Vec<String>, dir: &Path) -> LaunchSpec {
    let sock = dir.join("monitor.sock");
    let listener = bind_qmp_listener(&sock).expect("bind QMP listener");
    LaunchSpec {
        qemu: PathBuf::from("/usr/bin/qemu-system-x86_64"),
        argv,
        fds: vec![InheritFd {
            fd: OwnedFd::from(listener),
            target: MONITOR_FD,
        }],
        qmp_socket: sock,
        user: None,
        log: dir.join("qemu.log"),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        pre_start: vec![],
        start: true,
        timeout: Duration::from_secs(20),
        pid_file: None,
    }
}

/// A QEMU under test. Dropping it kills QEMU and removes its directory.
pub struct TestVm {
    /// The QEMU process (taken on drop).
    pub proc: Option<QemuProcess>,
    /// Its private directory (QMP socket, log, images a test puts there).
    pub dir: tempfile::TempDir,
    /// QEMU's pid.
    pub pid: i32,
}

impl TestVm {
    /// Launches QEMU with `args` plus the QMP monitor on an inherited listener.
    pub async fn launch(args: Vec<String>) -> Result<TestVm, (LaunchError, tempfile::TempDir)> {
        Self::launch_with(args, |_| {}).await
    }

    /// Like [`TestVm::launch`], letting the test adjust the spec.
    pub async fn launch_with(
        mut args: Vec<String>,
        adjust: impl FnOnce(&mut LaunchSpec),
    ) -> Result<TestVm, (LaunchError, tempfile::TempDir)> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("qmp-test-{}-", std::process::id()))
            .tempdir()
            .expect("temp dir");
        args.extend(monitor_args());
        let mut spec = launch_spec(args, dir.path());
        adjust(&mut spec);
        match launch(spec).await {
            Ok(p) => Ok(TestVm {
                pid: p.pid(),
                proc: Some(p),
                dir,
            }),
            Err(e) => Err((e, dir)),
        }
    }

    /// The connected QMP client.
    pub fn client(&self) -> &QmpClient {
        self.proc.as_ref().expect("running").client()
    }

    /// The running QEMU.
    pub fn proc(&mut self) -> &mut QemuProcess {
        self.proc.as_mut().expect("running")
    }

    /// `<dir>/<name>`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for TestVm {
    fn drop(&mut self) {
        if let Some(p) = self.proc.take() {
            let _ = p.signal(libc::SIGKILL);
            drop(p);
            // SAFETY: waitpid on our own child; ECHILD if tokio reaped it first.
            unsafe {
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// Creates a sparse raw image of `size` bytes.
pub fn raw_image(path: &Path, size: u64) {
    let f = std::fs::File::create(path).expect("create image");
    f.set_len(size).expect("size image");
}

/// The `query-named-block-nodes` node names.
pub async fn node_names(client: &QmpClient) -> Vec<String> {
    let r = client
        .execute("query-named-block-nodes", None)
        .await
        .expect("query-named-block-nodes");
    let mut names: Vec<String> = r
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|n| n["node-name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names
}

/// The `query-block` entry of a device id.
pub async fn block_of(client: &QmpClient, id: &str) -> Value {
    let r = client
        .execute("query-block", None)
        .await
        .expect("query-block");
    r.as_array()
        .expect("array")
        .iter()
        .find(|b| {
            b["qdev"] == id
                || b["qdev"]
                    .as_str()
                    .is_some_and(|q| q.contains(&format!("/{id}/")))
        })
        .cloned()
        .unwrap_or(Value::Null)
}
