//! Storage of the first sync beyond overlays, empty disks and cloud-init: config-volume ISOs,
//! hostDisks and persistent volume claims, with the facts the converter needs for them.
//!
//! - configMap, secret, downwardAPI, serviceAccount and sysprep volumes become ISO images of their
//!   mounted directories, as KubeVirt's config disks (`pkg/config/*.go`:
//!   `<private>/config-map/<vol>` imaged into `<private>/config-map-disks/<vol>.iso`, ...).
//! - hostDisk: `Disk` must exist, `DiskOrCreate` is created sparse with its capacity
//!   (`pkg/host-disk/host-disk.go`), at `<private>/vmi-disks/<vol>/<file name of hostDisk.path>`.
//! - persistentVolumeClaim / dataVolume (not hot-pluggable): a block-mode claim is the device
//!   `<dev>/<vol>`; a filesystem claim is the file `<private>/vmi-disks/<vol>/disk.img`, created
//!   with the claim's capacity (`status.volumeStatus[].persistentVolumeClaimInfo.capacity.storage`)
//!   when missing, as KubeVirt turns filesystem PVCs into `DiskOrCreate` hostDisks
//!   (`hostdisk.ReplacePVCByHostDisk`); an existing image shorter than the claim's usable size is
//!   extended first ([`crate::sync::reconcile::resize::expand_offline`]).

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use tracing::info;

use super::cache::{cache_facts, direct_io, iso_facts};
use crate::cmdline::context::{PathRoots, StorageKind, VolumeFacts};
use crate::cmdline::FieldPath;
use crate::storage::{self, ConfigVolumeSpec, HostDiskSpec, HostDiskType};
use crate::sync::error::SyncError;
use crate::vmi::{Vmi, Volume};

/// Prepares `vol` if it is a config volume, a hostDisk or a (non-hotplug) PVC or DataVolume;
/// returns its converter facts, or `None` for other kinds.
///
/// # Errors
/// [`SyncError::Storage`] from the ISO writer or the hostDisk preparation;
/// [`SyncError::InvalidField`] for a filesystem claim whose `disk.img` is missing and whose
/// capacity the VMI status does not give.
pub fn prepare(
    vmi: &Vmi,
    vol: &Volume,
    paths: &PathRoots,
    owner: Option<storage::Owner>,
) -> Result<Option<VolumeFacts>, SyncError> {
    let private = Path::new(&paths.private_dir);
    if let Some(spec) = ConfigVolumeSpec::from_volume(vol, private) {
        let mut spec = spec.map_err(SyncError::Storage)?;
        spec.owner = owner;
        storage::write_config_volume_iso(&spec).map_err(SyncError::Storage)?;
        let facts = iso_facts(&vol.name, &spec.iso);
        info!(volume = %vol.name, iso = %spec.iso.display(), direct_io = facts.direct_io,
            preallocated = facts.preallocated, "config volume ISO");
        return Ok(Some(facts));
    }
    let vmi_disks = private.join("vmi-disks");
    if let Some(spec) = HostDiskSpec::from_volume(vol, &vmi_disks) {
        let mut spec = spec.map_err(SyncError::Storage)?;
        spec.owner = owner;
        create_parent(&spec.path)?;
        let (outcome, size) = storage::prepare_host_disk(&spec).map_err(SyncError::Storage)?;
        let (direct_io, preallocated) = cache_facts(&vol.name, &spec.path, size);
        info!(volume = %vol.name, ?outcome, size, path = %spec.path.display(), direct_io, "hostDisk");
        return Ok(Some(VolumeFacts {
            virtual_size: Some(size),
            direct_io,
            preallocated,
            ..VolumeFacts::default()
        }));
    }
    // Hotplug volumes are the hotplug facts' (`super::hotplug`), whether declared or by status.
    if (vol.persistent_volume_claim.is_none() && vol.data_volume.is_none())
        || vmi.is_hotplug_volume(vol)
    {
        return Ok(None);
    }
    let device = Path::new(&paths.dev).join(&vol.name);
    storage::validate_volume_name(&vol.name).map_err(SyncError::Storage)?;
    if std::fs::metadata(&device).is_ok_and(|m| m.file_type().is_block_device()) {
        let direct_io = direct_io(&vol.name, &[&device]);
        info!(volume = %vol.name, device = %device.display(), direct_io, "block PVC");
        return Ok(Some(VolumeFacts {
            kind: StorageKind::Block,
            direct_io,
            ..VolumeFacts::default()
        }));
    }
    let image = vmi_disks.join(&vol.name).join("disk.img");
    let size = match std::fs::metadata(&image) {
        Ok(m) => m.len(),
        Err(_) => {
            let capacity = claim_capacity(vmi, &vol.name)?.ok_or_else(|| {
                SyncError::invalid_field(
                    super::volume_field(vmi, &vol.name),
                    format!(
                        "{} is missing and status.volumeStatus gives no PVC capacity",
                        image.display()
                    ),
                )
            })?;
            let spec = HostDiskSpec {
                volume: vol.name.clone(),
                path: image.clone(),
                kind: HostDiskType::DiskOrCreate { capacity },
                tolerance_percent: storage::from_vmi::DEFAULT_TOLERANCE_PERCENT,
                reserve_bytes: storage::from_vmi::DEFAULT_RESERVE_BYTES,
                owner,
            };
            create_parent(&image)?;
            storage::prepare_host_disk(&spec)
                .map_err(SyncError::Storage)?
                .1
        }
    };
    let size = crate::sync::reconcile::resize::expand_offline(vmi, &vol.name, &image, size);
    let (direct_io, preallocated) = cache_facts(&vol.name, &image, size);
    info!(volume = %vol.name, size, image = %image.display(), direct_io, preallocated, "filesystem PVC");
    Ok(Some(VolumeFacts {
        virtual_size: Some(size),
        direct_io,
        preallocated,
        ..VolumeFacts::default()
    }))
}

/// `status.volumeStatus[name].persistentVolumeClaimInfo.capacity.storage` in bytes.
fn claim_capacity(vmi: &Vmi, name: &str) -> Result<Option<u64>, SyncError> {
    let Some((index, q)) = vmi
        .status
        .as_ref()
        .and_then(|s| s.volume_status.as_ref())
        .and_then(|list| list.iter().enumerate().find(|(_, v)| v.name == name))
        .and_then(|(i, v)| Some((i, v.persistent_volume_claim_info.as_ref()?)))
        .and_then(|(i, info)| Some((i, info.capacity.as_ref()?.get("storage")?)))
    else {
        return Ok(None);
    };
    q.to_bytes().map(Some).map_err(|e| {
        let path = FieldPath::new("status.volumeStatus")
            .index(index)
            .key("persistentVolumeClaimInfo.capacity.storage");
        SyncError::invalid_field(path, e.to_string())
    })
}

fn create_parent(path: &Path) -> Result<(), SyncError> {
    let dir: PathBuf = path.parent().map(Path::to_path_buf).unwrap_or_default();
    std::fs::create_dir_all(&dir).map_err(|source| SyncError::PrepareQemu {
        what: format!("create {}", dir.display()),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the test directory's file system takes O_DIRECT (ext4, tmpfs since Linux 6.6).
    fn dio(dir: &Path) -> bool {
        storage::direct_io_supported(dir).unwrap()
    }

    fn roots(dir: &Path) -> PathRoots {
        let r = |p: &str| dir.join(p).display().to_string();
        PathRoots {
            private_dir: r("private"),
            dev: r("dev"),
            ..PathRoots::default()
        }
    }

    fn vmi(volumes: serde_json::Value, status: serde_json::Value) -> Vmi {
        let json = serde_json::json!({
            "metadata": {"name": "v", "namespace": "default"},
            "spec": {"domain": {"devices": {}}, "volumes": volumes},
            "status": status,
        });
        Vmi::from_json_or_yaml(&json.to_string()).unwrap()
    }

    fn prepare_all(vmi: &Vmi, paths: &PathRoots) -> Vec<Result<Option<VolumeFacts>, String>> {
        vmi.spec
            .volumes
            .iter()
            .flatten()
            .map(|v| prepare(vmi, v, paths, None).map_err(|e| e.to_string()))
            .collect()
    }

    #[test]
    fn filesystem_pvc_is_created_with_the_claim_capacity() {
        let dir = tempfile::tempdir().unwrap();
        let paths = roots(dir.path());
        let v = vmi(
            serde_json::json!([
                {"name": "data", "persistentVolumeClaim": {"claimName": "c1"}},
                {"name": "hot", "persistentVolumeClaim": {"claimName": "c2", "hotpluggable": true}},
                {"name": "other", "emptyDisk": {"capacity": "1Mi"}}
            ]),
            serde_json::json!({"volumeStatus": [{"name": "data", "target": "",
                "persistentVolumeClaimInfo": {"capacity": {"storage": "8Mi"}}}]}),
        );
        let image = dir.path().join("private/vmi-disks/data/disk.img");
        assert_eq!(
            prepare_all(&v, &paths),
            vec![
                Ok(Some(VolumeFacts {
                    virtual_size: Some(8 << 20),
                    direct_io: dio(dir.path()),
                    ..VolumeFacts::default()
                })),
                Ok(None),
                Ok(None),
            ]
        );
        assert_eq!(std::fs::metadata(&image).unwrap().len(), 8 << 20);
        // A second sync finds the image and keeps it.
        assert_eq!(
            prepare_all(&v, &paths)[0],
            Ok(Some(VolumeFacts {
                virtual_size: Some(8 << 20),
                direct_io: dio(dir.path()),
                ..VolumeFacts::default()
            }))
        );
    }

    #[test]
    fn a_pvc_hotplugged_by_status_alone_is_left_to_the_hotplug_facts() {
        // virt-handler's status says hotplug although the spec does not declare it: the
        // converter takes it as hotplug, so no boot disk.img may be made or demanded for it.
        let dir = tempfile::tempdir().unwrap();
        let v = vmi(
            serde_json::json!([{"name": "hp", "persistentVolumeClaim": {"claimName": "c"}}]),
            serde_json::json!({"volumeStatus": [{"name": "hp", "target": "sda",
                "phase": "MountedToPod", "hotplugVolume": {},
                "persistentVolumeClaimInfo": {"capacity": {"storage": "8Mi"}}}]}),
        );
        assert!(v.is_hotplug_volume(&v.spec.volumes.as_ref().unwrap()[0]));
        assert_eq!(prepare_all(&v, &roots(dir.path())), vec![Ok(None)]);
        assert!(!dir.path().join("private/vmi-disks/hp").exists());
    }

    #[test]
    fn a_missing_filesystem_pvc_without_capacity_names_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let v = vmi(
            serde_json::json!([{"name": "data", "dataVolume": {"name": "dv"}}]),
            serde_json::json!({}),
        );
        let err = prepare_all(&v, &roots(dir.path())).remove(0).unwrap_err();
        assert!(
            err.starts_with("invalid VMI: spec.volumes[0]: ")
                && err.ends_with("gives no PVC capacity"),
            "{err}"
        );
    }

    #[test]
    fn config_map_becomes_an_iso_and_host_disk_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let paths = roots(dir.path());
        let source = dir.path().join("private/config-map/cm");
        std::fs::create_dir_all(&source).unwrap();
        std::fs::write(source.join("key"), "value").unwrap();
        let v = vmi(
            serde_json::json!([
                {"name": "cm", "configMap": {"name": "app"}},
                {"name": "hd", "hostDisk": {"path": "/data/x.img", "type": "DiskOrCreate",
                                            "capacity": "2Mi"}}
            ]),
            serde_json::json!({}),
        );
        assert_eq!(
            prepare_all(&v, &paths),
            vec![
                Ok(Some(VolumeFacts {
                    direct_io: dio(dir.path()),
                    preallocated: true,
                    ..VolumeFacts::default()
                })),
                Ok(Some(VolumeFacts {
                    virtual_size: Some(2 << 20),
                    direct_io: dio(dir.path()),
                    ..VolumeFacts::default()
                })),
            ]
        );
        assert!(dir.path().join("private/config-map-disks/cm.iso").is_file());
        assert_eq!(
            std::fs::metadata(dir.path().join("private/vmi-disks/hd/x.img"))
                .unwrap()
                .len(),
            2 << 20
        );
    }
}
