//! `argv(&DomainPlan)`: the QEMU command line, in libvirt's order (`qemu_command.c`,
//! `qemuBuildCommandLine`). JSON for `-device`, `-blockdev`, `-netdev`, `-object`, `-audiodev`;
//! key=value (through [`KeyVal`]) for the rest.

use super::device_arg;
use crate::cmdline::plan::{
    Accel, Backend, DeviceClass, DomainPlan, FirmwarePlan, MachinePlan, PlannedDevice,
};
use crate::cmdline::qemu::KeyVal;

fn json_arg<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// The argv being written: switches with their one value, and bare flags, in order.
struct Argv(Vec<String>);

impl Argv {
    /// A switch and its value (`-machine pc-q35,...`).
    fn switch(&mut self, k: &str, v: String) {
        self.0.push(k.to_string());
        self.0.push(v);
    }

    /// A switch without a value (`-S`, `-nodefaults`).
    fn flag(&mut self, k: &str) {
        self.0.push(k.to_string());
    }
}

/// The QEMU argv, without the binary name.
///
/// Always contains `-S`, `-no-user-config`, `-nodefaults` and the QMP monitor (when the plan has
/// one). QEMU 7.2 spells ACPI/HPET off as `-no-acpi`/`-no-hpet`; 10.x as machine options, and
/// gets `clusters=1` in `-smp` as libvirt 11 writes it for KubeVirt's `<topology>`.
pub fn argv(plan: &DomainPlan) -> Vec<String> {
    let mut a = Argv(Vec::with_capacity(128));
    let modern = plan.qemu.at_least(8, 0);

    a.switch(
        "-name",
        KeyVal::new()
            .kv("guest", &plan.name)
            .on_off("debug-threads", true)
            .finish(),
    );
    a.flag("-S");
    if let FirmwarePlan::Efi { blockdevs, .. } = &plan.firmware {
        for b in blockdevs {
            a.switch("-blockdev", json_arg(b));
        }
    }
    a.switch("-machine", machine(&plan.machine, modern));
    a.switch(
        "-accel",
        match plan.accel {
            Accel::Kvm => "kvm".into(),
            Accel::Tcg => "tcg".into(),
        },
    );
    a.switch("-cpu", cpu(plan));
    if let FirmwarePlan::Rom(rom) = &plan.firmware {
        a.switch("-bios", rom.clone());
    }
    memory_and_smp(&mut a, plan, modern);
    identity_and_kernel(&mut a, plan);
    a.switch("-display", "none".into());
    a.flag("-no-user-config");
    a.flag("-nodefaults");
    monitor_clock_and_globals(&mut a, plan);
    power_management(&mut a, plan, modern);
    a.switch("-boot", boot(plan));
    devices(&mut a, plan);
    if let Some(ls) = &plan.launch_security {
        a.switch("-object", json_arg(ls));
    }
    // A hook's `qemu:commandline` args: verbatim words, where libvirt puts them (before -sandbox).
    a.0.extend(plan.extra_args.iter().cloned());
    a.switch(
        "-sandbox",
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny".into(),
    );
    a.switch("-msg", "timestamp=on".into());
    a.0
}

/// `-machine`'s value (libvirt's `qemuBuildMachineCommandLine`): the machine type, then USB,
/// vmport, SMM, the split irqchip, no guest core in dumps, the confidential-guest object, the
/// memory backend and the pflash nodes; HPET and ACPI off only on QEMU 8 and later (`modern`),
/// where they are machine options.
fn machine(m: &MachinePlan, modern: bool) -> String {
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
    kv.finish()
}

/// `-cpu`'s value (libvirt's `qemuBuildCpuCommandLine`): the model, then each flag.
///
/// Model and flags are validated names and comma-free values (the -cpu parser has no comma
/// escape; `devices::cpu` refuses a comma, so the keyval writer never doubles one here).
fn cpu(plan: &DomainPlan) -> String {
    plan.cpu
        .flags
        .iter()
        .fold(KeyVal::with_head(&plan.cpu.model), |kv, f| {
            kv.kv(&f.name, &f.value)
        })
        .finish()
}

/// Guest memory and vCPUs, as libvirt orders them: `-m` (size, and the hotplug slots and
/// `maxmem`), the memory backend `-object`, `-overcommit`, `-smp`, the plan's other objects, and
/// the one `-numa` node.
fn memory_and_smp(a: &mut Argv, plan: &DomainPlan, modern: bool) {
    let mem = &plan.memory;
    let mut kv = KeyVal::new().kv("size", format!("{}k", mem.size / 1024));
    if let Some(max) = mem.maxmem {
        kv = kv.kv("slots", "0").kv("maxmem", format!("{}k", max / 1024));
    }
    a.switch("-m", kv.finish());
    if let Some(b) = &mem.backend {
        a.switch("-object", json_arg(b));
    }
    a.switch("-overcommit", "mem-lock=off".into());
    a.switch("-smp", smp(plan, modern));
    for o in &plan.objects {
        a.switch("-object", json_arg(o));
    }
    if let Some(n) = &mem.numa {
        a.switch(
            "-numa",
            KeyVal::with_head("node")
                .kv("nodeid", "0")
                .kv("cpus", &n.cpus)
                .kv("memdev", &n.memdev)
                .finish(),
        );
    }
}

/// `-smp`'s value (libvirt's `qemuBuildSmpCommandLine`): the vCPUs QEMU starts with, `maxcpus`,
/// and the topology, with `clusters=1` on QEMU 8 and later.
///
/// With CPU hotplug QEMU starts with the first socket only; the other boot vCPUs are plugged
/// before `cont`.
fn smp(plan: &DomainPlan, modern: bool) -> String {
    let s = &plan.smp;
    let mut kv = KeyVal::with_head(&s.stable.to_string());
    if s.maxcpus != s.stable {
        kv = kv.kv("maxcpus", s.maxcpus.to_string());
    }
    kv.kv("sockets", s.sockets.to_string())
        .kv("dies", "1")
        .opt("clusters", modern.then_some("1"))
        .kv("cores", s.cores.to_string())
        .kv("threads", s.threads.to_string())
        .finish()
}

/// The domain's identity and direct kernel boot: `-uuid`, one `-smbios` per SMBIOS table, then
/// `-kernel`, `-initrd` and `-append`.
fn identity_and_kernel(a: &mut Argv, plan: &DomainPlan) {
    a.switch("-uuid", plan.uuid.clone());
    for t in &plan.smbios {
        let mut kv = KeyVal::new().kv("type", t.table.to_string());
        for (k, v) in &t.fields {
            kv = kv.kv(k, v);
        }
        a.switch("-smbios", kv.finish());
    }
    if let Some(k) = &plan.kernel_boot {
        if let Some(p) = &k.kernel {
            a.switch("-kernel", p.clone());
        }
        if let Some(p) = &k.initrd {
            a.switch("-initrd", p.clone());
        }
        if let Some(p) = &k.append {
            a.switch("-append", p.clone());
        }
    }
}

/// The QMP monitor (`-chardev` and `-mon`, libvirt's `qemuBuildMonitorCommandLine`), the clock
/// (`-rtc`, `qemuBuildClockCommandLine`) and the `-global` device properties.
fn monitor_clock_and_globals(a: &mut Argv, plan: &DomainPlan) {
    if let Some(mon) = &plan.monitor {
        a.switch("-chardev", mon.to_arg());
        a.switch(
            "-mon",
            KeyVal::new()
                .kv("chardev", &mon.id)
                .kv("id", "monitor")
                .kv("mode", "control")
                .finish(),
        );
    }
    a.switch(
        "-rtc",
        KeyVal::new()
            .kv("base", &plan.rtc.base)
            .opt("clock", plan.rtc.clock)
            .opt("driftfix", plan.rtc.driftfix)
            .finish(),
    );
    for g in &plan.globals {
        a.switch(
            "-global",
            KeyVal::new()
                .kv("driver", g.driver)
                .kv("property", g.property)
                .kv("value", &g.value)
                .finish(),
        );
    }
}

/// Power management and the guest's exit (libvirt's `qemuBuildPMCommandLine`): QEMU 7.2's
/// `-no-hpet`/`-no-acpi` (on QEMU 8 and later these are machine options), `-no-shutdown`, and
/// `-no-reboot` when the plan asks for it.
fn power_management(a: &mut Argv, plan: &DomainPlan, modern: bool) {
    if !modern {
        if plan.machine.hpet == Some(false) {
            a.flag("-no-hpet");
        }
        if !plan.machine.acpi {
            a.flag("-no-acpi");
        }
    }
    a.flag("-no-shutdown");
    if plan.no_reboot {
        a.flag("-no-reboot");
    }
}

/// `-boot`'s value (libvirt's `qemuBuildBootCommandLine`): strict boot order, and the boot menu
/// with its splash time when the plan shows one.
fn boot(plan: &DomainPlan) -> String {
    let boot = KeyVal::new().on_off("strict", true);
    let boot = if plan.boot_menu {
        boot.on_off("menu", true).kv("splash-time", "10000")
    } else {
        boot
    };
    boot.finish()
}

/// Every planned device in order: its backend, then its `-device`. libvirt puts the audiodev
/// and VNC just before the video adapter (or after the last device when there is none), and
/// follows the watchdog with its `-watchdog-action`.
fn devices(a: &mut Argv, plan: &DomainPlan) {
    for d in &plan.devices {
        backend(a, d);
        if d.class == DeviceClass::Video {
            audio_and_vnc(a, plan);
        }
        a.switch("-device", device_arg(d));
        if d.class == DeviceClass::Watchdog {
            if let Some(act) = plan.watchdog_action {
                a.switch("-watchdog-action", act.name().into());
            }
        }
    }
    if !plan.devices.iter().any(|d| d.class == DeviceClass::Video) {
        audio_and_vnc(a, plan);
    }
}

/// One device's backend: its block nodes, netdev, chardev, object, or the TPM emulator's
/// chardev and `-tpmdev`.
fn backend(a: &mut Argv, d: &PlannedDevice) {
    match &d.backend {
        Backend::None => {}
        Backend::Blockdevs(bs) => {
            for b in bs {
                a.switch("-blockdev", json_arg(b));
            }
        }
        Backend::Netdev { argv, .. } => a.switch("-netdev", json_arg(argv)),
        Backend::Chardev(c) => a.switch("-chardev", c.to_arg()),
        Backend::Object(o) => a.switch("-object", json_arg(o)),
        Backend::Tpm { chardev, tpmdev_id } => {
            a.switch("-chardev", chardev.to_arg());
            a.switch(
                "-tpmdev",
                KeyVal::with_head("emulator")
                    .kv("id", tpmdev_id)
                    .kv("chardev", &chardev.id)
                    .finish(),
            );
        }
    }
}

/// The silent `-audiodev` (when the plan has one) and the VNC server on its unix socket that
/// uses it.
fn audio_and_vnc(a: &mut Argv, plan: &DomainPlan) {
    if !plan.audiodev {
        return;
    }
    a.switch("-audiodev", r#"{"id":"audio1","driver":"none"}"#.into());
    if let Some(v) = &plan.vnc {
        a.switch(
            "-vnc",
            KeyVal::new()
                .kv("vnc", format!("unix:{v}"))
                .kv("audiodev", "audio1")
                .finish(),
        );
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
