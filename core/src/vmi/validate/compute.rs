//! Rules for the CPU, memory, firmware, features (Hyper-V) and clock
//! (`vmi-create-admitter.go`, `pkg/defaults/hyperv.go`).

use super::syntax::*;
use super::*;

pub(super) fn validate_cpu(spec: &VmiSpec, e: &mut Errors) {
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

pub(super) fn validate_memory(spec: &VmiSpec, e: &mut Errors) {
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

pub(super) fn validate_firmware(spec: &VmiSpec, e: &mut Errors) {
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

pub(super) fn validate_features(spec: &VmiSpec, e: &mut Errors) {
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

pub(super) fn validate_clock(spec: &VmiSpec, e: &mut Errors) {
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
