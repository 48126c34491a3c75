//! `status`: the fields virt-controller and virt-handler fill that the launcher reads.
//!
//! Field names and JSON spelling follow KubeVirt v1.9.0 `staging/src/kubevirt.io/api/core/v1/types.go`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::domain::Machine;
use super::Quantity;

/// `status` (KubeVirt `VirtualMachineInstanceStatus`, the subset the launcher reads).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VmiStatus {
    /// Node running the VMI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Phase: `Pending`, `Scheduling`, `Scheduled`, `Running`, `Succeeded`, `Failed`, `Unknown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Reason of the phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Interfaces as reported (pod interface name, info source, IPs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interfaces: Option<Vec<InterfaceStatus>>,
    /// Per-volume state: target device name, hotplug phase, PVC info.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_status: Option<Vec<VolumeStatus>>,
    /// Uid QEMU runs as (107 for non-root launchers, 0 for root).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_user: Option<u64>,
    /// vsock context id (JSON `VSOCKCID`).
    #[serde(rename = "VSOCKCID")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vsock_cid: Option<u32>,
    /// CPU topology currently plugged.
    #[serde(rename = "currentCPUTopology")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_cpu_topology: Option<CpuTopology>,
    /// Memory at boot, current and requested.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStatus>,
    /// Scheduling hints (TSC frequency).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology_hints: Option<TopologyHints>,
    /// Migration transport: `Unix` or `Proxy`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration_transport: Option<String>,
    /// Pods running the VMI, by pod UID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_pods: Option<BTreeMap<String, String>>,
    /// Machine type actually used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
    /// Conditions virt-handler and virt-controller set (`AgentConnected`, `Paused`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<VmiCondition>>,
    /// Changed block tracking: the state virt-controller sets and the running backup (KubeVirt
    /// `ChangedBlockTrackingStatus`, v1.9.0 `types.go:2265`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed_block_tracking: Option<ChangedBlockTrackingStatus>,
}

impl VmiStatus {
    /// True when the disks must run on CBT overlays: the state is `Initializing` or `Enabled`
    /// (KubeVirt `virtwrap/storage/cbt.go` `ApplyChangedBlockTracking`).
    pub fn cbt_active(&self) -> bool {
        self.changed_block_tracking
            .as_ref()
            .is_some_and(ChangedBlockTrackingStatus::overlays_wanted)
    }
}

/// `status.changedBlockTracking` (KubeVirt `ChangedBlockTrackingStatus`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ChangedBlockTrackingStatus {
    /// `""`, `PendingRestart`, `Initializing`, `Enabled`, `Disabled` or
    /// `IncrementalBackupFeatureGateDisabled` (KubeVirt `ChangedBlockTrackingState`).
    pub state: String,
    /// The backup in progress or last finished, until virt-controller removes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backup_status: Option<BackupStatus>,
}

impl ChangedBlockTrackingStatus {
    /// `Initializing` or `Enabled`: the states in which KubeVirt's launcher makes or uses overlays.
    pub fn overlays_wanted(&self) -> bool {
        matches!(self.state.as_str(), "Initializing" | "Enabled")
    }
}

/// `status.changedBlockTracking.backupStatus` (KubeVirt `VirtualMachineInstanceBackupStatus`,
/// `types.go:2236`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BackupStatus {
    /// Name of the `VirtualMachineBackup`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub backup_name: String,
    /// RFC 3339 start time (the backup's creation timestamp).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<String>,
    /// RFC 3339 end time, once finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_timestamp: Option<String>,
    /// The backup finished (successfully or not).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub completed: bool,
    /// The backup failed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub failed: bool,
    /// Failure reason or warning (e.g. a failed thaw).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backup_msg: Option<String>,
    /// Checkpoint the backup created.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_name: Option<String>,
    /// Volumes in the backup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<BackupVolumeInfo>>,
    /// `Succeeded`, `Failed` or `Skipped` (the guest freeze).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub quiesce_status: String,
}

/// One volume of a backup (KubeVirt `backup/v1alpha1` `BackupVolumeInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BackupVolumeInfo {
    /// Volume name.
    pub volume_name: String,
    /// Domain target device (`vda`).
    pub disk_target: String,
    /// NBD data endpoint (pull mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_endpoint: Option<String>,
    /// Dirty-map endpoint (pull mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub map_endpoint: Option<String>,
}

/// One `status.conditions[]` entry (KubeVirt `VirtualMachineInstanceCondition`, the fields the
/// launcher reads).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct VmiCondition {
    /// Condition type (JSON `type`), e.g. `AgentConnected`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
}

/// One `status.interfaces[]` entry (KubeVirt `VirtualMachineInstanceNetworkInterface`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct InterfaceStatus {
    /// First IP (JSON `ipAddress`).
    #[serde(rename = "ipAddress")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// MAC address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Interface name as in the spec.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// All IPs (JSON `ipAddresses`).
    #[serde(rename = "ipAddresses")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ips: Option<Vec<String>>,
    /// Name of the pod interface backing it, e.g. `eth0` or `pod16477688c0e`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_interface_name: Option<String>,
    /// Name inside the guest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    /// Where the data came from: `domain`, `guest-agent`, `multus-status`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info_source: Option<String>,
    /// Queue count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_count: Option<i32>,
    /// `up` or `down`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_state: Option<String>,
}

/// One `status.volumeStatus[]` entry (KubeVirt `VolumeStatus`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VolumeStatus {
    /// Volume name.
    pub name: String,
    /// Target device name in the guest, e.g. `vda`, `sdb`.
    pub target: String,
    /// Hotplug phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// PVC details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_info: Option<PersistentVolumeClaimInfo>,
    /// Hotplug attachment pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hotplug_volume: Option<HotplugVolumeStatus>,
    /// Size in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    /// Memory dump details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_dump_volume: Option<MemoryDumpInfo>,
    /// Container disk details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_disk_volume: Option<ContainerDiskInfo>,
}

/// `volumeStatus.persistentVolumeClaimInfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PersistentVolumeClaimInfo {
    /// PVC name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// Access modes, e.g. `ReadWriteOnce`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_modes: Option<Vec<String>>,
    /// `Filesystem` or `Block`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<String>,
    /// Capacity by resource name (`storage`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<BTreeMap<String, Quantity>>,
    /// Requests by resource name (`storage`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<BTreeMap<String, Quantity>>,
    /// Whether the volume is preallocated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preallocated: Option<bool>,
    /// Filesystem overhead, a decimal string like `"0.055"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filesystem_overhead: Option<String>,
}

/// `volumeStatus.hotplugVolume`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HotplugVolumeStatus {
    /// Attachment pod name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attach_pod_name: Option<String>,
    /// Attachment pod UID (JSON `attachPodUID`).
    #[serde(rename = "attachPodUID")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attach_pod_uid: Option<String>,
}

/// `volumeStatus.memoryDumpVolume`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MemoryDumpInfo {
    /// Start time (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<String>,
    /// End time (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_timestamp: Option<String>,
    /// PVC name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// File name of the dump.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_file_name: Option<String>,
}

/// `volumeStatus.containerDiskVolume`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerDiskInfo {
    /// Image checksum.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checksum: Option<u32>,
}

/// `status.currentCPUTopology` (KubeVirt `CPUTopology`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CpuTopology {
    /// Cores per socket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// Sockets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sockets: Option<u32>,
    /// Threads per core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
}

/// `status.memory` (KubeVirt `MemoryStatus`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MemoryStatus {
    /// Guest memory at boot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_at_boot: Option<Quantity>,
    /// Guest memory now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_current: Option<Quantity>,
    /// Guest memory requested.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_requested: Option<Quantity>,
    /// Pod memory overhead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_overhead: Option<Quantity>,
}

/// `status.topologyHints`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TopologyHints {
    /// TSC frequency in Hz.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tsc_frequency: Option<i64>,
}

#[cfg(test)]
mod cbt_tests {
    use super::*;

    #[test]
    fn changed_block_tracking_round_trips_kubevirt_json() {
        let json = r#"{"changedBlockTracking":{"state":"Enabled","backupStatus":{"backupName":"nightly","startTimestamp":"2026-12-02T21:00:00Z","completed":true,"checkpointName":"nightly-20261202210000","volumes":[{"volumeName":"rootdisk","diskTarget":"vda"}]}}}"#;
        let st: VmiStatus = serde_json::from_str(json).unwrap();
        assert!(st.cbt_active());
        let cbt = st.changed_block_tracking.as_ref().unwrap();
        let b = cbt.backup_status.as_ref().unwrap();
        assert_eq!(b.backup_name, "nightly");
        assert!(b.completed && !b.failed);
        assert_eq!(b.volumes.as_ref().unwrap()[0].disk_target, "vda");
        let back: serde_json::Value = serde_json::to_value(&st).unwrap();
        assert_eq!(
            back,
            serde_json::from_str::<serde_json::Value>(json).unwrap()
        );
        for (state, want) in [
            ("Initializing", true),
            ("Disabled", false),
            ("", false),
            ("PendingRestart", false),
        ] {
            let c = ChangedBlockTrackingStatus {
                state: state.into(),
                backup_status: None,
            };
            assert_eq!(c.overlays_wanted(), want, "{state}");
        }
        assert!(!VmiStatus::default().cbt_active());
    }
}
