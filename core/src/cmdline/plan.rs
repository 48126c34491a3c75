//! `DomainPlan`: what the VM has, typed, before any renderer runs. Configurators fill it in, the
//! passes (`passes/`) order devices and assign PCI addresses, and the renderers only print it.

use super::context::QemuVersion;
use super::error::FieldPath;
use super::qemu::{
    Blockdev, ChardevSocket, Device, NetdevTap, Object, ObjectLaunchSecurity, ObjectMemoryBackend,
};

/// Accelerator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Accel {
    /// `-accel kvm`.
    #[default]
    Kvm,
    /// `-accel tcg` (KubeVirt's `--allow-emulation` without `/dev/kvm`).
    Tcg,
}

/// `-machine` options (libvirt's rendering of KubeVirt's q35 domain).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MachinePlan {
    /// Machine type (`q35`, `pc-q35-7.2`, ...).
    pub machine_type: String,
    /// `vmport=off` on amd64 (KubeVirt `<vmport state="off"/>`).
    pub vmport_off: bool,
    /// `smm=on` (`features.smm` or secure boot).
    pub smm: Option<bool>,
    /// `memory-backend=<id>` when the RAM has no NUMA cell.
    pub memory_backend: Option<String>,
    /// EFI code node name (`pflash0=`).
    pub pflash0: Option<String>,
    /// EFI vars node name (`pflash1=`).
    pub pflash1: Option<String>,
    /// ACPI on (KubeVirt: on unless `features.acpi.enabled: false`).
    pub acpi: bool,
    /// HPET: `Some(false)` when the `hpet` timer is `present: false`.
    pub hpet: Option<bool>,
    /// `graphics=off` (SeaBIOS `useSerial`).
    pub graphics_off: bool,
    /// `kernel_irqchip=split` (TDX).
    pub kernel_irqchip_split: bool,
    /// `confidential-guest-support=<id>` (the launch-security object, `lsec0`).
    pub confidential_guest_support: Option<String>,
}

/// One `-cpu` feature flag, `name=on|off`, or `name=value` (Hyper-V spinlocks, vendor id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuFlag {
    /// QEMU property name (`vmx`, `hv-relaxed`, `hv-spinlocks`).
    pub name: String,
    /// Value (`on`, `off`, `0x1000`).
    pub value: String,
}

/// `-cpu`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuPlan {
    /// QEMU model name: `host` (host-model and host-passthrough under KVM), `max` (TCG), a named
    /// model (`Skylake-Server`), or `base` for a CPU adopted from a migration source's static
    /// expansion ([`super::devices::cpu::adopted_cpu_plan`]).
    pub model: String,
    /// Feature flags in order.
    pub flags: Vec<CpuFlag>,
    /// The VMI asked for `host-model`: a migration sends the static expansion of this CPU so that
    /// the target runs the same CPUID identity (libvirt expands host-model into a named model
    /// plus features at start and migrates that definition). False for host-passthrough (which
    /// libvirt migrates as is, between identical hosts) and for a named model.
    pub host_model: bool,
    /// The migration source's definition this CPU was adopted from (`model` is then its name and
    /// `flags` its properties plus `enforce=on`); a later migration sends it on unchanged.
    pub adopted: Option<CpuModel>,
    /// The running host-model CPU in libvirt's terms, for the domain XML sent to a stock
    /// libvirt target (`<cpu mode='custom' match='exact' check='full'>`): set by the migration
    /// source before export (`sync::migration::stock_cpu`), `None` otherwise. The exporter
    /// writes `host-model` without it.
    pub libvirt: Option<LibvirtCpu>,
}

/// A CPU as libvirt's domain XML names it: what libvirt's own source sends for a running
/// host-model domain (the expansion `qemuProcessUpdateGuestCPU` made at start, updated by
/// `virCPUUpdateLive`; `src/qemu/qemu_process.c`, `src/cpu/cpu_x86.c`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LibvirtCpu {
    /// A `cpu_map` model (`EPYC`, `qemu64`), written with `fallback='forbid'`.
    pub model: String,
    /// The `cpu_map` vendor (`AMD`, `Intel`), `<vendor>`.
    pub vendor: Option<String>,
    /// Features in libvirt's spelling (`pclmuldq`, `lahf_lm`) with `true` for
    /// `policy='require'` and `false` for `policy='disable'`, in libvirt's order.
    pub features: Vec<(String, bool)>,
    /// The running vCPU's PMU (`<features><pmu state=..>`, QEMU's `pmu`).
    pub pmu: Option<bool>,
    /// The running vCPU's physical address bits (`<maxphysaddr mode='emulate' bits=..>`,
    /// libvirt 8.7 on; QEMU's `phys-bits`).
    pub phys_bits: Option<u32>,
}

/// A CPU model and its properties, QEMU's `CpuModelInfo` (`qapi/machine-target.json`, QEMU 7.2
/// to 10.1): what `query-cpu-model-expansion` takes and answers, and what a migration source sends
/// its target for a host-model CPU (the model `base` and every property of the static expansion).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct CpuModel {
    /// The model name (`base`, `max`, `host`, `Skylake-Server`).
    pub name: String,
    /// Properties by QOM name (`family`, `vendor`, `sse4.2`); empty means the model's defaults.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub props: std::collections::BTreeMap<String, CpuProp>,
}

/// The value of one CPU property: a feature (`true`/`false`), a number (`family`, `min-level`) or
/// a string (`vendor`, `model-id`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum CpuProp {
    /// A feature bit or a boolean property.
    Bool(bool),
    /// An integer property.
    Int(i64),
    /// A string property.
    Text(String),
}

/// `-smp`.
///
/// With CPU hotplug (`maxSockets` above `sockets`) QEMU starts, as libvirt starts KubeVirt's
/// domain, with the vCPUs of the first socket only (`-smp <stable>`, libvirt's
/// `hotpluggable='no'` vCPUs); the launcher `device_add`s the other enabled vCPUs (`vcpu<index>`)
/// before the guest runs, so that each of them can be unplugged later, down to the first socket
/// (KubeVirt's `domainVCPUTopologyForHotplug`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmpPlan {
    /// vCPUs enabled when the guest starts (`sockets * cores * threads`).
    pub cpus: u32,
    /// vCPUs QEMU creates itself (`-smp <stable>`): `cores * threads` (the first socket) with CPU
    /// hotplug, else `cpus`. The vCPUs from `stable` to `cpus` are plugged before the guest runs.
    pub stable: u32,
    /// vCPUs including hot-pluggable ones (`maxSockets * cores * threads`).
    pub maxcpus: u32,
    /// Sockets (maxSockets with CPU hotplug).
    pub sockets: u32,
    /// Cores per socket.
    pub cores: u32,
    /// Threads per core.
    pub threads: u32,
}

/// A NUMA cell (`-numa node,nodeid=0,cpus=0-N,memdev=ram-node0`), added for memfd/hugepages and
/// for memory hotplug.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaCell {
    /// `0-<maxcpus-1>`.
    pub cpus: String,
    /// Memory backend id.
    pub memdev: String,
}

/// `-m` and the RAM backend.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MemoryPlan {
    /// Guest memory in bytes.
    pub size: u64,
    /// Hotplug ceiling in bytes (`maxGuest`), with `slots=0` (virtio-mem).
    pub maxmem: Option<u64>,
    /// The RAM backend object.
    pub backend: Option<ObjectMemoryBackend>,
    /// The NUMA cell, when one is needed.
    pub numa: Option<NumaCell>,
}

/// Firmware.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum FirmwarePlan {
    /// SeaBIOS (no pflash).
    #[default]
    Bios,
    /// OVMF: the pflash nodes (code read-only, per-VM vars) in argv order.
    Efi {
        /// `libvirt-pflash0-*` and `libvirt-pflash1-*` nodes, bottom first.
        blockdevs: Vec<Blockdev>,
        /// Secure boot (`-global driver=cfi.pflash01,property=secure,value=on`).
        secure: bool,
        /// The vars template the per-VM NVRAM file is copied from (by `storage`, before launch).
        vars_template: String,
        /// The per-VM NVRAM file (`<nvram dir>/<vmi name>_VARS.fd`).
        vars: String,
    },
    /// A firmware image loaded as a ROM (`-bios`, libvirt's `<loader type="rom">`): the
    /// stateless OVMF builds of SEV-SNP and TDX guests, no NVRAM.
    Rom(String),
}

/// Direct kernel boot.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KernelBootPlan {
    /// `-kernel` path.
    pub kernel: Option<String>,
    /// `-initrd` path.
    pub initrd: Option<String>,
    /// `-append` command line.
    pub append: Option<String>,
}

/// One `-smbios type=N,...` table; fields in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmbiosTable {
    /// SMBIOS type (1 system, 3 chassis).
    pub table: u8,
    /// `key=value` pairs (values escaped by the renderer).
    pub fields: Vec<(&'static str, String)>,
}

/// `-rtc` options, derived from the [`ClockPlan`] ([`super::devices::clock::lower_clock`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RtcPlan {
    /// `utc`, `localtime`, or a start date `YYYY-MM-DDTHH:MM:SS`.
    pub base: String,
    /// `vm` when the RTC tracks the guest, `host` the wall clock, `rt` the host's monotonic
    /// clock.
    pub clock: Option<&'static str>,
    /// `slew` for tickpolicy catchup.
    pub driftfix: Option<&'static str>,
}

/// Where the guest's RTC starts (libvirt's `<clock offset>`, `qemuBuildClockArgStr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClockOffset {
    /// UTC (`offset="utc"`), shifted by `adjustment` seconds (libvirt's `adjustment`, KubeVirt's
    /// `utc.offsetSeconds`; a shift makes libvirt's `variable` clock with basis `utc`): `-rtc
    /// base=utc`, or `base=<now + adjustment>` as `YYYY-MM-DDTHH:MM:SS`. `None` is libvirt's
    /// `reset`.
    Utc {
        /// Seconds; `None`: no shift.
        adjustment: Option<i64>,
    },
    /// The host's local time (`offset="localtime"`): `-rtc base=localtime`.
    Localtime,
    /// The local time of a zone (`offset="timezone"`): `-rtc base=localtime` with `TZ=<zone>` in
    /// QEMU's environment.
    Timezone(String),
}

impl Default for ClockOffset {
    fn default() -> Self {
        ClockOffset::Utc { adjustment: None }
    }
}

/// A guest timer libvirt's `<timer name>` names, as KubeVirt's converter emits them
/// (`converter/compute/clock.go`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimerName {
    /// `rtc`: the `-rtc` options.
    Rtc,
    /// `pit`: `-global kvm-pit.lost_tick_policy` (KVM only).
    Pit,
    /// `kvmclock`: the `kvmclock` CPU flag.
    Kvmclock,
    /// `hpet`: `-no-hpet` (QEMU 7.2) or `-machine hpet=off` (QEMU 8 and later) when absent.
    Hpet,
    /// `hypervclock`: the `hv-time` CPU flag.
    Hypervclock,
}

impl TimerName {
    /// Every name, in KubeVirt's order.
    pub const ALL: [TimerName; 5] = [
        TimerName::Rtc,
        TimerName::Pit,
        TimerName::Kvmclock,
        TimerName::Hpet,
        TimerName::Hypervclock,
    ];

    /// libvirt's name.
    pub fn name(self) -> &'static str {
        match self {
            TimerName::Rtc => "rtc",
            TimerName::Pit => "pit",
            TimerName::Kvmclock => "kvmclock",
            TimerName::Hpet => "hpet",
            TimerName::Hypervclock => "hypervclock",
        }
    }

    /// The timer of a libvirt name.
    pub fn from_name(name: &str) -> Option<TimerName> {
        TimerName::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// libvirt's `<timer tickpolicy>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickPolicy {
    /// `delay`: missed ticks delivered late, at the normal rate (QEMU's default).
    Delay,
    /// `catchup`: missed ticks delivered faster until caught up (rtc: `driftfix=slew`).
    Catchup,
    /// `merge`.
    Merge,
    /// `discard`: missed ticks dropped (pit: `lost_tick_policy=discard`).
    Discard,
}

impl TickPolicy {
    /// Every policy.
    pub const ALL: [TickPolicy; 4] = [
        TickPolicy::Delay,
        TickPolicy::Catchup,
        TickPolicy::Merge,
        TickPolicy::Discard,
    ];

    /// libvirt's word.
    pub fn name(self) -> &'static str {
        match self {
            TickPolicy::Delay => "delay",
            TickPolicy::Catchup => "catchup",
            TickPolicy::Merge => "merge",
            TickPolicy::Discard => "discard",
        }
    }

    /// The policy of a libvirt word.
    pub fn from_name(name: &str) -> Option<TickPolicy> {
        TickPolicy::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// libvirt's `<timer name="rtc" track>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerTrack {
    /// `boot` (libvirt refuses it for QEMU).
    Boot,
    /// `guest`: `-rtc clock=vm`.
    Guest,
    /// `wall`: `-rtc clock=host`.
    Wall,
    /// `realtime`: `-rtc clock=rt`.
    Realtime,
}

impl TimerTrack {
    /// Every track.
    pub const ALL: [TimerTrack; 4] = [
        TimerTrack::Boot,
        TimerTrack::Guest,
        TimerTrack::Wall,
        TimerTrack::Realtime,
    ];

    /// libvirt's word.
    pub fn name(self) -> &'static str {
        match self {
            TimerTrack::Boot => "boot",
            TimerTrack::Guest => "guest",
            TimerTrack::Wall => "wall",
            TimerTrack::Realtime => "realtime",
        }
    }

    /// The track of a libvirt word.
    pub fn from_name(name: &str) -> Option<TimerTrack> {
        TimerTrack::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// One `<timer>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerPlan {
    /// Which timer.
    pub name: TimerName,
    /// `present` (`None`: not written).
    pub present: Option<bool>,
    /// `tickpolicy`.
    pub tick_policy: Option<TickPolicy>,
    /// `track` (rtc only).
    pub track: Option<TimerTrack>,
}

/// The domain's clock as libvirt's `<clock>` has it (the offset and the listed timers); the
/// `-rtc` options, `TZ`, the PIT global, HPET and the timer CPU flags are derived from it
/// ([`super::devices::clock::lower_clock`]), and the libvirt export shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClockPlan {
    /// The domain has a `<clock>` (KubeVirt writes one only for `spec.domain.clock`).
    pub listed: bool,
    /// Where the RTC starts.
    pub offset: ClockOffset,
    /// The timers, in order.
    pub timers: Vec<TimerPlan>,
    /// The time (Unix seconds) a shifted start date is computed from (the converter context's
    /// `now_unix`).
    pub now_unix: i64,
}

impl ClockPlan {
    /// The timer `name`, if listed.
    pub fn timer(&self, name: TimerName) -> Option<&TimerPlan> {
        self.timers.iter().find(|t| t.name == name)
    }
}

/// A `-global driver.property=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalProp {
    /// Driver (`kvm-pit`, `cfi.pflash01`, `ICH9-LPC`).
    pub driver: &'static str,
    /// Property.
    pub property: &'static str,
    /// Value.
    pub value: String,
}

/// Device classes, in the order the argv lists them (libvirt's `qemuBuildCommandLine` order:
/// controllers, disks, filesystems, NICs, serial, channels, tpm, inputs, graphics, video, sound,
/// watchdog, host devices, balloon, rng, vsock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeviceClass {
    /// `pcie-root-port` (added by the PCI pass).
    RootPort,
    /// USB, SCSI, virtio-serial controllers.
    Controller,
    /// Disks (KubeVirt `disks`).
    Disk,
    /// virtiofs filesystems (`vhost-user-fs-pci`).
    Filesystem,
    /// NICs (KubeVirt `interfaces`).
    Nic,
    /// Serial ports.
    Serial,
    /// virtio-serial ports.
    Channel,
    /// TPM (libvirt emits it after the consoles, before inputs).
    Tpm,
    /// Tablets.
    Input,
    /// Video adapter.
    Video,
    /// Sound card and codec.
    Sound,
    /// Watchdog.
    Watchdog,
    /// Host devices passed through with VFIO (GPUs, `hostDevices`, SR-IOV VFs).
    HostDevice,
    /// Memory balloon.
    Balloon,
    /// RNG.
    Rng,
    /// vsock.
    Vsock,
}

/// Where the PCI pass puts a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On its own `pcie-root-port` (hot-pluggable; KubeVirt's placement for PCIe devices).
    RootPort,
    /// Directly on `pcie.0` at this slot (integrated devices: VGA at 0x1).
    RootComplex(u8),
    /// Directly on `pcie.0`, next free slot from 0x4 (conventional PCI: i6300esb, AC97, ich9-hda).
    RootComplexAny,
    /// Not a PCI device, or its bus is fixed by the configurator.
    NonPci,
}

/// A PCI bus and address, as QEMU's `bus` and `addr` properties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciAddress {
    /// `pcie.0` or `pci.<n>`.
    pub bus: String,
    /// `0x0`, `0x1`, `0x2.0x3`.
    pub addr: String,
}

/// The backend a device frontend needs, rendered just before it.
#[derive(Debug, Clone, PartialEq)]
pub enum Backend {
    /// None.
    None,
    /// Blockdev chain, bottom node first (backing file's nodes, then the overlay's).
    Blockdevs(Vec<Blockdev>),
    /// A tap netdev: the argv form (inherited fds) and the hotplug form (`getfd` names).
    Netdev {
        /// As on the command line.
        argv: Box<NetdevTap>,
        /// As for `netdev_add` after `getfd` (fd names instead of numbers).
        hotplug: Box<NetdevTap>,
        /// The `getfd` names, in order: taps, then vhost fds.
        fd_names: Vec<String>,
    },
    /// A chardev.
    Chardev(ChardevSocket),
    /// An object (`rng-random`).
    Object(Object),
    /// `-chardev` + `-tpmdev emulator` for swtpm.
    Tpm {
        /// The swtpm socket chardev.
        chardev: ChardevSocket,
        /// tpmdev id.
        tpmdev_id: String,
    },
}

/// One device of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedDevice {
    /// Class (orders the argv).
    pub class: DeviceClass,
    /// The VMI name it came from (disk, interface, input, ...), for messages and the QMP plan.
    pub name: Option<String>,
    /// Backend.
    pub backend: Backend,
    /// Frontend.
    pub device: Device,
    /// Where the PCI pass puts it.
    pub placement: Placement,
    /// Filled by the PCI pass.
    pub address: Option<PciAddress>,
    /// The device can be unplugged and plugged again over QMP (disks and NICs on root ports).
    pub hotpluggable: bool,
    /// For disks: the guest target name (`vda`, `sdb`).
    pub target: Option<String>,
    /// `iommu_platform=on`: the virtio device uses the IOMMU (SEV/SNP guests, set by
    /// `passes/launch_security.rs`; KubeVirt's `<driver iommu="on"/>`).
    pub iommu_platform: bool,
}

/// Watchdog action (`-watchdog-action` / QMP `set-action watchdog=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchdogAction {
    /// Reset the guest.
    Reset,
    /// Power off.
    Poweroff,
    /// Pause.
    Pause,
    /// Do nothing.
    None,
    /// Inject an NMI.
    InjectNmi,
    /// Shut the guest down (ACPI).
    Shutdown,
}

impl WatchdogAction {
    /// The action's name: QEMU's `-watchdog-action` value, which is also libvirt's `<watchdog
    /// action=...>` word.
    pub fn name(self) -> &'static str {
        match self {
            WatchdogAction::Reset => "reset",
            WatchdogAction::Poweroff => "poweroff",
            WatchdogAction::Pause => "pause",
            WatchdogAction::None => "none",
            WatchdogAction::InjectNmi => "inject-nmi",
            WatchdogAction::Shutdown => "shutdown",
        }
    }
}

/// Something on the host the plan needs that only exists on some nodes (a VFIO device, SEV or
/// TDX, a virtiofsd socket), as the context reported it. The converter plans the device either
/// way; [`DomainPlan::missing_hardware`] lists the ones that are not there, so the launcher can
/// refuse to start QEMU with a message naming the VMI field instead of a QEMU error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HardwareNeed {
    /// The VMI field that asks for it (`spec.domain.devices.gpus[0]`).
    pub path: FieldPath,
    /// The QEMU id of the device or object that uses it (`ua-gpu-gpu1`, `lsec0`).
    pub id: String,
    /// What is needed, for messages (`host PCI device for resource nvidia.com/GA102`).
    pub what: String,
    /// `None` when the context reported it present; else why it is missing.
    pub missing: Option<String>,
}

/// One missing piece of hardware ([`DomainPlan::missing_hardware`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingHardware {
    /// The VMI field that asks for it.
    pub path: FieldPath,
    /// The QEMU id of the device or object.
    pub id: String,
    /// What is needed and why it is not there.
    pub reason: String,
}

impl std::fmt::Display for MissingHardware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({})", self.path, self.reason, self.id)
    }
}

/// The whole planned VM.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DomainPlan {
    /// QEMU version the renderers target.
    pub qemu: QemuVersion,
    /// Domain name `<namespace>_<name>` (`-name guest=...`).
    pub name: String,
    /// Firmware UUID (`-uuid`).
    pub uuid: String,
    /// Machine.
    pub machine: MachinePlan,
    /// Accelerator.
    pub accel: Accel,
    /// CPU model and flags.
    pub cpu: CpuPlan,
    /// Topology.
    pub smp: SmpPlan,
    /// Memory.
    pub memory: MemoryPlan,
    /// Firmware.
    pub firmware: FirmwarePlan,
    /// Direct kernel boot.
    pub kernel_boot: Option<KernelBootPlan>,
    /// SMBIOS tables.
    pub smbios: Vec<SmbiosTable>,
    /// The clock (offset and timers) the RTC, `TZ`, PIT, HPET and timer CPU flags come from.
    pub clock: ClockPlan,
    /// RTC.
    pub rtc: RtcPlan,
    /// Environment for QEMU (`TZ` for a timezone clock).
    pub env: Vec<(String, String)>,
    /// Words a hook sidecar's `<qemu:commandline><qemu:arg>` adds, verbatim and in order, after
    /// all devices and before `-sandbox` (where libvirt renders them, `qemu-ns` case of
    /// libvirt's `qemuxmlconftest`). Each is one argv word: never split or re-quoted.
    pub extra_args: Vec<String>,
    /// QEMU environment a hook sidecar's `<qemu:commandline><qemu:env>` adds, after [`Self::env`].
    pub extra_env: Vec<(String, String)>,
    /// `-global` properties.
    pub globals: Vec<GlobalProp>,
    /// Objects rendered before devices (iothreads).
    pub objects: Vec<Object>,
    /// QMP monitor chardev (`charmonitor`).
    pub monitor: Option<ChardevSocket>,
    /// Devices (ordered and addressed by the passes).
    pub devices: Vec<PlannedDevice>,
    /// VNC unix socket path.
    pub vnc: Option<String>,
    /// An `-audiodev none` is needed (VNC or sound).
    pub audiodev: bool,
    /// Watchdog action.
    pub watchdog_action: Option<WatchdogAction>,
    /// `-no-reboot` (`spec.domain.rebootPolicy: Terminate`).
    pub no_reboot: bool,
    /// Boot menu with a 10 s timeout (`startStrategy: Paused`).
    pub boot_menu: bool,
    /// Spare PCIe root ports added for hotplug (count).
    pub spare_root_ports: u32,
    /// Free-ports rule input: guest memory above 2 GiB.
    pub large_memory: bool,
    /// Placeholder ports reserved for NICs (KubeVirt: max(0, 4 - #interfaces)).
    pub nic_placeholders: u32,
    /// Balloon statistics period in seconds, set over QMP after start (`qom-set
    /// guest-stats-polling-interval`), as libvirt does.
    pub balloon_stats_period: Option<u32>,
    /// NIC ids whose link starts down (`set_link` after start; interface `state: down`).
    pub links_down: Vec<String>,
    /// Disk I/O limits set over QMP after start (`block_set_io_throttle`, by disk id), as
    /// libvirt sets a disk's `<iotune>`; a hook sidecar's only, KubeVirt has no such field.
    pub io_throttles: Vec<crate::cmdline::qemu::BlockSetIoThrottle>,
    /// Confidential-computing object (`sev-guest`, `sev-snp-guest`, `tdx-guest`, id `lsec0`),
    /// referenced by `-machine confidential-guest-support=lsec0`.
    pub launch_security: Option<ObjectLaunchSecurity>,
    /// Host hardware the plan needs, present or not (see [`HardwareNeed`]).
    pub hardware: Vec<HardwareNeed>,
    /// Id of the disk holding `bootindex=1` only because no device has a `bootOrder` (libvirt's
    /// default `<boot dev='hd'/>` on the first disk, `devices/disks/mod.rs`). libvirt derives it
    /// at start only: a disk KubeVirt attaches later gets none, so the QMP plan's `device_add`
    /// of this disk leaves it out (and can never clash with a live `bootindex=1`).
    pub default_boot_disk: Option<String>,
}

impl DomainPlan {
    /// The planned devices with a given class.
    pub fn devices_of(&self, class: DeviceClass) -> impl Iterator<Item = &PlannedDevice> {
        self.devices.iter().filter(move |d| d.class == class)
    }

    /// The launch-time check: every piece of host hardware the plan needs that the context did
    /// not report (a GPU, host device or SR-IOV VF without a host PCI address, SEV or TDX not
    /// available, a virtiofsd socket not there), in plan order, each with the VMI field path.
    /// Empty when QEMU can be started. Pure: the launcher gathers the facts into the
    /// `ConverterContext` first and calls this before spawning QEMU (KubeVirt fails the same
    /// cases in `generateConverterContext` when a device plugin's address pool comes up short).
    pub fn missing_hardware(&self) -> Vec<MissingHardware> {
        self.hardware
            .iter()
            .filter_map(|h| {
                h.missing.as_ref().map(|why| MissingHardware {
                    path: h.path.clone(),
                    id: h.id.clone(),
                    reason: format!("{}: {why}", h.what),
                })
            })
            .collect()
    }
}
