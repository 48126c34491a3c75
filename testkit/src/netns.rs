//! Throwaway network namespaces: one [`Netns`] type, deleted (with `/etc/netns/<name>`) on drop,
//! and the [`PodNet`] pair a CNI plugin leaves for a pod: a "node" namespace and a "pod" namespace
//! joined by a veth that is `eth0` in the pod (KubeVirt's pod network before virt-launcher runs).
//! Names carry the test process id and a counter, so tests run in parallel.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::process::{run, ChildGuard};

/// The pod's MAC address on `eth0` (what the kubelet's CNI gives `10.244.0.5`).
pub const POD_MAC: &str = "0a:58:0a:f4:00:05";
/// [`POD_MAC`] as bytes.
pub const POD_MAC_BYTES: [u8; 6] = [0x0a, 0x58, 0x0a, 0xf4, 0x00, 0x05];

/// The pod's resolv.conf as the kubelet writes it (cluster DNS 10.96.0.10).
pub const KUBELET_RESOLV_CONF: &str =
    "search default.svc.cluster.local svc.cluster.local cluster.local\n\
                               nameserver 10.96.0.10\noptions ndots:5\n";

/// A named network namespace `qlt-<role>-<pid>-<n>` with `lo` up; deleted on drop, with its
/// `/etc/netns/<name>` directory (what `ip netns exec` bind-mounts over `/etc`).
pub struct Netns {
    /// The namespace name.
    pub name: String,
}

impl Netns {
    /// Creates the namespace and brings `lo` up.
    pub fn new(role: &str) -> Netns {
        let name = format!("qlt-{role}-{}", crate::unique());
        run(&["ip", "netns", "add", &name]);
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `/run/netns/<name>`, the namespace's file (for `setns`).
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// `/etc/netns/<name>`: files there replace `/etc/<file>` for `ip netns exec`.
    pub fn etc(&self) -> PathBuf {
        PathBuf::from("/etc/netns").join(&self.name)
    }

    /// Writes `/etc/netns/<name>/resolv.conf`.
    pub fn write_resolv_conf(&self, text: &str) {
        std::fs::create_dir_all(self.etc()).expect("create /etc/netns/<name>");
        std::fs::write(self.etc().join("resolv.conf"), text).expect("write resolv.conf");
    }

    /// `ip -n <name> ARGS`; returns stdout, panics with stderr on failure.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut v = vec!["ip", "-n", &self.name];
        v.extend_from_slice(args);
        run(&v)
    }

    /// A command run inside the namespace (`ip netns exec <name> PROGRAM`).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Runs `args` inside the namespace and returns its output (no status check).
    pub fn exec(&self, args: &[&str]) -> Output {
        self.command(args[0])
            .args(&args[1..])
            .output()
            .expect("run ip netns exec")
    }

    /// Runs `args` inside the namespace; returns stdout, panics with stderr on failure.
    pub fn sh(&self, args: &[&str]) -> String {
        let o = self.exec(args);
        assert!(
            o.status.success(),
            "{args:?} in {}: {}",
            self.name,
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Spawns `args` inside the namespace (stdout and stderr piped); killed when the guard drops.
    pub fn spawn(&self, args: &[&str]) -> ChildGuard {
        ChildGuard::spawn(
            self.command(args[0])
                .args(&args[1..])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        )
    }

    /// `nft -s list ruleset` inside the namespace.
    pub fn nft_ruleset(&self) -> String {
        self.sh(&["nft", "-s", "list", "ruleset"])
    }

    /// `sysctl -n KEY` inside the namespace, trimmed.
    pub fn sysctl(&self, key: &str) -> String {
        self.sh(&["sysctl", "-n", key]).trim().to_string()
    }

    /// Pids of the processes in the namespace (`ip netns pids`).
    pub fn pids(&self) -> Vec<u32> {
        Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// SIGKILLs every process in the namespace, until none is left (at most 10 s). Each is
    /// checked to be in this namespace again once pinned ([`crate::process::kill_if`]): a pid
    /// listed a moment ago may since belong to a process of another test.
    pub fn kill_all(&self) {
        use std::os::unix::fs::MetadataExt;
        let Ok(ns) = std::fs::metadata(self.path()) else {
            return;
        };
        let in_this_netns = |pid: i32| {
            std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|m| m.dev() == ns.dev() && m.ino() == ns.ino())
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = self.pids();
            if pids.is_empty() || Instant::now() >= deadline {
                return;
            }
            for pid in pids {
                crate::process::kill_if(
                    pid as i32,
                    nix::sys::signal::Signal::SIGKILL,
                    in_this_netns,
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.etc());
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// How [`PodNet::with`] shapes the pod network.
#[derive(Debug, Clone)]
pub struct PodNetSpec {
    /// MTU of the veth pair (`None` keeps the kernel's 1500).
    pub mtu: Option<u32>,
    /// Also fd00:10:244::5/64 on `eth0` (::1 on the node side) and an IPv6 default route.
    pub ipv6: bool,
    /// A route to the service network 10.96.0.0/12 via the node.
    pub service_route: bool,
    /// The pod's resolv.conf (`/etc/netns/<pod>/resolv.conf`), or none.
    pub resolv_conf: Option<String>,
}

impl Default for PodNetSpec {
    /// MTU 1450 (an overlay network's), IPv4 only, no service route, no resolv.conf.
    fn default() -> Self {
        PodNetSpec {
            mtu: Some(1450),
            ipv6: false,
            service_route: false,
            resolv_conf: None,
        }
    }
}

/// A node namespace and a pod namespace joined by a veth: `eth0` in the pod (MAC [`POD_MAC`],
/// 10.244.0.5/24, default route via 10.244.0.1), `vpod` 10.244.0.1/24 on the node.
pub struct PodNet {
    /// The node side.
    pub node: Netns,
    /// The pod (the launcher's namespace).
    pub pod: Netns,
}

impl PodNet {
    /// The net tests' pod: MTU 1450, a service route, IPv6 too when `ipv6`, no resolv.conf.
    pub fn new(ipv6: bool) -> PodNet {
        PodNet::with(&PodNetSpec {
            ipv6,
            service_route: true,
            ..PodNetSpec::default()
        })
    }

    /// The pod network as `spec` says.
    pub fn with(spec: &PodNetSpec) -> PodNet {
        let node = Netns::new("node");
        let pod = Netns::new("pod");
        node.ip(&[
            "link", "add", "vpod", "type", "veth", "peer", "name", "eth0", "netns", &pod.name,
        ]);
        let mtu = spec.mtu.map(|m| m.to_string());
        let mut node_link = vec!["link", "set", "vpod"];
        let mut pod_link = vec!["link", "set", "eth0", "address", POD_MAC];
        if let Some(m) = &mtu {
            node_link.extend(["mtu", m]);
            pod_link.extend(["mtu", m]);
        }
        node_link.push("up");
        pod_link.push("up");
        node.ip(&node_link);
        node.ip(&["addr", "add", "10.244.0.1/24", "dev", "vpod"]);
        pod.ip(&pod_link);
        pod.ip(&["addr", "add", "10.244.0.5/24", "dev", "eth0"]);
        pod.ip(&["route", "add", "default", "via", "10.244.0.1"]);
        if spec.service_route {
            pod.ip(&["route", "add", "10.96.0.0/12", "via", "10.244.0.1"]);
        }
        if spec.ipv6 {
            node.ip(&["addr", "add", "fd00:10:244::1/64", "dev", "vpod", "nodad"]);
            pod.ip(&["addr", "add", "fd00:10:244::5/64", "dev", "eth0", "nodad"]);
            pod.ip(&["-6", "route", "add", "default", "via", "fd00:10:244::1"]);
        }
        if let Some(text) = &spec.resolv_conf {
            pod.write_resolv_conf(text);
        }
        PodNet { node, pod }
    }

    /// What Multus attaches for a secondary network (a bridge CNI's veth): the L2 link
    /// `pod_iface` (KubeVirt's hashed name, `pod<sha256(network)[..11]>`) in the pod, with MAC
    /// `pod_mac`, MTU `mtu` and no addresses, up; its peer `node_link` on the node with MAC
    /// `node_mac` and `node_cidr`, standing for the secondary network's far side (traffic over
    /// the guest's secondary NIC reaches it; the same MAC in every pod's node is the same far
    /// side seen from each). The binding (bridge `k6t-<hash>`, tap `tap<hash>`) is made
    /// from this link by whoever plays virt-handler's network setup (the launcher does when it
    /// may).
    pub fn add_multus_link(
        &self,
        pod_iface: &str,
        pod_mac: &str,
        mtu: u32,
        node_link: &str,
        node_mac: &str,
        node_cidr: &str,
    ) {
        let mtu = mtu.to_string();
        self.node.ip(&[
            "link",
            "add",
            node_link,
            "type",
            "veth",
            "peer",
            "name",
            pod_iface,
            "netns",
            &self.pod.name,
        ]);
        self.node.ip(&[
            "link", "set", node_link, "address", node_mac, "mtu", &mtu, "up",
        ]);
        self.node.ip(&["addr", "add", node_cidr, "dev", node_link]);
        self.pod.ip(&[
            "link", "set", pod_iface, "address", pod_mac, "mtu", &mtu, "up",
        ]);
    }

    /// A "vm" namespace with a veth `vmnic` (MAC `mac`, MTU 1450) whose peer `vmport<n>` is a
    /// port of `bridge` in the pod namespace: a guest NIC stand-in.
    pub fn attach_vm(&self, bridge: &str, mac: &str) -> Netns {
        let vm = Netns::new("vm");
        let port = format!("vmport{}", crate::names::next());
        vm.ip(&[
            "link",
            "add",
            "vmnic",
            "type",
            "veth",
            "peer",
            "name",
            &port,
            "netns",
            &self.pod.name,
        ]);
        vm.sh(&["sysctl", "-qw", "net.ipv6.conf.vmnic.accept_dad=0"]);
        vm.ip(&["link", "set", "vmnic", "address", mac, "mtu", "1450", "up"]);
        self.pod
            .ip(&["link", "set", &port, "mtu", "1450", "master", bridge, "up"]);
        vm
    }
}

/// Moves the calling thread into a fresh network namespace of its own (`unshare(CLONE_NEWNET)`:
/// threads, sockets and processes it starts inherit it; it goes away with them) and gives it a
/// pod's `eth0`: `lo` up, a veth `eth0` (MAC `mac` when given) / `vpeer`, `cidr` on `eth0`, a
/// default route via 10.244.0.1. Errors: the failing step with `ip`'s stderr.
pub fn unshare_pod_eth0(cidr: &str, mac: Option<&str>) -> Result<(), String> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("unshare: {e}"))?;
    let ip = |args: &[&str]| -> Result<(), String> {
        let mut argv = vec!["ip"];
        argv.extend_from_slice(args);
        let o = crate::process::output(&argv);
        if o.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ip {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            ))
        }
    };
    ip(&["link", "set", "lo", "up"])?;
    ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "vpeer",
    ])?;
    match mac {
        Some(mac) => ip(&["link", "set", "eth0", "address", mac, "up"])?,
        None => ip(&["link", "set", "eth0", "up"])?,
    }
    ip(&["link", "set", "vpeer", "up"])?;
    ip(&["addr", "add", cidr, "dev", "eth0"])?;
    ip(&[
        "route",
        "add",
        "default",
        "via",
        "10.244.0.1",
        "dev",
        "eth0",
    ])
}
