//! Filling the storage inputs from a VMI: the one place this module reads `crate::vmi` types.
//!
//! Each constructor returns `None` when the volume is of another kind, so the orchestrator can
//! offer every `spec.volumes[]` entry to each of them.

use std::path::Path;

use crate::vmi::{Vmi, Volume};

use super::{
    paths, validate_volume_name, CloudInitKind, CloudInitSpec, ConfigVolumeKind, ConfigVolumeSpec,
    EmptyDiskSpec, HostDiskSpec, HostDiskType, Owner, StorageError, VmiIdentity,
};

/// KubeVirt `v1.ClusterInstancetypeAnnotation`; wins over the namespaced one.
const CLUSTER_INSTANCETYPE_ANNOTATION: &str = "kubevirt.io/cluster-instancetype-name";
/// KubeVirt `v1.InstancetypeAnnotation`.
const INSTANCETYPE_ANNOTATION: &str = "kubevirt.io/instancetype-name";
/// virt-launcher's default `pvc-tolerate-less-space-up-to-percent`.
pub const DEFAULT_TOLERANCE_PERCENT: u8 = 10;
/// virt-launcher's default `minimum-pvc-reserve-bytes` (1 MiB).
pub const DEFAULT_RESERVE_BYTES: u64 = 1 << 20;

fn capacity_error(volume: &str, value: &str) -> StorageError {
    StorageError::InvalidCapacity {
        volume: volume.to_string(),
        value: value.to_string(),
    }
}

impl CloudInitSpec {
    /// The cloud-init spec of `volume`, if it is `cloudInitNoCloud` or `cloudInitConfigDrive`.
    pub fn from_volume(volume: &Volume) -> Option<CloudInitSpec> {
        let (kind, source) = match (&volume.cloud_init_no_cloud, &volume.cloud_init_config_drive) {
            (Some(source), _) => (CloudInitKind::NoCloud, source),
            (None, Some(source)) => (CloudInitKind::ConfigDrive, source),
            (None, None) => return None,
        };
        Some(CloudInitSpec {
            volume: volume.name.clone(),
            kind: Some(kind),
            user_data: source.user_data.clone(),
            user_data_base64: source.user_data_base64.clone(),
            user_data_secret_ref: source.user_data_secret_ref.as_ref().map(|r| r.name.clone()),
            network_data: source.network_data.clone(),
            network_data_base64: source.network_data_base64.clone(),
            network_data_secret_ref: source
                .network_data_secret_ref
                .as_ref()
                .map(|r| r.name.clone()),
        })
    }

    /// The first cloud-init volume of the VMI: KubeVirt uses only that one.
    pub fn first_of(vmi: &Vmi) -> Option<CloudInitSpec> {
        vmi.spec
            .volumes
            .iter()
            .flatten()
            .find_map(CloudInitSpec::from_volume)
    }
}

impl VmiIdentity {
    /// Name, namespace, `spec.hostname`, firmware UUID and instancetype annotation of `vmi`.
    /// (Access-credential SSH keys are not in the VMI model yet: `ssh_key_secrets` stays empty.)
    pub fn from_vmi(vmi: &Vmi) -> VmiIdentity {
        let annotations = vmi.metadata.annotations.as_ref();
        let annotation = |key: &str| {
            annotations
                .and_then(|a| a.get(key))
                .filter(|v| !v.is_empty())
                .cloned()
        };
        VmiIdentity {
            name: vmi.metadata.name.clone().unwrap_or_default(),
            namespace: vmi.metadata.namespace.clone().unwrap_or_default(),
            hostname: vmi.spec.hostname.clone(),
            firmware_uuid: vmi
                .spec
                .domain
                .firmware
                .as_ref()
                .and_then(|f| f.uuid.clone()),
            instance_type: annotation(CLUSTER_INSTANCETYPE_ANNOTATION)
                .or_else(|| annotation(INSTANCETYPE_ANNOTATION)),
            ssh_key_secrets: Vec::new(),
            devices: None,
        }
    }
}

impl EmptyDiskSpec {
    /// The empty disk of `volume` (`emptyDisk.capacity`), placed under `dir` (normally
    /// [`paths::EMPTY_DISK_DIR`]) and owned by the qemu user.
    ///
    /// # Errors
    /// [`StorageError::InvalidVolumeName`]; [`StorageError::CapacityTooSmall`] when the capacity
    /// is missing; [`StorageError::InvalidCapacity`] when it is not a quantity.
    pub fn from_volume(volume: &Volume, dir: &Path) -> Option<Result<EmptyDiskSpec, StorageError>> {
        let source = volume.empty_disk.as_ref()?;
        Some((|| {
            validate_volume_name(&volume.name)?;
            let capacity = match &source.capacity {
                Some(q) => q
                    .to_bytes()
                    .map_err(|_| capacity_error(&volume.name, q.as_str()))?,
                None => 0,
            };
            Ok(EmptyDiskSpec::at_kubevirt_path(&volume.name, capacity, dir))
        })())
    }
}

impl HostDiskSpec {
    /// The hostDisk of `volume`, at the path the launcher sees it
    /// (`<vmi_disks_dir>/<volume>/<file name of hostDisk.path>`), with virt-launcher's default
    /// tolerance and reserve, owned by the qemu user.
    ///
    /// # Errors
    /// [`StorageError::InvalidVolumeName`], [`StorageError::InvalidCapacity`], or
    /// [`StorageError::CreateHostDisk`] (`InvalidInput`) for an unknown `type` or a path without a
    /// file name.
    pub fn from_volume(
        volume: &Volume,
        vmi_disks_dir: &Path,
    ) -> Option<Result<HostDiskSpec, StorageError>> {
        let source = volume.host_disk.as_ref()?;
        Some((|| {
            validate_volume_name(&volume.name)?;
            let invalid = |reason: String| StorageError::CreateHostDisk {
                volume: volume.name.clone(),
                path: source.path.clone().into(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, reason),
            };
            let path = paths::host_disk_path(vmi_disks_dir, &volume.name, Path::new(&source.path))
                .ok_or_else(|| invalid("hostDisk.path has no file name".into()))?;
            let kind = match source.r#type.as_str() {
                "Disk" => HostDiskType::Disk,
                "DiskOrCreate" => {
                    let capacity = match &source.capacity {
                        Some(q) => q
                            .to_bytes()
                            .map_err(|_| capacity_error(&volume.name, q.as_str()))?,
                        None => 0,
                    };
                    HostDiskType::DiskOrCreate { capacity }
                }
                other => return Err(invalid(format!("hostDisk.type {other:?} is not supported"))),
            };
            Ok(HostDiskSpec {
                volume: volume.name.clone(),
                path,
                kind,
                tolerance_percent: DEFAULT_TOLERANCE_PERCENT,
                reserve_bytes: DEFAULT_RESERVE_BYTES,
                owner: Some(Owner::QEMU),
            })
        })())
    }
}

impl ConfigVolumeSpec {
    /// The config ISO of `volume` if it is a ConfigMap, Secret, DownwardAPI, ServiceAccount or
    /// Sysprep (with a ConfigMap or Secret) volume, at KubeVirt's paths under `private_dir`
    /// (normally [`paths::PRIVATE_DIR`]).
    ///
    /// # Errors
    /// [`StorageError::InvalidVolumeName`].
    pub fn from_volume(
        volume: &Volume,
        private_dir: &Path,
    ) -> Option<Result<ConfigVolumeSpec, StorageError>> {
        let (kind, label) = if let Some(cm) = &volume.config_map {
            (ConfigVolumeKind::ConfigMap, cm.volume_label.as_deref())
        } else if let Some(secret) = &volume.secret {
            (ConfigVolumeKind::Secret, secret.volume_label.as_deref())
        } else if let Some(downward) = &volume.downward_api {
            (
                ConfigVolumeKind::DownwardApi,
                downward.volume_label.as_deref(),
            )
        } else if volume.service_account.is_some() {
            (ConfigVolumeKind::ServiceAccount, None)
        } else if let Some(sysprep) = &volume.sysprep {
            if sysprep.config_map.is_none() && sysprep.secret.is_none() {
                return None;
            }
            (ConfigVolumeKind::Sysprep, None)
        } else {
            return None;
        };
        Some(ConfigVolumeSpec::at_kubevirt_paths(
            &volume.name,
            kind,
            label,
            private_dir,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn vmi() -> Vmi {
        Vmi::from_json_or_yaml(
            r##"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: testvmi
  namespace: default
  annotations:
    kubevirt.io/instancetype-name: u1.small
spec:
  domain:
    firmware:
      uuid: 5d307ca9-b3ef-428c-8861-06e72d69f223
    devices: {}
  volumes:
  - name: containerdisk
    containerDisk:
      image: quay.io/containerdisks/fedora
  - name: cloudinitdisk
    cloudInitNoCloud:
      userData: "#cloud-config\n"
      networkDataSecretRef:
        name: netdata
  - name: other-cloudinit
    cloudInitConfigDrive:
      userData: ignored
  - name: scratch
    emptyDisk:
      capacity: 2Gi
  - name: host
    hostDisk:
      path: /data/disk.img
      type: DiskOrCreate
      capacity: 1Gi
  - name: app-config
    configMap:
      name: app
      volumeLabel: APPCFG
  - name: sa
    serviceAccount:
      serviceAccountName: default
"##,
        )
        .unwrap()
    }

    #[test]
    fn specs_are_filled_from_the_vmi() {
        let vmi = vmi();
        let volumes = vmi.spec.volumes.clone().unwrap();
        assert_eq!(
            CloudInitSpec::first_of(&vmi),
            Some(CloudInitSpec {
                volume: "cloudinitdisk".into(),
                kind: Some(CloudInitKind::NoCloud),
                user_data: Some("#cloud-config\n".into()),
                network_data_secret_ref: Some("netdata".into()),
                ..CloudInitSpec::default()
            })
        );
        assert_eq!(
            VmiIdentity::from_vmi(&vmi),
            VmiIdentity {
                name: "testvmi".into(),
                namespace: "default".into(),
                hostname: None,
                firmware_uuid: Some("5d307ca9-b3ef-428c-8861-06e72d69f223".into()),
                instance_type: Some("u1.small".into()),
                ssh_key_secrets: vec![],
                devices: None,
            }
        );
        let dir = Path::new("/var/run/libvirt/empty-disks");
        let empty: Vec<_> = volumes
            .iter()
            .filter_map(|v| EmptyDiskSpec::from_volume(v, dir))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            empty,
            vec![EmptyDiskSpec::at_kubevirt_path("scratch", 2 << 30, dir)]
        );
        let hosts: Vec<_> = volumes
            .iter()
            .filter_map(|v| HostDiskSpec::from_volume(v, Path::new(paths::VMI_DISKS_DIR)))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            hosts,
            vec![HostDiskSpec {
                volume: "host".into(),
                path: PathBuf::from("/var/run/kubevirt-private/vmi-disks/host/disk.img"),
                kind: HostDiskType::DiskOrCreate { capacity: 1 << 30 },
                tolerance_percent: 10,
                reserve_bytes: 1 << 20,
                owner: Some(Owner::QEMU),
            }]
        );
        let configs: Vec<_> = volumes
            .iter()
            .filter_map(|v| ConfigVolumeSpec::from_volume(v, Path::new(paths::PRIVATE_DIR)))
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            configs
                .iter()
                .map(|c| (c.kind, c.label.as_str(), c.iso.clone()))
                .collect::<Vec<_>>(),
            vec![
                (
                    ConfigVolumeKind::ConfigMap,
                    "APPCFG",
                    PathBuf::from("/var/run/kubevirt-private/config-map-disks/app-config.iso")
                ),
                (
                    ConfigVolumeKind::ServiceAccount,
                    "cfgdata",
                    PathBuf::from(
                        "/var/run/kubevirt-private/service-account-disk/service-account.iso"
                    )
                ),
            ]
        );
    }
}
