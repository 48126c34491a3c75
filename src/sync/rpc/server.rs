//! The command server: KubeVirt's `kubevirt.cmd.v1.Cmd` and `kubevirt.cmd.info.CmdInfo` services on
//! a Unix socket, as virt-launcher serves them (`pkg/virt-launcher/virtwrap/cmd-server/server.go`,
//! `cmd/virt-launcher/virt-launcher.go`, v1.9.0).
//!
//! Life cycle: [`CmdServer::start`] removes a stale socket file, listens on
//! `<share-dir>/sockets/launcher-init-sock`, and pings itself (every 1 s, for at most 15 s) until it
//! answers; [`CmdServer::mark_ready`] then renames the socket to `launcher-sock`, which is the
//! readiness signal virt-handler waits for. When the caller's shutdown future completes, the server
//! stops (at most 1 s for in-flight calls) and the init socket path is removed, as KubeVirt does.
//! Each accepted connection's requests pass [`crate::sync::rpc::authority`], so a client's
//! `:authority` that h2 would reject (gRPC C-core sends the socket path) is served as `localhost`.
//!
//! Every RPC is dispatched to a [`DomainManager`]. Failures are carried in-band (`Response{success:
//! false, message}`, gRPC status OK), except `Exec` and `GuestPing`, whose failures KubeVirt returns as
//! a gRPC error (status `Unknown`), which is what virt-handler's probes check, and `GetVMStats` with
//! its collector off (a gRPC error too, as KubeVirt's).
//!
//! qlauncher's manager ([`crate::sync::SyncVmi`]) serves all of KubeVirt v1.9.0's `cmd.v1` RPCs:
//! life cycle, CPU and memory hotplug, migration (source and target), freeze and thaw,
//! guest-agent queries (`GetGuestInfo`, `GetUsers`, `GetFilesystems`), `Exec` and `GuestPing`,
//! screenshots, memory dumps, dirty rate, VM stats, SR-IOV host-device hotplug, SEV attestation,
//! push backups with changed block tracking (`BackupVirtualMachine`) and `RedefineCheckpoint`.
//! An RPC a [`DomainManager`] leaves at its default (`None`) answers at once with
//! `success=false` and `<Rpc> is not supported by qlauncher`.

use crate::sync::error::SyncError;
use crate::sync::rpc::authority::AuthorityFilteredStream;
use crate::sync::rpc::proto::cmd::info as cmd_info;
use crate::sync::rpc::proto::cmd::v1 as cmd;
use crate::sync::rpc::service::CmdService;
use crate::sync::rpc::uds;
use futures_util::TryStreamExt;
use std::future::Future;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Status};

/// Versions of `kubevirt.cmd.vN` qlauncher serves (`CmdInfo.Info`).
pub const SUPPORTED_CMD_VERSIONS: [u32; 1] = [1];

/// How long the server keeps pinging itself before giving up (virt-launcher: 15 s).
pub const SELF_PING_TIMEOUT: Duration = Duration::from_secs(15);
/// Pause between two self-pings (virt-launcher: 1 s).
pub const SELF_PING_INTERVAL: Duration = Duration::from_secs(1);
/// How long a stopping server waits for in-flight calls (virt-launcher: 1 s).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(1);

use crate::sync::rpc::manager::DomainManager;

/// Where the command server listens: the init socket, and the ready socket it is renamed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdSocketPaths {
    /// `<share-dir>/sockets/launcher-init-sock`.
    pub init: PathBuf,
    /// `<share-dir>/sockets/launcher-sock`.
    pub ready: PathBuf,
}

impl CmdSocketPaths {
    /// The paths KubeVirt uses under the launcher's share directory (`/var/run/kubevirt` in the pod;
    /// `pkg/virt-handler/cmd-client/client.go`).
    pub fn in_share_dir(share_dir: &Path) -> CmdSocketPaths {
        let sockets = share_dir.join("sockets");
        CmdSocketPaths {
            init: sockets.join("launcher-init-sock"),
            ready: sockets.join("launcher-sock"),
        }
    }
}

/// A running command server.
#[derive(Debug)]
pub struct CmdServer {
    paths: CmdSocketPaths,
    task: JoinHandle<Result<(), SyncError>>,
}

impl CmdServer {
    /// Starts serving `manager` on `paths.init` and returns once the server answered its own Ping.
    /// The server runs until `shutdown` completes.
    ///
    /// The socket directory is created (mode 0755) if missing and an old socket file is removed
    /// first; the socket gets the mode `bind(2)` gives it under the process umask, as with Go's
    /// `net.Listen` in KubeVirt.
    ///
    /// # Errors
    /// [`SyncError::CreateSocketDir`], [`SyncError::RemoveStaleSocket`], [`SyncError::BindSocket`];
    /// [`SyncError::SelfPingTimeout`] when no Ping succeeded within 15 s; [`SyncError::Serve`] when
    /// the server failed before answering.
    pub async fn start<M: DomainManager>(
        manager: Arc<M>,
        paths: CmdSocketPaths,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<CmdServer, SyncError> {
        let listener = listen(&paths.init)?;
        let router = tonic::transport::Server::builder()
            .add_service(cmd_info::cmd_info_server::CmdInfoServer::new(InfoService))
            .add_service(cmd::cmd_server::CmdServer::new(CmdService { manager }));
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        // Any `:authority` is accepted: gRPC C-core clients send the socket path (see `authority`).
        let incoming = UnixListenerStream::new(listener).map_ok(AuthorityFilteredStream::new);
        let serving = router.serve_with_incoming_shutdown(incoming, async move {
            let _ = stop_rx.await;
        });
        let init_path = paths.init.clone();
        let task = tokio::spawn(async move {
            let mut serving = std::pin::pin!(serving);
            let result = tokio::select! {
                result = &mut serving => result.map_err(SyncError::Serve),
                () = shutdown => {
                    tracing::info!("stopping cmd server");
                    let _ = stop_tx.send(());
                    match tokio::time::timeout(STOP_TIMEOUT, &mut serving).await {
                        Ok(result) => result.map_err(SyncError::Serve),
                        Err(_) => {
                            tracing::error!("timeout on stopping the cmd server, continuing anyway");
                            Ok(())
                        }
                    }
                }
            };
            // KubeVirt removes the path it listened on; after the rename that is a no-op.
            let _ = std::fs::remove_file(&init_path);
            result
        });
        if !ping_until_answered(&paths.init, &task).await {
            if task.is_finished() {
                if let Ok(Err(error)) = task.await {
                    return Err(error);
                }
            } else {
                task.abort();
            }
            return Err(SyncError::SelfPingTimeout {
                path: paths.init,
                waited: SELF_PING_TIMEOUT,
            });
        }
        Ok(CmdServer { paths, task })
    }

    /// The socket paths.
    pub fn paths(&self) -> &CmdSocketPaths {
        &self.paths
    }

    /// Renames `launcher-init-sock` to `launcher-sock`: the readiness signal (virt-launcher's
    /// `markReady`). The listening socket keeps serving under its new name.
    ///
    /// # Errors
    /// [`SyncError::MarkReady`] when the rename fails.
    pub fn mark_ready(&self) -> Result<(), SyncError> {
        std::fs::rename(&self.paths.init, &self.paths.ready).map_err(|source| {
            SyncError::MarkReady {
                from: self.paths.init.clone(),
                to: self.paths.ready.clone(),
                source,
            }
        })?;
        tracing::info!("Marked as ready");
        Ok(())
    }

    /// Waits until the server has stopped (after the shutdown future completed).
    ///
    /// # Errors
    /// [`SyncError::Serve`] when the server failed.
    pub async fn wait(self) -> Result<(), SyncError> {
        match self.task.await {
            Ok(result) => result,
            Err(join) => {
                if join.is_panic() {
                    std::panic::resume_unwind(join.into_panic());
                }
                Ok(())
            }
        }
    }
}

/// Pings the server on `path` every [`SELF_PING_INTERVAL`] until it answers, the server task ends,
/// or [`SELF_PING_TIMEOUT`] runs out (virt-launcher's `startCmdServer`). True when it answered.
async fn ping_until_answered<T>(path: &Path, server: &JoinHandle<T>) -> bool {
    let deadline = tokio::time::Instant::now() + SELF_PING_TIMEOUT;
    loop {
        if server.is_finished() {
            return false;
        }
        if let Ok(Ok(())) = tokio::time::timeout_at(deadline, ping(path)).await {
            return true;
        }
        if tokio::time::Instant::now() + SELF_PING_INTERVAL >= deadline {
            return false;
        }
        tokio::time::sleep(SELF_PING_INTERVAL).await;
    }
}

fn listen(path: &Path) -> Result<UnixListener, SyncError> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|source| SyncError::CreateSocketDir {
                path: dir.to_owned(),
                source,
            })?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(SyncError::RemoveStaleSocket {
                path: path.to_owned(),
                source,
            })
        }
    }
    UnixListener::bind(path).map_err(|source| SyncError::BindSocket {
        path: path.to_owned(),
        source,
    })
}

async fn ping(path: &Path) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let channel = uds::connect(path, SELF_PING_INTERVAL).await?;
    let response = cmd::cmd_client::CmdClient::new(channel)
        .ping(cmd::EmptyRequest {})
        .await?
        .into_inner();
    if response.success {
        Ok(())
    } else {
        Err(response.message.into())
    }
}

/// `CmdInfo`: version negotiation.
struct InfoService;

#[tonic::async_trait]
impl cmd_info::cmd_info_server::CmdInfo for InfoService {
    async fn info(
        &self,
        _request: Request<cmd_info::CmdInfoRequest>,
    ) -> Result<tonic::Response<cmd_info::CmdInfoResponse>, Status> {
        Ok(tonic::Response::new(cmd_info::CmdInfoResponse {
            supported_cmd_versions: SUPPORTED_CMD_VERSIONS.to_vec(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_dir_paths_match_kubevirt() {
        let paths = CmdSocketPaths::in_share_dir(Path::new("/var/run/kubevirt"));
        assert_eq!(
            paths,
            CmdSocketPaths {
                init: PathBuf::from("/var/run/kubevirt/sockets/launcher-init-sock"),
                ready: PathBuf::from("/var/run/kubevirt/sockets/launcher-sock"),
            }
        );
    }
}
