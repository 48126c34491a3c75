//! SyncVMI: the orchestrator behind the command server, KubeVirt's `LibvirtDomainManager.SyncVMI`
//! (`pkg/virt-launcher/virtwrap/manager.go`, v1.9.0) without libvirt.
//!
//! [`SyncVmi`] is the dispatcher: it keeps the sync lock (a `tokio::sync::Mutex` over the
//! running domain, KubeVirt's `domainModifyLock`), the migration control and the deletion
//! signal, and calls down into the features, each of which takes the domain context
//! ([`DomainCtx`]) and, under the lock, the running domain: every VMI is admitted first
//! ([`crate::sync::admit`]); the first sync starts the domain ([`crate::sync::start`]: facts,
//! convert, QEMU, `cont`); later syncs of the same VMI change nothing, and a changed VMI is
//! applied by diff against the running domain ([`crate::sync::reconcile`]). Each RPC of the
//! [`DomainManager`](crate::sync::rpc::manager::DomainManager) impl (`manager_impl.rs`) is a
//! few lines over them; the domain's state and events live in [`crate::sync::state`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Mutex};
use tracing::info;

use crate::sync::admit::admit;
use crate::sync::config::SyncConfig;
use crate::sync::ctx::DomainCtx;
use crate::sync::domain::ApiDomain;
use crate::sync::error::SyncError;
use crate::sync::migration::launcher::{MigrationCtl, MigrationCtx};
use crate::sync::rpc::notify::Notifier;
use crate::sync::state::Running;
use crate::sync::{reconcile, start};
use crate::vmi::Vmi;

/// KubeVirt's SyncVMI over QEMU: implements the command server's
/// [`DomainManager`](crate::sync::rpc::manager::DomainManager) (`manager_impl.rs`) and the
/// launcher's [`crate::monitor::launcher::SupervisedDomain`] (`supervision.rs`).
pub struct SyncVmi {
    /// What the features take: settings, shared state, domain info, cmd API state.
    pub(crate) ctx: Arc<DomainCtx>,
    /// The running domain (`None` before the first sync); its lock serialises syncs (and the
    /// background host-device hotplug, hence shared).
    pub(crate) running: Arc<Mutex<Option<Running>>>,
    /// Set by DeleteVirtualMachine: the launcher may send its final notification and exit.
    pub(crate) deleted: watch::Sender<bool>,
    /// Live migration on either side ([`crate::sync::migration::launcher`]).
    pub(crate) migration: Arc<MigrationCtl>,
}

impl std::fmt::Debug for SyncVmi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncVmi")
            .field("config", &self.ctx.config)
            .finish_non_exhaustive()
    }
}

impl SyncVmi {
    /// A manager with no domain yet; `notifier` receives the domain events (none: not reported).
    pub fn new(config: SyncConfig, notifier: Option<Notifier>) -> SyncVmi {
        SyncVmi {
            ctx: Arc::new(DomainCtx::new(config, notifier)),
            running: Arc::new(Mutex::new(None)),
            deleted: watch::channel(false).0,
            migration: Default::default(),
        }
    }

    /// The parts the migration RPCs take ([`MigrationCtx`]), shared with this dispatcher.
    pub(crate) fn migrations(&self) -> MigrationCtx {
        MigrationCtx {
            ctx: self.ctx.clone(),
            running: self.running.clone(),
            ctl: self.migration.clone(),
            deleted: self.deleted.clone(),
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

    /// Sends KubeVirt's final notification (domain deleted) and waits up to `wait` for its
    /// delivery ([`crate::sync::state::Shared::final_notify`]).
    pub async fn final_notify(&self, wait: Duration) {
        self.ctx.shared.final_notify(wait).await;
    }

    /// How long the first sync took, split by step (`None` before QEMU runs).
    pub fn start_timings(&self) -> Option<crate::sync::guest::info::StartTimings> {
        self.ctx.info.timings()
    }

    /// The current domain (`None` before the first sync).
    pub fn domain(&self) -> Option<ApiDomain> {
        self.ctx.domain()
    }

    /// The QEMU pid once started.
    pub fn qemu_pid(&self) -> Option<i32> {
        self.ctx.qemu_pid()
    }

    /// One sync (SyncVMI): the first starts the domain, later ones apply the changed VMI by
    /// diff; serialised by the `running` lock.
    pub(crate) async fn sync(
        &self,
        vmi: Vmi,
        plugins: &[crate::hooks::plugins::Plugin],
    ) -> Result<(), SyncError> {
        let mut running = self.running.lock().await;
        let admitted = admit(vmi, running.as_ref().map(|r| r.firmware_uuid.as_str()))?;
        if let Some(r) = running.as_mut() {
            if r.spec == admitted.key {
                info!("domain is up to date");
            } else {
                reconcile::hotplug(&self.ctx, r, &admitted.vmi).await?;
                r.spec = admitted.key;
            }
            return Ok(());
        }
        let started = start::start(&self.ctx, &admitted.vmi, admitted.key, plugins).await?;
        self.migration.set_boot_argv(started.boot_argv);
        *running = Some(started.running);
        Ok(())
    }
}
