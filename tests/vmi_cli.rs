//! `qlauncher validate FILE`: defaulted JSON on success, `path: reason` lines and exit 2 on errors.

use std::io::Write;
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qlauncher"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

#[test]
fn valid_example_prints_defaulted_json() {
    let out = run(&["validate", "examples/demo.yaml"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["metadata"]["name"], "demo");
    assert_eq!(v["spec"]["domain"]["machine"]["type"], "q35");
    assert_eq!(v["spec"]["domain"]["memory"]["guest"], "256Mi");
    assert_eq!(
        v["spec"]["domain"]["devices"]["interfaces"][0]["ports"],
        serde_json::json!([{"name": "http", "port": 80}])
    );
    assert_eq!(v["status"]["runtimeUser"], 107);
}

#[test]
fn invalid_vmi_prints_errors_and_exits_2() {
    let mut f = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    f.write_all(
        br#"
kind: VirtualMachineInstance
metadata: {name: broken}
spec:
  domain:
    resources: {requests: {memory: 64Mi}}
    devices:
      disks: [{name: root, disk: {bus: floppy}}]
      interfaces: [{name: default, masquerade: {}, macAddress: "xx"}]
  networks: [{name: default, pod: {}}]
  volumes: [{name: root, containerDisk: {image: img}}]
"#,
    )
    .unwrap();
    let out = run(&["validate", f.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(out.stdout, b"");
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "spec.domain.devices.disks[0].disk.bus: unrecognized bus \"floppy\", must be one of: virtio, scsi, sata, usb\n\
         spec.domain.devices.interfaces[0].macAddress: \"xx\" is not a valid MAC address (aa:bb:cc:dd:ee:ff)\n"
    );
}

#[test]
fn other_kinds_exit_2_with_a_clear_message() {
    let mut f = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    f.write_all(b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
        .unwrap();
    let path = f.path().to_str().unwrap().to_string();
    let out = run(&["validate", &path]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        format!("{path}: no VirtualMachineInstance in manifest (kinds found: ConfigMap)\n")
    );
}

#[test]
fn masquerade_default_binding_flag() {
    let out = run(&[
        "validate",
        "--default-binding",
        "masquerade",
        "tests/fixtures/vmi/pvc.yaml",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["spec"]["domain"]["devices"]["interfaces"],
        serde_json::json!([{"name": "default", "masquerade": {}}])
    );
}
