//! The domain as the launcher's supervision sees it: the monitor's grace-period control
//! ([`DomainControl`]: graceful shutdown mark, ACPI power button), its process view
//! ([`SupervisedDomain`]: QEMU's pid, whether its exit was expected); KubeVirt's final
//! notification when the domain is gone is [`crate::sync::state::Shared::final_notify`].

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::monitor::grace::{DomainControl, Ending};
use crate::monitor::launcher::SupervisedDomain;
use crate::monitor::MonitorError;
use crate::qmp::lifecycle;
use crate::sync::error::SyncError;
use crate::sync::start::log_tail;
use crate::sync::vmi_sync::SyncVmi;

/// How long [`SupervisedDomain::check_exit`] waits for the event task to record QEMU's exit.
const EXIT_SEEN: Duration = Duration::from_secs(2);

impl DomainControl for SyncVmi {
    fn mark_graceful_shutdown(&self) {
        self.ctx.shared.graceful.store(true, Ordering::SeqCst);
        // A metadata-only change, notified as MODIFIED as KubeVirt's metadata cache does.
        self.ctx.shared.update_domain(|d| {
            let gp = d
                .spec
                .metadata
                .kubevirt
                .grace_period
                .get_or_insert_with(Default::default);
            let changed = gp.marked_for_graceful_shutdown != Some(true);
            gp.marked_for_graceful_shutdown = Some(true);
            if gp.deletion_timestamp.is_none() {
                gp.deletion_timestamp = Some(crate::sync::domain::kubernetes_time(
                    std::time::SystemTime::now(),
                ));
            }
            changed
        });
    }

    async fn power_button(&self) -> Result<(), MonitorError> {
        self.ctx.graceful_shutdown().await.map_err(|e| match e {
            SyncError::Qmp(e) => MonitorError::PowerButton(std::io::Error::other(e.to_string())),
            other => MonitorError::QemuExited {
                reason: other.to_string(),
            },
        })
    }
}

impl SupervisedDomain for SyncVmi {
    async fn started(&self) -> Result<i32, MonitorError> {
        let mut rx = self.ctx.shared.pid.subscribe();
        let pid = match rx.wait_for(|p| p.is_some()).await {
            Ok(p) => *p,
            Err(_) => None,
        };
        match pid {
            Some(pid) => Ok(pid),
            None => std::future::pending().await,
        }
    }

    async fn check_exit(&self, ending: Ending) -> Result<(), MonitorError> {
        if ending != Ending::ExitedOnItsOwn || self.ctx.shared.graceful.load(Ordering::SeqCst) {
            return Ok(());
        }
        // The `quit` after a completed outgoing migration (Shutoff/Migrated): the domain lives
        // on in the target pod. KubeVirt's launcher sends its final notification and exits 0
        // (`cmd/virt-launcher/virt-launcher.go`, v1.9.0), so the source pod completes instead
        // of ending Failed.
        if self.ctx.shared.job() == crate::sync::state::Job::MigratedAway {
            return Ok(());
        }
        // A migration target whose QEMU ended before its incoming migration completed: that
        // migration failed (the source reports it and runs on); the domain never was this pod's,
        // and KubeVirt's target launcher exits 0 after its final notification.
        if matches!(
            self.migration.incoming(),
            crate::sync::migration::launcher::Incoming::Pending
                | crate::sync::migration::launcher::Incoming::Failed
        ) {
            return Ok(());
        }
        // Let the event task see the exit (Shutoff) and the SHUTDOWN QEMU sent before it: it runs
        // on this same current-thread runtime, so only while this waits asynchronously.
        let deadline = tokio::time::Instant::now() + EXIT_SEEN;
        while self.ctx.shared.status().state != lifecycle::DomainState::Shutoff
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let status = self.ctx.shared.status();
        match status.shutdown {
            Some(lifecycle::ShutdownOrigin::Guest) | Some(lifecycle::ShutdownOrigin::Host) => {
                Ok(())
            }
            _ => Err(MonitorError::QemuExited {
                reason: format!(
                    "QEMU exited without a shutdown request: {}",
                    log_tail(&self.ctx.config.qemu_log)
                ),
            }),
        }
    }
}
