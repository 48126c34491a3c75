//! The pure planning step: [`NetConfig`] + [`PodFacts`] → [`NetPlan`].
//!
//! No I/O happens here (only a warning is logged for each kind of pod input the DHCP options
//! cannot carry: search domains that are not DNS names or do not fit, routes that do not fit);
//! every value [`crate::net::apply()`] writes and every option the DHCP
//! servers hand out is decided in this module, after KubeVirt v1.9.0 `pkg/network/setup/netpod`
//! (masquerade and bridge phases), `pkg/network/dhcp` and `pkg/network/dns`.

use crate::net::config::{bridge_name, renamed_pod_link, tap_name, Binding, NetConfig};
use crate::net::dhcp::ra::RaConfig;
use crate::net::dhcp::v4::DhcpV4Config;
use crate::net::dhcp::v6::DhcpV6Config;
use crate::net::discover::PodFacts;
use crate::net::nft::{masquerade_table, Family, MasqueradeInput, NatTable};
use crate::net::NetError;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use std::net::{IpAddr, Ipv4Addr};

mod dhcp_options;
mod validate;

pub use dhcp_options::{classless_routes, search_domains, ROUTES_MAX_BYTES};
use validate::validate;
pub use validate::MAX_QUEUES;

/// The bridge MAC of the masquerade binding (`pkg/network/link/mac.go`).
pub const MASQUERADE_BRIDGE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0];
/// "Infinite" DHCPv4 lease: 999 days in seconds (KubeVirt `dhcp/server`).
pub const LEASE_SECONDS: u32 = 999 * 24 * 3600;

/// One link-level step, executed in order by [`crate::net::apply()`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkStep {
    /// A bridge, created when absent, with this MAC (kernel-chosen when `None`), MTU and
    /// addresses (IPv6 ones without DAD), then set up.
    Bridge {
        /// The bridge name (`k6t-eth0`).
        name: String,
        /// The fixed MAC.
        mac: Option<[u8; 6]>,
        /// The MTU in bytes.
        mtu: u32,
        /// The addresses to hold.
        addresses: Vec<IpNet>,
    },
    /// Bridge binding: the pod link is taken down, renamed, given `mac`, stripped of
    /// `addresses`, made a port of `master` with learning off, and set up.
    MovePodLink {
        /// The pod link's name before (`eth0`).
        from: String,
        /// Its name after (`eth0-nic`).
        to: String,
        /// Its new MAC (the pod MAC moves to the guest).
        mac: [u8; 6],
        /// The addresses removed from it.
        addresses: Vec<IpNet>,
        /// The bridge it joins.
        master: String,
    },
    /// Bridge binding: a stand-in link named like the pod interface that keeps the pod MAC,
    /// MTU and addresses for Kubernetes. The kernel has no dummy links, so this is an `ifb`
    /// link (no traffic flows through it; it only holds the identity).
    StandIn {
        /// The name (`eth0`).
        name: String,
        /// The pod MAC.
        mac: [u8; 6],
        /// The pod MTU.
        mtu: u32,
        /// The pod addresses.
        addresses: Vec<IpNet>,
    },
    /// A persistent tap made with the tun ioctls, then enslaved to `master`, given `mtu`, set up.
    Tap {
        /// The tap name (`tap0`).
        name: String,
        /// Owner uid (TUNSETOWNER).
        owner: u32,
        /// Owner gid (TUNSETGROUP).
        group: u32,
        /// `IFF_MULTI_QUEUE|IFF_NO_PI` when true, else `IFF_TUN_EXCL|IFF_ONE_QUEUE`.
        multiqueue: bool,
        /// The MTU in bytes.
        mtu: u32,
        /// The bridge it joins.
        master: String,
    },
}

/// One sysctl under `/proc/sys`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysctl {
    /// The dotted key (`net.ipv4.ip_forward`, `net.ipv4.conf.k6t-eth0.route_localnet`).
    pub key: String,
    /// The value written.
    pub value: String,
}

/// Everything the setup of one interface does, as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetPlan {
    /// The binding.
    pub binding: Binding,
    /// The pod interface name.
    pub pod_iface: String,
    /// The bridge name.
    pub bridge: String,
    /// The tap name, for QEMU's `-netdev tap,ifname=`.
    pub tap: String,
    /// The guest NIC MAC: the VMI's, else the pod's.
    pub guest_mac: [u8; 6],
    /// The MTU of bridge, tap and guest NIC (the pod's).
    pub mtu: u32,
    /// Link steps, in order.
    pub links: Vec<LinkStep>,
    /// Sysctls, written after the links.
    pub sysctls: Vec<Sysctl>,
    /// NAT tables (masquerade only), committed atomically.
    pub nat_tables: Vec<NatTable>,
    /// The DHCPv4 server configuration, when the guest gets IPv4 by DHCP.
    pub dhcp_v4: Option<DhcpV4Config>,
    /// The DHCPv6 server configuration (masquerade with a pod IPv6 address).
    pub dhcp_v6: Option<DhcpV6Config>,
    /// Router advertisements, when asked for (`NetConfig::ipv6_router_advertisement`).
    pub router_advertisement: Option<RaConfig>,
    /// The pod facts the plan was made from (teardown of the bridge binding restores them).
    pub facts: PodFacts,
}

/// A locally administered MAC derived from `mac` and different from it, for the renamed pod
/// link of the bridge binding (deterministic, so setup stays idempotent).
fn derived_mac(mac: [u8; 6]) -> [u8; 6] {
    let mut m = mac;
    m[0] = (m[0] | 0x02) & 0xfe;
    if m == mac {
        m[0] ^= 0x04;
    }
    m
}

fn nth_host_v4(net: Ipv4Net, n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(net.network()).wrapping_add(n))
}

fn nth_host_v6(net: Ipv6Net, n: u128) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::from(u128::from(net.network()).wrapping_add(n))
}

/// What the DHCP servers tell the guest about names, from the pod's `resolv.conf` (KubeVirt
/// `pkg/network/dns`).
struct GuestDns {
    /// Option 119 (and DHCPv6's domain list): the search domains that are DNS names and fit.
    search: Vec<String>,
    /// Option 15: the longest search domain.
    domain_name: Option<String>,
    /// Option 6: the pod's IPv4 nameservers, or Google's `8.8.8.8` when the pod has no
    /// nameserver of either family.
    dns: Vec<Ipv4Addr>,
}

/// The guest's [`GuestDns`], and one note per kind of search domain left out.
fn guest_dns(cfg: &NetConfig, facts: &PodFacts) -> (GuestDns, Vec<String>) {
    let search_list = crate::net::dhcp::search_list(&search_domains(
        &facts.resolv.search,
        cfg.subdomain.as_deref(),
    ));
    let notes = search_list.notes();
    let search = search_list.names.clone();
    // Option 15: the longest search domain (KubeVirt `dns.GetDomainName`), of those that are
    // DNS names (the first of the longest; the cut for length does not apply to it).
    let domain_name = search
        .iter()
        .chain(&search_list.overflow)
        .map(|d| d.trim_end_matches('.'))
        .fold(None::<&str>, |best, d| match best {
            Some(b) if b.len() >= d.len() => Some(b),
            _ => Some(d),
        })
        .map(str::to_string);
    // KubeVirt `dns.ParseNameservers` (pkg/network/dns/resolveconf.go) falls back to 8.8.8.8
    // only when the pod has no nameserver of either family: a pod with only IPv6 nameservers
    // offers no IPv4 one (KubeVirt then sends option 6 empty; it is left out here, as RFC 2132
    // gives it a minimum length of 4).
    let dns = if facts.resolv.nameservers_v4.is_empty() && facts.resolv.nameservers_v6.is_empty() {
        vec![Ipv4Addr::new(8, 8, 8, 8)]
    } else {
        facts.resolv.nameservers_v4.clone()
    };
    let names = GuestDns {
        search,
        domain_name,
        dns,
    };
    (names, notes)
}

/// Builds the plan. Errors: [`NetError::InvalidConfig`] naming the field, or
/// [`NetError::PodInterfaceUnusable`] when the pod lacks what the binding needs.
pub fn plan(cfg: &NetConfig, facts: &PodFacts) -> Result<NetPlan, NetError> {
    validate(cfg)?;
    let pod = &facts.iface;
    if pod.mtu == 0 {
        return Err(NetError::PodInterfaceUnusable {
            iface: pod.name.clone(),
            reason: "MTU is 0".into(),
        });
    }
    let bridge = bridge_name(&cfg.pod_iface);
    let tap = tap_name(&cfg.pod_iface);
    let (names, mut notes) = guest_dns(cfg, facts);
    let tap_step = LinkStep::Tap {
        name: tap.clone(),
        owner: cfg.runtime_uid,
        group: cfg.runtime_uid,
        multiqueue: cfg.queues > 1,
        mtu: pod.mtu,
        master: bridge.clone(),
    };
    let mut plan = NetPlan {
        binding: cfg.binding,
        pod_iface: cfg.pod_iface.clone(),
        bridge,
        tap,
        guest_mac: cfg.mac.unwrap_or(pod.mac),
        mtu: pod.mtu,
        links: Vec::new(),
        sysctls: Vec::new(),
        nat_tables: Vec::new(),
        dhcp_v4: None,
        dhcp_v6: None,
        router_advertisement: None,
        facts: facts.clone(),
    };
    match cfg.binding {
        Binding::Masquerade => masquerade_binding(cfg, facts, names, tap_step, &mut plan)?,
        Binding::Bridge => bridge_binding(cfg, facts, names, tap_step, &mut plan, &mut notes)?,
    }
    for note in &notes {
        tracing::warn!(iface = %cfg.pod_iface, "pod network input: {note}");
    }
    Ok(plan)
}

/// The masquerade binding's addresses in the VM CIDRs (KubeVirt's `vmNetworkCIDR` and
/// `vmIPv6NetworkCIDR`): the gateway is the first host (the bridge), the guest the second, for
/// each family the pod has an address of.
struct MasqueradeAddrs {
    /// The pod has a global IPv4 address.
    has_v4: bool,
    /// The pod has a global IPv6 address.
    has_v6: bool,
    gw4: Ipv4Addr,
    guest4: Ipv4Addr,
    gw6: std::net::Ipv6Addr,
    guest6: std::net::Ipv6Addr,
}

/// The masquerade binding (KubeVirt `netpod` masquerade phase): the bridge with the gateway
/// addresses and the tap, forwarding sysctls, one NAT table per family, and the DHCP servers.
fn masquerade_binding(
    cfg: &NetConfig,
    facts: &PodFacts,
    names: GuestDns,
    tap_step: LinkStep,
    plan: &mut NetPlan,
) -> Result<(), NetError> {
    let pod = &facts.iface;
    let has_v4 = !pod.ipv4.is_empty();
    let has_v6 = !pod.ipv6.is_empty();
    if !has_v4 && !has_v6 {
        return Err(NetError::PodInterfaceUnusable {
            iface: pod.name.clone(),
            reason: "no global IPv4 or IPv6 address for masquerade".into(),
        });
    }
    let at = MasqueradeAddrs {
        has_v4,
        has_v6,
        gw4: nth_host_v4(cfg.vm_cidr_v4, 1),
        guest4: nth_host_v4(cfg.vm_cidr_v4, 2),
        gw6: nth_host_v6(cfg.vm_cidr_v6, 1),
        guest6: nth_host_v6(cfg.vm_cidr_v6, 2),
    };
    let mut addresses = Vec::new();
    if has_v4 {
        addresses.push(IpNet::V4(
            Ipv4Net::new(at.gw4, cfg.vm_cidr_v4.prefix_len())
                .map_err(|e| NetError::invalid("vm_cidr_v4", e.to_string()))?,
        ));
    }
    if has_v6 {
        addresses.push(IpNet::V6(
            Ipv6Net::new(at.gw6, cfg.vm_cidr_v6.prefix_len())
                .map_err(|e| NetError::invalid("vm_cidr_v6", e.to_string()))?,
        ));
    }
    plan.links.push(LinkStep::Bridge {
        name: plan.bridge.clone(),
        mac: Some(MASQUERADE_BRIDGE_MAC),
        mtu: pod.mtu,
        addresses,
    });
    plan.links.push(tap_step);
    if has_v4 {
        plan.sysctls.push(Sysctl {
            key: "net.ipv4.ip_forward".into(),
            value: "1".into(),
        });
    }
    if has_v6 {
        plan.sysctls.push(Sysctl {
            key: "net.ipv6.conf.all.forwarding".into(),
            value: "1".into(),
        });
    }
    plan.sysctls.push(Sysctl {
        key: format!("net.ipv4.conf.{}.route_localnet", plan.bridge),
        value: "1".into(),
    });
    masquerade_nat(cfg, facts, &at, plan);
    masquerade_dhcp(cfg, facts, &at, names, plan);
    Ok(())
}

/// The masquerade NAT tables, one per family the pod has (KubeVirt's nftables rules, see
/// [`masquerade_table`]).
fn masquerade_nat(cfg: &NetConfig, facts: &PodFacts, at: &MasqueradeAddrs, plan: &mut NetPlan) {
    let pod_ipv4 = facts.iface.ipv4.first().map(|n| IpAddr::V4(n.addr()));
    let mut fams = Vec::new();
    if at.has_v4 {
        fams.push((Family::Ip, IpAddr::V4(at.guest4), IpAddr::V4(at.gw4)));
    }
    if at.has_v6 {
        fams.push((Family::Ip6, IpAddr::V6(at.guest6), IpAddr::V6(at.gw6)));
    }
    for (family, guest, gateway) in fams {
        plan.nat_tables.push(masquerade_table(&MasqueradeInput {
            family,
            pod_iface: &cfg.pod_iface,
            bridge: &plan.bridge,
            guest,
            gateway,
            pod_ipv4,
            ports: &cfg.ports,
            istio: cfg.istio,
            legacy_migration_ports: cfg.legacy_migration_ports,
        }));
    }
}

/// The masquerade binding's DHCP servers on the bridge: DHCPv4 hands out the guest's VM-CIDR
/// address with the gateway as router; DHCPv6 (and router advertisements, when asked for)
/// when the pod has IPv6.
fn masquerade_dhcp(
    cfg: &NetConfig,
    facts: &PodFacts,
    at: &MasqueradeAddrs,
    names: GuestDns,
    plan: &mut NetPlan,
) {
    let pod = &facts.iface;
    if at.has_v4 {
        plan.dhcp_v4 = Some(DhcpV4Config {
            iface: plan.bridge.clone(),
            server_ip: at.gw4,
            client_ip: at.guest4,
            prefix_len: cfg.vm_cidr_v4.prefix_len(),
            router: Some(at.gw4),
            dns: names.dns,
            search: names.search.clone(),
            domain_name: names.domain_name,
            hostname: cfg.hostname.clone(),
            mtu: u16::try_from(pod.mtu).unwrap_or(u16::MAX),
            routes: Vec::new(),
            lease_seconds: LEASE_SECONDS,
            client_mac: None,
            extra: cfg.dhcp_options.clone(),
        });
    }
    if at.has_v6 {
        plan.dhcp_v6 = Some(DhcpV6Config {
            iface: plan.bridge.clone(),
            server_mac: MASQUERADE_BRIDGE_MAC,
            address: at.guest6,
            dns: facts.resolv.nameservers_v6.clone(),
            search: names.search,
        });
        if cfg.ipv6_router_advertisement {
            plan.router_advertisement = Some(RaConfig {
                iface: plan.bridge.clone(),
                source_mac: MASQUERADE_BRIDGE_MAC,
                mtu: pod.mtu,
                router_lifetime_secs: 1800,
                interval_secs: 200,
            });
        }
    }
}

/// The bridge binding (KubeVirt `netpod` bridge phase): the pod link moves onto the bridge
/// under a derived MAC, a stand-in keeps the pod's identity, the bridge gets a link-local
/// address when the pod has IPv4, then the tap; DHCPv4 hands the guest the pod's own address.
fn bridge_binding(
    cfg: &NetConfig,
    facts: &PodFacts,
    names: GuestDns,
    tap_step: LinkStep,
    plan: &mut NetPlan,
    notes: &mut Vec<String>,
) -> Result<(), NetError> {
    let pod = &facts.iface;
    let pod_addrs: Vec<IpNet> = pod
        .ipv4
        .iter()
        .map(|n| IpNet::V4(*n))
        .chain(pod.ipv6.iter().map(|n| IpNet::V6(*n)))
        .collect();
    let renamed = renamed_pod_link(&cfg.pod_iface);
    let fake = Ipv4Addr::new(169, 254, 75, 10 + cfg.iface_index);
    let bridge_addrs = if pod.ipv4.is_empty() {
        Vec::new()
    } else {
        vec![IpNet::V4(Ipv4Net::new(fake, 32).map_err(|e| {
            NetError::invalid("iface_index", e.to_string())
        })?)]
    };
    plan.links.push(LinkStep::Bridge {
        name: plan.bridge.clone(),
        mac: None,
        mtu: pod.mtu,
        addresses: Vec::new(),
    });
    plan.links.push(LinkStep::MovePodLink {
        from: cfg.pod_iface.clone(),
        to: renamed,
        mac: derived_mac(pod.mac),
        addresses: pod_addrs.clone(),
        master: plan.bridge.clone(),
    });
    plan.links.push(LinkStep::StandIn {
        name: cfg.pod_iface.clone(),
        mac: pod.mac,
        mtu: pod.mtu,
        addresses: pod_addrs,
    });
    plan.links.push(LinkStep::Bridge {
        name: plan.bridge.clone(),
        mac: None,
        mtu: pod.mtu,
        addresses: bridge_addrs,
    });
    plan.links.push(tap_step);
    plan.sysctls.push(Sysctl {
        key: "net.ipv4.conf.all.arp_ignore".into(),
        value: "1".into(),
    });
    if let Some(addr) = pod.ipv4.first() {
        let (routes, cut) = classless_routes(&pod.routes_v4, Some(*addr));
        if !cut.is_empty() {
            let cut: Vec<String> = cut.iter().map(|d| d.to_string()).collect();
            notes.push(format!(
                "classless static routes cut at {ROUTES_MAX_BYTES} bytes (DHCP option 121), dropped: {}",
                cut.join(", ")
            ));
        }
        plan.dhcp_v4 = Some(DhcpV4Config {
            iface: plan.bridge.clone(),
            server_ip: fake,
            client_ip: addr.addr(),
            prefix_len: addr.prefix_len(),
            router: pod.gateway_v4,
            dns: names.dns,
            search: names.search,
            domain_name: names.domain_name,
            hostname: cfg.hostname.clone(),
            mtu: u16::try_from(pod.mtu).unwrap_or(u16::MAX),
            routes,
            lease_seconds: LEASE_SECONDS,
            client_mac: Some(plan.guest_mac),
            extra: cfg.dhcp_options.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::config::{Port, Protocol};
    use crate::net::discover::{PodIface, ResolvConf, RouteV4};

    fn facts() -> PodFacts {
        PodFacts {
            iface: PodIface {
                name: "eth0".into(),
                index: 2,
                mac: [0x0a, 0x58, 0x0a, 0xf4, 0, 5],
                mtu: 1450,
                ipv4: vec!["10.244.0.5/24".parse().unwrap()],
                ipv6: vec!["fd00:10:244::5/64".parse().unwrap()],
                routes_v4: vec![
                    RouteV4 {
                        destination: "0.0.0.0/0".parse().unwrap(),
                        gateway: Some("10.244.0.1".parse().unwrap()),
                        protocol: 3,
                    },
                    RouteV4 {
                        destination: "10.244.0.0/24".parse().unwrap(),
                        gateway: None,
                        protocol: 2,
                    },
                    RouteV4 {
                        destination: "10.96.0.0/12".parse().unwrap(),
                        gateway: Some("10.244.0.1".parse().unwrap()),
                        protocol: 3,
                    },
                ],
                gateway_v4: Some("10.244.0.1".parse().unwrap()),
                gateway_v6: Some("fd00:10:244::1".parse().unwrap()),
            },
            resolv: ResolvConf {
                nameservers_v4: vec!["10.96.0.10".parse().unwrap()],
                nameservers_v6: vec!["fd00:10:96::a".parse().unwrap()],
                search: vec![
                    "default.svc.cluster.local".into(),
                    "svc.cluster.local".into(),
                    "cluster.local".into(),
                ],
                dropped: vec![],
            },
        }
    }

    #[test]
    fn masquerade_plan_has_kubevirt_links_sysctls_and_dhcp() {
        let cfg = NetConfig {
            hostname: "testvmi".into(),
            ..Default::default()
        };
        let p = plan(&cfg, &facts()).unwrap();
        assert_eq!(
            p.links,
            vec![
                LinkStep::Bridge {
                    name: "k6t-eth0".into(),
                    mac: Some(MASQUERADE_BRIDGE_MAC),
                    mtu: 1450,
                    addresses: vec![
                        "10.0.2.1/24".parse().unwrap(),
                        "fd10:0:2::1/120".parse().unwrap()
                    ],
                },
                LinkStep::Tap {
                    name: "tap0".into(),
                    owner: 107,
                    group: 107,
                    multiqueue: false,
                    mtu: 1450,
                    master: "k6t-eth0".into(),
                },
            ]
        );
        let keys: Vec<_> = p.sysctls.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "net.ipv4.ip_forward",
                "net.ipv6.conf.all.forwarding",
                "net.ipv4.conf.k6t-eth0.route_localnet"
            ]
        );
        assert_eq!(p.guest_mac, [0x0a, 0x58, 0x0a, 0xf4, 0, 5]);
        let d = p.dhcp_v4.unwrap();
        assert_eq!(d.client_ip, Ipv4Addr::new(10, 0, 2, 2));
        assert_eq!(d.router, Some(Ipv4Addr::new(10, 0, 2, 1)));
        assert_eq!(d.routes, vec![]);
        assert_eq!(d.client_mac, None);
        assert_eq!(d.domain_name.as_deref(), Some("default.svc.cluster.local"));
        assert_eq!(
            p.dhcp_v6.unwrap().address,
            "fd10:0:2::2".parse::<std::net::Ipv6Addr>().unwrap()
        );
        assert_eq!(p.router_advertisement, None);
    }

    #[test]
    fn public_dns_only_when_the_pod_has_no_nameserver_of_either_family() {
        let cfg = NetConfig::default();
        let with = |v4: &[&str], v6: &[&str]| {
            let mut f = facts();
            f.resolv.nameservers_v4 = v4.iter().map(|a| a.parse().unwrap()).collect();
            f.resolv.nameservers_v6 = v6.iter().map(|a| a.parse().unwrap()).collect();
            let p = plan(&cfg, &f).unwrap();
            (p.dhcp_v4.unwrap().dns, p.dhcp_v6.unwrap().dns)
        };
        assert_eq!(with(&[], &[]), (vec![Ipv4Addr::new(8, 8, 8, 8)], vec![]));
        assert_eq!(
            with(&[], &["fd00:10:96::a"]),
            (vec![], vec!["fd00:10:96::a".parse().unwrap()])
        );
        assert_eq!(
            with(&["10.96.0.10"], &[]),
            (vec![Ipv4Addr::new(10, 96, 0, 10)], vec![])
        );
    }

    #[test]
    fn custom_cidr_moves_gateway_and_guest() {
        let cfg = NetConfig {
            vm_cidr_v4: "192.168.7.0/29".parse().unwrap(),
            ..Default::default()
        };
        let d = plan(&cfg, &facts()).unwrap().dhcp_v4.unwrap();
        assert_eq!(
            (d.server_ip, d.client_ip, d.prefix_len),
            (
                "192.168.7.1".parse().unwrap(),
                "192.168.7.2".parse().unwrap(),
                29
            )
        );
    }

    #[test]
    fn bridge_plan_moves_pod_identity_and_filters_mac() {
        let cfg = NetConfig {
            binding: Binding::Bridge,
            ..Default::default()
        };
        let p = plan(&cfg, &facts()).unwrap();
        assert!(matches!(&p.links[1], LinkStep::MovePodLink { to, .. } if to == "eth0-nic"));
        assert!(
            matches!(&p.links[2], LinkStep::StandIn { name, mac, .. } if name == "eth0" && *mac == facts().iface.mac)
        );
        let d = p.dhcp_v4.unwrap();
        assert_eq!(d.client_ip, Ipv4Addr::new(10, 244, 0, 5));
        assert_eq!(d.server_ip, Ipv4Addr::new(169, 254, 75, 10));
        assert_eq!(d.client_mac, Some(facts().iface.mac));
        assert_eq!(
            d.routes,
            vec![
                (
                    "10.96.0.0/12".parse().unwrap(),
                    "10.244.0.1".parse().unwrap()
                ),
                ("0.0.0.0/0".parse().unwrap(), "10.244.0.1".parse().unwrap()),
            ]
        );
        assert!(p.nat_tables.is_empty());
        assert!(p.dhcp_v6.is_none());
    }

    #[test]
    fn invalid_values_name_their_field() {
        let cases: Vec<(NetConfig, &str)> = vec![
            (
                NetConfig {
                    vm_cidr_v4: "10.0.2.0/31".parse().unwrap(),
                    ..Default::default()
                },
                "vm_cidr_v4",
            ),
            (
                NetConfig {
                    ports: vec![Port {
                        protocol: Protocol::Tcp,
                        port: 0,
                    }],
                    ..Default::default()
                },
                "ports[0].port",
            ),
            (
                NetConfig {
                    queues: 300,
                    ..Default::default()
                },
                "queues",
            ),
            (
                NetConfig {
                    pod_iface: "../etc".into(),
                    ..Default::default()
                },
                "pod_iface",
            ),
            (
                NetConfig {
                    mac: Some([1, 0, 0, 0, 0, 0]),
                    ..Default::default()
                },
                "mac",
            ),
        ];
        for (cfg, field) in cases {
            match plan(&cfg, &facts()) {
                Err(NetError::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }
}
