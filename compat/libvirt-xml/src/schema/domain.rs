//! `<domain>` and its top-level children: memory, `<os>`, `<sysinfo>`, `<clock>`, `<metadata>`.

use serde::Serialize;
use serde_with::skip_serializing_none;

use super::*;

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
    /// Hook-added QEMU arguments and environment (Go's `QEMUCmd`, between `<clock>` and
    /// `<metadata>`).
    #[serde(rename = "qemu:commandline")]
    pub commandline: Option<Commandline>,
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
    /// `<launchSecurity>` of an SEV, SEV-ES or SEV-SNP guest.
    #[serde(rename = "launchSecurity")]
    pub launch_security: Option<LaunchSecurity>,
    /// `destroy` for `rebootPolicy: Terminate`.
    pub on_reboot: Option<String>,
}

/// `<launchSecurity type="sev|sev-snp"><policy>0x..</policy></launchSecurity>` (KubeVirt's
/// `LaunchSecurityDomainConfigurator`, `converter/compute/launch_security.go`): the guest policy
/// in hex; `cbitpos` and `reducedPhysBits` as libvirt fills them in from the host.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LaunchSecurity {
    /// `sev` or `sev-snp`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// C-bit position (the host's).
    pub cbitpos: Option<u32>,
    /// Physical address bits lost to encryption (the host's).
    #[serde(rename = "reducedPhysBits")]
    pub reduced_phys_bits: Option<u32>,
    /// Guest policy, `0x` and hex digits.
    pub policy: Option<String>,
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

/// `<os>`.
/// Fields in the order of KubeVirt's `api.OS` (v1.9.0 `virtwrap/api/schema.go`): the hook
/// input (`hooks::kubevirt_input`) prints them in that order, as Go's `encoding/xml` does.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Os {
    /// `<type arch="x86_64" machine="q35">hvm</type>`.
    #[serde(rename = "type")]
    pub type_: OsType,
    /// `<smbios mode="sysinfo"/>`.
    pub smbios: Option<ModeAttr>,
    /// `<bootmenu enable="yes" timeout="10000"/>`.
    pub bootmenu: Option<BootMenu>,
    /// `<bios useserial="yes"/>`.
    pub bios: Option<Bios>,
    /// OVMF code.
    pub loader: Option<Loader>,
    /// Per-VM EFI variables.
    pub nvram: Option<Nvram>,
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
    /// Type 0 entries (empty in KubeVirt's converter output; a hook may fill them).
    pub bios: Option<Entries>,
    /// Type 2 entries (empty in KubeVirt's converter output; a hook may fill them).
    #[serde(rename = "baseBoard")]
    pub base_board: Option<Entries>,
    /// Type 3 entries.
    pub chassis: Option<Entries>,
    /// Type 11 strings (`<oemStrings><entry>..</entry>`; not in KubeVirt's `api.SysInfo`, written
    /// by hooks that use libvirtxml).
    #[serde(rename = "oemStrings")]
    pub oem_strings: Option<OemStrings>,
}

/// `<oemStrings>`: SMBIOS type 11 strings in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OemStrings {
    /// The strings.
    pub entry: Vec<String>,
}

/// `<qemu:commandline>`: extra QEMU arguments and environment (libvirt's QEMU namespace; Go's
/// `api.Commandline`, element order env then arg).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Commandline {
    /// `<qemu:env name=".." value=".."/>`.
    #[serde(rename = "qemu:env")]
    pub env: Vec<QemuEnv>,
    /// `<qemu:arg value=".."/>`.
    #[serde(rename = "qemu:arg")]
    pub arg: Vec<QemuArg>,
}

/// `<qemu:env>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QemuEnv {
    /// Variable name.
    #[serde(rename = "@name")]
    pub name: String,
    /// Value.
    #[serde(rename = "@value")]
    pub value: String,
}

/// `<qemu:arg>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QemuArg {
    /// One argv word.
    #[serde(rename = "@value")]
    pub value: String,
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
