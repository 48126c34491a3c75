//! Support for the end-to-end tests that drive `qlauncher run` the way a user does: a throwaway
//! "pod" network namespace (its `eth0` a veth to a "node" namespace, a resolv.conf as Kubernetes
//! writes it), the `qlauncher run` process inside it, the guest's serial console on KubeVirt's
//! socket path under `--root`, and a graceful stop by SIGTERM.
//!
//! Cleanup never depends on the test passing: dropping a [`Pod`] kills every process left in its
//! namespace (the monitor, the launcher, QEMU) and then deletes both namespaces and
//! `/etc/netns/<pod>`. Names carry the test process id and a counter, so tests run in parallel.

use crate::guest::{Console, GuestImages};
pub use crate::netns::KUBELET_RESOLV_CONF as RESOLV_CONF;
use crate::netns::{PodNet, PodNetSpec};
use crate::process::run as host;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a TCG guest may take from `qlauncher run` to its shell prompt, and to stop.
pub const STEP: Duration = Duration::from_secs(240);

/// A pod network namespace with `eth0` 10.244.0.5/24 (MTU 1450, default route via 10.244.0.1) on a
/// veth to a node namespace's `vpod` 10.244.0.1/24, and `/etc/netns/<pod>/resolv.conf`
/// ([`RESOLV_CONF`]). Dropping it kills every process left in the pod namespace first.
pub struct Pod {
    /// The namespaces.
    pub net: PodNet,
}

impl Default for Pod {
    fn default() -> Self {
        Pod::new()
    }
}

impl Pod {
    /// Creates both namespaces and the veth pair.
    pub fn new() -> Pod {
        Pod {
            net: PodNet::with(&PodNetSpec {
                resolv_conf: Some(RESOLV_CONF.into()),
                ..PodNetSpec::default()
            }),
        }
    }

    /// `ip -n <pod> ARGS...`.
    pub fn ip(&self, args: &[&str]) -> String {
        self.net.pod.ip(args)
    }

    /// `ip -n <node> ARGS...`.
    pub fn node_ip(&self, args: &[&str]) -> String {
        self.net.node.ip(args)
    }

    /// A command run inside the pod namespace (`ip netns exec <pod> PROGRAM`).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.net.pod.command(program)
    }

    /// Pids of the processes in the pod namespace.
    pub fn pids(&self) -> Vec<u32> {
        self.net.pod.pids()
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.net.pod.kill_all();
    }
}

/// A `qlauncher run` process (it becomes the monitor: PID 1 of the pod), with its `--root`.
pub struct Run {
    child: Child,
    /// The `--root` directory as the host sees it.
    pub root: PathBuf,
    /// stdout and stderr of `qlauncher run`.
    pub log: PathBuf,
    exit: Option<ExitStatus>,
}

impl Run {
    /// Spawns `command` (a `qlauncher run ...`, possibly wrapped in `ip netns exec`, `chroot`)
    /// with its output going to `log`; `root` is where its `--root` is on the host.
    pub fn spawn(mut command: Command, root: &Path, log: &Path) -> Run {
        let out = std::fs::File::create(log).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawn qlauncher run");
        Run {
            child,
            root: root.to_path_buf(),
            log: log.to_path_buf(),
            exit: None,
        }
    }

    /// Starts `qlauncher run VMI --root ROOT --emulation on EXTRA...` in `pod`, logging to
    /// `ROOT.log` (next to the root, so the root holds only what qlauncher writes).
    pub fn start(pod: &Pod, vmi: &Path, root: &Path, extra: &[&str]) -> Run {
        let mut c = pod.command(crate::qlauncher_bin());
        c.arg("run")
            .arg(vmi)
            .arg("--root")
            .arg(root)
            .args(["--emulation", "on"])
            .args(extra);
        Run::spawn(c, root, &root.with_extension("log"))
    }

    /// Starts `qlauncher run examples/NAME --root ROOT` in `pod` with the test guest's qcow2 as the
    /// containerDisk `rootdisk` (what the e2e tests boot).
    pub fn start_example(pod: &Pod, name: &str, root: &Path) -> Run {
        let disk = format!("rootdisk={}", GuestImages::locate().disk_qcow2.display());
        Run::start(pod, &example(name), root, &["--container-disk", &disk])
    }

    /// The pid of `qlauncher run`, i.e. of the monitor it became.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `qlauncher run`'s output, QEMU's log and whether `run` still runs, for failure messages.
    pub fn diagnostics(&mut self) -> String {
        let qemu_log = self
            .root
            .join("var/run/kubevirt-private/qlauncher/qemu.log");
        let state = match self.child.try_wait() {
            Ok(Some(s)) => format!("exited: {s}"),
            _ => "running".to_string(),
        };
        let procs: Vec<String> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                stat.contains("(qemu-system-x86").then(|| {
                    stat.split_whitespace()
                        .take(3)
                        .collect::<Vec<_>>()
                        .join(" ")
                })
            })
            .collect();
        format!(
            "qlauncher run ({state}):\n{}\nQEMU processes: {procs:?}\nQEMU log:\n{}",
            self.output(),
            std::fs::read_to_string(qemu_log).unwrap_or_default()
        )
    }

    /// What `qlauncher run` printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The VMI's private directory `<root>/var/run/kubevirt-private/<uid>` (the uid `run` derives
    /// from namespace/name), once it holds `file`; panics after `timeout` or when `run` exits.
    pub fn private_file(&mut self, file: &str, timeout: Duration) -> PathBuf {
        let private = self.root.join("var/run/kubevirt-private");
        let deadline = Instant::now() + timeout;
        loop {
            let found = std::fs::read_dir(&private).ok().and_then(|d| {
                d.flatten()
                    .map(|e| e.path().join(file))
                    .find(|p| p.exists())
            });
            if let Some(p) = found {
                return p;
            }
            if let Ok(Some(s)) = self.child.try_wait() {
                self.exit = Some(s);
                panic!(
                    "qlauncher run exited ({s}) before {file}:\n{}",
                    self.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no {file} within {timeout:?}; qlauncher run:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Connects to the guest's serial console (`<private>/<uid>/virt-serial0`) and waits for its
    /// shell prompt (a newline is typed first: the prompt may have been printed already).
    pub fn console(&mut self) -> Console {
        let socket = self.private_file("virt-serial0", STEP);
        let mut console = Console::connect(&socket, STEP).expect("connect to the serial console");
        console.send(b"\n").expect("write to the serial console");
        if let Err(e) = console.wait_for_prompt(STEP) {
            panic!("{e}\n{}", self.diagnostics());
        }
        console
    }

    /// The `QLG: ` markers (text after `QLG: `) in the serial console log
    /// (`<private>/<uid>/virt-serial0-log`, written by QEMU from the guest's first byte on).
    pub fn logged_markers(&mut self) -> Vec<String> {
        let log = self.private_file("virt-serial0-log", STEP);
        String::from_utf8_lossy(&std::fs::read(log).unwrap_or_default())
            .lines()
            .filter_map(|l| l.find("QLG: ").map(|i| l[i + 5..].trim_end().to_string()))
            .collect()
    }

    /// QEMU's operator QMP socket, `<root>/var/run/kubevirt-private/qlauncher/operator.sock`
    /// (bound before the guest starts).
    pub fn operator_qmp_socket(&self) -> PathBuf {
        self.root
            .join("var/run/kubevirt-private/qlauncher/operator.sock")
    }

    /// Waits up to `timeout` for `qlauncher run` to exit.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = crate::process::wait_timeout(&mut self.child, timeout);
        }
        self.exit
    }

    /// SIGTERM to `qlauncher run` (the kubelet stopping the pod): the guest gets the ACPI power
    /// button. Waits for `QLG: poweroff` on `console` and for `run` to exit; panics unless it
    /// exits with status 0.
    pub fn stop(&mut self, console: &mut Console) {
        host(&["kill", "-TERM", &self.pid().to_string()]);
        if let Err(e) = console.wait_for_marker("poweroff", STEP) {
            panic!("{e}\n{}", self.diagnostics());
        }
        let status = self
            .wait(STEP)
            .unwrap_or_else(|| panic!("qlauncher run did not exit:\n{}", self.output()));
        assert!(
            status.success(),
            "qlauncher run exited with {status}:\n{}",
            self.output()
        );
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A temporary directory with a short path (QEMU's socket paths under `--root` must stay within
/// the 107 bytes of a unix socket path), removed on drop.
pub fn short_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("q{}-", crate::unique()))
        .rand_bytes(4)
        .tempdir_in("/tmp")
        .unwrap()
}

/// The path of the example VMI `examples/NAME`.
pub fn example(name: &str) -> PathBuf {
    crate::repo_root().join("examples").join(name)
}

/// Writes `mark` at the start of the guest's raw scratch partition `vda2` (guest/README.md) and
/// syncs, through the serial console; panics unless the command succeeded and printed nothing.
pub fn write_scratch_marker(console: &mut Console, mark: &str) {
    let (rc, out) = console
        .run(
            &format!("printf {mark} | dd of=/dev/vda2 conv=fsync 2>/dev/null; sync"),
            STEP,
        )
        .expect("write the marker on the console");
    assert_eq!((rc, out), (0, String::new()));
}
