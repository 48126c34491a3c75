//! Bridge binding in real network namespaces: the pod link becomes a bridge port, an ifb
//! stand-in keeps the pod identity, the guest (by MAC) gets the pod IP and routes over DHCP,
//! other MACs get nothing, and teardown gives the pod its link, addresses and routes back.

use qlauncher::net::{Binding, NetConfig};
use testkit::net::*;
use testkit::netns::*;

fn config() -> NetConfig {
    NetConfig {
        binding: Binding::Bridge,
        hostname: "bridgevmi".into(),
        ..Default::default()
    }
}

fn link_json(ns: &Netns, name: &str) -> serde_json::Value {
    let v: serde_json::Value =
        serde_json::from_str(&ns.ip(&["-d", "-j", "link", "show", "dev", name])).unwrap();
    v[0].clone()
}

#[test]
fn bridge_binding_moves_pod_identity_and_serves_the_guest_mac_only() {
    let net = PodNet::new(false);
    let resolv = resolv_conf();
    let routes_before = net.pod.ip(&["route"]);
    let addrs_before = net.pod.ip(&["-br", "addr", "show", "dev", "eth0"]);
    let (plan, applied) = setup(&net.pod, &config(), resolv.path()).unwrap();

    let standin = link_json(&net.pod, "eth0");
    assert_eq!(
        (
            standin["linkinfo"]["info_kind"].as_str(),
            standin["address"].as_str(),
            standin["mtu"].as_u64()
        ),
        (Some("ifb"), Some(POD_MAC), Some(1450))
    );
    assert_eq!(
        net.pod
            .ip(&["-br", "-4", "addr", "show", "dev", "eth0"])
            .split_whitespace()
            .nth(2),
        Some("10.244.0.5/24")
    );
    let nic = link_json(&net.pod, "eth0-nic");
    assert_eq!(nic["master"].as_str(), Some("k6t-eth0"));
    assert_eq!(
        nic["linkinfo"]["info_slave_data"]["learning"].as_bool(),
        Some(false)
    );
    assert_ne!(nic["address"].as_str(), Some(POD_MAC));
    assert_eq!(
        net.pod
            .ip(&["-br", "-4", "addr", "show", "dev", "k6t-eth0"])
            .split_whitespace()
            .nth(2),
        Some("169.254.75.10/32")
    );
    assert_eq!(
        link_json(&net.pod, "tap0")["master"].as_str(),
        Some("k6t-eth0")
    );
    assert_eq!(net.pod.sysctl("net.ipv4.conf.all.arp_ignore"), "1");
    assert_eq!(
        reapply(&net.pod, &plan).unwrap().changed,
        Vec::<String>::new()
    );

    let servers = Servers::start(&net.pod, &plan);
    // Another MAC gets no lease.
    let stranger = net.attach_vm("k6t-eth0", "02:00:00:00:00:99");
    let dir = ClientDir::new();
    let script = dir.script(false);
    let out = udhcpc(&stranger, &script, 2, &[]);
    assert!(!out.status.success(), "a foreign MAC must not get a lease");
    assert!(servers.stats_v4.snapshot().ignored >= 1);
    drop(stranger);

    // The guest MAC (the pod MAC) gets the pod IP and routes.
    let vm = net.attach_vm("k6t-eth0", POD_MAC);
    let dir = ClientDir::new();
    let script = dir.script(true);
    let out = udhcpc(&vm, &script, 5, &["staticroutes", "mtu", "search"]);
    assert!(
        out.status.success(),
        "udhcpc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = dir.wait_env(5);
    let got: Vec<(&str, &str)> = [
        "ip",
        "subnet",
        "router",
        "staticroutes",
        "mtu",
        "hostname",
        "serverid",
    ]
    .iter()
    .map(|k| (*k, env.get(*k).map(String::as_str).unwrap_or("")))
    .collect();
    assert_eq!(
        got,
        vec![
            ("ip", "10.244.0.5"),
            ("subnet", "255.255.255.0"),
            ("router", "10.244.0.1"),
            (
                "staticroutes",
                "10.96.0.0/12 10.244.0.1 0.0.0.0/0 10.244.0.1"
            ),
            ("mtu", "1450"),
            ("hostname", "bridgevmi"),
            ("serverid", "169.254.75.10"),
        ]
    );
    // The guest talks to the node directly through the bridge with the pod IP.
    let (peer, msg) = tcp_once(&net.node, &vm, "10.244.0.1:8081", "bridged");
    assert_eq!(
        (peer.ip().to_string(), msg.as_str()),
        ("10.244.0.5".to_string(), "bridged")
    );
    drop(servers);
    drop(vm);

    teardown(&net.pod, &plan, &applied).unwrap();
    assert_eq!(
        link_json(&net.pod, "eth0")["linkinfo"]["info_kind"].as_str(),
        Some("veth")
    );
    assert_eq!(
        link_json(&net.pod, "eth0")["address"].as_str(),
        Some(POD_MAC)
    );
    assert_eq!(
        net.pod.ip(&["-br", "addr", "show", "dev", "eth0"]),
        addrs_before
    );
    assert_eq!(net.pod.ip(&["route"]), routes_before);
    assert_eq!(net.pod.sysctl("net.ipv4.conf.all.arp_ignore"), "0");
    let links = net.pod.ip(&["-br", "link"]);
    let names: Vec<&str> = links
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names.len(), 2, "{links}");
    assert_eq!(names[0], "lo");
    assert!(names[1].starts_with("eth0@"), "{links}");
}
