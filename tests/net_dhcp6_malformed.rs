//! DHCPv6 server against crafted messages over the wire, in network namespaces: Solicit,
//! Request and Information-request with malformed options (the three option lengths dhcproto
//! 0.15 subtracts below zero, an option past the end, a truncated IA_NA, missing identifiers)
//! are dropped and counted as malformed, the well-formed ones are answered, and the server keeps
//! serving a real client (dhclient -6) afterwards. The inputs in `fuzz/regressions/dhcp_v6/` are
//! checked to be reported malformed.

use qlauncher::net::dhcp::Outcome;
use qlauncher::net::NetConfig;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::time::Duration;
use testkit::net::*;
use testkit::netns::*;

const GUEST_MAC: &str = "02:00:00:aa:bb:04";
const CLIENT_ID: &[u8] = &[0, 1, 0, 10, 0, 3, 0, 1, 2, 0, 0, 0xaa, 0xbb, 4];
/// The server DUID of the masquerade bridge (DUID-LL of 02:00:00:00:00:00).
const SERVER_ID: &[u8] = &[0, 2, 0, 10, 0, 3, 0, 1, 2, 0, 0, 0, 0, 0];
const IA_NA: &[u8] = &[0, 3, 0, 12, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0];
const ORO: &[u8] = &[0, 6, 0, 4, 0, 23, 0, 24];

fn msg(kind: u8, xid: u8, opts: &[&[u8]]) -> Vec<u8> {
    let mut m = vec![kind, 0, 0, xid];
    for o in opts {
        m.extend_from_slice(o);
    }
    m
}

/// Sends each message from the guest's link-local address to ff02::1:2 and returns, per
/// message, the type of the reply (or `None` when none came within 500 ms).
fn exchange(vm: &Netns, msgs: Vec<Vec<u8>>) -> Vec<Option<u8>> {
    qlauncher::net::netns::run_in(&vm.path(), move || {
        use socket2::{Domain, Protocol, Socket, Type};
        let index = nix::net::if_::if_nametoindex("vmnic").expect("vmnic");
        let s = Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP)).expect("socket");
        s.set_only_v6(true).unwrap();
        s.set_reuse_address(true).unwrap();
        s.bind_device(Some(b"vmnic")).unwrap();
        s.bind(
            &std::net::SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 546, 0, 0)).into(),
        )
        .expect("bind [::]:546");
        let s: std::net::UdpSocket = s.into();
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let to = SocketAddrV6::new("ff02::1:2".parse().unwrap(), 547, 0, index);
        let mut out = Vec::new();
        let mut buf = [0u8; 2048];
        for m in msgs {
            // The link-local address may still be coming up: retry the first send.
            let mut sent = false;
            for _ in 0..20 {
                if s.send_to(&m, to).is_ok() {
                    sent = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            assert!(sent, "cannot send to ff02::1:2");
            let reply = match s.recv(&mut buf) {
                Ok(n) if n >= 4 && buf[1..4] == m[1..4] => Some(buf[0]),
                Ok(_) => None,
                Err(_) => None,
            };
            out.push(reply);
        }
        out
    })
    .expect("netns")
}

#[test]
fn malformed_solicit_request_and_information_request_are_dropped_and_counted() {
    let net = PodNet::new(true);
    let resolv = resolv_conf();
    let (plan, _applied) = setup(&net.pod, &NetConfig::default(), resolv.path()).unwrap();
    let servers = Servers::start(&net.pod, &plan);
    let vm = net.attach_vm("k6t-eth0", GUEST_MAC);
    let malformed = vec![
        // Solicit: status code of 1 byte, vendor class of 3, vendor opts of 2 (dhcproto's
        // three subtractions), an option past the end, a truncated IA_NA, no client id.
        msg(1, 1, &[CLIENT_ID, IA_NA, &[0, 13, 0, 1, 0]]),
        msg(1, 2, &[CLIENT_ID, IA_NA, &[0, 16, 0, 3, 0, 0, 1]]),
        msg(1, 3, &[CLIENT_ID, IA_NA, &[0, 17, 0, 2, 0, 0]]),
        msg(1, 4, &[CLIENT_ID, IA_NA, &[0, 6, 0, 30, 0, 23]]),
        msg(1, 5, &[CLIENT_ID, &[0, 3, 0, 8, 0, 0, 0, 9, 0, 0, 0, 0]]),
        msg(1, 6, &[IA_NA]),
        // Request: an IA_NA whose IA Address runs past it, no server id, bad status code.
        msg(
            3,
            7,
            &[
                CLIENT_ID,
                SERVER_ID,
                &[0, 3, 0, 16, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 24],
            ],
        ),
        msg(3, 8, &[CLIENT_ID, IA_NA]),
        msg(3, 9, &[CLIENT_ID, SERVER_ID, IA_NA, &[0, 13, 0, 0]]),
        // Information-request: with an IA_NA, a vendor class of 0 bytes, a cut option header.
        msg(11, 10, &[CLIENT_ID, IA_NA]),
        msg(11, 11, &[CLIENT_ID, &[0, 16, 0, 0]]),
        msg(11, 12, &[CLIENT_ID, ORO, &[0, 8, 0]]),
    ];
    let n = malformed.len() as u64;
    let replies = exchange(&vm, malformed);
    assert_eq!(
        replies,
        vec![None; n as usize],
        "malformed messages were answered"
    );
    let snap = servers.stats_v6.snapshot();
    assert_eq!((snap.received, snap.malformed, snap.replied), (n, n, 0));

    // Well-formed ones are answered: Solicit with Advertise (2), the others with Reply (7).
    let good = vec![
        msg(1, 20, &[CLIENT_ID, IA_NA, ORO, &[0, 8, 0, 2, 0, 0]]),
        msg(
            3,
            21,
            &[CLIENT_ID, SERVER_ID, IA_NA, ORO, &[0, 8, 0, 2, 0, 0]],
        ),
        msg(11, 22, &[CLIENT_ID, ORO, &[0, 8, 0, 2, 0, 0]]),
        msg(11, 23, &[ORO]),
    ];
    assert_eq!(
        exchange(&vm, good),
        vec![Some(2), Some(7), Some(7), Some(7)]
    );
    let snap = servers.stats_v6.snapshot();
    assert_eq!((snap.received, snap.malformed, snap.replied), (n + 4, n, 4));

    // And a real client still gets its lease.
    let dir = ClientDir::new();
    let script = dir.script(false);
    let _client = dir.dhclient(&vm, "-6", None, &script);
    assert_eq!(
        dir.wait_env(30).get("new_ip6_address").map(String::as_str),
        Some("fd10:0:2::2")
    );
}

#[test]
fn regression_inputs_are_malformed() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/dhcp_v6");
    let cfg = qlauncher::net::dhcp::v6::DhcpV6Config {
        iface: "k6t-eth0".into(),
        server_mac: [2, 0, 0, 0, 0, 0],
        address: "fd10:0:2::2".parse().unwrap(),
        dns: vec![],
        search: vec![],
    };
    let from = SocketAddrV6::new("fe80::1".parse().unwrap(), 546, 0, 2);
    let mut n = 0;
    for e in std::fs::read_dir(dir).expect("regressions") {
        let path = e.expect("entry").path();
        let out = qlauncher::net::dhcp::v6::respond(&cfg, &std::fs::read(&path).unwrap(), from);
        assert!(
            matches!(out, Outcome::Malformed(_)),
            "{}: {out:?}",
            path.display()
        );
        n += 1;
    }
    assert!(n >= 8, "{n} regression inputs");
}
