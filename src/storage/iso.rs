//! ISO9660 images with Joliet and Rock Ridge, written in-process with the crate `hadris-iso`.
//!
//! KubeVirt runs `xorrisofs -volid <label> -joliet -rock -partition_cyl_align on` on a staging
//! directory. The equivalent here: a level-1 ISO9660 tree (8.3 upper-case names) with Rock Ridge
//! (POSIX names, modes, owners, mtimes) and a Joliet tree (UCS-2 level 3), then the image padded
//! to a whole 1 MiB "cylinder" (64 heads x 32 sectors x 512 bytes) with the volume space size in
//! the volume descriptors updated to match, as `-partition_cyl_align on` does for images below
//! 8 GiB. The image is staged under a temporary name, fsynced and renamed over the old one.

use std::cell::RefCell;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use hadris_iso::read::PathSeparator;
use hadris_iso::write::options::{CreationFeatures, IsoFormatOptions};
use hadris_iso::write::{InputEntry, InputEntryKind, InputMetadata, InputTree, IsoImageWriter};

use super::error::is_no_space;
use super::staged::{create_dir_all, Replace, Staged};
use super::{Owner, StorageError};

/// Mode of an ISO file: `xorrisofs` output under a 022 umask.
pub const ISO_MODE: u32 = 0o644;
/// ISO logical sector size.
const SECTOR: u64 = 2048;
/// `-partition_cyl_align on`: 64 heads x 32 sectors x 512 bytes.
const CYLINDER: u64 = 64 * 32 * 512;
/// First volume descriptor sector.
const FIRST_DESCRIPTOR: u64 = 16;
/// The longest volume identifier (ECMA-119 `Volume Identifier`, 32 bytes).
pub const MAX_LABEL: usize = 32;

/// One file or directory of an ISO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsoEntry {
    /// Name inside its directory (Rock Ridge and Joliet keep it; the ISO9660 tree gets an 8.3
    /// form).
    pub name: String,
    /// Contents.
    pub kind: IsoEntryKind,
    /// Rock Ridge permission bits (`0o644`...).
    pub mode: u32,
    /// Rock Ridge owner.
    pub uid: u32,
    /// Rock Ridge group.
    pub gid: u32,
    /// Modification time, seconds since the epoch (`None`: now).
    pub mtime: Option<i64>,
}

/// File contents or directory children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IsoEntryKind {
    /// A regular file with these bytes.
    File(Vec<u8>),
    /// A directory with these entries.
    Dir(Vec<IsoEntry>),
}

impl IsoEntry {
    /// A file entry.
    pub fn file(name: &str, contents: Vec<u8>, mode: u32, owner: Owner) -> IsoEntry {
        IsoEntry {
            name: name.to_string(),
            kind: IsoEntryKind::File(contents),
            mode,
            uid: owner.uid,
            gid: owner.gid,
            mtime: None,
        }
    }

    /// A directory entry.
    pub fn dir(name: &str, children: Vec<IsoEntry>, mode: u32, owner: Owner) -> IsoEntry {
        IsoEntry {
            name: name.to_string(),
            kind: IsoEntryKind::Dir(children),
            mode,
            uid: owner.uid,
            gid: owner.gid,
            mtime: None,
        }
    }

    fn into_input(self) -> InputEntry {
        let metadata = InputMetadata {
            mode: Some(self.mode & 0o7777),
            uid: Some(self.uid),
            gid: Some(self.gid),
            modified: self.mtime,
            ..InputMetadata::default()
        };
        let kind = match self.kind {
            IsoEntryKind::File(bytes) => InputEntryKind::File(bytes),
            IsoEntryKind::Dir(children) => {
                InputEntryKind::Directory(children.into_iter().map(Self::into_input).collect())
            }
        };
        InputEntry {
            name: Arc::new(self.name),
            kind,
            metadata,
        }
    }
}

/// Writes an ISO with volume label `label` holding `entries` at `path` (its directory is
/// created), owned by `owner`, mode [`ISO_MODE`], replacing an existing image atomically.
///
/// # Errors
/// [`StorageError::NoSpace`] or [`StorageError::CreateIso`] (also for a label over 32 bytes);
/// nothing is left at `path` or beside it.
pub fn write_iso(
    volume: &str,
    path: &Path,
    label: &str,
    entries: Vec<IsoEntry>,
    owner: Option<Owner>,
) -> Result<(), StorageError> {
    write_iso_impl(volume, path, label, entries, owner, None)
}

/// [`write_iso`] with an optional write limit (fault injection for tests).
fn write_iso_impl(
    volume: &str,
    path: &Path,
    label: &str,
    entries: Vec<IsoEntry>,
    owner: Option<Owner>,
    limit: Option<u64>,
) -> Result<(), StorageError> {
    let fail = |source: io::Error| iso_error(volume, path, source);
    if label.len() > MAX_LABEL || label.is_empty() {
        return Err(fail(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("volume label {label:?} must be 1 to {MAX_LABEL} bytes"),
        )));
    }
    if let Some(dir) = path.parent() {
        create_dir_all(dir).map_err(fail)?;
    }
    let staged = Staged::create(path, ISO_MODE).map_err(fail)?;
    write_iso_limited(staged.file(), label, entries, limit).map_err(fail)?;
    staged.commit(owner, ISO_MODE, Replace::Yes).map_err(fail)?;
    Ok(())
}

/// Writes a zero-filled image of `size` bytes at `path`: what KubeVirt puts in place of a config
/// or cloud-init ISO on a migration target (`GenerateEmptyIso`, `defaultCreateEmptyIsoImage`),
/// sized from the source's volume status.
///
/// # Errors
/// As [`write_iso`].
pub fn write_zeroed_iso(
    volume: &str,
    path: &Path,
    size: u64,
    owner: Option<Owner>,
) -> Result<(), StorageError> {
    let fail = |source: io::Error| iso_error(volume, path, source);
    if let Some(dir) = path.parent() {
        create_dir_all(dir).map_err(fail)?;
    }
    let staged = Staged::create(path, ISO_MODE).map_err(fail)?;
    // Allocate for real (as WriteBytes does) so a full disk fails now, not in the guest.
    allocate(staged.file(), size).map_err(fail)?;
    staged.commit(owner, ISO_MODE, Replace::Yes).map_err(fail)?;
    Ok(())
}

fn allocate(file: &std::fs::File, size: u64) -> io::Result<()> {
    if size == 0 {
        return Ok(());
    }
    match nix::fcntl::posix_fallocate(file, 0, size as libc::off_t) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EOPNOTSUPP) | Err(nix::errno::Errno::EINVAL) => {
            let zeros = vec![0u8; 1 << 20];
            let mut written = 0u64;
            while written < size {
                let n = (size - written).min(zeros.len() as u64) as usize;
                file.write_all_at(&zeros[..n], written)?;
                written += n as u64;
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

fn iso_error(volume: &str, path: &Path, source: io::Error) -> StorageError {
    if is_no_space(&source) {
        StorageError::NoSpace {
            volume: volume.to_string(),
            path: path.to_path_buf(),
            source,
        }
    } else {
        StorageError::CreateIso {
            volume: volume.to_string(),
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Writes the image into `out`, pads and patches it. With `limit`, fails with `ENOSPC` once more
/// than `limit` bytes would be written (the fault injection of the interrupted-write tests;
/// `None` in production).
pub(crate) fn write_iso_limited(
    out: &std::fs::File,
    label: &str,
    entries: Vec<IsoEntry>,
    limit: Option<u64>,
) -> io::Result<()> {
    let tree = InputTree {
        path_separator: PathSeparator::ForwardSlash,
        entries: entries.into_iter().map(IsoEntry::into_input).collect(),
    };
    let options = IsoFormatOptions {
        volume_name: label.to_string(),
        system_id: None,
        volume_set_id: None,
        publisher_id: None,
        preparer_id: None,
        application_id: None,
        sector_size: SECTOR as usize,
        features: CreationFeatures::extensions(),
        path_separator: PathSeparator::ForwardSlash,
        strict_charset: false,
    };
    let first_error = Rc::new(RefCell::new(None));
    let mut file = out.try_clone()?;
    file.seek(SeekFrom::Start(0))?;
    let writer = RecordingFile {
        file,
        first_error: Rc::clone(&first_error),
        written: 0,
        limit,
    };
    // hadris erases the OS error into a portable kind (ENOSPC becomes "Other"); the wrapper
    // keeps the original so callers can tell a full disk from other failures.
    let writer = match IsoImageWriter::create(writer, tree, options) {
        Ok(writer) => writer,
        Err(hadris_iso::write::IsoCreationError::Io(e)) => {
            return Err(first_error
                .borrow_mut()
                .take()
                .unwrap_or_else(|| io::Error::new(io::ErrorKind::from(e.kind()), e.to_string())))
        }
    };
    let mut file = writer.file;
    file.flush()?;
    let written = file.seek(SeekFrom::End(0))?;
    let padded = written.div_ceil(CYLINDER).max(1) * CYLINDER;
    if limit.is_some_and(|limit| limit < padded) {
        return Err(io::Error::from_raw_os_error(libc::ENOSPC));
    }
    if padded != written {
        // Explicit zeros rather than a hole, so a full filesystem fails here.
        allocate_range(&file, written, padded - written)?;
    }
    fill_holes(&file, padded)?;
    patch_volume_space_size(&file, padded / SECTOR)
}

/// Allocates the areas the image writer skipped (the system area, gaps between extents), so the
/// whole image is on disk as with genisoimage, which writes every byte: a full file system
/// fails here rather than in the guest, and KubeVirt's `IsPreAllocated` (allocated bytes cover
/// the size) holds, which with `cache=none` gives `io=native` (`SetOptimalIOMode`). Data is left
/// as it is; a file system without `fallocate` keeps its holes.
fn fill_holes(file: &std::fs::File, len: u64) -> io::Result<()> {
    match nix::fcntl::fallocate(
        file,
        nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
        0,
        len as libc::off_t,
    ) {
        Ok(()) | Err(nix::errno::Errno::EOPNOTSUPP) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A file that remembers the first I/O error it returned, and can be told to fail with `ENOSPC`
/// after `limit` bytes.
struct RecordingFile {
    file: std::fs::File,
    first_error: Rc<RefCell<Option<io::Error>>>,
    written: u64,
    limit: Option<u64>,
}

impl RecordingFile {
    fn record<T>(&mut self, result: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &result {
            let mut slot = self.first_error.borrow_mut();
            if slot.is_none() {
                *slot = Some(match e.raw_os_error() {
                    Some(code) => io::Error::from_raw_os_error(code),
                    None => io::Error::new(e.kind(), e.to_string()),
                });
            }
        }
        result
    }
}

impl Read for RecordingFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let result = self.file.read(buf);
        self.record(result)
    }
}

impl Write for RecordingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(limit) = self.limit {
            let position = self.file.stream_position()?;
            if position + buf.len() as u64 > limit {
                return self.record(Err(io::Error::from_raw_os_error(libc::ENOSPC)));
            }
        }
        let result = self.file.write(buf);
        if let Ok(n) = &result {
            self.written += *n as u64;
        }
        self.record(result)
    }

    fn flush(&mut self) -> io::Result<()> {
        let result = self.file.flush();
        self.record(result)
    }
}

impl Seek for RecordingFile {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        let result = self.file.seek(pos);
        self.record(result)
    }
}

fn allocate_range(file: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
    let zeros = vec![0u8; len.min(CYLINDER) as usize];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

/// Sets the both-endian "volume space size" (bytes 80..88) of every primary (type 1) and
/// supplementary (type 2, Joliet) volume descriptor to `sectors`.
fn patch_volume_space_size(file: &std::fs::File, sectors: u64) -> io::Result<()> {
    let sectors = u32::try_from(sectors)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "ISO larger than 2^32 sectors"))?;
    let mut both = [0u8; 8];
    both[..4].copy_from_slice(&sectors.to_le_bytes());
    both[4..].copy_from_slice(&sectors.to_be_bytes());
    for sector in FIRST_DESCRIPTOR..FIRST_DESCRIPTOR + 64 {
        let mut head = [0u8; 6];
        file.read_exact_at(&mut head, sector * SECTOR)?;
        if &head[1..6] != b"CD001" {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("no volume descriptor at sector {sector}"),
            ));
        }
        match head[0] {
            1 | 2 => file.write_all_at(&both, sector * SECTOR + 80)?,
            255 => return Ok(()),
            _ => {}
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "no volume descriptor set terminator",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    #[test]
    fn a_write_failing_mid_image_leaves_nothing_behind() {
        let dir = std::env::temp_dir().join(format!("qlauncher-iso-fail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let owner = Owner { uid: 0, gid: 0 };
        let entries = vec![IsoEntry::file(
            "user-data",
            vec![7u8; 200_000],
            0o600,
            owner,
        )];
        for limit in [0u64, 2048, 40_000, 100_000, 300_000] {
            let iso = dir.join("noCloud.iso");
            let err = write_iso_impl(
                "cloudinitdisk",
                &iso,
                "cidata",
                entries.clone(),
                None,
                Some(limit),
            )
            .unwrap_err();
            assert!(
                matches!(err, StorageError::NoSpace { .. }),
                "limit {limit}: {err:?}"
            );
            assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "limit {limit}");
        }
        // An existing image survives a failed regeneration untouched.
        let iso = dir.join("noCloud.iso");
        write_iso_impl("cloudinitdisk", &iso, "cidata", entries.clone(), None, None).unwrap();
        let before = std::fs::read(&iso).unwrap();
        assert!(
            write_iso_impl("cloudinitdisk", &iso, "cidata", entries, None, Some(50_000)).is_err()
        );
        assert!(std::fs::read(&iso).unwrap() == before);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn image_is_padded_to_a_cylinder_and_descriptors_say_so() {
        let path =
            std::env::temp_dir().join(format!("qlauncher-iso-unit-{}.iso", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        let owner = Owner { uid: 0, gid: 0 };
        write_iso_limited(
            &file,
            "cidata",
            vec![IsoEntry::file(
                "user-data",
                b"#cloud-config\n".to_vec(),
                0o600,
                owner,
            )],
            None,
        )
        .unwrap();
        let len = file.metadata().unwrap().len();
        assert_eq!(len, CYLINDER);
        let mut pvd = [0u8; 88];
        file.read_exact_at(&mut pvd, 16 * SECTOR).unwrap();
        assert_eq!(&pvd[1..6], b"CD001");
        assert_eq!(u32::from_le_bytes(pvd[80..84].try_into().unwrap()), 512);
        assert_eq!(u32::from_be_bytes(pvd[84..88].try_into().unwrap()), 512);
        assert_eq!(&pvd[40..46], b"cidata");
        std::fs::remove_file(&path).unwrap();
    }
}
