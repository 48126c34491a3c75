//! `FreezeVirtualMachine` / `UnfreezeVirtualMachine` through the guest agent, with KubeVirt's
//! auto-thaw timer (`pkg/virt-launcher/virtwrap/storage/fsfreeze.go`, v1.9.0).
//!
//! Freeze: refused during a migration; `guest-fsfreeze-status` first (its error is the RPC's
//! error; already `frozen` is success); `guest-fsfreeze-freeze` (every mounted file system);
//! then any pending auto-thaw is cancelled and, for a non-zero `unfreezeTimeoutSeconds`, a new
//! one armed that thaws when it fires unless Unfreeze or another Freeze came first.
//! Unfreeze: cancels the timer; `guest-fsfreeze-status` says `thawed` → success without a thaw
//! (the guest's thaw hooks must not run twice); otherwise, and when the status query fails,
//! `guest-fsfreeze-thaw`. The agent's error description reaches the caller verbatim (virt-handler
//! and the snapshot controller match `fsfreeze is limited`).

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::warn;

use super::CmdApiError;
use crate::sync::guest::agent::GuestAgent;

/// The message of a freeze during a migration (KubeVirt's).
pub const FREEZE_DURING_MIGRATION: &str = "failed to freeze VMI, VMI is currently during migration";

/// Whether a migration runs according to the domain's migration metadata: started (a
/// `StartTimestamp`) and not ended (no `EndTimestamp`), KubeVirt's
/// `StorageManager.MigrationInProgress` (`storage/manager.go`). Freeze is refused then.
pub fn migration_in_progress(migration: Option<&crate::sync::domain::MigrationMetadata>) -> bool {
    migration.is_some_and(|m| m.start_timestamp.is_some() && m.end_timestamp.is_none())
}

/// How long `guest-fsfreeze-freeze` may take (virt-handler's Freeze deadline is 60 s; Windows VSS
/// can need most of it).
pub const FREEZE_TIMEOUT: Duration = Duration::from_secs(55);

/// How long the status query and the thaw may take (virt-handler's Unfreeze deadline is 20 s).
pub const THAW_TIMEOUT: Duration = Duration::from_secs(15);

/// The freeze state and the auto-thaw timer of one domain.
#[derive(Debug, Default)]
pub struct Freezer {
    auto_thaw: StdMutex<Option<JoinHandle<()>>>,
}

impl Freezer {
    /// Freezes the guest's file systems; `unfreeze_timeout` zero means no auto-thaw.
    ///
    /// # Errors
    /// [`CmdApiError::Refused`] during a migration, [`CmdApiError::Agent`] with the agent's text.
    pub async fn freeze(
        self: &Arc<Self>,
        agent: &Arc<GuestAgent>,
        unfreeze_timeout: Duration,
        migrating: bool,
    ) -> Result<(), CmdApiError> {
        if migrating {
            return Err(CmdApiError::Refused(FREEZE_DURING_MIGRATION.into()));
        }
        let status = agent
            .command("guest-fsfreeze-status", None, THAW_TIMEOUT)
            .await
            .map_err(CmdApiError::agent)?;
        if status.as_str() == Some("frozen") {
            return Ok(());
        }
        agent
            .command("guest-fsfreeze-freeze", None, FREEZE_TIMEOUT)
            .await
            .map_err(CmdApiError::agent)?;
        self.cancel_auto_thaw();
        if !unfreeze_timeout.is_zero() {
            let me = Arc::downgrade(self);
            let agent = agent.clone();
            let timer = tokio::spawn(async move {
                tokio::time::sleep(unfreeze_timeout).await;
                let Some(me) = me.upgrade() else { return };
                warn!(
                    timeout = ?unfreeze_timeout,
                    "Unfreeze was not called for the VMI, initiating unfreeze"
                );
                // Take the timer out first so the thaw does not abort this very task.
                me.auto_thaw
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                if let Err(e) = me.thaw(&agent).await {
                    warn!(error = %e, "auto-thaw failed");
                }
            });
            *self.auto_thaw.lock().unwrap_or_else(|e| e.into_inner()) = Some(timer);
        }
        Ok(())
    }

    /// Thaws the guest's file systems (no-op when the agent says `thawed`).
    ///
    /// # Errors
    /// [`CmdApiError::Agent`] with the agent's text of the failed thaw.
    pub async fn unfreeze(&self, agent: &GuestAgent) -> Result<(), CmdApiError> {
        self.cancel_auto_thaw();
        self.thaw(agent).await
    }

    /// Whether an auto-thaw is armed.
    pub fn auto_thaw_pending(&self) -> bool {
        self.auto_thaw
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    fn cancel_auto_thaw(&self) {
        if let Some(t) = self
            .auto_thaw
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            t.abort();
        }
    }

    async fn thaw(&self, agent: &GuestAgent) -> Result<(), CmdApiError> {
        if let Ok(status) = agent
            .command("guest-fsfreeze-status", None, THAW_TIMEOUT)
            .await
        {
            if status.as_str() == Some("thawed") {
                return Ok(());
            }
        }
        agent
            .command("guest-fsfreeze-thaw", None, THAW_TIMEOUT)
            .await
            .map(|_| ())
            .map_err(CmdApiError::agent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::domain::MigrationMetadata;

    #[test]
    fn a_started_unfinished_migration_is_in_progress() {
        assert!(!migration_in_progress(None));
        let mut m = MigrationMetadata::default();
        assert!(!migration_in_progress(Some(&m)), "accepted, not started");
        m.start_timestamp = Some("2026-12-01T12:00:00Z".into());
        assert!(migration_in_progress(Some(&m)));
        m.end_timestamp = Some("2026-12-01T12:00:09Z".into());
        assert!(!migration_in_progress(Some(&m)), "ended");
    }

    #[tokio::test]
    async fn freeze_during_a_migration_is_refused_before_the_agent_is_asked() {
        // An agent that was never connected: any command would fail with a connect error.
        let agent = Arc::new(GuestAgent::default());
        let freezer = Arc::new(Freezer::default());
        let err = freezer
            .freeze(&agent, Duration::from_secs(60), true)
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), FREEZE_DURING_MIGRATION);
        assert!(!freezer.auto_thaw_pending());
    }
}
