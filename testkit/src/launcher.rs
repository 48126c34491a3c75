//! A real launcher for the orchestrator fault and privilege tests: `qlauncher launcher` (not
//! under the monitor, so a test can kill it and start another) in a throwaway pod network
//! namespace whose `eth0` is a veth to a node namespace, with KubeVirt's directories under a short
//! root, the test guest's qcow2 as the containerDisk, and a notify server playing virt-handler on
//! `domain-notify-pipe.sock`. Everything (launchers, the QEMU they started, namespaces, files) is
//! removed on drop.
//!
//! A non-root pod (KubeVirt's default, `status.runtimeUser: 107`) is run as KubeVirt runs it: the
//! compute container's emptyDirs as the kubelet makes them (root:107, 2777,
//! [`crate::kubelet::compute_empty_dirs`]), virt-handler's masquerade setup of the pod network
//! before any launcher starts (the launcher, without `NET_ADMIN`, adopts it), the notify socket
//! given to 107, and each launcher exec'd as uid and gid 107 with only `NET_BIND_SERVICE`
//! ([`crate::kubelet::launcher_user_argv`]), `--run-as-nonroot` and the compute container's
//! environment. A root pod (the `Root` feature gate) runs the launcher and QEMU as root over
//! directories the test made.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use qlauncher::sync::domain::{LifeCycle, StateChangeReason};
use qlauncher::sync::SyncVmi;

use crate::handler::Client;
pub use crate::handler::{get_domain, sync, try_sync};
use crate::netns::{PodNet, PodNetSpec};
pub use crate::notify::Received;

/// Kills the QEMU of an in-process [`SyncVmi`] (detached from the test: it would outlive it) when
/// the guard drops, however the test ends. The pid is a remembered one (the domain keeps it after
/// QEMU exited), so it is signalled only while it is still a QEMU of this domain (`-uuid` of its
/// domain in its argv, checked once pinned, [`crate::process::kill_if`]): after a test that shut
/// its guest down, the number may by now be another test's QEMU.
pub struct KillQemu(pub std::sync::Arc<SyncVmi>);

impl Drop for KillQemu {
    fn drop(&mut self) {
        if let (Some(pid), Some(domain)) = (self.0.qemu_pid(), self.0.domain()) {
            kill_domain_qemu(pid, &domain.spec.uuid);
        }
    }
}

/// SIGKILLs `pid` if it is a live QEMU started with `-uuid <uuid>`; returns whether it was sent.
pub fn kill_domain_qemu(pid: i32, uuid: &str) -> bool {
    if uuid.is_empty() {
        return false;
    }
    crate::process::kill_if(pid, nix::sys::signal::Signal::SIGKILL, |pid| {
        !is_zombie(pid)
            && cmdline(pid).is_some_and(|argv| {
                is_qemu(&argv) && argv.windows(2).any(|w| w[0] == "-uuid" && w[1] == uuid)
            })
    })
}

/// The argv of `pid` (`None` when it is gone).
fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

fn is_qemu(argv: &[String]) -> bool {
    argv.first()
        .is_some_and(|a| a.rsplit('/').next().unwrap_or(a).starts_with("qemu-system"))
}

/// The MTU of a launcher pod's `eth0` (the kernel's default: [`pod_net`] sets none).
pub const POD_MTU: u32 = 1500;

/// The pod network of a launcher pod: no MTU or service route, a short resolv.conf.
fn pod_net() -> PodNet {
    PodNet::with(&PodNetSpec {
        mtu: None,
        resolv_conf: Some("search default.svc.cluster.local\nnameserver 10.96.0.10\n".into()),
        ..PodNetSpec::default()
    })
}

/// A VMI `default/<name>` with the test guest's disk as containerDisk (virtio), a NoCloud ISO
/// and a masquerade interface on the pod network, 128 MiB.
pub fn guest_vmi(name: &str, uid: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {
            "domain": {
                "resources": {"requests": {"memory": "128Mi"}},
                "devices": {
                    "disks": [
                        {"name": "rootdisk", "disk": {"bus": "virtio"}},
                        {"name": "cloudinit", "disk": {"bus": "virtio"}}
                    ],
                    "interfaces": [{"name": "default", "masquerade": {}}]
                }
            },
            "networks": [{"name": "default", "pod": {}}],
            "volumes": [
                {"name": "rootdisk", "containerDisk": {"image": "qlauncher/test-guest:latest"}},
                {"name": "cloudinit", "cloudInitNoCloud": {"userData": "#cloud-config\n"}}
            ]
        }
    })
}

/// The launcher pod's VMI: [`guest_vmi`] `hv` with a 5 s grace period. It carries
/// `firmware.uuid`, as every VMI virt-handler sends does (virt-api defaults it once): the VMI
/// uid's last group repeated into a UUID.
pub fn vmi(uid: &str) -> serde_json::Value {
    let mut v = guest_vmi("hv", uid);
    v["spec"]["terminationGracePeriodSeconds"] = 5.into();
    v["spec"]["domain"]["firmware"] =
        serde_json::json!({"uuid": format!("bbbbbbbb-0000-4000-8000-{}", &uid[uid.len() - 12..])});
    v
}

/// One pod: its network, its directories, its notify server, and the launchers started in it.
pub struct Pod {
    /// The root every KubeVirt path is under (short: QEMU's socket paths must fit 108 bytes).
    pub root: PathBuf,
    /// The VMI's uid.
    pub uid: String,
    /// The network namespaces.
    pub net: PodNet,
    /// Notifications received.
    pub received: Received,
    /// KubeVirt's default non-root pod (see the module doc); else a root pod.
    pub nonroot: bool,
    /// Launchers started from now on add an operator's QMP monitor on
    /// [`Self::operator_qmp_socket`] (`QLAUNCHER_OPERATOR_QMP`), for tests that read QEMU's state.
    pub operator_qmp: bool,
    launchers: Vec<Child>,
    _notify_stop: tokio::sync::oneshot::Sender<()>,
}

/// virt-handler's network setup of a non-root pod before the launcher's first sync
/// (`NetConf.Setup`, `pkg/network/setup/netpod/masquerade`, v1.9.0) for the interface `default`
/// on `eth0` (MTU [`POD_MTU`]): bridge `k6t-eth0` with the gateway, `tap0` owned by 107 as its
/// port, forwarding and `route_localnet` on, and KubeVirt's IPv4 `nat` table (every port
/// forwarded to the guest).
pub fn virt_handler_masquerade(net: &PodNet) {
    for args in crate::net::kubevirt_masquerade_links_mtu(crate::kubelet::QEMU_ID, false, POD_MTU) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        net.pod.ip(&args);
    }
    net.pod.sh(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    net.pod
        .sh(&["sysctl", "-qw", "net.ipv4.conf.k6t-eth0.route_localnet=1"]);
    let cfg = qlauncher::net::NetConfig::default();
    for c in crate::net::kubevirt_nft(&cfg, crate::net::POD_IPV4) {
        if c.get(2).map(String::as_str) != Some("ip") {
            continue;
        }
        let mut args = vec!["nft"];
        args.extend(c.iter().map(String::as_str));
        net.pod.sh(&args);
    }
}

impl Pod {
    /// Makes the pod (call inside a tokio runtime: the notify server runs on it): KubeVirt's
    /// default non-root pod when `nonroot` (see the module doc), else a root pod.
    pub fn new(guest_qcow2: &Path, nonroot: bool) -> Pod {
        let id = crate::unique();
        let root = PathBuf::from(format!("/tmp/qlh{id}"));
        std::fs::create_dir_all(&root).unwrap();
        // QEMU may run as 107: every directory above its files must be searchable.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        if nonroot {
            crate::kubelet::compute_empty_dirs(&root);
        }
        let uid = uuid_for(&id);
        let mut pod = Pod {
            root,
            uid,
            net: pod_net(),
            received: Received::default(),
            nonroot,
            operator_qmp: false,
            launchers: Vec::new(),
            _notify_stop: tokio::sync::oneshot::channel().0,
        };
        let disks = pod.share().join("container-disks");
        std::fs::create_dir_all(&disks).unwrap();
        std::os::unix::fs::symlink(guest_qcow2, disks.join("disk_0.img")).unwrap();
        let pipe = pod.share().join("domain-notify-pipe.sock");
        let stop = crate::notify::start_into(&pipe, pod.received.clone());
        pod._notify_stop = stop;
        if nonroot {
            // virt-handler gives the pipe to the launcher's user, and sets up the network.
            let id = Some(crate::kubelet::QEMU_ID);
            std::os::unix::fs::chown(&pipe, id, id).unwrap();
            virt_handler_masquerade(&pod.net);
        }
        pod
    }

    /// The operator's QMP socket of the pod's QEMU when [`Self::operator_qmp`] is set: in the
    /// private directory, which the launcher's user may write in a non-root pod.
    pub fn operator_qmp_socket(&self) -> PathBuf {
        self.private().join("operator-qmp.sock")
    }

    /// The pod's name (`POD_NAME` of its launchers): `virt-launcher-<root's name>`.
    pub fn pod_name(&self) -> String {
        let id = self.root.file_name().unwrap_or_default().to_string_lossy();
        format!("virt-launcher-{id}")
    }

    /// `<root>/var/run/kubevirt`.
    pub fn share(&self) -> PathBuf {
        self.root.join("var/run/kubevirt")
    }

    /// `<root>/var/run/kubevirt-private`.
    pub fn private(&self) -> PathBuf {
        self.root.join("var/run/kubevirt-private")
    }

    /// The containerDisk overlay.
    pub fn overlay(&self) -> PathBuf {
        self.root
            .join("var/run/kubevirt-ephemeral-disks/disk-data/rootdisk/disk.qcow2")
    }

    /// The QMP socket.
    pub fn qmp_socket(&self) -> PathBuf {
        self.private().join("qlauncher/monitor.sock")
    }

    /// The log of the `n`th launcher started.
    pub fn launcher_log(&self, n: usize) -> PathBuf {
        self.root.join(format!("launcher-{n}.log"))
    }

    /// Starts a launcher in the pod namespace (as virt-launcher-monitor would, with virt-launcher's
    /// flags); returns its index.
    pub fn start_launcher(&mut self) -> usize {
        self.start_launcher_with(&[])
    }

    /// [`Self::start_launcher`] with `extra` flags after the usual ones (`--hook-sidecars 1`).
    pub fn start_launcher_with(&mut self, extra: &[&str]) -> usize {
        let n = self.launchers.len();
        let p = |p: PathBuf| p.display().to_string();
        let mut args = vec![
            "launcher".to_string(),
            "--name".into(),
            "hv".into(),
            "--namespace".into(),
            "default".into(),
            "--uid".into(),
            self.uid.clone(),
            "--kubevirt-share-dir".into(),
            p(self.share()),
            "--ephemeral-disk-dir".into(),
            p(self.root.join("var/run/kubevirt-ephemeral-disks")),
            "--container-disk-dir".into(),
            p(self.share().join("container-disks")),
            "--hotplug-disk-dir".into(),
            p(self.share().join("hotplug-disks")),
            "--private-dir".into(),
            p(self.private()),
            "--grace-period-seconds".into(),
            "5".into(),
            "--qemu-timeout".into(),
            "120s".into(),
            "--allow-emulation".into(),
        ];
        if self.nonroot {
            args.push("--run-as-nonroot".into());
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut command = Command::new("ip");
        if self.nonroot && !tun_is_world_rw() {
            // In a pod /dev/net/tun is world read-write, as on a standard host; this machine's is
            // 0600. Give the launcher (and its QEMU) a private mount namespace in which a node of
            // the same device with the usual 0666 mode covers it.
            let node = self.root.join("tun");
            if !node.exists() {
                let path = std::ffi::CString::new(node.display().to_string()).unwrap();
                // SAFETY: a valid C path; creates a character device node (10, 200: tun).
                let r = unsafe {
                    libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(10, 200))
                };
                assert_eq!(r, 0, "mknod {}", node.display());
                std::fs::set_permissions(&node, std::fs::Permissions::from_mode(0o666)).unwrap();
            }
            command = Command::new("unshare");
            command
                .args(["--mount", "--propagation", "private", "sh", "-c"])
                .arg("mount --bind \"$0\" /dev/net/tun && exec \"$@\"")
                .arg(&node)
                .arg("ip");
        }
        command.args(["netns", "exec", &self.net.pod.name]);
        if self.nonroot {
            // The compute container's virt-launcher: 107 with only NET_BIND_SERVICE.
            command
                .args(crate::kubelet::launcher_user_argv())
                .envs(crate::kubelet::compute_user_env(&self.root));
        }
        if self.operator_qmp {
            command.env(
                qlauncher::sync::launcher::OPERATOR_QMP_ENV,
                self.operator_qmp_socket(),
            );
        }
        let child = command
            .arg(crate::qlauncher_bin())
            .args(&args)
            .env("QLAUNCHER_ROOT", &self.root)
            .env("QLAUNCHER_EMULATION", "on")
            .env("POD_NAME", self.pod_name())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.launcher_log(n)).unwrap())
            .spawn()
            .unwrap();
        self.launchers.push(child);
        n
    }

    /// The pid of the `n`th launcher (`unshare`, `sh` and `ip netns exec` exec it: same pid).
    pub fn launcher_pid(&self, n: usize) -> i32 {
        self.launchers[n].id() as i32
    }

    /// SIGKILL to the `n`th launcher, waited for.
    pub fn kill_launcher(&mut self, n: usize) {
        let c = &mut self.launchers[n];
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Waits up to `timeout` for the `n`th launcher to exit.
    pub async fn wait_launcher(&mut self, n: usize, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.launchers[n].try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "launcher {n} did not exit; log:\n{}",
                self.log(n)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The `n`th launcher's log.
    pub fn log(&self, n: usize) -> String {
        std::fs::read_to_string(self.launcher_log(n)).unwrap_or_default()
    }

    /// A command client on `launcher-sock`, once the (current) launcher serves it (60 s).
    pub async fn client(&self, n: usize) -> Client {
        let sock = self.share().join("sockets/launcher-sock");
        crate::handler::connect(&sock, Duration::from_secs(60), || {
            format!("launcher {n}: {}", self.log(n))
        })
        .await
    }

    /// The live QEMU processes whose command line names this pod's root.
    pub fn qemu_pids(&self) -> Vec<i32> {
        let mut out: Vec<i32> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
            .filter(|pid| self.is_our_qemu(*pid))
            .collect();
        out.sort_unstable();
        out
    }

    /// True when `pid` is a live QEMU whose command line names this pod's root.
    fn is_our_qemu(&self, pid: i32) -> bool {
        let needle = self.root.display().to_string() + "/";
        cmdline(pid).is_some_and(|argv| is_qemu(&argv) && argv.iter().any(|a| a.contains(&needle)))
            && !is_zombie(pid)
    }

    /// Waits until exactly one QEMU of this pod exists; returns its pid.
    pub async fn wait_qemu(&self, n: usize, timeout: Duration) -> i32 {
        let deadline = Instant::now() + timeout;
        loop {
            if let [pid] = self.qemu_pids()[..] {
                return pid;
            }
            assert!(
                Instant::now() < deadline,
                "no single QEMU ({:?}); log:\n{}",
                self.qemu_pids(),
                self.log(n)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until a notification of `state` arrived.
    pub async fn wait_event(&self, state: (LifeCycle, StateChangeReason), timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self
                .received
                .lock()
                .unwrap()
                .iter()
                .any(|(_, d)| (d.status.status, d.status.reason) == state)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no {state:?} notification; got {:?}",
                self.events()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The notifications so far: (event type, state, reason, deleted).
    pub fn events(&self) -> Vec<(String, LifeCycle, StateChangeReason, bool)> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .map(|(t, d)| {
                (
                    t.clone(),
                    d.status.status,
                    d.status.reason,
                    d.object_meta.deletion_timestamp.is_some(),
                )
            })
            .collect()
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        for c in &mut self.launchers {
            let _ = c.kill();
            let _ = c.wait();
        }
        // A failing test shows what each launcher of the pod logged last (its root goes below).
        if std::thread::panicking() {
            for n in 0..self.launchers.len() {
                let log = self.log(n);
                let lines: Vec<&str> = log.lines().collect();
                let tail = &lines[lines.len().saturating_sub(LOG_TAIL)..];
                eprintln!(
                    "--- {} launcher {n}: last {} lines of its log ---\n{}",
                    self.root.display(),
                    tail.len(),
                    tail.join("\n")
                );
            }
        }
        for _ in 0..50 {
            let pids = self.qemu_pids();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                // Still this pod's QEMU once pinned: the pid was read a moment ago.
                crate::process::kill_if(pid, nix::sys::signal::Signal::SIGKILL, |p| {
                    self.is_our_qemu(p)
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// How many of a launcher's last log lines a failing test prints ([`Pod`]'s drop).
const LOG_TAIL: usize = 60;

/// True when `/dev/net/tun` is read-write for everyone (as on a standard host and in a pod).
fn tun_is_world_rw() -> bool {
    std::fs::metadata("/dev/net/tun").is_ok_and(|m| m.permissions().mode() & 0o006 == 0o006)
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let close = s.rfind(')')?;
            s[close + 2..].chars().next()
        })
        .is_none_or(|c| c == 'Z' || c == 'X')
}

fn uuid_for(id: &str) -> String {
    let digits: String = id.chars().filter(char::is_ascii_digit).collect();
    format!(
        "aaaaaaaa-0000-4000-8000-{:0>12}",
        &digits[..digits.len().min(12)]
    )
}
