//! Post-copy live migration of the booted test guest between two real qemu-system-x86_64
//! processes (TCG), driven by qlauncher's source and target halves as KubeVirt's policy asks
//! (`AllowPostCopy`, `AllowWorkloadDisruption`): a guest workload rewrites 16 MiB of random data
//! in a loop while the bandwidth is limited to 1 MiB/s, so pre-copy can never converge; once the
//! completion deadline passes the source switches to post-copy (`migrate-start-postcopy`, the
//! capability on both sides), the target resumes the guest at post-copy start, and the
//! migration completes. The guest keeps running on the target: its counter continues from the
//! source's value and its data is intact. The same with KubeVirt's default 8 multifd channels,
//! and without post-copy (workload disruption alone): the source pauses the guest at the
//! deadline, pre-copy converges, the target runs it.
//!
//! Post-copy needs userfaultfd on the target; as root it works whatever
//! `vm.unprivileged_userfaultfd` says. A QEMU 7.2 running as another user (KubeVirt's non-root
//! VMIs run QEMU as 107) answers "Postcopy is not supported" to the target's
//! `migrate-set-capabilities postcopy-ram` while `vm.unprivileged_userfaultfd` is 0 (it opens no
//! `/dev/userfaultfd`; QEMU 8.1 and later can). KubeVirt's non-root post-copy therefore needs a
//! node with `vm.unprivileged_userfaultfd = 1` on such a QEMU (KubeVirt itself only lets
//! `userfaultfd` through its seccomp profile, `pkg/virt-handler/seccomp`): the launcher test, on
//! non-root pods, runs on such a node ([`UnprivilegedUserfaultfd`]).

use std::time::Duration;

use qlauncher::qmp::QmpClient;
use qlauncher::sync::domain::MigrationMetadata;
use qlauncher::sync::domain::{LifeCycle as L, StateChangeReason as R};
use qlauncher::sync::migration::source::{
    resolved_machine, run_source_with, SourceEvent, SourcePlan,
};
use qlauncher::sync::migration::target::{TargetEnd, TargetSession};
use qlauncher::sync::migration::MigrationOptions;
use testkit::guest::{GuestImages, Vm, BOOT_TIMEOUT};
use testkit::handler::Client;
use testkit::launcher::{get_domain, Pod};
use testkit::migration::{
    boot, exec_until_ok, job_data, metadata, migrate_on, migrating_vmi, options, plain_vmi,
    pod_pair, running_domain, target_sockets, wait_notified, Relay, Rpc,
};
use testkit::netns::POD_MAC;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

/// The highest `count N` marker seen on a console.
fn last_count(vm: &Vm) -> u64 {
    vm.console
        .markers()
        .iter()
        .filter_map(|m| m.strip_prefix("count ")?.trim().parse().ok())
        .max()
        .unwrap_or(0)
}

/// The VM's QMP monitor: QEMU creates it only after the serial console (which it waits for) is
/// connected, so it may not exist yet when [`Vm::start`] returns.
async fn qmp(vm: &Vm) -> QmpClient {
    for _ in 0..300 {
        if let Ok(c) = QmpClient::connect(&vm.qmp_path, Duration::from_secs(30)).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "no QMP monitor at {}:\n{}",
        vm.qmp_path.display(),
        vm.qemu_log()
    );
}

async fn status(client: &QmpClient) -> String {
    qlauncher::qmp::lifecycle::query_status(client)
        .await
        .unwrap()
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_copy_completes_a_migration_pre_copy_cannot_and_the_guest_keeps_counting() {
    converge(Policy::PostCopy { multifd: false }).await;
}

/// Workload disruption allowed, post-copy not: at the deadline the source pauses the guest
/// (mode `Paused`, deadline doubled), pre-copy converges, and the guest runs again on the
/// target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_post_copy_the_guest_is_paused_until_pre_copy_converges_and_runs_on_the_target() {
    converge(Policy::Pause).await;
}

/// KubeVirt's defaults send `ParallelMigrationThreads: 8` with a post-copy policy. QEMU before
/// 10.0 cannot run multifd and post-copy together (7.2 accepts both capabilities, then its
/// target aborts when post-copy starts), so there the source drops multifd on both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_copy_with_multifd_channels_as_kubevirt_defaults_send_it() {
    converge(Policy::PostCopy { multifd: true }).await;
}

/// How the source is allowed to complete a migration that does not converge.
#[derive(Clone, Copy)]
enum Policy {
    /// `AllowPostCopy` (with `ParallelMigrationThreads: 8` when `multifd`).
    PostCopy { multifd: bool },
    /// `AllowWorkloadDisruption` alone.
    Pause,
}

async fn converge(policy: Policy) {
    let post_copy = matches!(policy, Policy::PostCopy { .. });
    let guest = GuestImages::locate();
    let args = guest.kernel_boot_args();
    let mut source = Vm::start(|_| args.clone());
    source.wait_booted();
    // 16 MiB of random data in the initramfs (RAM), rewritten in a loop (far faster than
    // 1 MiB/s), and a counter printed every second.
    let (rc, out) = source
        .console
        .run(
            "dd if=/dev/urandom of=/tmp/a bs=1M count=16 2>/dev/null && md5sum /tmp/a",
            Duration::from_secs(120),
        )
        .unwrap();
    assert_eq!(rc, 0, "{out}");
    let sum = out.split_whitespace().next().unwrap().to_owned();
    let (rc, out) = source
        .console
        .run(
            "(while :; do dd if=/tmp/a of=/tmp/b bs=1M conv=notrunc 2>/dev/null; done) \
             >/dev/null 2>&1 </dev/null & \
             (i=0; while :; do i=$((i+1)); echo \"QLG: count $i\"; sleep 1; done) & true",
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(rc, 0, "{out}");
    source
        .console
        .wait_for_marker("count 3", Duration::from_secs(60))
        .unwrap();

    let mut target_args = args.clone();
    target_args.extend(["-incoming".to_owned(), "defer".to_owned()]);
    let mut target = Vm::start(|_| target_args);

    let s_qmp = qmp(&source).await;
    let t_qmp = qmp(&target).await;
    let sock_dir = tempfile::tempdir().unwrap();
    let control = sock_dir.path().join("control.sock");
    let sockets = target_sockets(sock_dir.path());
    let listener = UnixListener::bind(&control).unwrap();
    let t_client = t_qmp.clone();
    let t_sockets = sockets.clone();
    let target_half = tokio::spawn(async move {
        let (conn, _) = listener.accept().await.unwrap();
        let mut session = TargetSession::accept(conn, "vmi-1").await?;
        let caps = &session.domain.capabilities;
        assert_eq!(
            caps.iter().any(|c| c == "postcopy-ram"),
            post_copy,
            "{caps:?}"
        );
        if t_client.greeting().version < (10, 0, 0) {
            assert!(!caps.iter().any(|c| c == "multifd"), "{caps:?}");
            assert_eq!(session.domain.multifd_channels, None);
        }
        session.incoming(&t_client, &t_sockets).await?;
        session.finish(&t_client).await
    });

    let domain = running_domain("vmi-1", "mig-1", resolved_machine(&s_qmp).await.unwrap());
    // 256 MiB is one decimal GB: the completion deadline is 8 s (post-copy; at 1 MiB/s
    // pre-copy has sent about 8 MiB of the 256 by then) or 10 s (pause; at 8 MiB/s the paused
    // guest's last 16 MiB take 2 s, well within the doubled deadline).
    let options = match policy {
        Policy::PostCopy { multifd } => format!(
            r#"{{"Bandwidth":"1Mi","ProgressTimeout":150,"CompletionTimeoutPerGiB":8,
                 "AllowPostCopy":true,"AllowWorkloadDisruption":true,
                 "ParallelMigrationThreads":{}}}"#,
            if multifd { "8" } else { "null" }
        ),
        Policy::Pause => r#"{"Bandwidth":"8Mi","ProgressTimeout":150,"CompletionTimeoutPerGiB":10,
                 "AllowPostCopy":false,"AllowWorkloadDisruption":true}"#
            .to_owned(),
    };
    let plan = SourcePlan {
        stream: sockets.stream.clone(),
        nbd: sockets.nbd.clone(),
        options: MigrationOptions::from_json(options.as_bytes()).unwrap(),
        data_bytes: 256 << 20,
    };
    let before = last_count(&source);
    let (_abort_tx, abort) = watch::channel(false);
    let mut events = Vec::new();
    let conn = UnixStream::connect(&control).await.unwrap();
    let end = tokio::time::timeout(
        Duration::from_secs(600),
        run_source_with(conn, &s_qmp, domain, &plan, abort, &mut |e| events.push(e)),
    )
    .await
    .expect("the source finished")
    .unwrap_or_else(|e| {
        panic!(
            "the migration failed: {}\nsource QEMU:\n{}\ntarget QEMU:\n{}",
            e.failure_reason(),
            source.qemu_log(),
            target.qemu_log()
        )
    });
    if post_copy {
        assert_eq!(events, vec![SourceEvent::PostCopy]);
        assert_eq!(SourceEvent::PostCopy.mode(), "PostCopy");
    } else {
        assert_eq!(events, vec![SourceEvent::Paused]);
        assert_eq!(SourceEvent::Paused.mode(), "Paused");
    }
    assert_eq!(end.post_copy, post_copy, "{end:?}");
    let t_end = target_half
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the target failed: {}", e.failure_reason()));
    assert_eq!(t_end, TargetEnd::Completed { paused: false });
    assert_eq!(status(&s_qmp).await, "postmigrate");
    assert_eq!(status(&t_qmp).await, "running");
    let info = t_qmp.execute("query-migrate", None).await.unwrap();
    assert_eq!(info["status"], "completed", "{info}");

    // The counter continues on the target from where the source left it (not from 1), and
    // keeps counting.
    let first = target
        .console
        .wait_for_marker("count ", BOOT_TIMEOUT)
        .unwrap();
    let first: u64 = first["count ".len()..].trim().parse().unwrap();
    assert!(
        first > before,
        "target counted {first}, source was at {before}"
    );
    let next = format!("count {}", first + 2);
    target
        .console
        .wait_for_marker(&next, Duration::from_secs(120))
        .unwrap();
    // The random data moved intact (its pages were pulled in post-copy or sent before).
    target.console.send(b"\n").unwrap();
    let (rc, out) = target
        .console
        .run("md5sum /tmp/a", Duration::from_secs(120))
        .unwrap();
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains(&sum), "{out} vs {sum}");
}

/// virt-handler's options for the launcher tests: `bandwidth`, `completion_per_gib` seconds,
/// workload disruption allowed, post-copy as `post_copy`.
fn disruptive_options(bandwidth: &str, completion_per_gib: i64, post_copy: bool) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(&options(bandwidth, 150)).unwrap();
    v["CompletionTimeoutPerGiB"] = completion_per_gib.into();
    v["AllowPostCopy"] = post_copy.into();
    v["AllowWorkloadDisruption"] = true.into();
    serde_json::to_vec(&v).unwrap()
}

/// Polls GetDomain of a source until the record of `uid` shows `mode`; returns it.
async fn wait_mode(c: &mut Client, uid: &str, mode: &str) -> MigrationMetadata {
    let deadline = std::time::Instant::now() + LAUNCHER_MIGRATION;
    loop {
        if let Some(m) = get_domain(c).await.as_ref().and_then(metadata) {
            if m.uid == uid && m.mode == mode {
                return m;
            }
            assert!(
                m.uid != uid || m.end_timestamp.is_none(),
                "migration {uid} ended without mode {mode}: {m:?}"
            );
        }
        assert!(
            std::time::Instant::now() < deadline,
            "migration {uid} never reached mode {mode}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until GetDomain shows the domain Running.
async fn wait_running(c: &mut Client) {
    let deadline = std::time::Instant::now() + LAUNCHER_MIGRATION;
    loop {
        if get_domain(c)
            .await
            .is_some_and(|d| d.status.status == L::Running)
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the source never ran again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The guest's RAM counter (`/w/counter`) through the agent.
async fn ram_counter(c: &mut Client) -> u64 {
    testkit::migration::read_number(c, "/w/counter", Duration::from_secs(60)).await
}

/// `vm.unprivileged_userfaultfd` set to 1 while it lives, the earlier value restored on drop: a
/// node prepared for KubeVirt's non-root post-copy on QEMU before 8.1 (see the module doc).
struct UnprivilegedUserfaultfd(Option<String>);

const UFFD_SYSCTL: &str = "/proc/sys/vm/unprivileged_userfaultfd";

impl UnprivilegedUserfaultfd {
    fn allow() -> UnprivilegedUserfaultfd {
        let before = std::fs::read_to_string(UFFD_SYSCTL)
            .unwrap_or_else(|e| panic!("{UFFD_SYSCTL}: {e}"))
            .trim()
            .to_owned();
        if before == "1" {
            return UnprivilegedUserfaultfd(None);
        }
        std::fs::write(UFFD_SYSCTL, "1").unwrap_or_else(|e| panic!("{UFFD_SYSCTL}: {e}"));
        UnprivilegedUserfaultfd(Some(before))
    }
}

impl Drop for UnprivilegedUserfaultfd {
    fn drop(&mut self) {
        if let Some(before) = &self.0 {
            let _ = std::fs::write(UFFD_SYSCTL, before);
        }
    }
}

const LAUNCHER_BOOT: Duration = Duration::from_secs(240);
const LAUNCHER_MIGRATION: Duration = Duration::from_secs(300);

/// Between real launchers on KubeVirt's default non-root pods (QEMU as 107, on a node that lets
/// it use userfaultfd: see the module doc), one
/// boot of the disk guest with a workload that never converges at the bandwidth given (8 MiB
/// rewritten in a loop in a tmpfs) and its containerDisk overlay mirrored over NBD:
///
/// 0. the mirror's NBD leg stalls just before post-copy is requested: the progress timeout
///    fails the migration before QEMU entered post-copy, and the source runs on;
/// 1. post-copy with the disk mirror: data written to the overlay while its mirror runs is on
///    the target's disk (read back past the page cache), because the mirror is READY before the
///    RAM migration starts and completed at `pre-switchover`, before the target runs the guest;
/// 2. a cancel during post-copy is refused as libvirt refuses it: `AbortStatus` Aborting, then
///    Failed; the migration completes, not failed, and the guest keeps running on the target;
/// 3. then from the target to a third pod with workload disruption allowed and post-copy not:
///    past the completion deadline the guest is paused (mode `Paused` while the migration
///    runs), pre-copy converges, and the guest runs on the third pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn between_launchers_post_copy_with_a_disk_mirror_refuses_a_cancel_then_a_pause_converges() {
    let images = GuestImages::locate();
    let _uffd = UnprivilegedUserfaultfd::allow();
    let (mut source, mut target) = pod_pair(&images.disk_qcow2);
    let uid = source.uid.clone();
    let plain = plain_vmi(&uid);
    let (_, mut sc) = boot(&mut source, &plain, LAUNCHER_BOOT).await;
    exec_until_ok(
        &mut sc,
        "mkdir -p /w && mount -t tmpfs -o size=24m w /w && \
         dd if=/dev/urandom of=/w/a bs=1M count=8 2>/dev/null",
        Duration::from_secs(120),
    )
    .await;
    exec_until_ok(
        &mut sc,
        "(while :; do dd if=/w/a of=/w/b bs=1M conv=notrunc 2>/dev/null; done) \
         </dev/null >/dev/null 2>&1 & \
         (i=0; while :; do i=$((i+1)); echo $i >/w/counter; sleep 0.05; done) \
         </dev/null >/dev/null 2>&1 &",
        Duration::from_secs(30),
    )
    .await;

    // 0: the disk mirror's NBD leg stalls before post-copy is requested (the guest keeps writing
    // to its disk): QEMU's vCPU stop on the way into post-copy drains the disks and waits for the
    // mirror's writes with its main loop held. The progress timeout (5 s) fails the migration,
    // the launcher cuts the mirror's connection, and since QEMU never entered post-copy the
    // source rolls back and runs on.
    {
        let mut stalled = Pod::new(&images.disk_qcow2, true);
        stalled.uid = uid.clone();
        let vmi0 = migrating_vmi(&uid, "mig-pc-stall", &stalled.pod_name(), POD_MAC);
        let n = stalled.start_launcher();
        let mut c = stalled.client(n).await;
        assert_eq!(Rpc::sync_target(&mut c, &vmi0).await, (true, String::new()));
        let relay = Relay::start(&source, &stalled, &uid).await;
        exec_until_ok(
            &mut sc,
            "(while :; do dd if=/dev/urandom of=/data/churn bs=64k count=1 conv=fsync              2>/dev/null; sleep 0.5; done) </dev/null >/dev/null 2>&1 & echo $! >/w/churn",
            Duration::from_secs(30),
        )
        .await;
        let mut opts: serde_json::Value =
            serde_json::from_slice(&disruptive_options("1Mi", 20, true)).unwrap();
        opts["ProgressTimeout"] = 5.into();
        assert_eq!(
            Rpc::migrate(&mut sc, &vmi0, &serde_json::to_vec(&opts).unwrap()).await,
            (true, String::new())
        );
        // The RAM copy runs (the job's total counts the 128 MiB): the mirror is READY.
        let deadline = std::time::Instant::now() + LAUNCHER_MIGRATION;
        while job_data(&mut sc).await.0 < 128 << 20 {
            assert!(
                std::time::Instant::now() < deadline,
                "the RAM copy never started"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        relay.freeze_nbd(true);
        let ended = wait_notified(
            &source,
            "the stalled migration ended",
            LAUNCHER_MIGRATION,
            |d| metadata(d).is_some_and(|m| m.uid == "mig-pc-stall" && m.end_timestamp.is_some()),
        )
        .await;
        let m = metadata(&ended).unwrap();
        eprintln!("stalled before post-copy: {}", m.failure_reason);
        assert!(m.failed, "{m:?}");
        assert_eq!(m.mode, "PostCopy", "{m:?}");
        assert!(
            m.failure_reason.contains("stuck for")
                || m.failure_reason.contains("mirrors did not complete"),
            "{m:?}"
        );
        wait_running(&mut sc).await;
        let a = ram_counter(&mut sc).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let b = ram_counter(&mut sc).await;
        assert!(b > a, "the source's workload stopped: {a} -> {b}");
        exec_until_ok(&mut sc, "kill $(cat /w/churn)", Duration::from_secs(30)).await;
    }

    // 1 and 2: post-copy, with a cancel once it runs.
    let vmi = migrating_vmi(&uid, "mig-pc", &target.pod_name(), POD_MAC);
    let t = target.start_launcher();
    let mut tc = target.client(t).await;
    assert_eq!(Rpc::sync_target(&mut tc, &vmi).await, (true, String::new()));
    let relay = Relay::start(&source, &target, &uid).await;
    // QEMU sends post-copy at full speed: a slow network keeps it running for the cancel.
    relay.throttle_stream(4 << 20);
    // 128 MiB of RAM and the disk are one decimal GB: post-copy after 10 s.
    assert_eq!(
        Rpc::migrate(&mut sc, &vmi, &disruptive_options("1Mi", 10, true)).await,
        (true, String::new())
    );
    // Written while the mirror runs (at 1 MiB/s): the mirror carries it.
    let sum = exec_until_ok(
        &mut sc,
        "dd if=/dev/urandom of=/data/during bs=64k count=32 2>/dev/null && sync && \
         md5sum /data/during",
        Duration::from_secs(60),
    )
    .await;
    let sum = sum.split_whitespace().next().unwrap().to_owned();
    let before = ram_counter(&mut sc).await;
    let m = wait_mode(&mut sc, "mig-pc", "PostCopy").await;
    assert!(
        m.end_timestamp.is_none() && m.abort_status.is_empty(),
        "{m:?}"
    );
    assert_eq!(Rpc::cancel(&mut sc, &vmi).await, (true, String::new()));
    let m = get_domain(&mut sc)
        .await
        .as_ref()
        .and_then(metadata)
        .unwrap();
    assert_eq!(m.abort_status, "Failed", "{m:?}");
    assert!(m.end_timestamp.is_none(), "{m:?}");
    let ended = wait_notified(
        &source,
        "source Shutoff/Migrated with EndTimestamp",
        LAUNCHER_MIGRATION,
        |d| {
            d.status.status == L::Shutoff
                && metadata(d).is_some_and(|m| m.uid == "mig-pc" && m.end_timestamp.is_some())
        },
    )
    .await;
    assert_eq!(ended.status.reason, R::Migrated);
    let m = metadata(&ended).unwrap();
    assert!(!m.failed, "{m:?}");
    assert_eq!(
        (m.mode.as_str(), m.abort_status.as_str()),
        ("PostCopy", "Failed")
    );
    let aborts: Vec<String> = source
        .received
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(_, d)| metadata(d))
        .filter(|m| m.uid == "mig-pc")
        .map(|m| m.abort_status)
        .collect();
    let aborting = aborts.iter().position(|a| a == "Aborting").unwrap();
    let failed = aborts.iter().position(|a| a == "Failed").unwrap();
    assert!(aborting < failed, "{aborts:?}");
    wait_notified(
        &target,
        "target Running with EndTimestamp",
        LAUNCHER_MIGRATION,
        |d| {
            d.status.status == L::Running
                && metadata(d).is_some_and(|m| m.uid == "mig-pc" && m.end_timestamp.is_some())
        },
    )
    .await;
    assert_eq!(Rpc::finalize(&mut tc, &vmi).await, (true, String::new()));
    drop(relay);
    let after = ram_counter(&mut tc).await;
    assert!(
        after > before,
        "counter: {before} on the source, {after} on the target"
    );
    // The target's disk, past the page cache.
    let moved = exec_until_ok(
        &mut tc,
        "sync && echo 3 >/proc/sys/vm/drop_caches && md5sum /data/during",
        Duration::from_secs(60),
    )
    .await;
    assert!(moved.contains(&sum), "{moved} vs {sum}");

    // 3: on to a third pod, pausing the guest to converge.
    let mut third = Pod::new(&images.disk_qcow2, true);
    third.uid = uid.clone();
    let vmi2 = migrating_vmi(&uid, "mig-pause", &third.pod_name(), POD_MAC);
    // At 8 MiB/s the loop never lets pre-copy converge; paused after 10 s, the rest (about
    // 80 MiB sent by then) goes well within the doubled deadline.
    let (_, mut hc, _relay2) = migrate_on(
        &target,
        &mut tc,
        &mut third,
        &vmi2,
        "mig-pause",
        &disruptive_options("8Mi", 10, false),
        LAUNCHER_MIGRATION,
    )
    .await;
    let ended = wait_notified(
        &target,
        "target Shutoff/Migrated with EndTimestamp",
        LAUNCHER_MIGRATION,
        |d| {
            d.status.status == L::Shutoff
                && metadata(d).is_some_and(|m| m.uid == "mig-pause" && m.end_timestamp.is_some())
        },
    )
    .await;
    let m = metadata(&ended).unwrap();
    assert!(!m.failed, "{m:?}");
    assert_eq!(m.mode, "Paused", "{m:?}");
    // The mode was recorded while the migration ran, as virt-handler reads it.
    let running_paused = target.received.lock().unwrap().iter().any(|(_, d)| {
        metadata(d).is_some_and(|m| {
            m.uid == "mig-pause" && m.mode == "Paused" && m.end_timestamp.is_none()
        })
    });
    assert!(running_paused, "{:?}", target.events());
    assert_eq!(Rpc::finalize(&mut hc, &vmi2).await, (true, String::new()));
    let a = ram_counter(&mut hc).await;
    assert!(a >= after, "counter went back: {after} -> {a}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let b = ram_counter(&mut hc).await;
    assert!(b > a, "the workload stopped on the third pod: {a} -> {b}");
    let moved = exec_until_ok(&mut hc, "md5sum /data/during", Duration::from_secs(60)).await;
    assert!(moved.contains(&sum), "{moved} vs {sum}");
}
