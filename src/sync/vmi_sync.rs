//! SyncVMI: the orchestrator behind the command server, KubeVirt's `LibvirtDomainManager.SyncVMI`
//! (`pkg/virt-launcher/virtwrap/manager.go`, v1.9.0) without libvirt.
//!
//! One sync at a time (a `tokio::sync::Mutex`, KubeVirt's `domainModifyLock`). The first sync of a
//! VMI starts the domain (`start.rs`: facts, convert, QEMU, `cont`); later syncs of the
//! same VMI change nothing, and a changed VMI is applied by diff against the running domain
//! (`reconcile/`). The domain's state and events live in [`crate::sync::state`];
//! each RPC of the [`DomainManager`](crate::sync::rpc::manager::DomainManager) impl
//! (`manager_impl.rs`) is a few lines over them.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{watch, Mutex};
use tracing::info;

use crate::qmp::client::QmpClient;
use crate::qmp::lifecycle::{self, DomainStatus};
use crate::sync::config::{SyncConfig, AGENT_SHUTDOWN_ANSWER, AGENT_SHUTDOWN_TIMEOUT};
use crate::sync::domain::ApiDomain;
use crate::sync::error::SyncError;
use crate::sync::facts::secondary;
use crate::sync::rpc::notify::Notifier;
use crate::sync::state::{Running, Shared};
use crate::vmi::Vmi;

/// KubeVirt's SyncVMI over QEMU: implements the command server's
/// [`DomainManager`](crate::sync::rpc::manager::DomainManager) (`manager_impl.rs`) and the
/// launcher's [`crate::monitor::launcher::SupervisedDomain`].
pub struct SyncVmi {
    pub(crate) config: SyncConfig,
    /// The running domain (`None` before the first sync); its lock serialises syncs (and the
    /// background host-device hotplug, hence shared).
    pub(crate) running: Arc<Mutex<Option<Running>>>,
    pub(crate) shared: Arc<Shared>,
    /// Guest agent, stats names and start timings ([`crate::sync::guest::info`]).
    pub(crate) info: crate::sync::guest::info::DomainInfo,
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
                fake_reboot: AtomicBool::new(false),
            }),
            info: crate::sync::guest::info::DomainInfo::default(),
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
    pub fn start_timings(&self) -> Option<crate::sync::guest::info::StartTimings> {
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

    /// Whether the guest opened the guest agent's channel (`org.qemu.guest_agent.0`): its state
    /// in the domain is `connected`, which follows QEMU's `VSERPORT_CHANGE` as libvirt's
    /// `<channel>` state does (and virt-handler's `AgentConnected` condition after it).
    pub(crate) fn agent_connected(&self) -> bool {
        let domain = self.shared.domain.lock().unwrap_or_else(|e| e.into_inner());
        domain.as_ref().is_some_and(|d| {
            d.spec.devices.channels.iter().any(|c| {
                c.target.name == crate::sync::guest::info::AGENT_CHANNEL
                    && c.target.state.as_deref() == Some(crate::sync::domain::channel_state(true))
            })
        })
    }

    /// The graceful shutdown of libvirt's default mode (`virDomainShutdown` without flags, what
    /// KubeVirt's `SignalShutdownVMI` and its grace-period logic call): libvirt uses the guest
    /// agent only while it is connected to it, which it is while the guest holds the agent's
    /// channel open (`qemuDomainShutdownFlags`: `priv->agent`, opened and closed on
    /// `VSERPORT_CHANGE`). So: `guest-shutdown` through the agent when its channel is connected
    /// ([`SyncVmi::agent_connected`]), and the ACPI power button (QMP `system_powerdown`) at once
    /// when it is not, or when the agent does not take the command. A guest without ACPI
    /// handling but with an agent still powers off within its grace period, and a guest without
    /// an agent gets the button without waiting for one.
    ///
    /// # Errors
    /// [`SyncError::Qmp`] when the power button cannot be pressed (no QMP connection).
    pub(crate) async fn graceful_shutdown(&self) -> Result<(), SyncError> {
        if !self.agent_connected() {
            info!("graceful shutdown: the guest agent's channel is not connected, pressing the ACPI power button");
        } else if self.info.agent.has_socket() {
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

    pub(crate) fn client(&self) -> Result<QmpClient, SyncError> {
        self.shared
            .client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(SyncError::NoDomain)
    }

    /// One sync (SyncVMI): the first starts the domain, later ones apply the changed VMI by
    /// diff; serialised by the `running` lock.
    pub(crate) async fn sync(&self, mut vmi: Vmi) -> Result<(), SyncError> {
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
