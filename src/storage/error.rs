//! `StorageError`: the one error type of the storage module.

use std::io;
use std::path::PathBuf;

/// Why a storage step failed. Every variant names the volume (the VMI's `spec.volumes[].name`)
/// and the path or field involved; the underlying cause, when there is one, is the error's
/// `source()` and is not repeated in the message.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The volume name cannot be used as a path component.
    #[error("volume {volume:?}: invalid volume name: {reason}")]
    InvalidVolumeName {
        /// Volume name as given.
        volume: String,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// The base image (or a file in its backing chain) does not exist.
    #[error("volume {volume}: base image {path} does not exist")]
    MissingBase {
        /// Volume name.
        volume: String,
        /// Missing file.
        path: PathBuf,
        /// The `ENOENT` from open or stat.
        #[source]
        source: io::Error,
    },
    /// The base image (or a file in its backing chain) exists but cannot be opened or read.
    #[error("volume {volume}: base image {path} cannot be read")]
    UnreadableBase {
        /// Volume name.
        volume: String,
        /// Unreadable file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// With the ImageVolume feature, the file of a containerDisk (or kernel boot) image volume
    /// cannot be found or linked: no file, more than one, a path leaving the volume, or the link
    /// cannot be made (KubeVirt `linkImageVolumeFilePaths` fails SyncVMI the same way).
    #[error("volume {volume}: image volume {path}: {reason}")]
    ImageVolume {
        /// Volume name (`kernel-boot` for the kernel boot container).
        volume: String,
        /// The image volume directory or file involved.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The image is neither raw nor a qcow2 version qlauncher reads.
    #[error("volume {volume}: image {path} has an unsupported format: {reason}")]
    UnsupportedFormat {
        /// Volume name.
        volume: String,
        /// Image file.
        path: PathBuf,
        /// What was found (e.g. "vmdk", "qcow2 version 1", "encrypted qcow2").
        reason: String,
    },
    /// The qcow2 header cannot be parsed.
    #[error("volume {volume}: image {path} has a malformed qcow2 header: {reason}")]
    MalformedImage {
        /// Volume name.
        volume: String,
        /// Image file.
        path: PathBuf,
        /// The header field that is wrong.
        reason: String,
    },
    /// The backing chain below an image is longer than the policy allows.
    #[error("volume {volume}: backing chain of {path} is deeper than {limit} images")]
    ChainTooDeep {
        /// Volume name.
        volume: String,
        /// Top image of the chain.
        path: PathBuf,
        /// The limit, [`crate::storage::ChainPolicy::max_depth`].
        limit: u32,
    },
    /// A base that must be self-contained records a backing file of its own (KubeVirt
    /// `VerifyQCOW2` refuses such containerDisk images: GHSA-qv98-3369-g364, a backing file name
    /// such as `/etc/shadow` would make QEMU open a host file for the guest). Nothing is opened
    /// below the base and nothing is written.
    #[error(
        "volume {volume}: image {path} has a backing file {backing:?} of its own; a disk image \
         must be self-contained"
    )]
    BaseHasBackingFile {
        /// Volume name.
        volume: String,
        /// The image that records the backing file.
        path: PathBuf,
        /// The backing file name as recorded in its header.
        backing: String,
    },
    /// An image or a backing file resolves outside every allowed root, or is not a local file.
    #[error(
        "volume {volume}: {what} {backing} (of {image}) is not a local file under the allowed \
         roots {roots:?}"
    )]
    OutsideAllowedRoots {
        /// Volume name.
        volume: String,
        /// "base image", "backing file" or "data file".
        what: &'static str,
        /// The file that refers to it (or the base itself).
        image: PathBuf,
        /// The name as recorded (or the resolved path).
        backing: String,
        /// The allowed roots.
        roots: Vec<PathBuf>,
    },
    /// A write failed because the filesystem is full; the partial file was removed.
    #[error("volume {volume}: no space left to write {path}; nothing was left behind")]
    NoSpace {
        /// Volume name.
        volume: String,
        /// The final path that was not created.
        path: PathBuf,
        /// The `ENOSPC`/`EDQUOT` error.
        #[source]
        source: io::Error,
    },
    /// Creating the qcow2 overlay failed (other than for space); the partial file was removed.
    #[error("volume {volume}: creating overlay {path} failed")]
    CreateOverlay {
        /// Volume name.
        volume: String,
        /// Overlay path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Creating a push backup's target image failed (other than for space); nothing is left
    /// at the path.
    #[error("volume {volume}: creating backup target {path} failed")]
    CreateBackupTarget {
        /// Volume name.
        volume: String,
        /// Target path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A push backup's target exists already (libvirt's `qemuBackupDiskPrepareStorage`
    /// refusal, its text).
    #[error("store '{}' for backup of '{disk}' exists", .path.display())]
    BackupTargetExists {
        /// The disk's guest device (`vda`).
        disk: String,
        /// Target path.
        path: PathBuf,
    },
    /// Creating the empty disk failed; the partial file was removed.
    #[error("volume {volume}: creating empty disk {path} failed")]
    CreateEmptyDisk {
        /// Volume name.
        volume: String,
        /// Disk path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The requested capacity is below 1 MiB once aligned down as KubeVirt does.
    #[error("volume {volume}: capacity of {requested} bytes is too low, must be at least 1 MiB")]
    CapacityTooSmall {
        /// Volume name.
        volume: String,
        /// Requested size in bytes.
        requested: u64,
    },
    /// A capacity is not a Kubernetes quantity (or overflows 64 bits).
    #[error("volume {volume}: capacity {value:?} is not a valid quantity")]
    InvalidCapacity {
        /// Volume name.
        volume: String,
        /// The quantity as written.
        value: String,
    },
    /// A `Disk`-type hostDisk does not exist (KubeVirt creates nothing for it).
    #[error("volume {volume}: hostDisk {path} does not exist")]
    HostDiskMissing {
        /// Volume name.
        volume: String,
        /// Expected path.
        path: PathBuf,
        /// The stat error.
        #[source]
        source: io::Error,
    },
    /// A `DiskOrCreate` hostDisk does not fit, even within the tolerated shortfall.
    #[error(
        "volume {volume}: hostDisk {path} needs {requested} bytes but only {available} are \
         available, also after a {tolerance_percent}% tolerance"
    )]
    HostDiskTooLarge {
        /// Volume name.
        volume: String,
        /// Disk path.
        path: PathBuf,
        /// Requested bytes.
        requested: u64,
        /// Available bytes (free space minus the reserve).
        available: u64,
        /// `pvc-tolerate-less-space-up-to-percent`.
        tolerance_percent: u8,
    },
    /// Creating or inspecting a hostDisk failed; a partial file was removed.
    #[error("volume {volume}: preparing hostDisk {path} failed")]
    CreateHostDisk {
        /// Volume name.
        volume: String,
        /// Disk path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Cloud-init or config data is over its size limit.
    #[error("volume {volume}: {field} is {size} bytes, over the {limit} byte limit")]
    DataTooLarge {
        /// Volume name.
        volume: String,
        /// Field or file (e.g. `cloudInitNoCloud.userData`).
        field: String,
        /// Actual size in bytes.
        size: u64,
        /// Limit in bytes.
        limit: u64,
    },
    /// A `*Base64` field does not decode.
    #[error("volume {volume}: {field} is not valid base64")]
    InvalidBase64 {
        /// Volume name.
        volume: String,
        /// Field name (e.g. `cloudInitNoCloud.userDataBase64`).
        field: String,
        /// Decoder error.
        #[source]
        source: base64::DecodeError,
    },
    /// The cloud-init source is unusable (no data, two sources for one field, ...).
    #[error("volume {volume}: invalid cloud-init source: {reason}")]
    InvalidCloudInit {
        /// Volume name.
        volume: String,
        /// What is wrong.
        reason: String,
    },
    /// A file referenced by a secret, access credential or config volume cannot be read.
    #[error("volume {volume}: cannot read {path}")]
    ReadSource {
        /// Volume name.
        volume: String,
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A sysprep volume has neither `autounattend.xml` nor `unattend.xml`.
    #[error(
        "volume {volume}: sysprep source {dir} holds neither autounattend.xml nor unattend.xml"
    )]
    SysprepUnattendMissing {
        /// Volume name.
        volume: String,
        /// The sysprep source directory.
        dir: PathBuf,
    },
    /// Writing an ISO image failed (other than for space); nothing was left at its path.
    #[error("volume {volume}: creating ISO {path} failed")]
    CreateIso {
        /// Volume name.
        volume: String,
        /// ISO path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The per-VM EFI NVRAM file cannot be made from its template; nothing was left behind.
    #[error("VMI {vmi}: NVRAM {path}: {source}")]
    Nvram {
        /// VMI name.
        vmi: String,
        /// The template or the NVRAM file, whichever failed.
        path: PathBuf,
        /// The I/O error (or `InvalidInput` with the rule broken).
        source: io::Error,
    },
    /// Inspecting an image (stat, open, read) for its facts failed.
    #[error("volume {volume}: probing {path} failed")]
    ProbeImage {
        /// Volume name.
        volume: String,
        /// Image path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// True when an I/O error means "the filesystem is full" (ENOSPC, EDQUOT or the matching kind;
/// a wrapped error may keep only the kind).
pub(crate) fn is_no_space(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || matches!(
            err.kind(),
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
        )
}

/// The error of a failed write of `volume`'s file `path`: [`StorageError::NoSpace`] when the
/// filesystem is full ([`is_no_space`]), else the caller's variant, made by `otherwise` from the
/// same volume, path and error.
pub(crate) fn no_space_or(
    volume: &str,
    path: &std::path::Path,
    source: io::Error,
    otherwise: impl FnOnce(String, PathBuf, io::Error) -> StorageError,
) -> StorageError {
    if is_no_space(&source) {
        StorageError::NoSpace {
            volume: volume.to_owned(),
            path: path.to_path_buf(),
            source,
        }
    } else {
        otherwise(volume.to_owned(), path.to_path_buf(), source)
    }
}
