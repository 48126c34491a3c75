//! Validation of a (defaulted) VMI: the checks whose failure would make a broken domain.
//!
//! Rules follow KubeVirt v1.9.0's validating webhook
//! (`pkg/virt-api/webhooks/validating-webhook/admitters/vmi-create-admitter.go`,
//! `pkg/storage/admitters/disks.go`, `pkg/network/admitter/*.go`, `pkg/defaults/hyperv.go`),
//! plus the launcher-side safety rules of qlauncher (absolute image paths without `..`).
//! Every error names the JSON path of the field and the reason; all errors are collected.

use std::collections::BTreeMap;
use std::fmt;

use super::*;

/// One validation failure: the JSON path of the field (`spec.domain.devices.disks[1].disk.bus`)
/// and why it is rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the offending field.
    pub path: String,
    /// Why the value is rejected.
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

impl std::error::Error for FieldError {}

/// Disk buses KubeVirt accepts (`pkg/storage/admitters/disks.go`).
pub const DISK_BUSES: [&str; 4] = ["virtio", "scsi", "sata", "usb"];
/// NIC models KubeVirt accepts (`pkg/network/admitter/netiface.go`).
pub const INTERFACE_MODELS: [&str; 7] = [
    "e1000", "e1000e", "igb", "ne2k_pci", "pcnet", "rtl8139", "virtio",
];
/// Smallest memory request KubeVirt accepts, 1M.
pub const MIN_MEMORY_BYTES: u64 = 1_000_000;
/// Maximum disk serial length (`maxStrLen` in KubeVirt's admitters).
pub const MAX_SERIAL_LEN: usize = 256;

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn add(&mut self, path: impl Into<String>, reason: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            reason: reason.into(),
        });
    }
}

/// Whether `s` is a DNS-1123 label: lowercase alphanumerics and `-`, starting and ending
/// alphanumeric, at most 63 characters.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `s` is a DNS-1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

const DNS_LABEL_REASON: &str = "must be a DNS-1123 label (lowercase alphanumerics and '-', starting and ending alphanumeric, at most 63 characters)";

/// Whether `s` is a unicast-or-multicast 6-byte MAC written as `aa:bb:cc:dd:ee:ff` or
/// `aa-bb-cc-dd-ee-ff` (the forms Go's `net.ParseMAC` accepts for 48-bit addresses).
pub fn is_mac_address(s: &str) -> bool {
    let sep = if s.contains(':') { ':' } else { '-' };
    let parts: Vec<&str> = s.split(sep).collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|c| c.is_ascii_hexdigit()))
}

/// Whether `s` is a PCI address `dddd:bb:ss.f` (hex domain, bus, slot < 0x20, function < 8).
pub fn is_pci_address(s: &str) -> bool {
    let hex = |p: &str, len: usize| p.len() == len && p.bytes().all(|c| c.is_ascii_hexdigit());
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 3 || !hex(parts[0], 4) || !hex(parts[1], 2) {
        return false;
    }
    let Some((slot, func)) = parts[2].split_once('.') else {
        return false;
    };
    hex(slot, 2)
        && hex(func, 1)
        && u8::from_str_radix(slot, 16).is_ok_and(|v| v < 0x20)
        && u8::from_str_radix(func, 16).is_ok_and(|v| v < 8)
}

fn is_base64(s: &str) -> bool {
    let b = s.as_bytes();
    if !b.len().is_multiple_of(4) {
        return false;
    }
    let pad = b.iter().rev().take_while(|c| **c == b'=').count();
    pad <= 2
        && b[..b.len() - pad]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/')
}

/// An absolute path without `..` components, NUL or empty components' tricks.
fn is_safe_abs_path(p: &str) -> bool {
    p.starts_with('/') && !p.contains('\0') && !p.split('/').any(|c| c == "..")
}

fn one_of(v: &Option<String>, allowed: &[&str]) -> bool {
    v.as_deref().is_none_or(|x| allowed.contains(&x))
}

impl Vmi {
    /// Checks a VMI (normally after [`Vmi::apply_defaults`]) and returns every problem found.
    ///
    /// Errors: one [`FieldError`] per failed rule, in document order.
    pub fn validate(&self) -> Result<(), Vec<FieldError>> {
        let mut e = Errors::default();
        validate_metadata(self, &mut e);
        let spec = &self.spec;
        validate_spec_top(spec, &mut e);
        validate_resources(spec, &mut e);
        validate_cpu(spec, &mut e);
        validate_memory(spec, &mut e);
        validate_firmware(spec, &mut e);
        validate_features(spec, &mut e);
        validate_clock(spec, &mut e);
        let mut boot_orders: BTreeMap<u32, String> = BTreeMap::new();
        validate_disks(spec, &mut e, &mut boot_orders);
        validate_volumes(spec, &mut e);
        validate_interfaces(spec, &mut e, &mut boot_orders);
        validate_networks(spec, &mut e);
        validate_other_devices(spec, &mut e);
        if e.0.is_empty() {
            Ok(())
        } else {
            Err(e.0)
        }
    }
}

fn validate_metadata(vmi: &Vmi, e: &mut Errors) {
    match (&vmi.metadata.name, &vmi.metadata.generate_name) {
        (Some(name), _) if !is_dns_label(name) => e.add("metadata.name", DNS_LABEL_REASON),
        (None, None) => e.add("metadata.name", "is required"),
        _ => {}
    }
    // The namespace names a directory (cloud-init data, KubeVirt's getDomainBasePath): Kubernetes
    // guarantees a DNS-1123 label, and the launcher checks it again so `..` cannot escape.
    if let Some(ns) = vmi.metadata.namespace.as_deref() {
        if !ns.is_empty() && !is_dns_label(ns) {
            e.add("metadata.namespace", DNS_LABEL_REASON);
        }
    }
    if let Some(kind) = &vmi.kind {
        if kind != "VirtualMachineInstance" {
            e.add(
                "kind",
                format!("must be VirtualMachineInstance, not {kind}"),
            );
        }
    }
}

fn validate_spec_top(spec: &VmiSpec, e: &mut Errors) {
    if let Some(arch) = &spec.architecture {
        if !["amd64", "arm64", "s390x", ""].contains(&arch.as_str()) {
            e.add(
                "spec.architecture",
                format!("unsupported architecture: {arch}"),
            );
        }
    }
    if let Some(h) = &spec.hostname {
        if !is_dns_label(h) {
            e.add("spec.hostname", DNS_LABEL_REASON);
        }
    }
    if let Some(s) = &spec.subdomain {
        if !is_dns_subdomain(s) {
            e.add("spec.subdomain", "must be a DNS-1123 subdomain");
        }
    }
    if spec.termination_grace_period_seconds.is_some_and(|t| t < 0) {
        e.add(
            "spec.terminationGracePeriodSeconds",
            "must be greater than or equal to 0",
        );
    }
    if !one_of(&spec.start_strategy, &["Paused"]) {
        e.add("spec.startStrategy", "must be Paused if set");
    }
    if !one_of(
        &spec.eviction_strategy,
        &["None", "LiveMigrate", "LiveMigrateIfPossible", "External"],
    ) {
        e.add(
            "spec.evictionStrategy",
            "must be one of None, LiveMigrate, LiveMigrateIfPossible, External",
        );
    }
    if !one_of(
        &spec.domain.io_threads_policy,
        &["shared", "auto", "supplementalPool"],
    ) {
        e.add(
            "spec.domain.ioThreadsPolicy",
            "must be one of shared, auto, supplementalPool",
        );
    }
    if spec.domain.io_threads_policy.as_deref() == Some("supplementalPool")
        && spec
            .domain
            .io_threads
            .as_ref()
            .and_then(|t| t.supplemental_pool_thread_count)
            .unwrap_or(0)
            == 0
    {
        e.add(
            "spec.domain.ioThreads.supplementalPoolThreadCount",
            "must be set and positive for the supplementalPool policy",
        );
    }
    if !one_of(&spec.domain.reboot_policy, &["Reboot", "Terminate"]) {
        e.add(
            "spec.domain.rebootPolicy",
            "must be one of Reboot, Terminate",
        );
    }
}

fn validate_resources(spec: &VmiSpec, e: &mut Errors) {
    let res = &spec.domain.resources;
    for (kind, map) in [("requests", &res.requests), ("limits", &res.limits)] {
        for (name, q) in map.iter().flatten() {
            if let Err(err) = q.to_millis() {
                e.add(
                    format!("spec.domain.resources.{kind}.{name}"),
                    err.to_string(),
                );
            }
        }
    }
    let bytes = |q: Option<&Quantity>| q.and_then(|q| q.to_bytes().ok());
    let millis = |q: Option<&Quantity>| q.and_then(|q| q.to_millis().ok());
    if let Some(req) = bytes(res.request("memory")) {
        if req > 0 && req < MIN_MEMORY_BYTES {
            e.add(
                "spec.domain.resources.requests.memory",
                "must be greater than or equal to 1M",
            );
        }
        if let Some(lim) = bytes(res.limit("memory")) {
            if req > lim {
                e.add(
                    "spec.domain.resources.requests.memory",
                    "must be less than or equal to limits.memory",
                );
            }
        }
    }
    if let (Some(req), Some(lim)) = (millis(res.request("cpu")), millis(res.limit("cpu"))) {
        if req > lim {
            e.add(
                "spec.domain.resources.requests.cpu",
                "must be less than or equal to limits.cpu",
            );
        }
    }
}

fn validate_cpu(spec: &VmiSpec, e: &mut Errors) {
    let Some(cpu) = &spec.domain.cpu else { return };
    // All three unset or 0 is filled in by the defaults (sockets from the CPU limit); a 0 left
    // next to set values, or derived from a CPU limit of 0, makes a zero topology.
    let parts = [
        ("sockets", cpu.sockets),
        ("cores", cpu.cores),
        ("threads", cpu.threads),
    ];
    let all_zero = parts.iter().all(|(_, v)| v.unwrap_or(0) == 0);
    if !all_zero {
        for (name, v) in parts {
            if v == Some(0) {
                e.add(format!("spec.domain.cpu.{name}"), "must be greater than 0");
            }
        }
    }
    let vcpus = u64::from(cpu.sockets.unwrap_or(1).max(1))
        .saturating_mul(u64::from(cpu.cores.unwrap_or(1).max(1)))
        .saturating_mul(u64::from(cpu.threads.unwrap_or(1).max(1)));
    if vcpus > 1024 {
        e.add(
            "spec.domain.cpu",
            format!("{vcpus} vCPUs exceed the maximum of 1024"),
        );
    }
    if let Some(max) = cpu.max_sockets.filter(|m| *m != 0) {
        if max < cpu.sockets.unwrap_or(1) {
            e.add(
                "spec.domain.cpu.maxSockets",
                "must be greater than or equal to sockets",
            );
        }
    }
    for (i, f) in cpu.features.iter().flatten().enumerate() {
        if f.name.is_empty() {
            e.add(format!("spec.domain.cpu.features[{i}].name"), "is required");
        }
        if !one_of(
            &f.policy,
            &["force", "require", "optional", "disable", "forbid"],
        ) {
            e.add(
                format!("spec.domain.cpu.features[{i}].policy"),
                "must be one of force, require, optional, disable, forbid",
            );
        }
    }
    if cpu.isolate_emulator_thread == Some(true) && cpu.dedicated_cpu_placement != Some(true) {
        e.add(
            "spec.domain.cpu.isolateEmulatorThread",
            "requires dedicatedCpuPlacement",
        );
    }
    if cpu.realtime.is_some() && cpu.dedicated_cpu_placement != Some(true) {
        e.add(
            "spec.domain.cpu.dedicatedCpuPlacement",
            "must be true when realtime is used",
        );
    }
}

fn validate_memory(spec: &VmiSpec, e: &mut Errors) {
    let mem = spec.domain.memory.as_ref();
    let guest_q = mem.and_then(|m| m.guest.as_ref());
    let request = spec.domain.resources.request("memory");
    let hugepages = mem.and_then(|m| m.hugepages.as_ref());
    if guest_q.is_none() && request.is_none() && hugepages.is_none() {
        e.add(
            "spec.domain.memory.guest",
            "no memory requested: set domain.memory.guest, domain.memory.hugepages.pageSize or domain.resources.requests.memory",
        );
    }
    let mut guest = None;
    if let Some(q) = guest_q {
        match q.to_bytes() {
            Err(err) => e.add("spec.domain.memory.guest", err.to_string()),
            Ok(b) if b < MIN_MEMORY_BYTES => e.add(
                "spec.domain.memory.guest",
                "must be greater than or equal to 1M",
            ),
            Ok(b) => guest = Some(b),
        }
    }
    if let (Some(g), Some(lim)) = (
        guest,
        spec.domain
            .resources
            .limit("memory")
            .and_then(|q| q.to_bytes().ok()),
    ) {
        if g > lim {
            e.add(
                "spec.domain.memory.guest",
                "must be less than or equal to resources.limits.memory",
            );
        }
    }
    if let Some(max) = mem.and_then(|m| m.max_guest.as_ref()) {
        match max.to_bytes() {
            Err(err) => e.add("spec.domain.memory.maxGuest", err.to_string()),
            Ok(m) if guest.is_some_and(|g| m < g) => e.add(
                "spec.domain.memory.maxGuest",
                "must be greater than or equal to guest",
            ),
            Ok(_) => {}
        }
    }
    if let Some(hp) = hugepages {
        let size = hp.page_size.as_deref().unwrap_or("");
        match Quantity::new(size).to_bytes() {
            Ok(ps) if ps > 0 => {
                if let Some(g) = guest {
                    if !g.is_multiple_of(ps) {
                        e.add(
                            "spec.domain.memory.guest",
                            format!("must be a multiple of the hugepage size {size}"),
                        );
                    }
                }
            }
            _ => e.add(
                "spec.domain.memory.hugepages.pageSize",
                format!("invalid hugepage size {size:?}"),
            ),
        }
    }
}

fn validate_firmware(spec: &VmiSpec, e: &mut Errors) {
    let Some(fw) = &spec.domain.firmware else {
        return;
    };
    if let Some(u) = &fw.uuid {
        if uuid::Uuid::parse_str(u).is_err() {
            e.add("spec.domain.firmware.uuid", "must be a UUID");
        }
    }
    if let Some(bl) = &fw.bootloader {
        if bl.bios.is_some() && bl.efi.is_some() {
            e.add(
                "spec.domain.firmware.bootloader",
                "has both EFI and BIOS configured, but they are mutually exclusive",
            );
        }
        if let Some(efi) = &bl.efi {
            let secure = efi.secure_boot.unwrap_or(true);
            let smm_off = spec
                .domain
                .features
                .as_ref()
                .and_then(|f| f.smm.as_ref())
                .is_none_or(|s| s.enabled == Some(false));
            if secure && smm_off {
                e.add(
                    "spec.domain.features.smm",
                    "EFI secureBoot requires SMM, which is disabled",
                );
            }
        }
    }
    if let Some(kb) = &fw.kernel_boot {
        match &kb.container {
            None => {
                if kb.kernel_args.is_some() {
                    e.add(
                        "spec.domain.firmware.kernelBoot.kernelArgs",
                        "requires kernelBoot.container",
                    );
                }
            }
            Some(c) => {
                let p = "spec.domain.firmware.kernelBoot.container";
                if c.image.is_empty() {
                    e.add(format!("{p}.image"), "is required");
                }
                if c.kernel_path.is_none() && c.initrd_path.is_none() {
                    e.add(p, "must set at least one of kernelPath or initrdPath");
                }
                for (name, v) in [
                    ("kernelPath", &c.kernel_path),
                    ("initrdPath", &c.initrd_path),
                ] {
                    if let Some(path) = v {
                        if !is_safe_abs_path(path) {
                            e.add(
                                format!("{p}.{name}"),
                                "must be an absolute path without '..'",
                            );
                        }
                    }
                }
            }
        }
    }
    if fw.serial.as_deref().is_some_and(|s| s.contains('\0')) {
        e.add("spec.domain.firmware.serial", "must not contain NUL");
    }
}

fn validate_features(spec: &VmiSpec, e: &mut Errors) {
    let Some(hv) = spec
        .domain
        .features
        .as_ref()
        .and_then(|f| f.hyperv.as_ref())
    else {
        return;
    };
    let p = "spec.domain.features.hyperv";
    let on = |f: &Option<FeatureState>| f.as_ref().and_then(|s| s.enabled) == Some(true);
    let deps: [(bool, &str, &Option<FeatureState>, &str); 5] = [
        (on(&hv.evmcs), "evmcs", &hv.vapic, "vapic"),
        (on(&hv.ipi), "ipi", &hv.vpindex, "vpindex"),
        (
            hv.tlbflush.as_ref().and_then(|t| t.enabled) == Some(true),
            "tlbflush",
            &hv.vpindex,
            "vpindex",
        ),
        (
            hv.synictimer.as_ref().and_then(|t| t.enabled) == Some(true),
            "synictimer",
            &hv.synic,
            "synic",
        ),
        (on(&hv.synic), "synic", &hv.vpindex, "vpindex"),
    ];
    for (enabled, name, dep, dep_name) in deps {
        if enabled && !on(dep) {
            e.add(
                format!("{p}.{name}"),
                format!("requires '{p}.{dep_name}', which was disabled"),
            );
        }
    }
    if let Some(s) = &hv.spinlocks {
        if s.retries.is_some_and(|r| r < 4095) {
            e.add(
                format!("{p}.spinlocks.spinlocks"),
                "must be greater than or equal to 4095",
            );
        }
    }
    if let Some(v) = hv.vendorid.as_ref().and_then(|v| v.vendorid.as_ref()) {
        if v.len() > 12 || !v.bytes().all(|c| c.is_ascii_alphanumeric()) {
            e.add(
                format!("{p}.vendorid.vendorid"),
                "must be at most 12 alphanumeric characters",
            );
        }
    }
}

fn validate_clock(spec: &VmiSpec, e: &mut Errors) {
    let Some(clock) = &spec.domain.clock else {
        return;
    };
    if clock.utc.is_some() && clock.timezone.is_some() {
        e.add("spec.domain.clock", "must set only one of utc or timezone");
    }
    if let Some(tz) = &clock.timezone {
        if tz.is_empty()
            || tz.starts_with('/')
            || tz.split('/').any(|c| c == "..")
            || !tz
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"/_-+".contains(&c))
        {
            e.add("spec.domain.clock.timezone", "invalid time zone name");
        }
    }
    if let Some(t) = &clock.timer {
        let p = "spec.domain.clock.timer";
        if let Some(h) = &t.hpet {
            if !one_of(&h.tick_policy, &["delay", "catchup", "merge", "discard"]) {
                e.add(
                    format!("{p}.hpet.tickPolicy"),
                    "must be one of delay, catchup, merge, discard",
                );
            }
        }
        if let Some(x) = &t.pit {
            if !one_of(&x.tick_policy, &["delay", "catchup", "discard"]) {
                e.add(
                    format!("{p}.pit.tickPolicy"),
                    "must be one of delay, catchup, discard",
                );
            }
        }
        if let Some(r) = &t.rtc {
            if !one_of(&r.tick_policy, &["delay", "catchup"]) {
                e.add(
                    format!("{p}.rtc.tickPolicy"),
                    "must be one of delay, catchup",
                );
            }
            if !one_of(&r.track, &["guest", "wall"]) {
                e.add(format!("{p}.rtc.track"), "must be one of guest, wall");
            }
        }
    }
}

fn volume_names(spec: &VmiSpec) -> Vec<&str> {
    spec.volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect()
}

fn validate_disks(spec: &VmiSpec, e: &mut Errors, boot: &mut BTreeMap<u32, String>) {
    let volumes = volume_names(spec);
    let disks = spec.domain.devices.disks.as_deref().unwrap_or(&[]);
    for (i, disk) in disks.iter().enumerate() {
        let p = format!("spec.domain.devices.disks[{i}]");
        if let Some(j) = disks[..i].iter().position(|d| d.name == disk.name) {
            e.add(
                format!("{p}.name"),
                format!("duplicates the name of spec.domain.devices.disks[{j}]"),
            );
        }
        if !is_dns_label(&disk.name) {
            e.add(format!("{p}.name"), DNS_LABEL_REASON);
        } else if !volumes.contains(&disk.name.as_str()) {
            e.add(
                format!("{p}.name"),
                format!("no volume named '{}'", disk.name),
            );
        }
        let targets = [
            ("disk", disk.disk.as_ref().map(|t| &t.bus)),
            ("lun", disk.lun.as_ref().map(|t| &t.bus)),
            ("cdrom", disk.cdrom.as_ref().map(|t| &t.bus)),
        ];
        let set: Vec<_> = targets.iter().filter(|(_, b)| b.is_some()).collect();
        if set.len() > 1 {
            e.add(p.clone(), "can only have a single target type defined");
        }
        let (kind, bus) = match set.first() {
            Some((k, Some(b))) => (*k, b.as_deref().unwrap_or("")),
            _ => ("disk", ""),
        };
        if !bus.is_empty() {
            if !DISK_BUSES.contains(&bus) {
                e.add(
                    format!("{p}.{kind}.bus"),
                    format!("unrecognized bus {bus:?}, must be one of: virtio, scsi, sata, usb"),
                );
            } else if kind == "cdrom" && bus == "virtio" {
                e.add(
                    format!("{p}.cdrom.bus"),
                    "bus virtio is invalid for a CD-ROM",
                );
            } else if kind == "disk"
                && bus == "sata"
                && disk.disk.as_ref().and_then(|d| d.read_only) == Some(true)
            {
                e.add(
                    format!("{p}.disk.bus"),
                    "sata hard-disks do not support read-only",
                );
            }
            if disk.dedicated_io_thread == Some(true) && bus != "virtio" {
                e.add(
                    format!("{p}.dedicatedIOThread"),
                    format!("IOThreads are not supported for disks on a {bus} bus"),
                );
            }
        }
        if let Some(pci) = disk.disk.as_ref().and_then(|d| d.pci_address.as_ref()) {
            if bus != "virtio" {
                e.add(
                    format!("{p}.disk.pciAddress"),
                    "a PCI address is only possible with bus virtio",
                );
            }
            if !is_pci_address(pci) {
                e.add(
                    format!("{p}.disk.pciAddress"),
                    format!("malformed PCI address {pci:?}"),
                );
            }
        }
        let is_metrics = spec
            .volumes
            .iter()
            .flatten()
            .any(|v| v.name == disk.name && v.downward_metrics.is_some());
        if is_metrics {
            match &disk.disk {
                None => e.add(
                    format!("{p}.disk"),
                    "a downwardMetrics volume must be mapped to a disk",
                ),
                Some(d) if d.bus.as_deref().is_some_and(|b| b != "virtio") => e.add(
                    format!("{p}.disk.bus"),
                    "a downwardMetrics volume must be on bus virtio",
                ),
                Some(_) => {}
            }
        }
        check_boot_order(e, boot, disk.boot_order, &p);
        if let Some(serial) = &disk.serial {
            if !serial
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"_.+-".contains(&c))
            {
                e.add(
                    format!("{p}.serial"),
                    "must be made up of the characters [A-Za-z0-9_.+-]",
                );
            } else if serial.len() > MAX_SERIAL_LEN {
                e.add(format!("{p}.serial"), "must be at most 256 characters long");
            }
        }
        if !one_of(&disk.cache, &["none", "writethrough", "writeback"]) {
            e.add(
                format!("{p}.cache"),
                "must be one of none, writethrough, writeback",
            );
        }
        if !one_of(&disk.io, &["native", "threads"]) {
            e.add(format!("{p}.io"), "must be one of native, threads");
        }
        if !one_of(
            &disk.error_policy,
            &["stop", "ignore", "report", "enospace"],
        ) {
            e.add(
                format!("{p}.errorPolicy"),
                "must be one of stop, ignore, report, enospace",
            );
        }
        if let Some(cd) = &disk.cdrom {
            if !one_of(&cd.tray, &["open", "closed"]) {
                e.add(format!("{p}.cdrom.tray"), "must be one of open, closed");
            }
        }
        if let Some(custom) = disk.block_size.as_ref().and_then(|b| b.custom.as_ref()) {
            for (name, v) in [("logical", custom.logical), ("physical", custom.physical)] {
                let v = v.unwrap_or(0);
                if !(512..=2_097_152).contains(&v) || !v.is_power_of_two() {
                    e.add(
                        format!("{p}.blockSize.custom.{name}"),
                        "must be a power of two between 512 and 2097152",
                    );
                }
            }
            if custom.logical.unwrap_or(0) > custom.physical.unwrap_or(0) {
                e.add(
                    format!("{p}.blockSize.custom.logical"),
                    "must not exceed physical",
                );
            }
        }
    }
}

fn check_boot_order(
    e: &mut Errors,
    boot: &mut BTreeMap<u32, String>,
    order: Option<u32>,
    owner: &str,
) {
    let Some(order) = order else { return };
    if order < 1 {
        e.add(format!("{owner}.bootOrder"), "must be greater than 0");
        return;
    }
    if let Some(other) = boot.get(&order) {
        e.add(
            format!("{owner}.bootOrder"),
            format!("boot order {order} is already used by {other}"),
        );
    } else {
        boot.insert(order, owner.to_string());
    }
}

fn validate_volumes(spec: &VmiSpec, e: &mut Errors) {
    let volumes = spec.volumes.as_deref().unwrap_or(&[]);
    let devices = &spec.domain.devices;
    let users: Vec<&str> = devices
        .disks
        .iter()
        .flatten()
        .map(|d| d.name.as_str())
        .chain(
            devices
                .filesystems
                .iter()
                .flatten()
                .map(|f| f.name.as_str()),
        )
        .collect();
    for (i, v) in volumes.iter().enumerate() {
        let p = format!("spec.volumes[{i}]");
        if let Some(j) = volumes[..i].iter().position(|o| o.name == v.name) {
            e.add(
                format!("{p}.name"),
                format!("duplicates the name of spec.volumes[{j}]"),
            );
        }
        if !is_dns_label(&v.name) {
            e.add(format!("{p}.name"), DNS_LABEL_REASON);
        } else if v.memory_dump.is_none() && !users.contains(&v.name.as_str()) {
            e.add(
                format!("{p}.name"),
                "no disk or filesystem uses this volume",
            );
        }
        let kinds = v.source_kinds();
        if kinds.len() != 1 {
            e.add(
                p.clone(),
                format!(
                    "must have exactly one source type set (found {})",
                    if kinds.is_empty() {
                        "none".to_string()
                    } else {
                        kinds.join(", ")
                    }
                ),
            );
        }
        if let Some(cd) = &v.container_disk {
            if cd.image.is_empty() {
                e.add(format!("{p}.containerDisk.image"), "is required");
            }
            if let Some(path) = &cd.path {
                if !is_safe_abs_path(path) {
                    e.add(
                        format!("{p}.containerDisk.path"),
                        "must be an absolute path without '..'",
                    );
                }
            }
            if !one_of(&cd.image_pull_policy, &["Always", "Never", "IfNotPresent"]) {
                e.add(
                    format!("{p}.containerDisk.imagePullPolicy"),
                    "must be one of Always, Never, IfNotPresent",
                );
            }
        }
        if let Some(ed) = &v.empty_disk {
            let cp = format!("{p}.emptyDisk.capacity");
            match &ed.capacity {
                None => e.add(cp, "is required"),
                Some(q) => match q.to_bytes() {
                    Err(err) => e.add(cp, err.to_string()),
                    Ok(0) => e.add(cp, "must be greater than 0"),
                    Ok(_) => {}
                },
            }
        }
        if let Some(hd) = &v.host_disk {
            if !is_safe_abs_path(&hd.path) {
                e.add(
                    format!("{p}.hostDisk.path"),
                    "must be an absolute path without '..'",
                );
            }
            match hd.r#type.as_str() {
                "Disk" => {}
                "DiskOrCreate" => match hd.capacity.as_ref().map(|q| q.to_bytes()) {
                    None => e.add(
                        format!("{p}.hostDisk.capacity"),
                        "is required for type DiskOrCreate",
                    ),
                    Some(Err(err)) => e.add(format!("{p}.hostDisk.capacity"), err.to_string()),
                    Some(Ok(_)) => {}
                },
                _ => e.add(
                    format!("{p}.hostDisk.type"),
                    "must be one of Disk, DiskOrCreate",
                ),
            }
        }
        for (name, ci) in [
            ("cloudInitNoCloud", &v.cloud_init_no_cloud),
            ("cloudInitConfigDrive", &v.cloud_init_config_drive),
        ] {
            let Some(ci) = ci else { continue };
            let cp = format!("{p}.{name}");
            let user = [
                ci.user_data_secret_ref.is_some(),
                ci.user_data_base64.is_some(),
                ci.user_data.is_some(),
            ]
            .iter()
            .filter(|b| **b)
            .count();
            let network = [
                ci.network_data_secret_ref.is_some(),
                ci.network_data_base64.is_some(),
                ci.network_data.is_some(),
            ]
            .iter()
            .filter(|b| **b)
            .count();
            if user > 1 {
                e.add(cp.clone(), "must have only one userdata source set");
            }
            if user == 0 && network == 0 {
                e.add(cp.clone(), "must have a userdata or networkdata source");
            }
            if network > 1 {
                e.add(cp.clone(), "must have only one networkdata source set");
            }
            if ci
                .user_data_base64
                .as_deref()
                .is_some_and(|s| !is_base64(s))
            {
                e.add(format!("{cp}.userDataBase64"), "is not valid base64");
            }
            if ci
                .network_data_base64
                .as_deref()
                .is_some_and(|s| !is_base64(s))
            {
                e.add(format!("{cp}.networkDataBase64"), "is not valid base64");
            }
        }
        for (name, pvc) in [
            ("persistentVolumeClaim", &v.persistent_volume_claim),
            ("memoryDump", &v.memory_dump),
        ] {
            if pvc.as_ref().is_some_and(|c| c.claim_name.is_empty()) {
                e.add(format!("{p}.{name}.claimName"), "is required");
            }
        }
        if let Some(eph) = &v.ephemeral {
            if eph
                .persistent_volume_claim
                .as_ref()
                .is_none_or(|c| c.claim_name.is_empty())
            {
                e.add(
                    format!("{p}.ephemeral.persistentVolumeClaim.claimName"),
                    "is required",
                );
            }
        }
        if v.data_volume.as_ref().is_some_and(|d| d.name.is_empty()) {
            e.add(format!("{p}.dataVolume.name"), "is required");
        }
        if v.config_map.as_ref().is_some_and(|c| c.name.is_empty()) {
            e.add(format!("{p}.configMap.name"), "is required");
        }
        if v.secret.as_ref().is_some_and(|s| s.secret_name.is_empty()) {
            e.add(format!("{p}.secret.secretName"), "is required");
        }
        if let Some(cp) = &v.container_path {
            if !is_safe_abs_path(&cp.path) {
                e.add(
                    format!("{p}.containerPath.path"),
                    "must be an absolute path without '..'",
                );
            }
        }
    }
}

fn validate_interfaces(spec: &VmiSpec, e: &mut Errors, boot: &mut BTreeMap<u32, String>) {
    let networks = spec.networks.as_deref().unwrap_or(&[]);
    let ifaces = spec.domain.devices.interfaces.as_deref().unwrap_or(&[]);
    for (i, iface) in ifaces.iter().enumerate() {
        let p = format!("spec.domain.devices.interfaces[{i}]");
        if let Some(j) = ifaces[..i].iter().position(|o| o.name == iface.name) {
            e.add(
                format!("{p}.name"),
                format!("duplicates the name of spec.domain.devices.interfaces[{j}]"),
            );
        }
        let net = networks.iter().find(|n| n.name == iface.name);
        if iface.name.is_empty()
            || !iface
                .name
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        {
            e.add(
                format!("{p}.name"),
                "may only contain letters, digits, '-' and '_'",
            );
        } else if net.is_none() {
            e.add(
                format!("{p}.name"),
                format!("no network named '{}'", iface.name),
            );
        }
        let set = iface.bindings();
        if set.len() > 1 {
            e.add(
                p.clone(),
                format!(
                    "must have exactly one binding method (found {})",
                    set.join(", ")
                ),
            );
        } else if set.is_empty() {
            e.add(p.clone(), "must have a binding method");
        }
        for deprecated in ["slirp", "macvtap", "passt"] {
            if set.contains(&deprecated) {
                e.add(
                    format!("{p}.{deprecated}"),
                    format!("the {deprecated} binding is discontinued"),
                );
            }
        }
        if let Some(net) = net {
            if iface.masquerade.is_some() && net.pod.is_none() {
                e.add(
                    format!("{p}.masquerade"),
                    "masquerade is only possible on the pod network",
                );
            }
            if iface.passt_binding.is_some() && net.pod.is_none() {
                e.add(
                    format!("{p}.passtBinding"),
                    "passt is only possible on the pod network",
                );
            }
        }
        if let Some(b) = &iface.binding {
            if b.name.is_empty() {
                e.add(format!("{p}.binding.name"), "is required");
            }
        }
        if !one_of(&iface.model, &INTERFACE_MODELS) {
            e.add(
                format!("{p}.model"),
                format!("must be one of {}", INTERFACE_MODELS.join(", ")),
            );
        }
        if let Some(mac) = &iface.mac_address {
            if !is_mac_address(mac) {
                e.add(
                    format!("{p}.macAddress"),
                    format!("{mac:?} is not a valid MAC address (aa:bb:cc:dd:ee:ff)"),
                );
            }
        }
        if let Some(pci) = &iface.pci_address {
            if !is_pci_address(pci) {
                e.add(
                    format!("{p}.pciAddress"),
                    format!("malformed PCI address {pci:?}"),
                );
            }
        }
        check_boot_order(e, boot, iface.boot_order, &p);
        let ports = iface.ports.as_deref().unwrap_or(&[]);
        for (j, port) in ports.iter().enumerate() {
            let pp = format!("{p}.ports[{j}]");
            if port.port == 0 {
                e.add(format!("{pp}.port"), "is required");
            } else if !(1..=65535).contains(&port.port) {
                e.add(format!("{pp}.port"), "must be in range 0 < x < 65536");
            }
            if !one_of(&port.protocol, &["TCP", "UDP"]) {
                e.add(format!("{pp}.protocol"), "must be one of TCP, UDP");
            }
            if let Some(name) = &port.name {
                if ports[..j].iter().any(|o| o.name.as_ref() == Some(name)) {
                    e.add(
                        format!("{pp}.name"),
                        format!("duplicate port name {name:?}"),
                    );
                }
            }
        }
        if iface.port_ranges.is_some() && iface.ports.is_some() {
            e.add(
                format!("{p}.portRanges"),
                "cannot be set together with ports",
            );
        }
        for (j, r) in iface.port_ranges.iter().flatten().enumerate() {
            let rp = format!("{p}.portRanges[{j}]");
            if !(1..=65535).contains(&r.start) {
                e.add(format!("{rp}.start"), "must be in range 0 < x < 65536");
            }
            if !(1..=65535).contains(&r.end) {
                e.add(format!("{rp}.end"), "must be in range 0 < x < 65536");
            } else if r.start > r.end {
                e.add(format!("{rp}.start"), "must be less than or equal to end");
            }
        }
        if let Some(dhcp) = &iface.dhcp_options {
            for (j, o) in dhcp.private_options.iter().flatten().enumerate() {
                if !(224..=254).contains(&o.option) {
                    e.add(
                        format!("{p}.dhcpOptions.privateOptions[{j}].option"),
                        "must be in range 224..=254",
                    );
                }
            }
        }
        if !one_of(&iface.state, &["up", "down", "absent"]) {
            e.add(format!("{p}.state"), "must be one of up, down, absent");
        }
        if iface.acpi_index.is_some_and(|a| !(0..=16383).contains(&a)) {
            e.add(format!("{p}.acpiIndex"), "must be in range 0..=16383");
        }
    }
}

fn validate_networks(spec: &VmiSpec, e: &mut Errors) {
    let networks = spec.networks.as_deref().unwrap_or(&[]);
    let ifaces = spec.domain.devices.interfaces.as_deref().unwrap_or(&[]);
    let mut pod_seen = None;
    for (i, net) in networks.iter().enumerate() {
        let p = format!("spec.networks[{i}]");
        if let Some(j) = networks[..i].iter().position(|o| o.name == net.name) {
            e.add(
                format!("{p}.name"),
                format!("duplicates the name of spec.networks[{j}]"),
            );
        } else if !ifaces.iter().any(|f| f.name == net.name) {
            e.add(
                format!("{p}.name"),
                format!("no interface named '{}'", net.name),
            );
        }
        let sources = [
            net.pod.is_some(),
            net.multus.is_some(),
            net.resource_claim.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if sources != 1 {
            e.add(
                p.clone(),
                "must have exactly one source (pod, multus or resourceClaim)",
            );
        }
        if net.pod.is_some() {
            if let Some(j) = pod_seen {
                e.add(
                    format!("{p}.pod"),
                    format!("only one pod network is allowed (also spec.networks[{j}])"),
                );
            }
            pod_seen = Some(i);
        }
        if let Some(m) = &net.multus {
            if m.network_name.is_empty() {
                e.add(format!("{p}.multus.networkName"), "is required");
            }
        }
    }
}

fn validate_other_devices(spec: &VmiSpec, e: &mut Errors) {
    let dev = &spec.domain.devices;
    for (i, input) in dev.inputs.iter().flatten().enumerate() {
        let p = format!("spec.domain.devices.inputs[{i}]");
        if !one_of(&input.bus, &["usb", "virtio"]) {
            e.add(format!("{p}.bus"), "must be one of usb, virtio");
        }
        if !["tablet", "keyboard"].contains(&input.r#type.as_str()) {
            e.add(format!("{p}.type"), "must be one of tablet, keyboard");
        }
        if input.name.is_empty() {
            e.add(format!("{p}.name"), "is required");
        }
    }
    if let Some(w) = &dev.watchdog {
        let p = "spec.domain.devices.watchdog";
        if w.name.is_empty() {
            e.add(format!("{p}.name"), "is required");
        }
        match (&w.i6300esb, &w.diag288) {
            (Some(_), Some(_)) => e.add(p, "must have exactly one watchdog model"),
            (None, None) => e.add(p, "must have a watchdog model (i6300esb)"),
            _ => {}
        }
        for (model, action) in [("i6300esb", &w.i6300esb), ("diag288", &w.diag288)] {
            if let Some(a) = action {
                if !one_of(&a.action, &["poweroff", "reset", "shutdown"]) {
                    e.add(
                        format!("{p}.{model}.action"),
                        "must be one of poweroff, reset, shutdown",
                    );
                }
            }
        }
    }
    if let Some(s) = &dev.sound {
        if s.name.is_empty() {
            e.add("spec.domain.devices.sound.name", "is required");
        }
        if !one_of(&s.model, &["ich9", "ac97"]) {
            e.add(
                "spec.domain.devices.sound.model",
                "must be one of ich9, ac97",
            );
        }
    }
    let volumes = volume_names(spec);
    let disks = dev.disks.as_deref().unwrap_or(&[]);
    for (i, fs) in dev.filesystems.iter().flatten().enumerate() {
        let p = format!("spec.domain.devices.filesystems[{i}]");
        if !volumes.contains(&fs.name.as_str()) {
            e.add(
                format!("{p}.name"),
                format!("no volume named '{}'", fs.name),
            );
        }
        if disks.iter().any(|d| d.name == fs.name) {
            e.add(format!("{p}.name"), "is also used by a disk");
        }
        if fs.virtiofs.is_none() {
            e.add(format!("{p}.virtiofs"), "is required");
        }
    }
    if let Some(v) = dev.video.as_ref().and_then(|v| v.r#type.as_ref()) {
        if !["vga", "cirrus", "virtio", "ramfb", "bochs"].contains(&v.as_str()) {
            e.add(
                "spec.domain.devices.video.type",
                "must be one of vga, cirrus, virtio, ramfb, bochs",
            );
        }
    }
    for (i, pd) in dev.panic_devices.iter().flatten().enumerate() {
        if !one_of(&pd.model, &["hyperv", "isa", "pvpanic"]) {
            e.add(
                format!("spec.domain.devices.panicDevices[{i}].model"),
                "must be one of hyperv, isa, pvpanic",
            );
        }
    }
}
