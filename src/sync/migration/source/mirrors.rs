//! The disk mirrors of a block migration: one NBD client node and one `blockdev-mirror` per
//! copied disk, each writing through an NBD connection the launcher carries ([`NbdLink`]), their
//! graceful completion at `pre-switchover`, and the roll-back of a failed migration (libvirt's
//! `qemuMigrationSrcNBDStorageCopy` and `qemuMigrationSrcNBDCopyCancel`).

use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::net::UnixStream;

use super::POLL_INTERVAL;
use crate::qmp::client::Event;
use crate::qmp::migration::{
    BlockJobCancel, BlockJobInfo, BlockdevAddNbd, BlockdevDel, BlockdevMirror, MigrateCancel,
    QueryBlockJobs, QueryMigrate, SocketAddress,
};
use crate::qmp::{QmpClient, QmpError};
use crate::sync::migration::protocol::RunningDomain;
use crate::sync::migration::MigrationError;

/// One mirror: the NBD client node, the job, and the connection it writes through.
pub(super) struct Mirror {
    node: String,
    pub(super) job: String,
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
pub(super) fn cut_links(mirrors: &mut [Mirror]) {
    for m in mirrors {
        m.link = None;
    }
}

/// Block migration: one NBD client node (through an [`NbdLink`] to the proxy's socket `nbd`) and
/// one `top` mirror at `speed` per copied disk of `domain`, each pushed to `mirrors` once its node
/// exists (the roll-back removes what is there). Every copied disk must be among the target's
/// `exports`.
///
/// `blockdev-add` of an NBD client negotiates with the target's server while QEMU's main loop
/// waits: a target that stopped answering (frozen) holds it there, so each `blockdev-add` and
/// `blockdev-mirror` gets no more than `limit` (the progress timeout; the caller reads a
/// [`QmpError::Timeout`] as no progress), and the roll-back's cut of the links frees QEMU.
pub(super) async fn start_mirrors(
    qmp: &QmpClient,
    domain: &RunningDomain,
    exports: &[String],
    nbd: &Path,
    speed: Option<u64>,
    mirrors: &mut Vec<Mirror>,
    limit: Duration,
) -> Result<(), MigrationError> {
    for (i, disk) in domain.copied_disks.iter().enumerate() {
        if !exports.contains(&disk.export) {
            return Err(MigrationError::Peer(format!(
                "the target does not export {}",
                disk.export
            )));
        }
        let node = format!("migration-{i}");
        let link = NbdLink::open(qmp, nbd, &node).await?;
        qmp.run_timeout(
            &BlockdevAddNbd {
                driver: "nbd",
                node_name: node.clone(),
                server: SocketAddress::Fd { name: node.clone() },
                export: disk.export.clone(),
            },
            limit,
        )
        .await?;
        mirrors.push(Mirror {
            node: node.clone(),
            job: disk.export.clone(),
            link: Some(link),
        });
        let mirror = BlockdevMirror {
            job_id: disk.export.clone(),
            device: disk.node.clone(),
            target: node,
            sync: "top",
            speed,
            auto_finalize: true,
        };
        // A mirror of an earlier, failed attempt leaves its filter above the disk's node until
        // QEMU has finished tearing it down, after its job ended: QEMU refuses a new mirror of
        // the node meanwhile ("Need a root block node"). Retried until `limit`.
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match qmp.run_timeout(&mirror, limit).await {
                Err(QmpError::Command { desc, .. })
                    if desc.contains("Need a root block node")
                        && tokio::time::Instant::now() < deadline =>
                {
                    tracing::info!(disk = %disk.export, "the disk's node is not a root yet (an earlier mirror's filter): retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                r => {
                    r?;
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Whether every mirror is in sync (READY) in `jobs` (`query-block-jobs`).
///
/// # Errors
/// [`MigrationError::Qemu`] when a mirror's job is gone before the switchover.
pub(super) fn mirrors_ready(
    mirrors: &[Mirror],
    jobs: &[BlockJobInfo],
) -> Result<bool, MigrationError> {
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
    Ok(ready)
}

/// At `pre-switchover` (vCPUs stopped): completes every READY mirror gracefully
/// (`block-job-cancel` without force), waits (up to `limit`, the progress timeout) until the
/// jobs are gone and removes the NBD nodes. A mirror's completion drains its last writes: with
/// a target that stopped reading it holds QEMU's main loop, so the queries are bounded too.
pub(super) async fn complete_mirrors(
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

/// How long a roll-back waits for the force-cancelled mirrors' jobs to end (and for QEMU's
/// migration to leave `cancelling`): KubeVirt's abort timeout (`live-migration-source.go`), also
/// the bound libvirt's callers put on a cancel.
pub(super) const ROLL_BACK_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a roll-back asks `query-block-jobs` while it waits for the jobs' events (an event
/// lost to a lagging subscriber must not make a job look alive).
const ROLL_BACK_POLL: Duration = Duration::from_millis(500);

/// The mirrors' jobs a roll-back still waits for, by job id: each ends with its
/// `BLOCK_JOB_CANCELLED` (a forced cancel) or `BLOCK_JOB_COMPLETED` (it completed or failed first)
/// event, or when `query-block-jobs` no longer lists it (it ended before the roll-back listened,
/// e.g. on the cut NBD connection). libvirt's `qemuMigrationSrcNBDCopyCancel` waits for the same
/// events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct JobsLeft(pub(super) Vec<String>);

impl JobsLeft {
    /// Every job of `mirrors`.
    pub(super) fn of(mirrors: &[Mirror]) -> JobsLeft {
        JobsLeft(mirrors.iter().map(|m| m.job.clone()).collect())
    }

    /// Takes the job an end event names off the list (any other event is ignored).
    pub(super) fn event(&mut self, e: &Event) {
        if matches!(
            e.name.as_str(),
            "BLOCK_JOB_CANCELLED" | "BLOCK_JOB_COMPLETED"
        ) {
            if let Some(device) = e.data["device"].as_str() {
                self.0.retain(|j| j != device);
            }
        }
    }

    /// Keeps only the jobs `jobs` (`query-block-jobs`) still lists.
    pub(super) fn listed(&mut self, jobs: &[BlockJobInfo]) {
        self.0.retain(|j| jobs.iter().any(|b| &b.device == j));
    }

    /// Whether every job ended.
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The job ids still waited for.
    pub(super) fn jobs(&self) -> &[String] {
        &self.0
    }
}

/// Undoes a failed migration: force-cancels the mirrors and waits (up to [`ROLL_BACK_TIMEOUT`])
/// for their jobs to end ([`JobsLeft`]), cancels QEMU's migration and waits for it to settle,
/// removes the NBD nodes and resumes the source if it ran before. Each step is tried whatever
/// the one before did; the mirrors' jobs still running at the deadline are returned (empty when
/// every one ended), for the migration's failure reason.
pub(super) async fn roll_back(qmp: &QmpClient, mirrors: &[Mirror], was_running: bool) -> JobsLeft {
    let deadline = tokio::time::Instant::now() + ROLL_BACK_TIMEOUT;
    let left_time = || {
        deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .max(Duration::from_millis(100))
    };
    // Listening before the cancels: their events come after.
    let mut events = qmp.events();
    let mut left = JobsLeft::of(mirrors);
    for m in mirrors {
        let _ = qmp
            .run_timeout(
                &BlockJobCancel {
                    device: m.job.clone(),
                    force: true,
                },
                left_time(),
            )
            .await;
    }
    let _ = qmp.run_timeout(&MigrateCancel, left_time()).await;
    while !left.is_empty() {
        match qmp.run_timeout(&QueryBlockJobs, left_time()).await {
            Ok(jobs) => left.listed(&jobs),
            // QEMU is gone: so are its jobs.
            Err(QmpError::Disconnected { .. }) => left = JobsLeft(Vec::new()),
            Err(_) => {}
        }
        if left.is_empty() || tokio::time::Instant::now() >= deadline {
            break;
        }
        let poll = tokio::time::Instant::now() + ROLL_BACK_POLL;
        while !left.is_empty() {
            match tokio::time::timeout_at(poll.min(deadline), events.recv()).await {
                Ok(Some(e)) => left.event(&e),
                Ok(None) => {
                    left = JobsLeft(Vec::new());
                }
                Err(_) => break,
            }
        }
    }
    while tokio::time::Instant::now() < deadline {
        let settled = match qmp.run_timeout(&QueryMigrate, left_time()).await {
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
        if settled {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for m in mirrors {
        let _ = qmp
            .run_timeout(
                &BlockdevDel {
                    node_name: m.node.clone(),
                },
                left_time(),
            )
            .await;
    }
    if was_running {
        if let Ok((status, _)) = crate::qmp::lifecycle::query_status(qmp).await {
            if status != "running" {
                let _ = crate::qmp::lifecycle::resume(qmp).await;
            }
        }
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mirror(job: &str) -> Mirror {
        Mirror {
            node: format!("node-{job}"),
            job: job.into(),
            link: None,
        }
    }

    fn event(name: &str, device: &str) -> Event {
        Event {
            name: name.into(),
            data: serde_json::json!({"device": device, "type": "mirror"}),
            timestamp_us: 0,
        }
    }

    fn job(device: &str) -> BlockJobInfo {
        BlockJobInfo {
            device: device.into(),
            len: 0,
            offset: 0,
            ready: false,
            status: "running".into(),
        }
    }

    #[test]
    fn a_mirror_job_ends_with_its_cancelled_or_completed_event_or_when_it_is_no_longer_listed() {
        let mut left = JobsLeft::of(&[mirror("drive-a"), mirror("drive-b"), mirror("drive-c")]);
        // Not an end, or another job's.
        left.event(&event("BLOCK_JOB_READY", "drive-a"));
        left.event(&event("BLOCK_JOB_ERROR", "drive-a"));
        left.event(&event("BLOCK_JOB_CANCELLED", "drive-x"));
        left.event(&Event {
            name: "BLOCK_JOB_CANCELLED".into(),
            data: serde_json::Value::Null,
            timestamp_us: 0,
        });
        assert_eq!(left.jobs(), ["drive-a", "drive-b", "drive-c"]);
        left.event(&event("BLOCK_JOB_CANCELLED", "drive-a"));
        left.event(&event("BLOCK_JOB_COMPLETED", "drive-b"));
        assert_eq!(left.jobs(), ["drive-c"]);
        // Still listed: still running.
        left.listed(&[job("drive-c"), job("drive-x")]);
        assert_eq!(left.jobs(), ["drive-c"]);
        assert!(!left.is_empty());
        // Gone from the list (it ended before the roll-back listened).
        left.listed(&[job("drive-x")]);
        assert!(left.is_empty());
    }
}
