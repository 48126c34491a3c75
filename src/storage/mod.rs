//! Disk images and config volumes, made natively (no qemu-img, xorriso or shell).
//!
//! qcow2 overlays over containerDisk and ephemeral bases, empty disks and host disks, the facts the
//! converter needs about each image (format, virtual size, file or block, O_DIRECT support), and the
//! ISO images for cloud-init (NoCloud, ConfigDrive) and ConfigMap/Secret/DownwardAPI/ServiceAccount/
//! Sysprep volumes, at the paths KubeVirt v1.9.0 uses. Files are written under a temporary name,
//! fsynced and renamed.
//!
//! Layout (one file per kind of image, each with its input struct, so the orchestrator fills them
//! from the VMI):
//! - [`overlay`]: [`OverlaySpec`] → qcow2 overlay over a qcow2 or raw base (KubeVirt
//!   `pkg/ephemeral-disk`, `pkg/container-disk`).
//! - [`empty_disk`]: [`EmptyDiskSpec`] → sparse qcow2 (`pkg/emptydisk`).
//! - [`host_disk`]: [`HostDiskSpec`] → sparse raw or an existing file (`pkg/host-disk`).
//! - [`facts`]: [`ImageFacts`], [`DiskFacts`], [`probe_image`], [`probe_disk`],
//!   [`direct_io_supported`] for the converter context.
//! - [`cloud_init`]: [`CloudInitSpec`] → `noCloud.iso` / `configdrive.iso` (`pkg/cloud-init`).
//! - [`config_volume`]: [`ConfigVolumeSpec`] → config ISOs (`pkg/config`).
//! - [`nvram`]: [`detect_efi`] (the OVMF files on the host) and [`NvramSpec`] → the per-VM
//!   `<name>_VARS.fd` copied from its template (libvirt's NVRAM handling).
//! - [`iso`]: the ISO9660 + Joliet + Rock Ridge writer shared by the last two (crate `hadris-iso`).
//! - [`image_volume`]: the ImageVolume feature's links from `disk_<i>.img` (and the kernel boot
//!   artifacts) into the image volumes (`linkImageVolumeFilePaths`).
//! - [`paths`]: KubeVirt's fixed directories and file names.
//! - [`from_vmi`]: the specs above filled from `crate::vmi` types (the only `vmi` import).
//!
//! Every function is blocking (plain `std::fs` and positioned writes); async callers run
//! them on a blocking thread.

pub mod backup_target;
pub mod cbt;
pub mod cloud_init;
pub mod config_volume;
pub mod empty_disk;
mod error;
pub mod facts;
pub mod from_vmi;
pub mod host_disk;
pub mod image_volume;
pub mod iso;
pub mod nvram;
pub mod overlay;
pub mod paths;
mod qcow2;
mod qcow2_create;
mod staged;

pub use backup_target::{create_backup_target, BackupTargetSpec};
pub use cbt::{cbt_overlay_path, create_cbt_overlay, CbtOverlaySpec};
pub use cloud_init::{
    write_cloud_init_iso, CloudInitData, CloudInitKind, CloudInitSpec, DeviceData, VmiIdentity,
};
pub use config_volume::{write_config_volume_iso, ConfigVolumeKind, ConfigVolumeSpec};
pub use empty_disk::{create_empty_disk, EmptyDiskSpec};
pub use error::StorageError;
pub use facts::{
    direct_io_supported, probe_disk, probe_image, BackingFacts, ChainPolicy, DiskFacts, ImageFacts,
    ImageFormat, StorageKind,
};
pub use host_disk::{prepare_host_disk, HostDiskSpec, HostDiskType};
pub use nvram::{detect_efi, prepare_nvram, NvramSpec};
pub use overlay::{create_overlay, OverlaySpec};

/// What a create-if-missing step did: KubeVirt keeps an existing overlay, empty disk or host disk
/// (a re-sync must not lose the guest's writes), so "kept" is a success, not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The file was created by this call.
    Created,
    /// The file already existed and was left untouched.
    Kept,
}

/// The uid and gid a created file is given (`fchown`), KubeVirt's `OwnershipManager`: the qemu
/// user, 107:107, in KubeVirt's images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// Numeric user id.
    pub uid: u32,
    /// Numeric group id.
    pub gid: u32,
}

impl Owner {
    /// The `qemu` user and group of KubeVirt's launcher image (uid 107, gid 107).
    pub const QEMU: Owner = Owner { uid: 107, gid: 107 };
}

/// Checks that a volume name can be used as one path component: not empty, not `.` or `..`, no
/// `/` or NUL, at most 253 bytes (a Kubernetes DNS subdomain; KubeVirt's volume names are DNS
/// labels). This keeps every path built from a volume name under its directory.
///
/// # Errors
/// [`StorageError::InvalidVolumeName`] naming the volume and the rule it breaks.
pub fn validate_volume_name(volume: &str) -> Result<(), StorageError> {
    let reason = if volume.is_empty() {
        Some("it is empty")
    } else if volume == "." || volume == ".." {
        Some("it is a relative directory name")
    } else if volume.contains('/') {
        Some("it contains '/'")
    } else if volume.contains('\0') {
        Some("it contains a NUL byte")
    } else if volume.len() > 253 {
        Some("it is longer than 253 bytes")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(StorageError::InvalidVolumeName {
            volume: volume.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_names_that_escape_their_directory_are_rejected() {
        for bad in ["", ".", "..", "a/b", "../x", "a\0b"] {
            assert!(
                matches!(
                    validate_volume_name(bad),
                    Err(StorageError::InvalidVolumeName { .. })
                ),
                "{bad:?} accepted"
            );
        }
        assert!(validate_volume_name(&"x".repeat(254)).is_err());
        for good in ["containerdisk", "disk-0", "cloudinitdisk", "..data"] {
            assert!(validate_volume_name(good).is_ok(), "{good:?} rejected");
        }
    }
}
