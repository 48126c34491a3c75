//! qcow2 overlays over containerDisk and ephemeral bases.
//!
//! KubeVirt (`pkg/ephemeral-disk/ephemeral-disk.go`) runs `qemu-img create -f qcow2 -b <base>
//! -F <fmt> <overlay>` at `<ephemeral-disk-dir>/disk-data/<volume>/disk.qcow2`, skips the step when
//! the overlay exists, then sets mode 0640 and the qemu owner. Here the qcow2 (v3, 64 KiB
//! clusters, 16-bit refcounts, the bytes qemu-img writes) with the backing file name and format
//! recorded and the base's virtual size is three small writes and a length, sparse
//! ([`super::qcow2_create`]); the base is only ever opened read-only (to read its header or
//! length), and the overlay is staged as an unnamed file (`O_TMPFILE`, or a temporary name where
//! that is unsupported) and linked into place without replacing an existing file. It is not
//! fsynced: it lives in the pod's emptyDir, which a virt-launcher pod
//! (`restartPolicy: Never`) never reuses after a crash ([`Durability::PodLifetime`]).

use std::path::{Path, PathBuf};

use super::error::no_space_or;
use super::facts::{probe_image, ChainPolicy, ImageFacts};
use super::staged::{create_dir_all, Durability, Replace, Staged};
use super::{paths, validate_volume_name, Outcome, Owner, StorageError};

/// Mode of an overlay: KubeVirt's `os.Chmod(imagePath, 0640)`.
pub const OVERLAY_MODE: u32 = 0o640;

/// The longest backing file name QEMU accepts in a qcow2 header.
const MAX_BACKING_NAME: usize = 1023;

/// One overlay to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlaySpec {
    /// The VMI volume name (`spec.volumes[].name`); used in the path and in errors.
    pub volume: String,
    /// The base image: `/var/run/kubevirt/container-disks/disk_<i>.img` for a containerDisk,
    /// `/var/run/kubevirt-private/vmi-disks/<volume>/disk.img` or `/dev/<volume>` for an
    /// `ephemeral` PVC. Recorded in the overlay as given (absolute, like KubeVirt's `-b`).
    pub base: PathBuf,
    /// Where the overlay goes; [`OverlaySpec::at_kubevirt_path`] fills in
    /// `<ephemeral-disk-dir>/disk-data/<volume>/disk.qcow2`.
    pub overlay: PathBuf,
    /// Limits for the base and its backing chain (allowed roots, depth).
    pub policy: ChainPolicy,
    /// Owner given to the overlay (the runtime uid of QEMU), or `None` to keep the creator's.
    pub owner: Option<Owner>,
}

impl OverlaySpec {
    /// A spec for `volume` over `base`, placed where KubeVirt puts it under `ephemeral_dir`
    /// (normally [`paths::EPHEMERAL_DISK_DIR`]), owned by the qemu user, with a self-contained
    /// base: `policy.max_depth` 1 (the overlay over a base without a backing file of its own, as
    /// KubeVirt's `VerifyQCOW2` demands of containerDisks and as ephemeral PVC bases are raw) and
    /// no root restriction (the caller adds its roots when they are fixed).
    pub fn at_kubevirt_path(volume: &str, base: &Path, ephemeral_dir: &Path) -> OverlaySpec {
        OverlaySpec {
            volume: volume.to_string(),
            base: base.to_path_buf(),
            overlay: paths::overlay_path(ephemeral_dir, volume),
            policy: ChainPolicy {
                allowed_roots: Vec::new(),
                max_depth: 1,
            },
            owner: Some(Owner::QEMU),
        }
    }
}

/// Creates the overlay unless a file is already at `spec.overlay` (then [`Outcome::Kept`]: the
/// overlay is not opened, the base is probed again under the same policy, so a base swapped for
/// a hostile one since is still refused). Returns the outcome and the facts of the base.
///
/// `spec.policy.max_depth` counts the overlay: 1 means the base must have no backing file
/// ([`StorageError::BaseHasBackingFile`], refused before any file below the base is opened).
///
/// # Errors
/// [`StorageError::InvalidVolumeName`]; the base errors of [`probe_image`] (missing, unreadable,
/// outside the roots, chain too deep, a backing file where none may be, unsupported);
/// [`StorageError::NoSpace`] or
/// [`StorageError::CreateOverlay`] when writing fails, in which case nothing is left at
/// `spec.overlay` and no temporary file remains.
pub fn create_overlay(spec: &OverlaySpec) -> Result<(Outcome, Option<ImageFacts>), StorageError> {
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
    let exists = match std::fs::symlink_metadata(&spec.overlay) {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(fail(e)),
    };
    if spec.base.is_relative() {
        // QEMU would resolve a relative name against the overlay's directory, not ours.
        return Err(fail(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the base path must be absolute",
        )));
    }
    if spec.policy.max_depth == 0 {
        return Err(StorageError::ChainTooDeep {
            volume: spec.volume.clone(),
            path: spec.overlay.clone(),
            limit: 0,
        });
    }
    // The overlay adds one level on top of the base's chain.
    let mut policy = spec.policy.clone();
    policy.max_depth = policy.max_depth.saturating_sub(1);
    let base = probe_image(&spec.volume, &spec.base, &policy).map_err(|e| match e {
        StorageError::ChainTooDeep { volume, path, .. } => StorageError::ChainTooDeep {
            volume,
            path,
            limit: spec.policy.max_depth,
        },
        other => other,
    })?;
    if exists {
        return Ok((Outcome::Kept, Some(base)));
    }
    let backing_name = spec.base.to_str().ok_or_else(|| {
        fail(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the base path is not UTF-8",
        ))
    })?;
    if backing_name.len() > MAX_BACKING_NAME {
        return Err(fail(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("the base path is longer than the {MAX_BACKING_NAME} bytes qcow2 allows"),
        )));
    }
    if let Some(dir) = spec.overlay.parent() {
        create_dir_all(dir).map_err(fail)?;
    }
    // Overlays live in the pod's ephemeral-disk emptyDir and die with the pod: no inline fsync.
    let staged = Staged::create_unnamed(&spec.overlay, OVERLAY_MODE)
        .map_err(fail)?
        .with_durability(Durability::PodLifetime);
    write_qcow2(
        &staged,
        base.virtual_size,
        Some((backing_name, base.format.as_str())),
    )
    .map_err(fail)?;
    let created = staged
        .commit(spec.owner, OVERLAY_MODE, Replace::No)
        .map_err(fail)?;
    let outcome = if created {
        Outcome::Created
    } else {
        Outcome::Kept
    };
    Ok((outcome, Some(base)))
}

/// Formats the staged file as a qcow2 v3 image of `size` bytes (rounded up to 512, as QEMU
/// does), optionally with a backing file name and format, laid out as `qemu-img create` does
/// ([`super::qcow2_create`]). The caller fsyncs.
pub(crate) fn write_qcow2(
    staged: &Staged,
    size: u64,
    backing: Option<(&str, &str)>,
) -> std::io::Result<()> {
    super::qcow2_create::write_image(staged.file(), size.div_ceil(512) * 512, backing)
}
