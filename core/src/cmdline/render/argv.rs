//! `argv(&DomainPlan)`: the QEMU command line, in libvirt's order (`qemu_command.c`,
//! `qemuBuildCommandLine`). JSON for `-device`, `-blockdev`, `-netdev`, `-object`, `-audiodev`;
//! key=value (through [`KeyVal`]) for the rest.

use super::device_arg;
use crate::cmdline::plan::{Accel, Backend, DomainPlan, FirmwarePlan, WatchdogAction};
use crate::cmdline::qemu::KeyVal;

fn json_arg<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// The QEMU argv, without the binary name.
///
/// Always contains `-S`, `-no-user-config`, `-nodefaults` and the QMP monitor (when the plan has
/// one). QEMU 7.2 spells ACPI/HPET off as `-no-acpi`/`-no-hpet`; 10.x as machine options, and
/// gets `clusters=1` in `-smp` as libvirt 11 writes it for KubeVirt's `<topology>`.
pub fn argv(plan: &DomainPlan) -> Vec<String> {
    let mut a: Vec<String> = Vec::with_capacity(128);
    let mut push = |k: &str, v: String| {
        a.push(k.to_string());
        a.push(v);
    };
    let modern = plan.qemu.at_least(8, 0);

    push(
        "-name",
        KeyVal::new()
            .kv("guest", &plan.name)
            .on_off("debug-threads", true)
            .finish(),
    );
    a.push("-S".into());
    let mut push = |k: &str, v: String| {
        a.push(k.to_string());
        a.push(v);
    };

    if let FirmwarePlan::Efi { blockdevs, .. } = &plan.firmware {
        for b in blockdevs {
            push("-blockdev", json_arg(b));
        }
    }

    let m = &plan.machine;
    let mut kv = KeyVal::with_head(&m.machine_type).on_off("usb", false);
    if m.vmport_off {
        kv = kv.on_off("vmport", false);
    }
    if let Some(smm) = m.smm {
        kv = kv.on_off("smm", smm);
    }
    if m.kernel_irqchip_split {
        kv = kv.kv("kernel_irqchip", "split");
    }
    kv = kv.on_off("dump-guest-core", false);
    kv = kv.opt(
        "confidential-guest-support",
        m.confidential_guest_support.as_ref(),
    );
    kv = kv.opt("memory-backend", m.memory_backend.as_ref());
    kv = kv.opt("pflash0", m.pflash0.as_ref());
    kv = kv.opt("pflash1", m.pflash1.as_ref());
    if modern {
        if m.hpet == Some(false) {
            kv = kv.on_off("hpet", false);
        }
        if !m.acpi {
            kv = kv.on_off("acpi", false);
        }
    }
    if m.graphics_off {
        kv = kv.on_off("graphics", false);
    }
    push("-machine", kv.finish());
    push(
        "-accel",
        match plan.accel {
            Accel::Kvm => "kvm".into(),
            Accel::Tcg => "tcg".into(),
        },
    );

    // -cpu: model and flags are validated names and comma-free values (the -cpu parser has no
    // comma escape; `devices::cpu` refuses a comma, so the keyval writer never doubles one here).
    let cpu = plan
        .cpu
        .flags
        .iter()
        .fold(KeyVal::with_head(&plan.cpu.model), |kv, f| {
            kv.kv(&f.name, &f.value)
        });
    push("-cpu", cpu.finish());
    if let FirmwarePlan::Rom(rom) = &plan.firmware {
        push("-bios", rom.clone());
    }

    let mem = &plan.memory;
    let mut kv = KeyVal::new().kv("size", format!("{}k", mem.size / 1024));
    if let Some(max) = mem.maxmem {
        kv = kv.kv("slots", "0").kv("maxmem", format!("{}k", max / 1024));
    }
    push("-m", kv.finish());
    if let Some(b) = &mem.backend {
        push("-object", json_arg(b));
    }
    push("-overcommit", "mem-lock=off".into());
    let s = &plan.smp;
    // The first socket only with CPU hotplug; the other boot vCPUs are plugged before `cont`.
    let mut kv = KeyVal::with_head(&s.stable.to_string());
    if s.maxcpus != s.stable {
        kv = kv.kv("maxcpus", s.maxcpus.to_string());
    }
    push(
        "-smp",
        kv.kv("sockets", s.sockets.to_string())
            .kv("dies", "1")
            .opt("clusters", modern.then_some("1"))
            .kv("cores", s.cores.to_string())
            .kv("threads", s.threads.to_string())
            .finish(),
    );
    for o in &plan.objects {
        push("-object", json_arg(o));
    }
    if let Some(n) = &mem.numa {
        push(
            "-numa",
            KeyVal::with_head("node")
                .kv("nodeid", "0")
                .kv("cpus", &n.cpus)
                .kv("memdev", &n.memdev)
                .finish(),
        );
    }
    push("-uuid", plan.uuid.clone());
    for t in &plan.smbios {
        let mut kv = KeyVal::new().kv("type", t.table.to_string());
        for (k, v) in &t.fields {
            kv = kv.kv(k, v);
        }
        push("-smbios", kv.finish());
    }
    if let Some(k) = &plan.kernel_boot {
        if let Some(p) = &k.kernel {
            push("-kernel", p.clone());
        }
        if let Some(p) = &k.initrd {
            push("-initrd", p.clone());
        }
        if let Some(p) = &k.append {
            push("-append", p.clone());
        }
    }
    push("-display", "none".into());
    a.push("-no-user-config".into());
    a.push("-nodefaults".into());
    let mut push = |k: &str, v: String| {
        a.push(k.to_string());
        a.push(v);
    };
    if let Some(mon) = &plan.monitor {
        push("-chardev", mon.to_arg());
        push(
            "-mon",
            KeyVal::new()
                .kv("chardev", &mon.id)
                .kv("id", "monitor")
                .kv("mode", "control")
                .finish(),
        );
    }
    push(
        "-rtc",
        KeyVal::new()
            .kv("base", &plan.rtc.base)
            .opt("clock", plan.rtc.clock)
            .opt("driftfix", plan.rtc.driftfix)
            .finish(),
    );
    for g in &plan.globals {
        push(
            "-global",
            KeyVal::new()
                .kv("driver", g.driver)
                .kv("property", g.property)
                .kv("value", &g.value)
                .finish(),
        );
    }
    if !modern {
        if plan.machine.hpet == Some(false) {
            a.push("-no-hpet".into());
        }
        if !plan.machine.acpi {
            a.push("-no-acpi".into());
        }
    }
    a.push("-no-shutdown".into());
    if plan.no_reboot {
        a.push("-no-reboot".into());
    }
    let mut push = |k: &str, v: String| {
        a.push(k.to_string());
        a.push(v);
    };
    let boot = KeyVal::new().on_off("strict", true);
    let boot = if plan.boot_menu {
        boot.on_off("menu", true).kv("splash-time", "10000")
    } else {
        boot
    };
    push("-boot", boot.finish());

    for d in &plan.devices {
        match &d.backend {
            Backend::None => {}
            Backend::Blockdevs(bs) => {
                for b in bs {
                    push("-blockdev", json_arg(b));
                }
            }
            Backend::Netdev { argv, .. } => push("-netdev", json_arg(argv)),
            Backend::Chardev(c) => push("-chardev", c.to_arg()),
            Backend::Object(o) => push("-object", json_arg(o)),
            Backend::Tpm { chardev, tpmdev_id } => {
                push("-chardev", chardev.to_arg());
                push(
                    "-tpmdev",
                    KeyVal::with_head("emulator")
                        .kv("id", tpmdev_id)
                        .kv("chardev", &chardev.id)
                        .finish(),
                );
            }
        }
        if plan.audiodev && d.class == crate::cmdline::plan::DeviceClass::Video {
            // libvirt emits the audiodev and VNC just before the video adapter.
            push("-audiodev", r#"{"id":"audio1","driver":"none"}"#.into());
            if let Some(v) = &plan.vnc {
                push(
                    "-vnc",
                    KeyVal::new()
                        .kv("vnc", format!("unix:{v}"))
                        .kv("audiodev", "audio1")
                        .finish(),
                );
            }
        }
        push("-device", device_arg(d));
        if d.class == crate::cmdline::plan::DeviceClass::Watchdog {
            // libvirt follows the watchdog device with its action.
            if let Some(act) = plan.watchdog_action {
                push("-watchdog-action", watchdog_action(act).into());
            }
        }
    }
    let has_video = plan
        .devices
        .iter()
        .any(|d| d.class == crate::cmdline::plan::DeviceClass::Video);
    if !has_video && plan.audiodev {
        push("-audiodev", r#"{"id":"audio1","driver":"none"}"#.into());
        if let Some(v) = &plan.vnc {
            push(
                "-vnc",
                KeyVal::new()
                    .kv("vnc", format!("unix:{v}"))
                    .kv("audiodev", "audio1")
                    .finish(),
            );
        }
    }
    if let Some(ls) = &plan.launch_security {
        push("-object", json_arg(ls));
    }
    push(
        "-sandbox",
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny".into(),
    );
    push("-msg", "timestamp=on".into());
    a
}

fn watchdog_action(act: WatchdogAction) -> &'static str {
    match act {
        WatchdogAction::Reset => "reset",
        WatchdogAction::Poweroff => "poweroff",
        WatchdogAction::Pause => "pause",
        WatchdogAction::None => "none",
        WatchdogAction::InjectNmi => "inject-nmi",
        WatchdogAction::Shutdown => "shutdown",
    }
}

/// Quotes one word for a POSIX shell (single quotes; `'` becomes `'\''`). Plain words made of
/// `[A-Za-z0-9_./:=,@%+-]` stay bare.
pub fn shell_quote(w: &str) -> String {
    let plain = !w.is_empty()
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_./:=,@%+-".contains(&b));
    if plain {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}

/// The command as one shell line, one option per line (`\` continuations), like libvirt's
/// `.args` files: `binary` then every argv word quoted with [`shell_quote`]. For display only;
/// qlauncher never runs a shell.
pub fn shell_line(binary: &str, plan: &DomainPlan) -> String {
    let mut out = String::new();
    for (k, v) in &plan.env {
        out.push_str(&format!("{}={} \\\n", k, shell_quote(v)));
    }
    out.push_str(&shell_quote(binary));
    for w in argv(plan) {
        if w.starts_with('-') && !w.starts_with("-{") {
            out.push_str(" \\\n");
        } else {
            out.push(' ');
        }
        out.push_str(&shell_quote(&w));
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quote_keeps_plain_words_and_quotes_the_rest() {
        assert_eq!(shell_quote("-machine"), "-machine");
        assert_eq!(shell_quote("{\"a\":1}"), "'{\"a\":1}'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a\nb"), "'a\nb'");
    }
}
