//! Hostile pod input through the DHCP servers to real clients, in network namespaces: resolv.conf
//! files and pod routes taken from public KubeVirt bug reports (an overlong search list, search
//! entries that are not DNS names, the subdomain entry already present, on-link routes,
//! nameserver lines with two addresses). The replies are captured on the guest NIC with a packet
//! socket and options 6, 15, 119 and 121 (DHCPv6 23 and 24) compared byte for byte; the client
//! (busybox udhcpc, ISC dhclient -4/-6) must take the lease; each warning is logged exactly once.

use qlauncher::net::{Binding, NetConfig};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use testkit::net::*;
use testkit::netns::*;
use testkit::unique;

const GUEST_MAC: &str = "02:00:00:aa:bb:03";

// ---- the launcher's log, captured for every thread of this test binary ----

#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log() -> &'static LogBuf {
    static LOG: OnceLock<LogBuf> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = LogBuf::default();
        let w = buf.clone();
        tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .init();
        buf
    })
}

/// The warning lines that mention `marker`.
fn warnings_with(marker: &str) -> Vec<String> {
    let text = String::from_utf8_lossy(&log().0.lock().unwrap()).into_owned();
    text.lines()
        .filter(|l| l.contains("WARN") && l.contains(marker))
        .map(str::to_string)
        .collect()
}

// ---- a packet socket on the guest NIC: what the client received, as bytes ----

/// Frames received: (ethertype, L3 packet).
type Frames = Vec<(u16, Vec<u8>)>;

struct Capture {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Frames>>,
}

impl Capture {
    /// Captures incoming frames on `vmnic` in `vm` (ethertype, L3 packet) until [`Capture::stop`].
    fn start(vm: &Netns) -> Capture {
        let fd = qlauncher::net::netns::run_in(&vm.path(), || {
            let proto = (libc::ETH_P_ALL as u16).to_be();
            // SAFETY: plain socket(2); the result is checked.
            let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, i32::from(proto)) };
            assert!(
                fd >= 0,
                "packet socket: {}",
                std::io::Error::last_os_error()
            );
            // SAFETY: fd was just returned by socket(2) and is owned here only.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let index = nix::net::if_::if_nametoindex("vmnic").expect("vmnic");
            // SAFETY: zeroed sockaddr_ll is a valid value; fields set below.
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = proto;
            sll.sll_ifindex = index as i32;
            // SAFETY: sll is a valid sockaddr_ll of the given size.
            let r = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                )
            };
            assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
            let tv = libc::timeval {
                tv_sec: 0,
                tv_usec: 100_000,
            };
            // SAFETY: setsockopt with a timeval of the right size.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    &tv as *const libc::timeval as *const libc::c_void,
                    std::mem::size_of::<libc::timeval>() as u32,
                )
            };
            fd
        })
        .expect("netns");
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut frames = Vec::new();
            let mut buf = vec![0u8; 65536];
            while !s.load(Ordering::Relaxed) {
                // SAFETY: zeroed sockaddr_ll is valid; recvfrom writes at most its size.
                let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
                let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
                // SAFETY: buf and sll are valid for the lengths passed.
                let n = unsafe {
                    libc::recvfrom(
                        fd.as_raw_fd(),
                        buf.as_mut_ptr() as *mut libc::c_void,
                        buf.len(),
                        0,
                        &mut sll as *mut libc::sockaddr_ll as *mut libc::sockaddr,
                        &mut len,
                    )
                };
                if n > 0 && sll.sll_pkttype != libc::PACKET_OUTGOING {
                    frames.push((u16::from_be(sll.sll_protocol), buf[..n as usize].to_vec()));
                }
            }
            frames
        });
        Capture {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops and returns the UDP payloads received on `port` (IPv4 or IPv6, no extension headers).
    fn stop(mut self, port: u16) -> Vec<Vec<u8>> {
        self.stop.store(true, Ordering::Relaxed);
        let frames = self.thread.take().expect("thread").join().expect("capture");
        frames
            .into_iter()
            .filter_map(|(ethertype, p)| {
                let udp = match ethertype {
                    0x0800 if p.len() > 20 && p[9] == 17 => &p[usize::from(p[0] & 0x0f) * 4..],
                    0x86dd if p.len() > 40 && p[6] == 17 => &p[40..],
                    _ => return None,
                };
                (udp.len() >= 8 && u16::from_be_bytes([udp[2], udp[3]]) == port)
                    .then(|| udp[8..].to_vec())
            })
            .collect()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The options of a DHCPv4 message, instances of one code concatenated (RFC 3396).
fn v4_options(msg: &[u8]) -> BTreeMap<u8, Vec<u8>> {
    let mut out: BTreeMap<u8, Vec<u8>> = BTreeMap::new();
    let mut i = 240;
    while i < msg.len() {
        match msg[i] {
            0 => i += 1,
            255 => break,
            code => {
                let len = usize::from(msg[i + 1]);
                out.entry(code)
                    .or_default()
                    .extend_from_slice(&msg[i + 2..i + 2 + len]);
                i += 2 + len;
            }
        }
    }
    out
}

/// The top-level options of a DHCPv6 message.
fn v6_options(msg: &[u8]) -> BTreeMap<u16, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut i = 4;
    while i + 4 <= msg.len() {
        let code = u16::from_be_bytes([msg[i], msg[i + 1]]);
        let len = usize::from(u16::from_be_bytes([msg[i + 2], msg[i + 3]]));
        out.insert(code, msg[i + 4..i + 4 + len].to_vec());
        i += 4 + len;
    }
    out
}

/// The DHCPv4 ACK among captured payloads.
fn ack(payloads: &[Vec<u8>]) -> BTreeMap<u8, Vec<u8>> {
    payloads
        .iter()
        .map(|p| v4_options(p))
        .find(|o| o.get(&53) == Some(&vec![5]))
        .expect("an ACK reached the guest NIC")
}

/// A domain list as RFC 1035 §4.1.4 writes it, with a pointer to the longest suffix written
/// before (what the server's encoder does; written here independently).
fn dns_list(names: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut seen: Vec<(String, usize)> = Vec::new();
    for name in names {
        let labels: Vec<&str> = name.split('.').collect();
        let mut done = false;
        for k in 0..labels.len() {
            let suffix = labels[k..].join(".").to_ascii_lowercase();
            if let Some((_, at)) = seen.iter().find(|(s, _)| *s == suffix) {
                out.extend_from_slice(&[0xc0 | (at >> 8) as u8, *at as u8]);
                done = true;
                break;
            }
            seen.push((suffix, out.len()));
            out.push(labels[k].len() as u8);
            out.extend_from_slice(labels[k].as_bytes());
        }
        if !done {
            out.push(0);
        }
    }
    out
}

fn ipv4s(a: &[&str]) -> Vec<u8> {
    a.iter()
        .flat_map(|s| s.parse::<std::net::Ipv4Addr>().unwrap().octets())
        .collect()
}

fn write_resolv(text: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(f.path(), text).expect("write resolv.conf");
    f
}

/// Sets up `cfg` in a fresh pod with `resolv` (after `prepare` ran in the pod), starts the
/// servers, runs udhcpc on a guest NIC and returns the ACK's options and udhcpc's environment.
fn udhcpc_lease(
    cfg: &NetConfig,
    resolv: &str,
    guest_mac: &str,
    prepare: impl FnOnce(&PodNet),
) -> (BTreeMap<u8, Vec<u8>>, BTreeMap<String, String>) {
    log();
    let net = PodNet::new(false);
    prepare(&net);
    let resolv = write_resolv(resolv);
    let (plan, _applied) = setup(&net.pod, cfg, resolv.path()).expect("setup");
    let servers = Servers::start(&net.pod, &plan);
    let vm = net.attach_vm("k6t-eth0", guest_mac);
    let capture = Capture::start(&vm);
    let dir = ClientDir::new();
    let script = dir.script(false);
    let out = udhcpc(&vm, &script, 5, &["search", "staticroutes", "domain"]);
    assert!(
        out.status.success(),
        "udhcpc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = dir.wait_env(5);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let payloads = capture.stop(68);
    assert_eq!(servers.stats_v4.snapshot().malformed, 0);
    (ack(&payloads), env)
}

#[test]
fn overlong_search_list_is_cut_at_255_bytes_with_one_warning() {
    let u = unique().replace('-', "x");
    // 12 domains of 43 characters: 45 bytes each on the wire, so five fit in 255.
    let names: Vec<String> = (0..12)
        .map(|i| {
            format!(
                "ns{i:02}{u}.{}.svc.cluster.local",
                "x".repeat(24 - u.len().min(20))
            )
        })
        .collect();
    let resolv = format!("search {}\nnameserver 10.96.0.10\n", names.join(" "));
    let (opts, env) = udhcpc_lease(&NetConfig::default(), &resolv, GUEST_MAC, |_| {});
    let fit = {
        let mut bytes = 0;
        names
            .iter()
            .take_while(|n| {
                bytes += n.len() + 2;
                bytes <= 255
            })
            .count()
    };
    assert!(fit > 0 && fit < names.len());
    let kept: Vec<&str> = names[..fit].iter().map(String::as_str).collect();
    assert_eq!(opts.get(&119), Some(&dns_list(&kept)));
    assert!(opts[&119].len() <= 255);
    assert_eq!(opts.get(&6), Some(&ipv4s(&["10.96.0.10"])));
    // Option 15: the (first) longest search domain.
    assert_eq!(opts.get(&15), Some(&names[0].as_bytes().to_vec()));
    assert_eq!(env.get("search"), Some(&kept.join(" ")));
    let w = warnings_with(&names[fit]);
    assert_eq!(w.len(), 1, "{w:#?}");
    assert!(w[0].contains("cut at 255 bytes"), "{}", w[0]);
    for dropped in &names[fit..] {
        assert!(w[0].contains(dropped.as_str()), "{} not named", dropped);
    }
}

#[test]
fn search_entries_that_are_not_dns_names_are_dropped_with_one_warning() {
    let u = unique().replace('-', "x");
    let ip = "10.7.7.7";
    let underscore = format!("bad_{u}.example");
    let hyphen = format!("trail{u}-.example");
    let good = format!("ok{u}.example");
    let resolv = format!(
        "search default.svc.cluster.local {ip} {underscore} {hyphen} {good} cluster.local\n\
         nameserver 10.96.0.10\n"
    );
    // dhclient checks the names itself and would drop the whole option for one bad name.
    log();
    let net = PodNet::new(false);
    let resolv_file = write_resolv(&resolv);
    let (plan, _applied) = setup(&net.pod, &NetConfig::default(), resolv_file.path()).unwrap();
    let _servers = Servers::start(&net.pod, &plan);
    let vm = net.attach_vm("k6t-eth0", GUEST_MAC);
    let capture = Capture::start(&vm);
    let dir = ClientDir::new();
    let script = dir.script(false);
    let _client = dir.dhclient(&vm, "-4", None, &script);
    let env = dir.wait_env(20);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let opts = ack(&capture.stop(68));
    let kept = ["default.svc.cluster.local", good.as_str(), "cluster.local"];
    assert_eq!(opts.get(&119), Some(&dns_list(&kept)));
    assert_eq!(opts.get(&15), Some(&b"default.svc.cluster.local".to_vec()));
    assert_eq!(opts.get(&6), Some(&ipv4s(&["10.96.0.10"])));
    assert_eq!(
        env.get("new_domain_search").map(String::as_str),
        Some(format!("default.svc.cluster.local. {good}. cluster.local.").as_str())
    );
    let w = warnings_with(&underscore);
    assert_eq!(w.len(), 1, "{w:#?}");
    for name in [ip, hyphen.as_str()] {
        assert!(w[0].contains(name), "{name} not named in {}", w[0]);
    }
    assert!(!w[0].contains(&good));
}

#[test]
fn subdomain_entry_already_in_the_list_is_not_added_again() {
    let resolv = "search mysub.default.svc.cluster.local default.svc.cluster.local svc.cluster.local cluster.local\n\
                  nameserver 10.96.0.10\n";
    let cfg = NetConfig {
        subdomain: Some("mysub".into()),
        ..Default::default()
    };
    let (opts, env) = udhcpc_lease(&cfg, resolv, GUEST_MAC, |_| {});
    let list = [
        "mysub.default.svc.cluster.local",
        "default.svc.cluster.local",
        "svc.cluster.local",
        "cluster.local",
    ];
    assert_eq!(opts.get(&119), Some(&dns_list(&list)));
    // Written out: the first name in full, then pointers to the suffixes already written.
    let mut expected = vec![5];
    expected.extend_from_slice(b"mysub");
    for l in ["default", "svc", "cluster", "local"] {
        expected.push(l.len() as u8);
        expected.extend_from_slice(l.as_bytes());
    }
    expected.extend_from_slice(&[0, 0xc0, 6, 0xc0, 14, 0xc0, 18]);
    assert_eq!(opts[&119], expected);
    assert_eq!(
        opts.get(&15),
        Some(&b"mysub.default.svc.cluster.local".to_vec())
    );
    assert_eq!(env.get("search"), Some(&list.join(" ")));
}

#[test]
fn bridge_binding_sends_on_link_routes_in_option_121() {
    let cfg = NetConfig {
        binding: Binding::Bridge,
        ..Default::default()
    };
    let (opts, env) = udhcpc_lease(&cfg, RESOLV_CONF, POD_MAC, |net| {
        net.pod
            .ip(&["route", "add", "172.16.0.0/16", "dev", "eth0"]);
    });
    // 10.96.0.0/12 via the gateway, 172.16.0.0/16 on-link (router 0.0.0.0), the default last;
    // the pod subnet's own route is not sent.
    let expected: Vec<u8> = [
        &[12, 10, 96][..],
        &[10, 244, 0, 1],
        &[16, 172, 16],
        &[0, 0, 0, 0],
        &[0],
        &[10, 244, 0, 1],
    ]
    .concat();
    assert_eq!(opts.get(&121), Some(&expected));
    assert_eq!(opts.get(&3), Some(&ipv4s(&["10.244.0.1"])));
    assert_eq!(
        env.get("staticroutes").map(String::as_str),
        Some("10.96.0.0/12 10.244.0.1 172.16.0.0/16 0.0.0.0 0.0.0.0/0 10.244.0.1")
    );
}

#[test]
fn nameserver_line_with_two_addresses_is_skipped_with_one_warning() {
    // KubeVirt v1.9 `ParseNameservers` skips the whole line (neither address reaches the guest).
    let resolv = "nameserver 10.96.0.10 10.96.0.77\nnameserver 10.96.0.12\nsearch cluster.local\n";
    let (opts, env) = udhcpc_lease(&NetConfig::default(), resolv, GUEST_MAC, |_| {});
    assert_eq!(opts.get(&6), Some(&ipv4s(&["10.96.0.12"])));
    assert_eq!(opts.get(&119), Some(&dns_list(&["cluster.local"])));
    assert_eq!(opts.get(&15), Some(&b"cluster.local".to_vec()));
    assert_eq!(env.get("dns").map(String::as_str), Some("10.96.0.12"));
    let w = warnings_with("10.96.0.77");
    assert_eq!(w.len(), 1, "{w:#?}");
    assert!(w[0].contains("one address"), "{}", w[0]);
}

#[test]
fn dhcpv6_reply_carries_dns_and_the_same_search_list() {
    let u = unique().replace('-', "x");
    let bad = format!("v6bad_{u}.example");
    let resolv = format!(
        "search default.svc.cluster.local {bad} cluster.local\n\
         nameserver 10.96.0.10\nnameserver fd00:10:96::a fd00:10:96::77\nnameserver fd00:10:96::b\n"
    );
    log();
    let net = PodNet::new(true);
    let resolv_file = write_resolv(&resolv);
    let (plan, _applied) = setup(&net.pod, &NetConfig::default(), resolv_file.path()).unwrap();
    let servers = Servers::start(&net.pod, &plan);
    let vm = net.attach_vm("k6t-eth0", GUEST_MAC);
    let capture = Capture::start(&vm);
    let dir = ClientDir::new();
    let script = dir.script(false);
    let _client = dir.dhclient(&vm, "-6", None, &script);
    let env = dir.wait_env(30);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let reply = capture
        .stop(546)
        .into_iter()
        .find(|p| p.first() == Some(&7))
        .expect("a Reply reached the guest NIC");
    let opts = v6_options(&reply);
    let dns: Vec<u8> = ["fd00:10:96::b"]
        .iter()
        .flat_map(|a| a.parse::<std::net::Ipv6Addr>().unwrap().octets())
        .collect();
    assert_eq!(opts.get(&23), Some(&dns));
    assert_eq!(
        opts.get(&24),
        Some(&dns_list(&["default.svc.cluster.local", "cluster.local"]))
    );
    assert_eq!(
        (
            env.get("new_ip6_address").map(String::as_str),
            env.get("new_dhcp6_name_servers").map(String::as_str),
            env.get("new_dhcp6_domain_search").map(String::as_str),
        ),
        (
            Some("fd10:0:2::2"),
            Some("fd00:10:96::b"),
            Some("default.svc.cluster.local. cluster.local.")
        )
    );
    assert_eq!(servers.stats_v6.snapshot().malformed, 0);
    assert_eq!(warnings_with(&bad).len(), 1);
    assert_eq!(warnings_with("fd00:10:96::77").len(), 1);
}
