//! A VM with 1,000 checkpoints still starts and backs up (KubeVirt never deletes a
//! checkpoint, so every backup leaves a persistent dirty bitmap in the CBT overlay for good):
//! the CBT overlay of the data disk is made before the launcher starts and given 1,000
//! persistent bitmaps (one QMP `transaction` through `qemu-storage-daemon`, as 1,000 earlier
//! backups would have left them); the launcher reuses it, the guest boots, `RedefineCheckpoint`
//! of an old one is valid, and a full backup and an incremental one after more guest writes
//! restore to the guest's disk block for block. No timing is asserted (the bench's backup
//! section times the same path).
//!
//! Needs root and the test guest (`scripts/build-guest`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use guest::{Console, GuestImages};
use qlauncher::qmp::client::QmpClient;
use qlauncher::sync::rpc::proto::cmd::v1 as cmd;
use serde_json::{json, Value};
use testkit::backup::{backup, cbt_vmi, completed, restore, sh, write};
use testkit::guest;
use testkit::handler;
use testkit::in_process::{InProcess, LauncherRoot};
use testkit::storage::run;

const MIB: usize = 1 << 20;
const CLUSTER: usize = 64 << 10;
/// The data disk's size.
const DISK: usize = 16 * MIB;
/// Checkpoints left by earlier backups.
const OLD_CHECKPOINTS: usize = 1000;

/// The name of old checkpoint `i` (KubeVirt's `<backupName>-<UTC time>` form).
fn old_checkpoint(i: usize) -> String {
    format!("old{i:04}-2026-01-01_00-00-00")
}

/// Makes the CBT overlay `overlay` over the raw `image` with `qemu-img` and gives it
/// [`OLD_CHECKPOINTS`] persistent bitmaps in one transaction of a `qemu-storage-daemon`.
async fn overlay_with_old_checkpoints(image: &Path, overlay: &Path, scratch: &Path) {
    std::fs::create_dir_all(image.parent().unwrap()).unwrap();
    std::fs::create_dir_all(overlay.parent().unwrap()).unwrap();
    std::fs::File::create(image)
        .unwrap()
        .set_len(DISK as u64)
        .unwrap();
    run(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-o",
            &format!("data_file={},data_file_raw=on", image.display()),
            overlay.to_str().unwrap(),
            &DISK.to_string(),
        ],
    );
    let socket = scratch.join("qsd.sock");
    let mut qsd = std::process::Command::new("qemu-storage-daemon")
        .arg("--blockdev")
        .arg(format!(
            "driver=file,filename={},node-name=s",
            overlay.display()
        ))
        .args(["--blockdev", "driver=qcow2,file=s,node-name=f"])
        .arg("--chardev")
        .arg(format!(
            "socket,path={},server=on,wait=off,id=m",
            socket.display()
        ))
        .args(["--monitor", "chardev=m"])
        .spawn()
        .expect("qemu-storage-daemon");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "no QMP socket of qemu-storage-daemon"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let client = QmpClient::connect(&socket, Duration::from_secs(10))
        .await
        .expect("QMP of qemu-storage-daemon");
    let actions: Vec<Value> = (0..OLD_CHECKPOINTS)
        .map(|i| {
            json!({"type": "block-dirty-bitmap-add",
                   "data": {"node": "f", "name": old_checkpoint(i), "persistent": true}})
        })
        .collect();
    client
        .execute_timeout(
            "transaction",
            Some(json!({"actions": actions})),
            Duration::from_secs(60),
        )
        .await
        .expect("1,000 bitmaps");
    let _ = client.execute("quit", None).await;
    assert!(qsd.wait().unwrap().success());
    let info = run("qemu-img", &["info", "-U", overlay.to_str().unwrap()]);
    assert_eq!(
        info.matches("name: old").count(),
        OLD_CHECKPOINTS,
        "the overlay keeps the bitmaps"
    );
}

fn start_options(target: &Path, name: &str, start: &str, incremental: Option<&str>) -> Value {
    let mut o = json!({"backupName": name, "cmd": "Start", "mode": "Push", "skipQuiesce": true,
        "backupStartTime": start, "targetPath": target.to_str().unwrap()});
    if let Some(i) = incremental {
        o["incremental"] = i.into();
    }
    o
}

/// Waits for a serial-log line containing `marker`.
async fn wait_marker(log: &Path, marker: &str) {
    let deadline = Instant::now() + guest::BOOT_TIMEOUT;
    loop {
        let text = std::fs::read(log).unwrap_or_default();
        if String::from_utf8_lossy(&text).contains(marker) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {marker:?} in {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn a_vm_with_1000_checkpoints_starts_and_backs_up_full_and_incremental() {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
    testkit::in_process::runtime().block_on(scenario());
}

async fn scenario() {
    let images = GuestImages::locate();
    let uid = format!("b4c6e131-0000-4000-8001-{:012}", std::process::id());
    let root = LauncherRoot::new(&images.disk_qcow2, &uid);
    let scratch = root.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let target = PathBuf::from(&root.config.paths.hotplug_disks).join("b-backup-target-pvc");
    std::fs::create_dir_all(&target).unwrap();
    let image = root.private.join("vmi-disks/data/disk.img");
    let overlay = root.private.join("libvirt/qemu/cbt/data.qcow2");
    overlay_with_old_checkpoints(&image, &overlay, &scratch).await;

    let launcher = InProcess::start(root.config.clone(), &root.share_dir()).await;
    let received = launcher.received.clone();
    let mut client = launcher.client.clone();
    let (ok, message) = handler::sync(&mut client, &cbt_vmi("many", &uid, "Initializing")).await;
    assert!(ok, "{message}");
    let enabled = cbt_vmi("many", &uid, "Enabled");
    let (ok, message) = handler::sync(&mut client, &enabled).await;
    assert!(ok, "{message}");
    let log = root.private.join(&uid).join("virt-serial0-log");
    wait_marker(&log, "QLG: agent ready").await;
    let mut console = Console::connect(
        &root.private.join(&uid).join("virt-serial0"),
        Duration::from_secs(10),
    )
    .unwrap();
    console.send(b"\n").unwrap();
    sh(&mut console, "true");
    let info = run("qemu-img", &["info", "-U", overlay.to_str().unwrap()]);
    assert!(
        info.contains(&old_checkpoint(OLD_CHECKPOINTS - 1)),
        "the launcher reused the overlay with its bitmaps"
    );

    // An old checkpoint is found among the 1,000 (as after a restart).
    let answer = client
        .redefine_checkpoint(cmd::RedefineCheckpointRequest {
            vmi: Some(handler::vmi_message(&enabled)),
            checkpoint: json!({"name": old_checkpoint(500), "creationTime": "2026-01-01T00:00:00Z",
                "volumes": [{"volumeName": "data", "diskTarget": "vdb"}]})
            .to_string()
            .into_bytes(),
        })
        .await
        .expect("RedefineCheckpoint")
        .into_inner();
    assert!(answer.response.as_ref().unwrap().success, "{answer:?}");
    assert!(!answer.checkpoint_invalid, "{answer:?}");

    write(&mut console, 'A', 0, CLUSTER);
    write(&mut console, 'B', DISK - CLUSTER, CLUSTER);
    let at_t1 = std::fs::read(&image).unwrap();

    let t1 = "2026-12-03T11:00:01Z";
    let c1 = "b1-2026-12-03_11-00-01";
    let answer = backup(
        &mut client,
        &enabled,
        start_options(&target, "b1", t1, None),
    )
    .await;
    assert!(answer.success, "{}", answer.message);
    let b1 = completed(&received, "b1").await;
    assert!(!b1.failed, "{b1:?}");
    assert_eq!(b1.checkpoint_name, c1);
    let full = target.join("many").join(c1).join("b1-data.qcow2");
    assert!(
        restore(&full, None, &scratch) == at_t1,
        "full backup = disk at T1"
    );

    write(&mut console, 'C', 5 * CLUSTER, CLUSTER);
    write(&mut console, 'D', 7 * CLUSTER + 4096, 4096);
    let at_t2 = std::fs::read(&image).unwrap();

    let t2 = "2026-12-03T11:00:02Z";
    let c2 = "b2-2026-12-03_11-00-02";
    let answer = backup(
        &mut client,
        &enabled,
        start_options(&target, "b2", t2, Some(c1)),
    )
    .await;
    assert!(answer.success, "{}", answer.message);
    let b2 = completed(&received, "b2").await;
    assert!(!b2.failed, "{b2:?}");
    let incremental = target.join("many").join(c2).join("b2-data.qcow2");
    assert!(
        restore(&incremental, Some(&full), &scratch) == at_t2,
        "full + incremental = disk at T2"
    );

    // An incremental from one of the old checkpoints holds every write since it (a superset of
    // b2's) and restores the same.
    let t3 = "2026-12-03T11:00:03Z";
    let c3 = "b3-2026-12-03_11-00-03";
    let answer = backup(
        &mut client,
        &enabled,
        start_options(&target, "b3", t3, Some(&old_checkpoint(500))),
    )
    .await;
    assert!(answer.success, "{}", answer.message);
    let b3 = completed(&received, "b3").await;
    assert!(!b3.failed, "{b3:?}");
    let since_old = target.join("many").join(c3).join("b3-data.qcow2");
    assert!(
        restore(&since_old, Some(&full), &scratch) == at_t2,
        "full + incremental since an old checkpoint = disk at T2"
    );
    drop(launcher);
}
