//! Masquerade binding end to end: real DHCP clients (busybox udhcpc, ISC dhclient for v4 and
//! v6) on a veth attached to the bridge get 10.0.2.2 and every option; traffic from the client
//! is masqueraded to the node; a connection to the pod IP on a listed port is DNATed to it.

use qlauncher::net::{DhcpExtraOptions, NetConfig, Port, Protocol};
use testkit::net::*;
use testkit::netns::*;

const GUEST_MAC: &str = "02:00:00:aa:bb:01";

fn config() -> NetConfig {
    NetConfig {
        hostname: "testvmi".into(),
        mac: Some([0x02, 0, 0, 0xaa, 0xbb, 0x01]),
        ports: vec![Port {
            protocol: Protocol::Tcp,
            port: 80,
        }],
        dhcp_options: DhcpExtraOptions {
            tftp_server_name: Some("tftp.example".into()),
            boot_file_name: Some("pxelinux.0".into()),
            ntp_servers: vec!["10.0.0.123".parse().unwrap()],
            private_options: vec![(240, "private-value".into())],
        },
        ..Default::default()
    }
}

fn pick(env: &std::collections::BTreeMap<String, String>, keys: &[&str]) -> Vec<(String, String)> {
    keys.iter()
        .map(|k| (k.to_string(), env.get(*k).cloned().unwrap_or_default()))
        .collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn udhcpc_gets_lease_and_options_and_traffic_is_natted() {
    let net = PodNet::new(false);
    let resolv = resolv_conf();
    let (plan, _applied) = setup(&net.pod, &config(), resolv.path()).unwrap();
    let _servers = Servers::start(&net.pod, &plan);
    let vm = net.attach_vm("k6t-eth0", GUEST_MAC);
    let dir = ClientDir::new();
    let script = dir.script(true);
    let out = udhcpc(
        &vm,
        &script,
        5,
        &[
            "search",
            "staticroutes",
            "mtu",
            "tftp",
            "bootfile",
            "ntpsrv",
            "240",
        ],
    );
    assert!(
        out.status.success(),
        "udhcpc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = dir.wait_env(5);
    assert_eq!(
        pick(
            &env,
            &[
                "ip", "subnet", "router", "dns", "hostname", "domain", "search", "mtu", "lease",
                "tftp", "bootfile", "ntpsrv", "opt240", "serverid"
            ]
        ),
        pairs(&[
            ("ip", "10.0.2.2"),
            ("subnet", "255.255.255.0"),
            ("router", "10.0.2.1"),
            ("dns", "10.96.0.10"),
            ("hostname", "testvmi"),
            ("domain", "default.svc.cluster.local"),
            (
                "search",
                "default.svc.cluster.local svc.cluster.local cluster.local"
            ),
            ("mtu", "1450"),
            ("lease", "86313600"),
            ("tftp", "tftp.example"),
            ("bootfile", "pxelinux.0"),
            ("ntpsrv", "10.0.0.123"),
            ("opt240", "707269766174652d76616c7565"),
            ("serverid", "10.0.2.1"),
        ])
    );
    // Masquerade: the node sees the pod IP as the source.
    let (peer, msg) = tcp_once(&net.node, &vm, "10.244.0.1:8080", "from-guest");
    assert_eq!(
        (peer.ip().to_string(), msg.as_str()),
        ("10.244.0.5".to_string(), "from-guest")
    );
    // DNAT: a connection to the pod IP on listed port 80 reaches the guest.
    let guest_listener = listen(&vm, "0.0.0.0:80");
    send_from(&net.node, "10.244.0.5:80", "to-guest").unwrap();
    let (peer, msg) = accept_one(&guest_listener);
    assert_eq!(
        (peer.ip().to_string(), msg.as_str()),
        ("10.244.0.1".to_string(), "to-guest")
    );
}

#[test]
fn dhclient_gets_lease_and_options() {
    let net = PodNet::new(false);
    let resolv = resolv_conf();
    let (plan, _applied) = setup(&net.pod, &config(), resolv.path()).unwrap();
    let servers = Servers::start(&net.pod, &plan);
    let vm = net.attach_vm("k6t-eth0", GUEST_MAC);
    let dir = ClientDir::new();
    let script = dir.script(false);
    let conf = dir.path("dhclient.conf");
    std::fs::write(
        &conf,
        "option rfc3442-classless-static-routes code 121 = array of unsigned integer 8;\n\
         option private-240 code 240 = string;\n\
         request subnet-mask, routers, domain-name-servers, host-name, domain-name, domain-search,\n\
         interface-mtu, ntp-servers, tftp-server-name, bootfile-name, private-240;\n",
    )
    .unwrap();
    let _client = dir.dhclient(&vm, "-4", Some(&conf), &script);
    let env = dir.wait_env(20);
    assert_eq!(
        pick(
            &env,
            &[
                "new_ip_address",
                "new_subnet_mask",
                "new_routers",
                "new_domain_name_servers",
                "new_host_name",
                "new_domain_name",
                "new_domain_search",
                "new_interface_mtu",
                "new_dhcp_lease_time",
                "new_ntp_servers",
                "new_tftp_server_name",
                "new_bootfile_name",
                "new_private_240",
                "new_dhcp_server_identifier"
            ]
        ),
        pairs(&[
            ("new_ip_address", "10.0.2.2"),
            ("new_subnet_mask", "255.255.255.0"),
            ("new_routers", "10.0.2.1"),
            ("new_domain_name_servers", "10.96.0.10"),
            ("new_host_name", "testvmi"),
            ("new_domain_name", "default.svc.cluster.local"),
            (
                "new_domain_search",
                "default.svc.cluster.local. svc.cluster.local. cluster.local."
            ),
            ("new_interface_mtu", "1450"),
            ("new_dhcp_lease_time", "86313600"),
            ("new_ntp_servers", "10.0.0.123"),
            ("new_tftp_server_name", "tftp.example"),
            ("new_bootfile_name", "pxelinux.0"),
            ("new_private_240", "private-value"),
            ("new_dhcp_server_identifier", "10.0.2.1"),
        ])
    );
    assert_eq!(servers.stats_v4.snapshot().malformed, 0);
}

#[test]
fn dhclient6_gets_ia_na_and_dns() {
    let net = PodNet::new(true);
    let resolv = resolv_conf();
    let (plan, _applied) = setup(&net.pod, &config(), resolv.path()).unwrap();
    let _servers = Servers::start(&net.pod, &plan);
    let vm = net.attach_vm("k6t-eth0", GUEST_MAC);
    let dir = ClientDir::new();
    let script = dir.script(false);
    let _client = dir.dhclient(&vm, "-6", None, &script);
    let env = dir.wait_env(30);
    assert_eq!(
        pick(&env, &["new_ip6_address", "new_dhcp6_name_servers"]),
        pairs(&[
            ("new_ip6_address", "fd10:0:2::2"),
            ("new_dhcp6_name_servers", "fd00:10:96::a")
        ])
    );
}

#[test]
fn malformed_datagrams_are_counted_and_the_server_keeps_serving() {
    let net = PodNet::new(false);
    let resolv = resolv_conf();
    let (plan, _applied) = setup(&net.pod, &config(), resolv.path()).unwrap();
    let servers = Servers::start(&net.pod, &plan);
    let vm = net.attach_vm("k6t-eth0", GUEST_MAC);
    vm.ip(&["addr", "add", "10.0.2.200/24", "dev", "vmnic"]);
    qlauncher::net::netns::run_in(&vm.path(), || {
        let s = std::net::UdpSocket::bind("10.0.2.200:0").unwrap();
        s.set_broadcast(true).unwrap();
        for junk in [
            &b""[..],
            b"\x01\x02\x03",
            &[0xffu8; 300][..],
            &[0u8; 600][..],
        ] {
            s.send_to(junk, "10.0.2.1:67").unwrap();
        }
    })
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let snap = servers.stats_v4.snapshot();
    assert_eq!((snap.received, snap.malformed), (4, 4));
    // Then 400 random datagrams: pure noise and mutated DISCOVERs (xorshift, seed printed).
    let seed = u64::from(std::process::id()) | 1;
    eprintln!("fuzz seed {seed}");
    let sent = qlauncher::net::netns::run_in(&vm.path(), move || {
        let s = std::net::UdpSocket::bind("10.0.2.200:0").unwrap();
        let mut x = seed;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let base = qlauncher::net::dhcp::v4::client_message(
            dhcproto::v4::MessageType::Discover,
            [2, 0, 0, 0, 0, 7],
            1,
            None,
            None,
            &[1, 3, 6, 119, 121],
        );
        for i in 0..400u32 {
            let pkt: Vec<u8> = if i % 2 == 0 {
                (0..next() % 700).map(|_| next() as u8).collect()
            } else {
                let mut p = base.clone();
                for _ in 0..1 + next() % 8 {
                    let at = (next() as usize) % p.len();
                    p[at] = next() as u8;
                }
                p
            };
            s.send_to(&pkt, "10.0.2.1:67").unwrap();
            if i % 50 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        400u64
    })
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let snap = servers.stats_v4.snapshot();
    assert_eq!(snap.received, 4 + sent, "every datagram is accounted for");
    assert!(snap.malformed >= 4 + 200, "{snap:?}");
    vm.ip(&["addr", "flush", "dev", "vmnic"]);
    let dir = ClientDir::new();
    let script = dir.script(false);
    let out = udhcpc(&vm, &script, 5, &[]);
    assert!(
        out.status.success(),
        "udhcpc after junk: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        dir.wait_env(5).get("ip").map(String::as_str),
        Some("10.0.2.2")
    );
}

#[test]
fn optional_router_advertisement_gives_the_guest_an_ipv6_default_route() {
    let net = PodNet::new(true);
    let resolv = resolv_conf();
    let cfg = NetConfig {
        ipv6_router_advertisement: true,
        ..config()
    };
    let (mut plan, _applied) = setup(&net.pod, &cfg, resolv.path()).unwrap();
    plan.router_advertisement
        .as_mut()
        .expect("RA planned")
        .interval_secs = 1;
    let _servers = Servers::start(&net.pod, &plan);
    let vm = net.attach_vm("k6t-eth0", GUEST_MAC);
    let mut route = String::new();
    for _ in 0..100 {
        route = vm.ip(&["-6", "route", "show", "default"]);
        if !route.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let words: Vec<&str> = route.split_whitespace().collect();
    assert_eq!(
        (words.first(), words.get(1), words.get(3), words.get(4)),
        (Some(&"default"), Some(&"via"), Some(&"dev"), Some(&"vmnic")),
        "{route}"
    );
    assert!(words[2].starts_with("fe80::"), "{route}");
}

#[test]
fn router_advertisement_is_off_by_default() {
    let net = PodNet::new(true);
    let resolv = resolv_conf();
    let (plan, _applied) = setup(&net.pod, &config(), resolv.path()).unwrap();
    assert_eq!(plan.router_advertisement, None);
}

#[test]
fn nak_inform_and_release_over_the_wire() {
    use dhcproto::v4::{DhcpOption, Flags, HType, Message, MessageType, Opcode};
    use dhcproto::Encodable;
    use qlauncher::net::dhcp::v4::{client_message, decode};
    let net = PodNet::new(false);
    let resolv = resolv_conf();
    let (plan, _applied) = setup(&net.pod, &config(), resolv.path()).unwrap();
    let servers = Servers::start(&net.pod, &plan);
    let vm = net.attach_vm("k6t-eth0", GUEST_MAC);
    vm.ip(&["addr", "add", "10.0.2.2/24", "dev", "vmnic"]);
    let mac = [0x02, 0, 0, 0xaa, 0xbb, 0x01];
    let replies = qlauncher::net::netns::run_in(&vm.path(), move || {
        use socket2::{Domain, Protocol, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
        s.set_reuse_address(true).unwrap();
        s.set_broadcast(true).unwrap();
        s.bind_device(Some(b"vmnic")).unwrap();
        s.bind(&std::net::SocketAddr::from(([0, 0, 0, 0], 68)).into())
            .unwrap();
        let s: std::net::UdpSocket = s.into();
        s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        let server = "10.0.2.1:67";
        let mut buf = [0u8; 1500];
        let mut recv = |s: &std::net::UdpSocket| {
            let n = s.recv(&mut buf).expect("reply");
            decode(&buf[..n]).expect("decodes")
        };
        // REQUEST for an address that is not the guest's: NAK.
        s.send_to(
            &client_message(
                MessageType::Request,
                mac,
                11,
                Some("10.0.2.9".parse().unwrap()),
                None,
                &[],
            ),
            server,
        )
        .unwrap();
        let nak = recv(&s);
        // INFORM from a configured client: ACK without lease, to ciaddr.
        let mut inform = Message::default();
        inform
            .set_opcode(Opcode::BootRequest)
            .set_htype(HType::Eth)
            .set_xid(12)
            .set_flags(Flags::default())
            .set_chaddr(&mac)
            .set_ciaddr("10.0.2.2".parse::<std::net::Ipv4Addr>().unwrap());
        inform
            .opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Inform));
        s.send_to(&inform.to_vec().unwrap(), server).unwrap();
        let ack = recv(&s);
        // RELEASE: recorded, no reply.
        s.send_to(
            &client_message(MessageType::Release, mac, 13, None, None, &[]),
            server,
        )
        .unwrap();
        (nak, ack)
    })
    .unwrap();
    let (nak, ack) = replies;
    assert_eq!(
        (nak.xid(), nak.opts().msg_type()),
        (11, Some(MessageType::Nak))
    );
    assert_eq!(
        (ack.xid(), ack.opts().msg_type(), ack.yiaddr()),
        (12, Some(MessageType::Ack), std::net::Ipv4Addr::UNSPECIFIED)
    );
    assert!(ack
        .opts()
        .get(dhcproto::v4::OptionCode::AddressLeaseTime)
        .is_none());
    assert!(ack
        .opts()
        .get(dhcproto::v4::OptionCode::DomainNameServer)
        .is_some());
    std::thread::sleep(std::time::Duration::from_millis(200));
    let snap = servers.stats_v4.snapshot();
    assert_eq!((snap.naks, snap.releases, snap.received), (1, 1, 3));
}
