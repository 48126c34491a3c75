//! Hostile strings in the VMI string fields the converter passes to QEMU (not only rejects) are
//! checked against what QEMU itself parsed, read back over QMP and from guest memory:
//!
//! | field | QEMU-side read-back |
//! |---|---|
//! | `firmware.serial`, `chassis.{manufacturer,version,serial,asset,sku}` | the SMBIOS type 1 / type 3 strings SeaBIOS installed in guest memory (entry point in the F segment, table read with `pmemsave`) |
//! | `devices.disks[0].serial` | `qom-get /machine/peripheral/ua-<disk> serial` |
//! | `devices.disks[0].name` (= the volume's) | the device id `ua-<name>` in `qom-list /machine/peripheral` |
//! | `volumes[0].hostDisk.path` (its file name, under `<private>/vmi-disks/<volume>/`) | the `file` of a node in `query-named-block-nodes` |
//! | `firmware.kernelBoot.container.{kernelPath,initrdPath}` | `qom-get /machine kernel` / `initrd` |
//! | `metadata.name`, `metadata.namespace` | `query-name` (`<namespace>_<name>`) |
//! | `clock.timezone` (QEMU's `TZ`, with `-rtc base=localtime`) | `/proc/<qemu>/environ` |
//!
//! For each value of the corpus (the one of `tests/cmdline_hostile.rs` plus a 5000-byte value),
//! every field that accepts it alone gets it at once, QEMU 7.2 starts the converted argv, and each
//! field's value must come back whole: a value split into another option or property would fail
//! to start or come back different. `kernelArgs` is covered by `tests/harden_hostile_qemu.rs`.
//! Path fields get the value as a file name (`/` replaced by `_`) of a file the test creates.
//! Needs the test guest's kernel and initrd (`scripts/build-guest`).

use testkit::guest;
use testkit::guest::{QemuChild, Qmp};

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use qlauncher::cmdline::context::{MonitorSocket, QemuVersion};
use qlauncher::cmdline::{convert, render, ConverterContext};
use qlauncher::vmi::{DefaultsConfig, Vmi};
use serde_json::{json, Value};

/// The hostile values ([`testkit::hostile::VALUES`], not the empty one: it means "unset" for
/// most fields), plus non-ASCII separators and a 5000-byte value.
fn corpus() -> Vec<String> {
    let mut v: Vec<String> = testkit::hostile::VALUES
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.push("é,ü=ß".into());
    v.push("x".repeat(5000));
    v
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Field {
    FirmwareSerial,
    Chassis(&'static str),
    DiskSerial,
    DiskName,
    HostDiskPath,
    KernelPath,
    InitrdPath,
    Name,
    Namespace,
    Timezone,
}

const FIELDS: &[Field] = &[
    Field::FirmwareSerial,
    Field::Chassis("manufacturer"),
    Field::Chassis("version"),
    Field::Chassis("serial"),
    Field::Chassis("asset"),
    Field::Chassis("sku"),
    Field::DiskSerial,
    Field::DiskName,
    Field::HostDiskPath,
    Field::KernelPath,
    Field::InitrdPath,
    Field::Name,
    Field::Namespace,
    Field::Timezone,
];

/// A file name made of `value`: `/` → `_`, at most 200 bytes (on a char boundary).
fn file_name(value: &str) -> String {
    let mut s: String = value.replace('/', "_");
    let mut end = s.len().min(200);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    format!("f{s}")
}

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn container_disks(&self) -> String {
        self.dir.path().join("cd").display().to_string()
    }

    /// The file a hostDisk volume named `volume` whose path ends in `file` is at
    /// (`<private>/vmi-disks/<volume>/<file>`).
    fn host_disk(&self, volume: &str, file: &str) -> std::path::PathBuf {
        self.dir.path().join("p/vmi-disks").join(volume).join(file)
    }

    fn kernel_boot(&self, base: &str) -> String {
        format!("{}/kernel-boot/{base}", self.container_disks())
    }
}

fn base() -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm", "namespace": "ns", "uid": "u1"},
        "spec": {
            "domain": {
                "machine": {"type": "q35"},
                "memory": {"guest": "64Mi"},
                "firmware": {
                    "serial": "SER1",
                    "kernelBoot": {"kernelArgs": "console=ttyS0 panic=-1",
                        "container": {"image": "k", "kernelPath": "/boot/vmlinuz",
                                      "initrdPath": "/boot/initrd.img"}}
                },
                "chassis": {"manufacturer": "M", "version": "V", "serial": "S", "asset": "A", "sku": "K"},
                "devices": {
                    "autoattachGraphicsDevice": false, "autoattachSerialConsole": false,
                    "autoattachMemBalloon": false, "autoattachPodInterface": false,
                    "disks": [{"name": "d1", "disk": {"bus": "virtio"}, "serial": "DS1"}]
                }
            },
            "volumes": [{"name": "d1", "hostDisk": {"path": "/data/disk.img", "type": "Disk"}}]
        }
    })
}

/// Puts `value` into `field` of `v`.
fn apply(v: &mut Value, field: Field, value: &str) {
    let spec = |v: &mut Value, p: &str, x: Value| *v.pointer_mut(p).expect(p) = x;
    match field {
        Field::FirmwareSerial => spec(v, "/spec/domain/firmware/serial", json!(value)),
        Field::Chassis(k) => spec(v, &format!("/spec/domain/chassis/{k}"), json!(value)),
        Field::DiskSerial => spec(v, "/spec/domain/devices/disks/0/serial", json!(value)),
        Field::DiskName => {
            spec(v, "/spec/domain/devices/disks/0/name", json!(value));
            spec(v, "/spec/volumes/0/name", json!(value));
        }
        Field::HostDiskPath => spec(
            v,
            "/spec/volumes/0/hostDisk/path",
            json!(format!("/data/{}", file_name(value))),
        ),
        Field::KernelPath => spec(
            v,
            "/spec/domain/firmware/kernelBoot/container/kernelPath",
            json!(format!("/boot/{}", file_name(value))),
        ),
        Field::InitrdPath => spec(
            v,
            "/spec/domain/firmware/kernelBoot/container/initrdPath",
            json!(format!("/boot/{}", file_name(value))),
        ),
        Field::Name => spec(v, "/metadata/name", json!(value)),
        Field::Namespace => spec(v, "/metadata/namespace", json!(value)),
        Field::Timezone => {
            v["spec"]["domain"]["clock"] = json!({"timezone": value});
        }
    }
}

fn ctx(env: &Env, sock: &Path) -> ConverterContext {
    let mut ctx = ConverterContext {
        qemu: QemuVersion { major: 7, minor: 2 },
        kvm: false,
        allow_emulation: true,
        monitor: MonitorSocket::Path(sock.display().to_string()),
        ..Default::default()
    };
    ctx.paths.container_disks = env.container_disks();
    ctx.paths.private_dir = env.dir.path().join("p").display().to_string();
    ctx
}

/// The argv and the environment QEMU gets.
type Launch = (Vec<String>, Vec<(String, String)>);

fn plan_argv(env: &Env, v: &Value, sock: &Path) -> Result<Launch, String> {
    let mut vmi = Vmi::from_json_or_yaml(&v.to_string()).map_err(|e| e.to_string())?;
    vmi.apply_defaults(&DefaultsConfig::for_vmi(&vmi));
    vmi.validate().map_err(|e| format!("{e:?}"))?;
    let plan = convert(&vmi, &ctx(env, sock)).map_err(|e| e.to_string())?;
    Ok((render::argv(&plan), plan.env.clone()))
}

/// One QMP command that must succeed; its `return` value.
fn cmd(qmp: &mut Qmp, execute: &str, arguments: Value) -> Value {
    let arguments = if arguments.is_null() {
        json!({})
    } else {
        arguments
    };
    qmp.execute(execute, arguments)
        .unwrap_or_else(|e| panic!("{execute}: {e}"))
}

/// `size` bytes of guest memory at `addr` (`pmemsave` into a file).
fn memory(qmp: &mut Qmp, dir: &Path, addr: u64, size: u64) -> Vec<u8> {
    let file = dir.join("mem.bin");
    cmd(
        qmp,
        "pmemsave",
        json!({"val": addr, "size": size, "filename": file.display().to_string()}),
    );
    let data = std::fs::read(&file).expect("pmemsave file");
    let _ = std::fs::remove_file(&file);
    data
}

fn start((argv, envs): &Launch, sock: &Path) -> (QemuChild, Qmp) {
    let mut q = QemuChild::spawn(argv, envs);
    let qmp = q.qmp(sock, Duration::from_secs(30));
    (q, qmp)
}

/// The SMBIOS strings per structure type, from the tables SeaBIOS installed (waits for them).
/// The guest's SMBIOS strings by structure type, read once SeaBIOS has installed both the entry
/// point and a table holding the system (1) and chassis (3) structures: under load the entry
/// point can be seen before the table it points at is complete.
fn smbios_strings(qmp: &mut Qmp, dir: &Path) -> BTreeMap<u8, Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(table) = smbios_table(qmp, dir) {
            if table.contains_key(&1) && table.contains_key(&3) {
                return table;
            }
        }
        assert!(Instant::now() < deadline, "no complete SMBIOS table");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One read of the SMBIOS entry point and the table it names; `None` while there is no entry point.
fn smbios_table(qmp: &mut Qmp, dir: &Path) -> Option<BTreeMap<u8, Vec<String>>> {
    let (addr, len) = {
        let seg = memory(qmp, dir, 0xf0000, 0x10000);
        let found = (0..seg.len().saturating_sub(32)).step_by(16).find_map(|i| {
            let e = &seg[i..];
            if e.starts_with(b"_SM3_") {
                let max = u32::from_le_bytes(e[12..16].try_into().ok()?) as u64;
                let addr = u64::from_le_bytes(e[16..24].try_into().ok()?);
                Some((addr, max))
            } else if e.starts_with(b"_SM_") {
                let len = u16::from_le_bytes(e[22..24].try_into().ok()?) as u64;
                let addr = u32::from_le_bytes(e[24..28].try_into().ok()?) as u64;
                Some((addr, len))
            } else {
                None
            }
        });
        found?
    };
    let table = memory(qmp, dir, addr, len);
    let mut out: BTreeMap<u8, Vec<String>> = BTreeMap::new();
    let mut i = 0;
    while i + 4 <= table.len() {
        let (ty, flen) = (table[i], table[i + 1] as usize);
        if ty == 127 || flen < 4 {
            break;
        }
        let mut j = i + flen;
        let strings = out.entry(ty).or_default();
        // Strings follow the formatted area, each NUL-terminated, the set ending with a NUL.
        loop {
            let Some(end) = table[j.min(table.len())..].iter().position(|b| *b == 0) else {
                return Some(out);
            };
            if end == 0 {
                j += 1;
                break;
            }
            strings.push(String::from_utf8_lossy(&table[j..j + end]).into_owned());
            j += end + 1;
        }
        // A structure without strings ends with two NULs.
        if table.get(j) == Some(&0) && j == i + flen + 1 {
            j += 1;
        }
        i = j;
    }
    Some(out)
}

#[test]
fn hostile_values_arrive_whole_in_what_qemu_parsed() {
    let images = guest::GuestImages::locate();
    let env = Env {
        dir: tempfile::tempdir().expect("tempdir"),
    };
    let root = env.dir.path();
    for d in ["cd/kernel-boot", "p/u1", "p/vmi-disks/d1"] {
        std::fs::create_dir_all(root.join(d)).expect("dir");
    }
    std::os::unix::fs::symlink(&images.vmlinuz, env.kernel_boot("vmlinuz")).expect("kernel");
    std::os::unix::fs::symlink(&images.initrd, env.kernel_boot("initrd.img")).expect("initrd");
    std::fs::File::create(env.host_disk("d1", "disk.img"))
        .and_then(|f| f.set_len(1 << 20))
        .expect("host disk");
    let sock = root.join("qmp.sock");

    let mut checked: BTreeMap<Field, usize> = BTreeMap::new();
    let mut rejected = 0;
    for value in corpus() {
        let accepted: Vec<Field> = FIELDS
            .iter()
            .copied()
            .filter(|f| {
                let mut v = base();
                apply(&mut v, *f, &value);
                let ok = plan_argv(&env, &v, &sock).is_ok();
                rejected += usize::from(!ok);
                ok
            })
            .collect();
        if accepted.is_empty() {
            continue;
        }
        let mut v = base();
        for f in &accepted {
            apply(&mut v, *f, &value);
        }
        let label = format!("{:?}", &value[..value.len().min(30)]);
        let launch = plan_argv(&env, &v, &sock)
            .unwrap_or_else(|e| panic!("{label}: accepted one by one, not together: {e}"));
        // The files the path fields name.
        let volume = if accepted.contains(&Field::DiskName) {
            value.clone()
        } else {
            "d1".to_string()
        };
        let disk_file = if accepted.contains(&Field::HostDiskPath) {
            file_name(&value)
        } else {
            "disk.img".to_string()
        };
        for f in &accepted {
            match f {
                Field::DiskName | Field::HostDiskPath => {
                    let disk = env.host_disk(&volume, &disk_file);
                    std::fs::create_dir_all(disk.parent().expect("parent"))
                        .and_then(|_| std::fs::File::create(&disk))
                        .and_then(|f| f.set_len(1 << 20))
                        .expect("host disk");
                }
                Field::KernelPath => {
                    std::os::unix::fs::symlink(&images.vmlinuz, env.kernel_boot(&file_name(&value)))
                        .expect("kernel")
                }
                Field::InitrdPath => {
                    std::os::unix::fs::symlink(&images.initrd, env.kernel_boot(&file_name(&value)))
                        .or_else(|e| {
                            if e.kind() == std::io::ErrorKind::AlreadyExists {
                                Ok(())
                            } else {
                                Err(e)
                            }
                        })
                        .expect("initrd")
                }
                _ => {}
            }
        }
        let _ = std::fs::remove_file(&sock);
        let (qemu, mut qmp) = start(&launch, &sock);
        // The plan starts QEMU paused (-S); SeaBIOS installs the SMBIOS tables once it runs.
        cmd(&mut qmp, "cont", Value::Null);
        let smbios = smbios_strings(&mut qmp, root);
        let peripheral = cmd(&mut qmp, "qom-list", json!({"path": "/machine/peripheral"}));
        let ids: Vec<&str> = peripheral
            .as_array()
            .expect("qom-list")
            .iter()
            .filter_map(|p| p["name"].as_str())
            .collect();
        let disk_id = if accepted.contains(&Field::DiskName) {
            format!("ua-{value}")
        } else {
            "ua-d1".to_string()
        };
        for f in &accepted {
            let msg = format!("{label} in {f:?}");
            match f {
                Field::FirmwareSerial => assert!(
                    smbios.get(&1).is_some_and(|s| s.contains(&value)),
                    "{msg}: SMBIOS type 1 {:?}",
                    smbios.get(&1)
                ),
                Field::Chassis(_) => assert!(
                    smbios.get(&3).is_some_and(|s| s.contains(&value)),
                    "{msg}: SMBIOS type 3 {:?}",
                    smbios.get(&3)
                ),
                Field::DiskSerial => {
                    let serial = cmd(
                        &mut qmp,
                        "qom-get",
                        json!({"path": format!("/machine/peripheral/{disk_id}"), "property": "serial"}),
                    );
                    assert_eq!(serial, json!(value), "{msg}");
                }
                Field::DiskName => assert!(ids.contains(&disk_id.as_str()), "{msg}: {ids:?}"),
                Field::HostDiskPath => {
                    let nodes = cmd(&mut qmp, "query-named-block-nodes", Value::Null);
                    let want = env.host_disk(&volume, &disk_file).display().to_string();
                    assert!(
                        nodes
                            .as_array()
                            .expect("nodes")
                            .iter()
                            .any(|n| n["file"] == json!(want)),
                        "{msg}: {nodes}"
                    );
                }
                Field::KernelPath | Field::InitrdPath => {
                    let prop = if *f == Field::KernelPath {
                        "kernel"
                    } else {
                        "initrd"
                    };
                    let got = cmd(
                        &mut qmp,
                        "qom-get",
                        json!({"path": "/machine", "property": prop}),
                    );
                    assert_eq!(got, json!(env.kernel_boot(&file_name(&value))), "{msg}");
                }
                Field::Timezone => {
                    let environ = std::fs::read(format!("/proc/{}/environ", qemu.id()))
                        .expect("QEMU environ");
                    let want = format!("TZ={value}");
                    assert!(
                        environ.split(|b| *b == 0).any(|e| e == want.as_bytes()),
                        "{msg}: {:?}",
                        String::from_utf8_lossy(&environ)
                    );
                }
                Field::Name | Field::Namespace => {
                    let name = cmd(&mut qmp, "query-name", Value::Null);
                    let (ns, n) = (
                        if accepted.contains(&Field::Namespace) {
                            value.as_str()
                        } else {
                            "ns"
                        },
                        if accepted.contains(&Field::Name) {
                            value.as_str()
                        } else {
                            "vm"
                        },
                    );
                    assert_eq!(name["name"], json!(format!("{ns}_{n}")), "{msg}");
                }
            }
            *checked.entry(*f).or_default() += 1;
        }
    }
    let total: usize = checked.values().sum();
    println!(
        "HARDEN_QEMU_FIELDS values={} fields={} checked={total} rejected={rejected} per-field={checked:?}",
        corpus().len(),
        FIELDS.len()
    );
    // Free-text fields must take hostile text, not only reject it.
    for f in [
        Field::FirmwareSerial,
        Field::Chassis("manufacturer"),
        Field::DiskSerial,
    ] {
        assert!(
            checked.get(&f).copied().unwrap_or(0) > 0,
            "{f:?} never checked"
        );
    }
}
