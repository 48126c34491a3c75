//! `<disk>`: source, target, driver, backing store and block sizes (`<blockio>`).

use serde::Serialize;
use serde_with::skip_serializing_none;

use super::*;

/// `<disk>`.
/// Fields in the order of KubeVirt's `api.Disk` (v1.9.0 `virtwrap/api/schema.go`): the hook
/// input (`hooks::kubevirt_input`) prints them in that order, as Go's `encoding/xml` does.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disk {
    /// `disk`, `cdrom`, `lun`.
    #[serde(rename = "@device")]
    pub device: String,
    /// `file` / `block`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// `virtio-non-transitional` for virtio disks.
    #[serde(rename = "@model")]
    pub model: Option<String>,
    /// Source (absent: empty cdrom).
    pub source: Option<DiskSource>,
    /// Target.
    pub target: DiskTarget,
    /// Serial.
    pub serial: Option<String>,
    /// SCSI World Wide Name, 16 hex digits (a hook's; KubeVirt's `api.Disk` has none).
    pub wwn: Option<String>,
    /// Driver.
    pub driver: DiskDriver,
    /// I/O limits (a hook's; KubeVirt's `api.Disk` has none).
    pub iotune: Option<IoTune>,
    /// `<readonly/>`.
    pub readonly: Option<Empty>,
    /// `ua-<name>`.
    pub alias: NameAttr,
    /// Backing image (containerDisk, ephemeral).
    #[serde(rename = "backingStore")]
    pub backing_store: Option<BackingStore>,
    /// Boot order.
    pub boot: Option<BootOrder>,
    /// Address (PCI for virtio, drive for SCSI).
    pub address: Option<Address>,
    /// Block sizes.
    pub blockio: Option<BlockIo>,
    /// `<shareable/>`.
    pub shareable: Option<Empty>,
}

/// `<source file=".."/>` or `<source dev=".." name=".."/>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiskSource {
    /// Image file.
    #[serde(rename = "@file")]
    pub file: Option<String>,
    /// Block device.
    #[serde(rename = "@dev")]
    pub dev: Option<String>,
    /// Volume name (block PVCs).
    #[serde(rename = "@name")]
    pub name: Option<String>,
    /// `<dataStore>`: the raw external data file of a qcow2 source (KubeVirt's CBT overlays,
    /// `convertVolumeWithCBT`; libvirt's `virStorageSource.dataFileStore`).
    #[serde(rename = "dataStore")]
    pub data_store: Option<Box<DataStore>>,
}

/// `<dataStore type="file|block"><format type="raw"/><source file|dev/></dataStore>`
/// (KubeVirt `api.DataStore`, `virtwrap/api/schema.go`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DataStore {
    /// `file` / `block`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// `<format type="raw"/>`.
    pub format: TypeAttr,
    /// The data file.
    pub source: DiskSource,
}

/// `<target bus dev tray/>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiskTarget {
    /// `virtio`, `sata`, `scsi`, `usb`.
    #[serde(rename = "@bus")]
    pub bus: String,
    /// `vda`, `sdb`.
    #[serde(rename = "@dev")]
    pub dev: String,
    /// `open` / `closed` (cdrom).
    #[serde(rename = "@tray")]
    pub tray: Option<String>,
}

/// `<driver name="qemu" type cache io error_policy iothread discard queues/>`.
/// Fields in the order of KubeVirt's `api.DiskDriver` (v1.9.0 `virtwrap/api/schema.go`): the hook
/// input (`hooks::kubevirt_input`) prints them in that order, as Go's `encoding/xml` does.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiskDriver {
    /// Cache mode.
    #[serde(rename = "@cache")]
    pub cache: Option<String>,
    /// Error policy.
    #[serde(rename = "@error_policy")]
    pub error_policy: Option<String>,
    /// Read error policy, when it is not what `error_policy` implies (a hook's; KubeVirt's
    /// `api.DiskDriver` has none).
    #[serde(rename = "@rerror_policy")]
    pub rerror_policy: Option<String>,
    /// `native` / `threads`.
    #[serde(rename = "@io")]
    pub io: Option<String>,
    /// `qemu`.
    #[serde(rename = "@name")]
    pub name: String,
    /// `raw` / `qcow2`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// IOThread id.
    #[serde(rename = "@iothread")]
    pub iothread: Option<u32>,
    /// virtio queues (`blockMultiQueue`).
    #[serde(rename = "@queues")]
    pub queues: Option<u32>,
    /// `unmap`.
    #[serde(rename = "@discard")]
    pub discard: Option<String>,
}

/// `<backingStore type><format type/><source/></backingStore>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackingStore {
    /// `file` / `block`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// `<format type="raw|qcow2"/>`.
    pub format: TypeAttr,
    /// Source.
    pub source: DiskSource,
}

/// `<blockio logical_block_size physical_block_size discard_granularity/>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockIo {
    /// Bytes.
    #[serde(rename = "@logical_block_size")]
    pub logical_block_size: Option<u32>,
    /// Bytes.
    #[serde(rename = "@physical_block_size")]
    pub physical_block_size: Option<u32>,
    /// Bytes.
    #[serde(rename = "@discard_granularity")]
    pub discard_granularity: Option<u32>,
}

/// `<iotune>`: a disk's I/O limits in libvirt's element order (`virDomainDiskDefIotuneFormat`);
/// unset and zero limits are left out, as libvirt prints them.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct IoTune {
    /// `total_bytes_sec` (QEMU's, see `hooks::IOTUNE`).
    pub total_bytes_sec: Option<u64>,
    /// `read_bytes_sec` (QEMU's, see `hooks::IOTUNE`).
    pub read_bytes_sec: Option<u64>,
    /// `write_bytes_sec` (QEMU's, see `hooks::IOTUNE`).
    pub write_bytes_sec: Option<u64>,
    /// `total_iops_sec` (QEMU's, see `hooks::IOTUNE`).
    pub total_iops_sec: Option<u64>,
    /// `read_iops_sec` (QEMU's, see `hooks::IOTUNE`).
    pub read_iops_sec: Option<u64>,
    /// `write_iops_sec` (QEMU's, see `hooks::IOTUNE`).
    pub write_iops_sec: Option<u64>,
    /// `total_bytes_sec_max` (QEMU's, see `hooks::IOTUNE`).
    pub total_bytes_sec_max: Option<u64>,
    /// `read_bytes_sec_max` (QEMU's, see `hooks::IOTUNE`).
    pub read_bytes_sec_max: Option<u64>,
    /// `write_bytes_sec_max` (QEMU's, see `hooks::IOTUNE`).
    pub write_bytes_sec_max: Option<u64>,
    /// `total_iops_sec_max` (QEMU's, see `hooks::IOTUNE`).
    pub total_iops_sec_max: Option<u64>,
    /// `read_iops_sec_max` (QEMU's, see `hooks::IOTUNE`).
    pub read_iops_sec_max: Option<u64>,
    /// `write_iops_sec_max` (QEMU's, see `hooks::IOTUNE`).
    pub write_iops_sec_max: Option<u64>,
    /// `size_iops_sec` (QEMU's, see `hooks::IOTUNE`).
    pub size_iops_sec: Option<u64>,
    /// Throttle group.
    pub group_name: Option<String>,
    /// `total_bytes_sec_max_length` (QEMU's, see `hooks::IOTUNE`).
    pub total_bytes_sec_max_length: Option<u64>,
    /// `read_bytes_sec_max_length` (QEMU's, see `hooks::IOTUNE`).
    pub read_bytes_sec_max_length: Option<u64>,
    /// `write_bytes_sec_max_length` (QEMU's, see `hooks::IOTUNE`).
    pub write_bytes_sec_max_length: Option<u64>,
    /// `total_iops_sec_max_length` (QEMU's, see `hooks::IOTUNE`).
    pub total_iops_sec_max_length: Option<u64>,
    /// `read_iops_sec_max_length` (QEMU's, see `hooks::IOTUNE`).
    pub read_iops_sec_max_length: Option<u64>,
    /// `write_iops_sec_max_length` (QEMU's, see `hooks::IOTUNE`).
    pub write_iops_sec_max_length: Option<u64>,
}
