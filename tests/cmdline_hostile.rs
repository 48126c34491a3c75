//! Hostile values: every string field of a VMI that reaches the converter gets commas, `=`,
//! quotes, newlines, `../` and very long values. Each conversion must either be rejected with
//! the field's path, or render harmlessly: the argv has the same words as for a benign value,
//! every JSON word parses to an object with the same keys, and every key=value word splits
//! (QEMU's rules: `,,` is a literal comma) into the same keys.

// The converter context the fuzz targets use: a tap fd for every interface.
use testkit::fuzz;

use qlauncher::cmdline::{convert, render};
use qlauncher::vmi::Vmi;
use serde_json::{json, Value};

fn base() -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm", "namespace": "ns", "uid": "u1",
                     "annotations": {"kubevirt.io/pci-interface-slot-count": "4"}},
        "spec": {
            "domain": {
                "machine": {"type": "q35"},
                "cpu": {"model": "qemu64", "features": [{"name": "pdpe1gb", "policy": "require"}]},
                "memory": {"guest": "256Mi"},
                "firmware": {
                    "uuid": "11111111-2222-4333-8444-555555555555",
                    "serial": "SER1",
                    "kernelBoot": {"kernelArgs": "console=ttyS0",
                                   "container": {"image": "k", "kernelPath": "/boot/vmlinuz", "initrdPath": "/boot/initrd"}}
                },
                "chassis": {"manufacturer": "M", "version": "V", "serial": "S", "asset": "A", "sku": "K"},
                "clock": {"timezone": "Europe/Berlin", "timer": {"rtc": {"tickPolicy": "catchup", "track": "guest"}}},
                "features": {"hyperv": {"vendorid": {"vendorid": "KubeVirt"}}},
                "rebootPolicy": "Reboot",
                "ioThreadsPolicy": "shared",
                "devices": {
                    "disks": [
                        {"name": "d1", "disk": {"bus": "virtio"}, "serial": "DS1", "cache": "writeback",
                         "io": "threads", "errorPolicy": "stop"},
                        {"name": "h1", "disk": {"bus": "sata"}}
                    ],
                    "interfaces": [{"name": "n1", "masquerade": {}, "macAddress": "02:00:00:00:00:01",
                                    "model": "virtio", "state": "up"}],
                    "inputs": [{"name": "t1", "type": "tablet", "bus": "usb"}],
                    "watchdog": {"name": "w1", "i6300esb": {"action": "reset"}},
                    "sound": {"name": "s1", "model": "ich9"},
                    "video": {"type": "vga"}
                }
            },
            "volumes": [
                {"name": "d1", "containerDisk": {"image": "img"}},
                {"name": "h1", "hostDisk": {"path": "/data/disk.img", "type": "Disk"}}
            ]
        }
    })
}

/// Splits a key=value argument as QEMU does: single commas separate, `,,` is a comma.
fn keyval_keys(arg: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut chars = arg.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                parts.last_mut().unwrap().push(',');
            } else {
                parts.push(String::new());
            }
        } else {
            parts.last_mut().unwrap().push(c);
        }
    }
    parts
        .iter()
        .enumerate()
        .map(|(i, p)| match p.split_once('=') {
            Some((k, _)) => k.to_string(),
            None if i == 0 => "<head>".into(),
            None => format!("<bare {p}>"),
        })
        .collect()
}

/// The structure of an argv: per word, its option name or its key set.
fn shape(argv: &[String]) -> Vec<String> {
    const FLAGS: &[&str] = &[
        "-S",
        "-no-user-config",
        "-nodefaults",
        "-no-shutdown",
        "-no-reboot",
        "-no-hpet",
        "-no-acpi",
    ];
    let mut out = Vec::new();
    let mut prev = "";
    let mut expect_value = false;
    for w in argv {
        let is_option = !expect_value;
        expect_value = is_option && !FLAGS.contains(&w.as_str());
        let s = if is_option {
            assert!(w.starts_with('-'), "option expected, got {w:?}");
            w.clone()
        } else if matches!(
            prev,
            "-uuid" | "-kernel" | "-initrd" | "-append" | "-accel" | "-watchdog-action"
        ) {
            format!("value of {prev}")
        } else if w.starts_with('{') {
            let v: Value = serde_json::from_str(w).expect("JSON word parses");
            let mut keys: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
            keys.sort();
            format!("json {keys:?}")
        } else if prev == "-cpu" {
            // The -cpu parser has no escape: its shape is the flag names.
            format!(
                "cpu {:?}",
                w.split(',')
                    .map(|f| f.split('=').next().unwrap_or(""))
                    .collect::<Vec<_>>()
            )
        } else {
            format!("kv {:?}", keyval_keys(w))
        };
        prev = w.as_str();
        out.push(s);
    }
    out
}

/// `("kv", keys)` from a shape entry such as `kv ["a", "b"]`.
fn split_shape(s: &str) -> (String, Vec<String>) {
    match s.split_once(' ') {
        Some((kind, rest)) if rest.starts_with('[') => {
            let keys: Vec<String> = serde_json::from_str(rest).unwrap_or_default();
            (kind.to_string(), keys)
        }
        _ => (s.to_string(), vec![]),
    }
}

#[test]
fn hostile_values_are_rejected_with_their_path_or_rendered_harmlessly() {
    let long = "x".repeat(5000);
    let benign_vmi: Vmi = serde_json::from_value(base()).unwrap();
    let benign_plan =
        convert(&benign_vmi, &fuzz::context_for(&benign_vmi)).expect("benign VMI converts");
    let benign = shape(&render::argv(&benign_plan));

    // (pointers that get the hostile value, field paths an error may name)
    let fields: &[(&[&str], &[&str])] = &[
        (&["/metadata/name"], &["metadata.name"]),
        (&["/metadata/namespace"], &["metadata.namespace"]),
        (&["/metadata/uid"], &["metadata.uid"]),
        (
            &["/metadata/annotations/kubevirt.io~1pci-interface-slot-count"],
            &["metadata.annotations"],
        ),
        (
            &["/spec/domain/machine/type"],
            &["spec.domain.machine.type"],
        ),
        (&["/spec/domain/cpu/model"], &["spec.domain.cpu.model"]),
        (
            &["/spec/domain/cpu/features/0/name"],
            &["spec.domain.cpu.features[0].name"],
        ),
        (
            &["/spec/domain/cpu/features/0/policy"],
            &["spec.domain.cpu.features[0].policy"],
        ),
        (
            &["/spec/domain/firmware/uuid"],
            &["spec.domain.firmware.uuid"],
        ),
        (
            &["/spec/domain/firmware/serial"],
            &["spec.domain.firmware.serial"],
        ),
        (
            &["/spec/domain/firmware/kernelBoot/kernelArgs"],
            &["spec.domain.firmware.kernelBoot.kernelArgs"],
        ),
        (
            &["/spec/domain/firmware/kernelBoot/container/kernelPath"],
            &["spec.domain.firmware.kernelBoot.container.kernelPath"],
        ),
        (
            &["/spec/domain/firmware/kernelBoot/container/initrdPath"],
            &["spec.domain.firmware.kernelBoot.container.initrdPath"],
        ),
        (
            &["/spec/domain/chassis/manufacturer"],
            &["spec.domain.chassis.manufacturer"],
        ),
        (
            &["/spec/domain/chassis/version"],
            &["spec.domain.chassis.version"],
        ),
        (
            &["/spec/domain/chassis/serial"],
            &["spec.domain.chassis.serial"],
        ),
        (
            &["/spec/domain/chassis/asset"],
            &["spec.domain.chassis.asset"],
        ),
        (&["/spec/domain/chassis/sku"], &["spec.domain.chassis.sku"]),
        (
            &["/spec/domain/clock/timezone"],
            &["spec.domain.clock.timezone"],
        ),
        (
            &["/spec/domain/clock/timer/rtc/tickPolicy"],
            &["spec.domain.clock.timer.rtc.tickPolicy"],
        ),
        (
            &["/spec/domain/clock/timer/rtc/track"],
            &["spec.domain.clock.timer.rtc.track"],
        ),
        (
            &["/spec/domain/features/hyperv/vendorid/vendorid"],
            &["spec.domain.features.hyperv.vendorid.vendorid"],
        ),
        (
            &["/spec/domain/rebootPolicy"],
            &["spec.domain.rebootPolicy"],
        ),
        (
            &["/spec/domain/ioThreadsPolicy"],
            &["spec.domain.ioThreadsPolicy"],
        ),
        (
            &["/spec/domain/devices/disks/0/name", "/spec/volumes/0/name"],
            &["spec.volumes[0].name", "spec.domain.devices.disks[0].name"],
        ),
        (
            &["/spec/domain/devices/disks/0/serial"],
            &["spec.domain.devices.disks[0].serial"],
        ),
        (
            &["/spec/domain/devices/disks/0/cache"],
            &["spec.domain.devices.disks[0].cache"],
        ),
        (
            &["/spec/domain/devices/disks/0/io"],
            &["spec.domain.devices.disks[0].io"],
        ),
        (
            &["/spec/domain/devices/disks/0/errorPolicy"],
            &["spec.domain.devices.disks[0].errorPolicy"],
        ),
        (
            &["/spec/domain/devices/disks/0/disk/bus"],
            &["spec.domain.devices.disks[0].disk.bus"],
        ),
        (
            &["/spec/volumes/1/hostDisk/path"],
            &["spec.volumes[1].hostDisk.path"],
        ),
        (
            &["/spec/domain/devices/interfaces/0/name"],
            &["spec.domain.devices.interfaces[0].name"],
        ),
        (
            &["/spec/domain/devices/interfaces/0/macAddress"],
            &["spec.domain.devices.interfaces[0].macAddress"],
        ),
        (
            &["/spec/domain/devices/interfaces/0/model"],
            &["spec.domain.devices.interfaces[0].model"],
        ),
        (
            &["/spec/domain/devices/interfaces/0/state"],
            &["spec.domain.devices.interfaces[0].state"],
        ),
        (
            &["/spec/domain/devices/inputs/0/name"],
            &["spec.domain.devices.inputs[0].name"],
        ),
        (
            &["/spec/domain/devices/inputs/0/type"],
            &["spec.domain.devices.inputs[0].type"],
        ),
        (
            &["/spec/domain/devices/inputs/0/bus"],
            &["spec.domain.devices.inputs[0].bus"],
        ),
        (
            &["/spec/domain/devices/watchdog/name"],
            &["spec.domain.devices.watchdog.name"],
        ),
        (
            &["/spec/domain/devices/watchdog/i6300esb/action"],
            &["spec.domain.devices.watchdog.i6300esb.action"],
        ),
        (
            &["/spec/domain/devices/sound/name"],
            &["spec.domain.devices.sound.name"],
        ),
        (
            &["/spec/domain/devices/sound/model"],
            &["spec.domain.devices.sound.model"],
        ),
        (
            &["/spec/domain/devices/video/type"],
            &["spec.domain.devices.video.type"],
        ),
    ];
    let mut rendered = 0;
    let mut rejected = 0;
    for (pointers, paths) in fields {
        for hostile in testkit::hostile::VALUES
            .iter()
            .copied()
            .chain(["", long.as_str()])
        {
            let mut v = base();
            for p in *pointers {
                *v.pointer_mut(p).unwrap_or_else(|| panic!("pointer {p}")) = json!(hostile);
            }
            let vmi: Vmi = serde_json::from_value(v).unwrap();
            let label = format!("{pointers:?} = {:?}", &hostile[..hostile.len().min(40)]);
            match convert(&vmi, &fuzz::context_for(&vmi)) {
                Err(e) => {
                    assert!(
                        paths.contains(&e.path().as_str()),
                        "{label}: error names {} ({e})",
                        e.path()
                    );
                    rejected += 1;
                }
                Ok(plan) => {
                    let argv = render::argv(&plan);
                    let got = shape(&argv);
                    if hostile.is_empty() {
                        // An empty value means "default" for several fields (bus, model): the
                        // argv may differ, but every word still parses (checked by `shape`).
                        rendered += 1;
                        continue;
                    }
                    assert_eq!(got.len(), benign.len(), "{label}: argv length changed");
                    for (g, b) in got.iter().zip(&benign) {
                        // Same option, same kind of word; keys may only be dropped (an empty
                        // value is left out), never added.
                        let (gk, gkeys) = split_shape(g);
                        let (bk, bkeys) = split_shape(b);
                        assert_eq!(gk, bk, "{label}: {g} vs {b}");
                        assert!(
                            gkeys.iter().all(|k| bkeys.contains(k)),
                            "{label}: {g} vs {b}"
                        );
                    }
                    // The JSON and QMP plan serialize.
                    serde_json::to_string(&render::qmp_plan(&plan)).unwrap();
                    rendered += 1;
                }
            }
        }
    }
    assert!(
        rejected > 0 && rendered > 0,
        "rejected {rejected}, rendered {rendered}"
    );
}
