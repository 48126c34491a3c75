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

/// virt-handler's bridge binding for `default` on pod link `eth0`, as KubeVirt v1.9's
/// `NetConf.Setup` makes it (`pkg/network/setup/netpod/netpod.go`, `bridgeBindingSpec`): the
/// bridge `k6t-eth0` up with 169.254.75.10/32; the pod link renamed `eth0-nic`, its addresses
/// gone, the bridge's MAC copied to it, a port of the bridge without learning; `tap0` owned by
/// 107:107 with the pod MTU, a port of the bridge; and a link `eth0` with the pod's MAC, MTU and
/// addresses. KubeVirt makes that last one a dummy link; this kernel has no dummy links, so the
/// test makes it an ifb, which adoption treats alike (only its presence is checked).
fn handler_bridge_setup(pod: &Netns) {
    pod.ip(&["link", "add", "k6t-eth0", "type", "bridge"]);
    pod.ip(&["link", "set", "k6t-eth0", "up"]);
    pod.ip(&["addr", "add", "169.254.75.10/32", "dev", "k6t-eth0"]);
    let bridge_mac = link_json(pod, "k6t-eth0")["address"]
        .as_str()
        .unwrap()
        .to_owned();
    pod.ip(&["addr", "flush", "dev", "eth0"]);
    pod.ip(&["link", "set", "eth0", "down"]);
    pod.ip(&["link", "set", "eth0", "name", "eth0-nic"]);
    pod.ip(&["link", "set", "eth0-nic", "address", &bridge_mac]);
    pod.ip(&["link", "set", "eth0-nic", "master", "k6t-eth0", "up"]);
    pod.ip(&[
        "link",
        "set",
        "dev",
        "eth0-nic",
        "type",
        "bridge_slave",
        "learning",
        "off",
    ]);
    pod.ip(&[
        "tuntap", "add", "dev", "tap0", "mode", "tap", "user", "107", "group", "107",
    ]);
    pod.ip(&[
        "link", "set", "tap0", "mtu", "1450", "master", "k6t-eth0", "up",
    ]);
    // An ifb takes its MAC only when made.
    pod.ip(&[
        "link", "add", "eth0", "address", POD_MAC, "mtu", "1450", "type", "ifb",
    ]);
    pod.ip(&["link", "set", "eth0", "up"]);
    pod.ip(&["addr", "add", "10.244.0.5/24", "dev", "eth0"]);
}

/// The links of the binding, with what adoption must not change.
fn binding_links(pod: &Netns) -> Vec<String> {
    ["k6t-eth0", "eth0-nic", "tap0", "eth0"]
        .iter()
        .map(|name| {
            let l = link_json(pod, name);
            let addrs = pod.ip(&["-br", "addr", "show", "dev", name]);
            format!(
                "{name} kind={} mac={} mtu={} master={} owner={} learning={} addrs={}",
                l["linkinfo"]["info_kind"],
                l["address"],
                l["mtu"],
                l["master"],
                l["linkinfo"]["info_data"]["user"],
                l["linkinfo"]["info_slave_data"]["learning"],
                addrs
                    .split_whitespace()
                    .skip(2)
                    .collect::<Vec<_>>()
                    .join(",")
            )
        })
        .collect()
}

/// The pod network virt-handler set up for the bridge binding is adopted as it is: nothing is
/// changed, the guest's MAC gets the pod address over DHCP, and teardown removes nothing.
#[test]
fn virt_handler_bridge_setup_is_adopted_unchanged() {
    let net = PodNet::new(false);
    let resolv = resolv_conf();
    handler_bridge_setup(&net.pod);
    let before = binding_links(&net.pod);
    let ruleset = net.pod.nft_ruleset();

    let (plan, applied) = setup(&net.pod, &config(), resolv.path()).unwrap();
    assert!(applied.adopted, "{applied:?}");
    assert_eq!(applied.changed, Vec::<String>::new());
    assert_eq!(binding_links(&net.pod), before);
    assert_eq!(net.pod.nft_ruleset(), ruleset);
    let dhcp = plan
        .dhcp_v4
        .as_ref()
        .expect("the guest gets the pod address by DHCP");
    assert_eq!(dhcp.client_mac, Some(POD_MAC_BYTES));

    // The guest (the pod's MAC on the bridge) gets the pod's address.
    let servers = Servers::start(&net.pod, &plan);
    let guest = net.attach_vm("k6t-eth0", POD_MAC);
    let dir = ClientDir::new();
    let script = dir.script(false);
    let out = udhcpc(&guest, &script, 5, &[]);
    assert!(out.status.success(), "{out:?}");
    let env = dir.wait_env(5);
    assert_eq!(env.get("ip").map(String::as_str), Some("10.244.0.5"));
    drop(guest);
    drop(servers);

    assert_eq!(
        teardown(&net.pod, &plan, &applied).unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(binding_links(&net.pod), before, "teardown left it alone");
}
