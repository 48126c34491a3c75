//! emptyDisk volumes: a sparse qcow2 of the requested capacity.
//!
//! KubeVirt (`pkg/emptydisk/emptydisk.go`) rounds the capacity down to a multiple of 1 MiB
//! (`AlignImageSizeTo1MiB`), fails when that leaves 0, runs `qemu-img create -f qcow2 <file>
//! <size>` at `/var/run/libvirt/empty-disks/<volume>.qcow2` unless the file exists, and chowns it
//! to the qemu user. Here the qcow2 is written as qemu-img lays it out (`super::qcow2_create`);
//! the file is staged unnamed (`O_TMPFILE`, or a temporary name), fsynced and linked into place
//! without replacing an existing disk.

use std::path::{Path, PathBuf};

use super::error::no_space_or;
use super::overlay::write_qcow2;
use super::staged::{create_dir_all, Replace, Staged};
use super::{paths, validate_volume_name, Outcome, Owner, StorageError};

/// Mode of a new empty disk: `qemu-img create` under the launcher's 022 umask.
pub const EMPTY_DISK_MODE: u32 = 0o644;

/// 1 MiB, KubeVirt's image size alignment.
pub const MIB: u64 = 1 << 20;

/// One empty disk to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmptyDiskSpec {
    /// The VMI volume name.
    pub volume: String,
    /// `spec.volumes[].emptyDisk.capacity` in bytes (before alignment).
    pub capacity: u64,
    /// Where the image goes; [`EmptyDiskSpec::at_kubevirt_path`] fills in
    /// `/var/run/libvirt/empty-disks/<volume>.qcow2`.
    pub path: PathBuf,
    /// Owner given to the image, or `None` to keep the creator's.
    pub owner: Option<Owner>,
}

impl EmptyDiskSpec {
    /// A spec placed where KubeVirt puts it under `dir` (normally [`paths::EMPTY_DISK_DIR`]),
    /// owned by the qemu user.
    pub fn at_kubevirt_path(volume: &str, capacity: u64, dir: &Path) -> EmptyDiskSpec {
        EmptyDiskSpec {
            volume: volume.to_string(),
            capacity,
            path: paths::empty_disk_path(dir, volume),
            owner: Some(Owner::QEMU),
        }
    }
}

/// `size` rounded down to a multiple of 1 MiB (KubeVirt's `AlignImageSizeTo1MiB`).
pub fn align_down_1mib(size: u64) -> u64 {
    size - size % MIB
}

/// Creates the empty disk unless a file is already at `spec.path`. Returns the outcome and the
/// virtual size in bytes (aligned).
///
/// # Errors
/// [`StorageError::CapacityTooSmall`] below 1 MiB; [`StorageError::NoSpace`] or
/// [`StorageError::CreateEmptyDisk`] when writing fails (nothing is left behind).
pub fn create_empty_disk(spec: &EmptyDiskSpec) -> Result<(Outcome, u64), StorageError> {
    validate_volume_name(&spec.volume)?;
    let size = align_down_1mib(spec.capacity);
    if size == 0 {
        return Err(StorageError::CapacityTooSmall {
            volume: spec.volume.clone(),
            requested: spec.capacity,
        });
    }
    let fail = |source: std::io::Error| {
        no_space_or(&spec.volume, &spec.path, source, |volume, path, source| {
            StorageError::CreateEmptyDisk {
                volume,
                path,
                source,
            }
        })
    };
    match std::fs::symlink_metadata(&spec.path) {
        Ok(_) => return Ok((Outcome::Kept, size)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e)),
    }
    if let Some(dir) = spec.path.parent() {
        create_dir_all(dir).map_err(fail)?;
    }
    let staged = Staged::create_unnamed(&spec.path, EMPTY_DISK_MODE).map_err(fail)?;
    write_qcow2(&staged, size, None).map_err(fail)?;
    let created = staged
        .commit(spec.owner, EMPTY_DISK_MODE, Replace::No)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_aligned_down_to_1mib() {
        assert_eq!(align_down_1mib(0), 0);
        assert_eq!(align_down_1mib(MIB - 1), 0);
        assert_eq!(align_down_1mib(MIB), MIB);
        assert_eq!(align_down_1mib(3 * MIB + 12345), 3 * MIB);
    }

    #[test]
    fn capacity_below_1mib_is_rejected_before_any_io() {
        let spec = EmptyDiskSpec {
            volume: "scratch".into(),
            capacity: 1000,
            path: PathBuf::from("/nonexistent/dir/scratch.qcow2"),
            owner: None,
        };
        assert!(matches!(
            create_empty_disk(&spec),
            Err(StorageError::CapacityTooSmall {
                requested: 1000,
                ..
            })
        ));
    }
}
