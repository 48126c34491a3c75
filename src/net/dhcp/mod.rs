//! The in-process DHCP servers that hand the guest its address.
//!
//! KubeVirt runs these as goroutines inside virt-launcher (`pkg/network/dhcp`, with krolaw/dhcp4
//! and insomniacslk/dhcp); qlauncher runs them as tokio tasks. Each server takes a socket the
//! caller bound (inside the pod network namespace, see [`v4::bind`], [`v6::bind`],
//! [`ra::bind`]), its configuration, a [`DhcpStats`] to count into, and a shutdown future; it
//! returns when the future completes. Malformed packets are counted and dropped, never fatal.

pub mod ra;
pub mod v4;
pub mod v6;

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one server, readable while it runs.
#[derive(Debug, Default)]
pub struct DhcpStats {
    received: AtomicU64,
    replied: AtomicU64,
    naks: AtomicU64,
    releases: AtomicU64,
    ignored: AtomicU64,
    malformed: AtomicU64,
    send_errors: AtomicU64,
}

/// A copy of [`DhcpStats`] at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    /// Datagrams received.
    pub received: u64,
    /// Replies sent (OFFER, ACK, NAK, Advertise, Reply).
    pub replied: u64,
    /// NAKs among the replies.
    pub naks: u64,
    /// RELEASE messages seen.
    pub releases: u64,
    /// Well-formed messages not answered (other MAC, other server, DECLINE, unknown type).
    pub ignored: u64,
    /// Datagrams that did not parse or lacked required fields.
    pub malformed: u64,
    /// Replies the socket failed to send.
    pub send_errors: u64,
}

impl DhcpStats {
    /// Reads all counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            received: l(&self.received),
            replied: l(&self.replied),
            naks: l(&self.naks),
            releases: l(&self.releases),
            ignored: l(&self.ignored),
            malformed: l(&self.malformed),
            send_errors: l(&self.send_errors),
        }
    }

    fn bump(a: &AtomicU64) {
        a.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a server decided about one datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<A> {
    /// Send these bytes to this address.
    Reply {
        /// The encoded reply.
        bytes: Vec<u8>,
        /// Where to send it.
        to: A,
        /// Whether it is a NAK.
        nak: bool,
    },
    /// A RELEASE was recorded (nothing is sent).
    Released,
    /// Not answered, with the reason.
    Ignored(&'static str),
    /// The datagram did not parse or lacked required fields.
    Malformed(String),
}

impl<A> Outcome<A> {
    pub(crate) fn count(&self, stats: &DhcpStats) {
        DhcpStats::bump(&stats.received);
        match self {
            Outcome::Reply { nak, .. } => {
                DhcpStats::bump(&stats.replied);
                if *nak {
                    DhcpStats::bump(&stats.naks);
                }
            }
            Outcome::Released => DhcpStats::bump(&stats.releases),
            Outcome::Ignored(_) => DhcpStats::bump(&stats.ignored),
            Outcome::Malformed(_) => DhcpStats::bump(&stats.malformed),
        }
    }
}

/// The most bytes of domain search list one option carries: option 119's length byte (RFC 3397);
/// DHCPv6 option 24 (RFC 3646) is given the same list, so both families see the same search.
pub const SEARCH_LIST_MAX_BYTES: usize = 255;

/// Why `name` (without its trailing dot) cannot be a search domain, or `None` when it is a DNS
/// name in host name syntax (RFC 1123 §2.1: labels of letters, digits and inner hyphens, at most
/// 63 bytes, at most 253 in all, the last label not all digits). ISC dhclient and glibc's
/// `res_hnok` check the same syntax; dhclient throws away the whole option 119 when one name
/// fails it, so an entry that fails is dropped instead. KubeVirt v1.9 (`dhcp/server/server.go`,
/// `searchDomainValidationRegex`) stops its DHCP server on such an entry (kubevirt/kubevirt#12615).
pub fn dns_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("empty");
    }
    if name.parse::<std::net::IpAddr>().is_ok() {
        return Some("an IP address");
    }
    if name.len() > 253 {
        return Some("longer than 253 characters");
    }
    let mut last = "";
    for label in name.split('.') {
        if label.is_empty() {
            return Some("an empty label");
        }
        if label.len() > 63 {
            return Some("a label longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Some("a character other than a letter, a digit or '-'");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Some("a label that starts or ends with '-'");
        }
        last = label;
    }
    if last.bytes().all(|b| b.is_ascii_digit()) {
        return Some("an all-numeric top-level label");
    }
    None
}

/// Bytes `name` takes in a DHCP domain list, uncompressed (RFC 1035 §3.1): a length byte per
/// label, the labels, the root's zero byte.
pub fn wire_len(name: &str) -> usize {
    name.len() + 2
}

/// A search list made fit for options 119 and 24 by [`search_list`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SearchList {
    /// The names sent, in order.
    pub names: Vec<String>,
    /// Entries that are not DNS names, with the reason ([`dns_name_problem`]).
    pub invalid: Vec<(String, &'static str)>,
    /// Entries dropped as repeats of an earlier one (compared case-insensitively).
    pub repeated: Vec<String>,
    /// Entries dropped because the list reached [`SEARCH_LIST_MAX_BYTES`], in order.
    pub overflow: Vec<String>,
}

impl SearchList {
    /// One line per kind of entry dropped, naming the entries; empty when none was.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if !self.invalid.is_empty() {
            let v: Vec<String> = self
                .invalid
                .iter()
                .map(|(n, why)| format!("{n:?} ({why})"))
                .collect();
            notes.push(format!(
                "search domains that are not DNS names dropped: {}",
                v.join(", ")
            ));
        }
        if !self.repeated.is_empty() {
            notes.push(format!(
                "repeated search domains dropped: {:?}",
                self.repeated
            ));
        }
        if !self.overflow.is_empty() {
            notes.push(format!(
                "search list cut at {SEARCH_LIST_MAX_BYTES} bytes (DHCP option 119), dropped: {:?}",
                self.overflow
            ));
        }
        notes
    }
}

/// Makes the domain search list sent to the guest: trailing dots removed, entries that are not
/// DNS names and repeats dropped, then the list cut before the first entry that would take it
/// past [`SEARCH_LIST_MAX_BYTES`] (the later ones are dropped too, so the order the guest
/// searches in stays the pod's). Never fails.
pub fn search_list(domains: &[String]) -> SearchList {
    let mut out = SearchList::default();
    let mut bytes = 0usize;
    for d in domains {
        let name = d.strip_suffix('.').unwrap_or(d);
        if let Some(why) = dns_name_problem(name) {
            out.invalid.push((d.clone(), why));
            continue;
        }
        if out.names.iter().any(|n| n.eq_ignore_ascii_case(name)) {
            out.repeated.push(d.clone());
            continue;
        }
        if !out.overflow.is_empty() || bytes + wire_len(name) > SEARCH_LIST_MAX_BYTES {
            out.overflow.push(d.clone());
            continue;
        }
        bytes += wire_len(name);
        out.names.push(name.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names_and_not() {
        for ok in [
            "cluster.local",
            "a-b.c9.EXAMPLE",
            "x",
            "1a.com",
            "svc.cluster.local",
        ] {
            assert_eq!(dns_name_problem(ok), None, "{ok}");
        }
        for (bad, why) in [
            ("10.0.0.1", "an IP address"),
            ("fd00::1", "an IP address"),
            (
                "a_b.example",
                "a character other than a letter, a digit or '-'",
            ),
            ("ab-.example", "a label that starts or ends with '-'"),
            ("-ab.example", "a label that starts or ends with '-'"),
            ("a..b", "an empty label"),
            ("foo.123", "an all-numeric top-level label"),
            ("", "empty"),
        ] {
            assert_eq!(dns_name_problem(bad), Some(why), "{bad}");
        }
        assert!(dns_name_problem(&"a".repeat(64)).is_some());
        assert!(dns_name_problem(&["a"; 130].join(".")).is_some());
    }

    #[test]
    fn search_list_drops_invalid_repeats_and_overflow() {
        let long: Vec<String> = (0..12)
            .map(|i| format!("{i:02}-{}.example", "x".repeat(20)))
            .collect();
        let mut input = vec![
            "a.example.".to_string(),
            "10.1.2.3".into(),
            "A.example".into(),
        ];
        input.extend(long.iter().cloned());
        let s = search_list(&input);
        assert_eq!(s.invalid, vec![("10.1.2.3".to_string(), "an IP address")]);
        assert_eq!(s.repeated, vec!["A.example".to_string()]);
        let bytes: usize = s.names.iter().map(|n| wire_len(n)).sum();
        assert!(bytes <= SEARCH_LIST_MAX_BYTES);
        assert_eq!(s.names.len() + s.overflow.len(), 13);
        assert_eq!(s.names[0], "a.example");
        assert_eq!(s.notes().len(), 3);
    }
}
