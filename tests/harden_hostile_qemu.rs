//! Hostile strings reach QEMU intact: each hostile value of `firmware.kernelBoot.kernelArgs`
//! (free text, the one VMI string QEMU takes as a whole option value) and the VMI name that
//! passes validation is converted, QEMU 7.2 is started paused (`-S`) with the rendered argv,
//! and QMP shows the value arrived as one property: `qom-get /machine append` equals the
//! kernelArgs exactly and `query-name` the `<namespace>_<name>` guest name. A value that split
//! into an extra option would fail to start or change these. Needs the test guest's kernel
//! (`scripts/build-guest`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use qlauncher::cmdline::context::{MonitorSocket, QemuVersion};
use qlauncher::cmdline::{convert, render, ConverterContext};
use qlauncher::vmi::{DefaultsConfig, Vmi};
use serde_json::{json, Value};

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

fn guest_kernel() -> PathBuf {
    let dir = std::env::var("QLAUNCHER_GUEST_DIR")
        .unwrap_or_else(|_| "/var/cache/qlauncher/guest".into());
    let k = Path::new(&dir).join("vmlinuz");
    assert!(
        k.exists(),
        "{} is missing: run scripts/build-guest",
        k.display()
    );
    k
}

struct Qemu(Child);
impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn qmp(stream: &mut UnixStream, reader: &mut BufReader<UnixStream>, cmd: Value) -> Value {
    writeln!(stream, "{cmd}").expect("write");
    loop {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).expect("read") > 0, "QMP closed");
        let v: Value = serde_json::from_str(&line).expect("QMP JSON");
        if v.get("return").is_some() || v.get("error").is_some() {
            return v;
        }
    }
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
    let child = Command::new("qemu-system-x86_64")
        .args(&argv)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn QEMU");
    let mut q = Qemu(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut stream = loop {
        if let Ok(s) = UnixStream::connect(&sock) {
            break s;
        }
        if let Ok(Some(st)) = q.0.try_wait() {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(q.0.stderr.as_mut().expect("stderr"), &mut err);
            panic!("QEMU exited {st}: {err}\nargv: {argv:?}");
        }
        assert!(Instant::now() < deadline, "no QMP socket");
        std::thread::sleep(Duration::from_millis(20));
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut greeting = String::new();
    if reader.read_line(&mut greeting).is_err() {
        let _ = q.0.wait();
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(q.0.stderr.as_mut().expect("stderr"), &mut err);
        panic!("no QMP greeting: {err}\nargv: {argv:?}");
    }
    qmp(
        &mut stream,
        &mut reader,
        json!({"execute": "qmp_capabilities"}),
    );
    let status = qmp(&mut stream, &mut reader, json!({"execute": "query-status"}));
    assert_eq!(status["return"]["status"], "prelaunch", "{status}");
    let append = qmp(
        &mut stream,
        &mut reader,
        json!({"execute": "qom-get", "arguments": {"path": "/machine", "property": "append"}}),
    );
    let name = qmp(&mut stream, &mut reader, json!({"execute": "query-name"}));
    Some((append["return"].clone(), name["return"]["name"].clone()))
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
    let kernel = guest_kernel();
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
