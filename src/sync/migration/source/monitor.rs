//! The RAM migration as KubeVirt's `migrationMonitor` watches it (`live-migration-source.go`,
//! v1.9.0): poll every [`POLL_INTERVAL`], fail on no progress or past the completion deadline,
//! and, when disruption is allowed, switch to post-copy or pause the guest instead.

use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::mirrors::{complete_mirrors, mirrors_ready, start_mirrors, Mirror};
use super::{SourceEnd, SourceEvent, SourcePlan, PEER_TIMEOUT, POLL_INTERVAL};
use crate::qmp::client::EventStream;
use crate::qmp::commands::Command;
use crate::qmp::migration::{
    Migrate, MigrateContinue, MigrateSetParameters, MigrateStartPostcopy, MigrationInfo,
    QueryBlockJobs, QueryMigrate,
};
use crate::qmp::{QmpClient, QmpError};
use crate::sync::migration::protocol::RunningDomain;
use crate::sync::migration::MigrationError;

/// How far a migration got into post-copy.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct PostCopy {
    /// `migrate-start-postcopy` was accepted (KubeVirt's mode `PostCopy`): no more timeouts or
    /// cancels.
    pub(super) requested: bool,
    /// QEMU went on into post-copy (`postcopy-*` seen, or continued from `pre-switchover`):
    /// the target may run the guest, so a failure no longer rolls back.
    pub(super) entered: bool,
}

/// Runs the migration once the target is ready: sets the bandwidth and channels, starts the disk
/// mirrors (into `mirrors`, for the caller's roll-back), starts the RAM stream once they are in
/// sync, and polls until QEMU reports the end, completing the mirrors at `pre-switchover`.
/// `post_copy` records how far it got into post-copy, for the caller's failure handling.
#[allow(clippy::too_many_arguments)]
pub(super) async fn migrate(
    qmp: &QmpClient,
    domain: &RunningDomain,
    exports: &[String],
    plan: &SourcePlan,
    mirrors: &mut Vec<Mirror>,
    abort: &mut watch::Receiver<bool>,
    post_copy: &mut PostCopy,
    on_event: &mut (dyn FnMut(SourceEvent) + Send),
) -> Result<SourceEnd, MigrationError> {
    let bandwidth = plan
        .options
        .max_bandwidth()
        .map_err(MigrationError::Options)?;
    qmp.run(&MigrateSetParameters {
        max_bandwidth: Some(bandwidth),
        multifd_channels: domain.multifd_channels,
        ..Default::default()
    })
    .await?;

    // The mirrors' start is no progress yet: a target that stops answering their NBD
    // negotiation is the progress timeout, as a stuck copy is.
    let progress = plan.options.progress_deadline();
    let started_mirrors = Instant::now();
    match start_mirrors(
        qmp,
        domain,
        exports,
        &plan.nbd,
        plan.options.mirror_speed(),
        mirrors,
        progress.unwrap_or(PEER_TIMEOUT),
    )
    .await
    {
        Err(MigrationError::Qmp(QmpError::Timeout { .. })) if progress.is_some() => {
            return Err(stuck(started_mirrors));
        }
        r => r?,
    }

    let t0 = Instant::now();
    let mut completion = plan.options.completion_deadline(plan.data_bytes);
    let mut paused = false;
    let mut continued = false;
    let mut abort_alive = true;
    let mut events = qmp.events();
    let mut watermark: Option<u64> = None;
    let mut last_progress = Instant::now();
    let mut started = mirrors.is_empty();
    if started {
        start_stream(qmp, plan).await?;
    }
    loop {
        // libvirt refuses to abort a post-copy migration: the guest already runs on the target.
        if *abort.borrow() && !post_copy.requested {
            return Err(MigrationError::Aborted);
        }
        // Until QEMU is in post-copy a query waits no longer than the progress timeout leaves:
        // a drain stuck on a target that stopped reading holds QEMU's main loop (see
        // [`NbdLink`]), and a hung query is no progress (a migration with post-copy requested
        // but not entered can still be undone).
        let budget = progress
            .filter(|_| !post_copy.entered)
            .map(|p| p.saturating_sub(last_progress.elapsed()).max(POLL_INTERVAL));
        // Without mirrors (shared storage) one QMP round trip less per poll, also while the
        // vCPUs wait in `pre-switchover`.
        let jobs = if mirrors.is_empty() {
            Vec::new()
        } else {
            guarded(qmp, &QueryBlockJobs, budget, last_progress).await?
        };
        let mirror_left: u64 = jobs
            .iter()
            .filter(|j| mirrors.iter().any(|m| m.job == j.device))
            .map(|j| j.len.saturating_sub(j.offset))
            .sum();
        // RAM starts once every mirror is in sync (libvirt waits for READY).
        if !started && mirrors_ready(mirrors, &jobs)? {
            start_stream(qmp, plan).await?;
            started = true;
        }
        let info = if started {
            guarded(qmp, &QueryMigrate, budget, last_progress).await?
        } else {
            Default::default()
        };
        let remaining = info.ram.as_ref().map_or(0, |r| r.remaining) + mirror_left;
        if progressed(watermark, remaining) {
            last_progress = Instant::now();
        }
        watermark = Some(remaining);
        if info
            .status
            .as_deref()
            .is_some_and(|s| s.starts_with("postcopy-"))
        {
            post_copy.entered = true;
        }
        if let Some(e) = failure(&info) {
            return Err(e);
        }
        match info.status.as_deref() {
            Some("completed") => {
                let info = completed_figures(qmp, info).await;
                return Ok(SourceEnd {
                    total_ms: info.total_time.unwrap_or(0),
                    downtime_ms: info.downtime.unwrap_or(0),
                    post_copy: post_copy.requested,
                });
            }
            // QEMU stops here once per migration, before the pre-copy switchover or before
            // entering post-copy.
            Some("pre-switchover") if !continued => {
                complete_mirrors(qmp, mirrors, progress.unwrap_or(PEER_TIMEOUT)).await?;
                // Once continued into post-copy the device state goes out and the target may
                // start the guest.
                post_copy.entered |= post_copy.requested;
                qmp.run(&MigrateContinue::pre_switchover()).await?;
                continued = true;
            }
            _ => {}
        }
        if post_copy.requested {
            // KubeVirt tracks nothing in post-copy: aborting now would lose the running guest.
            tick(&mut events, abort, &mut abort_alive).await;
            continue;
        }
        let elapsed = t0.elapsed();
        let past_completion = completion.is_some_and(|c| elapsed > c);
        if plan.options.allow_workload_disruption && past_completion && !paused && started {
            // KubeVirt's assist: post-copy when allowed, else pause the guest and wait twice as
            // long.
            let event = assist(qmp, domain, plan, abort, post_copy).await?;
            if event == SourceEvent::Paused {
                paused = true;
                completion = completion.map(|c| c * 2);
            }
            on_event(event);
            continue;
        }
        check_deadlines(progress, completion, last_progress, elapsed)?;
        tick(&mut events, abort, &mut abort_alive).await;
    }
}

/// The failure a `query-migrate` status reports: `failed` (with QEMU's reason), `cancelled`, or
/// `postcopy-paused`, where the stream broke during post-copy and the guest's memory is split
/// between the two QEMUs so that neither can run it (libvirt's Paused/PostcopyFailed; QEMU would
/// wait for a recovery that KubeVirt never starts).
fn failure(info: &MigrationInfo) -> Option<MigrationError> {
    match info.status.as_deref() {
        Some("failed") => Some(MigrationError::Qemu(
            info.error_desc
                .clone()
                .unwrap_or_else(|| "migration failed".into()),
        )),
        Some("cancelled") => Some(MigrationError::Aborted),
        Some("postcopy-paused") => Some(MigrationError::Qemu(
            "the post-copy migration broke (postcopy-paused): the guest's memory is split \
             between source and target"
                .into(),
        )),
        _ => None,
    }
}

/// KubeVirt's assist once the completion deadline passed and the options allow disruption:
/// `migrate-start-postcopy` when post-copy is allowed and on (`post_copy` then records it),
/// else the guest paused. A cancel that came during this poll's queries still wins: after the
/// switch it is refused.
async fn assist(
    qmp: &QmpClient,
    domain: &RunningDomain,
    plan: &SourcePlan,
    abort: &watch::Receiver<bool>,
    post_copy: &mut PostCopy,
) -> Result<SourceEvent, MigrationError> {
    let post_copy_on = domain.capabilities.iter().any(|c| c == "postcopy-ram");
    if plan.options.allow_post_copy && post_copy_on {
        if *abort.borrow() {
            return Err(MigrationError::Aborted);
        }
        qmp.run(&MigrateStartPostcopy).await?;
        post_copy.requested = true;
        Ok(SourceEvent::PostCopy)
    } else {
        crate::qmp::lifecycle::pause(qmp).await?;
        Ok(SourceEvent::Paused)
    }
}

/// KubeVirt's two timeouts: no progress since `last_progress` for longer than `progress`
/// ([`stuck`]), or `elapsed` past the `completion` deadline.
fn check_deadlines(
    progress: Option<Duration>,
    completion: Option<Duration>,
    last_progress: Instant,
    elapsed: Duration,
) -> Result<(), MigrationError> {
    if let Some(p) = progress {
        if last_progress.elapsed() > p {
            return Err(stuck(last_progress));
        }
    }
    if let Some(c) = completion {
        if elapsed > c {
            return Err(MigrationError::Timeout(format!(
                "not completed after {} seconds",
                c.as_secs()
            )));
        }
    }
    Ok(())
}

/// Whether a poll shows progress (KubeVirt's `live-migration-source.go` progress watermark): the
/// watermark is the previous sample, not the lowest, because the remaining data jumps up when the
/// RAM copy starts after the mirrors (and at each dirty-bitmap sync), and a migration progresses
/// while it shrinks from one poll to the next. Only the first sample counts without shrinking:
/// KubeVirt's "watermark 0" also reads a stuck 0 as progress, and a disk mirror whose target
/// stopped reading shows 0 remaining forever without becoming ready, which then never hit the
/// progress timeout.
fn progressed(watermark: Option<u64>, remaining: u64) -> bool {
    watermark.is_none_or(|w| remaining < w)
}

/// Whether QEMU's outgoing migration has entered post-copy (`postcopy-active` and after): the
/// target may run the guest. Assumed when QEMU does not answer.
pub(super) async fn entered_post_copy(qmp: &QmpClient) -> bool {
    match qmp.run(&QueryMigrate).await {
        Ok(info) => !matches!(
            info.status.as_deref(),
            Some("setup")
                | Some("active")
                | Some("pre-switchover")
                | Some("device")
                | Some("failed")
                | Some("cancelling")
                | Some("cancelled")
        ),
        Err(_) => true,
    }
}

/// KubeVirt's progress-timeout failure: no progress since `last_progress`.
fn stuck(last_progress: Instant) -> MigrationError {
    MigrationError::Timeout(format!(
        "stuck for {} seconds",
        last_progress.elapsed().as_secs()
    ))
}

/// Runs a monitoring query; with a `budget`, one that gets no answer within it is the progress
/// timeout ([`stuck`]).
async fn guarded<C: Command>(
    qmp: &QmpClient,
    command: &C,
    budget: Option<Duration>,
    last_progress: Instant,
) -> Result<C::Reply, MigrationError> {
    match budget {
        None => Ok(qmp.run(command).await?),
        Some(b) => match qmp.run_timeout(command, b).await {
            Err(QmpError::Timeout { .. }) => Err(stuck(last_progress)),
            r => Ok(r?),
        },
    }
}

/// The `query-migrate` figures of a completed migration. QEMU sets the state `completed` before
/// it computes `total-time` and `downtime` (`migration_calculate_complete` runs after
/// `migration_completion` in the migration thread), so a query right after the MIGRATION event
/// may read zeros: asked again for up to a second until `total-time` is set.
async fn completed_figures(qmp: &QmpClient, mut info: MigrationInfo) -> MigrationInfo {
    for _ in 0..20 {
        if info.total_time.unwrap_or(0) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        match qmp.run(&QueryMigrate).await {
            Ok(i) => info = i,
            Err(_) => break,
        }
    }
    info
}

/// Waits for the next poll: [`POLL_INTERVAL`], or earlier when QEMU reports a MIGRATION status
/// change (the switchover at `pre-switchover` runs while the vCPUs are stopped, so reacting to the
/// event instead of the next poll shortens the downtime, as libvirt does), or when `abort`
/// changes (`abort_alive` turns false once its sender is gone).
async fn tick(events: &mut EventStream, abort: &mut watch::Receiver<bool>, abort_alive: &mut bool) {
    let migration_event = async {
        loop {
            match events.recv().await {
                Some(e) if e.name == "MIGRATION" => return,
                Some(_) => {}
                None => std::future::pending::<()>().await,
            }
        }
    };
    tokio::select! {
        _ = tokio::time::sleep(POLL_INTERVAL) => {}
        _ = migration_event => {}
        r = abort.changed(), if *abort_alive => {
            if r.is_err() {
                *abort_alive = false;
            }
        }
    }
}

async fn start_stream(qmp: &QmpClient, plan: &SourcePlan) -> Result<(), MigrationError> {
    qmp.run(&Migrate {
        uri: format!("unix:{}", plan.stream.display()),
    })
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stuck_zero_remaining_is_no_progress_after_the_first_sample() {
        assert!(progressed(None, 0));
        assert!(progressed(None, 500));
        assert!(progressed(Some(500), 400));
        // The remaining data jumps up when the RAM copy starts: no progress, no failure yet.
        assert!(!progressed(Some(400), 9_000));
        assert!(progressed(Some(9_000), 0));
        // A mirror whose target froze: 0 remaining, never ready.
        assert!(!progressed(Some(0), 0));
    }
}
