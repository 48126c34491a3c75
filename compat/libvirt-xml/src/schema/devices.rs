//! `<devices>`, the [`Device`] list and every device element but disks (`disks.rs`).

use serde::Serialize;
use serde_with::skip_serializing_none;

use super::*;

/// `<devices>`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Devices {
    /// Devices in KubeVirt's order (interface, channel, hostdev, controller, video, graphics,
    /// memballoon, disk, input, serial, console, watchdog, rng, filesystem, sound, tpm, vsock).
    #[serde(rename = "$value")]
    pub items: Vec<Device>,
}

/// One device element.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Device {
    /// `<interface>`.
    #[serde(rename = "interface")]
    Interface(Interface),
    /// `<channel>`.
    #[serde(rename = "channel")]
    Channel(Channel),
    /// `<hostdev>`.
    #[serde(rename = "hostdev")]
    HostDev(HostDev),
    /// `<controller>`.
    #[serde(rename = "controller")]
    Controller(Controller),
    /// `<video>`.
    #[serde(rename = "video")]
    Video(Video),
    /// `<graphics>`.
    #[serde(rename = "graphics")]
    Graphics(Graphics),
    /// `<memballoon>`.
    #[serde(rename = "memballoon")]
    Memballoon(Memballoon),
    /// `<disk>`.
    #[serde(rename = "disk")]
    Disk(Box<Disk>),
    /// `<input>`.
    #[serde(rename = "input")]
    Input(Input),
    /// `<serial>`.
    #[serde(rename = "serial")]
    Serial(Serial),
    /// `<console>`.
    #[serde(rename = "console")]
    Console(Console),
    /// `<watchdog>`.
    #[serde(rename = "watchdog")]
    Watchdog(Watchdog),
    /// `<rng>`.
    #[serde(rename = "rng")]
    Rng(Rng),
    /// `<filesystem>`.
    #[serde(rename = "filesystem")]
    Filesystem(Filesystem),
    /// `<sound>`.
    #[serde(rename = "sound")]
    Sound(Sound),
    /// `<tpm>`.
    #[serde(rename = "tpm")]
    Tpm(Tpm),
    /// `<vsock>`.
    #[serde(rename = "vsock")]
    Vsock(Vsock),
}

/// `<address type="pci" domain bus slot function [multifunction]/>` or `type="drive"`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Address {
    /// `pci` or `drive`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// PCI domain `0x0000`.
    #[serde(rename = "@domain")]
    pub domain: Option<String>,
    /// PCI bus `0x05`.
    #[serde(rename = "@bus")]
    pub bus: Option<String>,
    /// PCI slot `0x00`.
    #[serde(rename = "@slot")]
    pub slot: Option<String>,
    /// PCI function `0x0`.
    #[serde(rename = "@function")]
    pub function: Option<String>,
    /// `on` on function 0 of a multi-function slot.
    #[serde(rename = "@multifunction")]
    pub multifunction: Option<String>,
    /// Drive controller index.
    #[serde(rename = "@controller")]
    pub controller: Option<u32>,
    /// Drive unit.
    #[serde(rename = "@unit")]
    pub unit: Option<u32>,
}

/// `<interface type="ethernet">`.
/// Fields in the order of KubeVirt's `api.Interface` (v1.9.0 `virtwrap/api/schema.go`): the hook
/// input (`hooks::kubevirt_input`) prints them in that order, as Go's `encoding/xml` does.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Interface {
    /// `ethernet`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// PCI address.
    pub address: Option<Address>,
    /// `<source/>` (empty for ethernet).
    pub source: Empty,
    /// `<target dev="tap0" managed="no"/>`.
    pub target: Option<IfaceTarget>,
    /// `<model type="virtio-non-transitional"/>`.
    pub model: TypeAttr,
    /// `<mac address=".."/>`.
    pub mac: Option<MacAddress>,
    /// `<mtu size="1500"/>`.
    pub mtu: Option<Mtu>,
    /// `<boot order="N"/>`.
    pub boot: Option<BootOrder>,
    /// `<link state="down"/>`.
    pub link: Option<State>,
    /// `ua-<name>`.
    pub alias: NameAttr,
    /// `<driver name="vhost" queues="N"/>`.
    pub driver: Option<IfaceDriver>,
    /// `<rom enabled="no"/>`.
    pub rom: Option<Rom>,
    /// `<acpi index="N"/>`.
    pub acpi: Option<AcpiIndex>,
}

/// `<target dev managed/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IfaceTarget {
    /// Tap name.
    #[serde(rename = "@dev")]
    pub dev: String,
    /// `no`: the tap exists already (created by virt-handler).
    #[serde(rename = "@managed")]
    pub managed: String,
}

/// `<driver name="vhost" queues="N"/>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IfaceDriver {
    /// `vhost` (with multiqueue, as KubeVirt writes it).
    #[serde(rename = "@name")]
    pub name: Option<String>,
    /// Queue pairs.
    #[serde(rename = "@queues")]
    pub queues: Option<u32>,
    /// virtio-net receive queue size (a hook's; KubeVirt's `api.InterfaceDriver` has none).
    #[serde(rename = "@rx_queue_size")]
    pub rx_queue_size: Option<u16>,
    /// virtio-net transmit queue size (a hook's, as `rx_queue_size`).
    #[serde(rename = "@tx_queue_size")]
    pub tx_queue_size: Option<u16>,
}

/// `<mac address=".."/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MacAddress {
    /// `aa:bb:cc:dd:ee:ff`.
    #[serde(rename = "@address")]
    pub address: String,
}

/// `<mtu size=".."/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mtu {
    /// Bytes.
    #[serde(rename = "@size")]
    pub size: u32,
}

/// `<boot order="N"/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BootOrder {
    /// 1-based boot order.
    #[serde(rename = "@order")]
    pub order: u32,
}

/// `<rom enabled="no"/>`, or a hook's `<rom bar file>` (KubeVirt's `api.Rom` has only
/// `enabled`).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rom {
    /// `no`, or `yes` with a `bar` or `file`.
    #[serde(rename = "@enabled")]
    pub enabled: String,
    /// `on` / `off`: the ROM's PCI BAR visible.
    #[serde(rename = "@bar")]
    pub bar: Option<String>,
    /// The ROM image.
    #[serde(rename = "@file")]
    pub file: Option<String>,
}

/// `<acpi index="N"/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AcpiIndex {
    /// ACPI index.
    #[serde(rename = "@index")]
    pub index: u32,
}

/// `<channel type="unix">`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Channel {
    /// `unix`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// `<source mode="bind" path=".."/>` (absent: libvirt picks the path).
    pub source: Option<SourceModePath>,
    /// `<target name=".." type="virtio"/>`.
    pub target: ChannelTarget,
}

/// `<source mode path/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceModePath {
    /// `bind`.
    #[serde(rename = "@mode")]
    pub mode: String,
    /// Socket path.
    #[serde(rename = "@path")]
    pub path: String,
}

/// `<target name type/>` of a channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChannelTarget {
    /// Port name (`org.qemu.guest_agent.0`).
    #[serde(rename = "@name")]
    pub name: String,
    /// `virtio`.
    #[serde(rename = "@type")]
    pub type_: String,
}

/// `<hostdev type="pci|mdev" mode="subsystem">`: a device passed through with VFIO, as KubeVirt's
/// `device/hostdevice` package builds it (`createPCIHostDevice`, `createMDEVHostDevice`): a PCI
/// function with `managed="no"` (the device plugin bound it to vfio-pci already), or a mediated
/// device with `model="vfio-pci"` and the vGPU display (`display`, `ramfb`).
/// Fields in the order of KubeVirt's `api.HostDevice` (v1.9.0 `virtwrap/api/schema.go`): the hook
/// input (`hooks::kubevirt_input`) prints them in that order, as Go's `encoding/xml` does.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostDev {
    /// `pci` or `mdev`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// `no` (PCI only).
    #[serde(rename = "@managed")]
    pub managed: Option<String>,
    /// `subsystem`.
    #[serde(rename = "@mode")]
    pub mode: String,
    /// `vfio-pci` (mediated devices only).
    #[serde(rename = "@model")]
    pub model: Option<String>,
    /// `on`: the vGPU provides a display.
    #[serde(rename = "@display")]
    pub display: Option<String>,
    /// `on`: with a boot framebuffer.
    #[serde(rename = "@ramfb")]
    pub ramfb: Option<String>,
    /// The host device.
    pub source: HostDevSource,
    /// `<boot order="N"/>` (SR-IOV interfaces with a `bootOrder`).
    pub boot: Option<BootOrder>,
    /// Guest PCI address.
    pub address: Option<Address>,
    /// `ua-gpu-<name>`, `ua-hostdevice-<name>`, `ua-sriov-<interface>`.
    pub alias: NameAttr,
}

/// `<source><address .../></source>` of a host device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostDevSource {
    /// The host PCI address or the mediated device's UUID.
    pub address: HostAddress,
}

/// The host side of a `<hostdev>`: `domain bus slot function` of a PCI function (`0x0000`,
/// `0x65`, `0x00`, `0x0`), or `uuid` of a mediated device.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostAddress {
    /// PCI domain.
    #[serde(rename = "@domain")]
    pub domain: Option<String>,
    /// PCI bus.
    #[serde(rename = "@bus")]
    pub bus: Option<String>,
    /// PCI slot.
    #[serde(rename = "@slot")]
    pub slot: Option<String>,
    /// PCI function.
    #[serde(rename = "@function")]
    pub function: Option<String>,
    /// Mediated device UUID.
    #[serde(rename = "@uuid")]
    pub uuid: Option<String>,
}

/// `<controller type index model>`.
/// Fields in the order of KubeVirt's `api.Controller` (v1.9.0 `virtwrap/api/schema.go`): the hook
/// input (`hooks::kubevirt_input`) prints them in that order, as Go's `encoding/xml` does.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Controller {
    /// `usb`, `scsi`, `virtio-serial`, `pci`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// Index.
    #[serde(rename = "@index")]
    pub index: u32,
    /// Model.
    #[serde(rename = "@model")]
    pub model: Option<String>,
    /// `<driver iothread queues/>` (virtio-scsi).
    pub driver: Option<ControllerDriver>,
    /// Alias (`ua-` never; libvirt's own names).
    pub alias: Option<NameAttr>,
    /// PCI address.
    pub address: Option<Address>,
    /// `<target chassis port/>` (pcie-root-port).
    pub target: Option<ControllerTarget>,
}

/// `<driver iothread queues/>` of a controller.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ControllerDriver {
    /// IOThread id.
    #[serde(rename = "@iothread")]
    pub iothread: Option<u32>,
    /// Request queues.
    #[serde(rename = "@queues")]
    pub queues: Option<u32>,
}

/// `<target chassis port/>` of a pcie-root-port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ControllerTarget {
    /// Chassis number.
    #[serde(rename = "@chassis")]
    pub chassis: u32,
    /// Port number (`0x10`).
    #[serde(rename = "@port")]
    pub port: String,
}

/// `<video><model type heads vram/></video>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Video {
    /// Model.
    pub model: VideoModel,
    /// PCI address.
    pub address: Option<Address>,
}

/// `<model type="vga" heads="1" vram="16384"/>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VideoModel {
    /// `vga`, `bochs`, `virtio`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// Heads.
    #[serde(rename = "@heads")]
    pub heads: Option<u32>,
    /// KiB.
    #[serde(rename = "@vram")]
    pub vram: Option<u32>,
}

/// `<graphics type="vnc"><listen type="socket" socket=".."/></graphics>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Graphics {
    /// `vnc`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// Listen.
    pub listen: GraphicsListen,
}

/// `<listen type="socket" socket=".."/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GraphicsListen {
    /// `socket`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// Socket path.
    #[serde(rename = "@socket")]
    pub socket: String,
}

/// `<memballoon model freePageReporting><stats period/></memballoon>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Memballoon {
    /// Model or `none`.
    #[serde(rename = "@model")]
    pub model: String,
    /// `on` / `off`.
    #[serde(rename = "@freePageReporting")]
    pub free_page_reporting: Option<String>,
    /// Statistics period.
    pub stats: Option<Stats>,
    /// PCI address.
    pub address: Option<Address>,
}

/// `<stats period="10"/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Seconds.
    #[serde(rename = "@period")]
    pub period: u32,
}

/// `<input type="tablet" bus model>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Input {
    /// `tablet`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// `usb` / `virtio`.
    #[serde(rename = "@bus")]
    pub bus: String,
    /// `virtio` for virtio tablets.
    #[serde(rename = "@model")]
    pub model: Option<String>,
    /// `ua-<name>`.
    pub alias: NameAttr,
    /// Address.
    pub address: Option<Address>,
}

/// `<serial type="unix">`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Serial {
    /// `unix`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// `<target port="0"/>`.
    pub target: PortTarget,
    /// Socket.
    pub source: SourceModePath,
    /// `<log file append="on"/>`.
    pub log: Option<Log>,
}

/// `<target port="0"/>`, with `type="serial"` on a console.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PortTarget {
    /// `serial` (console only).
    #[serde(rename = "@type")]
    pub type_: Option<String>,
    /// Port.
    #[serde(rename = "@port")]
    pub port: u32,
}

/// `<log file append/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Log {
    /// Log file path.
    #[serde(rename = "@file")]
    pub file: String,
    /// `on`.
    #[serde(rename = "@append")]
    pub append: String,
}

/// `<console type="pty"><target type="serial" port="0"/></console>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Console {
    /// `pty`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// Target.
    pub target: PortTarget,
}

/// `<watchdog model action>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Watchdog {
    /// `i6300esb`.
    #[serde(rename = "@model")]
    pub model: String,
    /// Action.
    #[serde(rename = "@action")]
    pub action: String,
    /// `ua-<name>`.
    pub alias: NameAttr,
    /// Address.
    pub address: Option<Address>,
}

/// `<rng model><backend model="random">/dev/urandom</backend></rng>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rng {
    /// Model.
    #[serde(rename = "@model")]
    pub model: String,
    /// Backend.
    pub backend: RngBackend,
    /// Address.
    pub address: Option<Address>,
}

/// `<backend model="random">/dev/urandom</backend>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RngBackend {
    /// `random`.
    #[serde(rename = "@model")]
    pub model: String,
    /// Entropy source.
    #[serde(rename = "$text")]
    pub source: String,
}

/// `<filesystem type="mount">` of a virtiofs share served by its own virtiofsd (KubeVirt's
/// `VirtiofsConfigurator`, `converter/storage/virtiofs.go`): `<driver type="virtiofs" queue>`,
/// `<source socket>`, `<target dir>` (the share's name, the guest's mount tag). Go's
/// `api.FilesystemDevice` has no alias or address. KubeVirt also writes
/// `accessMode="passthrough"`, an attribute libvirt does not know (its own is `accessmode`, with
/// passthrough the default), so libvirt ignores it and KubeVirt's GetDomain shows no access
/// mode: the export leaves it out (the hook input, Go's text, has it).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Filesystem {
    /// `mount`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// KubeVirt's `accessMode` (see above): only in the hook input.
    #[serde(rename = "@accessMode")]
    pub access_mode: Option<String>,
    /// `<source socket>`.
    pub source: FilesystemSource,
    /// `<target dir>`.
    pub target: FilesystemTarget,
    /// `<driver type="virtiofs" queue>`.
    pub driver: FilesystemDriver,
    /// The PCI address the plan gave it (libvirt's XML has one; Go's type does not, so the
    /// `api.Domain` and the hook input leave it out).
    pub address: Option<Address>,
}

/// `<source socket>`: the virtiofsd socket. (Go's `api.FilesystemSource` always writes `dir`,
/// empty here; libvirt's schema wants a socket source without it.)
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FilesystemSource {
    /// Host directory (none: virtiofsd runs in its own container).
    #[serde(rename = "@dir")]
    pub dir: Option<String>,
    /// virtiofsd's socket.
    #[serde(rename = "@socket")]
    pub socket: Option<String>,
}

/// `<target dir>`: the mount tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FilesystemTarget {
    /// The tag (the VMI's filesystem name).
    #[serde(rename = "@dir")]
    pub dir: String,
}

/// `<driver type queue>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FilesystemDriver {
    /// `virtiofs`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// Request queue size.
    #[serde(rename = "@queue")]
    pub queue: Option<String>,
}

/// `<sound model>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sound {
    /// `ich9` / `ac97`.
    #[serde(rename = "@model")]
    pub model: String,
    /// `ua-<name>`.
    pub alias: NameAttr,
    /// Address.
    pub address: Option<Address>,
}

/// `<tpm model><backend type="emulator" version="2.0"/></tpm>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tpm {
    /// `tpm-tis` / `tpm-crb`.
    #[serde(rename = "@model")]
    pub model: String,
    /// Backend.
    pub backend: TpmBackend,
}

/// `<backend type="emulator" version="2.0" persistent_state/>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TpmBackend {
    /// `emulator`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// `2.0`.
    #[serde(rename = "@version")]
    pub version: String,
    /// `yes` for persistent TPMs.
    #[serde(rename = "@persistent_state")]
    pub persistent_state: Option<String>,
}

/// `<vsock model><cid auto="no" address/></vsock>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Vsock {
    /// `virtio-non-transitional`.
    #[serde(rename = "@model")]
    pub model: String,
    /// CID.
    pub cid: Cid,
    /// Address.
    pub address: Option<Address>,
}

/// `<cid auto="no" address="N"/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cid {
    /// `no`.
    #[serde(rename = "@auto")]
    pub auto: String,
    /// CID.
    #[serde(rename = "@address")]
    pub address: u32,
}
