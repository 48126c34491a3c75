//! A persistent dirty bitmap (what a CBT checkpoint is in QEMU) migrates with the VM between
//! two real launchers in KubeVirt's default non-root pods: the source enables QEMU's
//! `dirty-bitmaps` capability on both sides when a block node holds one, so the target's QEMU,
//! whose overlay was made fresh in its own pod, has the bitmap with the source's dirty count,
//! still recording the guest's writes. Without it the target has no bitmap at all and the VM's
//! next backup would have to be full (KubeVirt v1.9's libvirt always migrates them,
//! `kubevirt-backup.md` §4.8 in the project's references).
//!
//! The same boot carries a CBT disk (`data`, a filesystem PVC both pods share, each pod with
//! its own CBT overlay): a full push backup on the source, guest writes, the migration, then on
//! the target `RedefineCheckpoint` of that backup's checkpoint is valid, the guest writes more,
//! and an incremental backup on the target restores (rebased on the source's full backup) to
//! the guest's disk block for block: the writes between the full backup and the migration
//! came with the migrated bitmap.
//!
//! Needs root and the test guest (`scripts/build-guest`).

use std::os::unix::fs::chown;
use std::path::{Path, PathBuf};
use std::time::Duration;

use qlauncher::sync::domain::LifeCycle as L;
use serde_json::{json, Value};
use testkit::backup::{
    backup, checkpoint, completed, redefine, restore, with_cbt_data_disk, write_script,
};
use testkit::guest::{GuestImages, Qmp};
use testkit::kubelet::QEMU_ID;
use testkit::launcher::{get_domain, sync, Pod};
use testkit::migration::{
    exec, exec_until_ok, migrating_vmi, options, plain_vmi, pod_pair, wait_notified, Relay, Rpc,
};

const BOOT: Duration = Duration::from_secs(240);
const MIGRATION: Duration = Duration::from_secs(240);
/// The checkpoint's bitmap name, as KubeVirt names checkpoints (`<backup>-<UTC timestamp>`).
const BITMAP: &str = "bk-20261203150000";
const CLUSTER: usize = 64 << 10;
/// The CBT disk's size (`testkit::backup::with_cbt_data_disk`).
const DISK: usize = 16 << 20;
/// The backup target volume's directory name (virt-controller's `<backup>-backup-target-pvc`).
const TARGET_VOLUME: &str = "b-backup-target-pvc";

/// Runs `command` with `arguments` on the QEMU behind the operator's QMP socket `qmp`.
async fn qmp_run(qmp: PathBuf, command: &'static str, arguments: Value) -> Value {
    tokio::task::spawn_blocking(move || {
        let mut qmp = Qmp::connect(&qmp, Duration::from_secs(10)).unwrap();
        qmp.execute(command, arguments).unwrap()
    })
    .await
    .unwrap()
}

/// The root disk's format node (what `query-block` shows inserted under `ua-rootdisk`).
async fn root_node(qmp: PathBuf) -> String {
    let block = qmp_run(qmp, "query-block", json!({})).await;
    let root = block
        .as_array()
        .unwrap()
        .iter()
        .find(|b| {
            b["qdev"]
                .as_str()
                .is_some_and(|q| q.contains("ua-rootdisk"))
        })
        .unwrap_or_else(|| panic!("no ua-rootdisk in {block}"))
        .clone();
    root["inserted"]["node-name"].as_str().unwrap().to_owned()
}

/// The bitmap [`BITMAP`] of `node`, as `query-named-block-nodes` shows it, if there is one.
async fn bitmap(qmp: PathBuf, node: &str) -> Option<Value> {
    let nodes = qmp_run(qmp, "query-named-block-nodes", json!({"flat": true})).await;
    nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node-name"] == node)
        .and_then(|n| n["dirty-bitmaps"].as_array().cloned())
        .and_then(|b| b.into_iter().find(|b| b["name"] == BITMAP))
}

/// The backup target volume's directory in `pod` (mounted by virt-handler under
/// `hotplug-disks`), writable by the launcher's user; made when missing.
fn target_dir(pod: &Pod) -> PathBuf {
    let dir = pod.share().join("hotplug-disks").join(TARGET_VOLUME);
    std::fs::create_dir_all(&dir).unwrap();
    chown(&dir, Some(QEMU_ID), Some(QEMU_ID)).unwrap();
    dir
}

/// The push backup `name` started at `start` into `pod`'s target volume (incremental since
/// `incremental` when given), without a freeze; waits for its completion and returns the
/// target file.
async fn push_backup(
    pod: &Pod,
    client: &mut testkit::handler::Client,
    vmi: &Value,
    name: &str,
    start: &str,
    incremental: Option<&str>,
) -> PathBuf {
    let dir = target_dir(pod);
    let mut o = json!({"backupName": name, "cmd": "Start", "mode": "Push", "skipQuiesce": true,
        "backupStartTime": start, "targetPath": dir.to_str().unwrap()});
    if let Some(i) = incremental {
        o["incremental"] = i.into();
    }
    let answer = backup(client, vmi, o).await;
    assert!(answer.success, "{}", answer.message);
    let done = completed(&pod.received, name).await;
    assert!(!done.failed, "{done:?}");
    dir.join("hv")
        .join(checkpoint(name, start))
        .join(format!("{name}-data.qcow2"))
}

/// Runs the guest command `script` through `pod`'s launcher `n` (the agent's Exec) until it
/// exits 0 (60 s); panics with its last answer and the launcher's log.
async fn guest(pod: &Pod, n: usize, client: &mut testkit::handler::Client, script: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let answer = exec(client, script).await;
        if matches!(answer, Some((0, _))) {
            return;
        }
        if std::time::Instant::now() > deadline {
            let log = pod.log(n);
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "{script:?}: {answer:?}; launcher log (last lines first):\n{}",
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The CBT disk's bytes as the guest wrote them (data-file-raw: the PVC's raw image).
fn disk_bytes(image: &Path) -> Vec<u8> {
    let bytes = std::fs::read(image).unwrap();
    assert_eq!(bytes.len(), DISK);
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_dirty_bitmap_migrates_with_its_count_and_keeps_recording() {
    let images = GuestImages::locate();
    let (mut source, mut target) = pod_pair(&images.disk_qcow2);
    let uid = source.uid.clone();
    source.operator_qmp = true;
    target.operator_qmp = true;

    // The PVC's mount in each pod (kubelet's, with the pod's fsGroup: writable by 107).
    for pod in [&source, &target] {
        let mount = pod.private().join("vmi-disks/data");
        std::fs::create_dir_all(&mount).unwrap();
        chown(&mount, Some(QEMU_ID), Some(QEMU_ID)).unwrap();
    }
    let s = source.start_launcher();
    let mut sc = source.client(s).await;
    let (plain, data) = with_cbt_data_disk(plain_vmi(&uid), "Enabled");
    assert_eq!(sync(&mut sc, &plain).await, (true, String::new()));
    exec_until_ok(&mut sc, "true", BOOT).await;
    // The PVC is shared storage: the target pod sees the source's image (one inode).
    let image = source.private().join("vmi-disks/data/disk.img");
    let target_image = target.private().join("vmi-disks/data/disk.img");
    std::fs::hard_link(&image, &target_image).unwrap();
    // Known blocks, a full backup on the source, then writes its checkpoint tracks.
    guest(&source, s, &mut sc, &write_script(&data, 'A', 0, CLUSTER)).await;
    guest(
        &source,
        s,
        &mut sc,
        &write_script(&data, 'B', 10 * CLUSTER, CLUSTER),
    )
    .await;
    let t1 = "2026-12-03T15:00:01Z";
    let full = push_backup(&source, &mut sc, &plain, "b1", t1, None).await;
    guest(
        &source,
        s,
        &mut sc,
        &write_script(&data, 'C', 20 * CLUSTER, CLUSTER),
    )
    .await;
    let node = root_node(source.operator_qmp_socket()).await;
    qmp_run(
        source.operator_qmp_socket(),
        "block-dirty-bitmap-add",
        json!({"node": node, "name": BITMAP, "persistent": true}),
    )
    .await;
    // 4 MiB the guest writes to its root disk after the checkpoint.
    exec_until_ok(
        &mut sc,
        "dd if=/dev/urandom of=/data/after-checkpoint bs=1M count=4 conv=fsync 2>/dev/null",
        Duration::from_secs(60),
    )
    .await;
    let before = bitmap(source.operator_qmp_socket(), &node).await.unwrap();
    let dirty = before["count"].as_u64().unwrap();
    assert!(dirty >= 4 << 20, "{before}");

    let guest_mac = get_domain(&mut sc).await.unwrap().spec.devices.interfaces[0]
        .mac
        .clone()
        .unwrap()
        .mac;
    let (vmi, _) = with_cbt_data_disk(
        migrating_vmi(&uid, "mig-bitmaps", &target.pod_name(), &guest_mac),
        "Enabled",
    );
    let t = target.start_launcher();
    let mut tc = target.client(t).await;
    assert_eq!(Rpc::sync_target(&mut tc, &vmi).await, (true, String::new()));
    let _relay = Relay::start(&source, &target, &uid).await;
    assert_eq!(
        Rpc::migrate(&mut sc, &vmi, &options("0", 150)).await,
        (true, String::new())
    );
    wait_notified(
        &target,
        "target Running after the migration",
        MIGRATION,
        |d| {
            d.status.status == L::Running
                && d.spec
                    .metadata
                    .kubevirt
                    .migration
                    .as_ref()
                    .is_some_and(|m| m.end_timestamp.is_some() && !m.failed)
        },
    )
    .await;

    // The target's QEMU has the checkpoint on the same node, persistent, consistent, with at
    // least the source's count (the guest keeps writing its logs), and still recording.
    let moved = bitmap(target.operator_qmp_socket(), &node)
        .await
        .unwrap_or_else(|| panic!("no bitmap {BITMAP} on {node} of the target"));
    assert_eq!(moved["persistent"], true, "{moved}");
    assert_eq!(moved["recording"], true, "{moved}");
    assert_ne!(moved["inconsistent"], true, "{moved}");
    let moved_count = moved["count"].as_u64().unwrap();
    assert!(moved_count >= dirty, "{dirty} -> {moved}");
    // Recording on the target: cleared, then 1 MiB rewritten in place.
    qmp_run(
        target.operator_qmp_socket(),
        "block-dirty-bitmap-clear",
        json!({"node": node, "name": BITMAP}),
    )
    .await;
    exec_until_ok(
        &mut tc,
        "dd if=/dev/urandom of=/data/after-checkpoint bs=1M count=1 conv=notrunc,fsync 2>/dev/null",
        Duration::from_secs(60),
    )
    .await;
    let later = bitmap(target.operator_qmp_socket(), &node).await.unwrap();
    assert!(later["count"].as_u64().unwrap() >= 1 << 20, "{later}");

    // The migrated VM's next incremental backup: the tracker's checkpoint redefined on the
    // target (valid: its bitmap came with the migration), more writes (one over b1's data, one
    // 4 KiB inside a cluster), then the incremental since b1 on the target.
    let c1 = checkpoint("b1", t1);
    let redefined = redefine(&mut tc, &vmi, &c1, &data).await;
    assert!(!redefined.checkpoint_invalid, "{redefined:?}");
    guest(&target, t, &mut tc, &write_script(&data, 'D', 0, CLUSTER)).await;
    guest(
        &target,
        t,
        &mut tc,
        &write_script(&data, 'E', 30 * CLUSTER + 8192, 4096),
    )
    .await;
    let t2 = "2026-12-03T15:10:02Z";
    let incremental = push_backup(&target, &mut tc, &vmi, "b2", t2, Some(&c1)).await;
    let scratch = tempfile::tempdir().unwrap();
    assert_eq!(
        restore(&incremental, Some(&full), scratch.path()),
        disk_bytes(&target_image),
        "full (source) + incremental (target) = the guest's disk"
    );
    source.wait_launcher(s, Duration::from_secs(60)).await;
}
