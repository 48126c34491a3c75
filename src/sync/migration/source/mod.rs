//! The source launcher's half of a migration, on the QMP and control-channel level: send the
//! running domain's definition, configure QEMU as KubeVirt configures libvirt (bandwidth,
//! auto-converge, multifd, `pause-before-switchover`), mirror the local disks to the target's
//! NBD server, run the RAM migration under the progress and completion timeouts, complete the
//! mirrors at `pre-switchover`, `migrate-continue`, and report the outcome to the target.
//!
//! Mirrors the behaviour of libvirt's Begin/Perform/Confirm (`qemuMigrationSrcRun`,
//! `src/qemu/qemu_migration.c`) with KubeVirt's monitor policy (`handleLegacyConvergence`,
//! `live-migration-source.go`, v1.9.0): poll every 400 ms, abort after `ProgressTimeout` seconds
//! without the remaining data shrinking, or after the completion deadline. When the options allow
//! workload disruption and the completion deadline passes, the source instead switches to
//! post-copy (`migrate-start-postcopy`, when post-copy is allowed) or pauses the guest (the
//! deadline doubled), as KubeVirt's `handleLegacyConvergence` does; a post-copy migration is never
//! aborted (a cancel then fails, as libvirt refuses it). On any failure before post-copy the
//! mirrors' NBD connections are cut, the mirrors force-cancelled, QEMU's migration cancelled, and
//! the source resumed if it was running; after post-copy started the guest's state lives on the
//! target and the source stays paused (libvirt's Paused/PostcopyFailed).
//!
//! Unlike libvirt, which lets QEMU dial the NBD server, the launcher carries each mirror's NBD
//! connection itself (`mirrors::NbdLink`), so that a target that stops reading cannot wedge the source
//! QEMU: the monitoring queries are bounded by the progress timeout, and on failure the
//! launcher closes its end, which fails QEMU's pending NBD writes at once.
//!
//! The parts: [`capabilities`](mod@capabilities) (what QEMU and the target enable), [`mirrors`] (the disk mirrors
//! and their NBD connections, their completion and the roll-back), and [`monitor`] (the RAM
//! migration under KubeVirt's timeouts, its `migrationMonitor`).

mod capabilities;
pub mod libvirt;
mod mirrors;
mod monitor;

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use crate::qmp::QmpClient;
use crate::sync::migration::protocol::{
    hello_as_source, read_message, write_message, Message, Outcome, ProtocolError, RunningDomain,
};
use crate::sync::migration::{MigrationError, MigrationOptions};

pub use capabilities::{capabilities, set_capabilities};

/// KubeVirt's monitor interval.
pub const POLL_INTERVAL: Duration = Duration::from_millis(400);

/// How long the source waits for the target's answer to Prepare (QEMU start included) and to
/// the outcome, and for the target to take each message it sends (the Hello, the Prepare, the
/// outcome of a completed migration): the launcher's runtime has one thread, and nothing on the
/// control channel may wait on the peer without a bound.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(120);

/// How long the source tries to tell the target that the migration failed before it records
/// the failure itself.
pub const FAILED_OUTCOME_TIMEOUT: Duration = Duration::from_secs(5);

/// What the source needs besides the definition.
#[derive(Debug, Clone)]
pub struct SourcePlan {
    /// The stream socket (`<uid>-49152-source.sock` in this pod).
    pub stream: PathBuf,
    /// The NBD socket (`<uid>-49153-source.sock` in this pod).
    pub nbd: PathBuf,
    /// virt-handler's options.
    pub options: MigrationOptions,
    /// Memory plus copied disk bytes, for the completion deadline.
    pub data_bytes: u64,
}

/// A successful migration's figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceEnd {
    /// QEMU's total time in ms.
    pub total_ms: u64,
    /// QEMU's downtime in ms.
    pub downtime_ms: u64,
    /// The migration completed in post-copy.
    pub post_copy: bool,
}

/// A change of the migration's mode while it runs, for `spec.metadata.kubevirt.migration.mode`
/// (KubeVirt's `updateVMIMigrationMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceEvent {
    /// `migrate-start-postcopy` was accepted: mode `PostCopy`; the guest now runs on the target
    /// and the migration can no longer be cancelled.
    PostCopy,
    /// The guest was paused to let pre-copy converge (disruption allowed, post-copy not): mode
    /// `Paused`.
    Paused,
}

impl SourceEvent {
    /// The metadata `Mode` value (`v1.MigrationPostCopy`, `v1.MigrationPaused`).
    pub fn mode(self) -> &'static str {
        match self {
            SourceEvent::PostCopy => "PostCopy",
            SourceEvent::Paused => "Paused",
        }
    }
}

/// Runs the migration of the QEMU behind `qmp` over `control` (connected to the target's
/// control socket through the proxy). `domain` is the running definition (its `capabilities`
/// and `multifd_channels` are filled from the options here). `abort` turning true cancels.
///
/// On success the source QEMU is in `postmigrate` (the caller stops it). On failure the source
/// runs again (or stays paused if it was) and the error is the failure reason. Mode changes are
/// dropped: see [`run_source_with`].
pub async fn run_source<S: AsyncRead + AsyncWrite + Unpin>(
    control: S,
    qmp: &QmpClient,
    domain: RunningDomain,
    plan: &SourcePlan,
    abort: watch::Receiver<bool>,
) -> Result<SourceEnd, MigrationError> {
    run_source_with(control, qmp, domain, plan, abort, &mut |_| {}).await
}

/// [`run_source`], calling `on_event` when the mode changes (post-copy started, guest paused)
/// so that the caller records it in the migration metadata at once, as virt-handler expects.
///
/// Post-copy and multifd together need QEMU 10.0 or later (the multifd + post-copy series of
/// late 2024): QEMU 7.2 accepts both capabilities, but its target aborts
/// (`yank_unregister_instance` assertion) when post-copy starts. On an older QEMU (the QMP
/// greeting's version), or when QEMU refuses the pair, post-copy (the policy's explicit choice)
/// wins and the migration runs on one channel, on both sides: KubeVirt's defaults send
/// `ParallelMigrationThreads: 8` with any post-copy policy. The source's capabilities are set
/// before the definition goes to the target, so the target mirrors what the source runs.
pub async fn run_source_with<S: AsyncRead + AsyncWrite + Unpin>(
    mut control: S,
    qmp: &QmpClient,
    mut domain: RunningDomain,
    plan: &SourcePlan,
    mut abort: watch::Receiver<bool>,
    on_event: &mut (dyn FnMut(SourceEvent) + Send),
) -> Result<SourceEnd, MigrationError> {
    capabilities::negotiate(qmp, &plan.options, &mut domain, true).await?;
    let was_running = !domain.paused;

    timeout(hello_as_source(&mut control), "the target's Hello").await??;
    timeout(
        write_message(&mut control, &Message::Prepare(Box::new(domain.clone()))),
        "the target reading the Prepare",
    )
    .await??;
    let ready = match timeout(read_message(&mut control), "the target's Ready").await?? {
        Message::Ready(r) => r,
        Message::Failed { reason } => return Err(MigrationError::Peer(reason)),
        other => {
            return Err(ProtocolError::Unexpected {
                expected: "Ready",
                got: other.kind(),
            }
            .into())
        }
    };

    let mut mirrors = Vec::new();
    let mut post_copy = monitor::PostCopy::default();
    let result = monitor::migrate(
        qmp,
        &domain,
        &ready.nbd_exports,
        plan,
        &mut mirrors,
        &mut abort,
        &mut post_copy,
        on_event,
    )
    .await;
    // On failure the mirrors' connections are cut first: QEMU may be blocked on their writes.
    if result.is_err() {
        mirrors::cut_links(&mut mirrors);
    }
    // After post-copy started the running guest is the target's: never resume the source. A
    // failure between `migrate-start-postcopy` and QEMU entering post-copy (the mirrors'
    // completion at `pre-switchover`, the vCPU stop) leaves the whole guest on the source: QEMU
    // then reports `failed` (and restarts the vCPUs itself) or still waits, and it rolls back.
    let post_copy = if result.is_err() && post_copy.requested && !post_copy.entered {
        monitor::entered_post_copy(qmp).await
    } else {
        post_copy.requested
    };
    let was_running = was_running && !post_copy;
    match result {
        Ok(end) => {
            timeout(
                write_message(
                    &mut control,
                    &Message::Outcome(Outcome {
                        completed: true,
                        reason: None,
                    }),
                ),
                "the target reading the outcome",
            )
            .await??;
            match timeout(read_message(&mut control), "the target's Done").await? {
                Ok(Message::Done) => Ok(end),
                Ok(Message::Failed { reason }) => {
                    // The target could not take over: run here again.
                    if was_running {
                        let _ = crate::qmp::lifecycle::resume(qmp).await;
                    }
                    Err(MigrationError::Peer(reason))
                }
                Ok(other) => Err(ProtocolError::Unexpected {
                    expected: "Done",
                    got: other.kind(),
                }
                .into()),
                Err(e) => {
                    if was_running {
                        let _ = crate::qmp::lifecycle::resume(qmp).await;
                    }
                    Err(e.into())
                }
            }
        }
        Err(e) => {
            // After post-copy started nothing can be rolled back (the guest's RAM is partly on
            // the target, a cancel would only break the target too): the source stays paused.
            let e = if post_copy {
                e
            } else {
                rolled_back(e, mirrors::roll_back(qmp, &mirrors, was_running).await)
            };
            // Best effort, and briefly: the failure is recorded once this returns, and a target
            // that stopped reading learns it from the closed channel.
            let _ = tokio::time::timeout(
                FAILED_OUTCOME_TIMEOUT,
                write_message(
                    &mut control,
                    &Message::Outcome(Outcome {
                        completed: false,
                        reason: Some(e.failure_reason()),
                    }),
                ),
            )
            .await;
            Err(e)
        }
    }
}

/// The error of a migration that failed with `failed` and was rolled back with the mirrors'
/// jobs `left` still running: `failed` itself when every job ended, else
/// [`MigrationError::RollBack`].
fn rolled_back(failed: MigrationError, left: mirrors::JobsLeft) -> MigrationError {
    if left.is_empty() {
        return failed;
    }
    MigrationError::RollBack {
        failed: Box::new(failed),
        jobs: left.jobs().to_vec(),
        after: mirrors::ROLL_BACK_TIMEOUT,
    }
}

async fn timeout<T>(
    f: impl std::future::Future<Output = T>,
    what: &str,
) -> Result<T, MigrationError> {
    tokio::time::timeout(PEER_TIMEOUT, f).await.map_err(|_| {
        MigrationError::Timeout(format!("no answer from {what} within {PEER_TIMEOUT:?}"))
    })
}

/// The versioned machine type the QEMU behind `qmp` runs (`qom-get /machine type`, e.g.
/// `pc-q35-7.2-machine` → `pc-q35-7.2`): what the target must start with, as libvirt resolves
/// an alias such as `q35` once and keeps the result in the live XML.
pub async fn resolved_machine(qmp: &QmpClient) -> Result<String, MigrationError> {
    let v = qmp
        .run(&crate::qmp::commands::QomGet {
            path: "/machine".into(),
            property: "type".into(),
        })
        .await?;
    let t = v.as_str().unwrap_or_default();
    t.strip_suffix("-machine")
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| MigrationError::Qemu(format!("unexpected machine type {t:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roll_back_that_leaves_mirrors_running_is_in_the_failure_reason() {
        let stuck = || MigrationError::Timeout("stuck for 5 seconds".into());
        let none = rolled_back(stuck(), mirrors::JobsLeft(Vec::new()));
        assert_eq!(
            none.failure_reason(),
            "migration aborted: stuck for 5 seconds"
        );
        let left = mirrors::JobsLeft(vec!["drive-ua-rootdisk".into(), "drive-ua-data".into()]);
        let e = rolled_back(stuck(), left.clone());
        assert_eq!(
            e.failure_reason(),
            "migration aborted: stuck for 5 seconds; the roll-back left the disk mirrors \
             drive-ua-rootdisk, drive-ua-data running 30 seconds after their cancel"
        );
        assert!(!e.is_abort());
        // A cancel stays a cancel (AbortStatus Succeeded), its reason KubeVirt's.
        let e = rolled_back(MigrationError::Aborted, left);
        assert!(e.is_abort());
        assert!(
            e.failure_reason()
                .starts_with(crate::sync::migration::metadata::ABORTED_REASON),
            "{}",
            e.failure_reason()
        );
    }
}
