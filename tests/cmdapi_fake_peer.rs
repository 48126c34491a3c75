//! SR-IOV host-device hotplug and SEV attestation, which need hardware this machine lacks, against
//! a scripted QMP peer: the exact QMP sequence qlauncher sends (as libvirt does for KubeVirt's
//! `HotplugHostDevices`, `GetSEVInfo`, `GetLaunchMeasurement`, `InjectLaunchSecret`), what it
//! answers, and the clear refusal when the device is absent; and KubeVirt's background hotplug:
//! the call returns before QEMU answers, a second call meanwhile is refused, a failure is only
//! logged.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use qlauncher::sync::cmdapi::host_devices::{self, HotplugRunner, SriovInterface};
use qlauncher::sync::cmdapi::{sev, CmdApiError};
use serde_json::{json, Value};
use testkit::qmp_script::{scripted, step, Step};
use tokio::sync::Notify;

/// A step whose reply waits for `gate`.
fn gated(execute: &'static str, reply: Value, gate: &Arc<Notify>) -> Step {
    Step {
        gate: Some(gate.clone()),
        ..step(execute, reply)
    }
}

/// A node with one VF: `<root>/sys/bus/pci/devices/<addr>` with its IOMMU group, and
/// `<root>/dev/vfio/<group>`.
fn node_with_vf(root: &Path, addr: &str, group: &str) {
    let groups = root.join("sys/kernel/iommu_groups").join(group);
    std::fs::create_dir_all(&groups).unwrap();
    let dev = root.join("sys/bus/pci/devices").join(addr);
    std::fs::create_dir_all(&dev).unwrap();
    std::os::unix::fs::symlink(&groups, dev.join("iommu_group")).unwrap();
    std::fs::create_dir_all(root.join("dev/vfio")).unwrap();
    std::fs::write(root.join("dev/vfio").join(group), b"").unwrap();
}

fn network_info() -> BTreeMap<String, String> {
    host_devices::parse_network_info(
        r#"{"interfaces":[{"network":"sriov1","deviceInfo":{"type":"pci","version":"1.1.0",
        "pci":{"pci-address":"0000:65:00.2"}}}]}"#,
    )
}

fn desired() -> Vec<SriovInterface> {
    vec![SriovInterface {
        name: "sriov1".into(),
        boot_order: Some(3),
    }]
}

#[tokio::test]
async fn sriov_vf_is_plugged_on_the_first_free_root_port() {
    let dir = tempfile::tempdir().unwrap();
    node_with_vf(dir.path(), "0000:65:00.2", "42");
    let script = vec![
        step(
            "qom-list",
            json!({"return": [
                {"name": "type", "type": "string"},
                {"name": "pci.1", "type": "child<pcie-root-port>"},
                {"name": "pci.2", "type": "child<pcie-root-port>"},
                {"name": "ua-disk0", "type": "child<virtio-blk-pci>"}]}),
        ),
        step("qom-get", json!({"return": "/machine/q35/pcie.0"})),
        step("qom-get", json!({"return": "/machine/q35/pcie.0"})),
        step(
            "qom-get",
            json!({"return": "/machine/peripheral/pci.1/pci.1"}),
        ),
        step("qom-list", json!({"return": []})),
        step("device_add", json!({"return": {}})),
    ];
    let (client, peer) = scripted(dir.path(), script).await;
    let plugged = host_devices::hotplug_sriov(
        &client,
        &desired(),
        &network_info(),
        &BTreeSet::new(),
        &dir.path().join("sys"),
        &dir.path().join("dev"),
    )
    .await
    .unwrap();
    assert_eq!(plugged.len(), 1);
    assert_eq!(plugged[0].alias(), "sriov-sriov1");
    drop(client);
    let got = peer.await.unwrap();
    assert_eq!(
        got,
        vec![
            json!({"execute": "qom-list", "arguments": {"path": "/machine/peripheral"}}),
            json!({"execute": "qom-get", "arguments": {"path": "/machine/peripheral/pci.1", "property": "parent_bus"}}),
            json!({"execute": "qom-get", "arguments": {"path": "/machine/peripheral/pci.2", "property": "parent_bus"}}),
            json!({"execute": "qom-get", "arguments": {"path": "/machine/peripheral/ua-disk0", "property": "parent_bus"}}),
            json!({"execute": "qom-list", "arguments": {"path": "/machine/peripheral-anon"}}),
            json!({"execute": "device_add", "arguments": {"driver": "vfio-pci",
                "host": "0000:65:00.2", "id": "ua-sriov-sriov1", "bus": "pci.2", "addr": "0x0",
                "bootindex": 3}}),
        ]
    );
}

#[tokio::test]
async fn the_vfs_qemu_runs_are_found_with_their_host_addresses_and_not_plugged_again() {
    let dir = tempfile::tempdir().unwrap();
    let script = vec![
        step(
            "qom-list",
            json!({"return": [
                {"name": "type", "type": "string"},
                {"name": "pci.1", "type": "child<pcie-root-port>"},
                {"name": "ua-sriov-sriov1", "type": "child<vfio-pci>"},
                {"name": "ua-hostdevice-x", "type": "child<vfio-pci>"}]}),
        ),
        step("qom-get", json!({"return": "0000:65:00.2"})),
    ];
    let (client, peer) = scripted(dir.path(), script).await;
    let running = host_devices::plugged_sriov(&client).await.unwrap();
    assert_eq!(running.len(), 1);
    assert_eq!(
        (running[0].id.as_str(), running[0].host.as_str()),
        ("ua-sriov-sriov1", "0000:65:00.2")
    );
    assert_eq!(running[0].alias(), "sriov-sriov1");
    // What QEMU runs counts as present: nothing to plug.
    let present: BTreeSet<String> = running.iter().map(|p| p.alias()).collect();
    assert!(host_devices::plan(&desired(), &network_info(), &present)
        .unwrap()
        .is_empty());
    drop(client);
    assert_eq!(
        peer.await.unwrap(),
        vec![
            json!({"execute": "qom-list", "arguments": {"path": "/machine/peripheral"}}),
            json!({"execute": "qom-get", "arguments": {"path": "/machine/peripheral/ua-sriov-sriov1", "property": "host"}}),
        ]
    );
}

/// Polls until the runner is free (its background task ended), at most 10 s.
async fn wait_idle(runner: &HotplugRunner) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while runner.in_progress() {
        assert!(Instant::now() < deadline, "the hotplug never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn hotplug_answers_before_qemu_and_refuses_a_second_call_while_one_runs() {
    let dir = tempfile::tempdir().unwrap();
    node_with_vf(dir.path(), "0000:65:00.2", "42");
    let gate = Arc::new(Notify::new());
    let script = vec![
        step(
            "qom-list",
            json!({"return": [{"name": "pci.1", "type": "child<pcie-root-port>"}]}),
        ),
        step("qom-get", json!({"return": "/machine/q35/pcie.0"})),
        step("qom-list", json!({"return": []})),
        gated("device_add", json!({"return": {}}), &gate),
    ];
    let (client, peer) = scripted(dir.path(), script).await;
    let runner = HotplugRunner::default();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let (c, root) = (client.clone(), dir.path().to_path_buf());
    runner
        .start(async move {
            let r = host_devices::hotplug_sriov(
                &c,
                &desired(),
                &network_info(),
                &BTreeSet::new(),
                &root.join("sys"),
                &root.join("dev"),
            )
            .await;
            let _ = done_tx.send(r.as_ref().map(Vec::len).map_err(|e| e.to_string()));
            r
        })
        .expect("the first call is accepted at once");
    // QEMU has not answered device_add (the reply is held): the RPC already returned, and a
    // second call is KubeVirt's "in progress" refusal.
    assert!(runner.in_progress());
    let err = runner.start(async { Ok(Vec::new()) }).unwrap_err();
    assert_eq!(err.to_string(), "hot-plug host-devices is in progress");
    gate.notify_one();
    assert_eq!(done_rx.await.unwrap(), Ok(1));
    wait_idle(&runner).await;

    // A failing hotplug is accepted too (its error only logged); the runner is free after it.
    runner
        .start(async { Err(CmdApiError::Refused(host_devices::NO_PCI_MAPPING.into())) })
        .expect("a failing hotplug still answers success");
    wait_idle(&runner).await;
    runner.start(async { Ok(Vec::new()) }).unwrap();
    wait_idle(&runner).await;

    drop(client);
    let got = peer.await.unwrap();
    assert_eq!(
        got.last().unwrap(),
        &json!({"execute": "device_add", "arguments": {"driver": "vfio-pci",
            "host": "0000:65:00.2", "id": "ua-sriov-sriov1", "bus": "pci.1", "addr": "0x0",
            "bootindex": 3}})
    );
}

#[tokio::test]
async fn sriov_hotplug_refuses_an_absent_vf_and_skips_a_present_one() {
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = scripted(dir.path(), vec![]).await;
    let err = host_devices::hotplug_sriov(
        &client,
        &desired(),
        &network_info(),
        &BTreeSet::new(),
        &dir.path().join("sys"),
        &dir.path().join("dev"),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("host device 0000:65:00.2 of SR-IOV interface sriov1 is absent"),
        "{err}"
    );
    // The VF exists but its VFIO node was not given to the pod.
    node_with_vf(dir.path(), "0000:65:00.2", "42");
    std::fs::remove_file(dir.path().join("dev/vfio/42")).unwrap();
    let err = host_devices::hotplug_sriov(
        &client,
        &desired(),
        &network_info(),
        &BTreeSet::new(),
        &dir.path().join("sys"),
        &dir.path().join("dev"),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("has no VFIO device node"), "{err}");
    // No network-info entry at all: KubeVirt's message.
    let err = host_devices::hotplug_sriov(
        &client,
        &desired(),
        &BTreeMap::new(),
        &BTreeSet::new(),
        &dir.path().join("sys"),
        &dir.path().join("dev"),
    )
    .await
    .unwrap_err()
    .to_string();
    assert_eq!(err, host_devices::NO_PCI_MAPPING);
    // Already in the domain: nothing to do.
    let none = host_devices::hotplug_sriov(
        &client,
        &desired(),
        &network_info(),
        &BTreeSet::from(["sriov-sriov1".to_string()]),
        &dir.path().join("sys"),
        &dir.path().join("dev"),
    )
    .await
    .unwrap();
    assert!(none.is_empty());
    drop(client);
    assert_eq!(
        peer.await.unwrap(),
        Vec::<Value>::new(),
        "no QMP command sent"
    );
}

#[tokio::test]
async fn sev_info_measurement_and_secret_follow_libvirts_qmp() {
    let dir = tempfile::tempdir().unwrap();
    let loader = dir.path().join("OVMF_CODE.cc.fd");
    std::fs::write(&loader, b"ovmf").unwrap();
    let script = vec![
        step(
            "query-sev-capabilities",
            json!({"return": {"pdh": "cGRo", "cert-chain": "Y2VydHM=", "cpu0-id": "aWQ=",
                "cbitpos": 47, "reduced-phys-bits": 1}}),
        ),
        step(
            "query-sev-launch-measure",
            json!({"return": {"data": "bWVhc3VyZQ=="}}),
        ),
        step(
            "query-sev",
            json!({"return": {"enabled": true, "api-major": 1, "api-minor": 55, "build-id": 21,
                "policy": 1, "state": "launch-secret", "handle": 1, "sev-type": "sev"}}),
        ),
        step("sev-inject-launch-secret", json!({"return": {}})),
        step(
            "query-sev-capabilities",
            json!({"error": {"class": "GenericError", "desc": "SEV feature is not available"}}),
        ),
    ];
    let (client, peer) = scripted(dir.path(), script).await;

    let info: Value = serde_json::from_slice(&sev::platform_info(&client).await.unwrap()).unwrap();
    assert_eq!(info, json!({"pdh": "cGRo", "certChain": "Y2VydHM="}));

    let m: Value = serde_json::from_slice(
        &sev::launch_measurement(&client, true, &loader)
            .await
            .unwrap(),
    )
    .unwrap();
    let sha: String = sha2::Digest::finalize(sha2::Digest::chain_update(
        <sha2::Sha256 as sha2::Digest>::new(),
        b"ovmf",
    ))
    .iter()
    .map(|b| format!("{b:02x}"))
    .collect();
    assert_eq!(
        m,
        json!({"measurement": "bWVhc3VyZQ==", "apiMajor": 1, "apiMinor": 55, "buildID": 21,
            "policy": 1, "loaderSHA": sha})
    );

    let options = sev::secret_options(br#"{"header":"aGVhZGVy","secret":"c2VjcmV0"}"#).unwrap();
    sev::inject_secret(&client, &options).await.unwrap();

    // QEMU without SEV: its error passes through.
    let err = sev::platform_info(&client).await.unwrap_err().to_string();
    assert!(err.contains("SEV feature is not available"), "{err}");

    // A node without /dev/sev is refused before QEMU is asked.
    let err = sev::check_device(&dir.path().join("dev/sev"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("SEV is not available on this node"), "{err}");

    drop(client);
    let got = peer.await.unwrap();
    assert_eq!(
        got,
        vec![
            json!({"execute": "query-sev-capabilities"}),
            json!({"execute": "query-sev-launch-measure"}),
            json!({"execute": "query-sev"}),
            json!({"execute": "sev-inject-launch-secret",
                "arguments": {"packet-header": "aGVhZGVy", "secret": "c2VjcmV0"}}),
            json!({"execute": "query-sev-capabilities"}),
        ]
    );
}
