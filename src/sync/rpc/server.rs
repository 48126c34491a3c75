//! The command server: KubeVirt's `kubevirt.cmd.v1.Cmd` and `kubevirt.cmd.info.CmdInfo` services on
//! a Unix socket, as virt-launcher serves them (`pkg/virt-launcher/virtwrap/cmd-server/server.go`,
//! `cmd/virt-launcher/virt-launcher.go`, v1.9.0).
//!
//! Life cycle: [`CmdServer::start`] removes a stale socket file, listens on
//! `<share-dir>/sockets/launcher-init-sock`, and pings itself (every 1 s, for at most 15 s) until it
//! answers; [`CmdServer::mark_ready`] then renames the socket to `launcher-sock`, which is the
//! readiness signal virt-handler waits for. When the caller's shutdown future completes, the server
//! stops (at most 1 s for in-flight calls) and the init socket path is removed, as KubeVirt does.
//!
//! Every RPC is dispatched to a [`DomainManager`]. Failures are carried in-band (`Response{success:
//! false, message}`, gRPC status OK), except `Exec` and `GuestPing`, whose failures KubeVirt returns as
//! a gRPC error (status `Unknown`), which is what virt-handler's probes check. The RPCs qlauncher does
//! not implement (migration, freeze, backup, SEV, screenshots, memory dump, guest-agent queries,
//! VM stats, host-device hotplug) answer at once with `success=false` and a message saying so.

use crate::sync::domain::Domain;
use crate::sync::proto::cmd::info as cmd_info;
use crate::sync::proto::cmd::v1 as cmd;
use crate::sync::proto::cmd::v1::VirtualMachineOptions;
use crate::sync::{uds, SyncError};
use serde::de::DeserializeOwned;
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

/// The message virt-launcher answers when `vmiJson` does not decode
/// (`cmd-server/server.go`, `getVMIFromRequest`).
pub const INVALID_VMI_MESSAGE: &str = "No valid vmi object present in command server request";

/// What `Exec` reports of a guest command that ran: its exit code and standard output. A non-zero
/// exit code is a successful RPC (KubeVirt's `agent.ExecExitCode`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// The command's exit code.
    pub exit_code: i32,
    /// The command's standard output, as text.
    pub stdout: String,
}

/// The launcher behaviour behind the command server: KubeVirt's `virtwrap.DomainManager`, reduced to
/// the operations qlauncher implements. The orchestrator implements it; the server only decodes,
/// dispatches and encodes.
///
/// `Vmi` is the type the request's `vmiJson` is decoded into (a request whose JSON does not decode
/// is answered with [`INVALID_VMI_MESSAGE`] without calling the manager). An `Err` becomes
/// `success=false` with the error and its sources joined by `": "` as the message.
///
/// Calls arrive concurrently (virt-handler may sync while it reads the domain); serialising
/// domain changes (KubeVirt's `domainModifyLock`) is the manager's job.
pub trait DomainManager: Send + Sync + 'static {
    /// The VirtualMachineInstance type decoded from `VMI.vmiJson`.
    type Vmi: DeserializeOwned + Send + 'static;
    /// The manager's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// `SyncVirtualMachine`: define, start and reconcile the domain (KubeVirt `SyncVMI`).
    fn sync_vmi(
        &self,
        vmi: Self::Vmi,
        options: Option<VirtualMachineOptions>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `PauseVirtualMachine`: pause the vCPUs on user request.
    fn pause_vmi(&self, vmi: Self::Vmi) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `UnpauseVirtualMachine`: resume vCPUs paused on user request.
    fn unpause_vmi(&self, vmi: Self::Vmi) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `ResetVirtualMachine`: hard reset.
    fn reset_vmi(&self, vmi: Self::Vmi) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `SoftRebootVirtualMachine`: reboot through the guest agent, else the ACPI power button.
    fn soft_reboot_vmi(
        &self,
        vmi: Self::Vmi,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `ShutdownVirtualMachine`: signal a graceful (ACPI) shutdown (KubeVirt `SignalShutdownVMI`).
    fn shutdown_vmi(&self, vmi: Self::Vmi) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `KillVirtualMachine`: stop QEMU now.
    fn kill_vmi(&self, vmi: Self::Vmi) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `DeleteVirtualMachine`: forget the stopped domain.
    fn delete_vmi(&self, vmi: Self::Vmi) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `SyncVirtualMachineCPUs`: vCPU hotplug to the VMI's socket count (KubeVirt `UpdateVCPUs`).
    fn sync_vcpus(
        &self,
        vmi: Self::Vmi,
        options: Option<VirtualMachineOptions>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `SyncVirtualMachineMemory`: memory hotplug (KubeVirt `UpdateGuestMemory`).
    fn sync_memory(
        &self,
        vmi: Self::Vmi,
        options: Option<VirtualMachineOptions>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `GetDomain`: the current domain with the guest agent's OS info and interfaces merged into
    /// its status, as KubeVirt's `GetDomain` does; `None` when there is none (answered as an empty
    /// string, which virt-handler reads as "no domain").
    fn get_domain(&self) -> impl Future<Output = Result<Option<Domain>, Self::Error>> + Send;
    /// `GetDomainStats`: KubeVirt's `stats.DomainStats` as a JSON value.
    fn get_domain_stats(
        &self,
    ) -> impl Future<Output = Result<serde_json::Value, Self::Error>> + Send;
    /// `GetQemuVersion`: the QEMU version string, e.g. `7.2.0`.
    fn qemu_version(&self) -> impl Future<Output = Result<String, Self::Error>> + Send;
    /// `GuestPing`: ping the guest agent of `domain_name` within `timeout`.
    fn guest_ping(
        &self,
        domain_name: String,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `Exec`: run `command args...` in the guest through the agent within `timeout`.
    fn exec(
        &self,
        domain_name: String,
        command: String,
        args: Vec<String>,
        timeout: Duration,
    ) -> impl Future<Output = Result<ExecOutput, Self::Error>> + Send;
}

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
        let serving =
            router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
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

/// `Cmd`: decodes requests and dispatches them to the manager.
struct CmdService<M> {
    manager: Arc<M>,
}

type RpcResult<T> = Result<tonic::Response<T>, Status>;

fn ok() -> cmd::Response {
    cmd::Response {
        success: true,
        message: String::new(),
    }
}

fn failed(message: String) -> cmd::Response {
    cmd::Response {
        success: false,
        message,
    }
}

/// The in-band answer to an RPC qlauncher does not implement.
fn unsupported(rpc: &str) -> cmd::Response {
    failed(format!("{rpc} is not supported by qlauncher"))
}

/// An error and its sources, joined by `": "` (Go's wrapped-error text).
fn error_message(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

fn decode_vmi<V: DeserializeOwned>(vmi: Option<&cmd::Vmi>) -> Result<V, cmd::Response> {
    let bytes = vmi.map(|v| v.vmi_json.as_slice()).unwrap_or_default();
    serde_json::from_slice(bytes).map_err(|_| failed(INVALID_VMI_MESSAGE.to_owned()))
}

fn seconds(timeout_seconds: i32) -> Duration {
    Duration::from_secs(u64::try_from(timeout_seconds).unwrap_or(0))
}

impl<M: DomainManager> CmdService<M> {
    /// Runs one VMI command: decode the VMI, call the manager, answer in-band.
    async fn vmi_command<F, Fut>(
        &self,
        rpc: &'static str,
        vmi: Option<cmd::Vmi>,
        call: F,
    ) -> RpcResult<cmd::Response>
    where
        F: FnOnce(Arc<M>, M::Vmi) -> Fut,
        Fut: Future<Output = Result<(), M::Error>>,
    {
        let vmi = match decode_vmi::<M::Vmi>(vmi.as_ref()) {
            Ok(vmi) => vmi,
            Err(response) => return Ok(tonic::Response::new(response)),
        };
        let response = match call(Arc::clone(&self.manager), vmi).await {
            Ok(()) => {
                tracing::info!(rpc, "command succeeded");
                ok()
            }
            Err(error) => {
                let message = error_message(&error);
                tracing::error!(rpc, error = %message, "command failed");
                failed(message)
            }
        };
        Ok(tonic::Response::new(response))
    }
}

#[tonic::async_trait]
impl<M: DomainManager> cmd::cmd_server::Cmd for CmdService<M> {
    async fn sync_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        let request = request.into_inner();
        let options = request.options;
        self.vmi_command("SyncVirtualMachine", request.vmi, |m, vmi| async move {
            m.sync_vmi(vmi, options).await
        })
        .await
    }

    async fn pause_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        self.vmi_command(
            "PauseVirtualMachine",
            request.into_inner().vmi,
            |m, vmi| async move { m.pause_vmi(vmi).await },
        )
        .await
    }

    async fn unpause_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        self.vmi_command(
            "UnpauseVirtualMachine",
            request.into_inner().vmi,
            |m, vmi| async move { m.unpause_vmi(vmi).await },
        )
        .await
    }

    async fn freeze_virtual_machine(
        &self,
        _: Request<cmd::FreezeRequest>,
    ) -> RpcResult<cmd::Response> {
        Ok(tonic::Response::new(unsupported("FreezeVirtualMachine")))
    }

    async fn unfreeze_virtual_machine(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        Ok(tonic::Response::new(unsupported("UnfreezeVirtualMachine")))
    }

    async fn reset_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        self.vmi_command(
            "ResetVirtualMachine",
            request.into_inner().vmi,
            |m, vmi| async move { m.reset_vmi(vmi).await },
        )
        .await
    }

    async fn soft_reboot_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        self.vmi_command(
            "SoftRebootVirtualMachine",
            request.into_inner().vmi,
            |m, vmi| async move { m.soft_reboot_vmi(vmi).await },
        )
        .await
    }

    async fn shutdown_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        self.vmi_command(
            "ShutdownVirtualMachine",
            request.into_inner().vmi,
            |m, vmi| async move { m.shutdown_vmi(vmi).await },
        )
        .await
    }

    async fn kill_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        self.vmi_command(
            "KillVirtualMachine",
            request.into_inner().vmi,
            |m, vmi| async move { m.kill_vmi(vmi).await },
        )
        .await
    }

    async fn delete_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        self.vmi_command(
            "DeleteVirtualMachine",
            request.into_inner().vmi,
            |m, vmi| async move { m.delete_vmi(vmi).await },
        )
        .await
    }

    async fn migrate_virtual_machine(
        &self,
        _: Request<cmd::MigrationRequest>,
    ) -> RpcResult<cmd::Response> {
        Ok(tonic::Response::new(unsupported("MigrateVirtualMachine")))
    }

    async fn sync_migration_target(&self, _: Request<cmd::VmiRequest>) -> RpcResult<cmd::Response> {
        Ok(tonic::Response::new(unsupported("SyncMigrationTarget")))
    }

    async fn cancel_virtual_machine_migration(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        Ok(tonic::Response::new(unsupported(
            "CancelVirtualMachineMigration",
        )))
    }

    async fn signal_target_pod_cleanup(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        Ok(tonic::Response::new(unsupported("SignalTargetPodCleanup")))
    }

    async fn finalize_virtual_machine_migration(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        Ok(tonic::Response::new(unsupported(
            "FinalizeVirtualMachineMigration",
        )))
    }

    async fn hotplug_host_devices(&self, _: Request<cmd::VmiRequest>) -> RpcResult<cmd::Response> {
        Ok(tonic::Response::new(unsupported("HotplugHostDevices")))
    }

    async fn get_domain(&self, _: Request<cmd::EmptyRequest>) -> RpcResult<cmd::DomainResponse> {
        let (response, domain) = match self.manager.get_domain().await {
            Ok(None) => (ok(), String::new()),
            Ok(Some(domain)) => match serde_json::to_string(&domain) {
                Ok(json) => (ok(), json),
                Err(error) => (failed(error_message(&error)), String::new()),
            },
            Err(error) => (failed(error_message(&error)), String::new()),
        };
        Ok(tonic::Response::new(cmd::DomainResponse {
            response: Some(response),
            domain,
        }))
    }

    async fn get_domain_stats(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> RpcResult<cmd::DomainStatsResponse> {
        let (response, domain_stats) = match self.manager.get_domain_stats().await {
            Ok(stats) => (ok(), stats.to_string()),
            Err(error) => (failed(error_message(&error)), String::new()),
        };
        Ok(tonic::Response::new(cmd::DomainStatsResponse {
            response: Some(response),
            domain_stats,
        }))
    }

    async fn get_guest_info(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> RpcResult<cmd::GuestInfoResponse> {
        Ok(tonic::Response::new(cmd::GuestInfoResponse {
            response: Some(unsupported("GetGuestInfo")),
            guest_info_response: String::new(),
        }))
    }

    async fn get_users(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> RpcResult<cmd::GuestUserListResponse> {
        Ok(tonic::Response::new(cmd::GuestUserListResponse {
            response: Some(unsupported("GetUsers")),
            guest_user_list_response: String::new(),
        }))
    }

    async fn get_filesystems(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> RpcResult<cmd::GuestFilesystemsResponse> {
        Ok(tonic::Response::new(cmd::GuestFilesystemsResponse {
            response: Some(unsupported("GetFilesystems")),
            guest_filesystems_response: String::new(),
        }))
    }

    async fn ping(&self, _: Request<cmd::EmptyRequest>) -> RpcResult<cmd::Response> {
        Ok(tonic::Response::new(ok()))
    }

    async fn exec(&self, request: Request<cmd::ExecRequest>) -> RpcResult<cmd::ExecResponse> {
        let request = request.into_inner();
        let outcome = self
            .manager
            .exec(
                request.domain_name,
                request.command,
                request.args,
                seconds(request.timeout_seconds),
            )
            .await;
        match outcome {
            Ok(output) => Ok(tonic::Response::new(cmd::ExecResponse {
                response: Some(ok()),
                exit_code: output.exit_code,
                std_out: output.stdout,
            })),
            Err(error) => Err(Status::unknown(error_message(&error))),
        }
    }

    async fn guest_ping(
        &self,
        request: Request<cmd::GuestPingRequest>,
    ) -> RpcResult<cmd::GuestPingResponse> {
        let request = request.into_inner();
        match self
            .manager
            .guest_ping(request.domain_name, seconds(request.timeout_seconds))
            .await
        {
            Ok(()) => Ok(tonic::Response::new(cmd::GuestPingResponse {
                response: Some(ok()),
            })),
            Err(error) => {
                let message = error_message(&error);
                tracing::warn!(error = %message, "GuestAgentPing probe failed");
                Err(Status::unknown(message))
            }
        }
    }

    async fn virtual_machine_memory_dump(
        &self,
        _: Request<cmd::MemoryDumpRequest>,
    ) -> RpcResult<cmd::Response> {
        Ok(tonic::Response::new(unsupported(
            "VirtualMachineMemoryDump",
        )))
    }

    async fn get_qemu_version(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> RpcResult<cmd::QemuVersionResponse> {
        let (response, version) = match self.manager.qemu_version().await {
            Ok(version) => (ok(), version),
            Err(error) => (failed(error_message(&error)), String::new()),
        };
        Ok(tonic::Response::new(cmd::QemuVersionResponse {
            response: Some(response),
            version,
        }))
    }

    async fn sync_virtual_machine_cp_us(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        let request = request.into_inner();
        let options = request.options;
        self.vmi_command("SyncVirtualMachineCPUs", request.vmi, |m, vmi| async move {
            m.sync_vcpus(vmi, options).await
        })
        .await
    }

    async fn sync_virtual_machine_memory(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        let request = request.into_inner();
        let options = request.options;
        self.vmi_command(
            "SyncVirtualMachineMemory",
            request.vmi,
            |m, vmi| async move { m.sync_memory(vmi, options).await },
        )
        .await
    }

    async fn get_sev_info(&self, _: Request<cmd::EmptyRequest>) -> RpcResult<cmd::SevInfoResponse> {
        Ok(tonic::Response::new(cmd::SevInfoResponse {
            response: Some(unsupported("GetSEVInfo")),
            sev_info: Vec::new(),
        }))
    }

    async fn get_launch_measurement(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::LaunchMeasurementResponse> {
        Ok(tonic::Response::new(cmd::LaunchMeasurementResponse {
            response: Some(unsupported("GetLaunchMeasurement")),
            launch_measurement: Vec::new(),
        }))
    }

    async fn inject_launch_secret(
        &self,
        _: Request<cmd::InjectLaunchSecretRequest>,
    ) -> RpcResult<cmd::Response> {
        Ok(tonic::Response::new(unsupported("InjectLaunchSecret")))
    }

    async fn get_domain_dirty_rate_stats(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> RpcResult<cmd::DirtyRateStatsResponse> {
        Ok(tonic::Response::new(cmd::DirtyRateStatsResponse {
            response: Some(unsupported("GetDomainDirtyRateStats")),
            dirty_rate_mbs: 0,
        }))
    }

    async fn get_screenshot(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::ScreenshotResponse> {
        Ok(tonic::Response::new(cmd::ScreenshotResponse {
            response: Some(unsupported("GetScreenshot")),
            mime: String::new(),
            data: Vec::new(),
        }))
    }

    async fn backup_virtual_machine(
        &self,
        _: Request<cmd::BackupRequest>,
    ) -> RpcResult<cmd::Response> {
        Ok(tonic::Response::new(unsupported("BackupVirtualMachine")))
    }

    async fn redefine_checkpoint(
        &self,
        _: Request<cmd::RedefineCheckpointRequest>,
    ) -> RpcResult<cmd::RedefineCheckpointResponse> {
        Ok(tonic::Response::new(cmd::RedefineCheckpointResponse {
            response: Some(unsupported("RedefineCheckpoint")),
            checkpoint_invalid: false,
        }))
    }

    async fn get_vm_stats(
        &self,
        _: Request<cmd::VmStatsRequest>,
    ) -> RpcResult<cmd::VmStatsResponse> {
        Ok(tonic::Response::new(cmd::VmStatsResponse {
            response: Some(unsupported("GetVMStats")),
            ..cmd::VmStatsResponse::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer step failed")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn error_message_joins_sources_like_go_wrapping() {
        let error = Outer(std::io::Error::other("disk full"));
        assert_eq!(error_message(&error), "outer step failed: disk full");
    }

    #[test]
    fn undecodable_vmi_answers_kubevirts_message() {
        let bad = cmd::Vmi {
            vmi_json: b"{not json".to_vec(),
        };
        let response = decode_vmi::<serde_json::Value>(Some(&bad)).unwrap_err();
        assert_eq!(response, failed(INVALID_VMI_MESSAGE.to_owned()));
        let missing = decode_vmi::<serde_json::Value>(None).unwrap_err();
        assert_eq!(missing, failed(INVALID_VMI_MESSAGE.to_owned()));
    }

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

    #[test]
    fn negative_timeouts_become_zero() {
        assert_eq!(seconds(-5), Duration::ZERO);
        assert_eq!(seconds(7), Duration::from_secs(7));
    }
}
