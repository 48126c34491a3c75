//! DHCPv4 server benchmark in real network namespaces (needs root, `ip`).
//!
//! Prints the DISCOVER→OFFER→REQUEST→ACK latency seen by a client on a veth attached to the
//! masquerade bridge, and the sustained DISCOVER→OFFER rate with a window of outstanding
//! requests. Run: `cargo bench --bench net_dhcp`.

use dhcproto::v4::MessageType;
use qlauncher::net::dhcp::v4::{client_message, decode};
use qlauncher::net::NetConfig;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};
use testkit::net::*;
use testkit::netns::*;

const MAC: [u8; 6] = [0x02, 0, 0, 0xaa, 0xbb, 0x02];
const SERVER: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::BROADCAST, 67);

fn client_socket(vm: &Netns) -> UdpSocket {
    qlauncher::net::netns::run_in(&vm.path(), || {
        use socket2::{Domain, Protocol, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
        s.set_reuse_address(true).unwrap();
        s.set_broadcast(true).unwrap();
        s.bind_device(Some(b"vmnic")).unwrap();
        s.bind(&SocketAddr::from(([0, 0, 0, 0], 68)).into())
            .unwrap();
        let s: UdpSocket = s.into();
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        s
    })
    .unwrap()
}

/// Waits for a reply of `kind` with `xid`; `None` on timeout.
fn wait(sock: &UdpSocket, buf: &mut [u8], xid: u32, kind: MessageType) -> Option<()> {
    loop {
        let n = sock.recv(buf).ok()?;
        if let Some(m) = decode(&buf[..n]) {
            if m.xid() == xid && m.opts().msg_type() == Some(kind) {
                return Some(());
            }
        }
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let net = PodNet::new(false);
    let resolv = resolv_conf();
    let cfg = NetConfig {
        hostname: "benchvmi".into(),
        ..Default::default()
    };
    let (plan, _) = setup(&net.pod, &cfg, resolv.path()).expect("setup");
    let servers = Servers::start(&net.pod, &plan);
    let vm = net.attach_vm("k6t-eth0", "02:00:00:aa:bb:02");
    vm.ip(&["addr", "add", "10.0.2.200/24", "dev", "vmnic"]);
    std::thread::sleep(Duration::from_millis(300));
    let sock = client_socket(&vm);
    let mut buf = vec![0u8; 2048];
    let prl = [1, 3, 6, 12, 15, 26, 28, 42, 119, 121];

    // Latency: full four-message exchanges, one at a time.
    let n = 500u32;
    let mut lat = Vec::new();
    for xid in 1..=n {
        let t = Instant::now();
        sock.send_to(
            &client_message(MessageType::Discover, MAC, xid, None, None, &prl),
            SERVER,
        )
        .unwrap();
        if wait(&sock, &mut buf, xid, MessageType::Offer).is_none() {
            continue;
        }
        let req = client_message(
            MessageType::Request,
            MAC,
            xid,
            Some(Ipv4Addr::new(10, 0, 2, 2)),
            Some(Ipv4Addr::new(10, 0, 2, 1)),
            &prl,
        );
        sock.send_to(&req, SERVER).unwrap();
        if wait(&sock, &mut buf, xid, MessageType::Ack).is_some() {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 - 1.0) * p) as usize].as_micros();
    println!(
        "dhcp DISCOVER->ACK latency ({} of {n} exchanges): min {} us, median {} us, p99 {} us, max {} us",
        lat.len(),
        pct(0.0),
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );

    // Throughput: keep a window of DISCOVERs outstanding for 3 seconds, count OFFERs.
    let window = 32u32;
    let run = Duration::from_secs(3);
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let start = Instant::now();
    let (mut next, mut outstanding, mut offers) = (100_000u32, 0u32, 0u64);
    while start.elapsed() < run {
        while outstanding < window {
            sock.send_to(
                &client_message(MessageType::Discover, MAC, next, None, None, &prl),
                SERVER,
            )
            .unwrap();
            next += 1;
            outstanding += 1;
        }
        match sock.recv(&mut buf) {
            Ok(len) => {
                if decode(&buf[..len])
                    .is_some_and(|m| m.opts().msg_type() == Some(MessageType::Offer))
                {
                    offers += 1;
                    outstanding -= 1;
                }
            }
            Err(_) => outstanding = 0,
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let snap = servers.stats_v4.snapshot();
    println!(
        "dhcp sustained: {:.0} requests/s answered (window {window}, {secs:.1} s, {offers} OFFERs; server saw {} datagrams, {} malformed, {} send errors)",
        offers as f64 / secs,
        snap.received,
        snap.malformed,
        snap.send_errors
    );
}
