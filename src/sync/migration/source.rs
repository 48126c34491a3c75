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
//! connection itself ([`NbdLink`]), so that a target that stops reading cannot wedge the source
//! QEMU: the monitoring queries are bounded by the progress timeout, and on failure the
//! launcher closes its end, which fails QEMU's pending NBD writes at once.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;
use tokio::sync::watch;

use crate::qmp::client::EventStream;
use crate::qmp::commands::Command;
use crate::qmp::migration::{
    BlockJobCancel, BlockdevAddNbd, BlockdevDel, BlockdevMirror, Capability, CapabilityState,
    Migrate, MigrateCancel, MigrateContinue, MigrateSetCapabilities, MigrateSetParameters,
    MigrateStartPostcopy, MigrationInfo, QueryBlockJobs, QueryMigrate, SocketAddress,
};
use crate::qmp::{QmpClient, QmpError};
use crate::sync::migration::protocol::{
    hello_as_source, read_message, write_message, Message, Outcome, ProtocolError, RunningDomain,
};
use crate::sync::migration::{MigrationError, MigrationOptions};

/// KubeVirt's monitor interval.
pub const POLL_INTERVAL: Duration = Duration::from_millis(400);

/// How long the source waits for the target's answer to Prepare (QEMU start included) and to
/// the outcome.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(120);

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

/// The capabilities the source enables for `options` (besides `events`, `return-path` and
/// `pause-before-switchover`, always on; [`run_source`] drops the last when no disk is copied),
/// with the names the target must enable too.
pub fn capabilities(options: &MigrationOptions) -> (Vec<Capability>, Vec<String>) {
    let mut caps = vec![
        Capability::Events,
        Capability::ReturnPath,
        Capability::PauseBeforeSwitchover,
    ];
    let mut shared = Vec::new();
    if options.allow_auto_converge {
        caps.push(Capability::AutoConverge);
    }
    if options.allow_post_copy {
        caps.push(Capability::PostcopyRam);
        shared.push("postcopy-ram".to_owned());
    }
    if options.parallel_migration_threads.is_some_and(|n| n > 0) {
        caps.push(Capability::Multifd);
        shared.push("multifd".to_owned());
    }
    (caps, shared)
}

/// `migrate-set-capabilities` with every capability a migration of ours may turn on: those in
/// `on` on, the others off. A QEMU keeps its capabilities from one migration to the next, and a
/// migrated domain's QEMU still has those it had as the target (`postcopy-ram`, `multifd`,
/// `late-block-activate`) or from an earlier failed attempt: a source that still announces
/// post-copy makes a target without it fail the incoming stream. libvirt likewise sets each
/// capability it knows on every migration (`qemuMigrationParamsApply`).
pub fn set_capabilities(on: &[Capability]) -> MigrateSetCapabilities {
    const MANAGED: [Capability; 7] = [
        Capability::Events,
        Capability::ReturnPath,
        Capability::PauseBeforeSwitchover,
        Capability::AutoConverge,
        Capability::PostcopyRam,
        Capability::Multifd,
        Capability::LateBlockActivate,
    ];
    MigrateSetCapabilities {
        capabilities: MANAGED
            .iter()
            .map(|&capability| CapabilityState {
                capability,
                state: on.contains(&capability),
            })
            .collect(),
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
    let (mut caps, mut shared) = capabilities(&plan.options);
    if domain.copied_disks.is_empty() {
        // The pause before the switchover exists to complete the disk mirrors with the vCPUs
        // stopped; without mirrors it would only add a QMP round trip to the downtime.
        caps.retain(|&c| c != Capability::PauseBeforeSwitchover);
    }
    domain.multifd_channels = plan.options.parallel_migration_threads.filter(|&n| n > 0);
    let both = caps.contains(&Capability::PostcopyRam) && caps.contains(&Capability::Multifd);
    let mut one_channel = |caps: &mut Vec<Capability>, domain: &mut RunningDomain| {
        caps.retain(|&c| c != Capability::Multifd);
        shared.retain(|c| c != "multifd");
        domain.multifd_channels = None;
    };
    if both && qmp.greeting().version < (10, 0, 0) {
        one_channel(&mut caps, &mut domain);
    }
    if let Err(e) = qmp.run(&set_capabilities(&caps)).await {
        if !caps.contains(&Capability::Multifd) || !caps.contains(&Capability::PostcopyRam) {
            return Err(e.into());
        }
        one_channel(&mut caps, &mut domain);
        qmp.run(&set_capabilities(&caps)).await?;
    }
    domain.capabilities = shared;
    let was_running = !domain.paused;

    hello_as_source(&mut control).await?;
    write_message(&mut control, &Message::Prepare(Box::new(domain.clone()))).await?;
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
    let mut post_copy = PostCopy::default();
    let result = migrate(
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
        cut_links(&mut mirrors);
    }
    // After post-copy started the running guest is the target's: never resume the source. A
    // failure between `migrate-start-postcopy` and QEMU entering post-copy (the mirrors'
    // completion at `pre-switchover`, the vCPU stop) leaves the whole guest on the source: QEMU
    // then reports `failed` (and restarts the vCPUs itself) or still waits, and it rolls back.
    let post_copy = if result.is_err() && post_copy.requested && !post_copy.entered {
        entered_post_copy(qmp).await
    } else {
        post_copy.requested
    };
    let was_running = was_running && !post_copy;
    match result {
        Ok(end) => {
            write_message(
                &mut control,
                &Message::Outcome(Outcome {
                    completed: true,
                    reason: None,
                }),
            )
            .await?;
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
            if !post_copy {
                roll_back(qmp, &mirrors, was_running).await;
            }
            let _ = write_message(
                &mut control,
                &Message::Outcome(Outcome {
                    completed: false,
                    reason: Some(e.failure_reason()),
                }),
            )
            .await;
            Err(e)
        }
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

/// How far a migration got into post-copy.
#[derive(Debug, Default, Clone, Copy)]
struct PostCopy {
    /// `migrate-start-postcopy` was accepted (KubeVirt's mode `PostCopy`): no more timeouts or
    /// cancels.
    requested: bool,
    /// QEMU went on into post-copy (`postcopy-*` seen, or continued from `pre-switchover`):
    /// the target may run the guest, so a failure no longer rolls back.
    entered: bool,
}

/// One mirror: the NBD client node, the job, and the connection it writes through.
struct Mirror {
    node: String,
    job: String,
    link: Option<NbdLink>,
}

/// The NBD connection of one disk mirror, carried by the launcher: QEMU's NBD client gets one
/// end of a socket pair (`getfd`, server `{"type":"fd"}`), and the launcher copies between the
/// other end and the migration proxy's NBD socket.
///
/// Why not let QEMU dial the proxy socket itself: when the target stops reading (a frozen
/// target QEMU or node), the mirror's in-flight NBD writes never complete, and QEMU 7.2 has no
/// request timeout. Any drain then blocks QEMU's main loop under the big lock — the vCPU stop
/// at the switchover, `stop`, `blockdev-del`, `quit` — and neither `block-job-cancel force` nor
/// `yank` of the NBD node helps: the NBD coroutine waits for POLLOUT, which a unix socket
/// whose peer holds the unread data never reports, shut down or not (measured: `stop` blocked
/// until the target was resumed, 20 s later, with and without a yank). Closing the launcher's
/// end frees that data: the writes fail at once, the drain ends, and the source runs on.
struct NbdLink {
    task: tokio::task::JoinHandle<()>,
}

impl NbdLink {
    /// Connects to the proxy's NBD socket `proxy` and hands QEMU its end as `fdname`.
    async fn open(qmp: &QmpClient, proxy: &Path, fdname: &str) -> Result<NbdLink, MigrationError> {
        let upstream = UnixStream::connect(proxy).await.map_err(|e| {
            MigrationError::Peer(format!(
                "cannot reach the target's NBD server at {}: {e}",
                proxy.display()
            ))
        })?;
        let (ours, qemus) = std::os::unix::net::UnixStream::pair()
            .and_then(|(a, b)| a.set_nonblocking(true).map(|()| (a, b)))
            .map_err(|e| MigrationError::Qemu(format!("socketpair for the NBD client: {e}")))?;
        let ours = UnixStream::from_std(ours)
            .map_err(|e| MigrationError::Qemu(format!("socketpair for the NBD client: {e}")))?;
        qmp.getfd(fdname, qemus.as_fd()).await?;
        drop(qemus);
        let task = tokio::spawn(async move {
            let (mut a, mut b) = (ours, upstream);
            let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
        });
        Ok(NbdLink { task })
    }
}

impl Drop for NbdLink {
    /// Cuts the connection: both sockets close with the task.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Cuts every mirror's NBD connection (see [`NbdLink`]): QEMU's pending writes to the target fail
/// and the jobs end, whatever the target does.
fn cut_links(mirrors: &mut [Mirror]) {
    for m in mirrors {
        m.link = None;
    }
}

#[allow(clippy::too_many_arguments)]
async fn migrate(
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

    // Block migration: one NBD client node and one top mirror per copied disk.
    for (i, disk) in domain.copied_disks.iter().enumerate() {
        if !exports.contains(&disk.export) {
            return Err(MigrationError::Peer(format!(
                "the target does not export {}",
                disk.export
            )));
        }
        let node = format!("migration-{i}");
        let link = NbdLink::open(qmp, &plan.nbd, &node).await?;
        qmp.run(&BlockdevAddNbd {
            driver: "nbd",
            node_name: node.clone(),
            server: SocketAddress::Fd { name: node.clone() },
            export: disk.export.clone(),
        })
        .await?;
        mirrors.push(Mirror {
            node: node.clone(),
            job: disk.export.clone(),
            link: Some(link),
        });
        qmp.run(&BlockdevMirror {
            job_id: disk.export.clone(),
            device: disk.node.clone(),
            target: node,
            sync: "top",
            speed: plan.options.mirror_speed(),
            auto_finalize: true,
        })
        .await?;
    }

    let t0 = Instant::now();
    let mut completion = plan.options.completion_deadline(plan.data_bytes);
    let progress = plan.options.progress_deadline();
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
        if !started {
            // RAM starts once every mirror is in sync (libvirt waits for READY).
            let ready = mirrors
                .iter()
                .all(|m| jobs.iter().any(|j| j.device == m.job && j.ready));
            let gone = mirrors
                .iter()
                .find(|m| !jobs.iter().any(|j| j.device == m.job));
            if let Some(m) = gone {
                return Err(MigrationError::Qemu(format!(
                    "the mirror of {} ended early",
                    m.job
                )));
            }
            if ready {
                start_stream(qmp, plan).await?;
                started = true;
            }
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
        match info.status.as_deref() {
            Some("completed") => {
                let info = completed_figures(qmp, info).await;
                return Ok(SourceEnd {
                    total_ms: info.total_time.unwrap_or(0),
                    downtime_ms: info.downtime.unwrap_or(0),
                    post_copy: post_copy.requested,
                });
            }
            Some("failed") => {
                return Err(MigrationError::Qemu(
                    info.error_desc.unwrap_or_else(|| "migration failed".into()),
                ))
            }
            Some("cancelled") => return Err(MigrationError::Aborted),
            // The stream broke during post-copy: the guest's memory is split between the two
            // QEMUs and neither can run it (libvirt's Paused/PostcopyFailed; QEMU would wait for
            // a recovery that KubeVirt never starts).
            Some("postcopy-paused") => {
                return Err(MigrationError::Qemu(
                    "the post-copy migration broke (postcopy-paused): the guest's memory is \
                     split between source and target"
                        .into(),
                ))
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
            let post_copy_on = domain.capabilities.iter().any(|c| c == "postcopy-ram");
            if plan.options.allow_post_copy && post_copy_on {
                // A cancel that came during this poll's queries still wins: after the switch it
                // is refused.
                if *abort.borrow() {
                    return Err(MigrationError::Aborted);
                }
                qmp.run(&MigrateStartPostcopy).await?;
                post_copy.requested = true;
                on_event(SourceEvent::PostCopy);
            } else {
                crate::qmp::lifecycle::pause(qmp).await?;
                paused = true;
                completion = completion.map(|c| c * 2);
                on_event(SourceEvent::Paused);
            }
            continue;
        }
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
        tick(&mut events, abort, &mut abort_alive).await;
    }
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
async fn entered_post_copy(qmp: &QmpClient) -> bool {
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

/// At `pre-switchover` (vCPUs stopped): completes every READY mirror gracefully
/// (`block-job-cancel` without force), waits (up to `limit`, the progress timeout) until the
/// jobs are gone and removes the NBD nodes. A mirror's completion drains its last writes: with
/// a target that stopped reading it holds QEMU's main loop, so the queries are bounded too.
async fn complete_mirrors(
    qmp: &QmpClient,
    mirrors: &mut Vec<Mirror>,
    limit: Duration,
) -> Result<(), MigrationError> {
    let t0 = Instant::now();
    let late = || {
        MigrationError::Timeout(format!(
            "the disk mirrors did not complete within {} seconds",
            limit.as_secs()
        ))
    };
    let left = || limit.saturating_sub(t0.elapsed()).max(POLL_INTERVAL);
    fn bounded<T>(
        r: Result<T, QmpError>,
        late: impl Fn() -> MigrationError,
    ) -> Result<T, MigrationError> {
        match r {
            Err(QmpError::Timeout { .. }) => Err(late()),
            r => r.map_err(MigrationError::from),
        }
    }
    for m in mirrors.iter() {
        let cancel = BlockJobCancel {
            device: m.job.clone(),
            force: false,
        };
        bounded(qmp.run_timeout(&cancel, left()).await, late)?;
    }
    loop {
        let jobs = bounded(qmp.run_timeout(&QueryBlockJobs, left()).await, late)?;
        if !jobs
            .iter()
            .any(|j| mirrors.iter().any(|m| m.job == j.device))
        {
            break;
        }
        if t0.elapsed() > limit {
            return Err(late());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for m in mirrors.drain(..) {
        qmp.run(&BlockdevDel { node_name: m.node }).await?;
    }
    Ok(())
}

/// Undoes a failed migration: force-cancels the mirrors, cancels QEMU's migration, removes the
/// NBD nodes and resumes the source if it ran before. Best effort: each step is tried.
async fn roll_back(qmp: &QmpClient, mirrors: &[Mirror], was_running: bool) {
    for m in mirrors {
        let _ = qmp
            .run(&BlockJobCancel {
                device: m.job.clone(),
                force: true,
            })
            .await;
    }
    let _ = qmp.run(&MigrateCancel).await;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        let settled = match qmp.run(&QueryMigrate).await {
            Ok(info) => !matches!(
                info.status.as_deref(),
                Some("cancelling")
                    | Some("active")
                    | Some("setup")
                    | Some("pre-switchover")
                    | Some("device")
            ),
            Err(_) => true,
        };
        let jobs_left = qmp
            .run(&QueryBlockJobs)
            .await
            .map(|j| j.iter().any(|j| mirrors.iter().any(|m| m.job == j.device)))
            .unwrap_or(false);
        if settled && !jobs_left {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for m in mirrors {
        let _ = qmp
            .run(&BlockdevDel {
                node_name: m.node.clone(),
            })
            .await;
    }
    if was_running {
        if let Ok((status, _)) = crate::qmp::lifecycle::query_status(qmp).await {
            if status != "running" {
                let _ = crate::qmp::lifecycle::resume(qmp).await;
            }
        }
    }
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

    #[test]
    fn capabilities_left_from_an_earlier_migration_are_turned_off() {
        let set = set_capabilities(&[Capability::Events, Capability::ReturnPath]);
        let state = |c| {
            set.capabilities
                .iter()
                .find(|s| s.capability == c)
                .map(|s| s.state)
        };
        assert_eq!(state(Capability::Events), Some(true));
        assert_eq!(state(Capability::ReturnPath), Some(true));
        // A QEMU that was the target of a post-copy migration with multifd still has them.
        assert_eq!(state(Capability::PostcopyRam), Some(false));
        assert_eq!(state(Capability::Multifd), Some(false));
        assert_eq!(state(Capability::LateBlockActivate), Some(false));
        assert_eq!(state(Capability::AutoConverge), Some(false));
        assert_eq!(state(Capability::PauseBeforeSwitchover), Some(false));
    }
}
