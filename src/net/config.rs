//! The input of the network setup: what the orchestrator reads from the VMI for one interface.
//!
//! This is qlauncher's own shape (the VMI types live in `crate::vmi`); `sync` fills it from
//! `spec.domain.devices.interfaces[i]`, `spec.networks[i]`, the VMI annotations and the launcher's
//! runtime user.

use ipnet::{Ipv4Net, Ipv6Net};
use std::net::{Ipv4Addr, Ipv6Addr};

/// How the guest NIC is connected to the pod network (`spec.domain.devices.interfaces[i]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Binding {
    /// `masquerade: {}`: the guest gets 10.0.2.2 behind NAT on bridge `k6t-<iface>`.
    #[default]
    Masquerade,
    /// `bridge: {}`: the guest takes over the pod IP; the pod link becomes a bridge port.
    Bridge,
}

/// A port protocol as written in `interfaces[i].ports[j].protocol` (lower-cased for nftables).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Protocol {
    /// `TCP` (the KubeVirt default when the field is empty).
    #[default]
    Tcp,
    /// `UDP`.
    Udp,
    /// `SCTP`.
    Sctp,
}

impl Protocol {
    /// The nftables keyword (`tcp`, `udp`, `sctp`).
    pub fn keyword(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The IP protocol number (6, 17, 132), as `meta l4proto` compares it.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    /// Parses the VMI spelling, case-insensitively; empty means TCP (KubeVirt `masquerade.go`).
    pub fn parse(s: &str) -> Option<Protocol> {
        match s.to_ascii_lowercase().as_str() {
            "" | "tcp" => Some(Protocol::Tcp),
            "udp" => Some(Protocol::Udp),
            "sctp" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

/// One forwarded port (`interfaces[i].ports[j]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Port {
    /// The protocol.
    pub protocol: Protocol,
    /// The port number, 1..=65535.
    pub port: u16,
}

/// The VMI's `interfaces[i].dhcpOptions` (KubeVirt `v1.DHCPOptions`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DhcpExtraOptions {
    /// `tftpServerName`, sent as option 66.
    pub tftp_server_name: Option<String>,
    /// `bootFileName`, sent as option 67.
    pub boot_file_name: Option<String>,
    /// `ntpServers` (IPv4 only; KubeVirt drops others), sent as option 42.
    pub ntp_servers: Vec<Ipv4Addr>,
    /// `privateOptions`: (option 224..=254, string value).
    pub private_options: Vec<(u8, String)>,
}

/// Everything the network setup of one VMI interface needs from the VMI and the launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// The binding.
    pub binding: Binding,
    /// The pod interface: `eth0` for the pod network, the Multus name (`pod<hash>` or `net1`)
    /// for a secondary network.
    pub pod_iface: String,
    /// `spec.networks[i].pod.vmNetworkCIDR` (default 10.0.2.0/24); masquerade only.
    pub vm_cidr_v4: Ipv4Net,
    /// `spec.networks[i].pod.vmIPv6NetworkCIDR` (default fd10:0:2::/120); masquerade only.
    pub vm_cidr_v6: Ipv6Net,
    /// `interfaces[i].ports`; empty forwards every port (masquerade).
    pub ports: Vec<Port>,
    /// `interfaces[i].macAddress`; the pod interface MAC when absent.
    pub mac: Option<[u8; 6]>,
    /// Tap queues: 1, or the vCPU count when `networkInterfaceMultiqueue` is set (at most 256).
    pub queues: u32,
    /// The uid (and gid) that owns the tap: 107 for the non-root launcher, 0 for root.
    pub runtime_uid: u32,
    /// The VMI annotation `sidecar.istio.io/inject: "true"`.
    pub istio: bool,
    /// Legacy migration (migration transport not Unix): skip forwarding 49152 and 49153.
    pub legacy_migration_ports: bool,
    /// `interfaces[i].dhcpOptions`.
    pub dhcp_options: DhcpExtraOptions,
    /// The guest hostname offered in option 12 (the pod hostname: `spec.hostname` or the VMI name
    /// cut at the first dot, at most 63 characters).
    pub hostname: String,
    /// `spec.subdomain`: prefixes the search list with `<subdomain>.<longest *.svc.* domain>`.
    pub subdomain: Option<String>,
    /// The index of the interface among the VMI's pod/Multus interfaces (0 for the primary);
    /// used for the bridge binding's fake bridge address `169.254.75.1<index>/32`.
    pub iface_index: u8,
    /// Send IPv6 router advertisements so the guest gets an IPv6 default route (beyond KubeVirt,
    /// issue 19193). Off by default.
    pub ipv6_router_advertisement: bool,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            binding: Binding::Masquerade,
            pod_iface: "eth0".into(),
            vm_cidr_v4: Ipv4Net::new(Ipv4Addr::new(10, 0, 2, 0), 24).expect("static prefix"),
            vm_cidr_v6: Ipv6Net::new(Ipv6Addr::new(0xfd10, 0, 2, 0, 0, 0, 0, 0), 120)
                .expect("static prefix"),
            ports: Vec::new(),
            mac: None,
            queues: 1,
            runtime_uid: 107,
            istio: false,
            legacy_migration_ports: false,
            dhcp_options: DhcpExtraOptions::default(),
            hostname: String::new(),
            subdomain: None,
            iface_index: 0,
            ipv6_router_advertisement: false,
        }
    }
}

/// The VMI annotation that asks for an Istio sidecar (`pkg/network/istio/decorators.go`).
pub const ISTIO_INJECT_ANNOTATION: &str = "sidecar.istio.io/inject";

/// Whether the VMI has an Istio sidecar: its annotation `sidecar.istio.io/inject` is `true` in
/// any case (KubeVirt v1.9 `istio.ProxyInjectionEnabled`, `pkg/network/istio/proxy.go`). Sets
/// [`NetConfig::istio`], which gives the masquerade binding KubeVirt's Istio rules.
pub fn istio_proxy_injection(vmi: &crate::vmi::Vmi) -> bool {
    vmi.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ISTIO_INJECT_ANNOTATION))
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The interface name suffix KubeVirt derives link names from: `eth0` stays `eth0`, a hashed
/// Multus name `pod<hash>` becomes `<hash>` (`pkg/network/link/names.go`).
fn name_stem(pod_iface: &str) -> &str {
    match pod_iface.strip_prefix("pod") {
        Some(rest) if !rest.is_empty() => rest,
        _ => pod_iface,
    }
}

/// Linux interface names are at most 15 bytes (IFNAMSIZ - 1).
fn clamp_ifname(name: String) -> String {
    let mut n = name;
    n.truncate(15);
    n
}

/// The bridge name: `k6t-` + the stem (`k6t-eth0`) (`link.GenerateBridgeName`).
pub fn bridge_name(pod_iface: &str) -> String {
    clamp_ifname(format!("k6t-{}", name_stem(pod_iface)))
}

/// The tap name: `tap` + the pod name from its 4th byte (`eth0` → `tap0`, `pod1a2b` → `tap1a2b`)
/// (`link.GenerateTapDeviceName`).
pub fn tap_name(pod_iface: &str) -> String {
    clamp_ifname(format!("tap{}", pod_iface.get(3..).unwrap_or("")))
}

/// The bridge binding's new name for the pod link: `<iface>-nic` (`eth0-nic`).
pub fn renamed_pod_link(pod_iface: &str) -> String {
    clamp_ifname(format!("{}-nic", name_stem(pod_iface)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_kubevirt() {
        assert_eq!(bridge_name("eth0"), "k6t-eth0");
        assert_eq!(tap_name("eth0"), "tap0");
        assert_eq!(renamed_pod_link("eth0"), "eth0-nic");
        assert_eq!(bridge_name("pod16477688c0e"), "k6t-16477688c0e");
        assert_eq!(tap_name("pod16477688c0e"), "tap16477688c0e");
        assert_eq!(bridge_name("net1"), "k6t-net1");
        assert_eq!(tap_name("net1"), "tap1");
    }

    #[test]
    fn istio_annotation_is_read_case_insensitively() {
        let vmi = |ann: serde_json::Value| -> crate::vmi::Vmi {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "v", "annotations": ann},
                "spec": {"domain": {"devices": {}}}
            }))
            .unwrap()
        };
        assert!(istio_proxy_injection(&vmi(
            serde_json::json!({"sidecar.istio.io/inject": "True"})
        )));
        assert!(!istio_proxy_injection(&vmi(
            serde_json::json!({"sidecar.istio.io/inject": "false"})
        )));
        assert!(!istio_proxy_injection(&vmi(serde_json::json!({}))));
    }

    #[test]
    fn protocol_parse_is_case_insensitive_and_defaults_to_tcp() {
        assert_eq!(Protocol::parse(""), Some(Protocol::Tcp));
        assert_eq!(Protocol::parse("UDP"), Some(Protocol::Udp));
        assert_eq!(Protocol::parse("Sctp"), Some(Protocol::Sctp));
        assert_eq!(Protocol::parse("icmp"), None);
    }
}
