//! The pod network, set up inside the pod's network namespace through netlink.
//!
//! Discovery of the pod interface, the masquerade binding (bridge `k6t-eth0`, tap `tap0`, nftables
//! NAT rules as KubeVirt v1.9.0 writes them) and the bridge binding, and the in-process DHCPv4/DHCPv6
//! server that hands the guest its address. No `ip`, `nft` or dnsmasq binary is run.
//!
//! The work is split as "build values, then execute them":
//! - [`discover()`] reads the pod interface and resolv.conf into [`PodFacts`] (effects, read-only);
//! - [`plan()`] turns a [`NetConfig`] and the [`PodFacts`] into a [`NetPlan`] (pure: links,
//!   addresses, sysctls, nftables rules and DHCP configuration as data);
//! - [`apply()`] executes a [`NetPlan`] through rtnetlink, the tun ioctls, `/proc/sys` and nftnl,
//!   idempotently, and [`teardown()`] removes exactly what it made;
//! - [`dhcp`] serves the guest (DHCPv4, DHCPv6, optional router advertisements) on a socket the
//!   caller binds and with a shutdown future the caller owns.
//!
//! The bridge binding's stand-in link, which keeps the pod's MAC and IPs for Kubernetes after the
//! pod link became a bridge port, is an `ifb` link: KubeVirt uses a `dummy` link, which this
//! kernel (and some node kernels) lacks; `ifb` is likewise a single link that carries no traffic.
//!
//! Namespaces are per thread: [`netns::run_in`] runs a closure on a dedicated thread that entered
//! a network namespace, so a caller (or a test) never moves its own thread.

pub mod adopt;
pub mod apply;
pub mod config;
pub mod dhcp;
pub mod discover;
pub mod netns;
pub mod nft;
mod nft_dump;
mod nft_netlink;
pub mod plan;
pub mod sysctl;
pub mod tap;

pub use apply::{apply, teardown, Applied};
pub use config::{Binding, DhcpExtraOptions, NetConfig, Port, Protocol};
pub use discover::{discover, parse_resolv_conf, PodFacts, PodIface, ResolvConf};
pub use plan::{plan, LinkStep, NetPlan};

use std::io;

/// Every way the pod network setup, discovery or DHCP serving can fail.
///
/// Variants are named after the failing step; the cause is in `#[source]`.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The configuration is invalid; `field` names the [`NetConfig`] field (or VMI path) at fault.
    #[error("{field}: {reason}")]
    InvalidConfig {
        /// The field path, e.g. `vm_cidr_v4` or `ports[2].port`.
        field: String,
        /// Why the value is rejected.
        reason: String,
    },
    /// The pod has no interface with this name.
    #[error("pod interface {0:?} not found")]
    PodInterfaceMissing(String),
    /// The pod interface lacks a fact the binding needs (e.g. a MAC or an IPv4 address).
    #[error("pod interface {iface:?}: {reason}")]
    PodInterfaceUnusable {
        /// The interface name.
        iface: String,
        /// What is missing.
        reason: String,
    },
    /// Opening the netlink route socket failed.
    #[error("open the rtnetlink socket")]
    NetlinkSocket(#[source] io::Error),
    /// A netlink request failed; `step` says which (e.g. `add bridge k6t-eth0`).
    #[error("netlink: {step}")]
    Netlink {
        /// The step, with the link or address it concerned.
        step: String,
        /// The rtnetlink error.
        #[source]
        source: rtnetlink::Error,
    },
    /// Creating or configuring the tap device through `/dev/net/tun` failed.
    #[error("create tap {name:?}")]
    CreateTap {
        /// The tap name.
        name: String,
        /// The ioctl or open error.
        #[source]
        source: io::Error,
    },
    /// Reading or writing a sysctl under `/proc/sys` failed.
    #[error("sysctl {key}")]
    Sysctl {
        /// The dotted sysctl key.
        key: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Reading the pod's resolv.conf failed.
    #[error("read {path}")]
    ReadResolvConf {
        /// The path read.
        path: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Sending an nftables batch or reading nftables state failed.
    #[error("nftables: {step}")]
    Nftables {
        /// The step (e.g. `commit table ip nat`).
        step: String,
        /// The netlink error.
        #[source]
        source: io::Error,
    },
    /// The pod network is partly set up, or set up differently from the plan (virt-handler's
    /// setup of another binding, or another tool's); nothing is changed.
    #[error("the pod network set up in this namespace differs from the plan: {differences}")]
    IncompatibleSetup {
        /// Each difference, `; `-separated (`tap0 is owned by uid 0, QEMU runs as 107`).
        differences: String,
    },
    /// A `nat` table exists that qlauncher did not make; it is left alone.
    #[error("table {family} nat exists and was not made by qlauncher")]
    ForeignNatTable {
        /// `ip` or `ip6`.
        family: &'static str,
    },
    /// Entering a network namespace failed.
    #[error("enter network namespace {path}")]
    EnterNetns {
        /// The namespace file (e.g. `/run/netns/pod` or `/proc/<pid>/ns/net`).
        path: String,
        /// The open or setns error.
        #[source]
        source: io::Error,
    },
    /// The namespace worker thread panicked or could not start.
    #[error("network namespace worker thread failed")]
    NetnsThread,
    /// Opening or configuring a DHCP or RA socket failed.
    #[error("dhcp socket on {iface:?}: {step}")]
    DhcpSocket {
        /// The interface the socket binds to.
        iface: String,
        /// The socket step (bind, join multicast, ...).
        step: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Building a DHCP option failed (e.g. a search domain that is not a valid DNS name).
    #[error("dhcp option {option}: {reason}")]
    DhcpOption {
        /// The option (e.g. `119 domain search`).
        option: String,
        /// Why.
        reason: String,
    },
}

impl NetError {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        NetError::InvalidConfig {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
