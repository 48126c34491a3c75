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

/// A disk's I/O limits, with QEMU's `BlockIOThrottle` names (`qapi/block-core.json`): bytes and
/// operations per second, total or read/write; their bursts (`*_max`, per second) and how long
/// a burst may last (`*_max_length`, seconds); the size one operation counts for
/// (`iops_size`, bytes); and the throttle group whose limits the disks share (`group`).
/// libvirt's `<iotune>` (`total_bytes_sec` → `bps`, ..., `group_name` → `group`), set as
/// libvirt 11.10 sets it, over QMP before the guest runs (`qemuProcessSetupDiskThrottling`).
/// Zero is "no limit", as in QEMU and libvirt.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct IoThrottle {
    /// Total bytes per second.
    pub bps: u64,
    /// Read bytes per second.
    pub bps_rd: u64,
    /// Write bytes per second.
    pub bps_wr: u64,
    /// Total operations per second.
    pub iops: u64,
    /// Read operations per second.
    pub iops_rd: u64,
    /// Write operations per second.
    pub iops_wr: u64,
    /// Total bytes per second in a burst.
    pub bps_max: Option<u64>,
    /// Read bytes per second in a burst.
    pub bps_rd_max: Option<u64>,
    /// Write bytes per second in a burst.
    pub bps_wr_max: Option<u64>,
    /// Total operations per second in a burst.
    pub iops_max: Option<u64>,
    /// Read operations per second in a burst.
    pub iops_rd_max: Option<u64>,
    /// Write operations per second in a burst.
    pub iops_wr_max: Option<u64>,
    /// Longest burst of `bps_max`, seconds.
    pub bps_max_length: Option<u64>,
    /// Longest burst of `bps_rd_max`, seconds.
    pub bps_rd_max_length: Option<u64>,
    /// Longest burst of `bps_wr_max`, seconds.
    pub bps_wr_max_length: Option<u64>,
    /// Longest burst of `iops_max`, seconds.
    pub iops_max_length: Option<u64>,
    /// Longest burst of `iops_rd_max`, seconds.
    pub iops_rd_max_length: Option<u64>,
    /// Longest burst of `iops_wr_max`, seconds.
    pub iops_wr_max_length: Option<u64>,
    /// Bytes one operation counts for.
    pub iops_size: Option<u64>,
    /// Throttle group name.
    pub group: Option<String>,
}

/// `block_set_io_throttle` arguments: the limits of the disk with device id `id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockSetIoThrottle {
    /// Device id (`ua-<name>`) in the plan; the QMP plan sends the QOM path of the device
    /// holding the block backend (`/machine/peripheral/ua-<name>/virtio-backend` for
    /// virtio-blk, as libvirt).
    pub id: String,
    /// The limits.
    #[serde(flatten)]
    pub limits: IoThrottle,
}

/// Declares [`IoThrottle::NUMBERS`], [`IoThrottle::number`] and [`IoThrottle::set_number`]
/// over the always-sent (`u64`) and the optional (`Option<u64>`, unset when 0) numeric fields.
macro_rules! io_throttle_numbers {
    (required: $($r:ident),*; optional: $($o:ident),*) => {
        impl IoThrottle {
            /// QEMU's names of the numeric limits, in the struct's order.
            pub const NUMBERS: &'static [&'static str] =
                &[$(stringify!($r),)* $(stringify!($o),)*];

            /// The numeric limit QEMU calls `name` (0: not set); `None` for another name.
            pub fn number(&self, name: &str) -> Option<u64> {
                match name {
                    $(stringify!($r) => Some(self.$r),)*
                    $(stringify!($o) => Some(self.$o.unwrap_or(0)),)*
                    _ => None,
                }
            }

            /// Sets the numeric limit QEMU calls `name` (0 unsets it); `false` for another name.
            pub fn set_number(&mut self, name: &str, value: u64) -> bool {
                match name {
                    $(stringify!($r) => self.$r = value,)*
                    $(stringify!($o) => self.$o = (value != 0).then_some(value),)*
                    _ => return false,
                }
                true
            }
        }
    };
}

io_throttle_numbers!(
    required: bps, bps_rd, bps_wr, iops, iops_rd, iops_wr;
    optional: bps_max, bps_rd_max, bps_wr_max, iops_max, iops_rd_max, iops_wr_max,
        bps_max_length, bps_rd_max_length, bps_wr_max_length, iops_max_length,
        iops_rd_max_length, iops_wr_max_length, iops_size
);
