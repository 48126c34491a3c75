//! A persistent dirty bitmap (what a CBT checkpoint is in QEMU) migrates with the VM between
//! two real launchers in KubeVirt's default non-root pods: the source enables QEMU's
//! `dirty-bitmaps` capability on both sides when a block node holds one, so the target's QEMU,
//! whose overlay was made fresh in its own pod, has the bitmap with the source's dirty count,
//! still recording the guest's writes. Without it the target has no bitmap at all and the VM's
//! next backup would have to be full (KubeVirt v1.9's libvirt always migrates them,
//! `kubevirt-backup.md` §4.8 in the project's references).
//!
//! Needs root and the test guest (`scripts/build-guest`).

use std::path::PathBuf;
use std::time::Duration;

use qlauncher::sync::domain::LifeCycle as L;
use serde_json::{json, Value};
use testkit::guest::{GuestImages, Qmp};
use testkit::launcher::{get_domain, sync};
use testkit::migration::{
    exec_until_ok, migrating_vmi, options, plain_vmi, pod_pair, wait_notified, Relay, Rpc,
};

const BOOT: Duration = Duration::from_secs(240);
const MIGRATION: Duration = Duration::from_secs(240);
/// The checkpoint's bitmap name, as KubeVirt names checkpoints (`<backup>-<UTC timestamp>`).
const BITMAP: &str = "bk-20261203150000";

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_dirty_bitmap_migrates_with_its_count_and_keeps_recording() {
    let images = GuestImages::locate();
    let (mut source, mut target) = pod_pair(&images.disk_qcow2);
    let uid = source.uid.clone();
    source.operator_qmp = true;
    target.operator_qmp = true;

    let s = source.start_launcher();
    let mut sc = source.client(s).await;
    assert_eq!(sync(&mut sc, &plain_vmi(&uid)).await, (true, String::new()));
    exec_until_ok(&mut sc, "true", BOOT).await;
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
    let vmi = migrating_vmi(&uid, "mig-bitmaps", &target.pod_name(), &guest_mac);
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
    source.wait_launcher(s, Duration::from_secs(60)).await;
}
