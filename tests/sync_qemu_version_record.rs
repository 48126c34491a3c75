//! QEMU's version record (`usr/share/qlauncher/qemu-version.json`, written when the image is
//! built by `qlauncher qemu-version-record`): the real launcher (`qlauncher launcher` with
//! virt-launcher's flags, in a pod network namespace, `QLAUNCHER_ROOT` the pod's root) given a
//! record that matches its QEMU binary learns the version from it without running
//! `qemu --version`: GetQemuVersion before the domain answers the record's version, the domain
//! starts, and the "domain started" log line says the version came from the record. A stale
//! record (another mtime) is ignored: the launcher probes, starts the domain the same, and
//! rewrites the record for the next launcher.
//!
//! Needs root and the test guest (`scripts/build-guest`).

use std::path::Path;
use std::time::Duration;

use qlauncher::sync::config::find_in_path;
use qlauncher::sync::domain::{LifeCycle as L, StateChangeReason as R};
use qlauncher::sync::qemu_version::{QemuVersionRecord, QEMU_VERSION_RECORD};
use qlauncher::sync::rpc::proto::cmd::v1 as cmd;
use testkit::guest::GuestImages;
use testkit::launcher::{sync, vmi, Pod};

const START: Duration = Duration::from_secs(90);

/// The "domain started" line of the launcher's (JSON) log, once it is there.
async fn started_line(pod: &Pod, n: usize) -> serde_json::Value {
    for _ in 0..600 {
        if let Some(l) = pod
            .log(n)
            .lines()
            .find(|l| l.contains("domain started (sync"))
        {
            return serde_json::from_str(l).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no 'domain started' line:\n{}", pod.log(n));
}

fn write_record(pod: &Pod, record: &QemuVersionRecord) -> std::path::PathBuf {
    let path = pod.root.join(QEMU_VERSION_RECORD);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    record.write(&path).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matching_record_gives_the_version_without_a_probe() {
    let images = GuestImages::locate();
    let mut pod = Pod::new(&images.disk_qcow2, false);
    let qemu = find_in_path("qemu-system-x86_64");
    let real = QemuVersionRecord::probe(&qemu, &qemu).unwrap();
    // The real major.minor (it chooses argv details), a micro QEMU does not have: only the record
    // can say it.
    let line = format!(
        "QEMU emulator version {}.{}.997 (recorded by the test)",
        real.major, real.minor
    );
    let record = QemuVersionRecord::of(&qemu, &line).unwrap();
    let path = write_record(&pod, &record);

    let n = pod.start_launcher();
    let mut client = pod.client(n).await;
    let version = client
        .get_qemu_version(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        version.version,
        format!("QEMU {}.{}.997", real.major, real.minor)
    );
    assert_eq!(
        sync(&mut client, &vmi(&pod.uid)).await,
        (true, String::new())
    );
    pod.wait_event((L::Running, R::Unknown), START).await;
    let line = started_line(&pod, n).await;
    assert_eq!(line["qemu_version_source"], "record", "{line}");
    // The record was used, not rewritten.
    assert_eq!(QemuVersionRecord::load(&path, &qemu), Ok(record));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_record_is_ignored_and_rewritten() {
    let images = GuestImages::locate();
    let mut pod = Pod::new(&images.disk_qcow2, false);
    let qemu = find_in_path("qemu-system-x86_64");
    let mut stale = QemuVersionRecord::probe(&qemu, &qemu).unwrap();
    let real = stale.clone();
    stale.mtime -= 1;
    stale.version_line = "QEMU emulator version 1.0.0 (stale)".into();
    (stale.major, stale.minor) = (1, 0);
    let path = write_record(&pod, &stale);

    let n = pod.start_launcher();
    let mut client = pod.client(n).await;
    assert_eq!(
        sync(&mut client, &vmi(&pod.uid)).await,
        (true, String::new())
    );
    pod.wait_event((L::Running, R::Unknown), START).await;
    let line = started_line(&pod, n).await;
    assert_eq!(line["qemu_version_source"], "probe", "{line}");
    // The probe's answer, written for the next launcher.
    let rewritten = QemuVersionRecord::load(&path, &qemu).unwrap();
    assert_eq!(rewritten.version_line, real.version_line);
    assert!(Path::new(&path).is_file());
}
