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
//! device. (3) The hand-over itself, with the launcher's own spawn steps (`confine_qemu`, then
//! `inherit_fd`) on a stand-in program: it runs as uid 107, holds the stand-in device open at
//! fd 20 (`/proc/self/fd/20`), and could not have opened the node itself.
//!
//! Not run here, for want of the module: a guest reaching the host over a real vhost-vsock.
//!
//! Needs root.

use qlauncher::sync::rpc::manager::DomainManager;
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
        .map(|_| ())
        .map_err(|e| qlauncher::sys::error::error_chain(&e))
        .expect_err("the sync must fail on this machine")
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

/// A stand-in for `/dev/vhost-vsock` only root can open (the null device, mode 0600) in a
/// directory everyone may enter.
fn stand_in_device(dir: &Path) -> PathBuf {
    let device = dir.join("vhost-vsock");
    let status = std::process::Command::new("mknod")
        .arg(&device)
        .args(["c", "1", "3"])
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::set_permissions(&device, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    device
}

#[test]
fn the_device_is_handed_over_at_vsock_fd_to_a_process_running_as_the_qemu_user() {
    use qlauncher::sync::facts::hardware::{inherit_fd, open_vhost_vsock, VSOCK_FD};
    use qlauncher::sync::privileges::confine_qemu;
    let dir = tempfile::tempdir().unwrap();
    let device = stand_in_device(dir.path());
    let fd = open_vhost_vsock(&vmi("3c1a2e5f-0000-4000-8000-000000000001"), &device)
        .unwrap()
        .expect("a VMI with status.VSOCKCID opens the device");

    // What QEMU is spawned with: the user switch and the close-on-exec sweep, then the fd.
    let mut holder = std::process::Command::new("readlink");
    holder.arg(format!("/proc/self/fd/{VSOCK_FD}"));
    confine_qemu(&mut holder, 107);
    inherit_fd(&mut holder, &fd, VSOCK_FD);
    let out = holder.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        device.display().to_string()
    );

    // Nothing else is inherited: the launcher's other descriptors are closed at exec.
    let mut lister = std::process::Command::new("ls");
    lister.arg("/proc/self/fd");
    confine_qemu(&mut lister, 107);
    inherit_fd(&mut lister, &fd, VSOCK_FD);
    let out = lister.output().unwrap();
    let mut fds: Vec<i32> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .filter(|n| *n > 2)
        .collect();
    fds.sort();
    // ls's own directory handle is the one other descriptor.
    assert!(fds.contains(&VSOCK_FD), "{fds:?}");
    assert!(fds.len() <= 2, "inherited descriptors: {fds:?}");

    // As uid 107 the node itself cannot be opened: the fd is the only way in.
    let mut opener = std::process::Command::new("head");
    opener.args(["-c", "0"]).arg(&device);
    confine_qemu(&mut opener, 107);
    let out = opener.output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_vmi_without_a_vsock_cid_opens_nothing() {
    use qlauncher::sync::facts::hardware::open_vhost_vsock;
    let mut json = serde_json::to_value(vmi("3c1a2e5f-0000-4000-8000-000000000002")).unwrap();
    json["status"] = json!({});
    let without: Vmi = serde_json::from_value(json).unwrap();
    let missing = Path::new("/nonexistent/vhost-vsock");
    assert!(open_vhost_vsock(&without, missing).unwrap().is_none());
}
