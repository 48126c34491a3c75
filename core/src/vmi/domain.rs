//! `spec.domain`: resources, CPU, memory, machine, firmware, clock, features, launch security.
//!
//! Field names and JSON spelling follow KubeVirt v1.9.0 `staging/src/kubevirt.io/api/core/v1/schema.go`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::devices::Devices;
use super::Quantity;

/// Marks a KubeVirt API struct that has no fields (`{}` in the manifest).
macro_rules! api_marker {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct $name {}
    };
}
pub(crate) use api_marker;

/// `spec.domain` (KubeVirt `DomainSpec`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DomainSpec {
    /// Compute resources of the pod; CPU and memory sizing derive from them.
    #[serde(skip_serializing_if = "ResourceRequirements::is_empty")]
    pub resources: ResourceRequirements,
    /// CPU topology and model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    /// Guest memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// Machine type (`q35` by default on amd64).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
    /// Firmware: UUID, serial, bootloader, kernel boot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    /// Guest clock offset and timers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock: Option<Clock>,
    /// Hypervisor features (ACPI, APIC, SMM, Hyper-V, KVM, pvspinlock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub features: Option<Features>,
    /// Devices.
    pub devices: Devices,
    /// IOThreads policy: `shared`, `auto` or `supplementalPool`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_threads_policy: Option<String>,
    /// IOThreads settings for `supplementalPool`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_threads: Option<DiskIoThreads>,
    /// SMBIOS chassis information.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chassis: Option<Chassis>,
    /// Confidential computing (SEV, SEV-SNP, TDX).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch_security: Option<LaunchSecurity>,
    /// What a guest reboot does: `Reboot` or `Terminate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reboot_policy: Option<String>,
}

/// `domain.resources` (KubeVirt `ResourceRequirements`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceRequirements {
    /// Requested resources by name (`cpu`, `memory`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<BTreeMap<String, Quantity>>,
    /// Resource limits by name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<BTreeMap<String, Quantity>>,
    /// Do not add the virtualization overhead to the memory request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overcommit_guest_overhead: Option<bool>,
}

impl ResourceRequirements {
    /// Whether no field is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `requests[name]`, if set.
    pub fn request(&self, name: &str) -> Option<&Quantity> {
        self.requests.as_ref().and_then(|m| m.get(name))
    }

    /// `limits[name]`, if set.
    pub fn limit(&self, name: &str) -> Option<&Quantity> {
        self.limits.as_ref().and_then(|m| m.get(name))
    }
}

/// `domain.cpu` (KubeVirt `CPU`). Zero and unset mean the same in KubeVirt's Go types.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Cpu {
    /// Cores per socket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// Sockets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sockets: Option<u32>,
    /// Maximum sockets for CPU hotplug.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sockets: Option<u32>,
    /// Threads per core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// CPU model: `host-model`, `host-passthrough` or a named model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// CPU features with their policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<CpuFeature>>,
    /// Pin each vCPU to a dedicated host CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dedicated_cpu_placement: Option<bool>,
    /// NUMA settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa: Option<Numa>,
    /// Give the emulator thread its own host CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolate_emulator_thread: Option<bool>,
    /// Realtime vCPU settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub realtime: Option<Realtime>,
}

/// `cpu.realtime`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Realtime {
    /// vCPU mask, e.g. `0-3,^1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mask: Option<String>,
}

/// `cpu.numa`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Numa {
    /// Mirror the host NUMA topology of the pinned CPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_mapping_passthrough: Option<NumaGuestMappingPassthrough>,
}

api_marker!(
    /// `numa.guestMappingPassthrough: {}`.
    NumaGuestMappingPassthrough
);

/// One `cpu.features[]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CpuFeature {
    /// Feature name, e.g. `pcid`.
    pub name: String,
    /// `force`, `require` (the default), `optional`, `disable` or `forbid`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

/// `domain.memory` (KubeVirt `Memory`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Memory {
    /// Back guest memory with hugepages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hugepages: Option<Hugepages>,
    /// Memory visible to the guest (bytes quantity).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest: Option<Quantity>,
    /// Upper bound for memory hotplug.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_guest: Option<Quantity>,
    /// Extra overhead added to the pod's memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_overhead: Option<ReservedOverhead>,
}

/// `memory.hugepages`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Hugepages {
    /// Page size, `2Mi` or `1Gi`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_size: Option<String>,
}

/// `memory.reservedOverhead`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ReservedOverhead {
    /// Extra memory overhead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub added_overhead: Option<Quantity>,
    /// `Required` or `NotRequired`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_lock: Option<String>,
}

/// `domain.machine`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Machine {
    /// QEMU machine type, e.g. `q35` or `pc-q35-rhel9.6.0`.
    #[serde(rename = "type")]
    pub r#type: String,
}

/// `domain.firmware` (KubeVirt `Firmware`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Firmware {
    /// SMBIOS system UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// BIOS or EFI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootloader: Option<Bootloader>,
    /// SMBIOS system serial number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Direct kernel boot from a container image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_boot: Option<KernelBoot>,
    /// ACPI tables (SLIC, MSDM) from secrets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acpi: Option<FirmwareAcpi>,
}

/// `firmware.bootloader`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Bootloader {
    /// SeaBIOS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bios: Option<Bios>,
    /// OVMF.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub efi: Option<Efi>,
}

/// `bootloader.bios`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Bios {
    /// Show BIOS output on the serial console.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_serial: Option<bool>,
}

/// `bootloader.efi`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Efi {
    /// Secure boot (default true in KubeVirt, needs SMM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
    /// Keep the NVRAM across restarts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent: Option<bool>,
}

/// `firmware.kernelBoot`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KernelBoot {
    /// Kernel command line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_args: Option<String>,
    /// The container image holding kernel and initrd.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<KernelBootContainer>,
}

/// `kernelBoot.container`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KernelBootContainer {
    /// Image reference.
    pub image: String,
    /// Pull secret name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_secret: Option<String>,
    /// `Always`, `Never` or `IfNotPresent`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Path of the kernel inside the image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_path: Option<String>,
    /// Path of the initrd inside the image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
}

/// `firmware.acpi`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FirmwareAcpi {
    /// Volume name holding the SLIC table.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slic_name_ref: Option<String>,
    /// Volume name holding the MSDM table.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub msdm_name_ref: Option<String>,
}

/// `domain.clock` (KubeVirt `Clock`, with the inlined `ClockOffset`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Clock {
    /// UTC offset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub utc: Option<ClockOffsetUtc>,
    /// Guest time zone name, e.g. `Europe/Berlin`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Timers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timer: Option<Timer>,
}

/// `clock.utc`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ClockOffsetUtc {
    /// Offset from UTC in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset_seconds: Option<i64>,
}

/// `clock.timer`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Timer {
    /// HPET.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hpet: Option<TickTimer>,
    /// KVM clock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kvm: Option<PresentTimer>,
    /// PIT.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pit: Option<TickTimer>,
    /// RTC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtc: Option<RtcTimer>,
    /// Hyper-V reference time counter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hyperv: Option<PresentTimer>,
}

/// A timer with a tick policy (HPET, PIT).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TickTimer {
    /// `delay`, `catchup`, `merge` or `discard`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tick_policy: Option<String>,
    /// Whether the timer is present (JSON `present`; defaulted to true).
    #[serde(rename = "present")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// A timer with only a presence flag (KVM, Hyper-V).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PresentTimer {
    /// Whether the timer is present (JSON `present`; defaulted to true).
    #[serde(rename = "present")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// `timer.rtc`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RtcTimer {
    /// `delay` or `catchup`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tick_policy: Option<String>,
    /// Whether the timer is present (JSON `present`; defaulted to true).
    #[serde(rename = "present")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `guest` or `wall`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub track: Option<String>,
}

/// `domain.features` (KubeVirt `Features`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Features {
    /// ACPI; unset or `enabled` unset means on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acpi: Option<FeatureState>,
    /// APIC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub apic: Option<FeatureApic>,
    /// Pass all Hyper-V enlightenments through.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hyperv_passthrough: Option<FeatureState>,
    /// Hyper-V enlightenments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hyperv: Option<FeatureHyperv>,
    /// System management mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smm: Option<FeatureState>,
    /// KVM features.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kvm: Option<FeatureKvm>,
    /// Paravirtual spinlocks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pvspinlock: Option<FeatureState>,
}

/// A feature switch (`{enabled: bool}`); `enabled` unset means on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FeatureState {
    /// Whether the feature is on (unset = on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// `features.apic`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FeatureApic {
    /// Whether the feature is on (unset = on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Paravirtual end of interrupt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_of_interrupt: Option<bool>,
}

/// `features.kvm`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FeatureKvm {
    /// Hide the KVM signature from the guest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden: Option<bool>,
}

/// `features.hyperv` (KubeVirt `FeatureHyperv`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FeatureHyperv {
    /// relaxed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relaxed: Option<FeatureState>,
    /// vapic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vapic: Option<FeatureState>,
    /// spinlocks with retry count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spinlocks: Option<FeatureSpinlocks>,
    /// vpindex.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vpindex: Option<FeatureState>,
    /// runtime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<FeatureState>,
    /// synic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub synic: Option<FeatureState>,
    /// synictimer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub synictimer: Option<SyNicTimer>,
    /// reset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reset: Option<FeatureState>,
    /// vendor_id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vendorid: Option<FeatureVendorId>,
    /// frequencies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequencies: Option<FeatureState>,
    /// reenlightenment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reenlightenment: Option<FeatureState>,
    /// tlbflush.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tlbflush: Option<TlbFlush>,
    /// ipi.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipi: Option<FeatureState>,
    /// evmcs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evmcs: Option<FeatureState>,
}

/// `hyperv.spinlocks`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FeatureSpinlocks {
    /// Whether the feature is on (unset = on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Retry count (JSON `spinlocks`; defaulted to 4096, minimum 4095).
    #[serde(rename = "spinlocks")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
}

/// `hyperv.vendorid`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FeatureVendorId {
    /// Whether the feature is on (unset = on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Vendor id string, at most 12 characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vendorid: Option<String>,
}

/// `hyperv.synictimer`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SyNicTimer {
    /// Whether the feature is on (unset = on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Direct mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct: Option<FeatureState>,
}

/// `hyperv.tlbflush`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TlbFlush {
    /// Whether the feature is on (unset = on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Direct flush.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct: Option<FeatureState>,
    /// Extended flush.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extended: Option<FeatureState>,
}

/// `domain.ioThreads`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DiskIoThreads {
    /// Number of IOThreads in the supplemental pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub supplemental_pool_thread_count: Option<u32>,
}

/// `domain.chassis` (SMBIOS type 3).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Chassis {
    /// Manufacturer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manufacturer: Option<String>,
    /// Version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Serial.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Asset tag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asset: Option<String>,
    /// SKU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sku: Option<String>,
}

/// `domain.launchSecurity`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LaunchSecurity {
    /// AMD SEV.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sev: Option<Sev>,
    /// AMD SEV-SNP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snp: Option<SevSnp>,
    /// Intel TDX.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tdx: Option<Tdx>,
}

/// `launchSecurity.sev`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Sev {
    /// Guest policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<SevPolicy>,
    /// Attestation requested.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attestation: Option<SevAttestation>,
    /// Launch session blob (base64).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Guest owner's Diffie-Hellman certificate (base64).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dh_cert: Option<String>,
}

/// `sev.policy`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SevPolicy {
    /// SEV-ES.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encrypted_state: Option<bool>,
}

api_marker!(
    /// `sev.attestation: {}`.
    SevAttestation
);
api_marker!(
    /// `launchSecurity.snp: {}`.
    SevSnp
);
api_marker!(
    /// `launchSecurity.tdx: {}`.
    Tdx
);
