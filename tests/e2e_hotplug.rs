//! Disk and NIC hotplug seen by the guest, in a VM started by `qlauncher run examples/demo.yaml`,
//! with the operator's tools: `qlauncher qmp` and `qlauncher hotplug` on QEMU's operator QMP
//! socket under `--root` (`var/run/kubevirt-private/qlauncher/operator.sock`; the launcher holds
//! the domain's own monitor). The NIC's tap is made by the test in the pod namespace, as
//! virt-handler's network setup would. The guest reports `QLG: disk-added`, `QLG: nic-added`, and
//! after the unplugs `QLG: disk-removed`, `QLG: nic-removed`; the VM then stops gracefully.
//!
//! Needs root and the test guest (`scripts/build-guest`).

use serde_json::{json, Value};
use std::path::Path;
use testkit::run::{short_tempdir, Pod, Run, STEP};

/// `qlauncher ARGS...` in the pod namespace; its stdout, or a panic with its stderr.
fn qlauncher(pod: &Pod, args: &[&str]) -> String {
    let mut argv = vec![env!("CARGO_BIN_EXE_qlauncher")];
    argv.extend_from_slice(args);
    pod.net.pod.sh(&argv)
}

/// Ids of the PCIe root ports with nothing plugged into them (`query-pci`).
fn free_root_ports(pod: &Pod, qmp: &Path) -> Vec<String> {
    let reply: Value = serde_json::from_str(&qlauncher(
        pod,
        &["qmp", qmp.to_str().unwrap(), "query-pci"],
    ))
    .unwrap();
    let mut free = Vec::new();
    for bus in reply.as_array().into_iter().flatten() {
        for dev in bus["devices"].as_array().into_iter().flatten() {
            if let Some(bridge) = dev.get("pci_bridge") {
                let empty = bridge["devices"].as_array().is_none_or(|d| d.is_empty());
                if empty {
                    if let Some(id) = dev["qdev_id"].as_str() {
                        free.push(id.to_string());
                    }
                }
            }
        }
    }
    free
}

#[test]
fn guest_sees_disk_and_nic_hotplugged_through_the_operator_qmp_socket() {
    let tmp = short_tempdir();
    let root = tmp.path().join("r");
    let pod = Pod::new();
    let mut run = Run::start_example(&pod, "demo.yaml", &root);
    let mut console = run.console();
    let qmp = run.operator_qmp_socket();
    let qmp_arg = qmp.to_str().unwrap();
    let ports = free_root_ports(&pod, &qmp);
    assert!(ports.len() >= 2, "free root ports: {ports:?}");

    // A 16 MiB raw disk.
    let image = tmp.path().join("hp.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let from = console.position();
    qlauncher(
        &pod,
        &[
            "hotplug",
            qmp_arg,
            "disk",
            "attach",
            "--blockdev",
            &json!({"driver": "file", "filename": image, "node-name": "e2e-file"}).to_string(),
            "--blockdev",
            &json!({"driver": "raw", "file": "e2e-file", "node-name": "e2e-raw"}).to_string(),
            "--device",
            &json!({"driver": "virtio-blk-pci", "id": "e2e-disk", "drive": "e2e-raw",
                    "bus": ports[0], "addr": "0x0"})
            .to_string(),
        ],
    );
    assert_eq!(
        console
            .wait_for_marker_after(from, "disk-added ", STEP)
            .unwrap(),
        "disk-added vdc size=16777216"
    );

    // A NIC on a tap the test makes in the pod namespace.
    let tap = format!("qlt{}", std::process::id() % 100_000);
    pod.ip(&["tuntap", "add", "dev", &tap, "mode", "tap"]);
    let from = console.position();
    qlauncher(
        &pod,
        &[
            "hotplug",
            qmp_arg,
            "nic",
            "attach",
            "--tap",
            &tap,
            "--fd-name",
            "e2e-tapfd",
            "--netdev",
            &json!({"type": "tap", "id": "e2e-net", "fd": "e2e-tapfd"}).to_string(),
            "--device",
            &json!({"driver": "virtio-net-pci", "id": "e2e-nic", "netdev": "e2e-net",
                    "mac": "02:00:00:00:00:31", "bus": ports[1], "addr": "0x0", "romfile": ""})
            .to_string(),
        ],
    );
    assert_eq!(
        console
            .wait_for_marker_after(from, "nic-added ", STEP)
            .unwrap(),
        "nic-added eth1 mac=02:00:00:00:00:31"
    );

    // Both unplugged: device_del, the guest releases them, the backends go.
    let from = console.position();
    qlauncher(
        &pod,
        &[
            "hotplug", qmp_arg, "disk", "detach", "--id", "e2e-disk", "--node", "e2e-raw",
            "--node", "e2e-file",
        ],
    );
    assert_eq!(
        console
            .wait_for_marker_after(from, "disk-removed ", STEP)
            .unwrap(),
        "disk-removed vdc"
    );
    let from = console.position();
    qlauncher(
        &pod,
        &[
            "hotplug", qmp_arg, "nic", "detach", "--id", "e2e-nic", "--netdev", "e2e-net",
        ],
    );
    assert_eq!(
        console
            .wait_for_marker_after(from, "nic-removed ", STEP)
            .unwrap(),
        "nic-removed eth1"
    );
    let reply: Value =
        serde_json::from_str(&qlauncher(&pod, &["qmp", qmp_arg, "query-block"])).unwrap();
    let nodes: Vec<&str> = reply
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["inserted"]["node-name"].as_str())
        .collect();
    assert!(!nodes.iter().any(|n| n.starts_with("e2e-")), "{nodes:?}");

    run.stop(&mut console);
}
