//! What the DHCP servers hand out that is derived from pod input: the DNS search list and the
//! classless static routes (option 121). Pure; the caller logs what was cut.

use ipnet::Ipv4Net;
use std::net::Ipv4Addr;

/// The search list KubeVirt offers: resolv.conf's (default `cluster.local`), prefixed with
/// `<subdomain>.<longest *.svc.* domain>` when `spec.subdomain` is set
/// (`pkg/network/dns/resolveconf.go`, `DomainNameWithSubdomain`). Nothing is added when that
/// domain already starts with `<subdomain>.` (the pod's list has the entry, as kubelet writes it
/// since glibc 2.26) or when the list holds the entry anywhere already.
pub fn search_domains(search: &[String], subdomain: Option<&str>) -> Vec<String> {
    let mut list: Vec<String> = if search.is_empty() {
        vec!["cluster.local".into()]
    } else {
        search.to_vec()
    };
    if let Some(sub) = subdomain.filter(|s| !s.is_empty()) {
        let svc = list
            .iter()
            .filter(|d| d.contains(".svc."))
            .max_by_key(|d| d.len())
            .cloned();
        if let Some(svc) = svc {
            let prefix = format!("{sub}.");
            let entry = format!("{sub}.{svc}");
            let present = svc
                .to_ascii_lowercase()
                .starts_with(&prefix.to_ascii_lowercase())
                || list.iter().any(|d| d.eq_ignore_ascii_case(&entry));
            if !present {
                list.insert(0, entry);
            }
        }
    }
    list
}

/// The most bytes of classless static routes one option 121 carries.
pub const ROUTES_MAX_BYTES: usize = 255;

/// Bytes one route takes in option 121 (RFC 3442): the prefix length, the significant octets of
/// the destination, the router.
fn route_wire_len(dst: &Ipv4Net) -> usize {
    1 + usize::from(dst.prefix_len()).div_ceil(8) + 4
}

/// The bridge binding's classless static routes (option 121), as KubeVirt v1.9
/// (`netpod/discoverbridge.go`, `dhcp/server/server.go` `formClasslessRoutes`): every IPv4 route
/// of the pod interface but the one to the guest's own subnet, on-link routes with router
/// 0.0.0.0 (kubevirt/kubevirt#12613), the default routes last. A client that gets option 121
/// ignores the router option (RFC 3442), so a default route is kept first when the list has to
/// be cut at [`ROUTES_MAX_BYTES`]; the routes cut are returned to be named in a warning.
pub fn classless_routes(
    routes: &[crate::net::discover::RouteV4],
    guest_net: Option<Ipv4Net>,
) -> (Vec<(Ipv4Net, Ipv4Addr)>, Vec<Ipv4Net>) {
    let local = guest_net.map(|n| n.trunc());
    let mut other = Vec::new();
    let mut default = Vec::new();
    for r in routes {
        let dst = r.destination.trunc();
        let gw = r.gateway.unwrap_or(Ipv4Addr::UNSPECIFIED);
        if dst.prefix_len() == 0 {
            if !default.iter().any(|(_, g)| *g == gw) {
                default.push((dst, gw));
            }
        } else if Some(dst) != local && !other.iter().any(|(d, _)| *d == dst) {
            other.push((dst, gw));
        }
    }
    let mut bytes: usize = default.iter().map(|(d, _)| route_wire_len(d)).sum();
    let mut kept = Vec::new();
    let mut cut = Vec::new();
    for (dst, gw) in other {
        if cut.is_empty() && bytes + route_wire_len(&dst) <= ROUTES_MAX_BYTES {
            bytes += route_wire_len(&dst);
            kept.push((dst, gw));
        } else {
            cut.push(dst);
        }
    }
    kept.extend(default);
    (kept, cut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::discover::RouteV4;

    fn pod_search() -> Vec<String> {
        [
            "default.svc.cluster.local",
            "svc.cluster.local",
            "cluster.local",
        ]
        .map(String::from)
        .to_vec()
    }

    fn route(destination: &str, gateway: Option<&str>, protocol: u8) -> RouteV4 {
        RouteV4 {
            destination: destination.parse().unwrap(),
            gateway: gateway.map(|g| g.parse().unwrap()),
            protocol,
        }
    }

    #[test]
    fn subdomain_prefixes_search_list() {
        let s = search_domains(&pod_search(), Some("mysub"));
        assert_eq!(s[0], "mysub.default.svc.cluster.local");
        assert_eq!(search_domains(&[], None), vec!["cluster.local".to_string()]);
        // Already there (kubelet writes it): not added again.
        let mut with = pod_search();
        with.insert(0, "mysub.default.svc.cluster.local".into());
        assert_eq!(search_domains(&with, Some("mysub")), with);
        let mut later = pod_search();
        later.push("mysub.default.svc.cluster.local".into());
        assert_eq!(search_domains(&later, Some("mysub")), later);
    }

    #[test]
    fn bridge_routes_keep_on_link_routes_and_fit_option_121() {
        let guest: Ipv4Net = "10.244.0.5/24".parse().unwrap();
        let mut routes_v4 = vec![
            route("0.0.0.0/0", Some("10.244.0.1"), 3),
            route("10.244.0.0/24", None, 2),
            route("10.96.0.0/12", Some("10.244.0.1"), 3),
            route("172.16.0.0/16", None, 4),
        ];
        let (routes, cut) = classless_routes(&routes_v4, Some(guest));
        assert_eq!(
            routes,
            vec![
                (
                    "10.96.0.0/12".parse().unwrap(),
                    "10.244.0.1".parse().unwrap()
                ),
                ("172.16.0.0/16".parse().unwrap(), Ipv4Addr::UNSPECIFIED),
                ("0.0.0.0/0".parse().unwrap(), "10.244.0.1".parse().unwrap()),
            ]
        );
        assert!(cut.is_empty());
        // 40 /24 routes (8 bytes each) do not fit: the default route stays, the tail is cut.
        for i in 0..40u8 {
            routes_v4.insert(
                0,
                route(&format!("192.168.{i}.0/24"), Some("10.244.0.1"), 4),
            );
        }
        let (routes, cut) = classless_routes(&routes_v4, Some(guest));
        let bytes: usize = routes.iter().map(|(d, _)| route_wire_len(d)).sum();
        assert!(bytes <= ROUTES_MAX_BYTES, "{bytes}");
        assert_eq!(routes.last().unwrap().0.prefix_len(), 0);
        assert_eq!(routes.len() - 1 + cut.len(), 42);
    }
}
