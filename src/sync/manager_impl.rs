//! The command server's [`DomainManager`] over [`SyncVmi`]: each RPC a few lines calling the
//! work where it lives (the sync in `vmi_sync.rs`, the life cycle over [`lifecycle`], the
//! resources in `reconcile/`, the cmd API in `cmdapi/`, migration in `migration/`), as
//! KubeVirt's `LibvirtDomainManager` methods answer them (`pkg/virt-launcher/virtwrap/manager.go`,
//! v1.9.0).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tracing::info;

use crate::qmp::commands::QueryVersion;
use crate::qmp::lifecycle;
use crate::sync::cmdapi::manager as cmdapi;
use crate::sync::config::{AGENT_SHUTDOWN_ANSWER, AGENT_SHUTDOWN_TIMEOUT};
use crate::sync::domain::ApiDomain;
use crate::sync::error::SyncError;
use crate::sync::reconcile;
use crate::sync::rpc::manager::{CheckpointRefusal, DomainManager, ExecOutput, Screenshot};
use crate::sync::rpc::proto::cmd::v1::{VirtualMachineOptions, VmStatsRequest, VmStatsResponse};
use crate::sync::vmi_sync::SyncVmi;
use crate::vmi::Vmi;

/// How long a Shutdown whose power button met a closing monitor waits for the domain to show
/// it shut down (its SHUTDOWN event or QEMU's exit) before it reports the QMP error.
const SHUTDOWN_SETTLE: Duration = Duration::from_secs(2);

/// Whether `vmi` has condition `kind` with status `True` (`status.conditions`).
fn has_condition(vmi: &Vmi, kind: &str) -> bool {
    vmi.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.kind == kind && c.status == "True"))
}

/// The VEP-190 plugins of a call's options (`pluginsJson`, KubeVirt's `setPluginsFromOptions`):
/// none without options or with empty bytes.
///
/// # Errors
/// [`SyncError::PluginsJson`] for bytes that are not a JSON array of `Plugin` objects.
pub(crate) fn plugins_of(
    options: Option<&VirtualMachineOptions>,
) -> Result<Vec<crate::hooks::plugins::Plugin>, SyncError> {
    let json = options.map_or(&[][..], |o| o.plugins_json.as_slice());
    crate::hooks::plugins::decode(json).map_err(SyncError::PluginsJson)
}

impl DomainManager for SyncVmi {
    type Vmi = Vmi;
    type Error = SyncError;

    async fn sync_vmi(
        &self,
        vmi: Vmi,
        options: Option<VirtualMachineOptions>,
    ) -> Result<(), SyncError> {
        // KubeVirt's `setPluginsFromOptions`: the plugins of this call (none without options).
        let plugins = plugins_of(options.as_ref())?;
        self.sync(vmi, &plugins).await
    }

    async fn pause_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        lifecycle::pause(&self.ctx.client()?)
            .await
            .map_err(SyncError::Qmp)
    }

    async fn unpause_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        lifecycle::resume(&self.ctx.client()?)
            .await
            .map_err(SyncError::Qmp)
    }

    async fn reset_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        lifecycle::reset(&self.ctx.client()?)
            .await
            .map_err(SyncError::Qmp)
    }

    /// KubeVirt's `SoftRebootVMI`: through the guest agent (`guest-shutdown` mode `reboot`) when
    /// the VMI has the `AgentConnected` condition, an agent that does not answer counting as
    /// done (KubeVirt ignores libvirt's `VIR_ERR_AGENT_UNRESPONSIVE`); else with the ACPI power
    /// button, the guest's shutdown then resetting the machine (libvirt's fake reboot); refused
    /// when the VMI turns ACPI off.
    async fn soft_reboot_vmi(&self, vmi: Vmi) -> Result<(), SyncError> {
        if has_condition(&vmi, "AgentConnected") {
            return match self
                .ctx
                .info
                .agent
                .reboot(AGENT_SHUTDOWN_TIMEOUT, AGENT_SHUTDOWN_ANSWER)
                .await
            {
                Ok(()) => {
                    info!("soft reboot: guest-shutdown (reboot) through the guest agent");
                    Ok(())
                }
                Err(e @ crate::sync::guest::agent::AgentError::Command { .. }) => {
                    Err(SyncError::Agent(e))
                }
                Err(e) => {
                    info!(reason = %e, "soft reboot: the guest agent is not responding");
                    Ok(())
                }
            };
        }
        let acpi_off = vmi
            .spec
            .domain
            .features
            .as_ref()
            .and_then(|f| f.acpi.as_ref())
            .and_then(|a| a.enabled)
            == Some(false);
        if acpi_off {
            return Err(SyncError::Refused(
                "VMI neither have the agent connected nor the ACPI feature enabled".into(),
            ));
        }
        let client = self.ctx.client()?;
        self.ctx.shared.fake_reboot.store(true, Ordering::SeqCst);
        if let Err(e) = lifecycle::powerdown(&client).await {
            self.ctx.shared.fake_reboot.store(false, Ordering::SeqCst);
            return Err(SyncError::Qmp(e));
        }
        info!("soft reboot: ACPI power button pressed (the guest's shutdown resets it)");
        Ok(())
    }

    /// KubeVirt's `SignalShutdownVMI` signals only a running or paused domain: one already
    /// shutting down or off (its guest powered off, QEMU quitting) is success, also when QEMU's
    /// monitor closed under the power button.
    async fn shutdown_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        self.ctx.shared.graceful.store(true, Ordering::SeqCst);
        let signalable = || {
            let s = self
                .ctx
                .shared
                .status
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            s.shutdown.is_none()
                && matches!(
                    s.state,
                    lifecycle::DomainState::Running | lifecycle::DomainState::Paused
                )
        };
        if !signalable() {
            return Ok(());
        }
        match self.ctx.graceful_shutdown().await {
            Err(SyncError::Qmp(e)) => {
                // The monitor closing is how a QEMU whose guest powered off ends; its SHUTDOWN
                // event may still be on its way to the event task.
                let deadline = tokio::time::Instant::now() + SHUTDOWN_SETTLE;
                while signalable() && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if signalable() {
                    return Err(SyncError::Qmp(e));
                }
                info!(error = %e, "the domain shut down meanwhile");
                Ok(())
            }
            other => other,
        }
    }

    /// Kills QEMU; a QEMU already gone (or never started) is success, as libvirt's destroy of an
    /// inactive domain is for KubeVirt's `KillVMI`.
    async fn kill_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        let alive = |pid: i32| {
            !matches!(
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
                Err(nix::errno::Errno::ESRCH)
            )
        };
        match self.qemu_pid() {
            Some(pid) if alive(pid) => {
                let q = match crate::monitor::qemu::Qemu::from_pid(pid) {
                    Ok(q) => q,
                    Err(_) if !alive(pid) => return Ok(()),
                    Err(e) => return Err(SyncError::StartQemu(e)),
                };
                crate::monitor::grace::kill(&q, crate::monitor::grace::KILL_ESCALATION)
                    .await
                    .map_err(SyncError::StartQemu)
            }
            _ => Ok(()),
        }
    }

    /// Records the deletion (any number of times); the launcher then sends the final delete
    /// notification and exits once QEMU is gone.
    async fn delete_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        self.deleted.send_replace(true);
        Ok(())
    }

    async fn sync_vcpus(
        &self,
        vmi: Vmi,
        _options: Option<VirtualMachineOptions>,
    ) -> Result<(), SyncError> {
        let running = self.running.lock().await;
        let r = running.as_ref().ok_or(SyncError::NoDomain)?;
        reconcile::apply_vcpus(&self.ctx, r, vmi).await
    }

    async fn sync_memory(
        &self,
        vmi: Vmi,
        _options: Option<VirtualMachineOptions>,
    ) -> Result<(), SyncError> {
        let mut running = self.running.lock().await;
        let r = running.as_mut().ok_or(SyncError::NoDomain)?;
        reconcile::apply_memory(&self.ctx, r, vmi).await
    }

    async fn get_domain(&self) -> Result<Option<ApiDomain>, SyncError> {
        self.ctx.info.refresh_interfaces();
        Ok(self.domain())
    }

    async fn get_domain_stats(&self) -> Result<serde_json::Value, SyncError> {
        let pid = self.qemu_pid().ok_or(SyncError::NoDomain)?;
        let mut stats = self.ctx.info.stats(&self.ctx.client()?, pid).await?;
        if let Some(job) = self.migrations().migration_job_info().await {
            stats["MigrateDomainJobInfo"] = job;
        }
        Ok(stats)
    }

    /// `QEMU <major>.<minor>.<micro>`, as KubeVirt's `GetQemuVersion` formats libvirt's
    /// hypervisor version (`virtwrap/cli/libvirt.go`; virt-handler hands the string to the guest
    /// in the downward metrics' `VirtProductInfo`): from QMP `query-version` while QEMU runs;
    /// before a domain exists (and after it is gone) from `qemu --version`, asked once.
    async fn qemu_version(&self) -> Result<String, SyncError> {
        if let Ok(client) = self.ctx.client() {
            if let Ok(v) = client.run(&QueryVersion).await {
                return Ok(format!(
                    "QEMU {}.{}.{}",
                    v.qemu.major, v.qemu.minor, v.qemu.micro
                ));
            }
        }
        let config = &self.ctx.config;
        let probe = config
            .qemu_probe
            .clone()
            .unwrap_or_else(|| crate::sync::qemu_version::QemuProbe::new(config.qemu.clone()));
        match probe.answer().await {
            Some((_, text)) => Ok(format!("QEMU {text}")),
            None => Err(SyncError::NoQemuVersion {
                qemu: config.qemu.clone(),
            }),
        }
    }

    async fn guest_ping(&self, _domain_name: String, timeout: Duration) -> Result<(), SyncError> {
        Ok(self.ctx.info.agent.ping(timeout).await?)
    }

    async fn exec(
        &self,
        _domain_name: String,
        command: String,
        args: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, SyncError> {
        Ok(self.ctx.info.agent.exec(&command, &args, timeout).await?)
    }

    async fn freeze_vmi(
        &self,
        _vmi: Vmi,
        unfreeze_timeout: Duration,
    ) -> Option<Result<(), SyncError>> {
        Some(cmdapi::freeze(&self.ctx, unfreeze_timeout).await)
    }

    async fn unfreeze_vmi(&self, _vmi: Vmi) -> Option<Result<(), SyncError>> {
        Some(cmdapi::unfreeze(&self.ctx).await)
    }

    async fn guest_info(&self) -> Option<String> {
        Some(self.ctx.cmdapi.store.guest_info_json())
    }

    async fn guest_users(&self) -> Option<String> {
        Some(self.ctx.cmdapi.store.users_json())
    }

    async fn guest_filesystems(&self) -> Option<String> {
        Some(self.ctx.cmdapi.store.filesystems_json())
    }

    async fn screenshot(&self, _vmi: Vmi) -> Option<Result<Screenshot, SyncError>> {
        Some(cmdapi::take_screenshot(&self.ctx).await)
    }

    async fn memory_dump(&self, _vmi: Vmi, dump_path: String) -> Option<Result<(), SyncError>> {
        Some(cmdapi::start_memory_dump(&self.ctx, &dump_path))
    }

    async fn backup(&self, vmi: Vmi, options: Vec<u8>) -> Option<Result<(), SyncError>> {
        Some(crate::sync::backup::backup_command(&self.ctx, &self.running, &vmi, &options).await)
    }

    async fn redefine_checkpoint(
        &self,
        vmi: Vmi,
        checkpoint: Vec<u8>,
    ) -> Option<Result<(), CheckpointRefusal<SyncError>>> {
        Some(
            crate::sync::backup::redefine_checkpoint(&self.ctx, &vmi, &checkpoint)
                .await
                .map_err(|(invalid, error)| CheckpointRefusal { invalid, error }),
        )
    }

    async fn dirty_rate(&self) -> Option<Result<i64, SyncError>> {
        Some(cmdapi::dirty_rate_mbs(&self.ctx).await)
    }

    async fn vm_stats(
        &self,
        request: VmStatsRequest,
    ) -> Option<Result<VmStatsResponse, SyncError>> {
        Some(cmdapi::collect_vm_stats(&self.ctx, request, self.get_domain_stats()).await)
    }

    async fn migrate_vmi(
        self: Arc<Self>,
        vmi_json: Vec<u8>,
        options: Vec<u8>,
    ) -> Option<Result<(), SyncError>> {
        Some(self.migrations().migrate(vmi_json, options).await)
    }

    async fn sync_migration_target(
        self: Arc<Self>,
        vmi_json: Vec<u8>,
        options: Option<VirtualMachineOptions>,
    ) -> Option<Result<(), SyncError>> {
        Some(self.migrations().sync_target(vmi_json, options).await)
    }

    async fn cancel_migration(self: Arc<Self>, vmi_json: Vec<u8>) -> Option<Result<(), SyncError>> {
        Some(self.migrations().cancel(vmi_json).await)
    }

    async fn signal_target_pod_cleanup(
        self: Arc<Self>,
        vmi_json: Vec<u8>,
    ) -> Option<Result<(), SyncError>> {
        Some(self.migrations().signal_cleanup(vmi_json).await)
    }

    async fn finalize_migration(
        self: Arc<Self>,
        vmi_json: Vec<u8>,
        options: Option<VirtualMachineOptions>,
    ) -> Option<Result<(), SyncError>> {
        Some(self.migrations().finalize(vmi_json, options).await)
    }

    async fn hotplug_host_devices(&self, vmi: Vmi) -> Option<Result<(), SyncError>> {
        Some(cmdapi::hotplug_sriov(&self.ctx, self.running.clone(), &vmi).await)
    }

    async fn sev_info(&self) -> Option<Result<Vec<u8>, SyncError>> {
        Some(cmdapi::sev_platform_info(&self.ctx).await)
    }

    async fn launch_measurement(&self, vmi: Vmi) -> Option<Result<Vec<u8>, SyncError>> {
        Some(cmdapi::sev_launch_measurement(&self.ctx, &vmi).await)
    }

    async fn inject_launch_secret(
        &self,
        vmi: Vmi,
        options: Vec<u8>,
    ) -> Option<Result<(), SyncError>> {
        Some(cmdapi::sev_inject_secret(&self.ctx, &vmi, &options).await)
    }
}
