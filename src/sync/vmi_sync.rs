//! SyncVMI: the orchestrator behind the command server, KubeVirt's `LibvirtDomainManager.SyncVMI`
//! (`pkg/virt-launcher/virtwrap/manager.go`, v1.9.0) without libvirt.
//!
//! One sync at a time (a `tokio::sync::Mutex`, KubeVirt's `domainModifyLock`). The first sync of a
//! VMI starts the domain (`start.rs`: facts, convert, QEMU, `cont`); later syncs of the
//! same VMI change nothing, and a changed VMI is applied by diff against the running domain
//! (`reconcile/`). The domain's state and events live in [`crate::sync::state`];
//! each RPC of the [`DomainManager`] impl below is a few lines over them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{watch, Mutex};
use tracing::info;

use crate::qmp::client::QmpClient;
use crate::qmp::commands::QueryVersion;
use crate::qmp::lifecycle::{self, DomainStatus};
use crate::sync::cmdapi::screenshot::Screenshot;
use crate::sync::domain::ApiDomain;
use crate::sync::facts::secondary;
use crate::sync::notify::Notifier;
use crate::sync::proto::cmd::v1::{VirtualMachineOptions, VmStatsRequest, VmStatsResponse};
use crate::sync::server::{DomainManager, ExecOutput};
use crate::sync::state::{Running, Shared};
use crate::sync::{SyncConfig, SyncError};
use crate::vmi::Vmi;

/// How long a guest may take to release an unplugged device (`DEVICE_DELETED`).
pub const HOTPLUG_TIMEOUT: Duration = Duration::from_secs(30);

/// How long QEMU may take to answer on QMP after it was started.
pub const QMP_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the graceful shutdown waits for the agent to connect and sync before it presses the
/// ACPI button instead (a guest without an agent costs this much of its grace period).
pub(crate) const AGENT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long it listens for the agent refusing `guest-shutdown` (it says nothing when it obeys).
pub(crate) const AGENT_SHUTDOWN_ANSWER: Duration = Duration::from_secs(1);
/// How long a Shutdown whose power button met a closing monitor waits for the domain to show
/// it shut down (its SHUTDOWN event or QEMU's exit) before it reports the QMP error.
const SHUTDOWN_SETTLE: Duration = Duration::from_secs(2);

/// KubeVirt's SyncVMI over QEMU: implements the command server's [`DomainManager`] and the
/// launcher's [`crate::monitor::launcher::SupervisedDomain`].
pub struct SyncVmi {
    pub(crate) config: SyncConfig,
    /// The running domain (`None` before the first sync); its lock serialises syncs (and the
    /// background host-device hotplug, hence shared).
    pub(crate) running: Arc<Mutex<Option<Running>>>,
    pub(crate) shared: Arc<Shared>,
    /// Guest agent, stats names and start timings ([`crate::sync::info`]).
    pub(crate) info: crate::sync::info::DomainInfo,
    /// Agent poller store, freeze, memory dump and caches ([`crate::sync::cmdapi`]).
    pub(crate) cmdapi: crate::sync::cmdapi::CmdApiState,
    /// Set by DeleteVirtualMachine: the launcher may send its final notification and exit.
    pub(crate) deleted: watch::Sender<bool>,
    /// Live migration on either side ([`crate::sync::migration::launcher`]).
    pub(crate) migration: crate::sync::migration::launcher::MigrationCtl,
}

impl std::fmt::Debug for SyncVmi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncVmi")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl SyncVmi {
    /// A manager with no domain yet; `notifier` receives the domain events (none: not reported).
    pub fn new(config: SyncConfig, notifier: Option<Notifier>) -> SyncVmi {
        let (pid, _) = watch::channel(None);
        SyncVmi {
            config,
            running: Arc::new(Mutex::new(None)),
            shared: Arc::new(Shared {
                domain: StdMutex::new(None),
                status: StdMutex::new(DomainStatus::default()),
                notifier,
                graceful: AtomicBool::new(false),
                pid,
                client: StdMutex::new(None),
                dumping: AtomicBool::new(false),
                migrating: AtomicBool::new(false),
                migrated: AtomicBool::new(false),
            }),
            info: crate::sync::info::DomainInfo::default(),
            cmdapi: crate::sync::cmdapi::CmdApiState::default(),
            deleted: watch::channel(false).0,
            migration: Default::default(),
        }
    }

    /// Waits until virt-handler called DeleteVirtualMachine (true) or `limit` passed (false):
    /// KubeVirt's launcher keeps serving after Shutoff until then, at most 15 s
    /// (`cmd/virt-launcher/virt-launcher.go`, `waitForFinalNotify`).
    pub async fn wait_deleted(&self, limit: Duration) -> bool {
        let mut deleted = self.deleted.subscribe();
        tokio::time::timeout(limit, deleted.wait_for(|d| *d))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// How long the first sync took, split by step (`None` before QEMU runs).
    pub fn start_timings(&self) -> Option<crate::sync::info::StartTimings> {
        self.info.timings()
    }

    /// The current domain (`None` before the first sync).
    pub fn domain(&self) -> Option<ApiDomain> {
        self.shared
            .domain
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The QEMU pid once started.
    pub fn qemu_pid(&self) -> Option<i32> {
        *self.shared.pid.borrow()
    }

    /// The graceful shutdown of libvirt's default mode (`virDomainShutdown` without flags, what
    /// KubeVirt's `SignalShutdownVMI` and its grace-period logic call): the guest agent's
    /// `guest-shutdown` when an agent answers on the domain's channel, the ACPI power button
    /// (QMP `system_powerdown`) when none does or it refuses. So a guest without ACPI handling
    /// but with an agent still powers off within its grace period.
    ///
    /// # Errors
    /// [`SyncError::Qmp`] when the power button cannot be pressed (no QMP connection).
    pub(crate) async fn graceful_shutdown(&self) -> Result<(), SyncError> {
        if self.info.agent.has_socket() {
            match self
                .info
                .agent
                .shutdown(AGENT_SHUTDOWN_TIMEOUT, AGENT_SHUTDOWN_ANSWER)
                .await
            {
                Ok(()) => {
                    info!("graceful shutdown: guest-shutdown through the guest agent");
                    return Ok(());
                }
                Err(e) => {
                    info!(reason = %e, "graceful shutdown: no agent shutdown, pressing the ACPI power button");
                }
            }
        }
        lifecycle::powerdown(&self.client()?)
            .await
            .map_err(SyncError::Qmp)
    }

    /// Starts the guest agent's polls of the domain just started or adopted: interfaces
    /// ([`crate::sync::info`]) and the rest of KubeVirt's agent poller
    /// ([`crate::sync::cmdapi::guest_info`]); changes land in the domain status with a MODIFIED
    /// event.
    pub(crate) fn start_agent_poll(&self) {
        let Ok(client) = self.client() else { return };
        let events = client.events();
        let shared = self.shared.clone();
        self.info.start_interface_poller(
            client,
            Arc::new(move |list| shared.set_guest_interfaces(list)),
        );
        let shared = self.shared.clone();
        self.cmdapi.start_poller(
            self.info.agent.clone(),
            self.config.agent_poll,
            Arc::new(move |update| shared.apply_agent_update(update)),
            Some(events),
        );
    }

    pub(crate) fn client(&self) -> Result<QmpClient, SyncError> {
        self.shared
            .client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(SyncError::NoDomain)
    }

    async fn sync(&self, mut vmi: Vmi) -> Result<(), SyncError> {
        let mut running = self.running.lock().await;
        if let Some(r) = running.as_ref() {
            r.keep_firmware_uuid(&mut vmi);
        }
        let cfg = crate::vmi::DefaultsConfig::for_vmi(&vmi);
        vmi.apply_defaults(&cfg);
        if let Err(errors) = vmi.validate() {
            let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            return Err(SyncError::InvalidVmi(text.join("; ")));
        }
        let volume_status = vmi.status.as_ref().map(|s| &s.volume_status);
        let spec = serde_json::to_value((&vmi.spec, volume_status, secondary::status_key(&vmi)))
            .map_err(SyncError::EncodeDomain)?;
        if let Some(r) = running.as_mut() {
            if r.spec == spec {
                info!("domain is up to date");
            } else {
                self.hotplug(r, &vmi).await?;
                r.spec = spec;
            }
            return Ok(());
        }
        let r = self.start(&vmi, spec).await?;
        *running = Some(r);
        Ok(())
    }
}

fn decode_failed(what: &str) -> SyncError {
    SyncError::Unsupported(what.to_string())
}

impl DomainManager for SyncVmi {
    type Vmi = Vmi;
    type Error = SyncError;

    async fn sync_vmi(
        &self,
        vmi: Vmi,
        _options: Option<VirtualMachineOptions>,
    ) -> Result<(), SyncError> {
        self.sync(vmi).await
    }

    async fn pause_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        lifecycle::pause(&self.client()?)
            .await
            .map_err(SyncError::Qmp)
    }

    async fn unpause_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        lifecycle::resume(&self.client()?)
            .await
            .map_err(SyncError::Qmp)
    }

    async fn reset_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        lifecycle::reset(&self.client()?)
            .await
            .map_err(SyncError::Qmp)
    }

    async fn soft_reboot_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        Err(decode_failed("soft reboot needs the guest agent"))
    }

    /// KubeVirt's `SignalShutdownVMI` signals only a running or paused domain: one already
    /// shutting down or off (its guest powered off, QEMU quitting) is success, also when QEMU's
    /// monitor closed under the power button.
    async fn shutdown_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        self.shared.graceful.store(true, Ordering::SeqCst);
        let signalable = || {
            let s = self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
            s.shutdown.is_none()
                && matches!(
                    s.state,
                    lifecycle::DomainState::Running | lifecycle::DomainState::Paused
                )
        };
        if !signalable() {
            return Ok(());
        }
        match self.graceful_shutdown().await {
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
        self.apply_vcpus(vmi).await
    }

    async fn sync_memory(
        &self,
        vmi: Vmi,
        _options: Option<VirtualMachineOptions>,
    ) -> Result<(), SyncError> {
        self.apply_memory(vmi).await
    }

    async fn get_domain(&self) -> Result<Option<ApiDomain>, SyncError> {
        self.info.refresh_interfaces();
        Ok(self.domain())
    }

    async fn get_domain_stats(&self) -> Result<serde_json::Value, SyncError> {
        let pid = self.qemu_pid().ok_or(SyncError::NoDomain)?;
        let mut stats = self.info.stats(&self.client()?, pid).await?;
        if let Some(job) = self.migration_job_info().await {
            stats["MigrateDomainJobInfo"] = job;
        }
        Ok(stats)
    }

    /// QMP `query-version` while QEMU runs; before a domain exists (and after it is gone) the
    /// answer of `qemu --version`, asked once.
    async fn qemu_version(&self) -> Result<String, SyncError> {
        if let Ok(client) = self.client() {
            if let Ok(v) = client.run(&QueryVersion).await {
                return Ok(format!(
                    "{}.{}.{}",
                    v.qemu.major, v.qemu.minor, v.qemu.micro
                ));
            }
        }
        let probe = self
            .config
            .qemu_probe
            .clone()
            .unwrap_or_else(|| crate::sync::config::QemuProbe::new(self.config.qemu.clone()));
        match probe.answer().await {
            Some((_, text)) => Ok(text),
            None => Err(SyncError::Unsupported(format!(
                "{} --version gave no version",
                self.config.qemu.display()
            ))),
        }
    }

    async fn guest_ping(&self, _domain_name: String, timeout: Duration) -> Result<(), SyncError> {
        self.info.agent.ping(timeout).await
    }

    async fn exec(
        &self,
        _domain_name: String,
        command: String,
        args: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, SyncError> {
        self.info.agent.exec(&command, &args, timeout).await
    }

    async fn freeze_vmi(
        &self,
        _vmi: Vmi,
        unfreeze_timeout: Duration,
    ) -> Option<Result<(), SyncError>> {
        Some(self.freeze(unfreeze_timeout).await)
    }

    async fn unfreeze_vmi(&self, _vmi: Vmi) -> Option<Result<(), SyncError>> {
        Some(self.unfreeze().await)
    }

    async fn guest_info(&self) -> Option<String> {
        Some(self.cmdapi.store.guest_info_json())
    }

    async fn guest_users(&self) -> Option<String> {
        Some(self.cmdapi.store.users_json())
    }

    async fn guest_filesystems(&self) -> Option<String> {
        Some(self.cmdapi.store.filesystems_json())
    }

    async fn screenshot(&self, _vmi: Vmi) -> Option<Result<Screenshot, SyncError>> {
        Some(self.take_screenshot().await)
    }

    async fn memory_dump(&self, _vmi: Vmi, dump_path: String) -> Option<Result<(), SyncError>> {
        Some(self.start_memory_dump(&dump_path))
    }

    async fn dirty_rate(&self) -> Option<Result<i64, SyncError>> {
        Some(self.dirty_rate_mbs().await)
    }

    async fn vm_stats(
        &self,
        request: VmStatsRequest,
    ) -> Option<Result<VmStatsResponse, SyncError>> {
        Some(self.collect_vm_stats(request).await)
    }

    async fn migrate_vmi(
        self: Arc<Self>,
        vmi_json: Vec<u8>,
        options: Vec<u8>,
    ) -> Option<Result<(), SyncError>> {
        Some(self.migrate(vmi_json, options).await)
    }

    async fn sync_migration_target(
        self: Arc<Self>,
        vmi_json: Vec<u8>,
        options: Option<VirtualMachineOptions>,
    ) -> Option<Result<(), SyncError>> {
        Some(self.sync_target(vmi_json, options).await)
    }

    async fn cancel_migration(self: Arc<Self>, vmi_json: Vec<u8>) -> Option<Result<(), SyncError>> {
        Some(self.cancel(vmi_json).await)
    }

    async fn signal_target_pod_cleanup(
        self: Arc<Self>,
        vmi_json: Vec<u8>,
    ) -> Option<Result<(), SyncError>> {
        Some(self.signal_cleanup(vmi_json).await)
    }

    async fn finalize_migration(
        self: Arc<Self>,
        vmi_json: Vec<u8>,
        options: Option<VirtualMachineOptions>,
    ) -> Option<Result<(), SyncError>> {
        Some(self.finalize(vmi_json, options).await)
    }

    async fn hotplug_host_devices(&self, vmi: Vmi) -> Option<Result<(), SyncError>> {
        Some(self.hotplug_sriov(&vmi).await)
    }

    async fn sev_info(&self) -> Option<Result<Vec<u8>, SyncError>> {
        Some(self.sev_platform_info().await)
    }

    async fn launch_measurement(&self, _vmi: Vmi) -> Option<Result<Vec<u8>, SyncError>> {
        Some(self.sev_launch_measurement().await)
    }

    async fn inject_launch_secret(
        &self,
        _vmi: Vmi,
        options: Vec<u8>,
    ) -> Option<Result<(), SyncError>> {
        Some(self.sev_inject_secret(&options).await)
    }
}
