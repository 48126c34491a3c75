//! The `<metadata><kubevirt>` block of the domain (`api.Metadata`,
//! `pkg/virt-launcher/virtwrap/api/schema.go`, v1.9.0): the VMI's UID, the grace-period
//! bookkeeping, the memory dump's progress and the migration record. Only the data lives here;
//! the rules that change them are their features' (`cmdapi/memory_dump.rs`, `migration/metadata.rs`).
//!
//! In the notify and GetDomain JSON the keys are the Go field names (the types have only XML tags);
//! timestamps are Kubernetes times (RFC 3339, whole seconds, UTC) or null.

use serde::{Deserialize, Serialize};

/// `api.Metadata`: the `<metadata><kubevirt>` block of the domain.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// KubeVirt's metadata.
    #[serde(rename = "KubeVirt", default)]
    pub kubevirt: KubeVirtMetadata,
}

/// `api.KubeVirtMetadata`, the fields qlauncher keeps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KubeVirtMetadata {
    /// The VMI's UID; virt-handler compares it with the VMI it expects.
    #[serde(rename = "UID", default)]
    pub uid: String,
    /// Grace-period bookkeeping, once a shutdown was requested.
    #[serde(
        rename = "GracePeriod",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub grace_period: Option<GracePeriodMetadata>,
    /// The memory dump's progress, once one was requested (`VirtualMachineMemoryDump`).
    #[serde(
        rename = "MemoryDump",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_dump: Option<MemoryDumpMetadata>,
    /// The migration record, once a migration of this domain was accepted
    /// (`spec.metadata.kubevirt.migration`, [`crate::sync::migration::metadata`]).
    #[serde(rename = "Migration", default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<MigrationMetadata>,
    /// The backup in progress or last run, once one was started (`BackupVirtualMachine`,
    /// [`crate::sync::backup`]).
    #[serde(rename = "Backup", default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupMetadata>,
}

/// `api.BackupMetadata` (`virtwrap/api/schema.go`, v1.9.0; Go field names, every key present,
/// nil timestamps `null`): what virt-handler copies into
/// `vmi.status.changedBlockTracking.backupStatus` when `Name` and `StartTimestamp` match the
/// backup it waits for. Changed by the rules of [`crate::sync::backup`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupMetadata {
    /// The `VirtualMachineBackup`'s name (`backupName`).
    #[serde(rename = "Name", default)]
    pub name: String,
    /// `Push` or `Pull`, as the option was sent.
    #[serde(rename = "Mode", default)]
    pub mode: String,
    /// The backup did not freeze the guest.
    #[serde(rename = "SkipQuiesce", default)]
    pub skip_quiesce: bool,
    /// `backupStartTime` as sent (RFC 3339, seconds, UTC).
    #[serde(rename = "StartTimestamp", default)]
    pub start_timestamp: Option<String>,
    /// When the jobs ended.
    #[serde(rename = "EndTimestamp", default)]
    pub end_timestamp: Option<String>,
    /// The jobs ended (successfully or not).
    #[serde(rename = "Completed", default)]
    pub completed: bool,
    /// The backup failed (or a push backup was aborted).
    #[serde(rename = "Failed", default)]
    pub failed: bool,
    /// A freeze failure while running; the failure's text once completed.
    #[serde(rename = "BackupMsg", default)]
    pub backup_msg: String,
    /// The checkpoint the backup makes, `<name>-<UTC YYYY-MM-DD_HH-MM-SS>`.
    #[serde(rename = "CheckpointName", default)]
    pub checkpoint_name: String,
    /// JSON of `[]backupv1.BackupVolumeInfo`: `[{"volumeName":..,"diskTarget":..}]`.
    #[serde(rename = "Volumes", default)]
    pub volumes: String,
    /// `Succeeded`, `Failed` or `Skipped`.
    #[serde(rename = "QuiesceStatus", default)]
    pub quiesce_status: String,
}

/// `api.GracePeriodMetadata`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GracePeriodMetadata {
    /// Seconds the guest gets to shut down before it is killed.
    #[serde(rename = "DeletionGracePeriodSeconds", default)]
    pub deletion_grace_period_seconds: i64,
    /// When the graceful shutdown was signalled (RFC 3339, UTC).
    #[serde(
        rename = "DeletionTimestamp",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub deletion_timestamp: Option<String>,
    /// Whether the VMI was marked for graceful shutdown.
    #[serde(
        rename = "MarkedForGracefulShutdown",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub marked_for_graceful_shutdown: Option<bool>,
}

/// `api.MigrationMetadata`: the migration record both launchers keep and virt-handler reads; the
/// launcher changes it by the rules of [`crate::sync::migration::metadata`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationMetadata {
    /// The migration UID (the VMIM's UID).
    #[serde(rename = "UID", default)]
    pub uid: String,
    /// When the launcher accepted the migration.
    #[serde(rename = "StartTimestamp", default)]
    pub start_timestamp: Option<String>,
    /// When it ended, successfully or not.
    #[serde(rename = "EndTimestamp", default)]
    pub end_timestamp: Option<String>,
    /// It failed.
    #[serde(rename = "Failed", default)]
    pub failed: bool,
    /// Why it failed.
    #[serde(rename = "FailureReason", default)]
    pub failure_reason: String,
    /// The state of a requested abort: `""`, `Aborting`, `Succeeded`, `Failed`.
    #[serde(rename = "AbortStatus", default)]
    pub abort_status: String,
    /// `PreCopy`, `PostCopy` or `Paused`.
    #[serde(rename = "Mode", default)]
    pub mode: String,
}

/// `api.MemoryDumpMetadata` (Go field names; nil timestamps are `null`): the progress of
/// `VirtualMachineMemoryDump` ([`crate::sync::cmdapi::memory_dump`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryDumpMetadata {
    /// Base name of the dump file.
    #[serde(rename = "FileName", default)]
    pub file_name: String,
    /// When the dump started (RFC 3339, seconds, UTC).
    #[serde(rename = "StartTimestamp", default)]
    pub start_timestamp: Option<String>,
    /// When it ended.
    #[serde(rename = "EndTimestamp", default)]
    pub end_timestamp: Option<String>,
    /// Whether it ended (successfully or not).
    #[serde(rename = "Completed", default)]
    pub completed: bool,
    /// Whether it failed.
    #[serde(rename = "Failed", default)]
    pub failed: bool,
    /// Why it failed.
    #[serde(rename = "FailureReason", default)]
    pub failure_reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_keys_are_go_field_names() {
        let m = MigrationMetadata {
            uid: "u".into(),
            start_timestamp: Some("2027-01-15T08:00:00Z".into()),
            mode: "PreCopy".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            serde_json::json!({
                "UID": "u", "StartTimestamp": "2027-01-15T08:00:00Z", "EndTimestamp": null,
                "Failed": false, "FailureReason": "", "AbortStatus": "", "Mode": "PreCopy"
            })
        );
    }
}
