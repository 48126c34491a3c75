//! The defaults virt-api's mutating webhook applies to a new VMI (KubeVirt v1.9.0).
//!
//! Mirrors `pkg/defaults/defaults.go` (`SetDefaultVirtualMachineInstance`), `pkg/defaults/amd64.go`,
//! `arm64.go`, `hyperv.go`, `staging/src/kubevirt.io/api/core/v1/defaults.go` with its generated
//! `SetObjectDefaults_VirtualMachineInstance`, `pkg/network/vmispec/defaults.go`,
//! `pkg/util/util.go` (`SetDefaultVolumeDisk`), `pkg/liveupdate/memory/memory.go`,
//! `pkg/virt-controller/watch/vm/firmware.go` and
//! `pkg/virt-api/webhooks/mutating-webhook/mutators/vmi-mutator.go`.

use std::collections::BTreeMap;

use uuid::Uuid;

use super::*;

/// Namespace UUID KubeVirt hashes a VM name into for its firmware UUID
/// (`pkg/virt-controller/watch/vm/firmware.go`, `CalculateLegacyUUID`).
pub const FIRMWARE_UUID_NAMESPACE: Uuid = Uuid::from_u128(0x6a1a24a1_4061_4607_8bf4_a3963d0c5895);

/// Annotation recording the PCI topology version of the VMI (`v3` for PCIe machines).
pub const PCI_TOPOLOGY_VERSION_ANNOTATION: &str = "kubevirt.io/pci-topology-version";

/// Uid of the unprivileged QEMU user in KubeVirt's launcher image.
pub const NON_ROOT_UID: u64 = 107;

/// vCPU ceiling for the default CPU hotplug limit (`defaults.go setupCPUHotplug`).
const MAX_HOTPLUG_VCPUS: u64 = 512;
/// Memory hotplug block alignment, 2 MiB (`memory.HotplugBlockAlignmentBytes`).
const HOTPLUG_BLOCK_ALIGNMENT: u64 = 2 << 20;
/// Memory hotplug block alignment with 1Gi hugepages.
const HOTPLUG_BLOCK_ALIGNMENT_1G: u64 = 1 << 30;
/// Minimum guest memory for memory hotplug, 1 GiB.
const MIN_HOTPLUG_GUEST_MEMORY: u64 = 1 << 30;

/// The interface binding of the default pod interface (KubeVirt CR
/// `spec.configuration.network.defaultNetworkInterface`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DefaultBinding {
    /// `bridge` (KubeVirt's default, `pkg/virt-config/virt-config.go`).
    #[default]
    Bridge,
    /// `masquerade`.
    Masquerade,
}

/// The cluster-level knobs that shape a VMI's defaults (from the KubeVirt CR), and whether the
/// VMI comes from a VirtualMachine.
#[derive(Debug, Clone, PartialEq)]
pub struct DefaultsConfig {
    /// Architecture used when `spec.architecture` is unset (virt-api's own, normally `amd64`).
    pub architecture: String,
    /// Machine type for amd64 (`q35`).
    pub machine_type_amd64: String,
    /// Binding of the default pod interface.
    pub default_binding: DefaultBinding,
    /// Cluster `cpuModel`; `host-model` when unset.
    pub cpu_model: Option<String>,
    /// Cluster `cpuRequest`; only applied when it differs from 100m.
    pub cpu_request: Option<Quantity>,
    /// Cluster `evictionStrategy`.
    pub eviction_strategy: Option<String>,
    /// Cluster `liveUpdateConfiguration.maxCpuSockets`.
    pub max_cpu_sockets: Option<u32>,
    /// Cluster `liveUpdateConfiguration.maxGuest`.
    pub max_guest: Option<Quantity>,
    /// Cluster `liveUpdateConfiguration.maxHotplugRatio` (4).
    pub max_hotplug_ratio: u32,
    /// VM rollout strategy is `LiveUpdate` (the default): enables the hotplug limits.
    pub live_update: bool,
    /// The `Root` feature gate: QEMU runs as root instead of uid 107.
    pub root: bool,
    /// Name of the VirtualMachine the VMI comes from; the firmware UUID derives from it.
    pub vm_name: Option<String>,
}

impl Default for DefaultsConfig {
    fn default() -> Self {
        DefaultsConfig {
            architecture: "amd64".to_string(),
            machine_type_amd64: "q35".to_string(),
            default_binding: DefaultBinding::Bridge,
            cpu_model: None,
            cpu_request: None,
            eviction_strategy: None,
            max_cpu_sockets: None,
            max_guest: None,
            max_hotplug_ratio: 4,
            live_update: true,
            root: false,
            vm_name: None,
        }
    }
}

impl DefaultsConfig {
    /// KubeVirt's default cluster configuration, with `vm_name` taken from the VMI's owner
    /// reference to a VirtualMachine (see [`Vmi::owner_vm_name`]).
    pub fn for_vmi(vmi: &Vmi) -> Self {
        DefaultsConfig {
            vm_name: vmi.owner_vm_name().map(str::to_string),
            ..Default::default()
        }
    }

    /// [`DefaultsConfig::for_vmi`] for a manifest read from disk: without an owner reference the
    /// VM name is `name` (the manifest's file stem), so the firmware UUID KubeVirt derives from
    /// the VM name is stable, as a VM's would be. The converter's fixtures and
    /// `qlauncher-compat convert` use it.
    pub fn for_manifest(vmi: &Vmi, name: &str) -> Self {
        let mut cfg = Self::for_vmi(vmi);
        if cfg.vm_name.is_none() {
            cfg.vm_name = Some(name.to_string());
        }
        cfg
    }
}

fn n(v: Option<u32>) -> u32 {
    v.unwrap_or(0)
}

fn t() -> Option<bool> {
    Some(true)
}

/// Sets `enabled: true` on a feature switch whose `enabled` is unset.
fn default_on(f: &mut Option<bool>) {
    if f.is_none() {
        *f = t();
    }
}

fn default_state(f: &mut Option<FeatureState>) {
    if let Some(s) = f {
        default_on(&mut s.enabled);
    }
}

fn enabled(f: &Option<FeatureState>) -> bool {
    f.as_ref().and_then(|s| s.enabled) == Some(true)
}

/// Formats bytes as a BinarySI quantity the way Kubernetes canonicalises it (`4Gi`, `1536Mi`,
/// `1000`).
pub fn binary_si(bytes: u64) -> Quantity {
    const SUFFIXES: [&str; 6] = ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"];
    if bytes != 0 {
        for (i, s) in SUFFIXES.iter().enumerate() {
            let unit = 1u64 << (10 * (6 - i));
            if bytes.is_multiple_of(unit) {
                return Quantity(format!("{}{s}", bytes / unit));
            }
        }
    }
    Quantity(bytes.to_string())
}

impl Vmi {
    /// Applies the defaults virt-api's mutating webhook (and, for VMs, virt-controller's firmware
    /// controller) applies to a new VMI, in KubeVirt's order. Applying twice changes nothing.
    ///
    /// Quantities that do not parse are left alone here; [`Vmi::validate`] reports them.
    pub fn apply_defaults(&mut self, cfg: &DefaultsConfig) {
        let spec = &mut self.spec;
        // SetDefaultVirtualMachineInstanceSpec
        if spec.architecture.as_deref().unwrap_or("").is_empty() {
            spec.architecture = Some(cfg.architecture.clone());
        }
        let arch = spec.architecture.clone().unwrap_or_default();
        default_machine_type(spec, cfg, &arch);
        default_resource_requests(spec, cfg);
        default_guest_memory(spec);
        default_cpu_topology(spec);
        default_pull_policies(spec);
        if spec.eviction_strategy.is_none() {
            spec.eviction_strategy = cfg.eviction_strategy.clone();
        }
        default_network_interface(spec, cfg);
        default_volume_disks(spec);
        // SetObjectDefaults_VirtualMachineInstance
        object_defaults(spec);
        let fw = spec.domain.firmware.get_or_insert_with(Default::default);
        if fw.uuid.as_deref().unwrap_or("").is_empty() {
            let uuid = match &cfg.vm_name {
                Some(name) => Uuid::new_v5(&FIRMWARE_UUID_NAMESPACE, name.as_bytes()),
                None => Uuid::new_v4(),
            };
            fw.uuid = Some(uuid.to_string());
        }
        hyperv_dependencies(spec);
        // setDefaultCPUArch
        match arch.as_str() {
            "arm64" => arm64_defaults(spec),
            "s390x" => s390x_defaults(spec),
            _ => amd64_defaults(spec),
        }
        let cpu = spec.domain.cpu.get_or_insert_with(Default::default);
        if cpu.model.as_deref().unwrap_or("").is_empty() {
            cpu.model = Some(
                cfg.cpu_model
                    .clone()
                    .filter(|m| !m.is_empty())
                    .unwrap_or_else(|| "host-model".to_string()),
            );
        }
        // Status. KubeVirt fills these on creation; a VMI handed over by virt-handler already
        // carries them (possibly changed by hotplug), so only absent ones are filled here.
        let status = self.status.get_or_insert_with(Default::default);
        if let (Some(guest), None) = (
            spec.domain.memory.as_ref().and_then(|m| m.guest.clone()),
            &status.memory,
        ) {
            status.memory = Some(MemoryStatus {
                guest_at_boot: Some(guest.clone()),
                guest_current: Some(guest.clone()),
                guest_requested: Some(guest),
                memory_overhead: None,
            });
        }
        if let (Some(cpu), None) = (&spec.domain.cpu, &status.current_cpu_topology) {
            status.current_cpu_topology = Some(CpuTopology {
                sockets: cpu.sockets,
                cores: cpu.cores,
                threads: cpu.threads,
            });
        }
        if arch != "arm64" && cfg.live_update {
            cpu_hotplug(spec, cfg);
            memory_hotplug(spec, cfg);
        }
        if supports_pcie_hotplug(spec) {
            let ann = self.metadata.annotations.get_or_insert_with(BTreeMap::new);
            ann.entry(PCI_TOPOLOGY_VERSION_ANNOTATION.to_string())
                .or_insert_with(|| "v3".to_string());
        }
        if !cfg.root && status.runtime_user.is_none() {
            status.runtime_user = Some(NON_ROOT_UID);
        }
    }
}

fn default_machine_type(spec: &mut VmiSpec, cfg: &DefaultsConfig, arch: &str) {
    let machine_type = match arch {
        "arm64" => "virt".to_string(),
        "s390x" => "s390-ccw-virtio".to_string(),
        _ => cfg.machine_type_amd64.clone(),
    };
    let m = spec.domain.machine.get_or_insert_with(Default::default);
    if m.r#type.is_empty() {
        m.r#type = machine_type;
    }
}

/// `Quantity.IsZero()` on a possibly absent quantity; text that does not parse counts as zero
/// (validation reports it).
fn is_zero(q: Option<&Quantity>) -> bool {
    q.is_none_or(|q| q.to_millis().map(|v| v == 0).unwrap_or(true))
}

fn default_resource_requests(spec: &mut VmiSpec, cfg: &DefaultsConfig) {
    let res = &mut spec.domain.resources;
    if !is_zero(res.limit("cpu")) && is_zero(res.request("cpu")) {
        if let Some(limit) = res.limit("cpu").cloned() {
            res.requests
                .get_or_insert_with(BTreeMap::new)
                .insert("cpu".to_string(), limit);
        }
    }
    if let Some(req) = &cfg.cpu_request {
        if req.to_millis().ok() != Some(100) && res.request("cpu").is_none() {
            let dedicated = spec
                .domain
                .cpu
                .as_ref()
                .and_then(|c| c.dedicated_cpu_placement)
                .unwrap_or(false);
            if !dedicated {
                res.requests
                    .get_or_insert_with(BTreeMap::new)
                    .insert("cpu".to_string(), req.clone());
            }
        }
    }
}

fn default_guest_memory(spec: &mut VmiSpec) {
    let res = spec.domain.resources.clone();
    let mem = spec.domain.memory.get_or_insert_with(Default::default);
    if mem.guest.is_some() {
        return;
    }
    if !is_zero(res.request("memory")) {
        mem.guest = res.request("memory").cloned();
    } else if !is_zero(res.limit("memory")) {
        mem.guest = res.limit("memory").cloned();
    } else if let Some(size) = mem.hugepages.as_ref().and_then(|h| h.page_size.as_ref()) {
        if quantity::is_valid(size) {
            mem.guest = Some(Quantity::new(size.clone()));
        }
    }
}

fn default_cpu_topology(spec: &mut VmiSpec) {
    let res = spec.domain.resources.clone();
    let cpu = spec.domain.cpu.get_or_insert_with(Default::default);
    if n(cpu.cores) == 0 && n(cpu.sockets) == 0 && n(cpu.threads) == 0 {
        let from = res.limit("cpu").or_else(|| res.request("cpu"));
        let sockets = match from {
            Some(q) => q
                .to_bytes()
                .ok()
                .map(|v| u32::try_from(v).unwrap_or(u32::MAX))
                .unwrap_or(1),
            None => 1,
        };
        cpu.sockets = Some(sockets);
        cpu.cores = Some(1);
        cpu.threads = Some(1);
    }
}

fn default_pull_policies(spec: &mut VmiSpec) {
    for v in spec.volumes.iter_mut().flatten() {
        if let Some(cd) = &mut v.container_disk {
            if cd.image_pull_policy.as_deref().unwrap_or("").is_empty() {
                let always = cd.image.ends_with(":latest") || !cd.image.contains([':', '@']);
                cd.image_pull_policy = Some(if always { "Always" } else { "IfNotPresent" }.into());
            }
        }
    }
}

fn default_network_interface(spec: &mut VmiSpec, cfg: &DefaultsConfig) {
    if spec.domain.devices.autoattach_pod_interface == Some(false) {
        return;
    }
    let has_nets = spec.networks.as_ref().is_some_and(|v| !v.is_empty());
    let has_ifaces = spec
        .domain
        .devices
        .interfaces
        .as_ref()
        .is_some_and(|v| !v.is_empty());
    if has_nets || has_ifaces {
        return;
    }
    let mut iface = Interface {
        name: "default".to_string(),
        ..Default::default()
    };
    match cfg.default_binding {
        DefaultBinding::Bridge => iface.bridge = Some(InterfaceBridge {}),
        DefaultBinding::Masquerade => iface.masquerade = Some(InterfaceMasquerade {}),
    }
    spec.domain.devices.interfaces = Some(vec![iface]);
    spec.networks = Some(vec![Network {
        name: "default".to_string(),
        pod: Some(PodNetwork::default()),
        ..Default::default()
    }]);
}

fn default_volume_disks(spec: &mut VmiSpec) {
    let devices = &mut spec.domain.devices;
    let mut names: Vec<String> = devices
        .disks
        .iter()
        .flatten()
        .map(|d| d.name.clone())
        .chain(devices.filesystems.iter().flatten().map(|f| f.name.clone()))
        .collect();
    for v in spec.volumes.iter().flatten() {
        if !names.contains(&v.name) {
            names.push(v.name.clone());
            devices.disks.get_or_insert_with(Vec::new).push(Disk {
                name: v.name.clone(),
                ..Default::default()
            });
        }
    }
}

fn object_defaults(spec: &mut VmiSpec) {
    let d = &mut spec.domain;
    d.firmware.get_or_insert_with(Default::default);
    let features = d.features.get_or_insert_with(Default::default);
    default_on(&mut features.acpi.get_or_insert_with(Default::default).enabled);
    if let Some(apic) = &mut features.apic {
        default_on(&mut apic.enabled);
    }
    if let Some(hv) = &mut features.hyperv {
        for f in [
            &mut hv.relaxed,
            &mut hv.vapic,
            &mut hv.vpindex,
            &mut hv.runtime,
            &mut hv.synic,
            &mut hv.reset,
            &mut hv.frequencies,
            &mut hv.reenlightenment,
            &mut hv.ipi,
            &mut hv.evmcs,
        ] {
            default_state(f);
        }
        if let Some(s) = &mut hv.spinlocks {
            default_on(&mut s.enabled);
            if s.enabled == Some(true) && s.retries.is_none() {
                s.retries = Some(4096);
            }
        }
        if let Some(s) = &mut hv.synictimer {
            default_on(&mut s.enabled);
            default_state(&mut s.direct);
        }
        if let Some(v) = &mut hv.vendorid {
            default_on(&mut v.enabled);
        }
        if let Some(tf) = &mut hv.tlbflush {
            default_on(&mut tf.enabled);
            default_state(&mut tf.direct);
            default_state(&mut tf.extended);
        }
    }
    default_state(&mut features.smm);
    default_state(&mut features.pvspinlock);
    if let Some(timer) = d.clock.as_mut().and_then(|c| c.timer.as_mut()) {
        if let Some(x) = &mut timer.hpet {
            default_on(&mut x.enabled);
        }
        if let Some(x) = &mut timer.kvm {
            default_on(&mut x.enabled);
        }
        if let Some(x) = &mut timer.pit {
            default_on(&mut x.enabled);
        }
        if let Some(x) = &mut timer.rtc {
            default_on(&mut x.enabled);
        }
        if let Some(x) = &mut timer.hyperv {
            default_on(&mut x.enabled);
        }
    }
    for disk in d.devices.disks.iter_mut().flatten() {
        if disk.disk.is_none() && disk.cdrom.is_none() && disk.lun.is_none() {
            disk.disk = Some(DiskTarget::default());
        }
        if let Some(cd) = &mut disk.cdrom {
            default_on(&mut cd.read_only);
            if cd.tray.as_deref().unwrap_or("").is_empty() {
                cd.tray = Some("closed".to_string());
            }
        }
        if let Some(bs) = &mut disk.block_size {
            default_state(&mut bs.match_volume);
        }
    }
    for input in d.devices.inputs.iter_mut().flatten() {
        if input.bus.as_deref().unwrap_or("").is_empty() {
            input.bus = Some("usb".to_string());
        }
        if input.r#type.is_empty() {
            input.r#type = "tablet".to_string();
        }
    }
    for gpu in d.devices.gpus.iter_mut().flatten() {
        if let Some(display) = gpu
            .virtual_gpu_options
            .as_mut()
            .and_then(|o| o.display.as_mut())
        {
            default_state(&mut display.ram_fb);
        }
    }
}

/// Enables the Hyper-V features other enabled ones depend on, when they are unset
/// (`pkg/defaults/hyperv.go SetHypervFeatureDependencies`). A disabled dependency stops the
/// pass, as in KubeVirt; validation then reports it.
fn hyperv_dependencies(spec: &mut VmiSpec) {
    let Some(hv) = spec
        .domain
        .features
        .as_mut()
        .and_then(|f| f.hyperv.as_mut())
    else {
        return;
    };
    fn require(on: bool, dep: &mut Option<FeatureState>) -> Result<(), ()> {
        if !on {
            return Ok(());
        }
        match dep.as_ref().and_then(|d| d.enabled) {
            None => {
                dep.get_or_insert_with(Default::default).enabled = t();
                Ok(())
            }
            Some(true) => Ok(()),
            Some(false) => Err(()),
        }
    }
    let mut steps = || -> Result<(), ()> {
        require(enabled(&hv.evmcs), &mut hv.vapic)?;
        require(enabled(&hv.ipi), &mut hv.vpindex)?;
        let tlb = hv.tlbflush.as_ref().and_then(|t| t.enabled) == Some(true);
        require(tlb, &mut hv.vpindex)?;
        let stimer = hv.synictimer.as_ref().and_then(|t| t.enabled) == Some(true);
        require(stimer, &mut hv.synic)?;
        require(enabled(&hv.synic), &mut hv.vpindex)?;
        Ok(())
    };
    let _ = steps();
    let evmcs_on = hv.evmcs.as_ref().is_some_and(|e| e.enabled.unwrap_or(true));
    if evmcs_on {
        let cpu = spec.domain.cpu.get_or_insert_with(Default::default);
        let features = cpu.features.get_or_insert_with(Vec::new);
        match features.iter_mut().find(|f| f.name == "vmx") {
            Some(f) => f.policy = Some("require".to_string()),
            None => features.push(CpuFeature {
                name: "vmx".to_string(),
                policy: Some("require".to_string()),
            }),
        }
    }
}

fn default_disk_bus(spec: &mut VmiSpec, bus: &str) {
    for disk in spec.domain.devices.disks.iter_mut().flatten() {
        let targets = [
            disk.disk.as_mut().map(|t| &mut t.bus),
            disk.cdrom.as_mut().map(|t| &mut t.bus),
            disk.lun.as_mut().map(|t| &mut t.bus),
        ];
        for b in targets.into_iter().flatten() {
            if b.as_deref().unwrap_or("").is_empty() {
                *b = Some(bus.to_string());
            }
        }
    }
}

fn amd64_defaults(spec: &mut VmiSpec) {
    default_disk_bus(spec, "sata");
    if let Some(w) = &mut spec.domain.devices.watchdog {
        let esb = w.i6300esb.get_or_insert_with(Default::default);
        if esb.action.as_deref().unwrap_or("").is_empty() {
            esb.action = Some("reset".to_string());
        }
    }
}

fn arm64_defaults(spec: &mut VmiSpec) {
    let cpu = spec.domain.cpu.get_or_insert_with(Default::default);
    if cpu.model.as_deref().unwrap_or("").is_empty() {
        cpu.model = Some("host-passthrough".to_string());
    }
    let fw = spec.domain.firmware.get_or_insert_with(Default::default);
    if fw.bootloader.is_none() {
        fw.bootloader = Some(Bootloader {
            efi: Some(Efi::default()),
            ..Default::default()
        });
    }
    if let Some(efi) = fw.bootloader.as_mut().and_then(|b| b.efi.as_mut()) {
        if efi.secure_boot.is_none() {
            efi.secure_boot = Some(false);
        }
    }
    default_disk_bus(spec, "virtio");
}

fn s390x_defaults(spec: &mut VmiSpec) {
    default_disk_bus(spec, "virtio");
    if let Some(w) = &mut spec.domain.devices.watchdog {
        let diag = w.diag288.get_or_insert_with(Default::default);
        if diag.action.as_deref().unwrap_or("").is_empty() {
            diag.action = Some("reset".to_string());
        }
    }
}

fn cpu_hotplug(spec: &mut VmiSpec, cfg: &DefaultsConfig) {
    let cpu = spec.domain.cpu.get_or_insert_with(Default::default);
    let sockets = n(cpu.sockets);
    let mut max = n(cpu.max_sockets);
    if max == 0 {
        max = cfg.max_cpu_sockets.unwrap_or(0);
        if sockets > max && max != 0 {
            max = sockets;
        }
    }
    if max == 0 {
        let (cores, threads) = (u64::from(n(cpu.cores)), u64::from(n(cpu.threads)));
        let mut m = u64::from(sockets).saturating_mul(u64::from(cfg.max_hotplug_ratio));
        let per_socket = cores.saturating_mul(threads);
        if m.saturating_mul(per_socket) > MAX_HOTPLUG_VCPUS {
            m = (MAX_HOTPLUG_VCPUS / per_socket).max(u64::from(sockets));
        }
        max = u32::try_from(m).unwrap_or(u32::MAX);
    }
    if max != 0 {
        cpu.max_sockets = Some(max);
    }
}

fn memory_hotplug(spec: &mut VmiSpec, cfg: &DefaultsConfig) {
    let mem = spec.domain.memory.get_or_insert_with(Default::default);
    if mem.max_guest.is_some() {
        return;
    }
    let max_guest = match (&cfg.max_guest, &mem.guest) {
        (Some(q), _) => Some(q.clone()),
        (None, Some(g)) => g.to_bytes().ok().and_then(|b| {
            b.checked_mul(u64::from(cfg.max_hotplug_ratio))
                .map(binary_si)
        }),
        (None, None) => None,
    };
    if live_update_memory_ok(spec, max_guest.as_ref()) {
        if let Some(m) = spec.domain.memory.as_mut() {
            m.max_guest = max_guest;
        }
    }
}

/// `pkg/liveupdate/memory/memory.go ValidateLiveUpdateMemory`, as a yes/no.
fn live_update_memory_ok(spec: &VmiSpec, max_guest: Option<&Quantity>) -> bool {
    let d = &spec.domain;
    if let Some(cpu) = &d.cpu {
        if cpu.realtime.is_some()
            || cpu
                .numa
                .as_ref()
                .is_some_and(|n| n.guest_mapping_passthrough.is_some())
        {
            return false;
        }
    }
    if d.launch_security.is_some() {
        return false;
    }
    let Some(mem) = &d.memory else { return false };
    let align = if mem.hugepages.as_ref().and_then(|h| h.page_size.as_deref()) == Some("1Gi") {
        HOTPLUG_BLOCK_ALIGNMENT_1G
    } else {
        HOTPLUG_BLOCK_ALIGNMENT
    };
    let (Some(guest), Some(max)) = (&mem.guest, max_guest) else {
        return false;
    };
    let (Ok(guest), Ok(max)) = (guest.to_bytes(), max.to_bytes()) else {
        return false;
    };
    guest <= max
        && guest.is_multiple_of(align)
        && max.is_multiple_of(align)
        && spec.architecture.as_deref() == Some("amd64")
        && guest >= MIN_HOTPLUG_GUEST_MEMORY
}

/// `pkg/defaults/defaults.go SupportsPCIeHotplug`.
fn supports_pcie_hotplug(spec: &VmiSpec) -> bool {
    match spec.architecture.as_deref().unwrap_or("") {
        "amd64" | "arm64" | "" => {}
        _ => return false,
    }
    match &spec.domain.machine {
        Some(m) => m.r#type.contains("q35") || m.r#type.starts_with("virt"),
        None => true,
    }
}
