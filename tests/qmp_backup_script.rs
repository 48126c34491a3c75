//! The push backup's QMP transaction (KubeVirt `BackupVirtualMachine` Start, libvirt's
//! `qemuBackupBegin`) against a scripted QMP peer: the exact `transaction` qlauncher sends for a
//! full backup of two CBT disks creating checkpoint `<name>-<UTC time>`, the one of an
//! incremental backup since an earlier checkpoint (libvirt's temporary `backup-<dst>` bitmap,
//! merged, then `sync: incremental`), and QEMU's refusal of it surfacing as a command error;
//! a pull backup's exact commands (libvirt's pull `qemuBackupBegin`, fact sheet §4.4):
//! `nbd-server-start` on KubeVirt's socket, the `sync: none` transaction into the scratch
//! nodes (an incremental pull's temporary bitmap on the scratch node, named as the new
//! checkpoint), the read-only `block-export-add` (bitmaps only for incremental), and the end:
//! `block-job-cancel` forced, `block-export-del`, `nbd-server-stop`; the targets' and the
//! scratch image's qcow2 nodes (libvirt's, plus `detect-zeroes: unmap` on push targets: a
//! deviation, see the test).

use qlauncher::qmp::commands::{
    checkpoint_name, full_push_transaction, incremental_push_transaction, pull_transaction,
    BackupDisk, BlockdevAdd, IncrementalFrom,
};
use qlauncher::qmp::migration::{
    BlockExportAddNbd, BlockExportDel, BlockJobCancel, NbdServerStart, NbdServerStop,
    SocketAddressLegacy,
};
use qlauncher::qmp::QmpError;
use qlauncher::sync::backup::target_format;
use serde_json::json;
use testkit::qmp_script::{scripted, step};

fn disks() -> Vec<BackupDisk> {
    vec![
        BackupDisk {
            target_dev: "vda".into(),
            node: "libvirt-2-format".into(),
            target_node: "backup-vda-format".into(),
        },
        BackupDisk {
            target_dev: "vdb".into(),
            node: "libvirt-1-format".into(),
            target_node: "backup-vdb-format".into(),
        },
    ]
}

#[tokio::test]
async fn a_full_push_backup_is_one_transaction_of_bitmaps_then_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = checkpoint_name("B1", "2026-01-02T03:04:05Z").unwrap();
    assert_eq!(checkpoint, "b1-2026-01-02_03-04-05");
    let (client, peer) =
        scripted(dir.path(), vec![step("transaction", json!({"return": {}}))]).await;
    client
        .run(&full_push_transaction(&checkpoint, &disks()))
        .await
        .unwrap();
    drop(client);
    let bitmap = |node: &str| {
        json!({"type": "block-dirty-bitmap-add", "data": {"node": node,
            "name": "b1-2026-01-02_03-04-05", "persistent": true, "disabled": false}})
    };
    let job = |dev: &str, node: &str| {
        json!({"type": "blockdev-backup", "data": {"device": node,
            "job-id": format!("backup-{dev}-{node}"), "target": format!("backup-{dev}-format"),
            "sync": "full", "auto-finalize": true, "auto-dismiss": false}})
    };
    assert_eq!(
        peer.await.unwrap(),
        vec![json!({"execute": "transaction", "arguments": {"actions": [
            bitmap("libvirt-2-format"),
            bitmap("libvirt-1-format"),
            job("vda", "libvirt-2-format"),
            job("vdb", "libvirt-1-format"),
        ]}})]
    );
}

#[tokio::test]
async fn the_backup_targets_and_the_scratch_image_are_qcow2_nodes_as_libvirts() {
    let dir = tempfile::tempdir().unwrap();
    let ok = || step("blockdev-add", json!({"return": {}}));
    let (client, peer) = scripted(dir.path(), vec![ok(), ok(), ok()]).await;
    for node in [
        target_format("libvirt-3-format", "libvirt-3-storage", None, true),
        target_format(
            "libvirt-4-format",
            "libvirt-4-storage",
            Some("libvirt-1-format"),
            true,
        ),
        target_format(
            "libvirt-5-format",
            "libvirt-5-storage",
            Some("libvirt-1-format"),
            false,
        ),
    ] {
        client.run(&BlockdevAdd(&node)).await.unwrap();
    }
    drop(client);
    // libvirt's target node (fact sheet §4.2, §4.3): qcow2 over the `-storage` node, `backing`
    // null for a full push target, the disk's node for an incremental one and a pull's scratch.
    // Deviation: `detect-zeroes: unmap` on the push targets, which libvirt 11 does not set
    // (KubeVirt's <domainbackup> has no <driver detect_zeroes>); without it a full backup of a
    // data-file-raw CBT overlay is written for the disk's whole virtual size.
    let node = |n: u32, backing: serde_json::Value, push: bool| {
        let mut o = json!({"node-name": format!("libvirt-{n}-format"), "read-only": false,
            "discard": "unmap", "driver": "qcow2", "file": format!("libvirt-{n}-storage"),
            "backing": backing});
        if push {
            o["detect-zeroes"] = "unmap".into();
        }
        json!({"execute": "blockdev-add", "arguments": o})
    };
    assert_eq!(
        peer.await.unwrap(),
        vec![
            node(3, json!(null), true),
            node(4, json!("libvirt-1-format"), true),
            node(5, json!("libvirt-1-format"), false),
        ]
    );
}

#[tokio::test]
async fn a_refused_transaction_is_a_command_error() {
    let dir = tempfile::tempdir().unwrap();
    let refusal = json!({"error": {"class": "GenericError",
        "desc": "Bitmap already exists: b1-2026-01-02_03-04-05"}});
    let (client, _peer) = scripted(dir.path(), vec![step("transaction", refusal)]).await;
    let err = client
        .run(&full_push_transaction("b1-2026-01-02_03-04-05", &disks()))
        .await
        .unwrap_err();
    assert!(matches!(err, QmpError::Command { .. }), "{err:?}");
    assert!(err.to_string().contains("Bitmap already exists"), "{err}");
}

#[tokio::test]
async fn an_incremental_push_backup_merges_the_checkpoint_into_a_temporary_bitmap() {
    let dir = tempfile::tempdir().unwrap();
    let from = "b0-2026-01-01_00-00-00";
    let checkpoint = checkpoint_name("b1", "2026-01-02T03:04:05Z").unwrap();
    let (client, peer) =
        scripted(dir.path(), vec![step("transaction", json!({"return": {}}))]).await;
    let sources = [
        IncrementalFrom {
            checkpoint: from.into(),
            granularity: 65536,
        },
        IncrementalFrom {
            checkpoint: from.into(),
            granularity: 131072,
        },
    ];
    client
        .run(&incremental_push_transaction(
            &checkpoint,
            &disks(),
            &sources,
        ))
        .await
        .unwrap();
    drop(client);
    let bitmap = |node: &str| {
        json!({"type": "block-dirty-bitmap-add", "data": {"node": node,
            "name": "b1-2026-01-02_03-04-05", "persistent": true, "disabled": false}})
    };
    let scratch = |dev: &str, node: &str, granularity: u32| {
        [
            json!({"type": "block-dirty-bitmap-add", "data": {"node": node,
                "name": format!("backup-{dev}"), "persistent": false, "disabled": true,
                "granularity": granularity}}),
            json!({"type": "block-dirty-bitmap-merge", "data": {"node": node,
                "target": format!("backup-{dev}"),
                "bitmaps": [{"node": node, "name": from}]}}),
        ]
    };
    let job = |dev: &str, node: &str| {
        json!({"type": "blockdev-backup", "data": {"device": node,
            "job-id": format!("backup-{dev}-{node}"), "target": format!("backup-{dev}-format"),
            "sync": "incremental", "bitmap": format!("backup-{dev}"),
            "auto-finalize": true, "auto-dismiss": false}})
    };
    let [a1, a2] = scratch("vda", "libvirt-2-format", 65536);
    let [b1, b2] = scratch("vdb", "libvirt-1-format", 131072);
    assert_eq!(
        peer.await.unwrap(),
        vec![json!({"execute": "transaction", "arguments": {"actions": [
            bitmap("libvirt-2-format"),
            bitmap("libvirt-1-format"),
            a1, a2, b1, b2,
            job("vda", "libvirt-2-format"),
            job("vdb", "libvirt-1-format"),
        ]}})]
    );
}

fn scratch_disks() -> Vec<BackupDisk> {
    vec![BackupDisk {
        target_dev: "vdb".into(),
        node: "libvirt-1-format".into(),
        target_node: "libvirt-5-format".into(),
    }]
}

#[tokio::test]
async fn a_pull_backup_serves_the_scratch_nodes_over_nbd_and_ends_with_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let sock = "/var/run/kubevirt/sockets/backup-nbd-sock";
    let ok = || json!({"return": {}});
    let (client, peer) = scripted(
        dir.path(),
        vec![
            step("nbd-server-start", ok()),
            step("transaction", ok()),
            step("block-export-add", ok()),
            step("transaction", ok()),
            step("block-export-add", ok()),
            step("block-job-cancel", ok()),
            step("block-export-del", ok()),
            step("nbd-server-stop", ok()),
        ],
    )
    .await;
    let full = checkpoint_name("b1", "2026-01-02T03:04:05Z").unwrap();
    client
        .run(&NbdServerStart {
            addr: SocketAddressLegacy::Unix { path: sock.into() },
        })
        .await
        .unwrap();
    client
        .run(&pull_transaction(&full, &scratch_disks(), None))
        .await
        .unwrap();
    client
        .run(&BlockExportAddNbd::pull("libvirt-5-format", "data", None))
        .await
        .unwrap();
    let incremental = checkpoint_name("b2", "2026-01-02T04:00:00Z").unwrap();
    let from = [IncrementalFrom {
        checkpoint: full.clone(),
        granularity: 65536,
    }];
    client
        .run(&pull_transaction(
            &incremental,
            &scratch_disks(),
            Some(&from),
        ))
        .await
        .unwrap();
    client
        .run(&BlockExportAddNbd::pull(
            "libvirt-5-format",
            "data",
            Some(vec![incremental.clone()]),
        ))
        .await
        .unwrap();
    client
        .run(&BlockJobCancel {
            device: "backup-vdb-libvirt-1-format".into(),
            force: true,
        })
        .await
        .unwrap();
    client
        .run(&BlockExportDel {
            id: "libvirt-nbd-libvirt-5-format".into(),
            mode: Some("hard"),
        })
        .await
        .unwrap();
    client.run(&NbdServerStop).await.unwrap();
    drop(client);
    let job = json!({"type": "blockdev-backup", "data": {"device": "libvirt-1-format",
        "job-id": "backup-vdb-libvirt-1-format", "target": "libvirt-5-format",
        "sync": "none", "auto-finalize": true, "auto-dismiss": false}});
    assert_eq!(
        peer.await.unwrap(),
        vec![
            json!({"execute": "nbd-server-start", "arguments": {"addr": {"type": "unix",
                "data": {"path": sock}}}}),
            json!({"execute": "transaction", "arguments": {"actions": [
                {"type": "block-dirty-bitmap-add", "data": {"node": "libvirt-1-format",
                    "name": "b1-2026-01-02_03-04-05", "persistent": true, "disabled": false}},
                job.clone(),
            ]}}),
            json!({"execute": "block-export-add", "arguments": {"type": "nbd",
                "id": "libvirt-nbd-libvirt-5-format", "node-name": "libvirt-5-format",
                "name": "data", "writable": false}}),
            json!({"execute": "transaction", "arguments": {"actions": [
                {"type": "block-dirty-bitmap-add", "data": {"node": "libvirt-1-format",
                    "name": "b2-2026-01-02_04-00-00", "persistent": true, "disabled": false}},
                {"type": "block-dirty-bitmap-add", "data": {"node": "libvirt-5-format",
                    "name": "b2-2026-01-02_04-00-00", "persistent": false, "disabled": true,
                    "granularity": 65536}},
                {"type": "block-dirty-bitmap-merge", "data": {"node": "libvirt-5-format",
                    "target": "b2-2026-01-02_04-00-00",
                    "bitmaps": [{"node": "libvirt-1-format", "name": "b1-2026-01-02_03-04-05"}]}},
                job,
            ]}}),
            json!({"execute": "block-export-add", "arguments": {"type": "nbd",
                "id": "libvirt-nbd-libvirt-5-format", "node-name": "libvirt-5-format",
                "name": "data", "writable": false, "bitmaps": ["b2-2026-01-02_04-00-00"]}}),
            json!({"execute": "block-job-cancel", "arguments": {
                "device": "backup-vdb-libvirt-1-format", "force": true}}),
            json!({"execute": "block-export-del", "arguments": {
                "id": "libvirt-nbd-libvirt-5-format", "mode": "hard"}}),
            json!({"execute": "nbd-server-stop"}),
        ]
    );
}
