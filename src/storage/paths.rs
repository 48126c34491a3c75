//! KubeVirt v1.9.0's fixed directories and file names in the launcher pod.
//!
//! Sources: `cmd/virt-launcher/virt-launcher.go` (ephemeral dir, cloud-init dir),
//! `pkg/ephemeral-disk/ephemeral-disk.go`, `pkg/emptydisk/emptydisk.go`, `pkg/config/*.go`,
//! `pkg/cloud-init/cloud-init.go`, `pkg/host-disk/host-disk.go`. The `*_path` helpers take the
//! base directory so tests can use a temporary one; volume names must have passed
//! [`super::validate_volume_name`].

use std::path::{Path, PathBuf};

/// `--ephemeral-disk-dir` default: overlays and cloud-init data live below it.
pub const EPHEMERAL_DISK_DIR: &str = "/var/run/kubevirt-ephemeral-disks";
/// Where virt-handler bind-mounts containerDisk images (`disk_<i>.img`).
pub const CONTAINER_DISK_DIR: &str = "/var/run/kubevirt/container-disks";
/// With the ImageVolume feature, `disk_<i>.img` is a symlink into `disk_<i>/` below this directory.
pub const IMAGE_VOLUME_DIR: &str = "/var/run/kubevirt-image-volume";
/// Block-mode PVCs appear as `/dev/<volume>`.
pub const BLOCK_DEVICE_DIR: &str = "/dev";
/// Filesystem PVCs (`<volume>/disk.img`), also the base of ephemeral PVC overlays.
pub const VMI_DISKS_DIR: &str = "/var/run/kubevirt-private/vmi-disks";
/// emptyDisk images (`<volume>.qcow2`).
pub const EMPTY_DISK_DIR: &str = "/var/run/libvirt/empty-disks";
/// Root of the config volume mounts and ISOs.
pub const PRIVATE_DIR: &str = "/var/run/kubevirt-private";
/// Where Secret volumes (and cloud-init secret refs, `<volume>/userdata`) are mounted.
pub const SECRET_SOURCE_DIR: &str = "/var/run/kubevirt-private/secret";
/// Where ConfigMap volumes are mounted.
pub const CONFIG_MAP_SOURCE_DIR: &str = "/var/run/kubevirt-private/config-map";
/// Where DownwardAPI volumes are mounted.
pub const DOWNWARD_API_SOURCE_DIR: &str = "/var/run/kubevirt-private/downwardapi";
/// Where Sysprep volumes are mounted.
pub const SYSPREP_SOURCE_DIR: &str = "/var/run/kubevirt-private/sysprep";
/// Where the pod's service account token is mounted.
pub const SERVICE_ACCOUNT_SOURCE_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// `<ephemeral_dir>/disk-data/<volume>/disk.qcow2`.
pub fn overlay_path(ephemeral_dir: &Path, volume: &str) -> PathBuf {
    ephemeral_dir
        .join("disk-data")
        .join(volume)
        .join("disk.qcow2")
}

/// `<container_disk_dir>/disk_<index>.img`, `index` being the volume's position in
/// `spec.volumes` (KubeVirt `GetDiskTargetPathFromLauncherView`).
pub fn container_disk_path(container_disk_dir: &Path, index: usize) -> PathBuf {
    container_disk_dir.join(format!("disk_{index}.img"))
}

/// The base of an `ephemeral` PVC volume: `/dev/<volume>` for a block PVC, else
/// `<vmi_disks_dir>/<volume>/disk.img` (KubeVirt `getBackingFilePath`).
pub fn ephemeral_base_path(vmi_disks_dir: &Path, volume: &str, block: bool) -> PathBuf {
    if block {
        Path::new(BLOCK_DEVICE_DIR).join(volume)
    } else {
        vmi_disks_dir.join(volume).join("disk.img")
    }
}

/// `<dir>/<volume>.qcow2` (`dir` normally [`EMPTY_DISK_DIR`]).
pub fn empty_disk_path(dir: &Path, volume: &str) -> PathBuf {
    dir.join(format!("{volume}.qcow2"))
}

/// `<ephemeral_dir>/cloud-init-data/<namespace>/<vmi>/` (KubeVirt's `getDomainBasePath`).
pub fn cloud_init_dir(ephemeral_dir: &Path, namespace: &str, vmi: &str) -> PathBuf {
    ephemeral_dir
        .join("cloud-init-data")
        .join(namespace)
        .join(vmi)
}

/// Where a hostDisk image appears in the launcher: `<vmi_disks_dir>/<volume>/<basename of
/// hostDisk.path>` (KubeVirt `GetMountedHostDiskPath`); `None` when `host_path` has no file name.
pub fn host_disk_path(vmi_disks_dir: &Path, volume: &str, host_path: &Path) -> Option<PathBuf> {
    let name = host_path.file_name()?;
    Some(vmi_disks_dir.join(volume).join(name))
}
