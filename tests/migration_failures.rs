//! Failed (and one paused) live migrations between real launchers (`qlauncher launcher`), the test playing both
//! virt-handlers and the migration proxy (see `migration_launchers.rs`). One boot of the source
//! guest serves every case, one after the other, each with a fresh target pod and migration UID
//! (a source that survives a failed migration can be migrated again, as in KubeVirt):
//!
//! - a target pod prepared but never reached exits on `SignalTargetPodCleanup`;
//! - cancel mid-copy (the RAM stream limited to 1 MiB/s, so the copy of 128 MiB is still running
//!   when the cancel comes): `AbortStatus` Aborting then Succeeded, `Failed` with KubeVirt's
//!   reason, the source runs on, the target's QEMU is gone, its final notification comes at once
//!   and `SignalTargetPodCleanup` ends its launcher;
//! - the target's QEMU killed mid-copy: `Failed` with a reason, the source runs on;
//! - the migration stream stalled mid-copy: no progress, the progress timeout aborts;
//! - the disk mirror's NBD leg mute before the mirror connects: the progress timeout fails it
//!   while QEMU waits in `blockdev-add`, and the source runs on;
//! - the target's QEMU frozen (SIGSTOP) mid-copy: the progress timeout fails the migration and
//!   the source QEMU is not wedged on the disk mirror's pending NBD writes;
//! - last, a user-paused VMI migrates and stays paused on the target until unpaused.
//!
//! The pods are non-root ones (QEMU runs as 107): the proxy sockets are QEMU's to use.
//! Needs root and the test guest (`scripts/build-guest`).

use std::time::Duration;

use qlauncher::sync::domain::{LifeCycle as L, StateChangeReason as R};
use testkit::guest::GuestImages;
use testkit::launcher::{get_domain, Pod};
use testkit::migration::{
    boot, exec_until_ok, job_data, metadata, migrating_vmi, options, read_counter, Relay, Rpc,
};

const BOOT: Duration = Duration::from_secs(240);
const END: Duration = Duration::from_secs(120);

/// Waits until GetDomain of the source shows the migration `uid` ended; returns its record.
async fn ended(
    c: &mut testkit::handler::Client,
    uid: &str,
) -> qlauncher::sync::domain::MigrationMetadata {
    let deadline = std::time::Instant::now() + END;
    loop {
        if let Some(m) = get_domain(c).await.as_ref().and_then(metadata) {
            if m.uid == uid && m.end_timestamp.is_some() {
                return m;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "migration {uid} never ended"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The state letter of process `pid` (`/proc/PID/stat`: `T` stopped, `S` sleeping…).
fn process_state(pid: i32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .unwrap_or('?')
}

/// Waits until GetDomain shows `state` (the launcher's current state, not a past notification).
async fn wait_state(c: &mut testkit::handler::Client, state: (L, R)) {
    let deadline = std::time::Instant::now() + END;
    loop {
        if let Some(d) = get_domain(c).await {
            if (d.status.status, d.status.reason) == state {
                return;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the domain never reached {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn source_runs(source: &Pod, c: &mut testkit::handler::Client) {
    let d = get_domain(c).await.expect("source domain");
    assert_eq!(d.status.status, L::Running, "{:?}", source.events());
    let a = read_counter(c, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let b = read_counter(c, Duration::from_secs(30)).await;
    assert!(b > a, "the source's workload stopped: {a} -> {b}");
}

/// A target pod for `uid`, prepared by SyncMigrationTarget, and the relay to it.
async fn prepared_target(
    images: &GuestImages,
    source: &Pod,
    uid: &str,
    migration: &str,
) -> (
    Pod,
    usize,
    testkit::handler::Client,
    serde_json::Value,
    Relay,
) {
    let mut target = Pod::new(&images.disk_qcow2, true);
    target.uid = uid.to_owned();
    let vmi = migrating_vmi(uid, migration, &target.pod_name(), testkit::netns::POD_MAC);
    let t = target.start_launcher();
    let mut tc = target.client(t).await;
    assert_eq!(Rpc::sync_target(&mut tc, &vmi).await, (true, String::new()));
    let relay = Relay::start(source, &target, uid).await;
    (target, t, tc, vmi, relay)
}

async fn wait_target_qemu(target: &Pod, t: usize) -> i32 {
    target.wait_qemu(t, Duration::from_secs(120)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_migrations_leave_the_source_running_then_a_paused_vmi_stays_paused() {
    let images = GuestImages::locate();
    let mut source = Pod::new(&images.disk_qcow2, true);
    let uid = source.uid.clone();
    let mut plain = migrating_vmi(&uid, "none", "none", testkit::netns::POD_MAC);
    plain["status"] = serde_json::json!({"migrationTransport": "Unix"});
    let (_, mut sc) = boot(&mut source, &plain, BOOT).await;
    exec_until_ok(
        &mut sc,
        "(i=0; while :; do i=$((i+1)); echo $i >/tmp/counter; sleep 0.05; done) \
         </dev/null >/dev/null 2>&1 &",
        Duration::from_secs(30),
    )
    .await;

    // A prepared target that never got a QEMU exits when told to clean up.
    {
        let (mut target, t, mut tc, vmi, _relay) =
            prepared_target(&images, &source, &uid, "mig-signal").await;
        let mut other = vmi.clone();
        other["status"]["migrationState"]["targetPod"] = "someone-else".into();
        assert_eq!(
            Rpc::signal_cleanup(&mut tc, &other).await,
            (true, String::new())
        );
        assert_eq!(
            Rpc::signal_cleanup(&mut tc, &vmi).await,
            (true, String::new())
        );
        let status = target.wait_launcher(t, Duration::from_secs(30)).await;
        assert!(!status.success(), "{status:?}");
    }

    // Cancel mid-copy.
    {
        let (mut target, t, mut tc, vmi, _relay) =
            prepared_target(&images, &source, &uid, "mig-cancel").await;
        assert_eq!(
            Rpc::migrate(&mut sc, &vmi, &options("1Mi", 150)).await,
            (true, String::new())
        );
        let tq = wait_target_qemu(&target, t).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let running = get_domain(&mut sc)
            .await
            .and_then(|d| metadata(&d))
            .unwrap();
        assert!(
            running.end_timestamp.is_none(),
            "ended before the cancel: {running:?}"
        );
        // The migration metrics virt-handler polls: the job's data in GetDomainStats.
        let stats = sc
            .get_domain_stats(qlauncher::sync::rpc::proto::cmd::v1::EmptyRequest {})
            .await
            .unwrap()
            .into_inner();
        let stats: serde_json::Value = serde_json::from_str(&stats.domain_stats).unwrap();
        let job = &stats["MigrateDomainJobInfo"];
        assert!(job["DataTotal"].as_u64().unwrap_or(0) > 0, "{job}");
        assert!(job["DataRemaining"].as_u64().unwrap_or(0) > 0, "{job}");
        assert_eq!(Rpc::cancel(&mut sc, &vmi).await, (true, String::new()));
        let m = ended(&mut sc, "mig-cancel").await;
        assert!(m.failed, "{m:?}");
        assert_eq!(m.failure_reason, "Live migration has been aborted");
        assert_eq!(m.abort_status, "Succeeded");
        // A repeated cancel of the ended migration changes nothing.
        assert_eq!(Rpc::cancel(&mut sc, &vmi).await, (true, String::new()));
        source_runs(&source, &mut sc).await;
        assert!(
            testkit::process::wait_until(Duration::from_secs(30), || !target
                .qemu_pids()
                .contains(&tq)),
            "the target's QEMU is still there"
        );
        // libvirt removes a failed incoming migration's transient domain at once: the target's
        // final notification (its domain with a deletion timestamp) comes now, not after the
        // 15 s wait for DeleteVirtualMachine, and the target launcher serves until
        // virt-handler's SignalTargetPodCleanup, then exits cleanly.
        assert!(
            testkit::process::wait_until(Duration::from_secs(10), || target
                .received
                .lock()
                .unwrap()
                .iter()
                .any(|(_, d)| d.object_meta.deletion_timestamp.is_some())),
            "no final notification from the target within 10 s"
        );
        assert_eq!(
            Rpc::signal_cleanup(&mut tc, &vmi).await,
            (true, String::new())
        );
        let status = target.wait_launcher(t, Duration::from_secs(10)).await;
        assert!(status.success(), "{status:?}");
        let aborting = source
            .received
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(_, d)| metadata(d))
            .filter(|m| m.uid == "mig-cancel")
            .map(|m| m.abort_status)
            .collect::<Vec<_>>();
        let first_aborting = aborting.iter().position(|a| a == "Aborting").unwrap();
        let first_succeeded = aborting.iter().position(|a| a == "Succeeded").unwrap();
        assert!(first_aborting < first_succeeded, "{aborting:?}");
    }

    // The target's QEMU killed mid-copy.
    {
        let (target, t, _tc, vmi, _relay) =
            prepared_target(&images, &source, &uid, "mig-kill").await;
        assert_eq!(
            Rpc::migrate(&mut sc, &vmi, &options("1Mi", 150)).await,
            (true, String::new())
        );
        let tq = wait_target_qemu(&target, t).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        // SAFETY: a signal to the QEMU this test's target launcher started.
        assert_eq!(unsafe { libc::kill(tq, libc::SIGKILL) }, 0);
        let m = ended(&mut sc, "mig-kill").await;
        assert!(m.failed && !m.failure_reason.is_empty(), "{m:?}");
        eprintln!("target killed: {}", m.failure_reason);
        source_runs(&source, &mut sc).await;
    }

    // No progress: the network drops the migration stream (the relay stops forwarding it);
    // the progress timeout (3 s) aborts.
    {
        let (target, t, _tc, vmi, relay) =
            prepared_target(&images, &source, &uid, "mig-stuck").await;
        assert_eq!(
            Rpc::migrate(&mut sc, &vmi, &options("1Mi", 3)).await,
            (true, String::new())
        );
        let tq = wait_target_qemu(&target, t).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        relay.freeze_stream(true);
        let m = ended(&mut sc, "mig-stuck").await;
        assert!(m.failed && m.failure_reason.contains("stuck for"), "{m:?}");
        source_runs(&source, &mut sc).await;
        assert!(
            testkit::process::wait_until(Duration::from_secs(30), || !target
                .qemu_pids()
                .contains(&tq)),
            "the target's QEMU is still there"
        );
    }

    // The NBD leg stops before the mirrors connect (the target's NBD server never gets the
    // negotiation's answers, as with a target frozen just then): the source QEMU waits in the
    // mirror's `blockdev-add` with its main loop held. The progress timeout (3 s) fails the
    // migration, cutting the mirror's connection frees QEMU, and the source runs on.
    {
        let (_target, _t, _tc, vmi, relay) =
            prepared_target(&images, &source, &uid, "mig-nbd-mute").await;
        relay.freeze_nbd(true);
        assert_eq!(
            Rpc::migrate(&mut sc, &vmi, &options("1Mi", 3)).await,
            (true, String::new())
        );
        let m = ended(&mut sc, "mig-nbd-mute").await;
        assert!(m.failed && m.failure_reason.contains("stuck for"), "{m:?}");
        source_runs(&source, &mut sc).await;
    }

    // The target's QEMU frozen (SIGSTOP) mid-copy, its NBD server and stream no longer read:
    // the progress timeout (3 s) fails the migration while the target is still frozen, and the
    // source QEMU is not wedged on the mirror's pending writes — it pauses and resumes at once
    // (`stop` drains every disk), and migrates again below.
    {
        let (target, t, _tc, vmi, _relay) =
            prepared_target(&images, &source, &uid, "mig-frozen").await;
        assert_eq!(
            Rpc::migrate(&mut sc, &vmi, &options("1Mi", 3)).await,
            (true, String::new())
        );
        let tq = wait_target_qemu(&target, t).await;
        // Frozen once the disk mirror writes to it (the job's data in GetDomainStats).
        let deadline = std::time::Instant::now() + END;
        while job_data(&mut sc).await.0 == 0 {
            assert!(std::time::Instant::now() < deadline, "no mirror job");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // SAFETY: a signal to the QEMU this test's target launcher started.
        assert_eq!(unsafe { libc::kill(tq, libc::SIGSTOP) }, 0);
        let m = ended(&mut sc, "mig-frozen").await;
        assert!(m.failed && m.failure_reason.contains("stuck for"), "{m:?}");
        assert_eq!(process_state(tq), 'T', "the target was resumed");
        let paused = tokio::time::timeout(
            Duration::from_secs(20),
            sc.pause_virtual_machine(testkit::handler::vmi_only(&plain)),
        )
        .await
        .expect("the source QEMU is wedged: pause took more than 20 s")
        .unwrap()
        .into_inner();
        assert!(paused.success, "{paused:?}");
        wait_state(&mut sc, (L::Paused, R::User)).await;
        let resumed = sc
            .unpause_virtual_machine(testkit::handler::vmi_only(&plain))
            .await
            .unwrap()
            .into_inner();
        assert!(resumed.success, "{resumed:?}");
        wait_state(&mut sc, (L::Running, R::Unknown)).await;
        assert_eq!(process_state(tq), 'T', "the target was resumed");
        source_runs(&source, &mut sc).await;
        // SAFETY: as above; SIGKILL ends a stopped process too.
        assert_eq!(unsafe { libc::kill(tq, libc::SIGKILL) }, 0);
    }

    // Last (it consumes the source): a user-paused VMI migrates and stays paused on the target
    // (Paused/User, which virt-handler counts as active), running again once unpaused.
    {
        let (target, _t, mut tc, vmi, _relay) =
            prepared_target(&images, &source, &uid, "mig-paused").await;
        let paused = sc
            .pause_virtual_machine(testkit::handler::vmi_only(&plain))
            .await
            .unwrap()
            .into_inner();
        assert!(paused.success, "{paused:?}");
        wait_state(&mut sc, (L::Paused, R::User)).await;
        assert_eq!(
            Rpc::migrate(&mut sc, &vmi, &options("0", 150)).await,
            (true, String::new())
        );
        testkit::migration::wait_notified(&source, "source Shutoff/Migrated", END, |d| {
            d.status.status == L::Shutoff
                && d.status.reason == R::Migrated
                && metadata(d).is_some_and(|m| m.uid == "mig-paused" && m.end_timestamp.is_some())
        })
        .await;
        testkit::migration::wait_notified(
            &target,
            "target Paused/User with EndTimestamp",
            END,
            |d| {
                (d.status.status, d.status.reason) == (L::Paused, R::User)
                    && metadata(d).is_some_and(|m| m.end_timestamp.is_some() && !m.failed)
            },
        )
        .await;
        let resumed = tc
            .unpause_virtual_machine(testkit::handler::vmi_only(&plain))
            .await
            .unwrap()
            .into_inner();
        assert!(resumed.success, "{resumed:?}");
        target.wait_event((L::Running, R::Unknown), END).await;
        source_runs(&target, &mut tc).await;
    }
}
