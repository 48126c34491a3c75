//! Rules for disks, boot order and volumes (`pkg/storage/admitters/disks.go`,
//! `vmi-create-admitter.go`), and the launcher's safe-path rule for image paths.

use std::collections::BTreeMap;

use super::syntax::*;
use super::*;

pub(super) fn volume_names(spec: &VmiSpec) -> Vec<&str> {
    spec.volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect()
}

pub(super) fn validate_disks(spec: &VmiSpec, e: &mut Errors, boot: &mut BTreeMap<u32, String>) {
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
            // A lun without a bus is on scsi (the converter's default, as KubeVirt's).
            let serial_bus = if bus.is_empty() && kind == "lun" {
                "scsi"
            } else {
                bus
            };
            if let Err(reason) = check_disk_serial(serial, serial_bus) {
                e.add(format!("{p}.serial"), reason);
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

pub(super) fn validate_volumes(spec: &VmiSpec, e: &mut Errors) {
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
        validate_volume_name(volumes, i, &users, &p, e);
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
            validate_container_disk(cd, &p, e);
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
            validate_host_disk(hd, &p, e);
        }
        for (name, ci) in [
            ("cloudInitNoCloud", &v.cloud_init_no_cloud),
            ("cloudInitConfigDrive", &v.cloud_init_config_drive),
        ] {
            if let Some(ci) = ci {
                validate_cloud_init(ci, &format!("{p}.{name}"), e);
            }
        }
        validate_references(v, &p, e);
    }
}

/// A volume's name (`spec.volumes[i]` at `p`): unique, a DNS label, and used by a disk or a
/// filesystem (`users`), unless the volume is a memory dump's.
fn validate_volume_name(volumes: &[Volume], i: usize, users: &[&str], p: &str, e: &mut Errors) {
    let v = &volumes[i];
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
}

/// A containerDisk: an image, a safe absolute path inside it when given, and a known pull
/// policy.
fn validate_container_disk(cd: &ContainerDiskSource, p: &str, e: &mut Errors) {
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

/// A hostDisk: a safe absolute path, and type `Disk` or `DiskOrCreate` (which needs a
/// capacity).
fn validate_host_disk(hd: &HostDisk, p: &str, e: &mut Errors) {
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

/// A cloud-init source (NoCloud or ConfigDrive, at `cp`): at most one userdata and one
/// networkdata source, at least one of the two, and valid base64 where it is base64.
fn validate_cloud_init(ci: &CloudInitSource, cp: &str, e: &mut Errors) {
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
        e.add(cp.to_string(), "must have only one userdata source set");
    }
    if user == 0 && network == 0 {
        e.add(cp.to_string(), "must have a userdata or networkdata source");
    }
    if network > 1 {
        e.add(cp.to_string(), "must have only one networkdata source set");
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

/// The sources that name another object: the claim of a PVC, memory dump or ephemeral
/// volume, a DataVolume, ConfigMap or Secret name, each required; a containerPath's safe
/// absolute path.
fn validate_references(v: &Volume, p: &str, e: &mut Errors) {
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
