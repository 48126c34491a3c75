//! Staged files: written under a temporary name beside the final path, fsynced, then renamed.
//!
//! KubeVirt writes `<iso>.staging` and renames it; the temporary name here also carries the pid
//! and a counter so two writers never share one. Until [`Staged::commit`] succeeds, dropping the
//! value removes the temporary file, so a failure at any step leaves nothing behind.
//!
//! Files that never replace an existing one ([`Staged::create_unnamed`]: overlays, empty disks)
//! are staged without a name at all where the file system allows it: `open(O_TMPFILE)` in the
//! final directory and `linkat` of `/proc/self/fd/<n>` (open(2)'s recipe, which needs no
//! `CAP_DAC_READ_SEARCH`, unlike `AT_EMPTY_PATH`) at commit, which also refuses an existing
//! name. One directory operation instead of a create and a rename, and a crash leaves no
//! temporary name behind. Where `O_TMPFILE` is unsupported (`EOPNOTSUPP`, `EISDIR` on kernels
//! before 3.11) the named temporary file and rename are used.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::Owner;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// How [`Staged::commit`] treats an existing file at the final path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replace {
    /// Atomically replace it (ISOs are regenerated on every sync).
    Yes,
    /// Keep it and discard the staged file (`renameat2(RENAME_NOREPLACE)`): images holding guest
    /// writes are never overwritten, even by a concurrent creator.
    No,
}

/// A file being written under a temporary name in the final path's directory.
#[derive(Debug)]
pub(crate) struct Staged {
    file: Option<File>,
    /// The temporary name; empty for an unnamed (`O_TMPFILE`) file or once committed.
    tmp: PathBuf,
    target: PathBuf,
    durability: Durability,
}

/// Whether [`Staged::commit`] makes the file durable before and after the rename.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// fsync the file, rename, fsync the directory: for anything that can outlive the pod
    /// (PVC and host-disk images, NVRAM, ...). The default.
    Synced,
    /// Rename only: for files that die with the pod's `emptyDir` (containerDisk and ephemeral
    /// overlays). virt-launcher pods never restart (`restartPolicy: Never`), so after a crash
    /// nobody reads the file again; the rename still makes it appear whole or not at all to a
    /// running reader.
    PodLifetime,
}

impl Staged {
    /// Creates `.<name>.staging.<pid>.<n>` beside `target`, exclusively, with `mode`.
    pub(crate) fn create(target: &Path, mode: u32) -> io::Result<Staged> {
        let dir = target.parent().unwrap_or(Path::new("."));
        let name = target.file_name().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "target has no file name")
        })?;
        let mut tmp_name = OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(
            ".staging.{}.{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let tmp = dir.join(tmp_name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_CLOEXEC)
            .open(&tmp)?;
        Ok(Staged {
            file: Some(file),
            tmp,
            target: target.to_path_buf(),
            durability: Durability::Synced,
        })
    }

    /// Creates an unnamed file (`O_TMPFILE`) in `target`'s directory with `mode`, for a commit
    /// with [`Replace::No`]; falls back to [`Staged::create`] where the file system or kernel
    /// has no `O_TMPFILE`.
    pub(crate) fn create_unnamed(target: &Path, mode: u32) -> io::Result<Staged> {
        let dir = target.parent().unwrap_or(Path::new("."));
        if target.file_name().is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "target has no file name",
            ));
        }
        match OpenOptions::new()
            .read(true)
            .write(true)
            .mode(mode)
            .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
            .open(dir)
        {
            Ok(file) => Ok(Staged {
                file: Some(file),
                tmp: PathBuf::new(),
                target: target.to_path_buf(),
                durability: Durability::Synced,
            }),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
                Staged::create(target, mode)
            }
            Err(e) => Err(e),
        }
    }

    /// Sets how [`Staged::commit`] treats durability (default [`Durability::Synced`]).
    pub(crate) fn with_durability(mut self, durability: Durability) -> Staged {
        self.durability = durability;
        self
    }

    /// The open temporary file.
    pub(crate) fn file(&self) -> &File {
        // `file` is only taken by `commit`, which consumes `self`.
        self.file.as_ref().unwrap_or_else(|| unreachable!())
    }

    /// Sets owner and mode (explicitly, not through the umask), fsyncs the data, renames the file
    /// to its final name and fsyncs the directory (no fsync for [`Durability::PodLifetime`]). Returns false when `replace` is
    /// [`Replace::No`] and the final path already existed (the staged file is then removed).
    pub(crate) fn commit(
        mut self,
        owner: Option<Owner>,
        mode: u32,
        replace: Replace,
    ) -> io::Result<bool> {
        let file = self.file.take().unwrap_or_else(|| unreachable!());
        if let Some(owner) = owner {
            std::os::unix::fs::fchown(&file, Some(owner.uid), Some(owner.gid))?;
        }
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        let synced = self.durability == Durability::Synced;
        if synced {
            file.sync_all()?;
        }
        if self.tmp.as_os_str().is_empty() {
            return link_unnamed(&file, &self.target, replace, synced);
        }
        drop(file);
        let created = match replace {
            Replace::Yes => {
                std::fs::rename(&self.tmp, &self.target)?;
                true
            }
            Replace::No => {
                match nix::fcntl::renameat2(
                    nix::fcntl::AT_FDCWD,
                    &self.tmp,
                    nix::fcntl::AT_FDCWD,
                    &self.target,
                    nix::fcntl::RenameFlags::RENAME_NOREPLACE,
                ) {
                    Ok(()) => true,
                    Err(nix::errno::Errno::EEXIST) => false,
                    // Filesystems without RENAME_NOREPLACE: link(2) also refuses to replace.
                    Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOSYS) => {
                        match std::fs::hard_link(&self.tmp, &self.target) {
                            Ok(()) => {
                                std::fs::remove_file(&self.tmp)?;
                                true
                            }
                            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
                            Err(e) => return Err(e),
                        }
                    }
                    Err(e) => return Err(io::Error::from(e)),
                }
            }
        };
        if created {
            // The temporary name is gone; nothing for Drop to remove.
            self.tmp = PathBuf::new();
            if synced {
                sync_dir(self.target.parent().unwrap_or(Path::new(".")))?;
            }
        }
        Ok(created)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        self.file.take();
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Gives the unnamed file its name (`linkat`, which never replaces: false when the name exists).
fn link_unnamed(file: &File, target: &Path, replace: Replace, synced: bool) -> io::Result<bool> {
    if replace == Replace::Yes {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an unnamed staged file cannot replace an existing one",
        ));
    }
    let proc_path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    let linked = nix::unistd::linkat(
        nix::fcntl::AT_FDCWD,
        &proc_path,
        nix::fcntl::AT_FDCWD,
        target,
        nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
    )
    .or_else(|e| match e {
        // No /proc: the descriptor itself (needs CAP_DAC_READ_SEARCH).
        nix::errno::Errno::ENOENT if !Path::new("/proc/self/fd").exists() => nix::unistd::linkat(
            file.as_fd(),
            "",
            nix::fcntl::AT_FDCWD,
            target,
            nix::fcntl::AtFlags::AT_EMPTY_PATH,
        ),
        other => Err(other),
    });
    match linked {
        Ok(()) => {
            if synced {
                sync_dir(target.parent().unwrap_or(Path::new(".")))?;
            }
            Ok(true)
        }
        Err(nix::errno::Errno::EEXIST) => Ok(false),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// fsyncs a directory so a rename in it is durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` and its parents with mode 0755 (KubeVirt's `MkdirAllWithNosec` uses 0750 for
/// some and 0755 for others; the qemu user only needs search permission).
pub(crate) fn create_dir_all(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
}

use std::os::unix::fs::DirBuilderExt;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "qlauncher-staged-{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn dropped_staged_file_leaves_nothing() {
        let dir = scratch("drop");
        {
            let staged = Staged::create(&dir.join("x.iso"), 0o644).unwrap();
            staged.file().write_all_at(b"partial", 0).unwrap();
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn no_replace_commit_keeps_the_existing_file() {
        let dir = scratch("keep");
        let target = dir.join("disk.qcow2");
        std::fs::write(&target, b"guest writes").unwrap();
        let staged = Staged::create(&target, 0o640).unwrap();
        staged.file().write_all_at(b"new", 0).unwrap();
        assert!(!staged.commit(None, 0o640, Replace::No).unwrap());
        assert_eq!(std::fs::read(&target).unwrap(), b"guest writes");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn commit_sets_mode_and_renames() {
        let dir = scratch("commit");
        let target = dir.join("a.iso");
        let staged = Staged::create(&target, 0o600).unwrap();
        staged.file().write_all_at(b"data", 0).unwrap();
        assert!(staged.commit(None, 0o640, Replace::Yes).unwrap());
        let meta = std::fs::metadata(&target).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unnamed_file_has_no_name_until_linked_with_its_mode() {
        let dir = scratch("unnamed");
        let target = dir.join("disk.qcow2");
        let staged = Staged::create_unnamed(&target, 0o600).unwrap();
        staged.file().write_all_at(b"image", 0).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        assert!(staged.commit(None, 0o640, Replace::No).unwrap());
        assert_eq!(std::fs::read(&target).unwrap(), b"image");
        let meta = std::fs::metadata(&target).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);

        // Dropped before the commit: nothing ever had a name.
        drop(Staged::create_unnamed(&dir.join("other.qcow2"), 0o600).unwrap());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unnamed_file_never_replaces_one_created_meanwhile() {
        let dir = scratch("unnamed-race");
        let target = dir.join("disk.qcow2");
        let staged = Staged::create_unnamed(&target, 0o640).unwrap();
        staged.file().write_all_at(b"new", 0).unwrap();
        std::fs::write(&target, b"guest writes").unwrap();
        assert!(!staged.commit(None, 0o640, Replace::No).unwrap());
        assert_eq!(std::fs::read(&target).unwrap(), b"guest writes");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
