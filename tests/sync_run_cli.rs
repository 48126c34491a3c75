//! `qlauncher run` refuses a VMI whose containerDisk has no local image, and a mapping for a volume
//! the VMI lacks, before anything is started.

use std::process::Command;

fn run(args: &[&str]) -> (bool, String) {
    let root = tempfile::tempdir().unwrap();
    let vmi = root.path().join("vmi.yaml");
    std::fs::write(
        &vmi,
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\n\
         metadata: {name: demo}\n\
         spec:\n  domain:\n    devices:\n      disks: [{name: rootdisk, disk: {bus: virtio}}]\n\
         \x20 volumes: [{name: rootdisk, containerDisk: {image: example/guest}}]\n",
    )
    .unwrap();
    let image = root.path().join("disk.img");
    std::fs::write(&image, vec![0u8; 4096]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_qlauncher"))
        .arg("run")
        .arg(&vmi)
        .arg("--root")
        .arg(root.path().join("root"))
        .args(
            args.iter()
                .map(|a| a.replace("IMAGE", &image.display().to_string())),
        )
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn container_disk_without_a_local_image_is_refused() {
    assert_eq!(
        run(&[]),
        (
            false,
            "error: volume rootdisk is a containerDisk: give its image with \
             --container-disk rootdisk=PATH\n"
                .to_string()
        )
    );
}

#[test]
fn mapping_for_an_unknown_volume_is_refused() {
    assert_eq!(
        run(&[
            "--container-disk",
            "rootdisk=IMAGE",
            "--container-disk",
            "other=IMAGE"
        ]),
        (
            false,
            "error: --container-disk other: the VMI has no containerDisk volume of that name\n"
                .to_string()
        )
    );
}

#[test]
fn root_too_long_for_qemu_sockets_is_refused_before_start() {
    let dir = tempfile::tempdir().unwrap();
    let vmi = dir.path().join("vmi.yaml");
    std::fs::write(
        &vmi,
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: demo}\n\
         spec:\n  domain:\n    devices: {}\n",
    )
    .unwrap();
    let root = dir
        .path()
        .join("a-root-directory-name-long-enough-to-overflow");
    let out = Command::new(env!("CARGO_BIN_EXE_qlauncher"))
        .arg("run")
        .arg(&vmi)
        .arg("--root")
        .arg(&root)
        .output()
        .unwrap();
    // `run` derives the VMI's uid from namespace/name: UUIDv5(URL, "qlauncher-run:default/demo").
    let socket = root.join(
        "var/run/kubevirt-private/590cec32-af46-592c-a239-1a88a114afce/org.qemu.guest_agent.0",
    );
    let len = socket.as_os_str().len();
    assert!(len > 107, "the test root is too short: {len}");
    assert_eq!(
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned()
        ),
        (
            false,
            format!(
                "error: --root {}: QEMU's socket {} would be {len} bytes long, over the 107 bytes \
                 a unix socket path can have: choose a shorter --root\n",
                root.display(),
                socket.display()
            )
        )
    );
}
