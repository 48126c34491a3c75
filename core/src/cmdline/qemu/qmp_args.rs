//! Arguments of the QMP commands the device plan names besides the add commands (whose
//! arguments are the device, blockdev and netdev structs themselves): removal (`device_del`,
//! `blockdev-del`, `netdev_del`), `getfd` and the start-up commands (`set_link`, `qom-set`).
//! QEMU `qapi/qdev.json`, `qapi/block-core.json`, `qapi/net.json`, `qapi/qom.json`,
//! `qapi/misc.json`.

use serde::Serialize;

/// `device_del` arguments: `{"id": "ua-<name>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceDel {
    /// Device id.
    pub id: String,
}

/// `blockdev-del` arguments: `{"node-name": "libvirt-N-format"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockdevDel {
    /// Node name.
    #[serde(rename = "node-name")]
    pub node_name: String,
}

/// `netdev_del` arguments: `{"id": "hostua-<name>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetdevDel {
    /// Netdev id.
    pub id: String,
}

/// `getfd` arguments: `{"fdname": ..}`; the fd itself travels as `SCM_RIGHTS`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GetFd {
    /// Name the fd gets in QEMU (a netdev's `fd` / `vhostfd` refers to it).
    pub fdname: String,
}

/// `set_link` arguments: a NIC's link up or down, by device id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SetLink {
    /// Device id (`ua-<name>`).
    pub name: String,
    /// Link up.
    pub up: bool,
}

/// `qom-set` of an integer property (the balloon's `guest-stats-polling-interval` in seconds,
/// virtio-mem's `requested-size` in bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QomSet {
    /// QOM path (`/machine/peripheral/<id>`).
    pub path: String,
    /// Property name.
    pub property: String,
    /// The new value.
    pub value: u64,
}
