//! `spec.domain.devices`: disks, interfaces, inputs, watchdog, rng, TPM, sound, video, GPUs,
//! host devices, filesystems and the autoattach switches.
//!
//! Field names and JSON spelling follow KubeVirt v1.9.0 `staging/src/kubevirt.io/api/core/v1/schema.go`.

use serde::{Deserialize, Serialize};

use super::domain::{api_marker, FeatureState};

/// `domain.devices` (KubeVirt `Devices`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Devices {
    /// Use virtio-transitional devices (for old guests).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_virtio_transitional: Option<bool>,
    /// Do not add PCIe root ports for hotplug.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_hotplug: Option<bool>,
    /// Disks, cdroms and LUNs, each backed by the volume of the same name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disks: Option<Vec<Disk>>,
    /// Watchdog device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<Watchdog>,
    /// Network interfaces, each attached to the network of the same name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interfaces: Option<Vec<Interface>>,
    /// Input devices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Vec<Input>>,
    /// Add the default pod interface when no interface is given (unset = true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_pod_interface: Option<bool>,
    /// Add a VGA/VNC display (unset = true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_graphics_device: Option<bool>,
    /// Add a serial console (unset = true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_serial_console: Option<bool>,
    /// Log the serial console to the pod log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_serial_console: Option<bool>,
    /// Add a virtio memory balloon (unset = true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_mem_balloon: Option<bool>,
    /// Add a USB tablet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_input_device: Option<bool>,
    /// Add a vsock device.
    #[serde(rename = "autoattachVSOCK")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_vsock: Option<bool>,
    /// Virtio RNG device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rng: Option<Rng>,
    /// One virtio-blk queue per vCPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_multi_queue: Option<bool>,
    /// One virtio-net queue per vCPU.
    #[serde(rename = "networkInterfaceMultiqueue")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_interface_multi_queue: Option<bool>,
    /// GPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Vec<Gpu>>,
    /// Downward metrics virtio-serial device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub downward_metrics: Option<DownwardMetricsDevice>,
    /// Panic devices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub panic_devices: Option<Vec<PanicDevice>>,
    /// virtiofs filesystems, each backed by the volume of the same name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filesystems: Option<Vec<Filesystem>>,
    /// Host devices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_devices: Option<Vec<HostDevice>>,
    /// USB redirection from the client.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_passthrough: Option<ClientPassthroughDevices>,
    /// Sound card.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sound: Option<SoundDevice>,
    /// vTPM.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpm: Option<TpmDevice>,
    /// Video device type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub video: Option<VideoDevice>,
}

/// One `devices.disks[]` entry (KubeVirt `Disk` with the inlined `DiskDevice`).
///
/// Exactly one of `disk`, `lun` or `cdrom` may be set; none means `disk: {}` after defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Disk {
    /// Disk name; the volume of the same name backs it.
    pub name: String,
    /// A plain disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskTarget>,
    /// A SCSI LUN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lun: Option<LunTarget>,
    /// A CD-ROM.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cdrom: Option<CdromTarget>,
    /// Boot order, starting at 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_order: Option<u32>,
    /// Disk serial number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Give the disk its own IOThread.
    #[serde(rename = "dedicatedIOThread")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dedicated_io_thread: Option<bool>,
    /// Cache mode: `none`, `writethrough` or `writeback`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// IO mode: `native` or `threads`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<String>,
    /// Device role tag exposed through the metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Logical/physical block sizes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<BlockSize>,
    /// Shareable between VMs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shareable: Option<bool>,
    /// `stop`, `ignore`, `report` or `enospace`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_policy: Option<String>,
    /// Changed block tracking.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed_block_tracking: Option<bool>,
}

/// `disk.disk`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DiskTarget {
    /// `virtio`, `sata`, `scsi` or `usb` (defaulted to `sata` on amd64).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    /// Read-only (JSON `readonly`).
    #[serde(rename = "readonly")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Guest PCI address `0000:00:05.0` (virtio only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
}

/// `disk.lun`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LunTarget {
    /// Bus (`scsi` normally).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    /// Read-only (JSON `readonly`).
    #[serde(rename = "readonly")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// SCSI persistent reservation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation: Option<bool>,
}

/// `disk.cdrom`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CdromTarget {
    /// Bus (`sata` or `scsi`; virtio is rejected).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    /// Read-only (JSON `readonly`, defaulted to true).
    #[serde(rename = "readonly")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// `open` or `closed` (defaulted to `closed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tray: Option<String>,
}

/// `disk.blockSize`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BlockSize {
    /// Explicit sizes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub custom: Option<CustomBlockSize>,
    /// Take the sizes from the backing volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub match_volume: Option<FeatureState>,
}

/// `blockSize.custom`, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CustomBlockSize {
    /// Logical block size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logical: Option<u32>,
    /// Physical block size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub physical: Option<u32>,
    /// Discard granularity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discard_granularity: Option<u32>,
}

/// One `devices.interfaces[]` entry (KubeVirt `Interface` with the inlined binding method).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Interface {
    /// Interface name; the network of the same name backs it.
    pub name: String,
    /// NIC model: `virtio` (default), `e1000`, `e1000e`, `igb`, `ne2k_pci`, `pcnet`, `rtl8139`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Bridge binding (the guest takes the pod IP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bridge: Option<InterfaceBridge>,
    /// Deprecated slirp binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slirp: Option<InterfaceSlirp>,
    /// Masquerade binding (NAT behind the pod IP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub masquerade: Option<InterfaceMasquerade>,
    /// SR-IOV binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sriov: Option<InterfaceSriov>,
    /// Deprecated macvtap binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub macvtap: Option<InterfaceMacvtap>,
    /// Deprecated passt binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passt: Option<InterfacePasst>,
    /// passt binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passt_binding: Option<InterfacePasstBinding>,
    /// A network binding plugin by name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding: Option<PluginBinding>,
    /// Ports forwarded to the guest (masquerade); all ports when empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<Port>>,
    /// Port ranges forwarded to the guest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_ranges: Option<Vec<PortRange>>,
    /// MAC address `aa:bb:cc:dd:ee:ff` (or with `-`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
    /// Boot order, starting at 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_order: Option<u32>,
    /// Guest PCI address `0000:00:05.0`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    /// Extra DHCP options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dhcp_options: Option<DhcpOptions>,
    /// Device role tag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// ACPI index of the NIC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acpi_index: Option<i64>,
    /// `up`, `down` or `absent`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

api_marker!(
    /// `interface.bridge: {}`.
    InterfaceBridge
);
api_marker!(
    /// `interface.slirp: {}` (deprecated).
    InterfaceSlirp
);
api_marker!(
    /// `interface.masquerade: {}`.
    InterfaceMasquerade
);
api_marker!(
    /// `interface.sriov: {}`.
    InterfaceSriov
);
api_marker!(
    /// `interface.macvtap: {}` (deprecated).
    InterfaceMacvtap
);
api_marker!(
    /// `interface.passt: {}` (deprecated).
    InterfacePasst
);
api_marker!(
    /// `interface.passtBinding: {}`.
    InterfacePasstBinding
);

/// `interface.binding`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PluginBinding {
    /// Plugin name as registered in the KubeVirt CR.
    pub name: String,
}

/// One `interface.ports[]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Port {
    /// Optional name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `TCP` (default) or `UDP`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Port number, 1..=65535.
    pub port: i64,
}

/// One `interface.portRanges[]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PortRange {
    /// `TCP` or `UDP`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// First port.
    pub start: i64,
    /// Last port.
    pub end: i64,
}

/// `interface.dhcpOptions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DhcpOptions {
    /// DHCP option 67.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_file_name: Option<String>,
    /// DHCP option 66.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tftp_server_name: Option<String>,
    /// DHCP option 42.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ntp_servers: Option<Vec<String>>,
    /// Private options 224..=254.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_options: Option<Vec<DhcpPrivateOption>>,
}

/// One `dhcpOptions.privateOptions[]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DhcpPrivateOption {
    /// Option number, 224..=254.
    pub option: i64,
    /// Option value.
    pub value: String,
}

/// One `devices.inputs[]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Input {
    /// `usb` (default) or `virtio`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    /// `tablet` or `keyboard`.
    #[serde(rename = "type")]
    pub r#type: String,
    /// Device name.
    pub name: String,
}

/// `devices.watchdog` (KubeVirt `Watchdog` with the inlined `WatchdogDevice`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Watchdog {
    /// Device name.
    pub name: String,
    /// Intel 6300ESB (amd64).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub i6300esb: Option<WatchdogAction>,
    /// DIAG288 (s390x).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diag288: Option<WatchdogAction>,
}

/// A watchdog model's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WatchdogAction {
    /// `poweroff`, `reset` (default) or `shutdown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

api_marker!(
    /// `devices.rng: {}` (virtio-rng fed from /dev/urandom).
    Rng
);
api_marker!(
    /// `devices.downwardMetrics: {}`.
    DownwardMetricsDevice
);
api_marker!(
    /// `devices.clientPassthrough: {}`.
    ClientPassthroughDevices
);
api_marker!(
    /// `filesystem.virtiofs: {}`.
    FilesystemVirtiofs
);

/// One `devices.gpus[]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Gpu {
    /// Name.
    pub name: String,
    /// Device plugin resource name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    /// DRA claim name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// DRA request name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_name: Option<String>,
    /// vGPU options.
    #[serde(rename = "virtualGPUOptions")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub virtual_gpu_options: Option<VgpuOptions>,
    /// Device role tag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `gpu.virtualGPUOptions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VgpuOptions {
    /// Display options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display: Option<VgpuDisplayOptions>,
}

/// `virtualGPUOptions.display`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VgpuDisplayOptions {
    /// Display on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// ramfb.
    #[serde(rename = "ramFB")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ram_fb: Option<FeatureState>,
}

/// One `devices.hostDevices[]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HostDevice {
    /// Name.
    pub name: String,
    /// Device plugin resource name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    /// DRA claim name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// DRA request name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_name: Option<String>,
    /// Device role tag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// One `devices.panicDevices[]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PanicDevice {
    /// `hyperv`, `isa` or `pvpanic`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// One `devices.filesystems[]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Filesystem {
    /// Name; the volume of the same name backs it.
    pub name: String,
    /// virtiofs (the only type).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub virtiofs: Option<FilesystemVirtiofs>,
}

/// `devices.sound`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SoundDevice {
    /// Name.
    pub name: String,
    /// `ich9` (default) or `ac97`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// `devices.tpm`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TpmDevice {
    /// Unset = true.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Keep the TPM state across restarts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent: Option<bool>,
}

/// `devices.video`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VideoDevice {
    /// `vga`, `cirrus`, `virtio`, `ramfb`, `bochs`.
    #[serde(rename = "type")]
    pub r#type: Option<String>,
}

impl Disk {
    /// The JSON name of the target that is set: `"disk"`, `"lun"` or `"cdrom"`; `None` when none
    /// is (the defaults then make it `disk`). With several set, the first in that order.
    pub fn target_kind(&self) -> Option<&'static str> {
        if self.disk.is_some() {
            Some("disk")
        } else if self.lun.is_some() {
            Some("lun")
        } else if self.cdrom.is_some() {
            Some("cdrom")
        } else {
            None
        }
    }

    /// The bus of the target that is set (see [`Disk::target_kind`]), if any.
    pub fn bus(&self) -> Option<&str> {
        match self.target_kind()? {
            "disk" => self.disk.as_ref()?.bus.as_deref(),
            "lun" => self.lun.as_ref()?.bus.as_deref(),
            _ => self.cdrom.as_ref()?.bus.as_deref(),
        }
    }

    /// Whether the guest sees the device read-only (`readonly` of the target; a defaulted cdrom is).
    pub fn read_only(&self) -> bool {
        match self.target_kind() {
            Some("disk") => self.disk.as_ref().and_then(|t| t.read_only),
            Some("lun") => self.lun.as_ref().and_then(|t| t.read_only),
            Some(_) => self.cdrom.as_ref().and_then(|t| t.read_only),
            None => None,
        }
        .unwrap_or(false)
    }
}

impl Interface {
    /// The JSON names of the binding methods that are set, e.g. `["masquerade"]`
    /// (`binding` for a network binding plugin).
    pub fn bindings(&self) -> Vec<&'static str> {
        [
            ("bridge", self.bridge.is_some()),
            ("slirp", self.slirp.is_some()),
            ("masquerade", self.masquerade.is_some()),
            ("sriov", self.sriov.is_some()),
            ("macvtap", self.macvtap.is_some()),
            ("passt", self.passt.is_some()),
            ("passtBinding", self.passt_binding.is_some()),
            ("binding", self.binding.is_some()),
        ]
        .into_iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| name)
        .collect()
    }
}
