//! Typed QMP queries of the domain statistics (KubeVirt's `GetDomainStats`, libvirt's
//! `virDomainListGetStats` groups): `query-cpus-fast`, `query-blockstats`, `query-block`,
//! `query-balloon` and the balloon's `guest-stats` (QEMU `qapi/machine.json`,
//! `qapi/block-core.json`, `qapi/misc-target.json`, `docs/virtio-balloon-stats.txt`). Only the
//! members the launcher reads are decoded.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `query-cpus-fast`: the vCPUs and their host threads.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueryCpusFast;
command!(QueryCpusFast, "query-cpus-fast", Vec<CpuInfoFast>);

/// One vCPU of `query-cpus-fast`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CpuInfoFast {
    /// The vCPU index.
    #[serde(rename = "cpu-index")]
    pub cpu_index: i64,
    /// The host thread id running it.
    #[serde(rename = "thread-id")]
    pub thread_id: i64,
    /// The vCPU's QOM path (`/machine/unattached/device[0]`).
    #[serde(rename = "qom-path", default)]
    pub qom_path: String,
}

/// `query-blockstats`: I/O counters per drive.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueryBlockstats;
command!(QueryBlockstats, "query-blockstats", Vec<BlockStatsInfo>);

/// One drive of `query-blockstats` (`BlockStats`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct BlockStatsInfo {
    /// The device's qdev id or QOM path, as in `query-block`.
    #[serde(default)]
    pub qdev: Option<String>,
    /// The counters.
    #[serde(default)]
    pub stats: BlockDeviceStats,
}

/// The counters of a drive (`BlockDeviceStats`; the members libvirt reports).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default)]
pub struct BlockDeviceStats {
    /// Read requests.
    pub rd_operations: Option<u64>,
    /// Bytes read.
    pub rd_bytes: Option<u64>,
    /// Time spent reading, ns.
    pub rd_total_time_ns: Option<u64>,
    /// Write requests.
    pub wr_operations: Option<u64>,
    /// Bytes written.
    pub wr_bytes: Option<u64>,
    /// Time spent writing, ns.
    pub wr_total_time_ns: Option<u64>,
    /// Flush requests.
    pub flush_operations: Option<u64>,
    /// Time spent flushing, ns.
    pub flush_total_time_ns: Option<u64>,
    /// The highest offset written, bytes (libvirt's allocation).
    pub wr_highest_offset: Option<u64>,
}

/// `query-balloon`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueryBalloon;
command!(QueryBalloon, "query-balloon", BalloonInfo);

/// The reply of `query-balloon`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct BalloonInfo {
    /// Memory the guest has, bytes.
    pub actual: u64,
}

/// `qom-get` of a balloon's `guest-stats` property (the stats the guest driver reports every
/// `guest-stats-polling-interval` seconds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QomGetGuestStats {
    /// QOM path of the balloon (`/machine/peripheral/balloon0`).
    pub path: String,
    /// Always `guest-stats`.
    pub property: &'static str,
}
command!(QomGetGuestStats, "qom-get", GuestStats);

impl QomGetGuestStats {
    /// The `guest-stats` of the balloon at `path`.
    pub fn of(path: &str) -> QomGetGuestStats {
        QomGetGuestStats {
            path: path.to_string(),
            property: "guest-stats",
        }
    }
}

/// A balloon's `guest-stats`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct GuestStats {
    /// `stat-swap-in`, `stat-free-memory`, ... in bytes or counts; QEMU reports a statistic the
    /// guest has not sent as -1 (7.2) or `u64::MAX`.
    #[serde(default)]
    pub stats: BTreeMap<String, i128>,
    /// When the guest last reported, seconds since the epoch.
    #[serde(rename = "last-update", default)]
    pub last_update: i64,
}

impl GuestStats {
    /// The statistic `key` when the guest reported it.
    pub fn get(&self, key: &str) -> Option<u64> {
        let v = u64::try_from(*self.stats.get(key)?).ok()?;
        (v != u64::MAX).then_some(v)
    }
}

/// `query-block`: every drive and its medium (read by the stats collection and the disk
/// resize).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueryBlock;
command!(QueryBlock, "query-block", Vec<BlockInfo>);

/// One drive of `query-block` (`BlockInfo`; the members the launcher reads).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct BlockInfo {
    /// The legacy drive id (empty for `-blockdev` drives).
    #[serde(default)]
    pub device: String,
    /// The device's qdev id or QOM path (`ua-cd`, `/machine/peripheral/ua-disk0/virtio-backend`).
    #[serde(default)]
    pub qdev: Option<String>,
    /// The medium; `None` for an empty drive.
    #[serde(default)]
    pub inserted: Option<BlockDeviceInfo>,
}

/// The medium of a drive (`BlockDeviceInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct BlockDeviceInfo {
    /// The top node's name.
    #[serde(rename = "node-name", default)]
    pub node_name: Option<String>,
    /// Read-only medium (QEMU always sends it; `None` when absent).
    #[serde(default)]
    pub ro: Option<bool>,
    /// The top node's filename (`json:{..}` for a chain).
    #[serde(default)]
    pub file: Option<String>,
    /// The image.
    #[serde(default)]
    pub image: Option<ImageInfo>,
}

/// An image of `query-block` (`ImageInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct ImageInfo {
    /// The image file.
    #[serde(default)]
    pub filename: Option<String>,
    /// Guest-visible size, bytes.
    #[serde(rename = "virtual-size", default)]
    pub virtual_size: Option<u64>,
    /// Bytes allocated on the host.
    #[serde(rename = "actual-size", default)]
    pub actual_size: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stats_replies_decode() {
        let cpus: Vec<CpuInfoFast> = serde_json::from_value(json!([
            {"cpu-index": 0, "thread-id": 10, "qom-path": "/machine/unattached/device[0]",
             "target": "x86_64", "props": {"socket-id": 0}}
        ]))
        .unwrap();
        assert_eq!(cpus[0].thread_id, 10);
        let stats: Vec<BlockStatsInfo> = serde_json::from_value(json!([
            {"device": "", "qdev": "ua-cd", "stats": {"rd_bytes": 7, "account_invalid": true,
             "timed_stats": [], "idle_time_ns": 5}}
        ]))
        .unwrap();
        assert_eq!(stats[0].stats.rd_bytes, Some(7));
        assert_eq!(stats[0].stats.wr_bytes, None);
        let guest: GuestStats = serde_json::from_value(json!({"stats": {
            "stat-free-memory": 4096, "stat-swap-in": -1, "stat-total-memory": u64::MAX},
            "last-update": 1700000000}))
        .unwrap();
        assert_eq!(guest.get("stat-free-memory"), Some(4096));
        assert_eq!(guest.get("stat-swap-in"), None);
        assert_eq!(guest.get("stat-total-memory"), None);
        assert_eq!(guest.get("stat-disk-caches"), None);
    }
}
