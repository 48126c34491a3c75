//! QEMU acceptance: every fixture that needs no missing hardware is started with the real
//! `qemu-system-x86_64` (TCG, `-S`, QEMU 7.2 rendering) on files prepared in a temp dir (qcow2
//! images made with `qemu-img`, which only tests use); then over QMP: `query-status` is
//! `prelaunch`, `qom-list /machine/peripheral` holds every planned device id, `query-pci` every
//! PCI device id, `query-named-block-nodes` every planned node, `query-block` every disk with
//! its top node, and `query-chardev` every planned chardev. A second test adds every
//! hot-pluggable disk and NIC with the QMP plan's own argument objects.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use qlauncher::cmdline::plan::{Backend, DomainPlan, FirmwarePlan};
use qlauncher::cmdline::qemu::{Blockdev, FormatDriver};
use qlauncher::cmdline::{convert, render};
use serde_json::{json, Value};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Kills and reaps QEMU on drop.
struct QemuGuard(Child);

impl Drop for QemuGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A minimal synchronous QMP client.
struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    qemu: QemuGuard,
}

impl Qmp {
    fn connect(path: &Path, mut qemu: QemuGuard) -> Qmp {
        let start = Instant::now();
        loop {
            if let Ok(s) = UnixStream::connect(path) {
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let mut q = Qmp {
                    reader: BufReader::new(s.try_clone().unwrap()),
                    writer: s,
                    qemu,
                };
                let greeting = q.line();
                assert!(greeting.get("QMP").is_some(), "greeting {greeting}");
                q.cmd("qmp_capabilities", json!({}));
                return q;
            }
            if let Ok(Some(status)) = qemu.0.try_wait() {
                panic!("QEMU exited with {status}: {}", stderr(&mut qemu.0));
            }
            assert!(start.elapsed() < Duration::from_secs(30), "no QMP socket");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn line(&mut self) -> Value {
        let mut l = String::new();
        if let Err(e) = self.reader.read_line(&mut l) {
            let _ = self.qemu.0.kill();
            panic!("QMP read: {e}; QEMU said: {}", stderr(&mut self.qemu.0));
        }
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("QMP line {l:?}: {e}"))
    }

    fn cmd(&mut self, execute: &str, arguments: Value) -> Value {
        let msg = json!({ "execute": execute, "arguments": arguments });
        writeln!(self.writer, "{msg}").unwrap();
        loop {
            let v = self.line();
            if let Some(r) = v.get("return") {
                return r.clone();
            }
            if let Some(e) = v.get("error") {
                panic!("{execute}: {e}");
            }
        }
    }
}

fn stderr(child: &mut Child) -> String {
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    err
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Creates every file and directory the plan's argv refers to.
fn prepare_files(plan: &DomainPlan, root: &Path) {
    testkit::cmdline::create_pod_dirs(root);
    let mut blockdevs: Vec<&Blockdev> = vec![];
    if let FirmwarePlan::Efi {
        blockdevs: b,
        vars_template,
        vars,
        ..
    } = &plan.firmware
    {
        std::fs::copy(vars_template, vars).unwrap();
        blockdevs.extend(
            b.iter()
                .filter(|b| b.node_name().starts_with("libvirt-pflash0")),
        );
    }
    blockdevs.extend(testkit::cmdline::chardev_dirs_and_blockdevs(plan));
    if let Some(k) = &plan.kernel_boot {
        let dir = std::env::var("QLAUNCHER_GUEST_DIR")
            .unwrap_or_else(|_| "/var/cache/qlauncher/guest".into());
        for (want, have) in [(&k.kernel, "vmlinuz"), (&k.initrd, "initrd.img")] {
            if let Some(want) = want {
                let src = Path::new(&dir).join(have);
                assert!(
                    src.exists(),
                    "{} is missing: run scripts/build-guest (or set QLAUNCHER_GUEST_DIR)",
                    src.display()
                );
                std::fs::create_dir_all(Path::new(want).parent().unwrap()).unwrap();
                std::fs::copy(&src, want).unwrap();
            }
        }
    }
    if let Some(v) = &plan.vnc {
        std::fs::create_dir_all(Path::new(v).parent().unwrap()).unwrap();
    }
    // Format of the file under each protocol node.
    // (The firmware's own files are there already.)
    blockdevs.retain(
        |b| !matches!(b, Blockdev::Protocol(p) if p.filename.starts_with("/usr/share/OVMF")),
    );
    for (path, fmt) in testkit::cmdline::missing_images(&blockdevs) {
        match fmt {
            Some(FormatDriver::Qcow2) => run(Command::new("qemu-img")
                .args(["create", "-q", "-f", "qcow2"])
                .arg(path)
                .arg("16M")),
            _ => {
                let f = std::fs::File::create(path).unwrap();
                f.set_len(16 << 20).unwrap();
            }
        }
    }
}

fn ids(v: &Value, key: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(s)) = m.get(key) {
                out.insert(s.clone());
            }
            for x in m.values() {
                ids(x, key, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| ids(x, key, out)),
        _ => {}
    }
}

fn accept(name: &str, vmi: &qlauncher::vmi::Vmi, facts: &qlauncher::cmdline::FactsFile) {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let tmp = tempfile::Builder::new().prefix("qlc").tempdir().unwrap();
    let root = tmp.path();
    let tap_prefix = format!("qc{}x{n}n", std::process::id() % 100000);
    let ctx = testkit::cmdline::acceptance_context(vmi, facts, root, &tap_prefix);
    let plan = convert(vmi, &ctx).unwrap_or_else(|e| panic!("{name}: {e}"));
    prepare_files(&plan, root);
    let argv = render::argv(&plan);
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(&argv)
        .envs(plan.env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let guard = QemuGuard(cmd.spawn().expect("spawn qemu"));
    let mut qmp = Qmp::connect(&root.join("qmp.sock"), guard);

    let status = qmp.cmd("query-status", json!({}));
    assert_eq!(status["status"], "prelaunch", "{name}");

    let peripheral = qmp.cmd("qom-list", json!({ "path": "/machine/peripheral" }));
    let mut qom = BTreeSet::new();
    ids(&peripheral, "name", &mut qom);
    let mut pci = BTreeSet::new();
    ids(&qmp.cmd("query-pci", json!({})), "qdev_id", &mut pci);
    let mut nodes = BTreeSet::new();
    ids(
        &qmp.cmd("query-named-block-nodes", json!({})),
        "node-name",
        &mut nodes,
    );
    let block = qmp.cmd("query-block", json!({}));
    let mut chardevs = BTreeSet::new();
    ids(&qmp.cmd("query-chardev", json!({})), "label", &mut chardevs);

    for d in &plan.devices {
        let id = d.device.id();
        assert!(qom.contains(id), "{name}: {id} not in qom-list {qom:?}");
        if let Some(addr) = &d.address {
            if addr.bus == "pcie.0" {
                assert!(pci.contains(id), "{name}: {id} not in query-pci {pci:?}");
            } else {
                // Before the firmware runs, query-pci lists no bus behind a root port; the
                // root port is in query-pci and the device's QOM parent bus is that port's bus.
                assert!(
                    pci.contains(&addr.bus),
                    "{name}: {} not in query-pci",
                    addr.bus
                );
                let parent = qmp.cmd(
                    "qom-get",
                    json!({ "path": format!("/machine/peripheral/{id}"), "property": "parent_bus" }),
                );
                assert_eq!(
                    parent,
                    json!(format!("/machine/peripheral/{0}/{0}", addr.bus)),
                    "{name}: {id}"
                );
            }
        }
        match &d.backend {
            Backend::Blockdevs(bs) => {
                for b in bs {
                    assert!(
                        nodes.contains(b.node_name()),
                        "{name}: node {}",
                        b.node_name()
                    );
                }
                let top = bs.last().unwrap().node_name();
                let found = block.as_array().unwrap().iter().any(|b| {
                    b["inserted"]["node-name"] == top
                        && b["qdev"].as_str().is_some_and(|q| {
                            q == id || q.starts_with(&format!("/machine/peripheral/{id}/"))
                        })
                });
                assert!(found, "{name}: {id} with {top} not in query-block {block}");
            }
            Backend::Chardev(c) => {
                assert!(chardevs.contains(&c.id), "{name}: chardev {}", c.id)
            }
            _ => {}
        }
    }
    assert!(chardevs.contains("charmonitor"), "{name}");
    drop(qmp);
}

#[test]
fn qemu_starts_every_fixture_paused_with_every_planned_device() {
    let mut started = 0;
    let mut failed = Vec::new();
    for (name, vmi, facts) in testkit::cmdline::fixtures() {
        if facts.rejected {
            continue;
        }
        if let Some(why) = &facts.no_acceptance {
            eprintln!("skip {name}: {why}");
            continue;
        }
        match std::panic::catch_unwind(|| accept(&name, &vmi, &facts)) {
            Ok(()) => started += 1,
            Err(_) => failed.push(name),
        }
    }
    assert!(failed.is_empty(), "failed: {failed:?}");
    assert!(started >= 30, "only {started} fixtures started");
}

/// The QMP arguments of a typed plan value, as the QMP client sends them.
fn json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("plan arguments serialise")
}

/// Starts QEMU without the plan's hot-pluggable disks and NICs, then adds each one with the QMP
/// plan's own argument objects (`blockdev-add` bottom first + `device_add`; `netdev_add` +
/// `device_add`; QEMU opens the tap by name here, so no `getfd`), and checks QEMU shows them.
fn hotplug(name: &str, vmi: &qlauncher::vmi::Vmi, facts: &qlauncher::cmdline::FactsFile) -> usize {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let tmp = tempfile::Builder::new().prefix("qlh").tempdir().unwrap();
    let root = tmp.path();
    let tap_prefix = format!("qh{}x{n}n", std::process::id() % 100000);
    let ctx = testkit::cmdline::acceptance_context(vmi, facts, root, &tap_prefix);
    let plan = convert(vmi, &ctx).unwrap_or_else(|e| panic!("{name}: {e}"));
    let qmp_plan = render::qmp_plan(&plan);
    if qmp_plan.disks.is_empty() && qmp_plan.nics.is_empty() {
        return 0;
    }
    prepare_files(&plan, root);
    let mut cold = plan.clone();
    cold.devices.retain(|d| !d.hotpluggable);
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(render::argv(&cold))
        .envs(plan.env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let guard = QemuGuard(cmd.spawn().expect("spawn qemu"));
    let mut qmp = Qmp::connect(&root.join("qmp.sock"), guard);
    for d in &qmp_plan.disks {
        for b in &d.blockdevs {
            qmp.cmd("blockdev-add", json(b));
        }
        qmp.cmd("device_add", json(&d.device));
    }
    for nic in &qmp_plan.nics {
        assert!(nic.getfd.is_empty(), "{name}: taps by name need no getfd");
        qmp.cmd("netdev_add", json(&nic.netdev));
        qmp.cmd("device_add", json(&nic.device));
    }
    let mut qom = BTreeSet::new();
    ids(
        &qmp.cmd("qom-list", json!({ "path": "/machine/peripheral" })),
        "name",
        &mut qom,
    );
    let block = qmp.cmd("query-block", json!({}));
    for d in &qmp_plan.disks {
        assert!(qom.contains(&d.id), "{name}: {} not plugged", d.id);
        let top = d.blockdevs.last().unwrap().node_name();
        assert!(
            block
                .as_array()
                .unwrap()
                .iter()
                .any(|b| b["inserted"]["node-name"] == top),
            "{name}: {top} not in query-block"
        );
    }
    for nic in &qmp_plan.nics {
        assert!(qom.contains(&nic.id), "{name}: {} not plugged", nic.id);
    }
    drop(qmp);
    qmp_plan.disks.len() + qmp_plan.nics.len()
}

#[test]
fn qmp_plan_adds_every_hotpluggable_disk_and_nic() {
    let mut plugged = 0;
    for (name, vmi, facts) in testkit::cmdline::fixtures() {
        if facts.rejected || facts.no_acceptance.is_some() {
            continue;
        }
        plugged += hotplug(&name, &vmi, &facts);
    }
    assert!(plugged >= 10, "only {plugged} devices hot-plugged");
}

/// Kills and reaps a virtiofsd on drop.
struct VirtiofsdGuard(Child);

impl Drop for VirtiofsdGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The virtiofs fixture against real virtiofsd processes (QEMU 7.2's, `/usr/lib/qemu/virtiofsd`):
/// one per filesystem on the socket the plan names, then QEMU starts with the plan's argv, its
/// vhost-user chardevs connect, and `fs0`/`fs1` exist. Before the sockets exist the plan reports
/// each filesystem as missing hardware, which is what the launcher refuses on.
#[test]
fn virtiofs_filesystems_connect_to_real_virtiofsd() {
    let virtiofsd = Path::new("/usr/lib/qemu/virtiofsd");
    assert!(
        virtiofsd.exists(),
        "{} is missing: install qemu-system-common (scripts/install-deps)",
        virtiofsd.display()
    );
    let (name, vmi, mut facts) = testkit::cmdline::fixtures()
        .into_iter()
        .find(|(n, _, _)| n == "virtiofs")
        .expect("virtiofs fixture");
    let tmp = tempfile::Builder::new().prefix("qlv").tempdir().unwrap();
    let root = tmp.path();
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let tap_prefix = format!("qv{}x{n}n", std::process::id() % 100000);
    facts.virtiofs_ready.clear();
    let mut ctx = testkit::cmdline::acceptance_context(&vmi, &facts, root, &tap_prefix);
    ctx.paths.virtiofs = root.join("vfs").to_string_lossy().to_string();
    let names = ["data", "app-config"];
    let missing: Vec<String> = convert(&vmi, &ctx)
        .unwrap()
        .missing_hardware()
        .iter()
        .map(|m| m.path.to_string())
        .collect();
    assert_eq!(
        missing,
        [
            "spec.domain.devices.filesystems[0]",
            "spec.domain.devices.filesystems[1]"
        ]
    );

    let mut daemons = Vec::new();
    for fs in names {
        let shared = root.join("shared").join(fs);
        std::fs::create_dir_all(&shared).unwrap();
        std::fs::create_dir_all(root.join("vfs")).unwrap();
        let sock = root.join("vfs").join(format!("{fs}.sock"));
        let child = Command::new(virtiofsd)
            .arg(format!("--socket-path={}", sock.display()))
            .arg("-o")
            .arg(format!("source={}", shared.display()))
            .args(["-o", "cache=none"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn virtiofsd");
        daemons.push(VirtiofsdGuard(child));
        let start = Instant::now();
        while !sock.exists() {
            assert!(start.elapsed() < Duration::from_secs(10), "{fs}: no socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        ctx.virtiofs_ready.insert(fs.to_string());
    }
    let plan = convert(&vmi, &ctx).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(plan.missing_hardware(), vec![]);
    prepare_files(&plan, root);
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(render::argv(&plan))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let guard = QemuGuard(cmd.spawn().expect("spawn qemu"));
    let mut qmp = Qmp::connect(&root.join("qmp.sock"), guard);
    assert_eq!(qmp.cmd("query-status", json!({}))["status"], "prelaunch");
    let mut qom = BTreeSet::new();
    ids(
        &qmp.cmd("qom-list", json!({ "path": "/machine/peripheral" })),
        "name",
        &mut qom,
    );
    let mut chardevs = BTreeSet::new();
    ids(&qmp.cmd("query-chardev", json!({})), "label", &mut chardevs);
    for (i, fs) in names.iter().enumerate() {
        assert!(
            qom.contains(&format!("fs{i}")),
            "{fs}: fs{i} not in {qom:?}"
        );
        assert!(
            chardevs.contains(&format!("chr-vu-fs{i}")),
            "{fs}: {chardevs:?}"
        );
        let tag = qmp.cmd(
            "qom-get",
            json!({ "path": format!("/machine/peripheral/fs{i}"), "property": "tag" }),
        );
        assert_eq!(tag, json!(fs));
    }
    drop(qmp);
    drop(daemons);
}

/// A hook's tier-2 NIC and disk edits (`compat/libvirt-xml/src/hooks/edits/`) as QEMU 7.2 takes
/// them: the NIC's MTU, queue sizes and ROM read back with `qom-get`, the disk's `<iotune>`
/// through the QMP plan's `block_set_io_throttle` read back with `query-block`, the features'
/// `kvm=off`, `hv-relaxed`, spinlocks, vendor id, stimer and TLB flush with `qom-get` of the
/// vCPU, and the clock's shifted RTC start (`rtc-time`) and HPET off (`hpet`) with `qom-get` of
/// the machine.
#[test]
fn qemu_takes_hooked_nic_and_disk_properties() {
    use qlauncher::cmdline::plan::{ClockOffset, TimerName, TimerPlan};
    use qlauncher::cmdline::qemu::IoThrottle;
    use qlauncher_libvirt_xml::hooks::{self, ClockEdit, DiskEdit, FeatureEdit, HookEdit, NicEdit};
    let (name, vmi, facts) = testkit::cmdline::fixtures()
        .into_iter()
        .find(|(n, _, _)| n == "basic")
        .expect("the basic fixture");
    let tmp = tempfile::Builder::new().prefix("qlk").tempdir().unwrap();
    let root = tmp.path();
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let tap_prefix = format!("qk{}x{n}n", std::process::id() % 100000);
    let ctx = testkit::cmdline::acceptance_context(&vmi, &facts, root, &tap_prefix);
    let mut plan = convert(&vmi, &ctx).unwrap_or_else(|e| panic!("{name}: {e}"));
    let disk = plan
        .devices
        .iter()
        .find(|d| matches!(d.backend, Backend::Blockdevs(_)))
        .expect("a disk")
        .device
        .id()
        .to_string();
    let nic = |edit| HookEdit::Nic {
        alias: "ua-default".into(),
        edit,
    };
    let limits = IoThrottle {
        bps_wr: 1 << 20,
        iops: 300,
        iops_max: Some(600),
        group: Some("hooked".into()),
        ..IoThrottle::default()
    };
    hooks::apply(
        &[
            nic(NicEdit::Mtu(Some(9000))),
            nic(NicEdit::QueueSizes {
                rx: Some(1024),
                tx: Some(256),
            }),
            nic(NicEdit::Rom {
                enabled: true,
                bar: Some(false),
                file: Some("/usr/lib/ipxe/qemu/efi-virtio.rom".into()),
            }),
            HookEdit::Disk {
                alias: disk.clone(),
                edit: DiskEdit::IoTune(Some(Box::new(limits))),
            },
            HookEdit::Feature(FeatureEdit::KvmHidden(true)),
            HookEdit::Feature(FeatureEdit::HyperV {
                flag: "hv-relaxed",
                on: true,
            }),
            HookEdit::Feature(FeatureEdit::Spinlocks(Some(8191))),
            HookEdit::Feature(FeatureEdit::VendorId(Some("MyVendor".into()))),
            HookEdit::Feature(FeatureEdit::Stimer {
                on: true,
                direct: true,
            }),
            HookEdit::Feature(FeatureEdit::TlbFlush {
                on: true,
                direct: true,
                extended: true,
            }),
            HookEdit::Clock(ClockEdit::Offset(ClockOffset::Utc {
                adjustment: Some(7200),
            })),
            HookEdit::Clock(ClockEdit::Timer {
                name: TimerName::Hpet,
                timer: Some(TimerPlan {
                    name: TimerName::Hpet,
                    present: Some(false),
                    tick_policy: None,
                    track: None,
                }),
            }),
            HookEdit::Clock(ClockEdit::Timer {
                name: TimerName::Hypervclock,
                timer: Some(TimerPlan {
                    name: TimerName::Hypervclock,
                    present: Some(true),
                    tick_policy: None,
                    track: None,
                }),
            }),
        ],
        &mut plan,
    );
    prepare_files(&plan, root);
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(render::argv(&plan))
        .envs(plan.env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let guard = QemuGuard(cmd.spawn().expect("spawn qemu"));
    let mut qmp = Qmp::connect(&root.join("qmp.sock"), guard);
    let got = [
        "host_mtu",
        "rx_queue_size",
        "tx_queue_size",
        "romfile",
        "rombar",
    ]
    .map(|p| {
        qmp.cmd(
            "qom-get",
            json!({"path": "/machine/peripheral/ua-default", "property": p}),
        )
    });
    assert_eq!(
        got,
        [
            json!(9000),
            json!(1024),
            json!(256),
            json!("/usr/lib/ipxe/qemu/efi-virtio.rom"),
            json!(0)
        ]
    );
    let cpus = qmp.cmd("query-cpus-fast", json!({}));
    let vcpu = cpus[0]["qom-path"].as_str().expect("a vCPU").to_string();
    let got = [
        "kvm",
        "hv-relaxed",
        "hv-spinlocks",
        "hv-vendor-id",
        "hv-stimer",
        "hv-stimer-direct",
        "hv-tlbflush",
        "hv-tlbflush-direct",
        "hv-tlbflush-ext",
        "hv-time",
    ]
    .map(|p| qmp.cmd("qom-get", json!({"path": vcpu.clone(), "property": p})));
    assert_eq!(
        got,
        [
            json!(false),
            json!(true),
            json!(8191),
            json!("MyVendor"),
            json!(true),
            json!(true),
            json!(true),
            json!(true),
            json!(true),
            json!(true)
        ]
    );
    // The hooked clock: the RTC starts two hours after the plan's time, HPET is gone.
    let tm = qmp.cmd(
        "qom-get",
        json!({"path": "/machine", "property": "rtc-time"}),
    );
    let base = qlauncher::cmdline::devices::clock::format_utc(plan.clock.now_unix + 7200);
    let rtc = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        tm["tm_year"].as_i64().unwrap() + 1900,
        tm["tm_mon"].as_i64().unwrap() + 1,
        tm["tm_mday"].as_i64().unwrap(),
        tm["tm_hour"].as_i64().unwrap(),
        tm["tm_min"].as_i64().unwrap(),
        tm["tm_sec"].as_i64().unwrap()
    );
    assert_eq!(rtc, base);
    assert_eq!(
        qmp.cmd("qom-get", json!({"path": "/machine", "property": "hpet"})),
        json!(false)
    );
    for step in &render::qmp_plan(&plan).startup {
        let step = json(step);
        if step["execute"] == "block_set_io_throttle" {
            qmp.cmd("block_set_io_throttle", step["arguments"].clone());
        }
    }
    let block = qmp.cmd("query-block", json!({}));
    let inserted = block
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["qdev"].as_str().is_some_and(|q| q.contains(&disk)))
        .map(|b| b["inserted"].clone())
        .unwrap_or_else(|| panic!("no {disk} in {block}"));
    assert_eq!(
        ["bps_wr", "iops", "iops_max", "group"].map(|k| inserted[k].clone()),
        [json!(1 << 20), json!(300), json!(600), json!("hooked")],
        "{inserted}"
    );
}
