//! The SR-IOV step before a live migration, which needs VFs this machine lacks, against a
//! scripted QMP peer: the exact QMP sequence the source sends (as libvirt does for KubeVirt's
//! `hotUnplugHostDevices`: the SR-IOV devices' `device_del`, then their `DEVICE_DELETED`), what
//! it returns, and KubeVirt's failure reasons when QEMU refuses or the guest does not release a
//! device in time (the migration fails with them, the domain runs on). The rest of the
//! migration runs against real QEMU in `migration_launchers.rs` and the other migration tests.

use std::time::{Duration, Instant};

use qlauncher::sync::migration::sriov::{unplug_sriov, SriovDetachError};
use qlauncher::sync::migration::MigrationError;
use serde_json::{json, Value};
use testkit::qmp_script::{scripted, step, Step};

/// `DEVICE_DELETED` of `id` as QEMU sends it once the guest released the device.
fn deleted(id: &str) -> Value {
    json!({"event": "DEVICE_DELETED", "data": {"device": id, "path": format!("/machine/peripheral/{id}")},
           "timestamp": {"seconds": 1, "microseconds": 0}})
}

/// The children of `/machine/peripheral` of a domain with two SR-IOV VFs on root ports, a
/// generic host device and a disk.
fn peripheral() -> Value {
    json!({"return": [
        {"name": "type", "type": "string"},
        {"name": "pci.3", "type": "child<pcie-root-port>"},
        {"name": "pci.4", "type": "child<pcie-root-port>"},
        {"name": "ua-sriov-vf1", "type": "child<vfio-pci>"},
        {"name": "ua-sriov-vf2", "type": "child<vfio-pci>"},
        {"name": "ua-rootdisk", "type": "child<virtio-blk-pci>"}]})
}

fn device_del(id: &str) -> Value {
    json!({"execute": "device_del", "arguments": {"id": id}})
}

fn qom_list() -> Value {
    json!({"execute": "qom-list", "arguments": {"path": "/machine/peripheral"}})
}

#[tokio::test]
async fn every_sriov_vf_is_unplugged_and_released_before_the_definition() {
    let dir = tempfile::tempdir().unwrap();
    let script = vec![
        step("qom-list", peripheral()),
        step("device_del", json!({"return": {}})),
        // The guest releases the second VF first; each one's event counts.
        Step {
            events: vec![
                deleted("ua-rootdisk-child"),
                deleted("ua-sriov-vf2"),
                deleted("ua-sriov-vf1"),
            ],
            ..step("device_del", json!({"return": {}}))
        },
    ];
    let (client, peer) = scripted(dir.path(), script).await;
    let unplugged = unplug_sriov(&client, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(unplugged, ["sriov-vf1", "sriov-vf2"]);
    drop(client);
    assert_eq!(
        peer.await.unwrap(),
        vec![
            qom_list(),
            device_del("ua-sriov-vf1"),
            device_del("ua-sriov-vf2")
        ]
    );
}

#[tokio::test]
async fn a_domain_without_sriov_devices_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let script = vec![step(
        "qom-list",
        json!({"return": [{"name": "pci.3", "type": "child<pcie-root-port>"},
                          {"name": "ua-hostdevice-gpu", "type": "child<vfio-pci>"}]}),
    )];
    let (client, peer) = scripted(dir.path(), script).await;
    assert!(unplug_sriov(&client, Duration::from_secs(30))
        .await
        .unwrap()
        .is_empty());
    drop(client);
    assert_eq!(peer.await.unwrap(), vec![qom_list()]);
}

#[tokio::test]
async fn a_vf_the_guest_keeps_fails_the_migration_with_kubevirts_reason() {
    let dir = tempfile::tempdir().unwrap();
    let script = vec![
        step("qom-list", peripheral()),
        step("device_del", json!({"return": {}})),
        Step {
            events: vec![deleted("ua-sriov-vf2")],
            ..step("device_del", json!({"return": {}}))
        },
    ];
    let (client, peer) = scripted(dir.path(), script).await;
    let t0 = Instant::now();
    let e = unplug_sriov(&client, Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(t0.elapsed() >= Duration::from_millis(500));
    assert!(
        matches!(&e, SriovDetachError::Timeout { detached, .. } if detached == &["sriov-vf2"]),
        "{e:?}"
    );
    assert_eq!(
        MigrationError::Prepare(e).failure_reason(),
        "error encountered during preparing domain for migration: failed to wait for \
         host-devices detach, timeout reached: [sriov-vf2]/[sriov-vf1 sriov-vf2]"
    );
    drop(client);
    assert_eq!(
        peer.await.unwrap(),
        vec![
            qom_list(),
            device_del("ua-sriov-vf1"),
            device_del("ua-sriov-vf2")
        ]
    );
}

#[tokio::test]
async fn a_refused_device_del_fails_the_migration_with_qemus_error() {
    let dir = tempfile::tempdir().unwrap();
    let script = vec![
        step("qom-list", peripheral()),
        step(
            "device_del",
            json!({"error": {"class": "GenericError", "desc": "Device ua-sriov-vf1 is already in the process of unplug"}}),
        ),
    ];
    let (client, peer) = scripted(dir.path(), script).await;
    let e = unplug_sriov(&client, Duration::from_secs(30))
        .await
        .unwrap_err();
    let reason = MigrationError::Prepare(e).failure_reason();
    assert!(
        reason.starts_with(
            "error encountered during preparing domain for migration: failed to detach hostdev \
             sriov-vf1, err: "
        ) && reason.contains("already in the process of unplug"),
        "{reason}"
    );
    drop(client);
    // Nothing after the refused one.
    assert_eq!(
        peer.await.unwrap(),
        vec![qom_list(), device_del("ua-sriov-vf1")]
    );
}
