//! qlauncher's pod network code run inside a test namespace: discover, plan and apply
//! ([`setup`]), reapply, tear down, and the DHCP servers ([`Servers`]); a DHCP client on the
//! guest NIC stand-in ([`udhcpc`], [`ClientDir`]); TCP probes across namespaces.

use std::path::PathBuf;
use std::process::Output;
use std::sync::Arc;

use qlauncher::net::dhcp::{self, DhcpStats};
use qlauncher::net::{self, Applied, NetConfig, NetError, NetPlan};

use crate::netns::Netns;

/// A dual-stack pod's resolv.conf as the kubelet writes it.
pub const RESOLV_CONF: &str = "search default.svc.cluster.local svc.cluster.local cluster.local\n\
nameserver 10.96.0.10\nnameserver fd00:10:96::a\noptions ndots:5\n";

/// Writes [`RESOLV_CONF`] to a temporary file.
pub fn resolv_conf() -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(f.path(), RESOLV_CONF).expect("write resolv.conf");
    f
}

/// Discovers the pod, plans and applies `cfg` inside `pod` (on a thread in that netns).
pub fn setup(
    pod: &Netns,
    cfg: &NetConfig,
    resolv: &std::path::Path,
) -> Result<(NetPlan, Applied), NetError> {
    let cfg = cfg.clone();
    let resolv = resolv.to_path_buf();
    net::netns::block_on_in(&pod.path(), move || async move {
        let (handle, conn) = net::apply::connect().await?;
        let facts = net::discover(&handle, &cfg.pod_iface, &resolv).await;
        conn.abort();
        let plan = net::plan(&cfg, &facts?)?;
        let applied = net::apply(&plan).await?;
        Ok((plan, applied))
    })?
}

/// Applies an existing plan again inside `pod`.
pub fn reapply(pod: &Netns, plan: &NetPlan) -> Result<Applied, NetError> {
    let plan = plan.clone();
    net::netns::block_on_in(&pod.path(), move || async move { net::apply(&plan).await })?
}

/// Tears `plan` down inside `pod`.
pub fn teardown(pod: &Netns, plan: &NetPlan, applied: &Applied) -> Result<Vec<String>, NetError> {
    let (plan, applied) = (plan.clone(), applied.clone());
    net::netns::block_on_in(&pod.path(), move || async move {
        net::teardown(&plan, &applied).await
    })?
}

/// DHCP servers (v4, and v6 when planned) running on a thread inside the pod netns; stopped
/// and joined on drop.
pub struct Servers {
    stop: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The DHCPv4 server's counters.
    pub stats_v4: Arc<DhcpStats>,
    /// The DHCPv6 server's counters.
    pub stats_v6: Arc<DhcpStats>,
}

impl Servers {
    /// Binds and serves `plan`'s DHCPv4 (required), DHCPv6 and router advertisement inside `pod`;
    /// returns once the sockets are bound. Panics when binding fails.
    pub fn start(pod: &Netns, plan: &NetPlan) -> Servers {
        let v4cfg = plan.dhcp_v4.clone().expect("plan has DHCPv4");
        let v6cfg = plan.dhcp_v6.clone();
        let racfg = plan.router_advertisement.clone();
        let (stop, rx) = tokio::sync::watch::channel(false);
        let stats_v4 = Arc::new(DhcpStats::default());
        let stats_v6 = Arc::new(DhcpStats::default());
        let (s4, s6) = (stats_v4.clone(), stats_v6.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let path = pod.path();
        let thread = std::thread::spawn(move || {
            let res = net::netns::block_on_in(&path, move || async move {
                let bound = (|| {
                    let sock4 = dhcp::v4::bind(&v4cfg.iface)?;
                    let server = Arc::new(dhcp::v4::DhcpV4Server::new(v4cfg)?);
                    let sock6 = match &v6cfg {
                        Some(c) => Some((dhcp::v6::bind(&c.iface)?, Arc::new(c.clone()))),
                        None => None,
                    };
                    let ra = match racfg {
                        Some(c) => Some((dhcp::ra::bind(&c.iface)?, c)),
                        None => None,
                    };
                    Ok::<_, NetError>((sock4, server, sock6, ra))
                })();
                let (sock4, server, sock6, ra) = match bound {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("{e:?}")));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
                    let _ = rx.changed().await;
                };
                let v6 = sock6
                    .map(|(s, c)| tokio::spawn(dhcp::v6::serve(s, c, s6, stopped(rx.clone()))));
                let ra = ra.map(|((s, idx), c)| {
                    tokio::spawn(dhcp::ra::serve(s, idx, c, stopped(rx.clone())))
                });
                dhcp::v4::serve(sock4, server, s4, stopped(rx))
                    .await
                    .expect("serve v4");
                for t in [v6, ra].into_iter().flatten() {
                    let _ = t.await;
                }
            });
            res.expect("netns thread");
        });
        ready_rx
            .recv()
            .expect("server thread")
            .expect("bind DHCP sockets");
        Servers {
            stop: Some(stop),
            thread: Some(thread),
            stats_v4,
            stats_v6,
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs busybox `udhcpc` once on the guest NIC `vmnic` inside `vm`: in the foreground, quitting
/// after the lease (`-q`) or after `tries` DISCOVERs one second apart (`-n`), with `script` as its
/// hook and each of `options` requested with `-O` (in that order).
pub fn udhcpc(vm: &Netns, script: &std::path::Path, tries: u32, options: &[&str]) -> Output {
    let tries = tries.to_string();
    let mut args = vec![
        "busybox",
        "udhcpc",
        "-i",
        "vmnic",
        "-f",
        "-q",
        "-n",
        "-t",
        &tries,
        "-T",
        "1",
        "-s",
        script.to_str().expect("utf-8 script path"),
    ];
    for option in options {
        args.extend(["-O", option]);
    }
    vm.exec(&args)
}

/// A temporary directory holding client scripts and their output.
pub struct ClientDir {
    /// The directory.
    pub dir: tempfile::TempDir,
}

impl Default for ClientDir {
    fn default() -> Self {
        ClientDir::new()
    }
}

impl ClientDir {
    /// A fresh temporary directory.
    pub fn new() -> ClientDir {
        ClientDir {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// `<dir>/<name>`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A udhcpc/dhclient hook script that dumps its environment to `env-<reason>` on a lease
    /// and, when `configure`, applies the udhcpc lease (address, MTU, default route).
    pub fn script(&self, configure: bool) -> PathBuf {
        let p = self.path("hook.sh");
        let out = self.dir.path().display().to_string();
        let apply = if configure {
            "if [ -n \"$ip\" ]; then ip addr add \"$ip/$subnet\" dev \"$interface\"; ip link set \"$interface\" mtu \"$mtu\"; \
             for r in $router; do ip route add default via \"$r\" dev \"$interface\"; break; done; fi"
        } else {
            ""
        };
        let body = format!(
            "#!/bin/sh\ncase \"$1$reason\" in\n  bound|renew|BOUND|BOUND6|REBOOT) env | sort > {out}/env.tmp; {apply}\n mv {out}/env.tmp {out}/env ;;\nesac\nexit 0\n"
        );
        std::fs::write(&p, body).expect("write script");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        p
    }

    /// Spawns ISC `dhclient FAMILY -d -1 [-cf CONFIG] -sf SCRIPT` on the guest NIC `vmnic` inside
    /// `vm` (`FAMILY` `-4` or `-6`; lease and pid files here), killed when the guard drops.
    pub fn dhclient(
        &self,
        vm: &Netns,
        family: &str,
        config: Option<&std::path::Path>,
        script: &std::path::Path,
    ) -> crate::process::ChildGuard {
        let (lease, pid) = (self.path("lease"), self.path("pid"));
        let mut args = vec!["dhclient", family, "-d", "-1"];
        if let Some(c) = config {
            args.extend(["-cf", c.to_str().expect("utf-8 path")]);
        }
        args.extend([
            "-sf",
            script.to_str().expect("utf-8 path"),
            "-lf",
            lease.to_str().expect("utf-8 path"),
            "-pf",
            pid.to_str().expect("utf-8 path"),
            "vmnic",
        ]);
        vm.spawn(&args)
    }

    /// Waits up to `secs` for the hook's environment dump and parses it into `KEY=value` pairs.
    pub fn wait_env(&self, secs: u64) -> std::collections::BTreeMap<String, String> {
        let p = self.path("env");
        for _ in 0..secs * 10 {
            if let Ok(text) = std::fs::read_to_string(&p) {
                return text
                    .lines()
                    .filter_map(|l| l.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("no lease within {secs}s");
    }
}

/// TCP: a listener bound inside `ns`, one accepted connection's peer and message.
pub fn listen(ns: &Netns, addr: &str) -> std::net::TcpListener {
    let addr: std::net::SocketAddr = addr.parse().expect("addr");
    net::netns::run_in(&ns.path(), move || std::net::TcpListener::bind(addr))
        .expect("netns")
        .expect("bind")
}

/// Connects from inside `ns` to `addr` and sends `msg`.
pub fn send_from(ns: &Netns, addr: &str, msg: &'static str) -> std::io::Result<()> {
    let addr: std::net::SocketAddr = addr.parse().expect("addr");
    net::netns::run_in(&ns.path(), move || {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5))?;
        s.write_all(msg.as_bytes())
    })
    .expect("netns")
}

/// One TCP connection from `from` to `addr` (a listener bound in `server` first), carrying `msg`:
/// returns the peer address the server saw and what it received.
pub fn tcp_once(
    server: &Netns,
    from: &Netns,
    addr: &str,
    msg: &'static str,
) -> (std::net::SocketAddr, String) {
    let l = listen(server, addr);
    send_from(from, addr, msg).unwrap();
    accept_one(&l)
}

/// Accepts one connection (5 s timeout) and returns the peer address and what it sent.
pub fn accept_one(l: &std::net::TcpListener) -> (std::net::SocketAddr, String) {
    use std::io::Read;
    l.set_nonblocking(true).expect("nonblocking");
    for _ in 0..50 {
        match l.accept() {
            Ok((mut s, peer)) => {
                s.set_nonblocking(false).expect("blocking");
                let mut buf = String::new();
                s.read_to_string(&mut buf).expect("read");
                return (peer, buf);
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
    panic!("no connection within 5s");
}

/// The `ip` commands of virt-handler's masquerade setup in the pod
/// (`pkg/network/setup/netpod/masquerade`, KubeVirt v1.9.0) for pod link `eth0` with MTU 1450:
/// bridge `k6t-eth0` with the masquerade bridge MAC and the gateway `10.0.2.1/24` (and
/// `fd10:0:2::1/120` without DAD when `ipv6`), set up, then tap `tap0` owned by `owner` (uid and
/// gid) as its port. Arguments of `ip`, in order.
pub fn kubevirt_masquerade_links(owner: u32, ipv6: bool) -> Vec<Vec<String>> {
    kubevirt_masquerade_links_mtu(owner, ipv6, 1450)
}

/// [`kubevirt_masquerade_links`] for a pod link `eth0` with MTU `mtu` (the bridge and the tap
/// take the pod link's).
pub fn kubevirt_masquerade_links_mtu(owner: u32, ipv6: bool, mtu: u32) -> Vec<Vec<String>> {
    let owner = owner.to_string();
    let mtu = mtu.to_string();
    let mut cmds: Vec<Vec<&str>> = vec![
        vec!["link", "add", "k6t-eth0", "type", "bridge"],
        vec![
            "link",
            "set",
            "k6t-eth0",
            "address",
            "02:00:00:00:00:00",
            "mtu",
            &mtu,
        ],
        vec!["addr", "add", "10.0.2.1/24", "dev", "k6t-eth0"],
    ];
    if ipv6 {
        cmds.push(vec![
            "-6",
            "addr",
            "add",
            "fd10:0:2::1/120",
            "dev",
            "k6t-eth0",
            "nodad",
        ]);
    }
    cmds.push(vec!["link", "set", "k6t-eth0", "up"]);
    cmds.push(vec![
        "tuntap", "add", "dev", "tap0", "mode", "tap", "user", &owner, "group", &owner,
    ]);
    cmds.push(vec![
        "link", "set", "tap0", "mtu", &mtu, "master", "k6t-eth0", "up",
    ]);
    cmds.into_iter()
        .map(|c| c.into_iter().map(String::from).collect())
        .collect()
}

/// The `ip` commands of virt-handler's bridge binding of a secondary (Multus) pod link
/// `pod_iface` = `pod<hash>` without addresses (`pkg/network/setup/netpod`, KubeVirt v1.9.0,
/// which sets up every interface of the VMI in the pod, a migration target's hot-plugged ones
/// included): the pod link taken down and renamed `<hash>-nic` with a MAC of its own (KubeVirt's
/// `CopyMacFrom` the new bridge: the pod link's MAC moves to the guest, and a port holding the
/// guest's MAC would take the guest's frames for the bridge itself) and MAC learning off, bridge
/// `k6t-<hash>` (MTU `mtu`) with it as a port, a stand-in named `pod_iface` with the pod link's
/// MAC `pod_mac` (KubeVirt's is a dummy link; this machine's kernel has none, so an ifb one, as
/// qlauncher's), and tap `tap<hash>` owned by `owner` as a port of the bridge. Arguments of `ip`,
/// in order.
pub fn kubevirt_bridge_links(
    pod_iface: &str,
    pod_mac: &str,
    mtu: u32,
    owner: u32,
) -> Vec<Vec<String>> {
    let hash = pod_iface.strip_prefix("pod").unwrap_or(pod_iface);
    let (nic, bridge, tap) = (
        format!("{hash}-nic"),
        format!("k6t-{hash}"),
        format!("tap{hash}"),
    );
    let (mtu, owner) = (mtu.to_string(), owner.to_string());
    let nic_mac = other_mac(pod_mac);
    let cmds: Vec<Vec<&str>> = vec![
        vec!["link", "set", pod_iface, "down"],
        vec!["link", "set", pod_iface, "name", &nic, "address", &nic_mac],
        vec!["link", "add", &bridge, "type", "bridge"],
        vec!["link", "set", &bridge, "mtu", &mtu, "up"],
        vec!["link", "set", &nic, "master", &bridge, "up"],
        vec![
            "link",
            "set",
            &nic,
            "type",
            "bridge_slave",
            "learning",
            "off",
        ],
        // An ifb link takes its MAC only when it is made.
        vec![
            "link", "add", pod_iface, "address", pod_mac, "mtu", &mtu, "type", "ifb",
        ],
        vec!["link", "set", pod_iface, "up"],
        vec![
            "tuntap", "add", "dev", &tap, "mode", "tap", "user", &owner, "group", &owner,
        ],
        vec!["link", "set", &tap, "mtu", &mtu, "master", &bridge, "up"],
    ];
    cmds.into_iter()
        .map(|c| c.into_iter().map(String::from).collect())
        .collect()
}

/// A locally administered unicast MAC other than `mac` (`aa:bb:...` form), the same for the same
/// `mac`: the renamed pod link's in [`kubevirt_bridge_links`] (KubeVirt's is the new bridge's
/// random one; a fixed one keeps the test's links predictable). Panics on a malformed `mac`.
pub fn other_mac(mac: &str) -> String {
    let mut m: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap_or_else(|e| panic!("MAC {mac:?}: {e}")))
        .collect();
    assert_eq!(m.len(), 6, "MAC {mac:?}");
    let first = m[0];
    m[0] = (first | 0x02) & 0xfe;
    if m[0] == first {
        m[0] ^= 0x04;
    }
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The pod IPv4 address of [`crate::netns::PodNet`]'s `eth0`, Istio's extra DNAT destination.
pub const POD_IPV4: &str = "10.244.0.5";

/// KubeVirt v1.9.0's masquerade NAT (`pkg/network/setup/netpod/masquerade/masquerade.go`,
/// `setupNATByFamily`) as the `nft` command lines its launcher runs, both families in order:
/// pod link `eth0`, bridge `k6t-eth0`, the default VM CIDRs (guest `10.0.2.2`, `fd10:0:2::2`),
/// `cfg.ports` (all ports when empty), `cfg.istio` (with `pod_ip` as the pod's IPv4) and
/// `cfg.legacy_migration_ports`. Each command is split into `nft`'s words (a `{ ... }` set is one
/// word). An oracle for the rules qlauncher writes: see [`kubevirt_nft_ruleset`].
pub fn kubevirt_nft(cfg: &NetConfig, pod_ip: &str) -> Vec<Vec<String>> {
    let mut cmds = Vec::new();
    for (fam, guest, gw, lo) in [
        ("ip", "10.0.2.2", "10.0.2.1", "127.0.0.1"),
        ("ip6", "fd10:0:2::2", "fd10:0:2::1", "::1"),
    ] {
        let mut lines: Vec<String> = vec!["add table FAM nat".into()];
        for (chain, hook) in [
            ("prerouting", "prerouting priority -100"),
            ("input", "input priority 100"),
            ("output", "output priority -100"),
            ("postrouting", "postrouting priority 100"),
        ] {
            lines.push(format!(
                "add chain FAM nat {chain} {{ type nat hook {hook}; }}"
            ));
        }
        lines.push("add chain FAM nat KUBEVIRT_PREINBOUND".into());
        lines.push("add chain FAM nat KUBEVIRT_POSTINBOUND".into());
        lines.push(format!(
            "add rule FAM nat postrouting FAM saddr {guest} counter masquerade"
        ));
        lines.push(
            "add rule FAM nat prerouting iifname eth0 counter jump KUBEVIRT_PREINBOUND".into(),
        );
        lines.push(
            "add rule FAM nat postrouting oifname k6t-eth0 counter jump KUBEVIRT_POSTINBOUND"
                .into(),
        );
        let skip = |lines: &mut Vec<String>, ports: &str| {
            for chain in ["output", "KUBEVIRT_POSTINBOUND"] {
                lines.push(format!(
                    "add rule FAM nat {chain} tcp dport {ports} FAM saddr {lo} counter return"
                ));
            }
        };
        if cfg.legacy_migration_ports {
            skip(&mut lines, "{ 49152, 49153 }");
        }
        let istio_v4 = cfg.istio && fam == "ip";
        let dnat = if istio_v4 {
            format!("{{ {lo}, {pod_ip} }}")
        } else {
            format!("{{ {lo} }}")
        };
        let snat = if istio_v4 {
            format!("{{ {lo}, 127.0.0.6 }}")
        } else {
            format!("{{ {lo} }}")
        };
        let ssh_only = format!(
            "add rule FAM nat KUBEVIRT_PREINBOUND tcp dport {{ 22 }} counter dnat to {guest}"
        );
        for p in &cfg.ports {
            let (proto, port) = (p.protocol.keyword(), p.port);
            if !cfg.istio {
                lines.push(format!(
                    "add rule FAM nat KUBEVIRT_PREINBOUND {proto} dport {{ {port} }} counter dnat to {guest}"
                ));
            } else if port == 22 {
                lines.push(ssh_only.clone());
            }
            lines.push(format!(
                "add rule FAM nat KUBEVIRT_POSTINBOUND {proto} dport {port} FAM saddr {snat} counter snat to {gw}"
            ));
            lines.push(format!(
                "add rule FAM nat output FAM daddr {dnat} {proto} dport {port} counter dnat to {guest}"
            ));
        }
        if cfg.ports.is_empty() {
            if cfg.istio {
                skip(
                    &mut lines,
                    "{ 15000, 15001, 15004, 15006, 15008, 15009, 15020, 15021, 15053, 15090 }",
                );
                lines.push(ssh_only);
            } else {
                lines.push(format!(
                    "add rule FAM nat KUBEVIRT_PREINBOUND counter dnat to {guest}"
                ));
            }
            lines.push(format!(
                "add rule FAM nat KUBEVIRT_POSTINBOUND FAM saddr {snat} counter snat to {gw}"
            ));
            lines.push(format!(
                "add rule FAM nat output FAM daddr {dnat} counter dnat to {guest}"
            ));
        }
        cmds.extend(lines.iter().map(|l| nft_words(&l.replace("FAM", fam))));
    }
    cmds
}

/// Splits an `nft` command line on spaces, keeping `{ ... }` groups as one word.
fn nft_words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut depth = 0;
    for ch in line.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ' ' if depth == 0 => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The ruleset (`nft list ruleset`) the real `nft` leaves after running [`kubevirt_nft`] for
/// `cfg` (pod IPv4 [`POD_IPV4`]) in a scratch namespace: what qlauncher's rules must equal.
pub fn kubevirt_nft_ruleset(cfg: &NetConfig) -> String {
    let scratch = Netns::new("kv-nft");
    for c in kubevirt_nft(cfg, POD_IPV4) {
        let mut args = vec!["nft"];
        args.extend(c.iter().map(String::as_str));
        scratch.sh(&args);
    }
    scratch.nft_ruleset()
}
