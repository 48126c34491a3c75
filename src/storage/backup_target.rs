//! The target image of a push backup (KubeVirt `BackupVirtualMachine` Start, push mode):
//! `<targetPath>/<vmi>/<backupName>-<UTC YYYY-MM-DD_HH-MM-SS>/<backupName>-<volume>.qcow2` on
//! the backup PVC, an empty qcow2 of the disk's size that QEMU's `blockdev-backup` job fills.
//!
//! libvirt makes it with `blockdev-create` (`qemuBackupDiskPrepareStorage`,
//! `qemuBlockStorageSourceCreate`): qcow2, the disk's capacity, no backing for a full backup and
//! the disk's image (`backing-file` = the CBT overlay, `backing-fmt` qcow2) for an incremental one,
//! whose unchanged clusters then read through to it. Here the same image is written natively
//! ([`super::qcow2_create`], the bytes `qemu-img create -f qcow2 [-b <overlay> -F qcow2]`
//! writes), staged under a temporary name and linked into place only if nothing is there: an
//! existing target is libvirt's error (`store '<path>' for backup of '<dst>' exists`), never
//! overwritten. It is fsynced: the PVC outlives the pod.

use std::path::{Path, PathBuf};

use super::error::no_space_or;
use super::staged::{Replace, Staged};
use super::{Owner, StorageError};

/// Mode of a backup target: owner and group (QEMU writes it; the backup's reader is the PVC's
/// user).
pub const BACKUP_TARGET_MODE: u32 = 0o640;

/// One backup target to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupTargetSpec {
    /// The VMI volume the disk is (in errors).
    pub volume: String,
    /// The disk's guest device, `vda` (in libvirt's "exists" error).
    pub disk: String,
    /// The target's path; its directory must exist.
    pub path: PathBuf,
    /// The disk's virtual size in bytes (rounded up to 512).
    pub size: u64,
    /// The qcow2 image the target reads unchanged clusters from (incremental backups: the
    /// disk's CBT overlay, recorded as given with format qcow2); `None` for a full backup.
    pub backing: Option<PathBuf>,
    /// Owner given to the file (QEMU's runtime uid), or `None` to keep the creator's.
    pub owner: Option<Owner>,
}

/// Creates the target image of `spec`.
///
/// # Errors
/// [`StorageError::BackupTargetExists`] when a file is at the path already (it is left as it
/// is); [`StorageError::NoSpace`] / [`StorageError::CreateBackupTarget`] when it cannot be
/// written (nothing is left at the path), also for a backing path that is not absolute UTF-8.
pub fn create_backup_target(spec: &BackupTargetSpec) -> Result<(), StorageError> {
    let fail = |source: std::io::Error| {
        no_space_or(&spec.volume, &spec.path, source, |volume, path, source| {
            StorageError::CreateBackupTarget {
                volume,
                path,
                source,
            }
        })
    };
    let backing = match &spec.backing {
        None => None,
        Some(b) => match b.to_str() {
            Some(name) if b.is_absolute() => Some((name, "qcow2")),
            _ => {
                return Err(fail(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "the backing path must be absolute UTF-8",
                )))
            }
        },
    };
    if std::fs::symlink_metadata(&spec.path).is_ok() {
        return Err(exists(spec));
    }
    let staged = Staged::create_unnamed(&spec.path, BACKUP_TARGET_MODE).map_err(fail)?;
    super::qcow2_create::write_image(staged.file(), spec.size.div_ceil(512) * 512, backing)
        .map_err(fail)?;
    let created = staged
        .commit(spec.owner, BACKUP_TARGET_MODE, Replace::No)
        .map_err(fail)?;
    if created {
        Ok(())
    } else {
        Err(exists(spec))
    }
}

fn exists(spec: &BackupTargetSpec) -> StorageError {
    StorageError::BackupTargetExists {
        disk: spec.disk.clone(),
        path: spec.path.clone(),
    }
}

/// `<target_path>/<vmi_name>/<checkpoint>`, KubeVirt's `getBackupPath` (the checkpoint being
/// `<backupName>-<UTC time>`); the caller validated every component.
pub fn backup_dir(target_path: &Path, vmi_name: &str, checkpoint: &str) -> PathBuf {
    target_path.join(vmi_name).join(checkpoint)
}

/// `<dir>/<backupName>-<volume>.qcow2`, KubeVirt's `targetQCOW2File`.
pub fn backup_target_path(dir: &Path, backup_name: &str, volume: &str) -> PathBuf {
    dir.join(format!("{backup_name}-{volume}.qcow2"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let spec = BackupTargetSpec {
            volume: "data".into(),
            disk: "vdb".into(),
            path: backup_target_path(dir.path(), "b1", "data"),
            size: 1 << 20,
            backing: Some("/cbt/data.qcow2".into()),
            owner: None,
        };
        create_backup_target(&spec).unwrap();
        let bytes = std::fs::read(&spec.path).unwrap();
        assert_eq!(&bytes[..4], b"QFI\xfb");
        assert!(bytes.windows(15).any(|w| w == b"/cbt/data.qcow2"));
        let err = create_backup_target(&spec).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("store '{}' for backup of 'vdb' exists", spec.path.display())
        );
        assert_eq!(std::fs::read(&spec.path).unwrap(), bytes);
    }
}
