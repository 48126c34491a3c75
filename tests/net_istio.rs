//! The masquerade binding of a VMI with an Istio sidecar (`sidecar.istio.io/inject: "true"`),
//! in real network namespaces: the NetConfig made from the VMI's annotation gives the nftables
//! rules KubeVirt v1.9 writes (`pkg/network/setup/netpod/masquerade/masquerade.go` with
//! `WithIstio`), checked against the `nft` CLI running KubeVirt's own commands, and Envoy's ports
//! stay in the pod: a connection from the pod to 127.0.0.1:15021 reaches a listener in the pod,
//! while other loopback ports still reach the guest.

use qlauncher::net::config::istio_proxy_injection;
use qlauncher::net::NetConfig;
use qlauncher::vmi::Vmi;
use testkit::net::*;
use testkit::netns::*;

const GUEST_MAC: &str = "02:00:00:aa:bb:02";

fn vmi(inject: &str) -> Vmi {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "istio-vmi",
            "annotations": {"sidecar.istio.io/inject": inject}
        },
        "spec": {
            "domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {}}]}},
            "networks": [{"name": "default", "pod": {}}]
        }
    }))
    .expect("VMI")
}

fn config(vmi: &Vmi) -> NetConfig {
    NetConfig {
        istio: istio_proxy_injection(vmi),
        ..Default::default()
    }
}

/// The `nft` commands KubeVirt v1.9's `setupNATByFamily` runs for an Istio VMI without ports
/// (no legacy migration ports: the migration transport is Unix), for both families.
fn kubevirt_istio_commands() -> Vec<Vec<String>> {
    let mut cmds: Vec<Vec<String>> = Vec::new();
    let mut add = |words: &[&str]| cmds.push(words.iter().map(|w| w.to_string()).collect());
    for (fam, guest, gw, lo) in [
        ("ip", "10.0.2.2", "10.0.2.1", "127.0.0.1"),
        ("ip6", "fd10:0:2::2", "fd10:0:2::1", "::1"),
    ] {
        add(&["add", "table", fam, "nat"]);
        for (chain, spec) in [
            ("prerouting", "{ type nat hook prerouting priority -100; }"),
            ("input", "{ type nat hook input priority 100; }"),
            ("output", "{ type nat hook output priority -100; }"),
            ("postrouting", "{ type nat hook postrouting priority 100; }"),
        ] {
            add(&["add", "chain", fam, "nat", chain, spec]);
        }
        add(&["add", "chain", fam, "nat", "KUBEVIRT_PREINBOUND"]);
        add(&["add", "chain", fam, "nat", "KUBEVIRT_POSTINBOUND"]);
        add(&[
            "add",
            "rule",
            fam,
            "nat",
            "postrouting",
            fam,
            "saddr",
            guest,
            "counter",
            "masquerade",
        ]);
        add(&[
            "add",
            "rule",
            fam,
            "nat",
            "prerouting",
            "iifname",
            "eth0",
            "counter",
            "jump",
            "KUBEVIRT_PREINBOUND",
        ]);
        add(&[
            "add",
            "rule",
            fam,
            "nat",
            "postrouting",
            "oifname",
            "k6t-eth0",
            "counter",
            "jump",
            "KUBEVIRT_POSTINBOUND",
        ]);
        let reserved = "{ 15000, 15001, 15004, 15006, 15008, 15009, 15020, 15021, 15053, 15090 }";
        for chain in ["output", "KUBEVIRT_POSTINBOUND"] {
            add(&[
                "add", "rule", fam, "nat", chain, "tcp", "dport", reserved, fam, "saddr", lo,
                "counter", "return",
            ]);
        }
        add(&[
            "add",
            "rule",
            fam,
            "nat",
            "KUBEVIRT_PREINBOUND",
            "tcp",
            "dport",
            "{ 22 }",
            "counter",
            "dnat",
            "to",
            guest,
        ]);
        let (dnat, snat) = if fam == "ip" {
            ("{ 127.0.0.1, 10.244.0.5 }", "{ 127.0.0.1, 127.0.0.6 }")
        } else {
            ("{ ::1 }", "{ ::1 }")
        };
        add(&[
            "add",
            "rule",
            fam,
            "nat",
            "KUBEVIRT_POSTINBOUND",
            fam,
            "saddr",
            snat,
            "counter",
            "snat",
            "to",
            gw,
        ]);
        add(&[
            "add", "rule", fam, "nat", "output", fam, "daddr", dnat, "counter", "dnat", "to", guest,
        ]);
    }
    cmds
}

fn kubevirt_ruleset() -> String {
    let scratch = Netns::new("kv-istio");
    for c in kubevirt_istio_commands() {
        let mut args = vec!["nft"];
        args.extend(c.iter().map(String::as_str));
        scratch.sh(&args);
    }
    scratch.nft_ruleset()
}

/// A guest NIC in its own netns with the masquerade guest addresses and routes back.
fn guest(net: &PodNet) -> Netns {
    let vm = net.attach_vm("k6t-eth0", GUEST_MAC);
    vm.ip(&["addr", "add", "10.0.2.2/24", "dev", "vmnic"]);
    vm.ip(&["addr", "add", "fd10:0:2::2/120", "dev", "vmnic", "nodad"]);
    vm.ip(&["route", "add", "default", "via", "10.0.2.1"]);
    vm
}

/// Whether a listener has a connection waiting (without blocking).
fn has_connection(l: &std::net::TcpListener) -> bool {
    l.set_nonblocking(true).expect("nonblocking");
    l.accept().is_ok()
}

#[test]
fn istio_vmi_gets_kubevirts_rules_for_both_families() {
    let vmi = vmi("true");
    let cfg = config(&vmi);
    assert!(cfg.istio, "the annotation sets the Istio variant");
    let net = PodNet::new(true);
    let resolv = resolv_conf();
    setup(&net.pod, &cfg, resolv.path()).expect("setup");
    let got = net.pod.nft_ruleset();
    assert_eq!(got, kubevirt_ruleset());
    assert!(got.contains("table ip6 nat"), "{got}");
}

#[test]
fn envoy_health_port_stays_in_the_pod_and_other_ports_reach_the_guest() {
    let net = PodNet::new(true);
    let resolv = resolv_conf();
    setup(&net.pod, &config(&vmi("TRUE")), resolv.path()).expect("setup");
    let vm = guest(&net);
    // Envoy's health port: the pod's own listener answers, the guest's does not see it.
    let envoy = listen(&net.pod, "127.0.0.1:15021");
    let guest_envoy = listen(&vm, "0.0.0.0:15021");
    send_from(&net.pod, "127.0.0.1:15021", "healthz").expect("connect 127.0.0.1:15021");
    let (peer, msg) = accept_one(&envoy);
    assert_eq!(
        (peer.ip().to_string(), msg.as_str()),
        ("127.0.0.1".into(), "healthz")
    );
    assert!(
        !has_connection(&guest_envoy),
        "127.0.0.1:15021 reached the guest"
    );
    // The same over IPv6 loopback.
    let envoy6 = listen(&net.pod, "[::1]:15021");
    send_from(&net.pod, "[::1]:15021", "healthz6").expect("connect [::1]:15021");
    assert_eq!(accept_one(&envoy6).1, "healthz6");
    // A port Envoy does not hold still goes to the guest, from the gateway address.
    let guest_app = listen(&vm, "0.0.0.0:8080");
    send_from(&net.pod, "127.0.0.1:8080", "app").expect("connect 127.0.0.1:8080");
    let (peer, msg) = accept_one(&guest_app);
    assert_eq!(
        (peer.ip().to_string(), msg.as_str()),
        ("10.0.2.1".into(), "app")
    );
}

#[test]
fn without_the_annotation_the_health_port_goes_to_the_guest() {
    // The control: the same connection without Istio is forwarded to the guest.
    let cfg = config(&vmi("false"));
    assert!(!cfg.istio);
    let net = PodNet::new(false);
    let resolv = resolv_conf();
    setup(&net.pod, &cfg, resolv.path()).expect("setup");
    let vm = guest(&net);
    let pod_listener = listen(&net.pod, "127.0.0.1:15021");
    let guest_listener = listen(&vm, "0.0.0.0:15021");
    send_from(&net.pod, "127.0.0.1:15021", "healthz").expect("connect");
    assert_eq!(accept_one(&guest_listener).1, "healthz");
    assert!(!has_connection(&pod_listener));
}
