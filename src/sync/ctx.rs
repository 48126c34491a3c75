//! The domain context: what every feature of the orchestrator takes (start, recovery, the sync
//! diff, the cmd API, migration), so that none of them extends the dispatcher
//! ([`crate::sync::vmi_sync::SyncVmi`]), which keeps only the sync lock, the migration control
//! and the deletion signal and calls down into them. Cloud Hypervisor's `Vm` handle beside its
//! `Vmm` dispatcher plays the same part.
//!
//! [`DomainCtx`] holds the launcher's settings ([`SyncConfig`]), the state shared with the QMP
//! event task ([`Shared`]: the `api.Domain`, the lifecycle status, the QMP client, the job), the
//! domain information ([`DomainInfo`]: guest agent, stats names, start timings) and the cmd API
//! state ([`CmdApiState`]: agent poller store, freeze, memory dump, caches).

use std::sync::Arc;

use tracing::info;

use crate::qmp::client::QmpClient;
use crate::qmp::lifecycle;
use crate::sync::cmdapi::CmdApiState;
use crate::sync::config::{SyncConfig, AGENT_SHUTDOWN_ANSWER, AGENT_SHUTDOWN_TIMEOUT};
use crate::sync::domain::ApiDomain;
use crate::sync::error::SyncError;
use crate::sync::guest::info::DomainInfo;
use crate::sync::rpc::notify::Notifier;
use crate::sync::state::Shared;

/// The domain's context (see the module doc).
pub(crate) struct DomainCtx {
    /// The launcher's settings.
    pub(crate) config: SyncConfig,
    /// The state shared with the event task.
    pub(crate) shared: Arc<Shared>,
    /// Guest agent, stats names and start timings.
    pub(crate) info: DomainInfo,
    /// Agent poller store, freeze, memory dump and caches.
    pub(crate) cmdapi: CmdApiState,
    /// The backup metadata, the running backup and the checkpoints.
    pub(crate) backups: crate::sync::backup::Backups,
}

impl DomainCtx {
    /// The context of a launcher with no domain yet; `notifier` receives the domain events.
    pub(crate) fn new(config: SyncConfig, notifier: Option<Notifier>) -> DomainCtx {
        DomainCtx {
            config,
            shared: Arc::new(Shared::new(notifier)),
            info: DomainInfo::default(),
            cmdapi: CmdApiState::default(),
            backups: crate::sync::backup::Backups::default(),
        }
    }

    /// The current domain (`None` before the first sync).
    pub(crate) fn domain(&self) -> Option<ApiDomain> {
        self.shared
            .domain
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The QEMU pid once started.
    pub(crate) fn qemu_pid(&self) -> Option<i32> {
        *self.shared.pid.borrow()
    }

    /// The QMP client of the running domain.
    ///
    /// # Errors
    /// [`SyncError::NoDomain`] before QEMU runs.
    pub(crate) fn client(&self) -> Result<QmpClient, SyncError> {
        self.shared
            .client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(SyncError::NoDomain)
    }

    /// The graceful shutdown (what KubeVirt's `SignalShutdownVMI` and its grace-period logic
    /// call, libvirt's `virDomainShutdown` without flags): `guest-shutdown` through the guest
    /// agent when its channel is connected (waiting at most [`AGENT_SHUTDOWN_TIMEOUT`] for the
    /// agent), else, or when the agent does not take the command, the ACPI power button (QMP
    /// `system_powerdown`). As libvirt's `qemuDomainShutdownFlags`, whose agent handle exists
    /// only while the channel is connected, a guest whose agent has not opened its port yet is
    /// not waited for: the button is pressed at once. Callers repeat the request (virt-handler
    /// every 5 s, [`crate::monitor::grace::supervise`] likewise), so a guest without ACPI
    /// handling powers off through its agent once the agent is up.
    ///
    /// # Errors
    /// [`SyncError::Qmp`] when the power button cannot be pressed (no QMP connection).
    pub(crate) async fn graceful_shutdown(&self) -> Result<(), SyncError> {
        if !self.agent_channel_connected() {
            info!("graceful shutdown: the guest agent's channel is not connected, pressing the ACPI power button");
        } else {
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

    /// Whether the domain has a guest agent socket and its channel is connected (the domain's
    /// `org.qemu.guest_agent.0` channel state, kept by QEMU's `VSERPORT_CHANGE` events).
    pub(crate) fn agent_channel_connected(&self) -> bool {
        self.info.agent.has_socket()
            && self
                .shared
                .domain
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|d| {
                    d.spec
                        .channel_connected(crate::sync::guest::info::AGENT_CHANNEL)
                })
    }

    /// Starts the guest agent's polls of the domain just started or adopted: interfaces
    /// ([`crate::sync::guest::info`]) and the rest of KubeVirt's agent poller
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
}
