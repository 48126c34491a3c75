//! The push backup's QMP transaction (KubeVirt `BackupVirtualMachine` Start, libvirt's
//! `qemuBackupBegin`) against a scripted QMP peer: the exact `transaction` qlauncher sends for a
//! full backup of two CBT disks creating checkpoint `<name>-<UTC time>`, the one of an
//! incremental backup since an earlier checkpoint (libvirt's temporary `backup-<dst>` bitmap,
//! merged, then `sync: incremental`), and QEMU's refusal of it surfacing as a command error.

use qlauncher::qmp::commands::{
    checkpoint_name, full_push_transaction, incremental_push_transaction, BackupDisk,
    IncrementalFrom,
};
use qlauncher::qmp::QmpError;
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
