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
//! `/dev/userfaultfd`; QEMU 8.1 and later can).

use std::time::Duration;

use qlauncher::qmp::QmpClient;
use qlauncher::sync::migration::source::{
    resolved_machine, run_source_with, SourceEvent, SourcePlan,
};
use qlauncher::sync::migration::target::{TargetEnd, TargetSession};
use qlauncher::sync::migration::MigrationOptions;
use testkit::guest::{GuestImages, Vm, BOOT_TIMEOUT};
use testkit::migration::{running_domain, target_sockets};
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
