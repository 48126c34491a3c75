//! The QMP of a push backup with changed block tracking (QEMU `qapi/block-core.json`,
//! `qapi/transaction.json`), as libvirt's `qemuBackupBegin` sends it (`qemu_backup.c`,
//! `qemuMonitorJSONTransactionBackup`, `qemuCheckpointAddActions`) for KubeVirt's
//! `BackupVirtualMachine` Start: one `transaction` that adds the new checkpoint's persistent
//! dirty bitmap on every CBT disk and starts one `blockdev-backup` job per disk.
//!
//! The checkpoint is named `<backupName>-<UTC YYYY-MM-DD_HH-MM-SS>`, lowercased
//! ([`checkpoint_name`]); the bitmap carries the checkpoint's name.

use serde::Serialize;

use super::Empty;

/// `block-dirty-bitmap-add`: a dirty bitmap `name` on the format node `node`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockDirtyBitmapAdd {
    /// The format node (the CBT overlay's qcow2 node).
    pub node: String,
    /// The bitmap name (a checkpoint's name, or `backup-<dst>` for an incremental's scratch).
    pub name: String,
    /// Stored in the qcow2 when QEMU closes the image (checkpoints: true).
    pub persistent: bool,
    /// Not recording writes (an incremental's merge target: true).
    pub disabled: bool,
    /// Bytes per bit; QEMU's default (the cluster size) when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub granularity: Option<u32>,
}
command!(BlockDirtyBitmapAdd, "block-dirty-bitmap-add", Empty);

/// `sync` of a `blockdev-backup` (`MirrorSyncMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackupSync {
    /// Copy the whole disk.
    Full,
    /// Copy the clusters the job's `bitmap` marks.
    Incremental,
    /// Copy nothing but the old data of clusters the guest overwrites (pull-mode fleecing).
    None,
}

/// `blockdev-backup`: a job copying `device` into the node `target`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct BlockdevBackup {
    /// The disk's format node.
    pub device: String,
    /// libvirt's `backup-<dst>-<node>` (`vda`, the format node).
    pub job_id: String,
    /// The target's format node.
    pub target: String,
    /// What is copied.
    pub sync: BackupSync,
    /// The bitmap of an incremental backup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bitmap: Option<String>,
    /// libvirt: true.
    pub auto_finalize: bool,
    /// libvirt: false, so the concluded job stays for `query-jobs` and `job-dismiss`.
    pub auto_dismiss: bool,
}
command!(BlockdevBackup, "blockdev-backup", Empty);

/// One action of a `transaction`: `{"type": "<command>", "data": {<its arguments>}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", content = "data", rename_all = "kebab-case")]
pub enum TransactionAction {
    /// `block-dirty-bitmap-add`.
    BlockDirtyBitmapAdd(BlockDirtyBitmapAdd),
    /// `blockdev-backup`.
    BlockdevBackup(BlockdevBackup),
}

/// `transaction`: the actions run all or none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transaction {
    /// In order.
    pub actions: Vec<TransactionAction>,
}
command!(Transaction, "transaction", Empty);

/// One disk of a push backup: the guest target, the CBT overlay's format node and the node of
/// the target image (already created and added).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupDisk {
    /// Guest device name (`vda`), in the job id.
    pub target_dev: String,
    /// The disk's format node (the CBT overlay).
    pub node: String,
    /// The target image's format node.
    pub target_node: String,
}

/// The transaction of a full push backup creating `checkpoint` (§4.2 of the fact sheet,
/// `qemuBackupBegin`): first the persistent, enabled bitmap `checkpoint` on every disk, then a
/// full `blockdev-backup` per disk, job id `backup-<dst>-<node>`, `auto-finalize` on and
/// `auto-dismiss` off.
pub fn full_push_transaction(checkpoint: &str, disks: &[BackupDisk]) -> Transaction {
    let bitmaps = disks.iter().map(|d| {
        TransactionAction::BlockDirtyBitmapAdd(BlockDirtyBitmapAdd {
            node: d.node.clone(),
            name: checkpoint.to_string(),
            persistent: true,
            disabled: false,
            granularity: None,
        })
    });
    let jobs = disks.iter().map(|d| {
        TransactionAction::BlockdevBackup(BlockdevBackup {
            device: d.node.clone(),
            job_id: format!("backup-{}-{}", d.target_dev, d.node),
            target: d.target_node.clone(),
            sync: BackupSync::Full,
            bitmap: None,
            auto_finalize: true,
            auto_dismiss: false,
        })
    });
    Transaction {
        actions: bitmaps.chain(jobs).collect(),
    }
}

/// Why a checkpoint name cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointNameError {
    /// `backupStartTime` is not an RFC 3339 UTC time (`metav1.Time` is always `...Z`).
    #[error("backup start time {0:?} is not an RFC 3339 UTC time")]
    StartTime(String),
    /// The backup name is empty or holds a character a bitmap name must not (`/`, NUL,
    /// whitespace), or the name is over QEMU's 1023 bytes.
    #[error("backup name {0:?} cannot name a checkpoint")]
    Name(String),
}

/// KubeVirt's checkpoint (and bitmap) name: `<backup_name>-<start in UTC as
/// YYYY-MM-DD_HH-MM-SS>`, lowercased (`pkg/virt-launcher/virtwrap/storage/backup.go`); `start`
/// is `backupStartTime` as sent (RFC 3339, second precision, `Z`).
///
/// # Errors
/// [`CheckpointNameError`] for a start time that is not RFC 3339 UTC or a name unfit for a
/// bitmap.
pub fn checkpoint_name(backup_name: &str, start: &str) -> Result<String, CheckpointNameError> {
    let time = humantime::parse_rfc3339(start)
        .map_err(|_| CheckpointNameError::StartTime(start.to_string()))?;
    let stamp = humantime::format_rfc3339_seconds(time).to_string();
    // "2026-01-02T03:04:05Z" -> "2026-01-02_03-04-05".
    let stamp = stamp
        .trim_end_matches('Z')
        .replace('T', "_")
        .replace(':', "-");
    if backup_name.is_empty()
        || backup_name
            .chars()
            .any(|c| c == '/' || c == '\0' || c.is_whitespace())
        || backup_name.len() + 1 + stamp.len() > 1023
    {
        return Err(CheckpointNameError::Name(backup_name.to_string()));
    }
    Ok(format!("{backup_name}-{stamp}").to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qmp::commands::Command;
    use serde_json::json;

    #[test]
    fn checkpoint_names_are_kubevirts() {
        assert_eq!(
            checkpoint_name("Nightly-B1", "2026-01-02T03:04:05Z").unwrap(),
            "nightly-b1-2026-01-02_03-04-05"
        );
        for bad in ["2026-01-02 03:04:05", "2026-01-02T03:04:05+02:00", "", "x"] {
            assert!(matches!(
                checkpoint_name("b", bad),
                Err(CheckpointNameError::StartTime(_))
            ));
        }
        for bad in ["", "a/b", "a b", "a\0b"] {
            assert!(matches!(
                checkpoint_name(bad, "2026-01-02T03:04:05Z"),
                Err(CheckpointNameError::Name(_))
            ));
        }
    }

    #[test]
    fn actions_serialize_as_qemus_transaction_members() {
        let t = full_push_transaction(
            "c",
            &[BackupDisk {
                target_dev: "vda".into(),
                node: "libvirt-1-format".into(),
                target_node: "t-format".into(),
            }],
        );
        assert_eq!(t.name(), "transaction");
        assert_eq!(
            t.arguments().unwrap().unwrap(),
            json!({"actions": [
                {"type": "block-dirty-bitmap-add", "data": {"node": "libvirt-1-format",
                    "name": "c", "persistent": true, "disabled": false}},
                {"type": "blockdev-backup", "data": {"device": "libvirt-1-format",
                    "job-id": "backup-vda-libvirt-1-format", "target": "t-format",
                    "sync": "full", "auto-finalize": true, "auto-dismiss": false}}
            ]})
        );
    }
}
