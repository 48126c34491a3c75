//! KubeVirt v1.9 pull backups with changed block tracking on a real guest (TCG), through the
//! real cmd socket as virt-handler calls `BackupVirtualMachine`, one guest boot for all:
//! - after the guest wrote known blocks, a full pull Start serves the CBT disk `data` on
//!   KubeVirt's NBD socket (`backup-nbd-sock`); the guest writes more; `qemu-img convert` of
//!   the export over `nbd+unix` equals the disk at Start (the fleecing image keeps the point
//!   in time);
//! - `Export` to a stand-in virt-exportserver (TLS with client certificates, HTTP/2 CONNECT):
//!   the export server's `kubevirt.nbd.NBD` Read of `data` through the launcher's tunnel is the
//!   disk at Start while the guest keeps writing, and its Map covers the whole disk; a repeated
//!   Export of the same backup is a no-op;
//! - Abort ends it as KubeVirt counts a cancelled pull: completed, not failed, no message; the
//!   tunnel ends (the export server's connection closes, a Read fails), the socket and the
//!   scratch file are gone, the NBD server no longer answers, and a later Export is refused by
//!   KubeVirt's eligibility check;
//! - an incremental pull since the first checkpoint offers `qemu:dirty-bitmap:<checkpoint>`:
//!   `qemu-img map` with `x-dirty-bitmap` shows exactly the clusters written since (as
//!   `data: false`), and its content is the disk at its Start.
//!
//! Needs root and the test guest (`scripts/build-guest`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use guest::{Console, GuestImages};
use qlauncher::sync::backup::tunnel::proto;
use qlauncher::sync::domain::BackupMetadata;
use serde_json::{json, Value};
use testkit::backup::{backup, backup_events, cbt_vmi, checkpoint, completed, sh, write};
use testkit::export_server::{export_server, make_pki, map, read_all, Session};
use testkit::guest;
use testkit::handler;
use testkit::in_process::{InProcess, LauncherRoot};
use testkit::notify::Received;
use testkit::storage::run;

const MIB: usize = 1 << 20;
const CLUSTER: usize = 64 << 10;
const DISK: usize = 16 * MIB;
/// The export server's TLS name (`exportServerName`), as virt-controller names its service.
const EXPORT_SERVER_NAME: &str = "virt-export-pull.default.svc";

/// The first domain event of the running backup `name` that carries the freeze's outcome.
async fn quiesced(received: &Received, name: &str) -> BackupMetadata {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(b) = backup_events(received, name)
            .into_iter()
            .find(|b| !b.completed && !b.quiesce_status.is_empty())
        {
            return b;
        }
        assert!(
            Instant::now() < deadline,
            "no event of backup {name} with its quiesce status: {:?}",
            backup_events(received, name)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The raw content of NBD export `data` on `socket`.
fn read_export(socket: &Path, scratch: &Path) -> Vec<u8> {
    let out = scratch.join("export.raw");
    let url = format!("nbd+unix:///data?socket={}", socket.display());
    run(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &url,
            out.to_str().unwrap(),
        ],
    );
    let bytes = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    bytes
}

/// The 64 KiB clusters the export's dirty bitmap `bitmap` marks (`data: false` in this mode).
fn dirty_clusters(socket: &Path, bitmap: &str) -> Vec<usize> {
    let opts = format!(
        "driver=nbd,export=data,server.type=unix,server.path={},x-dirty-bitmap=qemu:dirty-bitmap:{bitmap}",
        socket.display()
    );
    let map: Value = serde_json::from_str(&run(
        "qemu-img",
        &["map", "--output=json", "--image-opts", &opts],
    ))
    .unwrap();
    let mut clusters = Vec::new();
    for e in map.as_array().unwrap() {
        if e["data"] == false {
            let start = e["start"].as_u64().unwrap() as usize;
            let len = e["length"].as_u64().unwrap() as usize;
            clusters.extend((start / CLUSTER)..(start + len).div_ceil(CLUSTER));
        }
    }
    clusters
}

async fn wait_marker(log: &Path, prefix: &str) {
    let deadline = Instant::now() + guest::BOOT_TIMEOUT;
    loop {
        let text = std::fs::read(log).unwrap_or_default();
        if String::from_utf8_lossy(&text)
            .lines()
            .any(|l| l.contains(prefix))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {prefix:?} in {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn pull_backups_serve_the_point_in_time_and_the_dirty_bitmap_and_abort_cleans_up() {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
    // The export server stand-in listens on this namespace's loopback.
    testkit::run(&["ip", "link", "set", "lo", "up"]);
    testkit::in_process::runtime().block_on(scenario());
}

async fn scenario() {
    let images = GuestImages::locate();
    let uid = format!("b4c6e131-0001-4000-8000-{:012}", std::process::id());
    let root = LauncherRoot::new(&images.disk_qcow2, &uid);
    let scratch = root.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let target = PathBuf::from(&root.config.paths.hotplug_disks).join("b-backup-target-pvc");
    std::fs::create_dir_all(&target).unwrap();
    let image = root.private.join("vmi-disks/data/disk.img");
    let socket = root.config.backup_nbd_socket.clone();
    assert!(socket.ends_with("var/run/kubevirt/sockets/backup-nbd-sock"));
    let enabled = cbt_vmi("pull", &uid, "Enabled");

    let launcher = InProcess::start(root.config.clone(), &root.share_dir()).await;
    let mut client = launcher.client.clone();
    let received = launcher.received.clone();
    let (ok, message) = handler::sync(&mut client, &cbt_vmi("pull", &uid, "Initializing")).await;
    assert!(ok, "{message}");
    let (ok, message) = handler::sync(&mut client, &enabled).await;
    assert!(ok, "{message}");
    wait_marker(
        &root.private.join(&uid).join("virt-serial0-log"),
        "QLG: agent ready",
    )
    .await;
    let mut console = Console::connect(
        &root.private.join(&uid).join("virt-serial0"),
        Duration::from_secs(10),
    )
    .unwrap();
    console.send(b"\n").unwrap();
    sh(&mut console, "true");
    let disk = || {
        let b = std::fs::read(&image).unwrap();
        assert_eq!(b.len(), DISK);
        b
    };

    write(&mut console, 'A', 0, CLUSTER);
    write(&mut console, 'B', 10 * CLUSTER, CLUSTER);
    let at_t1 = disk();

    // Full pull b1.
    let t1 = "2026-12-03T11:00:01Z";
    let c1 = checkpoint("b1", t1);
    let start = |name: &str, t: &str, incremental: Option<&str>| {
        let mut o = json!({"backupName": name, "cmd": "Start", "mode": "Pull",
            "backupStartTime": t, "targetPath": target.to_str().unwrap()});
        if let Some(i) = incremental {
            o["incremental"] = i.into();
        }
        o
    };
    let answer = backup(&mut client, &enabled, start("b1", t1, None)).await;
    assert!(answer.success, "{}", answer.message);
    let scratch1 = target.join("pull").join(&c1).join("b1-data.qcow2");
    assert!(scratch1.exists(), "the scratch image");
    assert!(socket.exists(), "the NBD socket");
    // The metadata with the freeze's outcome reaches the notify server after the answer.
    let last = quiesced(&received, "b1").await;
    assert!(!last.completed);
    assert_eq!(last.mode, "Pull");
    assert_eq!(last.checkpoint_name, c1);
    assert_eq!(
        last.volumes,
        r#"[{"volumeName":"data","diskTarget":"vdb"}]"#
    );
    assert_eq!(last.quiesce_status, "Succeeded");

    // The guest writes on; the export keeps the point in time.
    write(&mut console, 'X', 0, CLUSTER);
    write(&mut console, 'Y', 20 * CLUSTER, CLUSTER);
    assert_ne!(disk(), at_t1);
    assert_eq!(
        read_export(&socket, &scratch),
        at_t1,
        "the export is the disk at Start"
    );

    // Export: virt-handler hands the launcher the export server's address, name, CA and the
    // backup's client certificate; the export server reads the disk through the tunnel.
    let pki = make_pki(EXPORT_SERVER_NAME);
    let (addr, mut sessions) = export_server(&pki).await;
    let export = json!({"backupName": "b1", "cmd": "Export", "mode": "Pull",
        "backupStartTime": t1, "exportServerAddr": addr, "exportServerName": EXPORT_SERVER_NAME,
        "caCert": pki.ca_pem, "backupCert": pki.client_cert, "backupKey": pki.client_key});
    let answer = backup(&mut client, &enabled, export.clone()).await;
    assert!(answer.success, "{}", answer.message);
    let session = tokio::time::timeout(Duration::from_secs(60), sessions.recv())
        .await
        .expect("the tunnel never reached the export server")
        .unwrap();
    let Session::Connected(authority, mut nbd, server) = session else {
        panic!("the tunnel's TLS failed with the right CA and name");
    };
    assert_eq!(authority, addr, "CONNECT to exportServerAddr");
    // A repeated Export of the same backup is a no-op (the tunnel keeps serving).
    let answer = backup(&mut client, &enabled, export.clone()).await;
    assert!(answer.success, "{}", answer.message);
    write(&mut console, 'V', 50 * CLUSTER, CLUSTER);
    assert_ne!(disk(), at_t1);
    assert_eq!(
        read_all(&mut nbd, "data").await,
        at_t1,
        "the export server's Read through the tunnel is the disk at Start"
    );
    let extents = map(&mut nbd, "data", "").await;
    assert_eq!(extents.first().map(|e| e.0), Some(0));
    assert_eq!(
        extents.iter().map(|e| e.1).sum::<u64>(),
        DISK as u64,
        "Map covers the disk: {extents:?}"
    );

    // Abort: a cancelled pull is a success; everything it served is gone.
    let abort =
        |name: &str, t: &str| json!({"backupName": name, "cmd": "Abort", "backupStartTime": t});
    let answer = backup(&mut client, &enabled, abort("b1", t1)).await;
    assert!(answer.success, "{}", answer.message);
    let b1 = completed(&received, "b1").await;
    assert!(!b1.failed, "{b1:?}");
    assert_eq!(b1.backup_msg, "");
    assert!(b1.end_timestamp.is_some());
    // The tunnel ends: the launcher closes the export server's connection.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server.is_finished() {
        assert!(Instant::now() < deadline, "the tunnel outlived the Abort");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let read = nbd
        .read(proto::ReadRequest {
            export_name: "data".into(),
            offset: 0,
            length: 0,
        })
        .await;
    assert!(read.is_err(), "a Read after the Abort");
    let answer = backup(&mut client, &enabled, export).await;
    assert!(!answer.success);
    assert!(
        answer.message.contains("backup already completed"),
        "{}",
        answer.message
    );
    assert!(!socket.exists(), "the NBD socket is gone");
    assert!(!scratch1.exists(), "the scratch image is removed");
    let url = format!("nbd+unix:///data?socket={}", socket.display());
    let probe = Command::new("qemu-img")
        .args(["info", &url])
        .output()
        .unwrap();
    assert!(!probe.status.success(), "the NBD server no longer answers");

    // Incremental pull b2 since b1's checkpoint.
    write(&mut console, 'Z', 30 * CLUSTER + 8192, 4096);
    let at_t2 = disk();
    let t2 = "2026-12-03T11:00:02Z";
    let c2 = checkpoint("b2", t2);
    let mut o = start("b2", t2, Some(&c1));
    o["skipQuiesce"] = true.into();
    let answer = backup(&mut client, &enabled, o).await;
    assert!(answer.success, "{}", answer.message);
    write(&mut console, 'W', 40 * CLUSTER, CLUSTER);
    assert_eq!(
        dirty_clusters(&socket, &c2),
        vec![0, 20, 30, 50],
        "the clusters written since b1's checkpoint"
    );
    assert_eq!(read_export(&socket, &scratch), at_t2);
    let answer = backup(&mut client, &enabled, abort("b2", t2)).await;
    assert!(answer.success, "{}", answer.message);
    let b2 = completed(&received, "b2").await;
    assert!(!b2.failed, "{b2:?}");
    assert_eq!(b2.quiesce_status, "Skipped");
    assert!(!socket.exists());
    assert!(!target.join("pull").join(&c2).join("b2-data.qcow2").exists());
    drop(console);
    drop(launcher);
}
