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
