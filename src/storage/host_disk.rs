//! hostDisk volumes (and filesystem PVCs, which KubeVirt turns into `DiskOrCreate` hostDisks).
//!
//! KubeVirt (`pkg/host-disk/host-disk.go`, run by virt-handler) creates a missing `DiskOrCreate`
//! image as a sparse raw file (`createSparseRaw`: write one zero byte at `size - 1`) after
//! checking the free space (`statfs` available bytes minus a reserve); when the request exceeds
//! it but is within `pvc-tolerate-less-space-up-to-percent`, it shrinks the file to the available
//! space. The capacity is first rounded down to 1 MiB. A `Disk` hostDisk must already exist.
//! Either way the file is chowned to the qemu user.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use super::empty_disk::align_down_1mib;
use super::error::no_space_or;
use super::staged::{create_dir_all, Replace, Staged};
use super::{validate_volume_name, Outcome, Owner, StorageError};

/// Mode of a created hostDisk image: `os.Create` under a 022 umask.
pub const HOST_DISK_MODE: u32 = 0o644;

/// `spec.volumes[].hostDisk.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostDiskType {
    /// `Disk`: the image must exist.
    Disk,
    /// `DiskOrCreate`: create a sparse raw image of `capacity` bytes when missing.
    DiskOrCreate {
        /// Requested capacity in bytes (before the 1 MiB alignment).
        capacity: u64,
    },
}

/// One hostDisk to prepare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDiskSpec {
    /// The VMI volume name.
    pub volume: String,
    /// `hostDisk.path` (for PVCs: `/var/run/kubevirt-private/vmi-disks/<volume>/disk.img`).
    pub path: PathBuf,
    /// `Disk` or `DiskOrCreate`.
    pub kind: HostDiskType,
    /// `pvc-tolerate-less-space-up-to-percent` (KubeVirt default 10).
    pub tolerance_percent: u8,
    /// Bytes kept free on the filesystem (`minimum-pvc-reserve-bytes`, KubeVirt default 1 MiB).
    pub reserve_bytes: u64,
    /// Owner given to the image (existing or new), or `None` to leave it.
    pub owner: Option<Owner>,
}

/// Prepares the hostDisk: checks a `Disk` exists, creates a missing `DiskOrCreate` image and
/// sets the owner of a `DiskOrCreate` image (new or existing), as virt-handler does. Returns the outcome and the image length in bytes.
///
/// # Errors
/// [`StorageError::HostDiskMissing`], [`StorageError::CapacityTooSmall`],
/// [`StorageError::HostDiskTooLarge`], [`StorageError::NoSpace`],
/// [`StorageError::CreateHostDisk`]; a failed creation leaves nothing at `spec.path`.
pub fn prepare_host_disk(spec: &HostDiskSpec) -> Result<(Outcome, u64), StorageError> {
    validate_volume_name(&spec.volume)?;
    let fail = |source: std::io::Error| {
        no_space_or(&spec.volume, &spec.path, source, |volume, path, source| {
            StorageError::CreateHostDisk {
                volume,
                path,
                source,
            }
        })
    };
    match std::fs::metadata(&spec.path) {
        Ok(meta) => {
            // virt-handler only takes ownership of DiskOrCreate images.
            let create = matches!(spec.kind, HostDiskType::DiskOrCreate { .. });
            if let Some(owner) = spec.owner.filter(|_| create) {
                std::os::unix::fs::chown(&spec.path, Some(owner.uid), Some(owner.gid))
                    .map_err(fail)?;
            }
            return Ok((Outcome::Kept, meta.len()));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e)),
    }
    let capacity = match spec.kind {
        HostDiskType::Disk => {
            return Err(StorageError::HostDiskMissing {
                volume: spec.volume.clone(),
                path: spec.path.clone(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            })
        }
        HostDiskType::DiskOrCreate { capacity } => capacity,
    };
    let requested = align_down_1mib(capacity);
    if requested == 0 {
        return Err(StorageError::CapacityTooSmall {
            volume: spec.volume.clone(),
            requested: capacity,
        });
    }
    let dir = spec.path.parent().unwrap_or(std::path::Path::new("/"));
    create_dir_all(dir).map_err(fail)?;
    let stat = nix::sys::statvfs::statvfs(dir).map_err(|e| fail(e.into()))?;
    let available = (stat.blocks_available() as u64)
        .saturating_mul(stat.fragment_size() as u64)
        .saturating_sub(spec.reserve_bytes);
    let size = if requested > available {
        let tolerated =
            requested as u128 * (100 - u128::from(spec.tolerance_percent.min(100))) / 100;
        if tolerated > u128::from(available) {
            return Err(StorageError::HostDiskTooLarge {
                volume: spec.volume.clone(),
                path: spec.path.clone(),
                requested,
                available,
                tolerance_percent: spec.tolerance_percent,
            });
        }
        tracing::info!(
            volume = %spec.volume,
            requested,
            available,
            "PV size too small; using it anyway, it is within the tolerance"
        );
        available
    } else {
        requested
    };
    if size == 0 {
        return Err(StorageError::CapacityTooSmall {
            volume: spec.volume.clone(),
            requested: capacity,
        });
    }
    let staged = Staged::create(&spec.path, HOST_DISK_MODE).map_err(fail)?;
    // Sparse: one zero byte at the last offset, as createSparseRaw does.
    staged.file().write_all_at(&[0], size - 1).map_err(fail)?;
    let created = staged
        .commit(spec.owner, HOST_DISK_MODE, Replace::No)
        .map_err(fail)?;
    Ok((
        if created {
            Outcome::Created
        } else {
            Outcome::Kept
        },
        size,
    ))
}
