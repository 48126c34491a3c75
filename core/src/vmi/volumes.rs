//! `spec.volumes`: the sources behind disks and filesystems.
//!
//! Field names and JSON spelling follow KubeVirt v1.9.0 `staging/src/kubevirt.io/api/core/v1/schema.go`.

use serde::{Deserialize, Serialize};

use super::domain::api_marker;
use super::meta::LocalObjectReference;
use super::Quantity;

/// One `spec.volumes[]` entry (KubeVirt `Volume` with the inlined `VolumeSource`).
///
/// Exactly one source must be set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Volume {
    /// Volume name, a DNS label; the disk or filesystem of the same name uses it.
    pub name: String,
    /// A disk image file on the node (filesystem PVCs are rewritten to this by virt-handler).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_disk: Option<HostDisk>,
    /// A PVC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    /// NoCloud cloud-init data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cloud_init_no_cloud: Option<CloudInitSource>,
    /// ConfigDrive cloud-init data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cloud_init_config_drive: Option<CloudInitSource>,
    /// Windows sysprep answer file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sysprep: Option<SysprepSource>,
    /// A disk image inside a container image (read-only base with a writable overlay).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_disk: Option<ContainerDiskSource>,
    /// A PVC used as read-only base with a writable overlay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<EphemeralVolumeSource>,
    /// A sparse scratch disk created at start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub empty_disk: Option<EmptyDiskSource>,
    /// A CDI DataVolume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_volume: Option<DataVolumeSource>,
    /// A ConfigMap exposed as an ISO/virtiofs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapVolumeSource>,
    /// A Secret exposed as an ISO/virtiofs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretVolumeSource>,
    /// Downward API files exposed as an ISO/virtiofs.
    #[serde(rename = "downwardAPI")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub downward_api: Option<DownwardApiVolumeSource>,
    /// The service account token exposed as an ISO/virtiofs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_account: Option<ServiceAccountVolumeSource>,
    /// Downward metrics disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub downward_metrics: Option<DownwardMetricsVolumeSource>,
    /// A PVC receiving a memory dump.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_dump: Option<PersistentVolumeClaimVolumeSource>,
    /// A path in the virt-launcher container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_path: Option<ContainerPathVolumeSource>,
}

impl Volume {
    /// The JSON names of the sources that are set, e.g. `["containerDisk"]`.
    pub fn source_kinds(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        let mut add = |set: bool, name: &'static str| {
            if set {
                v.push(name);
            }
        };
        add(self.host_disk.is_some(), "hostDisk");
        add(
            self.persistent_volume_claim.is_some(),
            "persistentVolumeClaim",
        );
        add(self.cloud_init_no_cloud.is_some(), "cloudInitNoCloud");
        add(
            self.cloud_init_config_drive.is_some(),
            "cloudInitConfigDrive",
        );
        add(self.sysprep.is_some(), "sysprep");
        add(self.container_disk.is_some(), "containerDisk");
        add(self.ephemeral.is_some(), "ephemeral");
        add(self.empty_disk.is_some(), "emptyDisk");
        add(self.data_volume.is_some(), "dataVolume");
        add(self.config_map.is_some(), "configMap");
        add(self.secret.is_some(), "secret");
        add(self.downward_api.is_some(), "downwardAPI");
        add(self.service_account.is_some(), "serviceAccount");
        add(self.downward_metrics.is_some(), "downwardMetrics");
        add(self.memory_dump.is_some(), "memoryDump");
        add(self.container_path.is_some(), "containerPath");
        v
    }
}

/// `volume.hostDisk`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HostDisk {
    /// Path of the image file.
    pub path: String,
    /// `Disk` (must exist) or `DiskOrCreate`.
    #[serde(rename = "type")]
    pub r#type: String,
    /// Size for `DiskOrCreate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Quantity>,
    /// Shared between VMs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared: Option<bool>,
}

/// `volume.persistentVolumeClaim` and `volume.memoryDump`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PersistentVolumeClaimVolumeSource {
    /// PVC name.
    pub claim_name: String,
    /// Mount read-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Hotplugged volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hotpluggable: Option<bool>,
}

/// `volume.cloudInitNoCloud` and `volume.cloudInitConfigDrive` (same fields).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CloudInitSource {
    /// Secret holding `userdata` (JSON `secretRef`).
    #[serde(rename = "secretRef")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_data_secret_ref: Option<LocalObjectReference>,
    /// User data, base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_data_base64: Option<String>,
    /// User data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    /// Secret holding `networkdata`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_data_secret_ref: Option<LocalObjectReference>,
    /// Network data, base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_data_base64: Option<String>,
    /// Network data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_data: Option<String>,
}

/// `volume.sysprep`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SysprepSource {
    /// Secret holding the answer file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<LocalObjectReference>,
    /// ConfigMap holding the answer file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_map: Option<LocalObjectReference>,
}

/// `volume.containerDisk`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerDiskSource {
    /// Image reference.
    pub image: String,
    /// Pull secret name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_secret: Option<String>,
    /// Path of the disk image inside the container (default: the single file in `/disk`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `Always`, `Never` or `IfNotPresent`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
}

/// `volume.ephemeral`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EphemeralVolumeSource {
    /// The PVC used as base.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
}

/// `volume.emptyDisk`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EmptyDiskSource {
    /// Size of the disk (required).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Quantity>,
}

/// `volume.dataVolume`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DataVolumeSource {
    /// DataVolume name.
    pub name: String,
    /// Hotplugged volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hotpluggable: Option<bool>,
}

/// `volume.configMap`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConfigMapVolumeSource {
    /// ConfigMap name.
    pub name: String,
    /// Tolerate a missing ConfigMap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// ISO volume label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_label: Option<String>,
}

/// `volume.secret`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SecretVolumeSource {
    /// Secret name.
    pub secret_name: String,
    /// Tolerate a missing Secret.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// ISO volume label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_label: Option<String>,
}

/// `volume.downwardAPI`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DownwardApiVolumeSource {
    /// Files to project.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<DownwardApiVolumeFile>>,
    /// ISO volume label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_label: Option<String>,
}

/// One downward API file (k8s `DownwardAPIVolumeFile`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DownwardApiVolumeFile {
    /// Relative file path.
    pub path: String,
    /// Object field selector.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field_ref: Option<ObjectFieldSelector>,
    /// Container resource selector.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_field_ref: Option<ResourceFieldSelector>,
    /// File mode bits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<i32>,
}

/// k8s `ObjectFieldSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectFieldSelector {
    /// API version of the field path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Field path, e.g. `metadata.labels`.
    pub field_path: String,
}

/// k8s `ResourceFieldSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceFieldSelector {
    /// Container name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,
    /// Resource, e.g. `limits.cpu`.
    pub resource: String,
    /// Output divisor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub divisor: Option<super::Quantity>,
}

/// `volume.serviceAccount`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceAccountVolumeSource {
    /// Service account name.
    pub service_account_name: String,
}

api_marker!(
    /// `volume.downwardMetrics: {}`.
    DownwardMetricsVolumeSource
);

/// `volume.containerPath`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerPathVolumeSource {
    /// Path inside the launcher container.
    pub path: String,
    /// Read-only (unset = true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
}
