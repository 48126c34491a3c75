//! The ImageVolume feature's disk links (KubeVirt v1.9.0 `pkg/virt-launcher/virtwrap/manager.go
//! linkImageVolumeFilePaths`, `getDiskTargetPathFromImageVolumeView`,
//! `getKernelBootArtifactPathFromImageVolumeView`).
//!
//! With the `ImageVolume` feature gate (on by default in v1.9, virt-controller then passes
//! `--image-volume`), no container-disk sidecar and no virt-handler bind mount bring the
//! containerDisk in: the kubelet mounts the containerDisk *image* read-only at
//! `/var/run/kubevirt-image-volume/disk_<i>` (`i` = the volume's position in `spec.volumes`), and
//! the kernel boot image at `/var/run/kubevirt-kernel-boot`. Before converting the VMI the launcher
//! links the KubeVirt paths the rest of the launcher uses to the files in those volumes:
//! - `<container-disk-dir>/disk_<i>.img` → `disk_<i>/<containerDisk.path>` when the volume names a
//!   path, else the one file in `disk_<i>/disk/` (none or more than one is an error);
//! - `<container-disk-dir>/kernel-boot/<basename>` → `<kernel boot dir>/<kernelPath|initrdPath>`.
//!
//! The image's own symlinks are resolved with the volume as the root (KubeVirt
//! `safepath.JoinAndResolveWithRelativeRoot`): an absolute link target or `..` never leaves the
//! volume. An existing link is kept (KubeVirt ignores `EEXIST`); a new one is made under a
//! temporary name and renamed.

use std::path::{Component, Path, PathBuf};

use super::error::StorageError;
use super::Outcome;

/// KubeVirt's `DiskSourceFallbackPath`: the directory of a containerDisk image that holds its one
/// disk file when the volume names no `path`.
pub const DISK_SOURCE_FALLBACK_DIR: &str = "disk";

/// Where the kubelet mounts the kernel boot image with the ImageVolume feature
/// (`pkg/util/util.go VirtKernelBootVolumeDir`).
pub const KERNEL_BOOT_VOLUME_DIR: &str = "/var/run/kubevirt-kernel-boot";

/// The image volume directories of a pod: `<root>/var/run/kubevirt-image-volume` (`disk_<i>`
/// below it) and `<root>/var/run/kubevirt-kernel-boot` (`root` is `/` in a pod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageVolumeDirs {
    /// [`super::paths::IMAGE_VOLUME_DIR`] under the root.
    pub disks: PathBuf,
    /// [`KERNEL_BOOT_VOLUME_DIR`] under the root.
    pub kernel_boot: PathBuf,
}

impl ImageVolumeDirs {
    /// KubeVirt's directories under `root`.
    pub fn under_root(root: &Path) -> ImageVolumeDirs {
        ImageVolumeDirs {
            disks: root.join(super::paths::IMAGE_VOLUME_DIR.trim_start_matches('/')),
            kernel_boot: root.join(KERNEL_BOOT_VOLUME_DIR.trim_start_matches('/')),
        }
    }
}

/// The most symlinks followed while resolving one path (Linux's `MAXSYMLINKS`).
const MAX_SYMLINKS: u32 = 40;

/// Links `<container_disk_dir>/disk_<index>.img` to the disk file of the image volume
/// `<image_volume_dir>/disk_<index>`: `path` inside it when given (`containerDisk.path`, relative
/// to the image's root), else the single file in its `disk/` directory.
///
/// Returns the link target (an absolute path below `image_volume_dir`) and whether the link was
/// made or kept. Errors: [`StorageError::ImageVolume`] naming `volume` when the volume has no such
/// file, `disk/` holds none or several, a path component is not valid, or the link cannot be made.
pub fn link_container_disk(
    image_volume_dir: &Path,
    container_disk_dir: &Path,
    volume: &str,
    index: usize,
    path: Option<&str>,
) -> Result<(PathBuf, Outcome), StorageError> {
    let root = image_volume_dir.join(format!("disk_{index}"));
    let err = |path: &Path, reason: String| StorageError::ImageVolume {
        volume: volume.to_string(),
        path: path.to_path_buf(),
        reason,
    };
    let relative = match path.filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => {
            let dir = root.join(DISK_SOURCE_FALLBACK_DIR);
            let mut names = Vec::new();
            for entry in std::fs::read_dir(&dir)
                .map_err(|e| err(&dir, format!("cannot list the disk directory: {e}")))?
            {
                let entry = entry.map_err(|e| err(&dir, format!("cannot list: {e}")))?;
                names.push(entry.file_name());
            }
            match names.as_slice() {
                [one] => Path::new(DISK_SOURCE_FALLBACK_DIR).join(one),
                [] => return Err(err(&dir, "no file found, no disk present".into())),
                _ => {
                    return Err(err(
                        &dir,
                        format!("{} files found, only one disk is allowed", names.len()),
                    ))
                }
            }
        }
    };
    let target =
        resolve_in_root(&root, &relative).map_err(|reason| err(&root.join(&relative), reason))?;
    let link = container_disk_dir.join(format!("disk_{index}.img"));
    let outcome =
        make_link(&target, &link).map_err(|e| err(&link, format!("cannot link it: {e}")))?;
    Ok((target, outcome))
}

/// Links the kernel boot artifacts (`kernelBoot.container.kernelPath` and `initrdPath`, each
/// relative to the image's root) of the image volume `kernel_boot_dir` as
/// `<container_disk_dir>/kernel-boot/<basename>` (the directory made 0755 if missing); empty or
/// absent paths are skipped. Returns the link targets. Errors: [`StorageError::ImageVolume`] for
/// the volume `kernel-boot`, as [`link_container_disk`].
pub fn link_kernel_boot(
    kernel_boot_dir: &Path,
    container_disk_dir: &Path,
    artifacts: &[Option<&str>],
) -> Result<Vec<PathBuf>, StorageError> {
    let err = |path: &Path, reason: String| StorageError::ImageVolume {
        volume: "kernel-boot".to_string(),
        path: path.to_path_buf(),
        reason,
    };
    let dir = container_disk_dir.join("kernel-boot");
    let mut targets = Vec::new();
    for artifact in artifacts.iter().flatten().filter(|a| !a.is_empty()) {
        let relative = Path::new(artifact);
        let Some(name) = relative.file_name() else {
            return Err(err(relative, "the artifact path has no file name".into()));
        };
        let target = resolve_in_root(kernel_boot_dir, relative)
            .map_err(|reason| err(&kernel_boot_dir.join(relative), reason))?;
        if !dir.is_dir() {
            std::fs::create_dir_all(&dir).map_err(|e| err(&dir, format!("cannot make it: {e}")))?;
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755));
        }
        let link = dir.join(name);
        make_link(&target, &link).map_err(|e| err(&link, format!("cannot link it: {e}")))?;
        targets.push(target);
    }
    Ok(targets)
}

/// `root` joined with `relative`, every symlink on the way resolved as if `root` were `/`
/// (absolute targets start again at `root`, `..` stops at `root`). The result must exist and be
/// a regular file or a block device. Errors are the reason, for the caller's message.
pub fn resolve_in_root(root: &Path, relative: &Path) -> Result<PathBuf, String> {
    let mut pending: Vec<std::ffi::OsString> = Vec::new();
    push_components(&mut pending, relative)?;
    pending.reverse();
    let mut current: Vec<std::ffi::OsString> = Vec::new();
    let mut links = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            current.pop();
            continue;
        }
        let mut candidate = root.to_path_buf();
        candidate.extend(&current);
        candidate.push(&part);
        let meta = std::fs::symlink_metadata(&candidate)
            .map_err(|e| format!("{}: {e}", candidate.display()))?;
        if meta.file_type().is_symlink() {
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(format!("too many symlinks below {}", root.display()));
            }
            let target = std::fs::read_link(&candidate)
                .map_err(|e| format!("{}: {e}", candidate.display()))?;
            if target.is_absolute() {
                current.clear();
            }
            let mut more = Vec::new();
            push_components(&mut more, &target)?;
            pending.extend(more.into_iter().rev());
        } else {
            current.push(part);
        }
    }
    let mut resolved = root.to_path_buf();
    resolved.extend(&current);
    let meta = std::fs::metadata(&resolved).map_err(|e| format!("{}: {e}", resolved.display()))?;
    use std::os::unix::fs::FileTypeExt;
    if !(meta.is_file() || meta.file_type().is_block_device()) {
        return Err(format!("{} is not a file", resolved.display()));
    }
    Ok(resolved)
}

/// The normal and `..` components of `path`, in order (root and `.` dropped).
fn push_components(out: &mut Vec<std::ffi::OsString>, path: &Path) -> Result<(), String> {
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n.to_os_string()),
            Component::ParentDir => out.push("..".into()),
            Component::RootDir | Component::CurDir => {}
            Component::Prefix(_) => return Err(format!("{} is not a Unix path", path.display())),
        }
    }
    Ok(())
}

/// A symlink `link` → `target`, made under a temporary name and renamed; kept when `link` exists.
fn make_link(target: &Path, link: &Path) -> std::io::Result<Outcome> {
    if std::fs::symlink_metadata(link).is_ok() {
        return Ok(Outcome::Kept);
    }
    let name = link.file_name().unwrap_or_default().to_string_lossy();
    let tmp = link.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    std::fs::rename(&tmp, link).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok(Outcome::Created)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let iv = t.path().join("image-volume");
        let cd = t.path().join("container-disks");
        std::fs::create_dir_all(iv.join("disk_1/disk")).unwrap();
        std::fs::create_dir_all(&cd).unwrap();
        (t, iv, cd)
    }

    #[test]
    fn the_single_file_of_disk_is_linked_and_an_existing_link_kept() {
        let (_t, iv, cd) = volume();
        std::fs::write(iv.join("disk_1/disk/fedora.qcow2"), b"x").unwrap();
        let (target, outcome) = link_container_disk(&iv, &cd, "rootdisk", 1, None).unwrap();
        assert_eq!(target, iv.join("disk_1/disk/fedora.qcow2"));
        assert_eq!(outcome, Outcome::Created);
        assert_eq!(std::fs::read_link(cd.join("disk_1.img")).unwrap(), target);
        let (_, again) = link_container_disk(&iv, &cd, "rootdisk", 1, None).unwrap();
        assert_eq!(again, Outcome::Kept);
    }

    #[test]
    fn no_file_or_several_files_name_the_volume() {
        let (_t, iv, cd) = volume();
        let e = link_container_disk(&iv, &cd, "rootdisk", 1, None).unwrap_err();
        assert!(
            e.to_string().contains("volume rootdisk") && e.to_string().contains("no file"),
            "{e}"
        );
        std::fs::write(iv.join("disk_1/disk/a"), b"x").unwrap();
        std::fs::write(iv.join("disk_1/disk/b"), b"x").unwrap();
        let e = link_container_disk(&iv, &cd, "rootdisk", 1, None).unwrap_err();
        assert!(e.to_string().contains("only one disk"), "{e}");
        assert!(!cd.join("disk_1.img").exists());
    }

    #[test]
    fn a_named_path_and_the_images_own_symlinks_stay_inside_the_volume() {
        let (_t, iv, cd) = volume();
        std::fs::create_dir_all(iv.join("disk_1/images")).unwrap();
        std::fs::write(iv.join("disk_1/images/real.img"), b"x").unwrap();
        // An absolute link inside the image means the image's root, not the host's.
        std::os::unix::fs::symlink("/images/real.img", iv.join("disk_1/disk/link.img")).unwrap();
        let (target, _) =
            link_container_disk(&iv, &cd, "rootdisk", 1, Some("/disk/link.img")).unwrap();
        assert_eq!(target, iv.join("disk_1/images/real.img"));
        // `..` stops at the volume's root: /etc/passwd of the host is never reached.
        let e = link_container_disk(&iv, &cd, "d2", 1, Some("../../../../../../etc/passwd"))
            .unwrap_err();
        assert!(e.to_string().contains("volume d2"), "{e}");
        std::os::unix::fs::symlink("/etc/passwd", iv.join("disk_1/escape")).unwrap();
        assert!(link_container_disk(&iv, &cd, "d3", 1, Some("escape")).is_err());
    }

    #[test]
    fn kernel_boot_artifacts_are_linked_by_base_name() {
        let t = tempfile::tempdir().unwrap();
        let kb = t.path().join("kb");
        let cd = t.path().join("cd");
        std::fs::create_dir_all(kb.join("boot")).unwrap();
        std::fs::create_dir_all(&cd).unwrap();
        std::fs::write(kb.join("boot/vmlinuz"), b"k").unwrap();
        std::fs::write(kb.join("boot/initrd.img"), b"i").unwrap();
        let targets = link_kernel_boot(
            &kb,
            &cd,
            &[Some("/boot/vmlinuz"), Some("/boot/initrd.img"), None],
        )
        .unwrap();
        assert_eq!(targets.len(), 2);
        assert_eq!(
            std::fs::read_link(cd.join("kernel-boot/vmlinuz")).unwrap(),
            kb.join("boot/vmlinuz")
        );
        assert!(link_kernel_boot(&kb, &cd, &[Some("/boot/missing")]).is_err());
    }
}
