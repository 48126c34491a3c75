//! The KVM probe (`qlauncher::monitor::kvm_probe`) with real QEMU: it succeeds under TCG; under KVM
//! its verdict agrees with whether a Linux guest (the test guest's kernelBoot pair) boots under
//! KVM; and `qlauncher run --emulation auto` picks the accelerator the probe picks and boots the
//! guest, while `--emulation off` fails with the probe's reason where KVM does not run guests.

use testkit::guest;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use guest::GuestImages;
use qlauncher::monitor::kvm_probe::{self, ProbeAccel, ProbeOptions, Stage};
use qlauncher::monitor::MonitorError;

/// Time a Linux guest gets to print `QLG: boot ok` under KVM: a working KVM needs 1 to 3 s; the
/// emulating KVM of a nested machine without hardware support is still decompressing the kernel.
const KVM_BOOT_BOUND: Duration = Duration::from_secs(15);

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn options(accel: ProbeAccel, cpu: Option<&str>, dir: &Path) -> ProbeOptions {
    ProbeOptions {
        qemu: "qemu-system-x86_64".into(),
        cpu: cpu.map(str::to_string),
        accel,
        scratch_dir: dir.to_path_buf(),
        start_timeout: Duration::from_secs(30),
        run_timeout: Duration::from_secs(2),
    }
}

#[test]
fn probe_under_tcg_reports_every_stage_and_success() {
    let dir = scratch();
    let mut opts = options(ProbeAccel::Tcg, None, dir.path());
    // TCG needs about 0.2 s; the bound is generous for a loaded machine.
    opts.run_timeout = Duration::from_secs(30);
    let report = kvm_probe::probe(&opts).unwrap();
    let stages: Vec<Stage> = report.stages.iter().map(|s| s.0).collect();
    assert_eq!(
        stages,
        [
            Stage::RealMode,
            Stage::ProtectedMode,
            Stage::LongMode,
            Stage::ComputeLoop,
            Stage::Memory
        ]
    );
    // The scratch image is gone.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// A plain QEMU process killed on drop.
struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether the test guest's kernel reaches `QLG: boot ok` under KVM within [`KVM_BOOT_BOUND`].
fn linux_boots_under_kvm(images: &GuestImages, cpu: Option<&str>) -> bool {
    let mut command = Command::new("qemu-system-x86_64");
    command.args([
        "-machine",
        "q35,accel=kvm",
        "-nodefaults",
        "-display",
        "none",
        "-no-user-config",
        "-m",
        "256",
    ]);
    if let Some(cpu) = cpu {
        command.args(["-cpu", cpu]);
    }
    let child = command
        .arg("-kernel")
        .arg(&images.vmlinuz)
        .arg("-initrd")
        .arg(&images.initrd)
        .args(["-append", "console=ttyS0", "-serial", "stdio"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut qemu = Qemu(child);
    let mut out = qemu.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            text.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&text).contains("QLG: boot ok") {
                let _ = tx.send(());
                break;
            }
        }
    });
    let booted = rx.recv_timeout(KVM_BOOT_BOUND).is_ok();
    drop(qemu);
    let _ = reader.join();
    booted
}

/// On this project's CI machine `/dev/kvm` opens but KVM emulates the guest instruction by
/// instruction: Linux does not boot in time and the probe must say so. On a machine with a working
/// KVM both succeed. `-cpu host` (what the launcher probes with) is checked the same way.
#[test]
fn probe_under_kvm_agrees_with_a_linux_boot() {
    if !Path::new("/dev/kvm").exists() {
        eprintln!("no /dev/kvm: nothing to compare");
        return;
    }
    let images = GuestImages::locate();
    let dir = scratch();
    for cpu in [None, Some("host,migratable=on")] {
        let verdict = kvm_probe::probe(&options(ProbeAccel::Kvm, cpu, dir.path()));
        let boots = linux_boots_under_kvm(&images, cpu);
        assert_eq!(
            verdict.is_ok(),
            boots,
            "cpu {cpu:?}: probe {verdict:?}, Linux boot under KVM within {KVM_BOOT_BOUND:?}: {boots}"
        );
        if cpu.is_none() {
            if let Err(e) = &verdict {
                // The probe names how far the guest got: QEMU started it, so it is slow, not dead.
                match e {
                    MonitorError::KvmProbeTimeout { reached, .. } => {
                        assert!(!reached.starts_with("nothing"), "{e}")
                    }
                    other => panic!("expected a timeout, got {other}"),
                }
            }
        }
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A `qlauncher run` process tree (monitor, launcher, QEMU) killed on drop.
struct Run {
    child: Option<Child>,
    root: tempfile::TempDir,
}

impl Run {
    fn start(emulation: &str) -> Run {
        let images = GuestImages::locate();
        let root = tempfile::Builder::new()
            .prefix(&format!(
                "kp{}-{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ))
            .tempdir_in("/tmp")
            .unwrap();
        let vmi = root.path().join("vmi.json");
        std::fs::write(
            &vmi,
            serde_json::to_vec(&serde_json::json!({
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "metadata": {"name": "probe", "namespace": "default"},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "domain": {
                        "resources": {"requests": {"memory": "256Mi"}},
                        "devices": {
                            "autoattachPodInterface": false,
                            "disks": [{"name": "rootdisk", "disk": {"bus": "virtio"}}]
                        }
                    },
                    "volumes": [{"name": "rootdisk",
                                 "containerDisk": {"image": "qlauncher/test-guest:latest"}}]
                }
            }))
            .unwrap(),
        )
        .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_qlauncher"))
            .arg("run")
            .arg(&vmi)
            .arg("--root")
            .arg(root.path().join("r"))
            .args(["--emulation", emulation, "--container-disk"])
            .arg(format!("rootdisk={}", images.disk_qcow2.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(root.path().join("run.log")).unwrap())
            .spawn()
            .unwrap();
        Run {
            child: Some(child),
            root,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.root.path().join("run.log")).unwrap_or_default()
    }

    /// The JSON log lines whose `msg` is `msg`.
    fn logged(&self, msg: &str) -> Vec<serde_json::Value> {
        self.log()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["msg"] == msg)
            .collect()
    }

    fn serial_log(&self) -> Option<PathBuf> {
        let private = self.root.path().join("r/var/run/kubevirt-private");
        std::fs::read_dir(private).ok().and_then(|d| {
            d.flatten()
                .map(|e| e.path().join("virt-serial0-log"))
                .find(|p| p.exists())
        })
    }

    /// QEMU's argv (QEMU is a child of the monitor).
    fn qemu_argv(&self) -> Option<Vec<String>> {
        let pid = self.child.as_ref()?.id();
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
        children.split_whitespace().find_map(|c| {
            let cmdline = std::fs::read(format!("/proc/{c}/cmdline")).ok()?;
            let argv: Vec<String> = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            argv.first()?.contains("qemu-system").then_some(argv)
        })
    }

    fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(s)) = self.child.as_mut()?.try_wait() {
                self.child = None;
                return Some(s);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(None) = c.try_wait() {
                // QEMU is the monitor's child: kill it first, or it would outlive the test.
                let pid = c.id();
                let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                    .unwrap_or_default();
                for p in children.split_whitespace().filter_map(|p| p.parse().ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(p),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// What the launcher should pick here: KVM exactly when the probe (as the launcher runs it) passes.
fn kvm_expected() -> bool {
    let dir = scratch();
    Path::new("/dev/kvm").exists()
        && kvm_probe::probe(&ProbeOptions::kvm("qemu-system-x86_64", dir.path())).is_ok()
}

#[test]
fn run_with_emulation_auto_uses_the_probed_accelerator_and_boots() {
    let kvm = kvm_expected();
    let mut run = Run::start("auto");
    let deadline = Instant::now() + guest::BOOT_TIMEOUT;
    let argv = loop {
        if let Some(a) = run.qemu_argv() {
            break a;
        }
        assert!(
            Instant::now() < deadline && run.wait(Duration::ZERO).is_none(),
            "QEMU did not start; run.log:\n{}",
            run.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let accel = argv
        .windows(2)
        .find(|w| w[0] == "-accel")
        .map(|w| w[1].clone());
    assert_eq!(
        accel.as_deref(),
        Some(if kvm { "kvm" } else { "tcg" }),
        "{argv:?}"
    );
    if kvm {
        assert_eq!(run.logged("KVM runs the probe guest: using KVM").len(), 1);
    } else {
        let lines = run.logged("KVM does not run guests here: using TCG");
        assert_eq!(lines.len(), 1, "run.log:\n{}", run.log());
        assert_eq!(lines[0]["level"], "info");
        let reason = lines[0]["reason"].as_str().unwrap_or_default();
        assert!(
            reason.starts_with("QEMU running the KVM probe exited with")
                || reason.starts_with("the KVM probe guest reached"),
            "{reason}"
        );
    }
    let serial = loop {
        if let Some(p) = run.serial_log() {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "no serial log; run.log:\n{}",
            run.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    loop {
        let text = std::fs::read_to_string(&serial).unwrap_or_default();
        if text.contains("QLG: boot ok") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no QLG: boot ok; serial:\n{text}\nrun.log:\n{}",
            run.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn run_with_emulation_off_fails_with_the_probe_reason_where_kvm_does_not_run_guests() {
    if kvm_expected() {
        eprintln!("KVM runs guests here: --emulation off would start the VM");
        return;
    }
    let mut run = Run::start("off");
    let status = run.wait(Duration::from_secs(60));
    assert_eq!(
        status.map(|s| s.success()),
        Some(false),
        "run.log:\n{}",
        run.log()
    );
    if Path::new("/dev/kvm").exists() {
        let lines = run
            .logged("KVM does not run guests here and emulation is off: the domain cannot start");
        assert_eq!(lines.len(), 1, "run.log:\n{}", run.log());
        assert_eq!(lines[0]["level"], "error");
    }
    assert!(run.qemu_argv().is_none());
}

/// Prints what the probe costs (run with `--ignored --nocapture`): wall time from spawning QEMU to
/// its exit, median of 5, under TCG and under KVM as the launcher runs it, and the time the
/// default-CPU KVM probe takes to give up.
#[test]
#[ignore = "measurement, prints figures"]
fn probe_cost() {
    let dir = scratch();
    let time = |opts: &ProbeOptions| {
        let mut ms: Vec<u128> = (0..5)
            .map(|_| {
                let t = Instant::now();
                let r = kvm_probe::probe(opts);
                let elapsed = t.elapsed().as_millis();
                eprintln!(
                    "  {elapsed} ms: {}",
                    r.map_or_else(|e| e.to_string(), |_| "ok".into())
                );
                elapsed
            })
            .collect();
        ms.sort();
        ms[2]
    };
    let mut tcg = options(ProbeAccel::Tcg, None, dir.path());
    tcg.run_timeout = Duration::from_secs(30);
    eprintln!("tcg: median {} ms", time(&tcg));
    if Path::new("/dev/kvm").exists() {
        let launcher = ProbeOptions::kvm("qemu-system-x86_64", dir.path());
        eprintln!(
            "kvm, -cpu host,migratable=on: median {} ms",
            time(&launcher)
        );
        eprintln!(
            "kvm, default cpu: median {} ms",
            time(&options(ProbeAccel::Kvm, None, dir.path()))
        );
    }
}
