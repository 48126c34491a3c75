//! ConfigMap, Secret, DownwardAPI, ServiceAccount and Sysprep volumes as ISO images.
//!
//! Mirrors KubeVirt v1.9.0 `pkg/config/*.go`: the volume's mount directory is listed and every
//! entry (including kubelet's `..data` link and timestamped directory) is grafted at the ISO root
//! under its own name, following symbolic links (`xorrisofs -follow-links -graft-points
//! name=path ...`), with Rock Ridge keeping each file's mode, owner and mtime. Labels: the
//! volume's `volumeLabel`, else `cfgdata`; Sysprep always `unattendCD` and it must hold
//! `autounattend.xml` or `unattend.xml` (any case). Paths:
//!
//! | kind | source | ISO |
//! |---|---|---|
//! | ConfigMap | `<private>/config-map/<vol>` | `<private>/config-map-disks/<vol>.iso` |
//! | Secret | `<private>/secret/<vol>` | `<private>/secret-disks/<vol>.iso` |
//! | DownwardAPI | `<private>/downwardapi/<vol>` | `<private>/downwardapi-disks/<vol>.iso` |
//! | Sysprep | `<private>/sysprep/<vol>` | `<private>/sysprep-disks/<vol>.iso` |
//! | ServiceAccount | `/var/run/secrets/kubernetes.io/serviceaccount` | `<private>/service-account-disk/service-account.iso` |
//!
//! where `<private>` is `/var/run/kubevirt-private`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::cloud_init::read_capped;
use super::iso::{write_iso, IsoEntry, IsoEntryKind};
use super::{paths, validate_volume_name, Owner, StorageError};

/// Default label of config ISOs.
pub const DEFAULT_LABEL: &str = "cfgdata";
/// Label of sysprep ISOs.
pub const SYSPREP_LABEL: &str = "unattendCD";
/// Largest single file taken into a config ISO (files are held in memory while imaging; a
/// Kubernetes ConfigMap or Secret is at most 1 MiB, the service account token far less).
pub const CONFIG_FILE_MAX: u64 = 64 << 20;
/// Deepest directory nesting followed (guards against symlink loops).
const MAX_DEPTH: usize = 8;

/// The source of a config volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigVolumeKind {
    /// `configMap`.
    ConfigMap,
    /// `secret`.
    Secret,
    /// `downwardAPI`.
    DownwardApi,
    /// `serviceAccount`.
    ServiceAccount,
    /// `sysprep` (with a ConfigMap or Secret inside).
    Sysprep,
}

/// One config volume to image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigVolumeSpec {
    /// Volume name.
    pub volume: String,
    /// Source kind.
    pub kind: ConfigVolumeKind,
    /// The directory whose entries go into the ISO.
    pub source: PathBuf,
    /// Where the ISO goes.
    pub iso: PathBuf,
    /// ISO volume label.
    pub label: String,
    /// Owner of the ISO file, or `None` to keep the creator's.
    pub owner: Option<Owner>,
}

impl ConfigVolumeSpec {
    /// The spec KubeVirt would use: source and ISO paths under `private_dir` (normally
    /// [`paths::PRIVATE_DIR`]; the service account source is always
    /// [`paths::SERVICE_ACCOUNT_SOURCE_DIR`]), label from `volume_label` (`volumeLabel`), owned by
    /// the qemu user.
    ///
    /// # Errors
    /// [`StorageError::InvalidVolumeName`].
    pub fn at_kubevirt_paths(
        volume: &str,
        kind: ConfigVolumeKind,
        volume_label: Option<&str>,
        private_dir: &Path,
    ) -> Result<ConfigVolumeSpec, StorageError> {
        validate_volume_name(volume)?;
        let iso_name = format!("{volume}.iso");
        let (source, iso) = match kind {
            ConfigVolumeKind::ConfigMap => (
                private_dir.join("config-map").join(volume),
                private_dir.join("config-map-disks").join(iso_name),
            ),
            ConfigVolumeKind::Secret => (
                private_dir.join("secret").join(volume),
                private_dir.join("secret-disks").join(iso_name),
            ),
            ConfigVolumeKind::DownwardApi => (
                private_dir.join("downwardapi").join(volume),
                private_dir.join("downwardapi-disks").join(iso_name),
            ),
            ConfigVolumeKind::Sysprep => (
                private_dir.join("sysprep").join(volume),
                private_dir.join("sysprep-disks").join(iso_name),
            ),
            ConfigVolumeKind::ServiceAccount => (
                PathBuf::from(paths::SERVICE_ACCOUNT_SOURCE_DIR),
                private_dir
                    .join("service-account-disk")
                    .join("service-account.iso"),
            ),
        };
        let label = match kind {
            ConfigVolumeKind::Sysprep => SYSPREP_LABEL.to_string(),
            ConfigVolumeKind::ServiceAccount => DEFAULT_LABEL.to_string(),
            _ => volume_label
                .filter(|l| !l.is_empty())
                .unwrap_or(DEFAULT_LABEL)
                .to_string(),
        };
        Ok(ConfigVolumeSpec {
            volume: volume.to_string(),
            kind,
            source,
            iso,
            label,
            owner: Some(Owner::QEMU),
        })
    }
}

/// Images `spec.source` into `spec.iso`, replacing an older image.
///
/// # Errors
/// [`StorageError::ReadSource`] when the source cannot be listed or read,
/// [`StorageError::SysprepUnattendMissing`], [`StorageError::DataTooLarge`],
/// [`StorageError::NoSpace`], [`StorageError::CreateIso`]; nothing is left behind on failure.
pub fn write_config_volume_iso(spec: &ConfigVolumeSpec) -> Result<(), StorageError> {
    validate_volume_name(&spec.volume)?;
    let entries = read_tree(&spec.volume, &spec.source, 0)?;
    if spec.kind == ConfigVolumeKind::Sysprep
        && !entries.iter().any(|e| {
            let lower = e.name.to_ascii_lowercase();
            lower == "autounattend.xml" || lower == "unattend.xml"
        })
    {
        return Err(StorageError::SysprepUnattendMissing {
            volume: spec.volume.clone(),
            dir: spec.source.clone(),
        });
    }
    write_iso(&spec.volume, &spec.iso, &spec.label, entries, spec.owner)
}

/// Lists `dir` (sorted by name), following symbolic links, into ISO entries.
fn read_tree(volume: &str, dir: &Path, depth: usize) -> Result<Vec<IsoEntry>, StorageError> {
    let read_err = |path: &Path, source| StorageError::ReadSource {
        volume: volume.to_string(),
        path: path.to_path_buf(),
        source,
    };
    if depth > MAX_DEPTH {
        return Err(read_err(
            dir,
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("directories nest deeper than {MAX_DEPTH} levels (a symlink loop?)"),
            ),
        ));
    }
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| read_err(dir, e))? {
        let entry = entry.map_err(|e| read_err(dir, e))?;
        names.push(entry.file_name());
    }
    names.sort();
    let mut entries = Vec::with_capacity(names.len());
    for name in names {
        let path = dir.join(&name);
        let meta = std::fs::metadata(&path).map_err(|e| read_err(&path, e))?;
        let kind = if meta.is_dir() {
            IsoEntryKind::Dir(read_tree(volume, &path, depth + 1)?)
        } else if meta.is_file() {
            IsoEntryKind::File(read_capped(volume, &path, CONFIG_FILE_MAX)?)
        } else {
            // Sockets, fifos, devices: xorrisofs would record them; a config volume has none.
            continue;
        };
        entries.push(IsoEntry {
            name: name.to_string_lossy().into_owned(),
            kind,
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
            mtime: Some(meta.mtime()),
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubevirt_paths_and_labels() {
        let private = Path::new("/var/run/kubevirt-private");
        let cm = ConfigVolumeSpec::at_kubevirt_paths(
            "app-config",
            ConfigVolumeKind::ConfigMap,
            None,
            private,
        )
        .unwrap();
        assert_eq!(
            cm,
            ConfigVolumeSpec {
                volume: "app-config".into(),
                kind: ConfigVolumeKind::ConfigMap,
                source: "/var/run/kubevirt-private/config-map/app-config".into(),
                iso: "/var/run/kubevirt-private/config-map-disks/app-config.iso".into(),
                label: "cfgdata".into(),
                owner: Some(Owner::QEMU),
            }
        );
        let sa = ConfigVolumeSpec::at_kubevirt_paths(
            "sa",
            ConfigVolumeKind::ServiceAccount,
            Some("x"),
            private,
        )
        .unwrap();
        assert_eq!(
            (sa.source, sa.iso, sa.label),
            (
                PathBuf::from("/var/run/secrets/kubernetes.io/serviceaccount"),
                PathBuf::from("/var/run/kubevirt-private/service-account-disk/service-account.iso"),
                "cfgdata".to_string()
            )
        );
        let sp = ConfigVolumeSpec::at_kubevirt_paths(
            "win",
            ConfigVolumeKind::Sysprep,
            Some("x"),
            private,
        )
        .unwrap();
        assert_eq!(sp.label, "unattendCD");
        let labelled = ConfigVolumeSpec::at_kubevirt_paths(
            "s",
            ConfigVolumeKind::Secret,
            Some("mylabel"),
            private,
        )
        .unwrap();
        assert_eq!(labelled.label, "mylabel");
        assert!(ConfigVolumeSpec::at_kubevirt_paths(
            "../x",
            ConfigVolumeKind::Secret,
            None,
            private
        )
        .is_err());
    }
}
