//! `BackupVirtualMachine` (push mode, full and incremental, Start and Abort) and
//! `RedefineCheckpoint` without libvirt: what KubeVirt's launcher does
//! (`pkg/virt-launcher/virtwrap/storage/backup.go`, `cmd-server/server.go`, v1.9.0) over the QMP
//! libvirt's `virDomainBackupBegin` and `virDomainCheckpointCreateXML(REDEFINE)` send
//! (`qemu_backup.c`, `qemu_checkpoint.c`, `qemu_blockjob.c`).
//!
//! Start, in order: the VMI's CBT state must be `Enabled`; the options decode ([`options`]);
//! no migration runs; de-duplication by (name, start time) against the backup metadata (the
//! same backup running: success, nothing done; finished: KubeVirt's "already executed";
//! another unfinished: "already in progress"); the metadata `{Name, StartTimestamp,
//! SkipQuiesce, Mode}` with a domain event. Then: every domain disk with a target and a CBT
//! overlay (`Source.DataStore`) is backed up, the others are not; its qcow2 node is the one
//! `query-named-block-nodes` shows over the overlay (`Source.File`); an incremental backup
//! needs the checkpoint in this launcher's registry (made by an earlier Start or by
//! `RedefineCheckpoint`; else libvirt's `Domain checkpoint not found: ...`) and a usable
//! bitmap of it on every disk (else `checkpoint inconsistent: missing or broken bitmap ...`),
//! never a silent full backup. The metadata gets `CheckpointName` and `Volumes` (event); the
//! directory `<targetPath>/<vmi>/<checkpoint>` and one qcow2 target per disk
//! `<backupName>-<volume>.qcow2` are made (an incremental target backed by the overlay) and
//! added as `libvirt-<N>-storage`/`-format` nodes; unless `skipQuiesce` the guest is frozen
//! through its agent (a failure: `QuiesceStatus=Failed`, `BackupMsg=<error>`, and the backup
//! goes on, as KubeVirt's); one `transaction` ([`crate::qmp::commands::full_push_transaction`],
//! [`crate::qmp::commands::incremental_push_transaction`]); the guest is thawed; the
//! checkpoint is registered. The answer comes well within virt-handler's 20 s (the freeze has
//! [`FREEZE_BUDGET`]). Any failure after the metadata was set clears it to `{}` (event),
//! removes what was added and the directory, as KubeVirt's launcher lets a retry start fresh.
//!
//! Completion (a task per backup): each job's `JOB_STATUS_CHANGE` to `concluded`, then
//! `query-jobs` (its `error`), `job-dismiss`, `blockdev-del` of the target's nodes and
//! `block-dirty-bitmap-remove` of the temporary bitmap. A failed job cancels the others. When
//! all are done, a push backup that did not complete has its targets deleted (libvirt), and the
//! metadata gets `Completed`, `Failed`, `BackupMsg` and `EndTimestamp` by KubeVirt's
//! `HandleBackupJobCompletedEvent` rules: success; aborted (push): failed, `backup aborted:
//! Operation canceled`; failed: the first job's error, or `unknown failure reason`.
//!
//! Abort: KubeVirt's eligibility checks (`failed to abort backup: could not find ongoing
//! backup`, ...), a running backup job (else `cannot abort backup, wrong operation or type: 0,
//! 0`, libvirt's numbers for no job), then `block-job-cancel {force: true}` for each job still
//! running (libvirt's `qemuBackupJobCancelBlockjobs`); completion follows as above.
//!
//! RedefineCheckpoint: a disk with a target, a data store and an overlay qualifies when a node
//! over its overlay has a bitmap of the checkpoint's name that is not `inconsistent` (KubeVirt's
//! check, PR #17993); none → `checkpointInvalid`, `no disks found with checkpoint bitmap
//! <name>`; a qualifying bitmap that is not persistent or not recording fails libvirt's
//! `REDEFINE_VALIDATE` (invalid too). The checkpoint is then registered for later incremental
//! backups. Nothing in QEMU changes, and nothing ever deletes a checkpoint (KubeVirt's
//! behaviour: the bitmaps stay in the overlays).
//!
//! Bitmaps pile up (one per Start and disk, for good; no cap and no merge here, as any one may
//! be a tracker's latest checkpoint), so the work here is bounded by one
//! `query-named-block-nodes` per Start and per RedefineCheckpoint, whatever their number (with
//! 1,000 bitmaps on QEMU 7.2 its reply is ~180 KB and takes tens of ms; `tests/sync_backup_many.rs`,
//! `scripts/bench-backup`).
//!
//! Pull (`mode: Pull`, [`pull`]): the same Start, but each disk gets a qcow2 scratch image
//! backed by the disk (at the push target's path) instead of a target, the NBD server on
//! KubeVirt's socket, the `sync: none` transaction and one read-only export per disk. The jobs
//! run until Abort; then the exports and the server stop, the scratch nodes and files go, and
//! a cancelled pull counts as success with no message (libvirt reports COMPLETED, KubeVirt
//! hides `Operation canceled`). `Export` checks the backup (KubeVirt's eligibility) and serves
//! the pull's exports ([`pull::export_names`]) on KubeVirt's socket to the export server
//! through [`tunnel`], which alone checks that the socket is there.

pub mod options;
pub mod pull;
pub mod tunnel;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, SystemTime};

use tracing::{info, warn};

use crate::cmdline::qemu::{
    BackingNode, Blockdev, BlockdevDel, BlockdevFormat, BlockdevProtocol, FormatDriver,
    ProtocolDriver,
};
use crate::qmp::client::{EventStream, QmpClient};
use crate::qmp::commands::{
    backup_job_id, full_push_transaction, incremental_push_transaction, pull_transaction,
    temporary_bitmap, BackupDisk, BlockDirtyBitmapRemove, BlockdevAdd, IncrementalFrom, JobDismiss,
    NamedBlockNode, QueryJobs, QueryNamedBlockNodes,
};
use crate::qmp::migration::{pull_export_id, BlockJobCancel};
use crate::qmp::QmpError;
use crate::storage::{self, BackupTargetSpec};
use crate::sync::ctx::DomainCtx;
use crate::sync::domain::{ApiDomain, BackupMetadata};
use crate::sync::error::SyncError;
use crate::sync::state::Running;
use crate::vmi::{BackupVolumeInfo, Vmi};
use options::{BackupCmd, StartRequest};

/// KubeVirt's `ChangedBlockTrackingNotEnabledMsg`.
pub const CBT_NOT_ENABLED: &str = "Backup failed ChangedBlockTracking is not enabled";
/// The RedefineCheckpoint refusal when CBT is not enabled (KubeVirt's text).
pub const REDEFINE_CBT_NOT_ENABLED: &str =
    "Redefine checkpoint failed: ChangedBlockTracking is not enabled";
/// KubeVirt's refusal of a backup during a migration.
pub const BACKUP_DURING_MIGRATION: &str = "failed to do backup, VMI is currently during migration";
/// How long the guest's freeze may take before the backup goes on unquiesced (the Start must
/// answer within virt-handler's 20 s).
pub const FREEZE_BUDGET: Duration = Duration::from_secs(10);
/// How long a Start waits for the sync lock (to number the target nodes).
const LOCK_BUDGET: Duration = Duration::from_secs(5);
/// How long one QMP command of a backup may take.
const QMP_TIMEOUT: Duration = Duration::from_secs(10);
/// libvirt's `errmsg` of a cancelled job.
pub const OPERATION_CANCELED: &str = "Operation canceled";

/// A checkpoint this launcher knows (libvirt's checkpoint list): made by a Start or
/// registered by RedefineCheckpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// `<backupName>-<UTC YYYY-MM-DD_HH-MM-SS>`.
    pub name: String,
    /// The backup's start time, when known.
    pub creation_time: Option<String>,
    /// The guest devices whose bitmap it is (`vda`).
    pub disks: Vec<String>,
}

/// The backup state of one domain: the metadata (KubeVirt's metadata cache), the running
/// backup and the checkpoints.
#[derive(Debug, Default)]
pub struct Backups {
    state: StdMutex<State>,
    /// The pull backup's tunnel to the export server (`Export`), at most one.
    tunnel: tunnel::TunnelSlot,
}

#[derive(Debug, Default)]
struct State {
    metadata: Option<BackupMetadata>,
    active: Option<Active>,
    checkpoints: BTreeMap<String, Checkpoint>,
}

#[derive(Debug)]
struct Active {
    /// Jobs not concluded yet.
    running: Vec<String>,
    /// Abort was requested.
    abort: bool,
    /// A pull backup's NBD serving.
    pull: Option<pull::PullTarget>,
}

impl Backups {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The checkpoints known, by name.
    pub fn checkpoints(&self) -> BTreeMap<String, Checkpoint> {
        self.lock().checkpoints.clone()
    }

    /// The backup metadata, once a backup was started.
    pub fn metadata(&self) -> Option<BackupMetadata> {
        self.lock().metadata.clone()
    }
}

/// One disk being backed up.
#[derive(Debug, Clone)]
struct DiskJob {
    volume: String,
    disk: BackupDisk,
    target_storage: String,
    target_path: PathBuf,
    temporary_bitmap: Option<String>,
}

/// A disk of the domain with a CBT overlay.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CbtDisk {
    volume: String,
    target_dev: String,
    overlay: String,
}

/// The domain's disks with a target device and a CBT overlay (`Source.DataStore` and
/// `Source.File`), in domain order (KubeVirt's `generateDomainBackup` selection; the volume
/// is the alias, `converter.GetVolumeNameByDisk`).
fn cbt_disks(domain: &ApiDomain) -> Vec<CbtDisk> {
    domain
        .spec
        .devices
        .disks
        .iter()
        .filter(|d| !d.target.device.is_empty())
        .filter(|d| d.source.rest.get("DataStore").is_some_and(|v| !v.is_null()))
        .filter(|d| !d.source.file.is_empty())
        .map(|d| CbtDisk {
            volume: d.alias.as_ref().map(|a| a.name.clone()).unwrap_or_default(),
            target_dev: d.target.device.clone(),
            overlay: d.source.file.clone(),
        })
        .collect()
}

fn cbt_enabled(vmi: &Vmi) -> bool {
    vmi.status
        .as_ref()
        .and_then(|s| s.changed_block_tracking.as_ref())
        .is_some_and(|c| c.state == "Enabled")
}

/// An RFC 3339 UTC time as Go's `time.Time.String` prints it (`2026-01-02 03:04:05 +0000
/// UTC`), the form KubeVirt's messages carry.
fn go_time(rfc3339: &str) -> String {
    match rfc3339.strip_suffix('Z') {
        Some(t) => format!("{} +0000 UTC", t.replacen('T', " ", 1)),
        None => rfc3339.to_string(),
    }
}

fn now() -> String {
    crate::sync::domain::kubernetes_time(SystemTime::now())
}

/// Changes the metadata with `f`, puts it in the domain and sends the domain event (KubeVirt's
/// metadata cache notifies on every change).
fn set_metadata(d: &DomainCtx, backups: &Backups, f: impl FnOnce(&mut BackupMetadata)) {
    let m = {
        let mut s = backups.lock();
        let m = s.metadata.get_or_insert_with(BackupMetadata::default);
        f(m);
        m.clone()
    };
    d.shared
        .modify(|domain| domain.spec.metadata.kubevirt.backup = Some(m));
}

fn refused(message: impl Into<String>) -> SyncError {
    SyncError::Refused(message.into())
}

/// `BackupVirtualMachine`: KubeVirt's command server checks, then Start, Abort or Export.
///
/// # Errors
/// [`SyncError::Refused`] with KubeVirt's (or libvirt's) text; QMP and storage errors of a
/// Start that could not begin.
pub(crate) async fn backup_command(
    d: &Arc<DomainCtx>,
    running: &Arc<tokio::sync::Mutex<Option<Running>>>,
    vmi: &Vmi,
    options: &[u8],
) -> Result<(), SyncError> {
    if !cbt_enabled(vmi) {
        return Err(refused(CBT_NOT_ENABLED));
    }
    let (options, cmd) = options::decode_options(options).map_err(refused)?;
    match cmd {
        BackupCmd::Start => {
            if d.domain().is_some_and(|domain| {
                crate::sync::cmdapi::freeze::migration_in_progress(
                    domain.spec.metadata.kubevirt.migration.as_ref(),
                )
            }) {
                return Err(refused(BACKUP_DURING_MIGRATION));
            }
            let hotplug_root = PathBuf::from(&d.config.paths.hotplug_disks);
            let request = StartRequest::check(&options, &hotplug_root).map_err(refused)?;
            start(d, running, vmi, request).await
        }
        BackupCmd::Abort => {
            let aborted = abort(d, &options).await;
            d.backups.tunnel.stop();
            aborted
        }
        BackupCmd::Export => {
            eligible(&d.backups.lock().metadata, &options).map_err(refused)?;
            let socket = &d.config.backup_nbd_socket;
            let exports = pull::export_names(d);
            info!(socket = %socket.display(), exports = exports.len(), "backup export requested");
            let tunnel = tunnel::TunnelOptions {
                export_server_addr: options.export_server_addr.clone().unwrap_or_default(),
                export_server_name: options.export_server_name.clone().unwrap_or_default(),
                ca_cert: options.ca_cert.clone().unwrap_or_default(),
                backup_cert: options.backup_cert.clone().unwrap_or_default(),
                backup_key: options.backup_key.clone().unwrap_or_default(),
                backup_name: options.backup_name.clone(),
                backup_start_time: options.backup_start_time.clone().unwrap_or_default(),
            };
            // KubeVirt's Export: a repeated Export of the same backup is a no-op; the tunnel
            // ends when the pull's socket goes (Abort, QEMU's exit) or on Abort below.
            d.backups
                .tunnel
                .export(tunnel, socket, exports)
                .map_err(refused)
        }
    }
}

/// KubeVirt's `checkBackupEligibility` for Abort and Export.
fn eligible(
    metadata: &Option<BackupMetadata>,
    options: &options::BackupOptions,
) -> Result<(), String> {
    let Some(m) = metadata.as_ref().filter(|m| !m.name.is_empty()) else {
        return Err("could not find ongoing backup".into());
    };
    let Some(started) = m.start_timestamp.as_deref() else {
        return Err("backup did not start yet".into());
    };
    let same_time = match (
        humantime::parse_rfc3339(started),
        options
            .backup_start_time
            .as_deref()
            .map(humantime::parse_rfc3339),
    ) {
        (Ok(a), Some(Ok(b))) => a == b,
        _ => false,
    };
    if m.name != options.backup_name || !same_time {
        return Err("requested backup differs from ongoing one".into());
    }
    if m.completed {
        return Err("backup already completed".into());
    }
    Ok(())
}

/// KubeVirt's `initializeBackupMetadata`: `Ok(true)` when this very backup is running already.
fn initialize_metadata(d: &DomainCtx, request: &StartRequest) -> Result<bool, SyncError> {
    let m = {
        let mut s = d.backups.lock();
        if let Some(m) = s.metadata.as_ref().filter(|m| !m.name.is_empty()) {
            let same = m.name == request.name
                && m.start_timestamp
                    .as_deref()
                    .and_then(|t| humantime::parse_rfc3339(t).ok())
                    == Some(request.start);
            match (&m.end_timestamp, same) {
                (None, true) => return Ok(true),
                (Some(end), true) => {
                    return Err(refused(format!(
                    "backup {} that started at {} already executed, finished at {}, completed: {}",
                    request.name,
                    go_time(m.start_timestamp.as_deref().unwrap_or_default()),
                    go_time(end),
                    m.completed
                )))
                }
                (None, false) => {
                    return Err(refused(format!(
                        "backup {} already in progress, need to wait for completion",
                        m.name
                    )))
                }
                (Some(_), false) => {}
            }
        }
        if s.active.is_some() {
            return Err(refused(
                "Requested operation is not valid: another backup job is already running",
            ));
        }
        let m = BackupMetadata {
            name: request.name.clone(),
            start_timestamp: Some(request.start_timestamp.clone()),
            skip_quiesce: request.skip_quiesce,
            mode: request.mode.clone(),
            ..BackupMetadata::default()
        };
        s.metadata = Some(m.clone());
        m
    };
    d.shared
        .modify(|domain| domain.spec.metadata.kubevirt.backup = Some(m));
    Ok(false)
}

/// The Start of a push backup (see the module doc).
async fn start(
    d: &Arc<DomainCtx>,
    running: &Arc<tokio::sync::Mutex<Option<Running>>>,
    vmi: &Vmi,
    request: StartRequest,
) -> Result<(), SyncError> {
    if initialize_metadata(d, &request)? {
        info!(backup = %request.name, "backup already in progress");
        return Ok(());
    }
    let dir = storage::backup_target::backup_dir(
        &request.target_path,
        vmi.metadata.name.as_deref().unwrap_or_default(),
        &request.checkpoint,
    );
    let mut made_dir = false;
    let result = begin(d, running, vmi, &request, &dir, &mut made_dir).await;
    if let Err(e) = &result {
        warn!(backup = %request.name, error = %e, "backup failed to start");
        {
            let mut s = d.backups.lock();
            s.metadata = Some(BackupMetadata::default());
        }
        d.shared.modify(|domain| {
            domain.spec.metadata.kubevirt.backup = Some(BackupMetadata::default())
        });
        if made_dir {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                warn!(dir = %dir.display(), error = %e, "cannot remove the backup directory");
            }
        }
    } else {
        info!(backup = %request.name, checkpoint = %request.checkpoint, "backup started");
    }
    result
}

/// The node over `overlay`: the qcow2 node whose file is the overlay.
fn node_of<'a>(nodes: &'a [NamedBlockNode], overlay: &str) -> Option<&'a NamedBlockNode> {
    nodes.iter().find(|n| n.drv == "qcow2" && n.file == overlay)
}

async fn begin(
    d: &Arc<DomainCtx>,
    running: &Arc<tokio::sync::Mutex<Option<Running>>>,
    vmi: &Vmi,
    request: &StartRequest,
    dir: &Path,
    made_dir: &mut bool,
) -> Result<(), SyncError> {
    let client = d.client()?;
    let domain = d.domain().ok_or(SyncError::NoDomain)?;
    if !options::is_path_component(vmi.metadata.name.as_deref().unwrap_or_default()) {
        return Err(refused(format!(
            "invalid backup options: the VMI name {:?} cannot name a directory",
            vmi.metadata.name
        )));
    }
    let disks = cbt_disks(&domain);
    if disks.is_empty() {
        return Err(refused("invalid argument: no disks selected for backup"));
    }
    for disk in &disks {
        let file = format!("{}-{}.qcow2", request.name, disk.volume);
        if !options::is_path_component(&disk.volume) || file.len() > options::NAME_MAX {
            return Err(refused(format!(
                "invalid backup options: backupName: {:?} with volume {:?} makes a target file name over {} bytes",
                request.name, disk.volume, options::NAME_MAX
            )));
        }
    }
    let nodes = client
        .run_timeout(&QueryNamedBlockNodes, QMP_TIMEOUT)
        .await
        .map_err(SyncError::Qmp)?;
    let mut found = Vec::new();
    for disk in &disks {
        let node = node_of(&nodes, &disk.overlay).ok_or_else(|| {
            refused(format!(
                "no block node of disk '{}' over {}",
                disk.target_dev, disk.overlay
            ))
        })?;
        found.push(node.clone());
    }
    let from = match &request.incremental {
        None => None,
        Some(p) => Some(incremental_sources(d, p, &disks, &found)?),
    };
    if from.is_some() {
        // A temporary bitmap an earlier backup could not remove (its QMP failed) would make the
        // transaction fail on every later incremental backup: drop it (no backup runs now).
        for (disk, node) in disks.iter().zip(&found) {
            let name = temporary_bitmap(&disk.target_dev);
            if node.dirty_bitmaps.iter().any(|b| b.name == name && !b.busy) {
                let remove = BlockDirtyBitmapRemove {
                    node: node.node_name.clone(),
                    name: name.clone(),
                };
                if let Err(e) = client.run_timeout(&remove, QMP_TIMEOUT).await {
                    warn!(bitmap = %name, error = %e, "cannot remove a stale temporary bitmap");
                }
            }
        }
    }

    // The metadata the backup shows while it runs.
    let volumes: Vec<BackupVolumeInfo> = disks
        .iter()
        .map(|disk| BackupVolumeInfo {
            volume_name: disk.volume.clone(),
            disk_target: disk.target_dev.clone(),
            ..BackupVolumeInfo::default()
        })
        .collect();
    let volumes = serde_json::to_string(&volumes).unwrap_or_default();
    set_metadata(d, &d.backups, |m| {
        m.checkpoint_name = request.checkpoint.clone();
        m.volumes = volumes;
    });

    // Targets.
    std::fs::create_dir_all(dir).map_err(|source| {
        SyncError::CmdApi(crate::sync::cmdapi::CmdApiError::Io {
            what: format!("error creating dir for backup {}", dir.display()),
            source,
        })
    })?;
    *made_dir = true;
    let first_index = {
        // The sync lock (a hotplug may hold it for long): the Start must answer within 20 s,
        // and virt-controller retries a refused one.
        let mut r = tokio::time::timeout(LOCK_BUDGET, running.lock())
            .await
            .map_err(|_| refused("the domain is being changed by a sync, retry the backup"))?;
        let r = r.as_mut().ok_or(SyncError::NoDomain)?;
        let first = r.next_node;
        r.next_node += u32::try_from(disks.len()).unwrap_or(u32::MAX);
        first
    };
    let owner = (d.config.runtime_uid != 0).then_some(storage::Owner::QEMU);
    let is_pull = request.mode == "Pull";
    // A pull's scratch image and an incremental push target read the disk's clusters.
    let backed = is_pull || from.is_some();
    let mut jobs: Vec<DiskJob> = Vec::new();
    let mut added: Vec<String> = Vec::new();
    let prepared = async {
        for (i, (disk, node)) in disks.iter().zip(&found).enumerate() {
            let n = first_index + u32::try_from(i).unwrap_or(0);
            let target_path =
                storage::backup_target::backup_target_path(dir, &request.name, &disk.volume);
            let size = node.image.as_ref().map_or(0, |i| i.virtual_size);
            storage::create_backup_target(&BackupTargetSpec {
                volume: disk.volume.clone(),
                disk: disk.target_dev.clone(),
                path: target_path.clone(),
                size,
                backing: backed.then(|| PathBuf::from(&disk.overlay)),
                owner,
            })
            .map_err(SyncError::Storage)?;
            let job = DiskJob {
                volume: disk.volume.clone(),
                disk: BackupDisk {
                    target_dev: disk.target_dev.clone(),
                    node: node.node_name.clone(),
                    target_node: format!("libvirt-{n}-format"),
                },
                target_storage: format!("libvirt-{n}-storage"),
                target_path: target_path.clone(),
                // A pull's temporary bitmap is on the scratch node and goes with it.
                temporary_bitmap: (from.is_some() && !is_pull)
                    .then(|| temporary_bitmap(&disk.target_dev)),
            };
            jobs.push(job.clone());
            let protocol = Blockdev::Protocol(BlockdevProtocol {
                driver: ProtocolDriver::File,
                filename: target_path.to_string_lossy().into_owned(),
                node_name: job.target_storage.clone(),
                aio: None,
                cache: None,
                auto_read_only: true,
                discard: Some("unmap"),
            });
            client
                .run_timeout(&BlockdevAdd(&protocol), QMP_TIMEOUT)
                .await
                .map_err(SyncError::Qmp)?;
            added.push(job.target_storage.clone());
            let format = target_format(
                &job.disk.target_node,
                &job.target_storage,
                backed.then_some(node.node_name.as_str()),
                !is_pull,
            );
            client
                .run_timeout(&BlockdevAdd(&format), QMP_TIMEOUT)
                .await
                .map_err(SyncError::Qmp)?;
            added.push(job.disk.target_node.clone());
        }
        if is_pull {
            pull::start_server(&client, &d.config.backup_nbd_socket).await?;
        }
        Ok::<(), SyncError>(())
    }
    .await;
    let socket = d.config.backup_nbd_socket.clone();
    let undo = |jobs: Vec<DiskJob>, added: Vec<String>| {
        let client = client.clone();
        let socket = socket.clone();
        async move {
            if is_pull {
                pull::stop_server(&client, &[], &socket).await;
            }
            for node in added.iter().rev() {
                delete_node(&client, node).await;
            }
            for job in &jobs {
                let _ = std::fs::remove_file(&job.target_path);
            }
        }
    };
    if let Err(e) = prepared {
        undo(jobs, added).await;
        return Err(e);
    }

    // Freeze, one transaction, thaw.
    if request.skip_quiesce {
        set_metadata(d, &d.backups, |m| m.quiesce_status = "Skipped".into());
    } else {
        let frozen = tokio::time::timeout(
            FREEZE_BUDGET,
            crate::sync::cmdapi::manager::freeze(d, Duration::ZERO),
        )
        .await
        .unwrap_or_else(|_| {
            Err(refused(format!(
                "guest-fsfreeze-freeze did not answer within {FREEZE_BUDGET:?}"
            )))
        });
        match frozen {
            Ok(()) => set_metadata(d, &d.backups, |m| m.quiesce_status = "Succeeded".into()),
            Err(e) => {
                let message = crate::sys::error::error_chain(&e);
                warn!(error = %message, "Failed freezing guest filesystem");
                set_metadata(d, &d.backups, |m| {
                    m.quiesce_status = "Failed".into();
                    m.backup_msg = message;
                });
            }
        }
    }
    let events = client.events();
    let disks_of_jobs: Vec<BackupDisk> = jobs.iter().map(|j| j.disk.clone()).collect();
    let transaction = match (&from, is_pull) {
        (from, true) => pull_transaction(&request.checkpoint, &disks_of_jobs, from.as_deref()),
        (None, false) => full_push_transaction(&request.checkpoint, &disks_of_jobs),
        (Some(from), false) => {
            incremental_push_transaction(&request.checkpoint, &disks_of_jobs, from)
        }
    }
    .with_speed(d.config.backup_speed);
    let started = client.run_timeout(&transaction, QMP_TIMEOUT).await;
    if !request.skip_quiesce {
        if let Err(e) = crate::sync::cmdapi::manager::unfreeze(d).await {
            warn!(error = %e, "Failed to unfreeze filesystem after backup completion");
        }
    }
    if let Err(e) = started {
        undo(jobs, added).await;
        return Err(SyncError::Qmp(e));
    }
    let pull_target = is_pull.then(|| pull::PullTarget {
        backup_name: request.name.clone(),
        start_timestamp: request.start_timestamp.clone(),
        socket: d.config.backup_nbd_socket.clone(),
        exports: jobs
            .iter()
            .map(|j| pull::PullExport {
                name: j.volume.clone(),
                node: j.disk.target_node.clone(),
                id: pull_export_id(&j.disk.target_node),
                bitmap: from.as_ref().map(|_| request.checkpoint.clone()),
            })
            .collect(),
    });
    {
        let mut s = d.backups.lock();
        s.checkpoints.insert(
            request.checkpoint.clone(),
            Checkpoint {
                name: request.checkpoint.clone(),
                creation_time: Some(request.start_timestamp.clone()),
                disks: disks.iter().map(|d| d.target_dev.clone()).collect(),
            },
        );
        s.active = Some(Active {
            running: jobs.iter().map(|j| backup_job_id(&j.disk)).collect(),
            abort: false,
            pull: pull_target.clone(),
        });
    }
    if let Some(target) = &pull_target {
        if let Err(e) = pull::add_exports(&client, &target.exports).await {
            // The jobs run: cancel them and clean up as at their end (the checkpoint stays,
            // as libvirt's); the Start fails.
            warn!(error = %e, "block-export-add of a pull backup failed");
            let ids: Vec<String> = jobs.iter().map(|j| backup_job_id(&j.disk)).collect();
            cancel_jobs(&client, &ids).await;
            complete(d.clone(), client, events, jobs).await;
            return Err(e);
        }
    }
    let d = d.clone();
    tokio::spawn(async move { complete(d, client, events, jobs).await });
    Ok(())
}

/// The qcow2 format node `node` over the protocol node `storage` of a backup target (`push`)
/// or a pull's scratch image: libvirt's `{"driver":"qcow2","node-name":..,"file":..,
/// "backing":null | "<disk's node>"}` (fact sheet §4.2, §4.3), with `discard: unmap`.
///
/// Deviation from libvirt 11 (whose backup target gets no `detect-zeroes`, as KubeVirt's
/// `<domainbackup>` has no `<driver>`): a push target also gets `detect-zeroes: unmap`. A CBT
/// disk's qcow2 overlay with `data-file-raw` reports every cluster as data, so without it a
/// full backup writes the whole virtual size (1024 MiB for 64 MiB of data, `scripts/bench-backup`);
/// with it the zero clusters stay unallocated (full) or zero-flagged (incremental, over its
/// backing), which read back as the same zeroes. The pull's scratch image is left as libvirt's.
pub fn target_format(node: &str, storage: &str, backing: Option<&str>, push: bool) -> Blockdev {
    Blockdev::Format(BlockdevFormat {
        node_name: node.to_owned(),
        read_only: false,
        discard: Some("unmap"),
        cache: None,
        detect_zeroes: push.then_some("unmap"),
        driver: FormatDriver::Qcow2,
        file: storage.to_owned(),
        data_file: None,
        backing: match backing {
            None => BackingNode::Null,
            Some(n) => BackingNode::Node(n.to_owned()),
        },
    })
}

/// The bitmap of checkpoint `p` on each disk of an incremental backup, checked as libvirt's
/// `qemuBackupBegin` and `qemuBlockBitmapChainIsValid` do.
fn incremental_sources(
    d: &DomainCtx,
    p: &str,
    disks: &[CbtDisk],
    nodes: &[NamedBlockNode],
) -> Result<Vec<IncrementalFrom>, SyncError> {
    let known = d.backups.lock().checkpoints.contains_key(p);
    let mut from = Vec::new();
    for (disk, node) in disks.iter().zip(nodes) {
        if !known {
            return Err(refused(format!(
                "Domain checkpoint not found: Checkpoint '{p}' for incremental backup of disk '{}' not found",
                disk.target_dev
            )));
        }
        let bitmap = node
            .dirty_bitmaps
            .iter()
            .find(|b| b.name == p)
            .filter(|b| b.persistent && b.recording && !b.inconsistent);
        let Some(bitmap) = bitmap else {
            return Err(refused(format!(
                "checkpoint inconsistent: missing or broken bitmap '{p}' for disk '{}'",
                disk.target_dev
            )));
        };
        from.push(IncrementalFrom {
            checkpoint: p.to_string(),
            granularity: bitmap.granularity,
        });
    }
    Ok(from)
}

async fn delete_node(client: &QmpClient, node: &str) {
    let del = BlockdevDel {
        node_name: node.to_string(),
    };
    if let Err(e) = client.run_timeout(&del, QMP_TIMEOUT).await {
        warn!(node, error = %e, "blockdev-del of a backup target failed");
    }
}

/// How one disk's job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum JobEnd {
    Completed,
    Failed(String),
}

/// Follows the jobs to their end, cleans up and records the outcome (see the module doc).
async fn complete(
    d: Arc<DomainCtx>,
    client: QmpClient,
    mut events: EventStream,
    jobs: Vec<DiskJob>,
) {
    let mut ends: Vec<(String, JobEnd)> = Vec::new();
    let mut cancelled_others = false;
    let ids: Vec<String> = jobs.iter().map(|j| backup_job_id(&j.disk)).collect();
    while ends.len() < jobs.len() {
        let Some(ev) = events.recv().await else {
            for id in &ids {
                if !ends.iter().any(|(i, _)| i == id) {
                    ends.push((
                        id.clone(),
                        JobEnd::Failed("the domain stopped before the backup completed".into()),
                    ));
                }
            }
            break;
        };
        if ev.name != "JOB_STATUS_CHANGE"
            || ev.data.get("status").and_then(|s| s.as_str()) != Some("concluded")
        {
            continue;
        }
        let Some(id) = ev.data.get("id").and_then(|s| s.as_str()) else {
            continue;
        };
        let Some(job) = jobs.iter().find(|j| backup_job_id(&j.disk) == id) else {
            continue;
        };
        if ends.iter().any(|(i, _)| i == id) {
            continue;
        }
        stop_pull(&d, &client).await;
        let end = conclude(&client, job).await;
        {
            let mut s = d.backups.lock();
            if let Some(a) = s.active.as_mut() {
                a.running.retain(|r| r != id);
            }
        }
        if matches!(end, JobEnd::Failed(_)) && !cancelled_others {
            cancelled_others = true;
            let remaining: Vec<String> = d
                .backups
                .lock()
                .active
                .as_ref()
                .map(|a| a.running.clone())
                .unwrap_or_default();
            cancel_jobs(&client, &remaining).await;
        }
        ends.push((id.to_string(), end));
    }
    stop_pull(&d, &client).await;
    let (abort, is_pull) = {
        let s = d.backups.lock();
        let a = s.active.as_ref();
        (
            a.is_some_and(|a| a.abort),
            s.metadata.as_ref().is_some_and(|m| m.mode == "Pull"),
        )
    };
    // A cancelled pull job is a success (libvirt: COMPLETED; KubeVirt hides the message).
    let first_error = ends.iter().find_map(|(_, e)| match e {
        JobEnd::Failed(m) if is_pull && abort && m == OPERATION_CANCELED => None,
        JobEnd::Failed(m) => Some(m.clone()),
        JobEnd::Completed => None,
    });
    let (failed, message) = match (&first_error, abort) {
        (None, _) => (false, String::new()),
        (Some(e), true) => (true, format!("backup aborted: {e}")),
        (Some(e), false) if e.is_empty() => (true, "unknown failure reason".to_string()),
        (Some(e), false) => (true, e.clone()),
    };
    if failed || is_pull {
        // libvirt deletes the targets of a push backup that did not complete, and a pull's
        // scratch files always.
        for job in &jobs {
            match std::fs::remove_file(&job.target_path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    warn!(target = %job.target_path.display(), error = %e, "cannot remove a backup target")
                }
            }
        }
    }
    let end = now();
    let backups = &d.backups;
    set_metadata(&d, backups, |m| {
        m.failed = failed;
        m.completed = true;
        m.backup_msg = message.clone();
        m.end_timestamp = Some(end);
    });
    backups.lock().active = None;
    if failed {
        warn!(message = %message, "backup failed");
    } else {
        info!(volumes = jobs.len(), "backup completed");
    }
}

/// Stops a pull backup's NBD serving once (before its scratch nodes can be deleted).
async fn stop_pull(d: &DomainCtx, client: &QmpClient) {
    let target = d.backups.lock().active.as_mut().and_then(|a| a.pull.take());
    if let Some(t) = target {
        let ids: Vec<String> = t.exports.iter().map(|e| e.id.clone()).collect();
        pull::stop_server(client, &ids, &t.socket).await;
    }
}

/// One concluded job: its error from `query-jobs`, `job-dismiss`, the target's nodes deleted,
/// the temporary bitmap removed.
async fn conclude(client: &QmpClient, job: &DiskJob) -> JobEnd {
    let id = backup_job_id(&job.disk);
    let end = match client.run_timeout(&QueryJobs, QMP_TIMEOUT).await {
        Ok(list) => match list.into_iter().find(|j| j.id == id) {
            Some(j) => match j.error {
                Some(e) => JobEnd::Failed(e),
                None => JobEnd::Completed,
            },
            None => JobEnd::Failed(format!("job {id} is gone")),
        },
        Err(e) => JobEnd::Failed(e.to_string()),
    };
    if let Err(e) = client
        .run_timeout(&JobDismiss { id: id.clone() }, QMP_TIMEOUT)
        .await
    {
        warn!(job = %id, error = %e, "job-dismiss failed");
    }
    delete_node(client, &job.disk.target_node).await;
    delete_node(client, &job.target_storage).await;
    if let Some(name) = &job.temporary_bitmap {
        let remove = BlockDirtyBitmapRemove {
            node: job.disk.node.clone(),
            name: name.clone(),
        };
        if let Err(e) = client.run_timeout(&remove, QMP_TIMEOUT).await {
            warn!(bitmap = %name, error = %e, "cannot remove the temporary bitmap");
        }
    }
    info!(job = %id, volume = %job.volume, outcome = ?end, "backup job concluded");
    end
}

/// `block-job-cancel {force: true}` of each job (libvirt's `qemuBackupJobCancelBlockjobs`); a
/// job that concluded meanwhile is no error.
async fn cancel_jobs(client: &QmpClient, ids: &[String]) {
    for id in ids {
        let cancel = BlockJobCancel {
            device: id.clone(),
            force: true,
        };
        match client.run_timeout(&cancel, QMP_TIMEOUT).await {
            Ok(_) => info!(job = %id, "backup job cancelled"),
            Err(e @ QmpError::Command { .. }) => {
                info!(job = %id, error = %e, "backup job not cancelled (it ended)")
            }
            Err(e) => warn!(job = %id, error = %e, "block-job-cancel failed"),
        }
    }
}

/// Abort (see the module doc).
async fn abort(d: &DomainCtx, options: &options::BackupOptions) -> Result<(), SyncError> {
    let ids = {
        let mut s = d.backups.lock();
        eligible(&s.metadata, options)
            .map_err(|e| refused(format!("failed to abort backup: {e}")))?;
        match s.active.as_mut() {
            Some(a) if !a.running.is_empty() => {
                a.abort = true;
                a.running.clone()
            }
            _ => {
                return Err(refused(
                    "cannot abort backup, wrong operation or type: 0, 0",
                ))
            }
        }
    };
    let client = d.client()?;
    cancel_jobs(&client, &ids).await;
    info!(backup = %options.backup_name, "backup job abort initiated successfully");
    Ok(())
}

/// `RedefineCheckpoint`: `Err((checkpoint_invalid, error))` on failure (see the module doc).
pub(crate) async fn redefine_checkpoint(
    d: &DomainCtx,
    vmi: &Vmi,
    checkpoint: &[u8],
) -> Result<(), (bool, SyncError)> {
    if !cbt_enabled(vmi) {
        return Err((false, refused(REDEFINE_CBT_NOT_ENABLED)));
    }
    let checkpoint = options::decode_checkpoint(checkpoint).map_err(|e| (false, refused(e)))?;
    let name = checkpoint.name.clone();
    let client = d.client().map_err(|e| (false, e))?;
    let domain = d.domain().ok_or((false, SyncError::NoDomain))?;
    let nodes = client
        .run_timeout(&QueryNamedBlockNodes, QMP_TIMEOUT)
        .await
        .map_err(|e| (false, refused(format!("failed to query bitmaps: {e}"))))?;
    let mut qualifying = Vec::new();
    for disk in cbt_disks(&domain) {
        let bitmap = nodes
            .iter()
            .filter(|n| n.file == disk.overlay)
            .flat_map(|n| &n.dirty_bitmaps)
            .find(|b| b.name == name && !b.inconsistent);
        match bitmap {
            Some(b) => qualifying.push((disk.target_dev, b.clone())),
            None => {
                info!(checkpoint = %name, disk = %disk.target_dev, "disk without the checkpoint's bitmap")
            }
        }
    }
    if qualifying.is_empty() {
        return Err((
            true,
            refused(format!("no disks found with checkpoint bitmap {name}")),
        ));
    }
    // libvirt's REDEFINE_VALIDATE (`qemuCheckpointRedefineValidateBitmaps`).
    if let Some((dev, _)) = qualifying
        .iter()
        .find(|(_, b)| !b.persistent || !b.recording)
    {
        return Err((
            true,
            refused(format!(
                "failed to redefine checkpoint {name}: checkpoint inconsistent: missing or invalid bitmap '{name}' for disk '{dev}'"
            )),
        ));
    }
    let disks: Vec<String> = qualifying.into_iter().map(|(dev, _)| dev).collect();
    info!(checkpoint = %name, ?disks, "checkpoint redefined");
    d.backups.lock().checkpoints.insert(
        name.clone(),
        Checkpoint {
            name,
            creation_time: checkpoint.creation_time,
            disks,
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(name: &str, start: &str) -> options::BackupOptions {
        options::BackupOptions {
            backup_name: name.into(),
            backup_start_time: Some(start.into()),
            ..Default::default()
        }
    }

    #[test]
    fn times_in_messages_are_gos() {
        assert_eq!(
            go_time("2026-01-02T03:04:05Z"),
            "2026-01-02 03:04:05 +0000 UTC"
        );
    }

    #[test]
    fn abort_eligibility_has_kubevirts_texts() {
        let o = options("b1", "2026-01-02T03:04:05Z");
        assert_eq!(
            eligible(&None, &o).unwrap_err(),
            "could not find ongoing backup"
        );
        let mut m = BackupMetadata {
            name: "b1".into(),
            ..Default::default()
        };
        assert_eq!(
            eligible(&Some(m.clone()), &o).unwrap_err(),
            "backup did not start yet"
        );
        m.start_timestamp = Some("2026-01-02T03:04:06Z".into());
        assert_eq!(
            eligible(&Some(m.clone()), &o).unwrap_err(),
            "requested backup differs from ongoing one"
        );
        m.start_timestamp = Some("2026-01-02T03:04:05Z".into());
        assert!(eligible(&Some(m.clone()), &o).is_ok());
        m.completed = true;
        assert_eq!(
            eligible(&Some(m), &o).unwrap_err(),
            "backup already completed"
        );
    }

    #[test]
    fn only_disks_with_a_data_store_and_a_target_are_backed_up() {
        let domain: ApiDomain = serde_json::from_value(serde_json::json!({
            "Spec": {"Devices": {"Disks": [
                {"Type": "file", "Source": {"File": "/c/rootdisk.qcow2"},
                 "Target": {"Device": "vda"}, "Alias": {"Name": "rootdisk"}},
                {"Type": "file", "Source": {"File": "/cbt/data.qcow2",
                    "DataStore": {"Type": "file", "Format": {"Type": "raw"},
                                  "Source": {"File": "/d/disk.img"}}},
                 "Target": {"Device": "vdb"}, "Alias": {"Name": "data", "UserDefined": true}}
            ]}}
        }))
        .unwrap();
        assert_eq!(
            cbt_disks(&domain),
            vec![CbtDisk {
                volume: "data".into(),
                target_dev: "vdb".into(),
                overlay: "/cbt/data.qcow2".into(),
            }]
        );
    }
}
