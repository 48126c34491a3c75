//! Facts about disk images, gathered before conversion so the converter does no I/O.
//!
//! KubeVirt asks `qemu-img info` for a containerDisk's format and virtual size, stats PVCs to tell
//! files from block devices, and opens each disk with `O_DIRECT` to choose `cache=none` or
//! `writethrough` (`converter.go` `DirectIOChecker`, `SetDriverCacheMode`). Here the qcow2 header
//! is read directly, the raw size comes from the file length (or the end of the block device),
//! and the O_DIRECT probe is a plain `open(2)`. The results are plain data ([`ImageFacts`]) that
//! the orchestrator copies into the converter context.

use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::qcow2::{self, HeaderError};
use super::{paths, StorageError};

pub use crate::cmdline::context::{ImageFormat, StorageKind};

/// The backing file recorded in a qcow2 image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackingFacts {
    /// The name as recorded in the header (QEMU resolves a relative name against the directory
    /// of the image that records it).
    pub name: String,
    /// The resolved, canonical path.
    pub path: PathBuf,
    /// The backing format recorded in the header, or the probed one when none is recorded.
    pub format: ImageFormat,
    /// Whether the header records the format (`qemu-img info` "backing file format").
    pub format_recorded: bool,
}

/// Everything the converter and the overlay code need to know about one image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageFacts {
    /// The path probed, as given.
    pub path: PathBuf,
    /// File or block device.
    pub kind: StorageKind,
    /// Detected format (qcow2 magic, otherwise raw).
    pub format: ImageFormat,
    /// Virtual size in bytes, as `qemu-img info` reports it (raw: length rounded up to 512).
    pub virtual_size: u64,
    /// Bytes allocated on the host (`st_blocks * 512`; 0 for block devices). KubeVirt's
    /// `IsPreAllocated` compares this with the virtual size.
    pub allocated_size: u64,
    /// The backing file of a qcow2 image.
    pub backing: Option<BackingFacts>,
    /// Number of images below this one in its backing chain (0: no backing file).
    pub chain_depth: u32,
}

/// Limits applied while following backing chains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainPolicy {
    /// Directories every image of the chain must resolve into (after following symlinks), e.g.
    /// `/var/run/kubevirt/container-disks`, `/var/run/kubevirt-private/vmi-disks`, `/dev`. An
    /// empty list allows any local path.
    pub allowed_roots: Vec<PathBuf>,
    /// The longest backing chain accepted below an image (qlauncher's own guard; QEMU has none).
    pub max_depth: u32,
}

impl Default for ChainPolicy {
    fn default() -> Self {
        ChainPolicy {
            allowed_roots: Vec::new(),
            max_depth: DEFAULT_MAX_CHAIN_DEPTH,
        }
    }
}

impl ChainPolicy {
    /// containerDisk bases: under [`paths::CONTAINER_DISK_DIR`] or [`paths::IMAGE_VOLUME_DIR`],
    /// and a qcow2 base must have no backing file (KubeVirt `VerifyQCOW2`), so the overlay chain
    /// is at most 1 deep.
    pub fn container_disk() -> ChainPolicy {
        ChainPolicy {
            allowed_roots: vec![
                PathBuf::from(paths::CONTAINER_DISK_DIR),
                PathBuf::from(paths::IMAGE_VOLUME_DIR),
            ],
            max_depth: 1,
        }
    }

    /// `ephemeral` PVC bases: raw, under [`paths::VMI_DISKS_DIR`] or `/dev`.
    pub fn ephemeral() -> ChainPolicy {
        ChainPolicy {
            allowed_roots: vec![
                PathBuf::from(paths::VMI_DISKS_DIR),
                PathBuf::from(paths::BLOCK_DEVICE_DIR),
            ],
            max_depth: 1,
        }
    }
}

/// Default [`ChainPolicy::max_depth`]: containerDisk images are flat; 8 leaves room for layered
/// bases without letting a crafted chain make QEMU open hundreds of files.
pub const DEFAULT_MAX_CHAIN_DEPTH: u32 = 8;

/// Other image formats' magic numbers: such a base is rejected instead of being exposed raw.
const OTHER_MAGICS: &[(usize, &[u8], &str)] = &[
    (0, b"KDMV", "vmdk"),
    (0, b"# Disk DescriptorFile", "vmdk"),
    (0, b"vhdxfile", "vhdx"),
    (0, b"conectix", "vpc"),
    (0, b"QED\0", "qed"),
    (0, b"LUKS\xba\xbe", "luks"),
    (64, b"\x7f\x10\xda\xbe", "vdi"),
];

/// Probes `path` and follows its backing chain under `policy`. The image and every backing file
/// are opened read-only; nothing is written.
///
/// # Errors
/// [`StorageError::MissingBase`] / [`StorageError::UnreadableBase`] for an image of the chain
/// that does not exist or cannot be read, [`StorageError::OutsideAllowedRoots`],
/// [`StorageError::ChainTooDeep`], [`StorageError::UnsupportedFormat`],
/// [`StorageError::MalformedImage`]; all name `volume`.
pub fn probe_image(
    volume: &str,
    path: &Path,
    policy: &ChainPolicy,
) -> Result<ImageFacts, StorageError> {
    let roots = canonical_roots(&policy.allowed_roots);
    let top = check_root(
        volume,
        "base image",
        path,
        path,
        &roots,
        &policy.allowed_roots,
    )?;
    let mut facts = probe_one(volume, path, &top, None, &policy.allowed_roots)?;
    // Walk the chain: every backing file must resolve under the roots, and at most max_depth of
    // them are followed (this also ends a chain that loops back on itself).
    let mut depth = 0u32;
    let mut image = path.to_path_buf();
    let mut next = facts.backing.clone();
    while let Some(backing) = next {
        depth += 1;
        if depth > policy.max_depth {
            return Err(StorageError::ChainTooDeep {
                volume: volume.to_string(),
                path: path.to_path_buf(),
                limit: policy.max_depth,
            });
        }
        let canonical = check_root(
            volume,
            "backing file",
            &image,
            &backing.path,
            &roots,
            &policy.allowed_roots,
        )
        .map_err(|e| match e {
            StorageError::OutsideAllowedRoots {
                volume,
                what,
                image,
                roots,
                ..
            } => StorageError::OutsideAllowedRoots {
                volume,
                what,
                image,
                backing: backing.name.clone(),
                roots,
            },
            other => other,
        })?;
        let below = probe_one(
            volume,
            &backing.path,
            &canonical,
            Some((backing.format, &image)),
            &policy.allowed_roots,
        )?;
        image = backing.path.clone();
        next = below.backing;
    }
    facts.chain_depth = depth;
    Ok(facts)
}

/// Probes one image (no chain walk). `expected` is the format the referring image recorded.
fn probe_one(
    volume: &str,
    given: &Path,
    canonical: &Path,
    expected: Option<(ImageFormat, &Path)>,
    roots: &[PathBuf],
) -> Result<ImageFacts, StorageError> {
    let open_err = |source: io::Error| {
        if source.kind() == io::ErrorKind::NotFound {
            StorageError::MissingBase {
                volume: volume.to_string(),
                path: given.to_path_buf(),
                source,
            }
        } else {
            StorageError::UnreadableBase {
                volume: volume.to_string(),
                path: given.to_path_buf(),
                source,
            }
        }
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        // O_NONBLOCK: opening a FIFO must not hang; regular files and block devices ignore it.
        .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(canonical)
        .map_err(open_err)?;
    let meta = file.metadata().map_err(open_err)?;
    let kind = if meta.file_type().is_block_device() {
        StorageKind::Block
    } else if meta.is_file() {
        StorageKind::File
    } else {
        return Err(StorageError::UnsupportedFormat {
            volume: volume.to_string(),
            path: given.to_path_buf(),
            reason: "neither a regular file nor a block device".into(),
        });
    };
    let length = match kind {
        StorageKind::File => meta.len(),
        StorageKind::Block => file.seek(SeekFrom::End(0)).map_err(open_err)?,
    };
    let head = read_head(&file, qcow2::HEADER_READ).map_err(open_err)?;
    let allocated_size = match kind {
        StorageKind::File => meta.blocks() * 512,
        StorageKind::Block => 0,
    };
    let is_qcow2 = head.starts_with(&qcow2::MAGIC);
    if let Some((format, referrer)) = expected {
        // A recorded "raw" backing format is honoured even if the bytes look like qcow2 (QEMU
        // does the same); a recorded "qcow2" on a non-qcow2 file is an error.
        if format == ImageFormat::Qcow2 && !is_qcow2 {
            return Err(StorageError::MalformedImage {
                volume: volume.to_string(),
                path: given.to_path_buf(),
                reason: format!("{} records it as qcow2 but it is not", referrer.display()),
            });
        }
        if format == ImageFormat::Raw {
            return Ok(raw_facts(given, kind, length, allocated_size));
        }
    }
    if !is_qcow2 {
        for (at, magic, name) in OTHER_MAGICS {
            if head.get(*at..at + magic.len()) == Some(*magic) {
                return Err(StorageError::UnsupportedFormat {
                    volume: volume.to_string(),
                    path: given.to_path_buf(),
                    reason: (*name).to_string(),
                });
            }
        }
        return Ok(raw_facts(given, kind, length, allocated_size));
    }
    let header = qcow2::parse(&head).map_err(|e| match e {
        HeaderError::Unsupported(reason) => StorageError::UnsupportedFormat {
            volume: volume.to_string(),
            path: given.to_path_buf(),
            reason,
        },
        HeaderError::Malformed(reason) => StorageError::MalformedImage {
            volume: volume.to_string(),
            path: given.to_path_buf(),
            reason,
        },
    })?;
    if header.encrypted {
        return Err(StorageError::UnsupportedFormat {
            volume: volume.to_string(),
            path: given.to_path_buf(),
            reason: "encrypted qcow2".into(),
        });
    }
    if let Some(data_file) = &header.data_file {
        return Err(StorageError::UnsupportedFormat {
            volume: volume.to_string(),
            path: given.to_path_buf(),
            reason: format!("qcow2 with external data file {data_file:?}"),
        });
    }
    let backing = match header.backing_name_at {
        (_, 0) => None,
        (offset, len) => {
            let mut name = vec![0u8; len as usize];
            file.read_exact_at(&mut name, offset).map_err(open_err)?;
            let name = String::from_utf8(name).map_err(|_| StorageError::MalformedImage {
                volume: volume.to_string(),
                path: given.to_path_buf(),
                reason: "backing file name is not UTF-8".into(),
            })?;
            Some((name, header.backing_format.clone()))
        }
    };
    let backing = match backing {
        None => None,
        Some((name, format)) => Some(resolve_backing(
            volume, given, canonical, &name, format, roots,
        )?),
    };
    Ok(ImageFacts {
        path: given.to_path_buf(),
        kind,
        format: ImageFormat::Qcow2,
        virtual_size: header.size,
        allocated_size,
        backing,
        chain_depth: 0,
    })
}

/// Reads up to `len` bytes from offset 0 (positional, so a prior seek does not matter).
fn read_head(file: &std::fs::File, len: usize) -> io::Result<Vec<u8>> {
    let mut head = vec![0u8; len];
    let mut filled = 0;
    while filled < len {
        match file.read_at(&mut head[filled..], filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    head.truncate(filled);
    Ok(head)
}

fn raw_facts(path: &Path, kind: StorageKind, length: u64, allocated_size: u64) -> ImageFacts {
    ImageFacts {
        path: path.to_path_buf(),
        kind,
        format: ImageFormat::Raw,
        virtual_size: length.div_ceil(512) * 512,
        allocated_size,
        backing: None,
        chain_depth: 0,
    }
}

/// Resolves a recorded backing name as QEMU does (relative to the referring image's directory),
/// rejects protocol names (`nbd:`, `json:`, `http://`...), and probes the format when none is
/// recorded. [`probe_image`] checks the result against the allowed roots.
fn resolve_backing(
    volume: &str,
    given: &Path,
    canonical: &Path,
    name: &str,
    format: Option<String>,
    roots: &[PathBuf],
) -> Result<BackingFacts, StorageError> {
    let outside = |backing: String| StorageError::OutsideAllowedRoots {
        volume: volume.to_string(),
        what: "backing file",
        image: given.to_path_buf(),
        backing,
        roots: roots.to_vec(),
    };
    if is_protocol_name(name) || name.is_empty() {
        return Err(outside(name.to_string()));
    }
    let base_dir = canonical.parent().unwrap_or(Path::new("/"));
    let joined = base_dir.join(name);
    let path = match std::fs::canonicalize(&joined) {
        Ok(p) => p,
        Err(source) if source.kind() == io::ErrorKind::NotFound => {
            return Err(StorageError::MissingBase {
                volume: volume.to_string(),
                path: joined,
                source,
            })
        }
        Err(source) => {
            return Err(StorageError::UnreadableBase {
                volume: volume.to_string(),
                path: joined,
                source,
            })
        }
    };
    let (format, format_recorded) = match format.as_deref() {
        Some("raw") => (ImageFormat::Raw, true),
        Some("qcow2") => (ImageFormat::Qcow2, true),
        Some(other) => {
            return Err(StorageError::UnsupportedFormat {
                volume: volume.to_string(),
                path: given.to_path_buf(),
                reason: format!("backing format {other:?}"),
            })
        }
        None => (sniff_format(volume, &path)?, false),
    };
    Ok(BackingFacts {
        name: name.to_string(),
        path,
        format,
        format_recorded,
    })
}

/// qcow2 if the file starts with the qcow2 magic, raw otherwise.
fn sniff_format(volume: &str, path: &Path) -> Result<ImageFormat, StorageError> {
    let mut magic = [0u8; 4];
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(path)
        .map_err(|source| StorageError::UnreadableBase {
            volume: volume.to_string(),
            path: path.to_path_buf(),
            source,
        })?;
    match file.read_exact_at(&mut magic, 0) {
        Ok(()) if magic == qcow2::MAGIC => Ok(ImageFormat::Qcow2),
        _ => Ok(ImageFormat::Raw),
    }
}

/// A QEMU protocol prefix: `scheme:` before any `/` (QEMU's `path_has_protocol`).
fn is_protocol_name(name: &str) -> bool {
    match name.find(':') {
        Some(colon) => !name[..colon].contains('/'),
        None => false,
    }
}

/// Canonical forms of the roots that exist (a missing root admits nothing).
pub(crate) fn canonical_roots(roots: &[PathBuf]) -> Vec<PathBuf> {
    roots
        .iter()
        .filter_map(|r| std::fs::canonicalize(r).ok())
        .collect()
}

/// Canonicalizes `path` and checks it lies under one of `roots` (any path when `configured` is
/// empty). Returns the canonical path.
pub(crate) fn check_root(
    volume: &str,
    what: &'static str,
    image: &Path,
    path: &Path,
    roots: &[PathBuf],
    configured: &[PathBuf],
) -> Result<PathBuf, StorageError> {
    let canonical = match std::fs::canonicalize(path) {
        Ok(p) => p,
        Err(source) if source.kind() == io::ErrorKind::NotFound => {
            return Err(StorageError::MissingBase {
                volume: volume.to_string(),
                path: path.to_path_buf(),
                source,
            })
        }
        Err(source) => {
            return Err(StorageError::UnreadableBase {
                volume: volume.to_string(),
                path: path.to_path_buf(),
                source,
            })
        }
    };
    if configured.is_empty() || roots.iter().any(|root| canonical.starts_with(root)) {
        Ok(canonical)
    } else {
        Err(StorageError::OutsideAllowedRoots {
            volume: volume.to_string(),
            what,
            image: image.to_path_buf(),
            backing: canonical.display().to_string(),
            roots: configured.to_vec(),
        })
    }
}

/// An image's facts plus the O_DIRECT verdict the converter turns into `cache=none` (true) or
/// `writethrough` (false).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskFacts {
    /// Format, size, kind and chain of the image.
    pub image: ImageFacts,
    /// O_DIRECT works on the image and, when it has one, on its backing file (KubeVirt
    /// `SetDriverCacheMode` checks both). A failed probe counts as unsupported, as in KubeVirt.
    pub direct_io: bool,
}

/// [`probe_image`] plus [`direct_io_supported`] on the image and its backing file: everything the
/// converter needs about one disk.
///
/// # Errors
/// As [`probe_image`]; O_DIRECT probe failures are not errors (they mean `writethrough`).
pub fn probe_disk(
    volume: &str,
    path: &Path,
    policy: &ChainPolicy,
) -> Result<DiskFacts, StorageError> {
    let image = probe_image(volume, path, policy)?;
    let direct = |p: &Path| match direct_io_supported(p) {
        Ok(supported) => supported,
        Err(e) => {
            tracing::warn!(volume, path = %p.display(), error = %e, "direct I/O check failed");
            false
        }
    };
    let direct_io = direct(path)
        && image
            .backing
            .as_ref()
            .is_none_or(|backing| direct(&backing.path));
    Ok(DiskFacts { image, direct_io })
}

/// Whether `path` can be opened with `O_DIRECT`, as KubeVirt's `DirectIOChecker` decides
/// `cache=none` (true) versus `writethrough` (false). A block device or existing file is opened
/// read-only; for a missing file, or when `path` is a directory, a uniquely named probe file is
/// created in it and removed. `EINVAL` on the `O_DIRECT` open (ramfs, tmpfs before Linux 6.6,
/// some FUSE filesystems) means unsupported.
///
/// # Errors
/// The I/O error when even the plain open fails.
pub fn direct_io_supported(path: &Path) -> io::Result<bool> {
    let meta = std::fs::metadata(path);
    let (probe, created) = match &meta {
        Ok(m) if m.is_dir() => (
            path.join(format!(
                ".qlauncher-direct-io-probe.{}.{}",
                std::process::id(),
                probe_counter()
            )),
            true,
        ),
        Ok(_) => (path.to_path_buf(), false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => (path.to_path_buf(), true),
        Err(e) => return Err(io::Error::new(e.kind(), e.to_string())),
    };
    let open = |direct: bool| {
        let mut flags = libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK;
        if direct {
            flags |= libc::O_DIRECT;
        }
        let mut options = std::fs::OpenOptions::new();
        options.read(true).custom_flags(flags);
        if created {
            options.write(true).create(true).mode(0o600);
        }
        options.open(&probe)
    };
    let result = match open(true) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(false).map(|_| false),
        Err(e) => Err(e),
    };
    if created {
        let _ = std::fs::remove_file(&probe);
    }
    result
}

fn probe_counter() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_names_are_detected_like_qemu() {
        assert!(is_protocol_name("nbd:localhost:10809"));
        assert!(is_protocol_name("json:{\"driver\":\"file\"}"));
        assert!(is_protocol_name("http://example/x.qcow2"));
        assert!(!is_protocol_name("/var/run/a:b.qcow2"));
        assert!(!is_protocol_name("base.qcow2"));
        assert!(!is_protocol_name("./a:b"));
    }
}
