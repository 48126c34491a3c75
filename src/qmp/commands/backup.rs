//! The QMP of a push backup with changed block tracking (QEMU `qapi/block-core.json`,
//! `qapi/transaction.json`), as libvirt's `qemuBackupBegin` sends it (`qemu_backup.c`,
//! `qemuMonitorJSONTransactionBackup`, `qemuCheckpointAddActions`) for KubeVirt's
//! `BackupVirtualMachine` Start: one `transaction` that adds the new checkpoint's persistent
//! dirty bitmap on every CBT disk and starts one `blockdev-backup` job per disk.
//!
//! The checkpoint is named `<backupName>-<UTC YYYY-MM-DD_HH-MM-SS>`, lowercased
//! ([`checkpoint_name`]); the bitmap carries the checkpoint's name. An incremental backup
//! ([`incremental_push_transaction`], libvirt's `qemuBackupDiskPrepareDataOne`) adds a
//! temporary disabled bitmap `backup-<dst>` with the granularity of the checkpoint it starts
//! from, merges that checkpoint's bitmap into it and copies the clusters it marks. After the
//! jobs: `query-jobs`, `job-dismiss`, `blockdev-del` of the targets and
//! `block-dirty-bitmap-remove` of the temporary bitmaps (`qemuBlockJobProcessEventConcludedBackup`).

use serde::{Deserialize, Serialize};

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
    /// Bytes per second at most (absent: no limit, as libvirt sends it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speed: Option<u64>,
}
command!(BlockdevBackup, "blockdev-backup", Empty);

/// One source of a `block-dirty-bitmap-merge` (`BlockDirtyBitmapOrStr`, the object form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BitmapRef {
    /// The node carrying the bitmap.
    pub node: String,
    /// The bitmap's name.
    pub name: String,
}

/// `block-dirty-bitmap-merge`: ORs `bitmaps` into the bitmap `target` of `node`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockDirtyBitmapMerge {
    /// The node of the target bitmap.
    pub node: String,
    /// The target bitmap.
    pub target: String,
    /// The sources, in order.
    pub bitmaps: Vec<BitmapRef>,
}
command!(BlockDirtyBitmapMerge, "block-dirty-bitmap-merge", Empty);

/// `block-dirty-bitmap-remove`: drops the bitmap `name` of `node` (from the qcow2 too when
/// persistent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockDirtyBitmapRemove {
    /// The node.
    pub node: String,
    /// The bitmap.
    pub name: String,
}
command!(BlockDirtyBitmapRemove, "block-dirty-bitmap-remove", Empty);

/// `query-jobs`: every job QEMU keeps (running or concluded and not dismissed).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueryJobs;
command!(QueryJobs, "query-jobs", Vec<JobInfo>);

/// One job of `query-jobs` (`JobInfo`, the fields the launcher reads).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct JobInfo {
    /// The job id.
    pub id: String,
    /// `backup`, `create`, `mirror`, ...
    #[serde(rename = "type", default)]
    pub kind: String,
    /// `created`, `running`, `paused`, `ready`, `waiting`, `pending`, `aborting`,
    /// `concluded`, `null`.
    #[serde(default)]
    pub status: String,
    /// Bytes done so far.
    #[serde(rename = "current-progress", default)]
    pub current_progress: u64,
    /// Bytes to do in all (an estimate while running).
    #[serde(rename = "total-progress", default)]
    pub total_progress: u64,
    /// Set when the job failed or was cancelled (`Operation canceled`).
    #[serde(default)]
    pub error: Option<String>,
}

/// `job-dismiss`: removes a concluded job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobDismiss {
    /// The job id.
    pub id: String,
}
command!(JobDismiss, "job-dismiss", Empty);

/// One action of a `transaction`: `{"type": "<command>", "data": {<its arguments>}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", content = "data", rename_all = "kebab-case")]
pub enum TransactionAction {
    /// `block-dirty-bitmap-add`.
    BlockDirtyBitmapAdd(BlockDirtyBitmapAdd),
    /// `block-dirty-bitmap-merge`.
    BlockDirtyBitmapMerge(BlockDirtyBitmapMerge),
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

/// libvirt's job id of a disk's backup job: `backup-<dst>-<node>`.
pub fn backup_job_id(disk: &BackupDisk) -> String {
    format!("backup-{}-{}", disk.target_dev, disk.node)
}

/// libvirt's temporary bitmap of an incremental backup of disk `<dst>`: `backup-<dst>`.
pub fn temporary_bitmap(target_dev: &str) -> String {
    format!("backup-{target_dev}")
}

/// The transaction of a full push backup creating `checkpoint` (§4.2 of the fact sheet,
/// `qemuBackupBegin`): first the persistent, enabled bitmap `checkpoint` on every disk, then a
/// full `blockdev-backup` per disk, job id `backup-<dst>-<node>`, `auto-finalize` on and
/// `auto-dismiss` off.
pub fn full_push_transaction(checkpoint: &str, disks: &[BackupDisk]) -> Transaction {
    let bitmaps = disks.iter().map(|d| checkpoint_bitmap(checkpoint, d));
    let jobs = disks.iter().map(|d| backup_job(d, BackupSync::Full, None));
    Transaction {
        actions: bitmaps.chain(jobs).collect(),
    }
}

/// The since-checkpoint part of one disk of an incremental backup: the checkpoint's bitmap
/// on the disk's node and its granularity (bytes per bit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncrementalFrom {
    /// The checkpoint (and bitmap) the backup starts from.
    pub checkpoint: String,
    /// That bitmap's granularity, which the temporary bitmap takes.
    pub granularity: u32,
}

/// The transaction of an incremental push backup since `from` creating `checkpoint` (§4.3,
/// `qemuBackupBegin` with `<incremental>`), `disks[i]` starting from `from[i]`: first the
/// persistent bitmap `checkpoint` on every disk; then per disk the temporary, disabled,
/// non-persistent bitmap `backup-<dst>` with the source's granularity and the merge of the
/// source's bitmap into it; then per disk the `incremental` `blockdev-backup` of the clusters
/// `backup-<dst>` marks.
///
/// # Panics
/// Never; `from` shorter than `disks` leaves the extra disks' merge out (callers pass one per
/// disk).
pub fn incremental_push_transaction(
    checkpoint: &str,
    disks: &[BackupDisk],
    from: &[IncrementalFrom],
) -> Transaction {
    let mut actions: Vec<TransactionAction> = disks
        .iter()
        .map(|d| checkpoint_bitmap(checkpoint, d))
        .collect();
    for (d, f) in disks.iter().zip(from) {
        let scratch = temporary_bitmap(&d.target_dev);
        actions.push(TransactionAction::BlockDirtyBitmapAdd(
            BlockDirtyBitmapAdd {
                node: d.node.clone(),
                name: scratch.clone(),
                persistent: false,
                disabled: true,
                granularity: Some(f.granularity),
            },
        ));
        actions.push(TransactionAction::BlockDirtyBitmapMerge(
            BlockDirtyBitmapMerge {
                node: d.node.clone(),
                target: scratch,
                bitmaps: vec![BitmapRef {
                    node: d.node.clone(),
                    name: f.checkpoint.clone(),
                }],
            },
        ));
    }
    actions.extend(disks.iter().map(|d| {
        backup_job(
            d,
            BackupSync::Incremental,
            Some(temporary_bitmap(&d.target_dev)),
        )
    }));
    Transaction { actions }
}

/// The transaction of a pull backup creating `checkpoint` (§4.4 of the fact sheet, libvirt's
/// `qemuBackupBegin` in pull mode), each disk's `target_node` being its scratch (fleecing)
/// image's format node, backed by the disk: first the persistent bitmap `checkpoint` on every
/// disk; for an incremental pull (`from`, one per disk) per disk the temporary, disabled,
/// non-persistent bitmap named `checkpoint` on the **scratch** node (libvirt's `exportbitmap`,
/// which KubeVirt sets to the new checkpoint) with the source's granularity, and the merge of
/// the source's bitmap on the disk into it; then per disk the `sync: none` `blockdev-backup`
/// into the scratch node (QEMU puts a copy-before-write filter over the disk).
pub fn pull_transaction(
    checkpoint: &str,
    disks: &[BackupDisk],
    from: Option<&[IncrementalFrom]>,
) -> Transaction {
    let mut actions: Vec<TransactionAction> = disks
        .iter()
        .map(|d| checkpoint_bitmap(checkpoint, d))
        .collect();
    for (d, f) in disks.iter().zip(from.unwrap_or_default()) {
        actions.push(TransactionAction::BlockDirtyBitmapAdd(
            BlockDirtyBitmapAdd {
                node: d.target_node.clone(),
                name: checkpoint.to_string(),
                persistent: false,
                disabled: true,
                granularity: Some(f.granularity),
            },
        ));
        actions.push(TransactionAction::BlockDirtyBitmapMerge(
            BlockDirtyBitmapMerge {
                node: d.target_node.clone(),
                target: checkpoint.to_string(),
                bitmaps: vec![BitmapRef {
                    node: d.node.clone(),
                    name: f.checkpoint.clone(),
                }],
            },
        ));
    }
    actions.extend(disks.iter().map(|d| backup_job(d, BackupSync::None, None)));
    Transaction { actions }
}

fn checkpoint_bitmap(checkpoint: &str, d: &BackupDisk) -> TransactionAction {
    TransactionAction::BlockDirtyBitmapAdd(BlockDirtyBitmapAdd {
        node: d.node.clone(),
        name: checkpoint.to_string(),
        persistent: true,
        disabled: false,
        granularity: None,
    })
}

fn backup_job(d: &BackupDisk, sync: BackupSync, bitmap: Option<String>) -> TransactionAction {
    TransactionAction::BlockdevBackup(BlockdevBackup {
        device: d.node.clone(),
        job_id: backup_job_id(d),
        target: d.target_node.clone(),
        sync,
        bitmap,
        auto_finalize: true,
        auto_dismiss: false,
        speed: None,
    })
}

impl Transaction {
    /// Limits every `blockdev-backup` of the transaction to `speed` bytes per second.
    pub fn with_speed(mut self, speed: Option<u64>) -> Transaction {
        for action in &mut self.actions {
            if let TransactionAction::BlockdevBackup(b) = action {
                b.speed = speed;
            }
        }
        self
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
