//! The `kubevirt.cmd.v1.Cmd` service: decodes each request, dispatches it to the
//! [`DomainManager`] and encodes the answer (`pkg/virt-launcher/virtwrap/cmd-server/server.go`,
//! v1.9.0). Failures are in-band (`success=false`) except for `Exec`, `GuestPing` and `GetVMStats`
//! with its flag off. The RPCs a manager does not implement answer at once with
//! `success=false` and a message saying so.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use tonic::{Request, Status};

use crate::sync::rpc::manager::{DomainManager, INVALID_VMI_MESSAGE};
use crate::sync::rpc::proto::cmd::v1 as cmd;

/// `Cmd`: decodes requests and dispatches them to the manager.
pub(crate) struct CmdService<M> {
    pub(crate) manager: Arc<M>,
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
    crate::sys::error::error_chain(error)
}

fn decode_vmi<V: DeserializeOwned>(vmi: Option<&cmd::Vmi>) -> Result<V, cmd::Response> {
    let bytes = vmi.map(|v| v.vmi_json.as_slice()).unwrap_or_default();
    serde_json::from_slice(bytes).map_err(|_| failed(INVALID_VMI_MESSAGE.to_owned()))
}

/// The request's `vmiJson` bytes (empty when absent); the migration calls decode it themselves
/// (they read `status.migrationState`).
fn vmi_json(vmi: Option<cmd::Vmi>) -> Vec<u8> {
    vmi.map(|v| v.vmi_json).unwrap_or_default()
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

    /// Runs one VMI command whose manager method may be unimplemented (`None`).
    async fn optional_vmi_command<F, Fut>(
        &self,
        rpc: &'static str,
        vmi: Option<cmd::Vmi>,
        call: F,
    ) -> RpcResult<cmd::Response>
    where
        F: FnOnce(Arc<M>, M::Vmi) -> Fut,
        Fut: Future<Output = Option<Result<(), M::Error>>>,
    {
        let vmi = match decode_vmi::<M::Vmi>(vmi.as_ref()) {
            Ok(vmi) => vmi,
            Err(response) => return Ok(tonic::Response::new(response)),
        };
        Ok(tonic::Response::new(answer(
            rpc,
            call(Arc::clone(&self.manager), vmi).await,
        )))
    }
}

/// The in-band answer of an optional manager call.
fn answer<E: std::error::Error + 'static>(
    rpc: &str,
    outcome: Option<Result<(), E>>,
) -> cmd::Response {
    match outcome {
        None => unsupported(rpc),
        Some(Ok(())) => ok(),
        Some(Err(error)) => {
            let message = error_message(&error);
            tracing::error!(rpc, error = %message, "command failed");
            failed(message)
        }
    }
}

/// The in-band answer and value of an optional manager call (`T::default()` on failure).
fn answer_with<T: Default, E: std::error::Error + 'static>(
    rpc: &str,
    outcome: Option<Result<T, E>>,
) -> (cmd::Response, T) {
    match outcome {
        Some(Ok(value)) => (ok(), value),
        None => (unsupported(rpc), T::default()),
        Some(Err(error)) => {
            let message = error_message(&error);
            tracing::error!(rpc, error = %message, "command failed");
            (failed(message), T::default())
        }
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
        request: Request<cmd::FreezeRequest>,
    ) -> RpcResult<cmd::Response> {
        let request = request.into_inner();
        let timeout = seconds(request.unfreeze_timeout_seconds);
        self.optional_vmi_command("FreezeVirtualMachine", request.vmi, |m, vmi| async move {
            m.freeze_vmi(vmi, timeout).await
        })
        .await
    }

    async fn unfreeze_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        self.optional_vmi_command(
            "UnfreezeVirtualMachine",
            request.into_inner().vmi,
            |m, vmi| async move { m.unfreeze_vmi(vmi).await },
        )
        .await
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
        request: Request<cmd::MigrationRequest>,
    ) -> RpcResult<cmd::Response> {
        let r = request.into_inner();
        let vmi = vmi_json(r.vmi);
        let m = Arc::clone(&self.manager);
        Ok(tonic::Response::new(answer(
            "MigrateVirtualMachine",
            m.migrate_vmi(vmi, r.options).await,
        )))
    }

    async fn sync_migration_target(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        let r = request.into_inner();
        let m = Arc::clone(&self.manager);
        Ok(tonic::Response::new(answer(
            "SyncMigrationTarget",
            m.sync_migration_target(vmi_json(r.vmi), r.options).await,
        )))
    }

    async fn cancel_virtual_machine_migration(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        let m = Arc::clone(&self.manager);
        Ok(tonic::Response::new(answer(
            "CancelVirtualMachineMigration",
            m.cancel_migration(vmi_json(request.into_inner().vmi)).await,
        )))
    }

    async fn signal_target_pod_cleanup(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        let m = Arc::clone(&self.manager);
        Ok(tonic::Response::new(answer(
            "SignalTargetPodCleanup",
            m.signal_target_pod_cleanup(vmi_json(request.into_inner().vmi))
                .await,
        )))
    }

    async fn finalize_virtual_machine_migration(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        let r = request.into_inner();
        let m = Arc::clone(&self.manager);
        Ok(tonic::Response::new(answer(
            "FinalizeVirtualMachineMigration",
            m.finalize_migration(vmi_json(r.vmi), r.options).await,
        )))
    }

    async fn hotplug_host_devices(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::Response> {
        self.optional_vmi_command(
            "HotplugHostDevices",
            request.into_inner().vmi,
            |m, vmi| async move { m.hotplug_host_devices(vmi).await },
        )
        .await
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
        let (response, guest_info_response) = match self.manager.guest_info().await {
            Some(json) => (ok(), json),
            None => (unsupported("GetGuestInfo"), String::new()),
        };
        Ok(tonic::Response::new(cmd::GuestInfoResponse {
            response: Some(response),
            guest_info_response,
        }))
    }

    async fn get_users(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> RpcResult<cmd::GuestUserListResponse> {
        let (response, guest_user_list_response) = match self.manager.guest_users().await {
            Some(json) => (ok(), json),
            None => (unsupported("GetUsers"), String::new()),
        };
        Ok(tonic::Response::new(cmd::GuestUserListResponse {
            response: Some(response),
            guest_user_list_response,
        }))
    }

    async fn get_filesystems(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> RpcResult<cmd::GuestFilesystemsResponse> {
        let (response, guest_filesystems_response) = match self.manager.guest_filesystems().await {
            Some(json) => (ok(), json),
            None => (unsupported("GetFilesystems"), String::new()),
        };
        Ok(tonic::Response::new(cmd::GuestFilesystemsResponse {
            response: Some(response),
            guest_filesystems_response,
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
        request: Request<cmd::MemoryDumpRequest>,
    ) -> RpcResult<cmd::Response> {
        let request = request.into_inner();
        let path = request.dump_path;
        self.optional_vmi_command(
            "VirtualMachineMemoryDump",
            request.vmi,
            |m, vmi| async move { m.memory_dump(vmi, path).await },
        )
        .await
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
        let (response, sev_info) = answer_with("GetSEVInfo", self.manager.sev_info().await);
        Ok(tonic::Response::new(cmd::SevInfoResponse {
            response: Some(response),
            sev_info,
        }))
    }

    async fn get_launch_measurement(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::LaunchMeasurementResponse> {
        let vmi = match decode_vmi::<M::Vmi>(request.into_inner().vmi.as_ref()) {
            Ok(vmi) => vmi,
            Err(response) => {
                return Ok(tonic::Response::new(cmd::LaunchMeasurementResponse {
                    response: Some(response),
                    launch_measurement: Vec::new(),
                }))
            }
        };
        let (response, launch_measurement) = answer_with(
            "GetLaunchMeasurement",
            self.manager.launch_measurement(vmi).await,
        );
        Ok(tonic::Response::new(cmd::LaunchMeasurementResponse {
            response: Some(response),
            launch_measurement,
        }))
    }

    async fn inject_launch_secret(
        &self,
        request: Request<cmd::InjectLaunchSecretRequest>,
    ) -> RpcResult<cmd::Response> {
        let request = request.into_inner();
        let options = request.options;
        self.optional_vmi_command("InjectLaunchSecret", request.vmi, |m, vmi| async move {
            m.inject_launch_secret(vmi, options).await
        })
        .await
    }

    async fn get_domain_dirty_rate_stats(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> RpcResult<cmd::DirtyRateStatsResponse> {
        let (response, dirty_rate_mbs) = match self.manager.dirty_rate().await {
            Some(Ok(rate)) => (ok(), rate),
            None => (unsupported("GetDomainDirtyRateStats"), -1),
            Some(Err(error)) => (failed(error_message(&error)), -1),
        };
        Ok(tonic::Response::new(cmd::DirtyRateStatsResponse {
            response: Some(response),
            dirty_rate_mbs,
        }))
    }

    async fn get_screenshot(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> RpcResult<cmd::ScreenshotResponse> {
        let vmi = match decode_vmi::<M::Vmi>(request.into_inner().vmi.as_ref()) {
            Ok(vmi) => vmi,
            Err(response) => {
                return Ok(tonic::Response::new(cmd::ScreenshotResponse {
                    response: Some(response),
                    ..cmd::ScreenshotResponse::default()
                }))
            }
        };
        let (response, shot) = answer_with("GetScreenshot", self.manager.screenshot(vmi).await);
        Ok(tonic::Response::new(cmd::ScreenshotResponse {
            response: Some(response),
            mime: shot.mime,
            data: shot.data,
        }))
    }

    async fn backup_virtual_machine(
        &self,
        request: Request<cmd::BackupRequest>,
    ) -> RpcResult<cmd::Response> {
        let request = request.into_inner();
        let options = request.options;
        self.optional_vmi_command("BackupVirtualMachine", request.vmi, |m, vmi| async move {
            m.backup(vmi, options).await
        })
        .await
    }

    async fn redefine_checkpoint(
        &self,
        request: Request<cmd::RedefineCheckpointRequest>,
    ) -> RpcResult<cmd::RedefineCheckpointResponse> {
        let request = request.into_inner();
        let vmi = match decode_vmi::<M::Vmi>(request.vmi.as_ref()) {
            Ok(vmi) => vmi,
            Err(response) => {
                return Ok(tonic::Response::new(cmd::RedefineCheckpointResponse {
                    response: Some(response),
                    checkpoint_invalid: false,
                }))
            }
        };
        let manager = &self.manager;
        let (response, checkpoint_invalid) = match manager
            .redefine_checkpoint(vmi, request.checkpoint)
            .await
        {
            None => (unsupported("RedefineCheckpoint"), false),
            Some(Ok(())) => (ok(), false),
            Some(Err(refusal)) => {
                let message = error_message(&refusal.error);
                tracing::error!(error = %message, invalid = refusal.invalid, "RedefineCheckpoint failed");
                (failed(message), refusal.invalid)
            }
        };
        Ok(tonic::Response::new(cmd::RedefineCheckpointResponse {
            response: Some(response),
            checkpoint_invalid,
        }))
    }

    async fn get_vm_stats(
        &self,
        request: Request<cmd::VmStatsRequest>,
    ) -> RpcResult<cmd::VmStatsResponse> {
        match self.manager.vm_stats(request.into_inner()).await {
            Some(Ok(response)) => Ok(tonic::Response::new(response)),
            Some(Err(error)) => Err(Status::unknown(error_message(&error))),
            None => Ok(tonic::Response::new(cmd::VmStatsResponse {
                response: Some(unsupported("GetVMStats")),
                ..cmd::VmStatsResponse::default()
            })),
        }
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
    fn negative_timeouts_become_zero() {
        assert_eq!(seconds(-5), Duration::ZERO);
        assert_eq!(seconds(7), Duration::from_secs(7));
    }
}
