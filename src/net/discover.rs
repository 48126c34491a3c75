//! Discovery of the pod interface and the pod's DNS configuration.
//!
//! Mirrors what KubeVirt's `netpod` reads through nmstate/netlink (`pkg/network/setup/netpod`)
//! and `pkg/network/dns/resolveconf.go`: the interface's MAC, MTU, IPv4/IPv6 addresses (global
//! scope), its routes and default gateways, and resolv.conf's nameservers and search domains.

use crate::net::NetError;
use futures_util::TryStreamExt;
use ipnet::{Ipv4Net, Ipv6Net};
use netlink_packet_route::address::{AddressAttribute, AddressScope};
use netlink_packet_route::link::LinkAttribute;
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteType};
use rtnetlink::{Handle, RouteMessageBuilder};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// One IPv4 route of the pod interface (main table, unicast).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RouteV4 {
    /// The destination (0.0.0.0/0 for the default route).
    pub destination: Ipv4Net,
    /// The next hop; `None` for an on-link route.
    pub gateway: Option<Ipv4Addr>,
    /// The route's `rtm_protocol` (3 = boot, 4 = static, ...), kept so teardown restores it.
    pub protocol: u8,
}

/// What the pod interface looks like before setup.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct PodIface {
    /// The interface name (`eth0`).
    pub name: String,
    /// The kernel link index.
    pub index: u32,
    /// The MAC address.
    pub mac: [u8; 6],
    /// The MTU in bytes.
    pub mtu: u32,
    /// Global-scope IPv4 addresses with prefix.
    pub ipv4: Vec<Ipv4Net>,
    /// Global-scope IPv6 addresses with prefix (link-local ones excluded).
    pub ipv6: Vec<Ipv6Net>,
    /// IPv4 routes through this interface (main table, unicast), default route included.
    pub routes_v4: Vec<RouteV4>,
    /// The IPv4 default gateway, when there is a default route through this interface.
    pub gateway_v4: Option<Ipv4Addr>,
    /// The IPv6 default gateway, when there is a default route through this interface.
    pub gateway_v6: Option<Ipv6Addr>,
}

/// The pod's resolv.conf, as far as the DHCP server uses it.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ResolvConf {
    /// IPv4 `nameserver` lines, in order.
    pub nameservers_v4: Vec<Ipv4Addr>,
    /// IPv6 `nameserver` lines, in order.
    pub nameservers_v6: Vec<Ipv6Addr>,
    /// The `search` domains (the last `search` line wins, as in resolv.conf(5)), trailing dots
    /// removed; entries that are not DNS names are left out (see `dropped`).
    pub search: Vec<String>,
    /// What was read but left out, one line per kind naming the entries (logged once by
    /// [`discover`]): search entries that are not DNS names
    /// ([`crate::net::dhcp::dns_name_problem`]) and `nameserver` lines with more than one
    /// address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
}

/// Everything discovered about the pod that planning needs.
///
/// Serializable so the orchestrator can cache it (as virt-handler caches the pod interface in
/// `vif-cache-<iface>.json`): after the bridge binding has moved the pod link, discovering again
/// would find the stand-in without routes, so re-plans must use the facts found before setup.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct PodFacts {
    /// The pod interface.
    pub iface: PodIface,
    /// The pod's DNS configuration.
    pub resolv: ResolvConf,
}

/// Parses resolv.conf text: `nameserver` (IPv4 and IPv6, zone suffixes dropped) and `search`
/// lines; comments (`#`, `;`) and other keywords are ignored, and so are unparsable addresses.
///
/// The text is untrusted pod input and never makes this fail. As resolv.conf(5) and glibc's
/// `res_init` read it, a `nameserver` line holds one address; a line with more words is skipped
/// whole, none of its addresses reaching the guest, as KubeVirt v1.9's `ParseNameservers`
/// (`pkg/network/dns/resolveconf.go`) skips it with a warning. Search entries that are not DNS
/// names are dropped. What was dropped is listed in [`ResolvConf::dropped`].
pub fn parse_resolv_conf(text: &str) -> ResolvConf {
    let mut r = ResolvConf::default();
    let mut long_lines: Vec<String> = Vec::new();
    let mut search_line: Vec<&str> = Vec::new();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => {
                let Some(addr) = words.next() else { continue };
                if words.next().is_some() {
                    long_lines.push(format!("{:?}", line.trim()));
                    continue;
                }
                let addr = addr.split('%').next().unwrap_or(addr);
                match addr.parse::<IpAddr>() {
                    Ok(IpAddr::V4(a)) => r.nameservers_v4.push(a),
                    Ok(IpAddr::V6(a)) => r.nameservers_v6.push(a),
                    Err(_) => {}
                }
            }
            Some("search") => search_line = words.collect(),
            _ => {}
        }
    }
    let mut invalid = Vec::new();
    for w in search_line {
        let name = w.strip_suffix('.').unwrap_or(w);
        match crate::net::dhcp::dns_name_problem(name) {
            None => r.search.push(name.to_string()),
            Some(why) => invalid.push(format!("{w:?} ({why})")),
        }
    }
    if !long_lines.is_empty() {
        r.dropped.push(format!(
            "nameserver lines must hold one address each; skipped: {}",
            long_lines.join(", ")
        ));
    }
    if !invalid.is_empty() {
        r.dropped.push(format!(
            "search domains that are not DNS names dropped: {}",
            invalid.join(", ")
        ));
    }
    r
}

fn nl(step: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetError {
    let step = step.into();
    move |source| NetError::Netlink { step, source }
}

/// Finds a link by name; `Ok(None)` when absent.
pub(crate) async fn link_by_name(
    handle: &Handle,
    name: &str,
) -> Result<Option<netlink_packet_route::link::LinkMessage>, NetError> {
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(l) => Ok(l),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(nl(format!("get link {name}"))(e)),
    }
}

/// Reads the pod interface `name` in the current network namespace.
///
/// Errors: [`NetError::PodInterfaceMissing`] when there is no such link, [`NetError::Netlink`]
/// when a dump fails.
pub async fn discover_iface(handle: &Handle, name: &str) -> Result<PodIface, NetError> {
    let link = link_by_name(handle, name)
        .await?
        .ok_or_else(|| NetError::PodInterfaceMissing(name.into()))?;
    let mut iface = PodIface {
        name: name.into(),
        index: link.header.index,
        ..Default::default()
    };
    for a in &link.attributes {
        match a {
            LinkAttribute::Address(m) if m.len() == 6 => iface.mac.copy_from_slice(m),
            LinkAttribute::Mtu(m) => iface.mtu = *m,
            _ => {}
        }
    }
    let mut addrs = handle
        .address()
        .get()
        .set_link_index_filter(iface.index)
        .execute();
    while let Some(a) = addrs
        .try_next()
        .await
        .map_err(nl(format!("get addresses of {name}")))?
    {
        if a.header.scope != AddressScope::Universe {
            continue;
        }
        let prefix = a.header.prefix_len;
        for attr in &a.attributes {
            match attr {
                AddressAttribute::Local(IpAddr::V4(v4)) => {
                    if let Ok(n) = Ipv4Net::new(*v4, prefix) {
                        iface.ipv4.push(n);
                    }
                }
                AddressAttribute::Address(IpAddr::V6(v6)) => {
                    if let Ok(n) = Ipv6Net::new(*v6, prefix) {
                        iface.ipv6.push(n);
                    }
                }
                _ => {}
            }
        }
    }
    let mut routes = handle
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute();
    while let Some(r) = routes
        .try_next()
        .await
        .map_err(nl(format!("get IPv4 routes of {name}")))?
    {
        if r.header.table != 254 || r.header.kind != RouteType::Unicast {
            continue;
        }
        let mut oif = None;
        let mut dst = Ipv4Addr::UNSPECIFIED;
        let mut gw = None;
        for attr in &r.attributes {
            match attr {
                RouteAttribute::Oif(i) => oif = Some(*i),
                RouteAttribute::Destination(RouteAddress::Inet(d)) => dst = *d,
                RouteAttribute::Gateway(RouteAddress::Inet(g)) => gw = Some(*g),
                _ => {}
            }
        }
        if oif != Some(iface.index) {
            continue;
        }
        let Ok(destination) = Ipv4Net::new(dst, r.header.destination_prefix_length) else {
            continue;
        };
        if destination.prefix_len() == 0 {
            iface.gateway_v4 = gw;
        }
        iface.routes_v4.push(RouteV4 {
            destination,
            gateway: gw,
            protocol: u8::from(r.header.protocol),
        });
    }
    let mut routes6 = handle
        .route()
        .get(RouteMessageBuilder::<Ipv6Addr>::new().build())
        .execute();
    while let Some(r) = routes6
        .try_next()
        .await
        .map_err(nl(format!("get IPv6 routes of {name}")))?
    {
        if r.header.table != 254 || r.header.destination_prefix_length != 0 {
            continue;
        }
        let mut oif = None;
        let mut gw = None;
        for attr in &r.attributes {
            match attr {
                RouteAttribute::Oif(i) => oif = Some(*i),
                RouteAttribute::Gateway(RouteAddress::Inet6(g)) => gw = Some(*g),
                _ => {}
            }
        }
        if oif == Some(iface.index) && gw.is_some() {
            iface.gateway_v6 = gw;
        }
    }
    Ok(iface)
}

/// Discovers the pod interface `iface` and reads the resolv.conf at `resolv_conf`
/// (`/etc/resolv.conf` in the launcher), in the current network namespace.
///
/// A missing resolv.conf is read as empty (the DHCP server then offers 8.8.8.8, as KubeVirt).
pub async fn discover(
    handle: &Handle,
    iface: &str,
    resolv_conf: &Path,
) -> Result<PodFacts, NetError> {
    let iface = discover_iface(handle, iface).await?;
    let text = match std::fs::read_to_string(resolv_conf) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(NetError::ReadResolvConf {
                path: resolv_conf.display().to_string(),
                source,
            })
        }
    };
    let resolv = parse_resolv_conf(&text);
    for note in &resolv.dropped {
        tracing::warn!(path = %resolv_conf.display(), "resolv.conf: {note}");
    }
    Ok(PodFacts { iface, resolv })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_of_a_kubernetes_pod() {
        let r = parse_resolv_conf(
            "# generated\nsearch default.svc.cluster.local svc.cluster.local cluster.local\n\
             nameserver 10.96.0.10\nnameserver fd00:10:96::a\nnameserver fe80::1%eth0\n\
             nameserver bogus\noptions ndots:5\n",
        );
        assert_eq!(
            r,
            ResolvConf {
                nameservers_v4: vec!["10.96.0.10".parse().unwrap()],
                nameservers_v6: vec!["fd00:10:96::a".parse().unwrap(), "fe80::1".parse().unwrap()],
                search: vec![
                    "default.svc.cluster.local".into(),
                    "svc.cluster.local".into(),
                    "cluster.local".into()
                ],
                dropped: vec![],
            }
        );
    }

    #[test]
    fn hostile_resolv_conf_is_cut_to_what_fits() {
        let r = parse_resolv_conf(
            "nameserver 10.96.0.10 10.96.0.11\nnameserver\nnameserver 10.96.0.12\nsearch ok.example. 10.0.0.1 a_b.example bad-.example OK.Example\n",
        );
        assert_eq!(
            r.nameservers_v4,
            vec!["10.96.0.12".parse::<Ipv4Addr>().unwrap()]
        );
        assert_eq!(
            r.search,
            vec!["ok.example".to_string(), "OK.Example".into()]
        );
        assert_eq!(
            r.dropped,
            vec![
                "nameserver lines must hold one address each; skipped: \"nameserver 10.96.0.10 10.96.0.11\"".to_string(),
                "search domains that are not DNS names dropped: \"10.0.0.1\" (an IP address), \"a_b.example\" (a character other than a letter, a digit or '-'), \"bad-.example\" (a label that starts or ends with '-')".into(),
            ]
        );
        // Arbitrary bytes never panic.
        let _ = parse_resolv_conf("search \u{0}\u{ffff} .. . ...\nnameserver %%%\n");
    }

    #[test]
    fn pod_facts_round_trip_through_json() {
        let facts = PodFacts {
            iface: PodIface {
                name: "eth0".into(),
                index: 2,
                mac: [0x0a, 0x58, 0x0a, 0xf4, 0, 5],
                mtu: 1450,
                ipv4: vec!["10.244.0.5/24".parse().unwrap()],
                routes_v4: vec![RouteV4 {
                    destination: "0.0.0.0/0".parse().unwrap(),
                    gateway: Some("10.244.0.1".parse().unwrap()),
                    protocol: 3,
                }],
                gateway_v4: Some("10.244.0.1".parse().unwrap()),
                ..Default::default()
            },
            resolv: parse_resolv_conf("nameserver 10.96.0.10\nsearch cluster.local\n"),
        };
        let json = serde_json::to_string(&facts).unwrap();
        assert_eq!(serde_json::from_str::<PodFacts>(&json).unwrap(), facts);
    }

    #[test]
    fn empty_resolv_conf_is_empty() {
        assert_eq!(parse_resolv_conf(""), ResolvConf::default());
    }
}
