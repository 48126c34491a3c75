//! The devices of the `api.Domain` spec (`api.Devices` and the device types virt-handler reads:
//! interfaces, disks, channels, host devices), KubeVirt's Go field names as JSON keys
//! (`pkg/virt-launcher/virtwrap/api/schema.go`, v1.9.0).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `api.Devices`: the lists the launcher updates live, typed; the others in `rest`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Devices {
    /// Network interfaces.
    #[serde(rename = "Interfaces", default)]
    pub interfaces: Vec<Interface>,
    /// Disks and CD-ROMs.
    #[serde(rename = "Disks", default)]
    pub disks: Vec<Disk>,
    /// Host devices: GPUs, `hostDevices` and SR-IOV VFs (those QEMU started with, and those
    /// plugged by `HotplugHostDevices`).
    #[serde(rename = "HostDevices", default, skip_serializing_if = "Vec::is_empty")]
    pub host_devices: Vec<HostDevice>,
    /// Channels (the guest agent's `org.qemu.guest_agent.0`).
    #[serde(rename = "Channels", default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<Channel>,
    /// `Controllers`, `Video`, `Graphics`, `Ballooning`, `Inputs`, `Serials`, `Consoles`, `Rng`...
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl Devices {
    /// Sets the domain's memory device (`Memory`, an `api.MemoryDevice`: KubeVirt's domain has at
    /// most one, the virtio-mem device). True when it changed.
    pub fn set_memory_device(&mut self, device: Value) -> bool {
        if self.rest.get("Memory") == Some(&device) {
            return false;
        }
        self.rest.insert("Memory".into(), device);
        true
    }
}

/// `api.HostDevice`: a GPU (`gpu-<name>`), host device (`hostdevice-<name>`) or SR-IOV VF
/// (`sriov-<interface>`, which virt-handler reads for the interface's status and SR-IOV hotplug)
/// passed through with VFIO.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostDevice {
    /// `pci` or `mdev`.
    #[serde(rename = "Type", default)]
    pub device_type: String,
    /// `no` for PCI: the device plugin bound the function to vfio-pci already.
    #[serde(rename = "Managed", default, skip_serializing_if = "String::is_empty")]
    pub managed: String,
    /// `subsystem`.
    #[serde(rename = "Mode", default, skip_serializing_if = "String::is_empty")]
    pub mode: String,
    /// `vfio-pci` for a mediated device.
    #[serde(rename = "Model", default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// The host PCI address, or the mediated device's UUID.
    #[serde(rename = "Source", default)]
    pub source: HostDeviceSource,
    /// The alias without its `ua-` (`sriov-<interface>`; QEMU's id is `ua-sriov-<interface>`).
    #[serde(rename = "Alias", default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<Alias>,
    /// `BootOrder`, the guest `Address`, `Display`, `RamFB` and the other converted fields.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// KubeVirt's alias prefix of SR-IOV host devices (`deviceinfo.SRIOVAliasPrefix`).
pub const SRIOV_ALIAS_PREFIX: &str = "sriov-";

impl HostDevice {
    /// True for an SR-IOV VF (user alias `sriov-<interface>`).
    pub fn is_sriov(&self) -> bool {
        self.alias
            .as_ref()
            .is_some_and(|a| a.user_defined && a.name.starts_with(SRIOV_ALIAS_PREFIX))
    }
}

impl Devices {
    /// Drops the SR-IOV VFs from the host devices (a migration target's domain: KubeVirt's
    /// target converts none, `isMigrationTarget`, and virt-handler plugs the target pod's VFs
    /// with `HotplugHostDevices` once it sees them missing). True when one was dropped.
    pub fn drop_sriov_host_devices(&mut self) -> bool {
        let before = self.host_devices.len();
        self.host_devices.retain(|h| !h.is_sriov());
        self.host_devices.len() != before
    }
}

/// `api.HostDeviceSource`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostDeviceSource {
    /// The host PCI address or mediated device UUID.
    #[serde(rename = "Address", default, skip_serializing_if = "Option::is_none")]
    pub address: Option<PciAddress>,
}

/// `api.Address` of a host device: a PCI function (`0x0000`, `0x65`, `0x00`, `0x2`; libvirt's
/// live XML has no `type` on a host device's source address) or a mediated device (`UUID`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct PciAddress {
    #[serde(rename = "Type", default, skip_serializing_if = "String::is_empty")]
    pub address_type: String,
    #[serde(rename = "Domain", default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    #[serde(rename = "Bus", default, skip_serializing_if = "String::is_empty")]
    pub bus: String,
    #[serde(rename = "Slot", default, skip_serializing_if = "String::is_empty")]
    pub slot: String,
    #[serde(rename = "Function", default, skip_serializing_if = "String::is_empty")]
    pub function: String,
    #[serde(rename = "UUID", default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
}

impl PciAddress {
    /// A host device's source address from `DDDD:BB:SS.F` (lower-case hex, no `Type`, as in the
    /// converted spec); `None` for anything else.
    pub fn parse(bdf: &str) -> Option<PciAddress> {
        let (domain, rest) = bdf.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (slot, function) = rest.split_once('.')?;
        let hex = |s: &str, n: usize| {
            (s.len() == n && s.chars().all(|c| c.is_ascii_hexdigit()))
                .then(|| format!("0x{}", s.to_ascii_lowercase()))
        };
        Some(PciAddress {
            address_type: String::new(),
            domain: hex(domain, 4)?,
            bus: hex(bus, 2)?,
            slot: hex(slot, 2)?,
            function: hex(function, 1)?,
            uuid: String::new(),
        })
    }
}

/// `api.Channel`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Channel {
    /// `unix`.
    #[serde(rename = "Type", default)]
    pub channel_type: String,
    /// Name, type and connection state.
    #[serde(rename = "Target", default)]
    pub target: ChannelTarget,
    /// `Source` and the other fields.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `api.ChannelTarget`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChannelTarget {
    /// `org.qemu.guest_agent.0`.
    #[serde(rename = "Name", default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// `virtio`.
    #[serde(rename = "Type", default, skip_serializing_if = "String::is_empty")]
    pub target_type: String,
    /// `connected` once the guest opened its end, `disconnected` before (libvirt's live state).
    #[serde(rename = "State", default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Other fields.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `api.Interface`, the fields qlauncher fills.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Interface {
    /// libvirt interface type (`ethernet` for a tap KubeVirt created).
    #[serde(rename = "Type", default)]
    pub interface_type: String,
    /// The guest MAC address.
    #[serde(rename = "MAC", default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<Mac>,
    /// The device alias, `ua-<interface name>` for interfaces of the VMI.
    #[serde(rename = "Alias", default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<Alias>,
    /// `Model`, `Target`, `Rom`, `Address` and the other converted fields.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `api.MAC`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Mac {
    /// `aa:bb:cc:dd:ee:ff`.
    #[serde(rename = "MAC", default)]
    pub mac: String,
}

/// `api.Alias` as its custom JSON form: `{"Name": "...", "UserDefined": bool}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alias {
    /// Alias name; for user-defined aliases without the `ua-` prefix the XML (and QEMU's device
    /// id) carries: `default` for `ua-default` (KubeVirt `api/schema.go` `Alias.MarshalJSON`).
    #[serde(rename = "Name", default)]
    pub name: String,
    /// True for the `ua-` aliases derived from the VMI.
    #[serde(rename = "UserDefined", default)]
    pub user_defined: bool,
}

impl Alias {
    /// The user alias KubeVirt gives a VMI device (`api.NewUserDefinedAlias`): `ua-<name>` as a
    /// QEMU id, `{"Name": "<name>", "UserDefined": true}` in JSON.
    pub fn user_defined(name: &str) -> Alias {
        Alias {
            name: name.to_string(),
            user_defined: true,
        }
    }

    /// QEMU's device id for this alias: `ua-<name>` for a user-defined alias, else the name.
    pub fn qemu_id(&self) -> String {
        if self.user_defined {
            ["ua-", &self.name].concat()
        } else {
            self.name.clone()
        }
    }
}

/// `api.Disk`, the fields qlauncher fills.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Disk {
    /// `disk`, `cdrom` or `lun`.
    #[serde(rename = "Device", default)]
    pub device: String,
    /// Source kind: `file` or `block`.
    #[serde(rename = "Type", default)]
    pub disk_type: String,
    /// Where the data comes from.
    #[serde(rename = "Source", default)]
    pub source: DiskSource,
    /// Guest-visible bus and name.
    #[serde(rename = "Target", default)]
    pub target: DiskTarget,
    /// `ua-<volume/disk name>`.
    #[serde(rename = "Alias", default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<Alias>,
    /// `Driver`, `Model`, `Serial`, `BackingStore`, `ReadOnly` and the other converted fields.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `api.DiskSource`, file or block device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DiskSource {
    /// Image file path (for `Type: file`).
    #[serde(rename = "File", default, skip_serializing_if = "String::is_empty")]
    pub file: String,
    /// Block device path (for `Type: block`).
    #[serde(rename = "Dev", default, skip_serializing_if = "String::is_empty")]
    pub dev: String,
    /// Other fields.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `api.DiskTarget`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DiskTarget {
    /// `virtio`, `sata`, `scsi` or `usb`.
    #[serde(rename = "Bus", default, skip_serializing_if = "String::is_empty")]
    pub bus: String,
    /// Guest device name, e.g. `vda`, `sdb`.
    #[serde(rename = "Device", default, skip_serializing_if = "String::is_empty")]
    pub device: String,
    /// `Tray` and the other fields.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}
