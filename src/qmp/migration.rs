//! Typed QMP commands of a live migration: capabilities and parameters, `migrate` /
//! `migrate-incoming`, the switchover and cancel commands, the NBD server and exports of the
//! target, and the NBD client and `blockdev-mirror` jobs of the source (QEMU's
//! `qapi/migration.json`, `qapi/block-export.json`, `qapi/block-core.json`; the order libvirt
//! issues them in is in `src/qemu/qemu_migration.c`).
//!
//! Every command here exists in QEMU 7.2 and 10.1 with the same arguments. Commands are plain
//! structs implementing [`crate::qmp::commands::Command`]; `QmpClient::run` turns one into JSON at the client's
//! edge and decodes its typed reply.

use serde::{Deserialize, Serialize};

use crate::qmp::commands::{command, Empty};

/// A migration capability QEMU names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Capability {
    /// MIGRATION events.
    Events,
    /// Throttle vCPUs when RAM does not converge (source).
    AutoConverge,
    /// Allow `migrate-start-postcopy` (both).
    PostcopyRam,
    /// Several stream channels (both).
    Multifd,
    /// A target-to-source return path (both).
    ReturnPath,
    /// Stop in `pre-switchover` before the device state is sent (source).
    PauseBeforeSwitchover,
    /// Activate block nodes on the target only at `cont` (target).
    LateBlockActivate,
    /// Send the block nodes' dirty bitmaps in the stream, paired by node name (both): the
    /// checkpoints of changed block tracking reach a target whose overlay is new.
    DirtyBitmaps,
}

/// One capability and its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CapabilityState {
    /// The capability.
    pub capability: Capability,
    /// On or off.
    pub state: bool,
}

/// `migrate-set-capabilities`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigrateSetCapabilities {
    /// The capabilities to set.
    pub capabilities: Vec<CapabilityState>,
}

impl MigrateSetCapabilities {
    /// Turns every capability in `on` on.
    pub fn enable(on: &[Capability]) -> MigrateSetCapabilities {
        MigrateSetCapabilities {
            capabilities: on
                .iter()
                .map(|&capability| CapabilityState {
                    capability,
                    state: true,
                })
                .collect(),
        }
    }
}

command!(MigrateSetCapabilities, "migrate-set-capabilities", Empty);

/// `migrate-set-parameters`; unset fields are left as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct MigrateSetParameters {
    /// Bytes per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bandwidth: Option<u64>,
    /// Milliseconds of allowed downtime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub downtime_limit: Option<u64>,
    /// Number of multifd channels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multifd_channels: Option<u32>,
    /// `none` or `zstd`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multifd_compression: Option<String>,
    /// Which nodes' dirty bitmaps the `dirty-bitmaps` capability sends, under which names in the
    /// stream (QEMU 5.2+). Once set, QEMU keeps a mapping until the next one replaces it: an empty
    /// list sends no bitmap at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_bitmap_mapping: Option<Vec<BitmapMigrationNodeAlias>>,
}

command!(MigrateSetParameters, "migrate-set-parameters", Empty);

/// `BitmapMigrationNodeAlias`: one node of a `block-bitmap-mapping`, named `alias` in the
/// stream (at most 255 bytes; libvirt uses the disk's target, `vda`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct BitmapMigrationNodeAlias {
    /// The block node on this side (its format node).
    pub node_name: String,
    /// The node's name in the stream.
    pub alias: String,
    /// The bitmaps of the node that migrate.
    pub bitmaps: Vec<BitmapMigrationBitmapAlias>,
}

/// `BitmapMigrationBitmapAlias`: one bitmap of a mapped node, named `alias` in the stream (at
/// most 255 bytes; libvirt's `libvirt-<dst>-<bitmap>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BitmapMigrationBitmapAlias {
    /// The bitmap on this side.
    pub name: String,
    /// The bitmap's name in the stream.
    pub alias: String,
}

/// `query-migrate-parameters`: the fields the launcher reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QueryMigrateParameters;

command!(
    QueryMigrateParameters,
    "query-migrate-parameters",
    MigrationParameters
);

/// `MigrationParameters` of `query-migrate-parameters`, the fields the launcher reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct MigrationParameters {
    /// The bitmap mapping set earlier (absent: none was ever set on this QEMU).
    #[serde(rename = "block-bitmap-mapping", default)]
    pub block_bitmap_mapping: Option<Vec<BitmapMigrationNodeAlias>>,
}

/// `migrate` to a URI (`unix:<path>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Migrate {
    /// Where QEMU connects.
    pub uri: String,
}

command!(Migrate, "migrate", Empty);

/// `migrate-incoming` on a QEMU started with `-incoming defer`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigrateIncoming {
    /// Where QEMU listens (`unix:<path>`).
    pub uri: String,
}

command!(MigrateIncoming, "migrate-incoming", Empty);

/// `migrate-continue` out of a paused migration state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigrateContinue {
    /// The state QEMU waits in (`pre-switchover`).
    pub state: String,
}

impl MigrateContinue {
    /// Continue after `pre-switchover`.
    pub fn pre_switchover() -> MigrateContinue {
        MigrateContinue {
            state: "pre-switchover".into(),
        }
    }
}

command!(MigrateContinue, "migrate-continue", Empty);

/// `migrate_cancel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MigrateCancel;

command!(MigrateCancel, "migrate_cancel", Empty);

/// `migrate-start-postcopy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MigrateStartPostcopy;

command!(MigrateStartPostcopy, "migrate-start-postcopy", Empty);

/// `query-migrate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QueryMigrate;

command!(QueryMigrate, "query-migrate", MigrationInfo);

/// `MigrationInfo`, the fields a launcher reads.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct MigrationInfo {
    /// `none`, `setup`, `active`, `pre-switchover`, `device`, `postcopy-active`, `completed`,
    /// `failed`, `cancelling`, `cancelled`, ...; absent before any migration.
    #[serde(default)]
    pub status: Option<String>,
    /// RAM statistics.
    #[serde(default)]
    pub ram: Option<RamStats>,
    /// Milliseconds since the start.
    #[serde(default)]
    pub total_time: Option<u64>,
    /// The downtime in ms, after completion.
    #[serde(default)]
    pub downtime: Option<u64>,
    /// Why it failed.
    #[serde(default)]
    pub error_desc: Option<String>,
}

/// `MigrationStats`, bytes unless noted.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RamStats {
    /// Guest RAM.
    #[serde(default)]
    pub total: u64,
    /// Sent so far.
    #[serde(default)]
    pub transferred: u64,
    /// Left to send.
    #[serde(default)]
    pub remaining: u64,
    /// Throughput in 10^6 bit/s.
    #[serde(default)]
    pub mbps: f64,
    /// Dirty pages per second.
    #[serde(default)]
    pub dirty_pages_rate: u64,
    /// RAM passes.
    #[serde(default)]
    pub dirty_sync_count: u64,
    /// Page size in bytes.
    #[serde(default)]
    pub page_size: u64,
}

/// QEMU's legacy socket address (`nbd-server-start`): `{"type":"unix","data":{"path":...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", content = "data", rename_all = "lowercase")]
pub enum SocketAddressLegacy {
    /// A unix socket.
    Unix {
        /// Its path.
        path: String,
    },
}

/// QEMU's flat socket address (`blockdev-add`): `{"type":"unix","path":...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum SocketAddress {
    /// A unix socket.
    Unix {
        /// Its path.
        path: String,
    },
    /// A connected socket handed over with `getfd` (`{"type":"fd","str":NAME}`).
    Fd {
        /// The fd's name.
        #[serde(rename = "str")]
        name: String,
    },
}

/// `nbd-server-start` (target).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NbdServerStart {
    /// Where it listens.
    pub addr: SocketAddressLegacy,
}

command!(NbdServerStart, "nbd-server-start", Empty);

/// `nbd-server-stop` (target, at Finish).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NbdServerStop;

command!(NbdServerStop, "nbd-server-stop", Empty);

/// `block-export-add` of type nbd, writable (target).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct BlockExportAddNbd {
    /// Always `nbd`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The export id.
    pub id: String,
    /// The exported node.
    pub node_name: String,
    /// The NBD export name the client asks for.
    pub name: String,
    /// The source writes into it.
    pub writable: bool,
    /// Dirty bitmaps of the node offered as NBD meta contexts `qemu:dirty-bitmap:<name>`
    /// (an incremental pull backup's); absent: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bitmaps: Option<Vec<String>>,
}

impl BlockExportAddNbd {
    /// A writable NBD export `name` of `node`, with id = name.
    pub fn writable(node: &str, name: &str) -> BlockExportAddNbd {
        BlockExportAddNbd {
            kind: "nbd",
            id: name.to_owned(),
            node_name: node.to_owned(),
            name: name.to_owned(),
            writable: true,
            bitmaps: None,
        }
    }

    /// A pull backup's read-only export (libvirt's `qemuBackupBeginPullExportDisks`): id
    /// `libvirt-nbd-<node>` ([`pull_export_id`]), name `name` (KubeVirt: the volume), the
    /// scratch node's `bitmaps` (only for an incremental pull).
    pub fn pull(node: &str, name: &str, bitmaps: Option<Vec<String>>) -> BlockExportAddNbd {
        BlockExportAddNbd {
            kind: "nbd",
            id: pull_export_id(node),
            node_name: node.to_owned(),
            name: name.to_owned(),
            writable: false,
            bitmaps,
        }
    }
}

/// libvirt's id of a pull backup's export of `node`: `libvirt-nbd-<node>`.
pub fn pull_export_id(node: &str) -> String {
    format!("libvirt-nbd-{node}")
}

/// `block-export-del`: removes an export (`mode: hard` also drops connected clients).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockExportDel {
    /// The export id.
    pub id: String,
    /// `safe` (fails while clients are connected) or `hard`; absent: `safe`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
}

command!(BlockExportDel, "block-export-del", Empty);

/// `query-block-exports`: the exports QEMU serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QueryBlockExports;

command!(
    QueryBlockExports,
    "query-block-exports",
    Vec<BlockExportInfo>
);

/// One export of `query-block-exports`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct BlockExportInfo {
    /// The export id.
    pub id: String,
    /// The exported node.
    #[serde(default)]
    pub node_name: String,
    /// Being removed (waiting for clients).
    #[serde(default)]
    pub shutting_down: bool,
}

command!(BlockExportAddNbd, "block-export-add", Empty);

/// `blockdev-add` of an NBD client node (source): the mirror's target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct BlockdevAddNbd {
    /// Always `nbd`.
    pub driver: &'static str,
    /// The new node's name.
    pub node_name: String,
    /// The NBD server.
    pub server: SocketAddress,
    /// The export name.
    pub export: String,
}

command!(BlockdevAddNbd, "blockdev-add", Empty);

/// `blockdev-del`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct BlockdevDel {
    /// The node.
    pub node_name: String,
}

command!(BlockdevDel, "blockdev-del", Empty);

/// `blockdev-mirror` with `sync: top` (the disk's top image only; the target has the same
/// backing file), as libvirt runs it for KubeVirt's non-shared incremental block migration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct BlockdevMirror {
    /// The job id (`drive-<alias>`).
    pub job_id: String,
    /// The source node.
    pub device: String,
    /// The NBD client node.
    pub target: String,
    /// `top` or `full`.
    pub sync: &'static str,
    /// Bytes per second, when limited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speed: Option<u64>,
    /// Keep the job until `block-job-cancel` (the default; stated for clarity).
    pub auto_finalize: bool,
}

command!(BlockdevMirror, "blockdev-mirror", Empty);

/// `block-job-cancel`: on a READY mirror, completes it gracefully (not `force`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockJobCancel {
    /// The job id.
    pub device: String,
    /// Abort even a READY mirror without completing it.
    pub force: bool,
}

command!(BlockJobCancel, "block-job-cancel", Empty);

/// `query-block-jobs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QueryBlockJobs;

command!(QueryBlockJobs, "query-block-jobs", Vec<BlockJobInfo>);

/// `BlockJobInfo`, the fields a launcher reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct BlockJobInfo {
    /// The job id.
    pub device: String,
    /// Bytes to copy (grows while the guest writes).
    #[serde(default)]
    pub len: u64,
    /// Bytes copied.
    #[serde(default)]
    pub offset: u64,
    /// The mirror is in sync.
    #[serde(default)]
    pub ready: bool,
    /// `running`, `ready`, `concluded`, ...
    #[serde(default)]
    pub status: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use serde_json::Value;

    #[test]
    fn commands_encode_as_qemu_spells_them() {
        let cases: Vec<(Value, Value)> = vec![
            (
                serde_json::to_value(MigrateSetCapabilities::enable(&[
                    Capability::PauseBeforeSwitchover,
                    Capability::LateBlockActivate,
                ]))
                .unwrap(),
                json!({"capabilities": [
                    {"capability": "pause-before-switchover", "state": true},
                    {"capability": "late-block-activate", "state": true}]}),
            ),
            (
                serde_json::to_value(MigrateSetParameters {
                    max_bandwidth: Some(1 << 26),
                    multifd_channels: Some(8),
                    ..Default::default()
                })
                .unwrap(),
                json!({"max-bandwidth": 67108864, "multifd-channels": 8}),
            ),
            (
                serde_json::to_value(NbdServerStart {
                    addr: SocketAddressLegacy::Unix { path: "/s".into() },
                })
                .unwrap(),
                json!({"addr": {"type": "unix", "data": {"path": "/s"}}}),
            ),
            (
                serde_json::to_value(BlockExportAddNbd::writable("n1", "drive-ua-d")).unwrap(),
                json!({"type": "nbd", "id": "drive-ua-d", "node-name": "n1",
                       "name": "drive-ua-d", "writable": true}),
            ),
            (
                serde_json::to_value(BlockdevAddNbd {
                    driver: "nbd",
                    node_name: "migration-vda-storage".into(),
                    server: SocketAddress::Unix { path: "/s".into() },
                    export: "drive-ua-d".into(),
                })
                .unwrap(),
                json!({"driver": "nbd", "node-name": "migration-vda-storage",
                       "server": {"type": "unix", "path": "/s"}, "export": "drive-ua-d"}),
            ),
            (
                serde_json::to_value(SocketAddress::Fd {
                    name: "migration-0".into(),
                })
                .unwrap(),
                json!({"type": "fd", "str": "migration-0"}),
            ),
            (
                serde_json::to_value(BlockdevMirror {
                    job_id: "drive-ua-d".into(),
                    device: "n1".into(),
                    target: "migration-vda-storage".into(),
                    sync: "top",
                    speed: None,
                    auto_finalize: true,
                })
                .unwrap(),
                json!({"job-id": "drive-ua-d", "device": "n1",
                       "target": "migration-vda-storage", "sync": "top",
                       "auto-finalize": true}),
            ),
            (
                serde_json::to_value(MigrateContinue::pre_switchover()).unwrap(),
                json!({"state": "pre-switchover"}),
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }

    #[test]
    fn query_migrate_reply_decodes() {
        let info: MigrationInfo = serde_json::from_value(json!({
            "status": "completed", "total-time": 1234, "downtime": 12,
            "ram": {"total": 134217728, "transferred": 1000, "remaining": 0,
                    "mbps": 812.5, "dirty-sync-count": 3, "page-size": 4096,
                    "duplicate": 5, "normal": 7}
        }))
        .unwrap();
        assert_eq!(info.status.as_deref(), Some("completed"));
        assert_eq!(info.ram.unwrap().dirty_sync_count, 3);
        let none: MigrationInfo = serde_json::from_value(json!({})).unwrap();
        assert_eq!(none.status, None);
    }
}
