//! The source launcher's half of a migration, on the QMP and control-channel level: send the
//! running domain's definition, configure QEMU as KubeVirt configures libvirt (bandwidth,
//! auto-converge, multifd, `pause-before-switchover`), mirror the local disks to the target's
//! NBD server, run the RAM migration under the progress and completion timeouts, complete the
//! mirrors at `pre-switchover`, `migrate-continue`, and report the outcome to the target.
//!
//! Mirrors the behaviour of libvirt's Begin/Perform/Confirm (`qemuMigrationSrcRun`,
//! `src/qemu/qemu_migration.c`) with KubeVirt's monitor policy (`handleLegacyConvergence`,
//! `live-migration-source.go`, v1.9.0): poll every 400 ms, abort after `ProgressTimeout` seconds
//! without the remaining data shrinking, or after the completion deadline. On any failure the
//! mirrors are force-cancelled, QEMU's migration cancelled, and the source resumed if it was
//! running.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use crate::qmp::migration::{
    BlockJobCancel, BlockdevAddNbd, BlockdevDel, BlockdevMirror, Capability, Migrate,
    MigrateCancel, MigrateContinue, MigrateSetCapabilities, MigrateSetParameters, QueryBlockJobs,
    QueryMigrate, SocketAddress,
};
use crate::qmp::QmpClient;
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
}

/// The capabilities the source enables for `options` (besides `events`, `return-path` and
/// `pause-before-switchover`, always on), with the names the target must enable too.
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

/// Runs the migration of the QEMU behind `qmp` over `control` (connected to the target's
/// control socket through the proxy). `domain` is the running definition (its `capabilities`
/// and `multifd_channels` are filled from the options here). `abort` turning true cancels.
///
/// On success the source QEMU is in `postmigrate` (the caller stops it). On failure the source
/// runs again (or stays paused if it was) and the error is the failure reason.
pub async fn run_source<S: AsyncRead + AsyncWrite + Unpin>(
    mut control: S,
    qmp: &QmpClient,
    mut domain: RunningDomain,
    plan: &SourcePlan,
    mut abort: watch::Receiver<bool>,
) -> Result<SourceEnd, MigrationError> {
    let (caps, shared) = capabilities(&plan.options);
    domain.capabilities = shared;
    domain.multifd_channels = plan.options.parallel_migration_threads.filter(|&n| n > 0);
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
    let result = migrate(
        qmp,
        &domain,
        &ready.nbd_exports,
        plan,
        &caps,
        &mut mirrors,
        &mut abort,
    )
    .await;
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
            roll_back(qmp, &mirrors, was_running).await;
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

/// One mirror: the NBD client node and the job.
struct Mirror {
    node: String,
    job: String,
}

async fn migrate(
    qmp: &QmpClient,
    domain: &RunningDomain,
    exports: &[String],
    plan: &SourcePlan,
    caps: &[Capability],
    mirrors: &mut Vec<Mirror>,
    abort: &mut watch::Receiver<bool>,
) -> Result<SourceEnd, MigrationError> {
    let bandwidth = plan
        .options
        .max_bandwidth()
        .map_err(MigrationError::Options)?;
    qmp.run(&MigrateSetCapabilities::enable(caps)).await?;
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
        qmp.run(&BlockdevAddNbd {
            driver: "nbd",
            node_name: node.clone(),
            server: SocketAddress::Unix {
                path: plan.nbd.display().to_string(),
            },
            export: disk.export.clone(),
        })
        .await?;
        mirrors.push(Mirror {
            node: node.clone(),
            job: disk.export.clone(),
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
    let completion = plan.options.completion_deadline(plan.data_bytes);
    let progress = plan.options.progress_deadline();
    let mut best_remaining = u64::MAX;
    let mut last_progress = Instant::now();
    let mut started = mirrors.is_empty();
    if started {
        start_stream(qmp, plan).await?;
    }
    loop {
        if *abort.borrow() {
            return Err(MigrationError::Aborted);
        }
        let jobs = qmp.run(&QueryBlockJobs).await?;
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
            qmp.run(&QueryMigrate).await?
        } else {
            Default::default()
        };
        let remaining = info.ram.as_ref().map_or(0, |r| r.remaining) + mirror_left;
        if remaining < best_remaining {
            best_remaining = remaining;
            last_progress = Instant::now();
        }
        match info.status.as_deref() {
            Some("completed") => {
                return Ok(SourceEnd {
                    total_ms: info.total_time.unwrap_or(0),
                    downtime_ms: info.downtime.unwrap_or(0),
                })
            }
            Some("failed") => {
                return Err(MigrationError::Qemu(
                    info.error_desc.unwrap_or_else(|| "migration failed".into()),
                ))
            }
            Some("cancelled") => return Err(MigrationError::Aborted),
            Some("pre-switchover") => {
                complete_mirrors(qmp, mirrors).await?;
                qmp.run(&MigrateContinue::pre_switchover()).await?;
            }
            _ => {}
        }
        let elapsed = t0.elapsed();
        if let Some(p) = progress {
            if last_progress.elapsed() > p {
                return Err(MigrationError::Timeout(format!(
                    "stuck for {} seconds",
                    last_progress.elapsed().as_secs()
                )));
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
        tokio::select! {
            _ = tokio::time::sleep(POLL_INTERVAL) => {}
            _ = abort.changed() => {}
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
/// (`block-job-cancel` without force), waits until the jobs are gone and removes the NBD nodes.
async fn complete_mirrors(
    qmp: &QmpClient,
    mirrors: &mut Vec<Mirror>,
) -> Result<(), MigrationError> {
    for m in mirrors.iter() {
        qmp.run(&BlockJobCancel {
            device: m.job.clone(),
            force: false,
        })
        .await?;
    }
    let t0 = Instant::now();
    loop {
        let jobs = qmp.run(&QueryBlockJobs).await?;
        if !jobs
            .iter()
            .any(|j| mirrors.iter().any(|m| m.job == j.device))
        {
            break;
        }
        if t0.elapsed() > PEER_TIMEOUT {
            return Err(MigrationError::Timeout(
                "the disk mirrors did not complete".into(),
            ));
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
