//! The libvirt domain XML elements KubeVirt v1.9's converter writes, as serde structs for
//! quick-xml (`@name` = attribute, `$text` = text content, `$value` = a list of differently named
//! child elements).
//!
//! Element order follows KubeVirt's Go structs (`pkg/virt-launcher/virtwrap/api/schema.go`:
//! domain at lines 220-247, devices at 640-663), so a KubeVirt-shaped domain reads the same way;
//! libvirt's own schema (`domaincommon.rng`) accepts any order inside `<domain>` and `<devices>`.
//! The device list is one `$value` sequence of [`Device`] variants in KubeVirt's class order, so
//! writing it needs no `overlapped-lists`; that quick-xml feature is enabled for readers of
//! libvirt-written XML, where device kinds interleave.

use serde::Serialize;
use serde_with::skip_serializing_none;

/// An element with no attributes and no content (`<acpi/>`, `<readonly/>`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Empty {}

/// An element with only a `state` attribute (`<vmport state="off"/>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct State {
    /// `on` / `off`.
    #[serde(rename = "@state")]
    pub state: String,
}

/// `<domain>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename = "domain")]
pub struct Domain {
    /// `kvm` or `qemu` (TCG).
    #[serde(rename = "@type")]
    pub type_: String,
    /// `http://libvirt.org/schemas/domain/qemu/1.0` (KubeVirt always declares it).
    #[serde(rename = "@xmlns:qemu")]
    pub xmlns_qemu: String,
    /// `<namespace>_<name>`.
    pub name: String,
    /// Guest memory.
    pub memory: Memory,
    /// Hotplug ceiling.
    #[serde(rename = "maxMemory")]
    pub max_memory: Option<MaxMemory>,
    /// Hugepages / memfd.
    #[serde(rename = "memoryBacking")]
    pub memory_backing: Option<MemoryBacking>,
    /// Boot.
    pub os: Os,
    /// SMBIOS strings.
    pub sysinfo: Option<SysInfo>,
    /// Devices.
    pub devices: Devices,
    /// Clock.
    pub clock: Option<Clock>,
    /// `<metadata><kubevirt xmlns="http://kubevirt.io">`.
    pub metadata: Metadata,
    /// Hypervisor features.
    pub features: Features,
    /// CPU model and topology.
    pub cpu: Cpu,
    /// vCPU count.
    pub vcpu: Vcpu,
    /// Per-vCPU hotplug state.
    pub vcpus: Option<Vcpus>,
    /// IOThread count.
    pub iothreads: Option<u32>,
    /// `destroy` for `rebootPolicy: Terminate`.
    pub on_reboot: Option<String>,
}

/// `<memory unit="b">`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Memory {
    /// Always `b`.
    #[serde(rename = "@unit")]
    pub unit: String,
    /// Bytes.
    #[serde(rename = "$text")]
    pub value: u64,
}

/// `<maxMemory unit="b" slots="0">`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MaxMemory {
    /// Always `b`.
    #[serde(rename = "@unit")]
    pub unit: String,
    /// DIMM slots (0: virtio-mem only).
    #[serde(rename = "@slots")]
    pub slots: u32,
    /// Bytes.
    #[serde(rename = "$text")]
    pub value: u64,
}

/// `<memoryBacking>`.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MemoryBacking {
    /// `<hugepages/>`.
    pub hugepages: Option<Empty>,
    /// `<source type="memfd"/>`.
    pub source: Option<TypeAttr>,
    /// `<access mode="shared"/>`.
    pub access: Option<ModeAttr>,
}

/// An element with only a `type` attribute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TypeAttr {
    /// The type.
    #[serde(rename = "@type")]
    pub type_: String,
}

/// An element with only a `mode` attribute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModeAttr {
    /// The mode.
    #[serde(rename = "@mode")]
    pub mode: String,
}

/// An element with only a `name` attribute (`<alias name="ua-disk0"/>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NameAttr {
    /// The name.
    #[serde(rename = "@name")]
    pub name: String,
}

/// `<os>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Os {
    /// `<type arch="x86_64" machine="q35">hvm</type>`.
    #[serde(rename = "type")]
    pub type_: OsType,
    /// OVMF code.
    pub loader: Option<Loader>,
    /// Per-VM EFI variables.
    pub nvram: Option<Nvram>,
    /// `<bootmenu enable="yes" timeout="10000"/>`.
    pub bootmenu: Option<BootMenu>,
    /// `<smbios mode="sysinfo"/>`.
    pub smbios: Option<ModeAttr>,
    /// `<bios useserial="yes"/>`.
    pub bios: Option<Bios>,
    /// Kernel image.
    pub kernel: Option<String>,
    /// Initrd.
    pub initrd: Option<String>,
    /// Kernel command line.
    pub cmdline: Option<String>,
}

/// `<os><type>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OsType {
    /// `x86_64`.
    #[serde(rename = "@arch")]
    pub arch: String,
    /// `q35`.
    #[serde(rename = "@machine")]
    pub machine: String,
    /// `hvm`.
    #[serde(rename = "$text")]
    pub value: String,
}

/// `<loader readonly="yes" secure="yes|no" type="pflash">CODE</loader>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Loader {
    /// `yes`.
    #[serde(rename = "@readonly")]
    pub readonly: String,
    /// `yes` / `no`.
    #[serde(rename = "@secure")]
    pub secure: String,
    /// `pflash`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// Code image path.
    #[serde(rename = "$text")]
    pub path: String,
}

/// `<nvram template="VARS">PATH</nvram>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Nvram {
    /// Template the per-VM copy starts from.
    #[serde(rename = "@template")]
    pub template: String,
    /// Per-VM vars path.
    #[serde(rename = "$text")]
    pub path: String,
}

/// `<bootmenu>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BootMenu {
    /// `yes`.
    #[serde(rename = "@enable")]
    pub enable: String,
    /// Milliseconds.
    #[serde(rename = "@timeout")]
    pub timeout: u32,
}

/// `<bios useserial="yes"/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Bios {
    /// `yes`.
    #[serde(rename = "@useserial")]
    pub useserial: String,
}

/// `<sysinfo type="smbios">`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SysInfo {
    /// `smbios`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// Type 1 entries.
    pub system: Entries,
    /// Type 0 (empty in KubeVirt).
    pub bios: Option<Empty>,
    /// Type 2 (empty in KubeVirt).
    #[serde(rename = "baseBoard")]
    pub base_board: Option<Empty>,
    /// Type 3 entries.
    pub chassis: Option<Entries>,
}

/// A list of `<entry name="..">value</entry>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entries {
    /// Entries in order.
    pub entry: Vec<Entry>,
}

/// `<entry name="uuid">...</entry>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// Field name.
    #[serde(rename = "@name")]
    pub name: String,
    /// Value.
    #[serde(rename = "$text")]
    pub value: String,
}

/// `<clock>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Clock {
    /// `utc` / `variable` / `timezone`.
    #[serde(rename = "@offset")]
    pub offset: String,
    /// `reset` or seconds.
    #[serde(rename = "@adjustment")]
    pub adjustment: Option<String>,
    /// `utc` for `offset="variable"`.
    #[serde(rename = "@basis")]
    pub basis: Option<String>,
    /// Seconds for `offset="variable"`.
    #[serde(rename = "@timezone")]
    pub timezone: Option<String>,
    /// Timers.
    #[serde(default)]
    pub timer: Vec<Timer>,
}

/// `<timer name="rtc" tickpolicy="catchup" present="yes" track="guest"/>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Timer {
    /// Timer name.
    #[serde(rename = "@name")]
    pub name: String,
    /// Tick policy.
    #[serde(rename = "@tickpolicy")]
    pub tickpolicy: Option<String>,
    /// `yes` / `no`.
    #[serde(rename = "@present")]
    pub present: Option<String>,
    /// `guest` / `wall`.
    #[serde(rename = "@track")]
    pub track: Option<String>,
}

/// `<metadata>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Metadata {
    /// KubeVirt's private metadata.
    pub kubevirt: KubevirtMetadata,
}

/// `<kubevirt xmlns="http://kubevirt.io"><uid>..</uid></kubevirt>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KubevirtMetadata {
    /// `http://kubevirt.io`.
    #[serde(rename = "@xmlns")]
    pub xmlns: String,
    /// The VMI uid (empty in KubeVirt's converter output: virt-launcher fills it later).
    pub uid: String,
}

/// `<features>`.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Features {
    /// ACPI on.
    pub acpi: Option<Empty>,
    /// APIC.
    pub apic: Option<Empty>,
    /// Hyper-V enlightenments.
    pub hyperv: Option<HyperV>,
    /// SMM.
    pub smm: Option<Empty>,
    /// `<kvm><hidden state=".."/></kvm>`.
    pub kvm: Option<Kvm>,
    /// Paravirtual spinlocks.
    pub pvspinlock: Option<State>,
    /// `<vmport state="off"/>` (amd64).
    pub vmport: Option<State>,
}

/// `<hyperv>`: each enlightenment with `state`.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HyperV {
    /// `passthrough` (`hypervPassthrough`).
    #[serde(rename = "@mode")]
    pub mode: Option<String>,
    /// relaxed.
    pub relaxed: Option<State>,
    /// vapic.
    pub vapic: Option<State>,
    /// spinlocks.
    pub spinlocks: Option<Spinlocks>,
    /// vpindex.
    pub vpindex: Option<State>,
    /// runtime.
    pub runtime: Option<State>,
    /// synic.
    pub synic: Option<State>,
    /// stimer (+direct).
    pub stimer: Option<Stimer>,
    /// reset.
    pub reset: Option<State>,
    /// vendor_id.
    pub vendor_id: Option<VendorId>,
    /// frequencies.
    pub frequencies: Option<State>,
    /// reenlightenment.
    pub reenlightenment: Option<State>,
    /// tlbflush.
    pub tlbflush: Option<State>,
    /// ipi.
    pub ipi: Option<State>,
    /// evmcs.
    pub evmcs: Option<State>,
}

/// `<spinlocks state="on" retries="4096"/>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Spinlocks {
    /// on/off.
    #[serde(rename = "@state")]
    pub state: String,
    /// Retry count.
    #[serde(rename = "@retries")]
    pub retries: Option<u32>,
}

/// `<stimer state="on"><direct state="on"/></stimer>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stimer {
    /// on/off.
    #[serde(rename = "@state")]
    pub state: String,
    /// Direct mode.
    pub direct: Option<State>,
}

/// `<vendor_id state="on" value=".."/>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VendorId {
    /// on/off.
    #[serde(rename = "@state")]
    pub state: String,
    /// Vendor string.
    #[serde(rename = "@value")]
    pub value: Option<String>,
}

/// `<kvm>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Kvm {
    /// Hide the KVM signature.
    pub hidden: State,
}

/// `<cpu>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cpu {
    /// `host-model`, `host-passthrough` or `custom`.
    #[serde(rename = "@mode")]
    pub mode: String,
    /// Named model (mode `custom`).
    pub model: Option<String>,
    /// Topology.
    pub topology: Topology,
    /// Features.
    #[serde(default)]
    pub feature: Vec<CpuFeature>,
}

/// `<topology sockets cores threads/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topology {
    /// Sockets.
    #[serde(rename = "@sockets")]
    pub sockets: u32,
    /// Cores per socket.
    #[serde(rename = "@cores")]
    pub cores: u32,
    /// Threads per core.
    #[serde(rename = "@threads")]
    pub threads: u32,
}

/// `<feature name=".." policy=".."/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CpuFeature {
    /// libvirt feature name.
    #[serde(rename = "@name")]
    pub name: String,
    /// require / disable / force / optional / forbid.
    #[serde(rename = "@policy")]
    pub policy: String,
}

/// `<vcpu placement="static">N</vcpu>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Vcpu {
    /// `static`.
    #[serde(rename = "@placement")]
    pub placement: String,
    /// Maximum vCPUs.
    #[serde(rename = "$text")]
    pub count: u32,
}

/// `<vcpus>` (CPU hotplug).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Vcpus {
    /// One per vCPU.
    pub vcpu: Vec<VcpuState>,
}

/// `<vcpu id enabled hotpluggable/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VcpuState {
    /// vCPU id.
    #[serde(rename = "@id")]
    pub id: u32,
    /// `yes` for the vCPUs present at boot.
    #[serde(rename = "@enabled")]
    pub enabled: String,
    /// `no` for the first socket.
    #[serde(rename = "@hotpluggable")]
    pub hotpluggable: String,
}

/// `<devices>`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Devices {
    /// Devices in KubeVirt's order (interface, channel, controller, video, graphics,
    /// memballoon, disk, input, serial, console, watchdog, rng, sound, tpm, vsock).
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
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Interface {
    /// `ethernet`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// `<source/>` (empty for ethernet).
    pub source: Empty,
    /// `<target dev="tap0" managed="no"/>`.
    pub target: Option<IfaceTarget>,
    /// `<model type="virtio-non-transitional"/>`.
    pub model: TypeAttr,
    /// `<driver name="vhost" queues="N"/>`.
    pub driver: Option<IfaceDriver>,
    /// `<mac address=".."/>`.
    pub mac: Option<MacAddress>,
    /// `<mtu size="1500"/>`.
    pub mtu: Option<Mtu>,
    /// `ua-<name>`.
    pub alias: NameAttr,
    /// `<boot order="N"/>`.
    pub boot: Option<BootOrder>,
    /// `<rom enabled="no"/>`.
    pub rom: Option<Rom>,
    /// `<link state="down"/>`.
    pub link: Option<State>,
    /// `<acpi index="N"/>`.
    pub acpi: Option<AcpiIndex>,
    /// PCI address.
    pub address: Option<Address>,
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
    /// `vhost`.
    #[serde(rename = "@name")]
    pub name: String,
    /// Queue pairs.
    #[serde(rename = "@queues")]
    pub queues: Option<u32>,
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

/// `<rom enabled="no"/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rom {
    /// `no`.
    #[serde(rename = "@enabled")]
    pub enabled: String,
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

/// `<controller type index model>`.
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
    /// `<target chassis port/>` (pcie-root-port).
    pub target: Option<ControllerTarget>,
    /// Alias (`ua-` never; libvirt's own names).
    pub alias: Option<NameAttr>,
    /// PCI address.
    pub address: Option<Address>,
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

/// `<disk>`.
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
    /// Driver.
    pub driver: DiskDriver,
    /// `<readonly/>`.
    pub readonly: Option<Empty>,
    /// `<shareable/>`.
    pub shareable: Option<Empty>,
    /// `ua-<name>`.
    pub alias: NameAttr,
    /// Boot order.
    pub boot: Option<BootOrder>,
    /// Address (PCI for virtio, drive for SCSI).
    pub address: Option<Address>,
    /// Backing image (containerDisk, ephemeral).
    #[serde(rename = "backingStore")]
    pub backing_store: Option<BackingStore>,
    /// Block sizes.
    pub blockio: Option<BlockIo>,
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
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiskDriver {
    /// Cache mode.
    #[serde(rename = "@cache")]
    pub cache: Option<String>,
    /// Error policy.
    #[serde(rename = "@error_policy")]
    pub error_policy: Option<String>,
    /// `qemu`.
    #[serde(rename = "@name")]
    pub name: String,
    /// `raw` / `qcow2`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// `native` / `threads`.
    #[serde(rename = "@io")]
    pub io: Option<String>,
    /// IOThread id.
    #[serde(rename = "@iothread")]
    pub iothread: Option<u32>,
    /// `unmap`.
    #[serde(rename = "@discard")]
    pub discard: Option<String>,
    /// virtio queues (`blockMultiQueue`).
    #[serde(rename = "@queues")]
    pub queues: Option<u32>,
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
