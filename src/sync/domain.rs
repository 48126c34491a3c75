//! The domain as virt-handler sees it: the subset of KubeVirt's `api.Domain`
//! (`pkg/virt-launcher/virtwrap/api/schema.go`, v1.9.0) that qlauncher fills, with the same JSON
//! field names.
//!
//! virt-handler decodes this JSON from `GetDomain` answers and from every `HandleDomainEvent`
//! notification, and derives the VMI phase, interfaces, guest OS info and grace-period handling from
//! it. KubeVirt's Go structs carry no `json` tags, so most keys are the Go field names (`Spec`,
//! `Status`, `Interfaces`, `Mac`), except the embedded Kubernetes `ObjectMeta` (`name`, `uid`,
//! `deletionTimestamp`). Fields qlauncher never fills are left out; Go's decoder ignores the
//! absence.
//!
//! The spec is the converter's: [`DomainSpec::from_converted`] takes the `api.DomainSpec` JSON that
//! `compat/libvirt-xml` renders from the same model it writes as libvirt XML (memory, OS, CPU,
//! features, sysinfo, clock, every device); the fields the launcher updates live (interfaces,
//! disks, channels, metadata) are typed, the rest is kept as the renderer wrote it (`rest`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::time::SystemTime;

/// KubeVirt's `api.Domain`: metadata, the domain spec and the live status.
///
/// JSON shape: `{"ObjectMeta": {...}, "Spec": {...}, "Status": {...}}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApiDomain {
    /// Kubernetes object metadata: the VMI's name, namespace and UID, and the deletion timestamp
    /// that marks the final notification.
    #[serde(rename = "ObjectMeta", default)]
    pub object_meta: ObjectMeta,
    /// What the domain is made of (libvirt's domain XML in KubeVirt, the launch plan here).
    #[serde(rename = "Spec", default)]
    pub spec: ApiDomainSpec,
    /// Run state, its reason, and guest-agent data.
    #[serde(rename = "Status", default)]
    pub status: DomainStatus,
}

impl ApiDomain {
    /// A domain for the VMI `namespace/name`: metadata filled, spec name `<namespace>_<name>` (the
    /// libvirt domain name KubeVirt uses, `util.DomainFromNamespaceName`), metadata UID `vmi_uid`,
    /// status `NoState` with no reason.
    pub fn for_vmi(namespace: &str, name: &str, vmi_uid: &str) -> ApiDomain {
        ApiDomain {
            object_meta: ObjectMeta {
                name: name.to_owned(),
                namespace: namespace.to_owned(),
                uid: vmi_uid.to_owned(),
                ..ObjectMeta::default()
            },
            spec: ApiDomainSpec {
                name: format!("{namespace}_{name}"),
                metadata: Metadata {
                    kubevirt: KubeVirtMetadata {
                        uid: vmi_uid.to_owned(),
                        grace_period: None,
                        memory_dump: None,
                        migration: None,
                    },
                },
                ..ApiDomainSpec::default()
            },
            status: DomainStatus::default(),
        }
    }

    /// Sets the run state and its reason (KubeVirt's `Domain.SetState`).
    pub fn set_state(&mut self, state: LifeCycle, reason: StateChangeReason) {
        self.status.status = state;
        self.status.reason = reason;
    }

    /// Turns this domain into KubeVirt's "final delete notification": state `NoState`, reason
    /// `NonExistent`, and `ObjectMeta.deletionTimestamp` set to `now` (RFC 3339, seconds, UTC).
    ///
    /// virt-handler treats a domain with a deletion timestamp as gone
    /// (`pkg/virt-handler/controller.go`, `getDomainFromCache`) and virt-launcher waits for this
    /// event before exiting (`cmd/virt-launcher/virt-launcher.go`, `waitForFinalNotify`).
    pub fn mark_deleted(&mut self, now: SystemTime) {
        self.set_state(LifeCycle::NoState, StateChangeReason::NonExistent);
        self.object_meta.deletion_timestamp = Some(kubernetes_time(now));
    }
}

/// Formats a time the way Kubernetes' `metav1.Time` does in JSON: RFC 3339 in UTC with whole
/// seconds, e.g. `2026-11-30T00:30:22Z`.
pub fn kubernetes_time(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

/// The part of Kubernetes' `metav1.ObjectMeta` a domain carries.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// The VMI's name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The VMI's namespace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The VMI's UID.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// Always `null` on the wire, as for KubeVirt's domains (kept for the identical shape).
    #[serde(rename = "creationTimestamp", default)]
    pub creation_timestamp: Option<String>,
    /// Set (RFC 3339, UTC, seconds) only on the final notification after the domain is gone.
    #[serde(
        rename = "deletionTimestamp",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub deletion_timestamp: Option<String>,
}

/// The part of KubeVirt's `api.DomainSpec` qlauncher fills. Keys are the Go field names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApiDomainSpec {
    /// Domain type: `kvm`, or `qemu` under software emulation.
    #[serde(rename = "Type", default)]
    pub domain_type: String,
    /// Domain name, `<namespace>_<vmi name>`.
    #[serde(rename = "Name", default)]
    pub name: String,
    /// Firmware UUID (also QEMU's `-uuid`), lower-case hyphenated.
    #[serde(rename = "UUID", default)]
    pub uuid: String,
    /// Devices virt-handler looks at.
    #[serde(rename = "Devices", default)]
    pub devices: Devices,
    /// KubeVirt's own metadata block.
    #[serde(rename = "Metadata", default)]
    pub metadata: Metadata,
    /// The other fields of the converted spec (`Memory`, `CurrentMemory`, `OS`, `CPU`, `VCPU`,
    /// `Features`, `SysInfo`, `Clock`, ...), Go field names as keys.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl ApiDomainSpec {
    /// Replaces this spec with `converted` (an `api.DomainSpec` JSON object, from
    /// `qlauncher_libvirt_xml::to_api_spec`), keeping the name, the metadata and what the launcher
    /// tracks live: the interfaces' MACs when the converted ones have none, and the channels'
    /// connection state.
    ///
    /// # Errors
    /// The decoding error when `converted` does not have the shape of `api.DomainSpec` (nothing
    /// is changed then).
    pub fn set_converted(
        &mut self,
        converted: Map<String, Value>,
    ) -> Result<(), serde_json::Error> {
        let mut next: ApiDomainSpec = serde_json::from_value(Value::Object(converted))?;
        next.name = std::mem::take(&mut self.name);
        next.metadata = std::mem::take(&mut self.metadata);
        if next.uuid.is_empty() {
            next.uuid = std::mem::take(&mut self.uuid);
        }
        for iface in &mut next.devices.interfaces {
            if iface.mac.is_none() {
                iface.mac = self
                    .devices
                    .interfaces
                    .iter()
                    .find(|old| old.alias.is_some() && old.alias == iface.alias)
                    .and_then(|old| old.mac.clone());
            }
        }
        for channel in &mut next.devices.channels {
            if let Some(old) = self
                .devices
                .channels
                .iter()
                .find(|old| old.target.name == channel.target.name)
            {
                channel.target.state = old.target.state.clone();
            }
        }
        // The machine type QEMU resolved stays (the converter writes the alias, `q35`).
        if let Some(machine) = self.machine().filter(|m| !m.is_empty()) {
            let machine = machine.to_owned();
            next.set_machine(&machine);
        }
        *self = next;
        Ok(())
    }

    /// `OS.Type.Machine`, when set.
    pub fn machine(&self) -> Option<&str> {
        self.rest.get("OS")?.get("Type")?.get("Machine")?.as_str()
    }

    /// Sets `OS.Type.Machine` (creating `OS.Type` when missing). True when it changed.
    pub fn set_machine(&mut self, machine: &str) -> bool {
        if self.machine() == Some(machine) {
            return false;
        }
        let os = self
            .rest
            .entry("OS")
            .or_insert_with(|| Value::Object(Map::new()));
        if !os.is_object() {
            *os = Value::Object(Map::new());
        }
        let os_type = os
            .as_object_mut()
            .map(|o| o.entry("Type").or_insert_with(|| Value::Object(Map::new())));
        if let Some(t) = os_type {
            if !t.is_object() {
                *t = Value::Object(Map::new());
            }
            if let Some(t) = t.as_object_mut() {
                t.insert("Machine".into(), Value::String(machine.to_owned()));
            }
        }
        true
    }

    /// Sets the `state` (`connected` / `disconnected`) of the channel named `name` (the guest
    /// agent's is `org.qemu.guest_agent.0`), as libvirt reports it. True when it changed.
    pub fn set_channel_state(&mut self, name: &str, state: &str) -> bool {
        let mut changed = false;
        for channel in &mut self.devices.channels {
            if channel.target.name == name && channel.target.state.as_deref() != Some(state) {
                channel.target.state = Some(state.to_owned());
                changed = true;
            }
        }
        changed
    }
}

/// `api.Metadata`: the `<metadata><kubevirt>` block of the domain.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// KubeVirt's metadata.
    #[serde(rename = "KubeVirt", default)]
    pub kubevirt: KubeVirtMetadata,
}

/// `api.KubeVirtMetadata`, the fields qlauncher keeps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KubeVirtMetadata {
    /// The VMI's UID; virt-handler compares it with the VMI it expects.
    #[serde(rename = "UID", default)]
    pub uid: String,
    /// Grace-period bookkeeping, once a shutdown was requested.
    #[serde(
        rename = "GracePeriod",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub grace_period: Option<GracePeriodMetadata>,
    /// The memory dump's progress, once one was requested (`VirtualMachineMemoryDump`).
    #[serde(
        rename = "MemoryDump",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_dump: Option<crate::sync::cmdapi::memory_dump::MemoryDumpMetadata>,
    /// The migration record, once a migration of this domain was accepted
    /// (`spec.metadata.kubevirt.migration`, [`crate::sync::migration::metadata`]).
    #[serde(rename = "Migration", default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<crate::sync::migration::metadata::MigrationMetadata>,
}

/// `api.GracePeriodMetadata`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GracePeriodMetadata {
    /// Seconds the guest gets to shut down before it is killed.
    #[serde(rename = "DeletionGracePeriodSeconds", default)]
    pub deletion_grace_period_seconds: i64,
    /// When the graceful shutdown was signalled (RFC 3339, UTC).
    #[serde(
        rename = "DeletionTimestamp",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub deletion_timestamp: Option<String>,
    /// Whether the VMI was marked for graceful shutdown.
    #[serde(
        rename = "MarkedForGracefulShutdown",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub marked_for_graceful_shutdown: Option<bool>,
}

/// `api.Devices`: the lists the launcher updates live, typed; the others in `rest`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Devices {
    /// Network interfaces.
    #[serde(rename = "Interfaces", default)]
    pub interfaces: Vec<Interface>,
    /// Disks and CD-ROMs.
    #[serde(rename = "Disks", default)]
    pub disks: Vec<Disk>,
    /// PCI host devices (SR-IOV VFs plugged by `HotplugHostDevices`).
    #[serde(rename = "HostDevices", default, skip_serializing_if = "Vec::is_empty")]
    pub host_devices: Vec<HostDevice>,
    /// Channels (the guest agent's `org.qemu.guest_agent.0`).
    #[serde(rename = "Channels", default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<Channel>,
    /// `Controllers`, `Video`, `Graphics`, `Ballooning`, `Inputs`, `Serials`, `Consoles`, `Rng`...
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `api.HostDevice`, the fields an SR-IOV VF has.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostDevice {
    /// `pci`.
    #[serde(rename = "Type", default)]
    pub device_type: String,
    /// `no`: KubeVirt binds the VF to vfio-pci itself.
    #[serde(rename = "Managed", default)]
    pub managed: String,
    /// The host address.
    #[serde(rename = "Source", default)]
    pub source: HostDeviceSource,
    /// `sriov-<interface>` (the JSON form drops the `ua-` of the device id).
    #[serde(rename = "Alias", default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<Alias>,
}

/// `api.HostDeviceSource`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostDeviceSource {
    /// The host PCI address.
    #[serde(rename = "Address", default, skip_serializing_if = "Option::is_none")]
    pub address: Option<PciAddress>,
}

/// `api.Address` of a PCI device (`0x0000`, `0x65`, `0x00`, `0x2`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct PciAddress {
    #[serde(rename = "Type", default)]
    pub address_type: String,
    #[serde(rename = "Domain", default)]
    pub domain: String,
    #[serde(rename = "Bus", default)]
    pub bus: String,
    #[serde(rename = "Slot", default)]
    pub slot: String,
    #[serde(rename = "Function", default)]
    pub function: String,
}

impl PciAddress {
    /// From `DDDD:BB:SS.F`; `None` for anything else.
    pub fn parse(bdf: &str) -> Option<PciAddress> {
        let (domain, rest) = bdf.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (slot, function) = rest.split_once('.')?;
        let hex = |s: &str, n: usize| {
            (s.len() == n && s.chars().all(|c| c.is_ascii_hexdigit())).then(|| format!("0x{s}"))
        };
        Some(PciAddress {
            address_type: "pci".into(),
            domain: hex(domain, 4)?,
            bus: hex(bus, 2)?,
            slot: hex(slot, 2)?,
            function: hex(function, 1)?,
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

/// `api.DomainStatus`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DomainStatus {
    /// Run state.
    #[serde(rename = "Status", default)]
    pub status: LifeCycle,
    /// Why the domain is in that state.
    #[serde(rename = "Reason", default)]
    pub reason: StateChangeReason,
    /// Guest interfaces as the guest agent reports them.
    #[serde(rename = "Interfaces", default)]
    pub interfaces: Vec<InterfaceStatus>,
    /// Guest OS as the guest agent reports it.
    #[serde(rename = "OSInfo", default)]
    pub os_info: GuestOsInfo,
    /// Filesystem freeze state.
    #[serde(rename = "FSFreezeStatus", default)]
    pub fs_freeze_status: FsFreeze,
    /// Details of the last guest panic, if any.
    #[serde(rename = "GuestPanicInfo", default)]
    pub guest_panic_info: Option<GuestPanicInfo>,
    /// Number of guest panics seen.
    #[serde(rename = "PanicCount", default)]
    pub panic_count: i64,
}

/// `api.LifeCycle`: the domain's run state (libvirt's `virDomainState` names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum LifeCycle {
    /// No state (also: the domain does not exist).
    #[default]
    NoState,
    /// vCPUs running.
    Running,
    /// Blocked on a resource.
    Blocked,
    /// vCPUs stopped.
    Paused,
    /// Guest shutting down.
    ShuttingDown,
    /// QEMU gone.
    Shutoff,
    /// Guest crashed.
    Crashed,
    /// Guest suspended by power management.
    #[serde(rename = "PMSuspended")]
    PmSuspended,
    /// The launcher is unreachable (set by virt-handler, never by a launcher).
    Unknown,
}

/// `api.StateChangeReason`: why the domain reached its state. One variant per distinct wire
/// string; Go reuses some strings for several states (`User`, `Unknown`, `Crashed`, ...).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StateChangeReason {
    /// No reason given (Go's zero value, the empty string).
    #[default]
    #[serde(rename = "")]
    Unset,
    /// Unknown reason (any state).
    Unknown,
    /// On user request (shutting down, paused).
    User,
    /// Shut off: guest shut down.
    Shutdown,
    /// Shut off: killed.
    Destroyed,
    /// Shut off: migrated away.
    Migrated,
    /// Shut off or paused: guest crashed.
    Crashed,
    /// Shut off: guest panicked.
    Panicked,
    /// Shut off: saved.
    Saved,
    /// Shut off: failed to start.
    Failed,
    /// Shut off or paused: restored from a snapshot.
    FromSnapshot,
    /// No state: the domain does not exist.
    NonExistent,
    /// Paused for migration.
    Migration,
    /// Paused for save.
    Save,
    /// Paused for a memory dump.
    Dump,
    /// Paused on a disk I/O error.
    #[serde(rename = "IOError")]
    IoError,
    /// Paused by the watchdog.
    Watchdog,
    /// Paused while shutting down.
    ShuttingDown,
    /// Paused for a snapshot.
    Snapshot,
    /// Paused while starting (QEMU started with `-S`).
    StartingUp,
    /// Paused in post-copy migration.
    Postcopy,
    /// Paused after post-copy migration failed.
    PostcopyFailed,
}

/// `api.InterfaceStatus`: one guest interface as the guest agent reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InterfaceStatus {
    /// MAC address.
    #[serde(rename = "Mac", default)]
    pub mac: String,
    /// First IP address (without prefix length).
    #[serde(rename = "Ip", default)]
    pub ip: String,
    /// All IP addresses.
    #[serde(rename = "IPs", default)]
    pub ips: Vec<String>,
    /// Guest interface name, e.g. `eth0`.
    #[serde(rename = "InterfaceName", default)]
    pub interface_name: String,
}

/// `api.GuestOSInfo` (from the guest agent's `guest-get-osinfo`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct GuestOsInfo {
    #[serde(rename = "Name", default)]
    pub name: String,
    #[serde(rename = "KernelRelease", default)]
    pub kernel_release: String,
    #[serde(rename = "Version", default)]
    pub version: String,
    #[serde(rename = "PrettyName", default)]
    pub pretty_name: String,
    #[serde(rename = "VersionId", default)]
    pub version_id: String,
    #[serde(rename = "KernelVersion", default)]
    pub kernel_version: String,
    #[serde(rename = "Machine", default)]
    pub machine: String,
    #[serde(rename = "Id", default)]
    pub id: String,
}

/// `api.FSFreeze`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FsFreeze {
    /// `thawed`, `frozen`, or empty when unknown.
    #[serde(rename = "Status", default)]
    pub status: String,
}

/// `api.GuestPanicInfo`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GuestPanicInfo {
    /// Panic kind reported by QEMU, e.g. `hyper-v`, `s390`, `unknown`.
    #[serde(rename = "Type", default)]
    pub panic_type: String,
    /// Hyper-V bugcheck code.
    #[serde(rename = "Arg1", default)]
    pub arg1: u64,
    /// Hyper-V bugcheck parameter.
    #[serde(rename = "Arg2", default)]
    pub arg2: u64,
    /// Hyper-V bugcheck parameter.
    #[serde(rename = "Arg3", default)]
    pub arg3: u64,
    /// Hyper-V bugcheck parameter.
    #[serde(rename = "Arg4", default)]
    pub arg4: u64,
    /// Hyper-V bugcheck parameter.
    #[serde(rename = "Arg5", default)]
    pub arg5: u64,
}

/// The type of a domain notification: a Kubernetes watch event type (`watch.EventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DomainEventType {
    /// The domain was defined or started (`ADDED`).
    Added,
    /// Any other change (`MODIFIED`), including KubeVirt's final delete notification.
    Modified,
    /// The domain object is gone (`DELETED`).
    Deleted,
}

impl DomainEventType {
    /// The wire string of `DomainEventRequest.eventType`.
    pub fn as_str(self) -> &'static str {
        match self {
            DomainEventType::Added => "ADDED",
            DomainEventType::Modified => "MODIFIED",
            DomainEventType::Deleted => "DELETED",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn running_domain_serializes_with_kubevirt_field_names() {
        let mut domain = ApiDomain::for_vmi("default", "testvmi", "1234-uid");
        domain.spec.uuid = "5e8f1b6c-6f3a-4c1e-9d0b-2f1f6f0e8a11".into();
        domain.spec.domain_type = "kvm".into();
        domain.spec.devices.interfaces.push(Interface {
            interface_type: "ethernet".into(),
            mac: Some(Mac {
                mac: "02:00:00:00:00:01".into(),
            }),
            alias: Some(Alias::user_defined("default")),
            ..Default::default()
        });
        domain.set_state(LifeCycle::Running, StateChangeReason::Unknown);
        domain.status.interfaces.push(InterfaceStatus {
            mac: "02:00:00:00:00:01".into(),
            ip: "10.0.2.2".into(),
            ips: vec!["10.0.2.2".into()],
            interface_name: "eth0".into(),
        });
        let json = serde_json::to_value(&domain).unwrap();
        let expected = serde_json::json!({
            "ObjectMeta": {"name": "testvmi", "namespace": "default", "uid": "1234-uid",
                           "creationTimestamp": null},
            "Spec": {
                "Type": "kvm", "Name": "default_testvmi",
                "UUID": "5e8f1b6c-6f3a-4c1e-9d0b-2f1f6f0e8a11",
                "Devices": {
                    "Interfaces": [{"Type": "ethernet", "MAC": {"MAC": "02:00:00:00:00:01"},
                                    "Alias": {"Name": "default", "UserDefined": true}}],
                    "Disks": []
                },
                "Metadata": {"KubeVirt": {"UID": "1234-uid"}}
            },
            "Status": {
                "Status": "Running", "Reason": "Unknown",
                "Interfaces": [{"Mac": "02:00:00:00:00:01", "Ip": "10.0.2.2", "IPs": ["10.0.2.2"],
                                "InterfaceName": "eth0"}],
                "OSInfo": {"Name": "", "KernelRelease": "", "Version": "", "PrettyName": "",
                           "VersionId": "", "KernelVersion": "", "Machine": "", "Id": ""},
                "FSFreezeStatus": {"Status": ""},
                "GuestPanicInfo": null,
                "PanicCount": 0
            }
        });
        assert_eq!(json, expected);
        let back: ApiDomain = serde_json::from_value(json).unwrap();
        assert_eq!(back, domain);
    }

    #[test]
    fn final_delete_marks_nonexistent_with_deletion_timestamp() {
        let mut domain = ApiDomain::for_vmi("ns", "vm", "u");
        domain.set_state(LifeCycle::Shutoff, StateChangeReason::Shutdown);
        domain.mark_deleted(UNIX_EPOCH + Duration::from_secs(1_796_000_000));
        let json = serde_json::to_value(&domain).unwrap();
        assert_eq!(json["Status"]["Status"], "NoState");
        assert_eq!(json["Status"]["Reason"], "NonExistent");
        assert_eq!(
            json["ObjectMeta"]["deletionTimestamp"],
            "2026-11-30T00:53:20Z"
        );
    }

    #[test]
    fn reasons_and_states_use_kubevirt_strings() {
        let pairs = [
            (
                serde_json::to_value(StateChangeReason::IoError).unwrap(),
                "IOError",
            ),
            (serde_json::to_value(StateChangeReason::Unset).unwrap(), ""),
            (
                serde_json::to_value(StateChangeReason::StartingUp).unwrap(),
                "StartingUp",
            ),
            (
                serde_json::to_value(LifeCycle::PmSuspended).unwrap(),
                "PMSuspended",
            ),
            (
                serde_json::to_value(LifeCycle::ShuttingDown).unwrap(),
                "ShuttingDown",
            ),
        ];
        for (value, wire) in pairs {
            assert_eq!(value, serde_json::Value::String(wire.into()));
        }
    }
}

#[cfg(test)]
mod converted_tests {
    use super::*;

    #[test]
    fn converted_spec_keeps_name_metadata_machine_and_channel_state() {
        let mut domain = ApiDomain::for_vmi("default", "vm", "uid-1");
        domain.spec.set_machine("pc-q35-7.2");
        domain.spec.devices.channels.push(Channel {
            target: ChannelTarget {
                name: "org.qemu.guest_agent.0".into(),
                state: Some("connected".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        let converted = serde_json::json!({
            "Type": "qemu", "Name": "default_vm", "UUID": "u",
            "OS": {"Type": {"Machine": "q35", "Arch": "x86_64", "OS": "hvm"}},
            "Memory": {"Unit": "b", "Value": 268435456},
            "Devices": {
                "Disks": [{"Device": "disk", "Type": "file",
                           "Target": {"Bus": "virtio", "Device": "vda"},
                           "Alias": {"Name": "rootdisk", "UserDefined": true},
                           "Driver": {"Name": "qemu", "Type": "qcow2"}}],
                "Channels": [{"Type": "unix",
                              "Target": {"Name": "org.qemu.guest_agent.0", "Type": "virtio"}}],
                "Controllers": [{"Type": "usb", "Index": "0", "Model": "none"}]
            }
        });
        let serde_json::Value::Object(map) = converted.clone() else {
            unreachable!()
        };
        domain.spec.set_converted(map).unwrap();
        assert_eq!(domain.spec.domain_type, "qemu");
        assert_eq!(domain.spec.metadata.kubevirt.uid, "uid-1");
        assert_eq!(domain.spec.machine(), Some("pc-q35-7.2"));
        assert_eq!(
            domain.spec.devices.channels[0].target.state.as_deref(),
            Some("connected")
        );
        // Everything converted is in the JSON virt-handler decodes.
        let json = serde_json::to_value(&domain.spec).unwrap();
        assert_eq!(json["Devices"]["Disks"][0]["Driver"]["Type"], "qcow2");
        assert_eq!(json["Devices"]["Controllers"][0]["Index"], "0");
        assert_eq!(json["Memory"]["Value"], 268435456);
        assert_eq!(
            json["Devices"]["Channels"][0]["Target"]["State"],
            "connected"
        );
    }
}
