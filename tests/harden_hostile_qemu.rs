//! Hostile strings reach QEMU intact: each hostile value of `firmware.kernelBoot.kernelArgs`
//! (free text, the one VMI string QEMU takes as a whole option value) and the VMI name that
//! passes validation is converted, QEMU 7.2 is started paused (`-S`) with the rendered argv,
//! and QMP shows the value arrived as one property: `qom-get /machine append` equals the
//! kernelArgs exactly and `query-name` the `<namespace>_<name>` guest name. A value that split
//! into an extra option would fail to start or change these. Needs the test guest's kernel
//! (`scripts/build-guest`).

use std::path::Path;
use std::time::Duration;

use qlauncher::cmdline::context::{MonitorSocket, QemuVersion};
use qlauncher::cmdline::{convert, render, ConverterContext};
use qlauncher::vmi::{DefaultsConfig, Vmi};
use serde_json::{json, Value};
use testkit::guest::{GuestImages, QemuChild};

/// Kernel arguments QEMU must pass through untouched.
fn hostile_kernel_args() -> Vec<String> {
    let mut v: Vec<String> = [
        "console=ttyS0",
        "a,b",
        "a,,b",
        ",",
        ",,",
        "x,id=evil",
        "-device virtio-rng-pci",
        "a=b,c=d",
        "\"quoted\"",
        "'single'",
        "$(reboot)",
        "`id`",
        "a;b|c&d",
        "../../etc/passwd",
        "a\\b",
        "tab\there",
        "é ü ß",
        "{\"json\":1}",
        "-S",
        "--",
        "x\ny",
        "  lead and trail  ",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("k=v ".repeat(500));
    v
}

/// Converts, starts QEMU paused, returns (`qom-get /machine append`, `query-name`).
fn start(vmi_json: &Value, kernel: &Path) -> Option<(Value, Value)> {
    let mut vmi = Vmi::from_json_or_yaml(&vmi_json.to_string()).ok()?;
    let cfg = DefaultsConfig::for_vmi(&vmi);
    vmi.apply_defaults(&cfg);
    if let Err(e) = vmi.validate() {
        eprintln!("invalid: {e:?}");
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("qmp.sock");
    let mut ctx = ConverterContext {
        qemu: QemuVersion { major: 7, minor: 2 },
        kvm: false,
        allow_emulation: true,
        monitor: MonitorSocket::Path(sock.to_string_lossy().into()),
        ..Default::default()
    };
    let private = dir.path().join("p");
    std::fs::create_dir_all(private.join("u1")).expect("private dir");
    ctx.paths.private_dir = private.to_string_lossy().into();
    let mut plan = match convert(&vmi, &ctx) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("not converted: {e}");
            return None;
        }
    };
    if let Some(k) = plan.kernel_boot.as_mut() {
        k.kernel = Some(kernel.to_string_lossy().into());
        k.initrd = None;
    }
    let mut argv = render::argv(&plan);
    if !argv.iter().any(|a| a == "-S") {
        argv.push("-S".into());
    }
    let mut q = QemuChild::spawn(&argv, &[]);
    let mut qmp = q.qmp(&sock, Duration::from_secs(20));
    let status = qmp
        .execute("query-status", json!({}))
        .expect("query-status");
    assert_eq!(status["status"], "prelaunch", "{status}");
    let append = qmp
        .execute("qom-get", json!({"path": "/machine", "property": "append"}))
        .unwrap_or_default();
    let name = qmp.execute("query-name", json!({})).unwrap_or_default();
    Some((append, name["name"].clone()))
}

fn vmi(args: &str) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm", "namespace": "ns", "uid": "u1"},
        "spec": {"domain": {
            "machine": {"type": "q35"},
            "memory": {"guest": "128Mi"},
            "firmware": {"kernelBoot": {"kernelArgs": args,
                "container": {"image": "k", "kernelPath": "/boot/vmlinuz"}}},
            "devices": {"autoattachGraphicsDevice": false, "autoattachSerialConsole": false,
                        "autoattachMemBalloon": false, "autoattachPodInterface": false}
        }}
    })
}

#[test]
fn hostile_kernel_args_arrive_as_one_machine_property() {
    let kernel = GuestImages::locate().vmlinuz;
    let mut started = 0;
    let mut rejected = Vec::new();
    for args in hostile_kernel_args() {
        match start(&vmi(&args), &kernel) {
            Some((append, name)) => {
                started += 1;
                assert_eq!(append, Value::String(args.clone()), "kernelArgs {args:?}");
                assert_eq!(name, "ns_vm", "kernelArgs {args:?}");
            }
            None => rejected.push(args),
        }
    }
    println!(
        "HARDEN_CORPUS kernel-args={} started={started} rejected={rejected:?}",
        hostile_kernel_args().len()
    );
    assert!(
        started * 2 > hostile_kernel_args().len(),
        "only {started} started; rejected {rejected:?}"
    );
}
