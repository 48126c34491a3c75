//! The masquerade binding's nftables NAT rules, as data.
//!
//! [`masquerade_table`] reproduces KubeVirt v1.9.0 `setupNATByFamily`
//! (`pkg/network/setup/netpod/masquerade/masquerade.go`) rule for rule and in the same order, for
//! one family. The [`fmt::Display`] forms are the `nft` syntax that `nft list ruleset` prints
//! (without counter values), so plans can be checked as text; [`crate::net::apply()`] commits the
//! same values through libnftnl (`nft_netlink`).

use crate::net::config::{Port, Protocol};
use std::fmt;
use std::net::IpAddr;

/// The nftables family of a NAT table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// `ip` (IPv4).
    Ip,
    /// `ip6` (IPv6).
    Ip6,
}

impl Family {
    /// The `nft` keyword, also the address match prefix (`ip saddr`, `ip6 saddr`).
    pub fn keyword(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        }
    }

    /// The loopback address (`127.0.0.1`, `::1`).
    pub fn loopback(self) -> IpAddr {
        match self {
            Family::Ip => IpAddr::from([127, 0, 0, 1]),
            Family::Ip6 => IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        }
    }
}

/// A base chain hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    /// `prerouting`.
    Prerouting,
    /// `input`.
    Input,
    /// `output`.
    Output,
    /// `postrouting`.
    Postrouting,
}

/// One match of a rule. Several in a rule are ANDed, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    /// `iifname "<name>"`.
    IifName(String),
    /// `oifname "<name>"`.
    OifName(String),
    /// `<proto> dport P` (one port, a comparison) or `<proto> dport { P, Q }` (an anonymous set).
    Dport(Protocol, Vec<u16>),
    /// `ip saddr A` or `ip saddr { A, B }`.
    Saddr(Vec<IpAddr>),
    /// `ip daddr A` or `ip daddr { A, B }`.
    Daddr(Vec<IpAddr>),
}

/// What a rule does after `counter`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// `masquerade`.
    Masquerade,
    /// `jump <chain>`.
    Jump(String),
    /// `return`.
    Return,
    /// `dnat to <addr>`.
    Dnat(IpAddr),
    /// `snat to <addr>`.
    Snat(IpAddr),
}

/// A rule: matches, a counter (every KubeVirt NAT rule has one), an action.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// The matches, in order.
    pub matches: Vec<Match>,
    /// The action.
    pub action: Action,
}

/// A chain: a base chain (type nat, with hook and priority) or a regular chain.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    /// The chain name.
    pub name: String,
    /// `(hook, priority)` for a base chain of type nat; `None` for a regular chain.
    pub hook: Option<(Hook, i32)>,
    /// The rules, in order.
    pub rules: Vec<Rule>,
}

/// One `table <family> nat`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NatTable {
    /// The family.
    pub family: Family,
    /// The chains, in creation order.
    pub chains: Vec<Chain>,
}

/// The table name KubeVirt uses.
pub const NAT_TABLE: &str = "nat";
const PREROUTING: &str = "prerouting";
const INPUT: &str = "input";
const OUTPUT: &str = "output";
const POSTROUTING: &str = "postrouting";
/// KubeVirt's inbound DNAT chain.
pub const PREINBOUND: &str = "KUBEVIRT_PREINBOUND";
/// KubeVirt's inbound SNAT chain.
pub const POSTINBOUND: &str = "KUBEVIRT_POSTINBOUND";

/// libvirt's direct and block migration ports, skipped for legacy migration.
pub const LEGACY_MIGRATION_PORTS: [u16; 2] = [49152, 49153];
/// Istio's Envoy ports that must not be forwarded (`pkg/network/istio/ports.go`).
pub const ISTIO_RESERVED_PORTS: [u16; 10] = [
    15000, 15001, 15004, 15006, 15008, 15009, 15020, 15021, 15053, 15090,
];
/// Istio's non-proxied ports, forwarded straight to the guest.
pub const ISTIO_NON_PROXIED_PORTS: [u16; 1] = [22];
/// Istio's inbound passthrough source address.
pub const ISTIO_LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 6));

/// The facts [`masquerade_table`] needs for one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasqueradeInput<'a> {
    /// The family.
    pub family: Family,
    /// The pod interface (`eth0`).
    pub pod_iface: &'a str,
    /// The bridge (`k6t-eth0`).
    pub bridge: &'a str,
    /// The guest address (10.0.2.2 / fd10:0:2::2).
    pub guest: IpAddr,
    /// The gateway, the bridge address (10.0.2.1 / fd10:0:2::1).
    pub gateway: IpAddr,
    /// The pod's first IPv4 address (for the istio DNAT set); ignored for ip6.
    pub pod_ipv4: Option<IpAddr>,
    /// The VMI interface ports.
    pub ports: &'a [Port],
    /// Istio sidecar injection.
    pub istio: bool,
    /// Skip forwarding of the legacy migration ports.
    pub legacy_migration_ports: bool,
}

fn rule(matches: Vec<Match>, action: Action) -> Rule {
    Rule { matches, action }
}

/// Builds `table <family> nat` as KubeVirt v1.9.0 `setupNATByFamily` does.
pub fn masquerade_table(m: &MasqueradeInput<'_>) -> NatTable {
    let fam = m.family;
    let lo = fam.loopback();
    let mut pre = Vec::new();
    let mut output = Vec::new();
    let mut post = Vec::new();
    let mut preinbound = Vec::new();
    let mut postinbound = Vec::new();

    post.push(rule(vec![Match::Saddr(vec![m.guest])], Action::Masquerade));
    pre.push(rule(
        vec![Match::IifName(m.pod_iface.into())],
        Action::Jump(PREINBOUND.into()),
    ));
    post.push(rule(
        vec![Match::OifName(m.bridge.into())],
        Action::Jump(POSTINBOUND.into()),
    ));

    let skip = |ports: &[u16], output: &mut Vec<Rule>, postinbound: &mut Vec<Rule>| {
        let r = rule(
            vec![
                Match::Dport(Protocol::Tcp, ports.to_vec()),
                Match::Saddr(vec![lo]),
            ],
            Action::Return,
        );
        output.push(r.clone());
        postinbound.push(r);
    };
    if m.legacy_migration_ports {
        skip(&LEGACY_MIGRATION_PORTS, &mut output, &mut postinbound);
    }

    let mut dnat_addrs = vec![lo];
    if m.istio && fam == Family::Ip {
        if let Some(pod) = m.pod_ipv4 {
            dnat_addrs.push(pod);
        }
    }
    let mut snat_addrs = vec![lo];
    if m.istio && fam == Family::Ip {
        snat_addrs.push(ISTIO_LOOPBACK);
    }

    for p in m.ports {
        if m.istio {
            let fwd: Vec<u16> = ISTIO_NON_PROXIED_PORTS
                .iter()
                .copied()
                .filter(|n| *n == p.port)
                .collect();
            if !fwd.is_empty() {
                preinbound.push(rule(
                    vec![Match::Dport(Protocol::Tcp, fwd)],
                    Action::Dnat(m.guest),
                ));
            }
        } else {
            preinbound.push(rule(
                vec![Match::Dport(p.protocol, vec![p.port])],
                Action::Dnat(m.guest),
            ));
        }
        postinbound.push(rule(
            vec![
                Match::Dport(p.protocol, vec![p.port]),
                Match::Saddr(snat_addrs.clone()),
            ],
            Action::Snat(m.gateway),
        ));
        output.push(rule(
            vec![
                Match::Daddr(dnat_addrs.clone()),
                Match::Dport(p.protocol, vec![p.port]),
            ],
            Action::Dnat(m.guest),
        ));
    }

    if m.ports.is_empty() {
        if m.istio {
            skip(&ISTIO_RESERVED_PORTS, &mut output, &mut postinbound);
            preinbound.push(rule(
                vec![Match::Dport(
                    Protocol::Tcp,
                    ISTIO_NON_PROXIED_PORTS.to_vec(),
                )],
                Action::Dnat(m.guest),
            ));
        } else {
            preinbound.push(rule(vec![], Action::Dnat(m.guest)));
        }
        postinbound.push(rule(
            vec![Match::Saddr(snat_addrs.clone())],
            Action::Snat(m.gateway),
        ));
        output.push(rule(
            vec![Match::Daddr(dnat_addrs.clone())],
            Action::Dnat(m.guest),
        ));
    }

    let base = |name: &str, hook, prio, rules| Chain {
        name: name.into(),
        hook: Some((hook, prio)),
        rules,
    };
    NatTable {
        family: fam,
        chains: vec![
            base(PREROUTING, Hook::Prerouting, -100, pre),
            base(INPUT, Hook::Input, 100, Vec::new()),
            base(OUTPUT, Hook::Output, -100, output),
            base(POSTROUTING, Hook::Postrouting, 100, post),
            Chain {
                name: PREINBOUND.into(),
                hook: None,
                rules: preinbound,
            },
            Chain {
                name: POSTINBOUND.into(),
                hook: None,
                rules: postinbound,
            },
        ],
    }
}

fn write_set<T: fmt::Display + Ord + Clone>(
    f: &mut fmt::Formatter<'_>,
    items: &[T],
) -> fmt::Result {
    if let [one] = items {
        return write!(f, "{one}");
    }
    // nft prints anonymous set elements sorted.
    let mut sorted = items.to_vec();
    sorted.sort();
    write!(f, "{{ ")?;
    for (i, x) in sorted.iter().enumerate() {
        if i > 0 {
            write!(f, ", ")?;
        }
        write!(f, "{x}")?;
    }
    write!(f, " }}")
}

/// Renders a rule as `nft list` prints it in a table of `family`, without counter values
/// (`counter` stands alone).
pub struct RuleText<'a>(pub Family, pub &'a Rule);

impl fmt::Display for RuleText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fam = self.0.keyword();
        for m in &self.1.matches {
            match m {
                Match::IifName(n) => write!(f, "iifname \"{n}\" ")?,
                Match::OifName(n) => write!(f, "oifname \"{n}\" ")?,
                Match::Dport(p, ports) => {
                    write!(f, "{} dport ", p.keyword())?;
                    write_set(f, ports)?;
                    write!(f, " ")?;
                }
                Match::Saddr(a) => {
                    write!(f, "{fam} saddr ")?;
                    write_set(f, a)?;
                    write!(f, " ")?;
                }
                Match::Daddr(a) => {
                    write!(f, "{fam} daddr ")?;
                    write_set(f, a)?;
                    write!(f, " ")?;
                }
            }
        }
        write!(f, "counter ")?;
        match &self.1.action {
            Action::Masquerade => write!(f, "masquerade"),
            Action::Jump(c) => write!(f, "jump {c}"),
            Action::Return => write!(f, "return"),
            Action::Dnat(a) => write!(f, "dnat to {a}"),
            Action::Snat(a) => write!(f, "snat to {a}"),
        }
    }
}

impl fmt::Display for NatTable {
    /// The table as `nft -s list ruleset` (stateless) prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "table {} {} {{", self.family.keyword(), NAT_TABLE)?;
        for (i, c) in self.chains.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            writeln!(f, "\tchain {} {{", c.name)?;
            if let Some((hook, prio)) = c.hook {
                let (h, p) = match (hook, prio) {
                    (Hook::Prerouting, -100) => ("prerouting", "dstnat".to_string()),
                    (Hook::Postrouting, 100) => ("postrouting", "srcnat".to_string()),
                    (Hook::Prerouting, p) => ("prerouting", p.to_string()),
                    (Hook::Postrouting, p) => ("postrouting", p.to_string()),
                    (Hook::Input, p) => ("input", p.to_string()),
                    (Hook::Output, p) => ("output", p.to_string()),
                };
                writeln!(f, "\t\ttype nat hook {h} priority {p}; policy accept;")?;
            }
            for r in &c.rules {
                writeln!(f, "\t\t{}", RuleText(self.family, r))?;
            }
            writeln!(f, "\t}}")?;
        }
        writeln!(f, "}}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(fam: Family, ports: &'a [Port]) -> MasqueradeInput<'a> {
        let (guest, gw): (IpAddr, IpAddr) = match fam {
            Family::Ip => ("10.0.2.2".parse().unwrap(), "10.0.2.1".parse().unwrap()),
            Family::Ip6 => (
                "fd10:0:2::2".parse().unwrap(),
                "fd10:0:2::1".parse().unwrap(),
            ),
        };
        MasqueradeInput {
            family: fam,
            pod_iface: "eth0",
            bridge: "k6t-eth0",
            guest,
            gateway: gw,
            pod_ipv4: Some("10.244.0.5".parse().unwrap()),
            ports,
            istio: false,
            legacy_migration_ports: false,
        }
    }

    fn rules(t: &NatTable) -> Vec<(String, String)> {
        t.chains
            .iter()
            .flat_map(|c| {
                c.rules
                    .iter()
                    .map(|r| (c.name.clone(), RuleText(t.family, r).to_string()))
            })
            .collect()
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn all_ports_ipv4_matches_kubevirt() {
        let t = masquerade_table(&input(Family::Ip, &[]));
        assert_eq!(
            rules(&t),
            pairs(&[
                (
                    "prerouting",
                    "iifname \"eth0\" counter jump KUBEVIRT_PREINBOUND"
                ),
                ("output", "ip daddr 127.0.0.1 counter dnat to 10.0.2.2"),
                ("postrouting", "ip saddr 10.0.2.2 counter masquerade"),
                (
                    "postrouting",
                    "oifname \"k6t-eth0\" counter jump KUBEVIRT_POSTINBOUND"
                ),
                ("KUBEVIRT_PREINBOUND", "counter dnat to 10.0.2.2"),
                (
                    "KUBEVIRT_POSTINBOUND",
                    "ip saddr 127.0.0.1 counter snat to 10.0.2.1"
                ),
            ])
        );
    }

    #[test]
    fn listed_ports_ipv6_with_migration_matches_kubevirt() {
        let ports = [
            Port {
                protocol: Protocol::Tcp,
                port: 80,
            },
            Port {
                protocol: Protocol::Udp,
                port: 53,
            },
        ];
        let mut i = input(Family::Ip6, &ports);
        i.legacy_migration_ports = true;
        let t = masquerade_table(&i);
        assert_eq!(
            rules(&t),
            pairs(&[
                (
                    "prerouting",
                    "iifname \"eth0\" counter jump KUBEVIRT_PREINBOUND"
                ),
                (
                    "output",
                    "tcp dport { 49152, 49153 } ip6 saddr ::1 counter return"
                ),
                (
                    "output",
                    "ip6 daddr ::1 tcp dport 80 counter dnat to fd10:0:2::2"
                ),
                (
                    "output",
                    "ip6 daddr ::1 udp dport 53 counter dnat to fd10:0:2::2"
                ),
                ("postrouting", "ip6 saddr fd10:0:2::2 counter masquerade"),
                (
                    "postrouting",
                    "oifname \"k6t-eth0\" counter jump KUBEVIRT_POSTINBOUND"
                ),
                (
                    "KUBEVIRT_PREINBOUND",
                    "tcp dport 80 counter dnat to fd10:0:2::2"
                ),
                (
                    "KUBEVIRT_PREINBOUND",
                    "udp dport 53 counter dnat to fd10:0:2::2"
                ),
                (
                    "KUBEVIRT_POSTINBOUND",
                    "tcp dport { 49152, 49153 } ip6 saddr ::1 counter return"
                ),
                (
                    "KUBEVIRT_POSTINBOUND",
                    "tcp dport 80 ip6 saddr ::1 counter snat to fd10:0:2::1"
                ),
                (
                    "KUBEVIRT_POSTINBOUND",
                    "udp dport 53 ip6 saddr ::1 counter snat to fd10:0:2::1"
                ),
            ])
        );
    }

    #[test]
    fn istio_without_ports_skips_envoy_and_forwards_ssh() {
        let mut i = input(Family::Ip, &[]);
        i.istio = true;
        let t = masquerade_table(&i);
        let envoy = "tcp dport { 15000, 15001, 15004, 15006, 15008, 15009, 15020, 15021, 15053, 15090 } ip saddr 127.0.0.1 counter return";
        assert_eq!(
            rules(&t),
            pairs(&[
                (
                    "prerouting",
                    "iifname \"eth0\" counter jump KUBEVIRT_PREINBOUND"
                ),
                ("output", envoy),
                (
                    "output",
                    "ip daddr { 10.244.0.5, 127.0.0.1 } counter dnat to 10.0.2.2"
                ),
                ("postrouting", "ip saddr 10.0.2.2 counter masquerade"),
                (
                    "postrouting",
                    "oifname \"k6t-eth0\" counter jump KUBEVIRT_POSTINBOUND"
                ),
                (
                    "KUBEVIRT_PREINBOUND",
                    "tcp dport 22 counter dnat to 10.0.2.2"
                ),
                ("KUBEVIRT_POSTINBOUND", envoy),
                (
                    "KUBEVIRT_POSTINBOUND",
                    "ip saddr { 127.0.0.1, 127.0.0.6 } counter snat to 10.0.2.1"
                ),
            ])
        );
    }

    #[test]
    fn istio_with_ports_forwards_only_non_proxied() {
        let ports = [
            Port {
                protocol: Protocol::Tcp,
                port: 22,
            },
            Port {
                protocol: Protocol::Tcp,
                port: 80,
            },
        ];
        let mut i = input(Family::Ip, &ports);
        i.istio = true;
        let t = masquerade_table(&i);
        let pre: Vec<_> = rules(&t)
            .into_iter()
            .filter(|(c, _)| c == "KUBEVIRT_PREINBOUND")
            .collect();
        assert_eq!(
            pre,
            pairs(&[(
                "KUBEVIRT_PREINBOUND",
                "tcp dport 22 counter dnat to 10.0.2.2"
            )])
        );
    }
}
