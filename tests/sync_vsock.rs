//! vsock (`status.VSOCKCID`): the launcher opens the vhost-vsock device itself and QEMU, running
//! as the unprivileged qemu user (uid 107), only inherits it as `vhostfd` (libvirt's way), so QEMU
//! needs no access to the device node.
//!
//! This machine's kernel has no `vhost_vsock` module, so there is no real `/dev/vhost-vsock`.
//! What can be checked here: (1) without the device the VMI is refused before QEMU starts, naming
//! the device; (2) with a stand-in device node only root may open (`mknod` of the null device,
//! mode 0600), QEMU running as uid 107 is handed the fd: QEMU's error is then the vhost ioctl on
//! that fd ("vhost_set_owner failed"), not a failed open of the device, which is what uid 107
//! opening the node itself would give. On a node with `vhost_vsock` the same fd is a real vhost
//! device.
//!
//! Needs root.

use qlauncher::sync::server::DomainManager;
use qlauncher::sync::{SyncConfig, SyncVmi};
use qlauncher::vmi::Vmi;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn vmi(uid: &str) -> Vmi {
    let json = json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "vsock", "namespace": "default", "uid": uid},
        "spec": {
            "domain": {
                "resources": {"requests": {"memory": "128Mi"}},
                "devices": {
                    "autoattachPodInterface": false,
                    "autoattachVSOCK": true,
                    "disks": [{"name": "rootdisk", "disk": {"bus": "virtio"}}]
                }
            },
            "volumes": [{"name": "rootdisk", "emptyDisk": {"capacity": "16Mi"}}]
        },
        "status": {"VSOCKCID": 3}
    });
    Vmi::from_json_or_yaml(&json.to_string()).unwrap()
}

fn setup(root: &Path, device: PathBuf) -> (Arc<SyncVmi>, String, PathBuf) {
    let mut config = SyncConfig::under_root(root);
    config.runtime_uid = 107;
    config.vhost_vsock = device;
    let log = config.qemu_log.clone();
    let private = PathBuf::from(&config.paths.private_dir);
    let uid = format!("3c1a2e5f-0000-4000-8000-{:012}", std::process::id());
    std::fs::create_dir_all(private.join(&uid)).unwrap();
    // virt-handler gives the VMI's directory to the qemu user.
    std::os::unix::fs::chown(private.join(&uid), Some(107), Some(107)).unwrap();
    (Arc::new(SyncVmi::new(config, None)), uid, log)
}

fn sync(manager: &Arc<SyncVmi>, uid: &str) -> String {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(manager.sync_vmi(vmi(uid), None))
        .expect_err("the sync must fail on this machine")
        .to_string()
}

#[test]
fn without_the_device_the_vmi_is_refused_before_qemu_starts() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("dev-vhost-vsock");
    let (manager, uid, log) = setup(root.path(), missing.clone());
    let err = sync(&manager, &uid);
    assert!(
        err.contains(&format!("open {} for status.VSOCKCID", missing.display())),
        "{err}"
    );
    assert!(
        std::fs::read_to_string(&log).unwrap_or_default().is_empty(),
        "QEMU was started"
    );
}

#[test]
fn an_unprivileged_qemu_is_handed_the_device_fd() {
    let root = tempfile::tempdir().unwrap();
    // A device node only root can open: the null device (an fd QEMU's vhost ioctls reject).
    let device = root.path().join("vhost-vsock");
    let status = std::process::Command::new("mknod")
        .arg(&device)
        .args(["c", "1", "3"])
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::set_permissions(&device, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // The root directory must be reachable for uid 107 (tempdir is 0700).
    std::fs::set_permissions(
        root.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let (manager, uid, log) = setup(root.path(), device);
    let err = sync(&manager, &uid);
    let qemu = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        qemu.contains("vhostfd=20") || err.contains("vhost_set_owner"),
        "{err}\n{qemu}"
    );
    assert!(
        qemu.contains("vhost_set_owner failed: Inappropriate ioctl for device")
            || err.contains("vhost_set_owner failed: Inappropriate ioctl for device"),
        "QEMU did not use the fd it was handed:\n{err}\n{qemu}"
    );
    assert!(!qemu.contains("failed to open vhost device"), "{qemu}");
}
