//! Changed block tracking (CBT) overlays: a qcow2 in front of a PVC/DataVolume/hostDisk volume
//! whose guest data stays in the volume's raw image.
//!
//! KubeVirt v1.9.0 (`pkg/virt-launcher/virtwrap/storage/cbt.go`, `createQCOW2OverlayFunc`) runs
//! `qemu-storage-daemon` with `blockdev-create {"driver":"qcow2","file":"file",
//! "data-file":"data-file","data-file-raw":true,"size":<virtual size of the image>}` into
//! `<PathForCBT>/<volume>.qcow2`, on the backend-storage PVC (`subPath: cbt`), and reuses an
//! existing file as it is (its persistent dirty bitmaps are the checkpoints that survive a VM
//! restart). Here the same image (the bytes `qemu-img create -f qcow2 -o
//! data_file=<image>,data_file_raw=on` writes, [`super::qcow2_create`]) is written natively; the
//! raw image is only probed (read-only), never changed. Because the data file is raw, the
//! guest's writes land in the volume's image at their own offsets: the volume stays usable
//! without the overlay, and the overlay only adds the dirty bitmaps.
//!
//! Unlike the pod-lifetime overlays of [`super::overlay`], a CBT overlay outlives the pod, so it
//! is fsynced ([`Durability::Synced`](super::staged::Durability::Synced)). A reused overlay is checked first: it must be a qcow2
//! naming exactly this volume's image as its raw data file (a file on the PVC that points
//! anywhere else is refused, as images a VMI brings itself may carry no data file at all).

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::error::no_space_or;
use super::facts::{probe_image, ChainPolicy, ImageFacts};
use super::qcow2::{parse, HeaderError, HEADER_READ};
use super::qcow2_create::MAX_RAW_DATA_FILE_SIZE;
use super::staged::{create_dir_all, Staged};
use super::{validate_volume_name, ImageFormat, Outcome, Owner, StorageError};

/// The CBT directory of a non-root launcher (`cbt.PathForCBT`, `pkg/storage/cbt/cbt.go`):
/// `<private>/libvirt/qemu/cbt`, where the backend-storage PVC is mounted with `subPath: cbt`.
pub const CBT_DIR_NON_ROOT: &str = "/var/run/kubevirt-private/libvirt/qemu/cbt";
/// The CBT directory of a root launcher.
pub const CBT_DIR_ROOT: &str = "/var/lib/libvirt/qemu/cbt";
/// Mode of a CBT overlay: owner and group only, as qlauncher's other images (KubeVirt's
/// `os.Create` leaves 0666 less the umask).
pub const CBT_OVERLAY_MODE: u32 = 0o640;

/// `<cbt_dir>/<volume>.qcow2` (KubeVirt's `GetQCOW2OverlayPath`); `volume` must have passed
/// [`validate_volume_name`], so the path stays in `cbt_dir`.
pub fn cbt_overlay_path(cbt_dir: &Path, volume: &str) -> PathBuf {
    cbt_dir.join(format!("{volume}.qcow2"))
}

/// One CBT overlay to create or reuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CbtOverlaySpec {
    /// The VMI volume name (a PVC, DataVolume or hostDisk volume); used in the path and errors.
    pub volume: String,
    /// The volume's raw image as QEMU opens it: `/var/run/kubevirt-private/vmi-disks/<volume>/disk.img`
    /// (filesystem PVC), `/dev/<volume>` (block PVC), the hostDisk's mounted path, or the
    /// hotplug path. Absolute; recorded in the overlay's header as given.
    pub image: PathBuf,
    /// Where the overlay goes; [`CbtOverlaySpec::at_kubevirt_path`] fills in
    /// `<cbt_dir>/<volume>.qcow2`.
    pub overlay: PathBuf,
    /// Limits for the image (allowed roots); its depth is always 0 (a raw image has no chain).
    pub policy: ChainPolicy,
    /// Owner given to a new overlay (QEMU's runtime uid), or `None` to keep the creator's.
    pub owner: Option<Owner>,
}

impl CbtOverlaySpec {
    /// A spec for `volume` over `image`, at `<cbt_dir>/<volume>.qcow2` (`cbt_dir` normally
    /// [`CBT_DIR_NON_ROOT`]), owned by the qemu user, with no root restriction.
    pub fn at_kubevirt_path(volume: &str, image: &Path, cbt_dir: &Path) -> CbtOverlaySpec {
        CbtOverlaySpec {
            volume: volume.to_string(),
            image: image.to_path_buf(),
            overlay: cbt_overlay_path(cbt_dir, volume),
            policy: ChainPolicy {
                allowed_roots: Vec::new(),
                max_depth: 0,
            },
            owner: Some(Owner::QEMU),
        }
    }
}

/// Creates the CBT overlay of `spec.volume`, or keeps the one already at `spec.overlay` after
/// checking that it is a qcow2 whose raw data file is `spec.image` ([`Outcome::Kept`]; its
/// bitmaps are left as they are). The image is probed read-only every time. Returns the outcome
/// and the image's facts.
///
/// # Errors
/// [`StorageError::InvalidVolumeName`]; the image errors of [`probe_image`];
/// [`StorageError::UnsupportedFormat`] for an image that is not raw, empty, or larger than the
/// 4 TiB the native writer lays out; [`StorageError::MalformedImage`] for an existing overlay
/// that is not a qcow2 over exactly this raw data file (or is a symlink, or corrupt);
/// [`StorageError::NoSpace`] / [`StorageError::CreateOverlay`] when writing fails, leaving
/// nothing at `spec.overlay`.
pub fn create_cbt_overlay(spec: &CbtOverlaySpec) -> Result<(Outcome, ImageFacts), StorageError> {
    validate_volume_name(&spec.volume)?;
    let fail = |source: std::io::Error| {
        no_space_or(
            &spec.volume,
            &spec.overlay,
            source,
            |volume, path, source| StorageError::CreateOverlay {
                volume,
                path,
                source,
            },
        )
    };
    let unsupported = |reason: String| StorageError::UnsupportedFormat {
        volume: spec.volume.clone(),
        path: spec.image.clone(),
        reason,
    };
    let image_name = match spec.image.to_str() {
        Some(name) if spec.image.is_absolute() => name,
        _ => {
            return Err(fail(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the image path must be absolute UTF-8",
            )))
        }
    };
    let mut policy = spec.policy.clone();
    policy.max_depth = 0;
    let image = probe_image(&spec.volume, &spec.image, &policy)?;
    if image.format != ImageFormat::Raw {
        return Err(unsupported(format!(
            "a CBT data file must be raw, not {}",
            image.format.as_str()
        )));
    }
    if image.virtual_size == 0 || image.virtual_size > MAX_RAW_DATA_FILE_SIZE {
        return Err(unsupported(format!(
            "a CBT data file of {} bytes (1 to {MAX_RAW_DATA_FILE_SIZE})",
            image.virtual_size
        )));
    }
    match std::fs::symlink_metadata(&spec.overlay) {
        Ok(_) => {
            check_existing(spec, image_name)?;
            return Ok((Outcome::Kept, image));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e)),
    }
    if let Some(dir) = spec.overlay.parent() {
        create_dir_all(dir).map_err(fail)?;
    }
    // On the backend-storage PVC: it outlives the pod, so the default (synced) durability.
    let staged = Staged::create_unnamed(&spec.overlay, CBT_OVERLAY_MODE).map_err(fail)?;
    super::qcow2_create::write_raw_data_file_image(
        staged.file(),
        image.virtual_size.div_ceil(512) * 512,
        image_name,
    )
    .map_err(fail)?;
    let created = staged
        .commit(spec.owner, CBT_OVERLAY_MODE, super::staged::Replace::No)
        .map_err(fail)?;
    if created {
        Ok((Outcome::Created, image))
    } else {
        // A concurrent creator won the name: check what it wrote like any kept overlay.
        check_existing(spec, image_name)?;
        Ok((Outcome::Kept, image))
    }
}

/// Checks that the file at `spec.overlay` (not followed if a symlink) is a sound qcow2 whose
/// raw data file is `image_name`.
fn check_existing(spec: &CbtOverlaySpec, image_name: &str) -> Result<(), StorageError> {
    let malformed = |reason: String| StorageError::MalformedImage {
        volume: spec.volume.clone(),
        path: spec.overlay.clone(),
        reason,
    };
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&spec.overlay)
        .map_err(|e| malformed(format!("the existing CBT overlay cannot be opened: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| malformed(format!("the existing CBT overlay: {e}")))?;
    if !meta.is_file() {
        return Err(malformed(
            "the existing CBT overlay is not a regular file".into(),
        ));
    }
    let mut buf = Vec::with_capacity(HEADER_READ);
    file.by_ref()
        .take(HEADER_READ as u64)
        .read_to_end(&mut buf)
        .map_err(|e| malformed(format!("the existing CBT overlay cannot be read: {e}")))?;
    let header = parse(&buf).map_err(|e| match e {
        HeaderError::Unsupported(r) | HeaderError::Malformed(r) => {
            malformed(format!("the existing CBT overlay: {r}"))
        }
    })?;
    if header.corrupt || header.encrypted || header.backing_name_at.1 != 0 {
        return Err(malformed(
            "the existing CBT overlay is corrupt, encrypted or has a backing file".into(),
        ));
    }
    match header.data_file.as_deref() {
        Some(name) if name == image_name && header.data_file_raw => Ok(()),
        other => Err(malformed(format!(
            "the existing CBT overlay's raw data file is {other:?}, not {image_name:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_paths_stay_in_the_cbt_dir() {
        assert_eq!(
            cbt_overlay_path(Path::new(CBT_DIR_NON_ROOT), "rootdisk"),
            Path::new("/var/run/kubevirt-private/libvirt/qemu/cbt/rootdisk.qcow2")
        );
        for bad in ["", "..", "a/b", "../../etc/x"] {
            let spec = CbtOverlaySpec::at_kubevirt_path(bad, Path::new("/x"), Path::new("/cbt"));
            assert!(matches!(
                create_cbt_overlay(&spec),
                Err(StorageError::InvalidVolumeName { .. })
            ));
        }
    }
}
