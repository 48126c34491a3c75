//! Rules for the other devices: inputs, watchdog, sound, filesystems, video, panic devices
//! (`vmi-create-admitter.go`).

use super::storage::volume_names;
use super::syntax::*;
use super::*;

pub(super) fn validate_other_devices(spec: &VmiSpec, e: &mut Errors) {
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
