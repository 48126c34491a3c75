//! `-netdev` / `netdev_add` argument structs (QEMU `NetdevTapOptions`). JSON `-netdev` is
//! accepted from QEMU 7.1 on (checked on 7.2 here).

use serde::Serialize;
use serde_with::skip_serializing_none;

/// A tap netdev: an inherited fd (or fds, multiqueue), or a tap opened by name.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NetdevTap {
    /// Always `tap`.
    #[serde(rename = "type")]
    pub type_: &'static str,
    /// Netdev id (`hostua-<name>`).
    pub id: String,
    /// One inherited tap fd (number as a string, or a `getfd` name at hotplug).
    pub fd: Option<String>,
    /// Several inherited fds, `:`-separated (multiqueue).
    pub fds: Option<String>,
    /// Tap name, when QEMU opens the tap itself (tests and unprivileged runs).
    pub ifname: Option<String>,
    /// `no` when `ifname` is used (never run a helper script).
    pub script: Option<&'static str>,
    /// `no` when `ifname` is used.
    pub downscript: Option<&'static str>,
    /// vhost-net on.
    pub vhost: Option<bool>,
    /// Inherited vhost fd.
    pub vhostfd: Option<String>,
    /// Inherited vhost fds (multiqueue), `:`-separated.
    pub vhostfds: Option<String>,
    /// Queue count when QEMU opens the tap by name.
    pub queues: Option<u32>,
}
