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
    assert_eq!(got, kubevirt_nft_ruleset(&cfg));
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
