//! Pull mode (`mode: Pull`): the NBD side of KubeVirt's pull backup, as libvirt's
//! `qemuBackupBegin` sets it up for `<domainbackup mode='pull'>` with
//! `<server transport='unix' socket='/var/run/kubevirt/sockets/backup-nbd-sock'/>` (fact sheet
//! §4.4): `nbd-server-start` on the socket ([`crate::sync::SyncConfig::backup_nbd_socket`]),
//! one qcow2 scratch (fleecing) image per disk backed by the disk (the push target's path and
//! shape), the transaction of [`crate::qmp::commands::pull_transaction`], then one read-only
//! `block-export-add` per disk (id `libvirt-nbd-<scratch node>`, name = the volume, the
//! scratch node's bitmap only for an incremental pull). The jobs run until Abort (or QEMU
//! ends); then [`stop_server`]: `block-export-del` of each export and `nbd-server-stop`
//! (QEMU unlinks the socket, which ends KubeVirt's tunnel), before the scratch nodes are
//! deleted and their files removed.
//!
//! `Export`'s tunnel serves the exports named by [`export_names`].

use std::path::{Path, PathBuf};

use tracing::{info, warn};

use crate::qmp::client::QmpClient;
use crate::qmp::migration::{
    BlockExportAddNbd, BlockExportDel, NbdServerStart, NbdServerStop, SocketAddressLegacy,
};
use crate::sync::ctx::DomainCtx;
use crate::sync::error::SyncError;

use super::QMP_TIMEOUT;

/// One disk's NBD export of a running pull backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullExport {
    /// The NBD export name: the VMI volume (KubeVirt's `exportname`).
    pub name: String,
    /// The scratch (fleecing) node it exports.
    pub node: String,
    /// The export id (`libvirt-nbd-<scratch node>`).
    pub id: String,
    /// The dirty bitmap offered as meta context `qemu:dirty-bitmap:<bitmap>`: the new
    /// checkpoint's name, for an incremental pull only.
    pub bitmap: Option<String>,
}

/// What a running pull backup serves, for `Export`'s tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullTarget {
    /// The backup's name (`backupName`).
    pub backup_name: String,
    /// `backupStartTime` as sent.
    pub start_timestamp: String,
    /// The NBD server's unix socket.
    pub socket: PathBuf,
    /// One per backed-up disk, in domain order.
    pub exports: Vec<PullExport>,
}

/// The export names of the running pull backup, for `Export`'s tunnel (the export server
/// asks for the volume names); none when no pull backup runs. The socket itself is checked
/// by the tunnel alone, as KubeVirt's `initiateBackupTunnel` does.
pub(crate) fn export_names(d: &DomainCtx) -> Vec<String> {
    d.backups
        .lock()
        .active
        .as_ref()
        .and_then(|a| a.pull.as_ref())
        .map(|p| p.exports.iter().map(|e| e.name.clone()).collect())
        .unwrap_or_default()
}

/// `nbd-server-start` on `socket` (its directory made when missing; a stale socket file of an
/// earlier QEMU removed first).
pub(super) async fn start_server(client: &QmpClient, socket: &Path) -> Result<(), SyncError> {
    if let Some(dir) = socket.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    remove_socket(socket);
    let start = NbdServerStart {
        addr: SocketAddressLegacy::Unix {
            path: socket.to_string_lossy().into_owned(),
        },
    };
    client
        .run_timeout(&start, QMP_TIMEOUT)
        .await
        .map(drop)
        .map_err(SyncError::Qmp)
}

/// The read-only export of each export's scratch node.
pub(super) async fn add_exports(
    client: &QmpClient,
    exports: &[PullExport],
) -> Result<(), SyncError> {
    for export in exports {
        let add = BlockExportAddNbd::pull(
            &export.node,
            &export.name,
            export.bitmap.clone().map(|b| vec![b]),
        );
        client
            .run_timeout(&add, QMP_TIMEOUT)
            .await
            .map_err(SyncError::Qmp)?;
    }
    Ok(())
}

/// Ends the serving: `block-export-del` (hard) of each export, `nbd-server-stop`, and the
/// socket file removed if QEMU left it. Errors are logged (QEMU may be gone).
pub(super) async fn stop_server(client: &QmpClient, ids: &[String], socket: &Path) {
    for id in ids {
        let del = BlockExportDel {
            id: id.clone(),
            mode: Some("hard"),
        };
        if let Err(e) = client.run_timeout(&del, QMP_TIMEOUT).await {
            info!(export = %id, error = %e, "block-export-del failed");
        }
    }
    match client.run_timeout(&NbdServerStop, QMP_TIMEOUT).await {
        Ok(_) => info!("pull backup NBD server stopped"),
        Err(e) => warn!(error = %e, "nbd-server-stop failed"),
    }
    remove_socket(socket);
}

fn remove_socket(socket: &Path) {
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => warn!(socket = %socket.display(), error = %e, "cannot remove the NBD socket"),
    }
}
