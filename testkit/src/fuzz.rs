//! The fuzz target bodies, shared by `fuzz/fuzz_targets/*.rs` (cargo-fuzz, libFuzzer; they include
//! this file as a module, the fuzz crate being outside the workspace) and `tests/harden_fuzz.rs`
//! (proptest, bounded, in CI). Each takes arbitrary bytes and must return without panicking,
//! hanging or allocating without bound; anything it checks beyond "no panic" is an invariant of
//! the code under test, asserted here. Uses only qlauncher, std and tokio, so that it compiles in
//! either crate.

use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};
use std::path::Path;
use std::time::Duration;

use qlauncher::cmdline::context::{IfaceFacts, TapSource};
use qlauncher::cmdline::{convert, render, ConverterContext};
use qlauncher::net::dhcp::v4::{DhcpV4Config, DhcpV4Server};
use qlauncher::net::dhcp::v6::{self, DhcpV6Config};
use qlauncher::net::dhcp::Outcome;
use qlauncher::net::DhcpExtraOptions;
use qlauncher::storage::{probe_image, ChainPolicy};
use qlauncher::vmi::{DefaultsConfig, Vmi};

/// A converter context with a tap fd for every interface of `vmi` (what the sync path hands in).
pub fn context_for(vmi: &Vmi) -> ConverterContext {
    let mut ctx = ConverterContext::default();
    for i in vmi
        .spec
        .domain
        .devices
        .interfaces
        .as_deref()
        .unwrap_or_default()
    {
        ctx.interfaces.insert(
            i.name.clone(),
            IfaceFacts {
                mac: None,
                mtu: Some(1500),
                tap: TapSource::Fds {
                    fds: vec![3],
                    vhostfds: vec![],
                },
            },
        );
    }
    ctx
}

/// VMI JSON/YAML -> defaults -> validation -> conversion -> argv and QMP plan.
/// Returns how far the input got: 0 parse error, 1 invalid, 2 conversion error, 3 rendered.
pub fn vmi_pipeline(data: &[u8]) -> u8 {
    let Ok(text) = std::str::from_utf8(data) else {
        return 0;
    };
    let Ok(mut vmi) = Vmi::from_json_or_yaml(text) else {
        return 0;
    };
    let cfg = DefaultsConfig::for_vmi(&vmi);
    vmi.apply_defaults(&cfg);
    if vmi.validate().is_err() {
        return 1;
    }
    let ctx = context_for(&vmi);
    let Ok(plan) = convert(&vmi, &ctx) else {
        return 2;
    };
    let argv = render::argv(&plan);
    for w in &argv {
        assert!(!w.contains('\0'), "NUL in argv word {w:?}");
    }
    let _ = render::qmp_plan(&plan);
    3
}

/// The DHCPv4 server configuration used for fuzzing (masquerade: any MAC).
pub fn v4_config() -> DhcpV4Config {
    DhcpV4Config {
        iface: "k6t-eth0".into(),
        server_ip: Ipv4Addr::new(10, 0, 2, 1),
        client_ip: Ipv4Addr::new(10, 0, 2, 2),
        prefix_len: 24,
        router: Some(Ipv4Addr::new(10, 0, 2, 1)),
        dns: vec![Ipv4Addr::new(10, 96, 0, 10)],
        search: vec!["default.svc.cluster.local".into()],
        domain_name: Some("default.svc.cluster.local".into()),
        hostname: "testvmi".into(),
        mtu: 1450,
        routes: vec![],
        lease_seconds: 86313600,
        client_mac: None,
        extra: DhcpExtraOptions {
            tftp_server_name: Some("tftp.example".into()),
            boot_file_name: Some("pxelinux.0".into()),
            ntp_servers: vec![Ipv4Addr::new(10, 0, 0, 123)],
            private_options: vec![(240, "private".into())],
        },
    }
}

/// One datagram through the DHCPv4 server: any reply it builds must decode again.
pub fn dhcp_v4(server: &DhcpV4Server, data: &[u8]) {
    if let Outcome::Reply { bytes, .. } = server.respond(data) {
        assert!(
            qlauncher::net::dhcp::v4::decode(&bytes).is_some(),
            "reply does not decode"
        );
    }
}

/// The DHCPv6 server configuration used for fuzzing.
pub fn v6_config() -> DhcpV6Config {
    DhcpV6Config {
        iface: "k6t-eth0".into(),
        server_mac: [2, 0, 0, 0, 0, 1],
        address: "fd10:0:2::2"
            .parse::<Ipv6Addr>()
            .unwrap_or(Ipv6Addr::LOCALHOST),
        dns: vec![Ipv6Addr::LOCALHOST],
        search: vec!["default.svc.cluster.local".into()],
    }
}

/// One datagram through the DHCPv6 server.
pub fn dhcp_v6(cfg: &DhcpV6Config, data: &[u8]) {
    let from = SocketAddrV6::new("fe80::1".parse().unwrap_or(Ipv6Addr::LOCALHOST), 546, 0, 2);
    let _ = v6::respond(cfg, data, from);
}

/// The QMP reader: a peer sends a greeting, then `data`, then closes. The client must either
/// fail cleanly or finish a command with an answer or an error, within the timeout.
pub fn qmp_reader(rt: &tokio::runtime::Runtime, data: &[u8]) {
    let data = data.to_vec();
    rt.block_on(async move {
        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        ours.set_nonblocking(true).expect("nonblocking");
        let ours = tokio::net::UnixStream::from_std(ours).expect("tokio stream");
        let peer = std::thread::spawn(move || {
            let _ = theirs.write_all(b"{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 0, \"minor\": 2, \"major\": 7}}, \"capabilities\": []}}\n");
            let _ = theirs.write_all(&data);
            let _ = theirs.shutdown(std::net::Shutdown::Write);
            // Keep reading so the client's writes never block, until it closes.
            let mut sink = [0u8; 4096];
            let _ = theirs.set_read_timeout(Some(Duration::from_secs(5)));
            while let Ok(n) = std::io::Read::read(&mut theirs, &mut sink) {
                if n == 0 {
                    break;
                }
            }
        });
        let res = tokio::time::timeout(
            Duration::from_secs(5),
            qlauncher::qmp::QmpClient::from_stream(ours, Duration::from_millis(500)),
        )
        .await
        .expect("from_stream returns within its own timeout");
        if let Ok(client) = res {
            let r = tokio::time::timeout(
                Duration::from_secs(5),
                client.execute_timeout("query-status", None, Duration::from_millis(200)),
            )
            .await;
            assert!(r.is_ok(), "execute did not return within its timeout");
        }
        let _ = peer.join();
    });
}

/// The image fact reader (format magic, qcow2 header, backing chain) over a file holding
/// `data`, in `dir`. Must return facts or an error, never panic.
pub fn image_facts(dir: &Path, data: &[u8]) {
    let path = dir.join("image");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let policy = ChainPolicy {
        allowed_roots: vec![dir.to_path_buf()],
        ..ChainPolicy::default()
    };
    let _ = probe_image("fuzz", &path, &policy);
}

/// Pod input (resolv.conf text, then pod routes) through the resolv.conf parser, planning and
/// the DHCP option builders, for both bindings; `data`: byte 0 picks the binding and whether
/// `spec.subdomain` is set, then resolv.conf text up to the first NUL, then 9-byte routes
/// (destination, prefix length, router; router 0.0.0.0 is on-link). Nothing in it may make
/// planning or the servers fail, and the guest's DISCOVER and SOLICIT get replies that decode,
/// fit 576 bytes and carry options 119 and 121 of at most 255 bytes.
pub fn pod_dns(data: &[u8]) {
    use qlauncher::net::discover::{PodFacts, PodIface, RouteV4};
    use qlauncher::net::{parse_resolv_conf, plan, Binding, NetConfig};
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (text, routes) = match rest.iter().position(|b| *b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let resolv = parse_resolv_conf(&String::from_utf8_lossy(text));
    let mut iface = PodIface {
        name: "eth0".into(),
        index: 2,
        mac: [0x0a, 0x58, 0x0a, 0xf4, 0, 5],
        mtu: 1450,
        ipv4: vec!["10.244.0.5/24".parse().expect("net")],
        ipv6: vec!["fd00:10:244::5/64".parse().expect("net")],
        ..Default::default()
    };
    for r in routes.chunks_exact(9) {
        let dst = Ipv4Addr::new(r[0], r[1], r[2], r[3]);
        let Ok(destination) = ipnet::Ipv4Net::new(dst, r[4] % 33) else {
            continue;
        };
        let gw = Ipv4Addr::new(r[5], r[6], r[7], r[8]);
        let gateway = (!gw.is_unspecified()).then_some(gw);
        if destination.prefix_len() == 0 {
            iface.gateway_v4 = gateway;
        }
        iface.routes_v4.push(RouteV4 {
            destination,
            gateway,
            protocol: 4,
        });
    }
    let facts = PodFacts { iface, resolv };
    let cfg = NetConfig {
        binding: if mode & 1 == 0 {
            Binding::Masquerade
        } else {
            Binding::Bridge
        },
        subdomain: (mode & 2 != 0).then(|| "mysub".to_string()),
        hostname: "fuzz".into(),
        ..Default::default()
    };
    let p = plan(&cfg, &facts).expect("pod input never fails planning");
    let v4 = p.dhcp_v4.clone().expect("DHCPv4 planned");
    let server = DhcpV4Server::new(v4.clone()).expect("pod input never fails the DHCPv4 server");
    let mac = v4.client_mac.unwrap_or([2, 0, 0, 0, 0, 9]);
    for prl in [&[][..], &[1, 3, 6, 15, 119, 121][..]] {
        let discover = qlauncher::net::dhcp::v4::client_message(
            dhcproto::v4::MessageType::Discover,
            mac,
            1,
            None,
            None,
            prl,
        );
        let Outcome::Reply { bytes, .. } = server.respond(&discover) else {
            panic!("no reply to DISCOVER");
        };
        assert!(bytes.len() + 28 <= 576, "reply of {} bytes", bytes.len());
        let m = qlauncher::net::dhcp::v4::decode(&bytes).expect("reply decodes");
        for code in [119u8, 121] {
            let mut i = 240;
            let mut total = 0usize;
            while i + 1 < bytes.len() && bytes[i] != 255 {
                if bytes[i] == 0 {
                    i += 1;
                    continue;
                }
                if bytes[i] == code {
                    total += usize::from(bytes[i + 1]);
                }
                i += 2 + usize::from(bytes[i + 1]);
            }
            assert!(total <= 255, "option {code} of {total} bytes");
        }
        let _ = m;
    }
    if let Some(v6cfg) = &p.dhcp_v6 {
        let mut solicit = vec![1, 0, 0, 7, 0, 1, 0, 10, 0, 3, 0, 1, 2, 0, 0, 0, 0, 9];
        solicit.extend_from_slice(&[0, 3, 0, 12, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        let from = SocketAddrV6::new(Ipv6Addr::LOCALHOST, 546, 0, 2);
        match v6::respond(v6cfg, &solicit, from) {
            Outcome::Reply { bytes, .. } => {
                v6::decode_client_message(&bytes).expect("Advertise decodes");
            }
            other => panic!("no Advertise: {other:?}"),
        }
    }
}
