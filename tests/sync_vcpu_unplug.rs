//! vCPU hotplug both ways (KubeVirt `UpdateVCPUs`, `pkg/virt-launcher/virtwrap/manager.go`: the
//! live vCPU count is set both ways), with real QEMU and the test guest:
//!
//! - A VMI booted with 2 sockets of 2 cores and `maxSockets: 4` starts as libvirt starts
//!   KubeVirt's domain, QEMU creating the first socket and the launcher plugging the second
//!   before the guest runs (the guest sees 4 CPUs at boot); the domain lists vCPUs 0-3 enabled
//!   of 8. A sync down to 1 socket unplugs vCPUs 3 and 2 (each `device_del` waits for its
//!   `DEVICE_DELETED`): the guest sees 2 CPUs, the domain lists 2 enabled. Below the first socket
//!   the sync is refused naming `spec.domain.cpu.sockets`. (Under TCG, with the launcher's
//!   `allow_unsafe_tcg_vcpu_unplug`, and nothing plugged afterwards: this machine's `/dev/kvm`
//!   does not run the guest.)
//! - Under TCG on QEMU 7.2: the guest sees a hot-plugged vCPU, but the unplug is refused naming
//!   the field and the QEMU version: QEMU before 10.2 (10.0.5 in the 10.0 series) keeps an
//!   unplugged vCPU's `tcg_commit` memory listener registered and aborts at the next memory
//!   topology change ("corrupted double-linked list" on the first `device_add` after a vCPU
//!   `device_del`, reproduced with QEMU alone; QEMU issue 2517, fixed by "physmem: Destroy all CPU
//!   AddressSpaces on unrealize"), and no order of commands avoids it. The next `device_add` (one
//!   more vCPU) works and the guest sees it. The same boot then checks the graceful shutdown
//!   without a guest agent (its channel not connected): the ACPI button at once, the agent not
//!   tried first (libvirt's default shutdown mode).
//! - KubeVirt's soft reboot without a guest agent presses the ACPI
//!   button and the guest's power-off resets the machine (libvirt's fake reboot: QEMU stays, the
//!   guest boots again).
//!
//! Needs root and the test guest (`scripts/build-guest`).

use testkit::guest;

use guest::{Console, GuestImages};
use qlauncher::sync::domain::{ApiDomain, LifeCycle};
use qlauncher::sync::rpc::manager::DomainManager;
use qlauncher::sync::SyncVmi;
use qlauncher::vmi::Vmi;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use testkit::in_process::LauncherRoot;
use testkit::launcher::KillQemu;

// ---- the launcher's log, captured for every thread of this test binary ----

#[derive(Clone, Default)]
struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log() -> &'static LogBuf {
    static LOG: OnceLock<LogBuf> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = LogBuf::default();
        let w = buf.clone();
        tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .init();
        buf
    })
}

fn log_text() -> String {
    String::from_utf8_lossy(&log().0.lock().unwrap()).into_owned()
}

fn vmi(uid: &str, cpu: Value) -> Vmi {
    let json = json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "vcpus", "namespace": "default", "uid": uid},
        "spec": {
            "domain": {
                "cpu": cpu,
                "resources": {"requests": {"memory": "128Mi"}},
                "devices": {
                    "autoattachPodInterface": false,
                    "disks": [{"name": "rootdisk", "disk": {"bus": "virtio"}}]
                }
            },
            "volumes": [
                {"name": "rootdisk", "containerDisk": {"image": "qlauncher/test-guest:latest"}}
            ]
        }
    });
    Vmi::from_json_or_yaml(&json.to_string()).unwrap()
}

fn guest(console: &mut Console, command: &str) -> String {
    let (status, out) = console
        .run(command, guest::BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}; console:\n{}", console.transcript()));
    assert_eq!(status, 0, "{out}");
    out.trim().to_string()
}

fn wait_present(console: &mut Console, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = guest(console, "cat /sys/devices/system/cpu/present");
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the guest sees CPUs {got}, not {want}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The domain's `VCPUs` list: (enabled ids, all ids).
fn domain_vcpus(domain: &ApiDomain) -> (Vec<u64>, usize) {
    let spec = serde_json::to_value(&domain.spec).unwrap();
    let list = spec["VCPUs"]["VCPU"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let enabled = list
        .iter()
        .filter(|v| v["Enabled"] == "yes")
        .filter_map(|v| v["ID"].as_u64())
        .collect();
    (enabled, list.len())
}

/// Stops the guest agent for good (until the next boot): its binary moved away so that the
/// guest's restart loop cannot start it again, then the running `qemu-ga` killed.
fn stop_agent(console: &mut Console) {
    let left = guest(
        console,
        "mv /usr/sbin/qemu-ga /usr/sbin/qemu-ga.off; \
         for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = qemu-ga ] && kill ${p#/proc/}; done; \
         sleep 1; n=0; for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = qemu-ga ] && n=$((n+1)); done; echo $n",
    );
    assert_eq!(left.lines().last(), Some("0"), "qemu-ga still runs: {left}");
}

/// Waits up to 30 s for the domain's guest agent channel to read `state`.
fn wait_agent_channel(manager: &SyncVmi, state: &str) {
    let channel = || {
        manager.domain().and_then(|d| {
            d.spec
                .devices
                .channels
                .iter()
                .find(|c| c.target.name == "org.qemu.guest_agent.0")
                .and_then(|c| c.target.state.clone())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while channel().as_deref() != Some(state) {
        assert!(
            Instant::now() < deadline,
            "agent channel still {:?}",
            channel()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

struct Booted {
    rt: tokio::runtime::Runtime,
    manager: Arc<SyncVmi>,
    _kill: KillQemu,
    console: Console,
    uid: String,
    _root: LauncherRoot,
}

fn boot(kvm: bool, allow_unplug: bool, uid_tag: u32, cpu: Value) -> Booted {
    let images = GuestImages::locate();
    let uid = format!("9a4c2e10-0000-4000-{uid_tag:04}-{:012}", std::process::id());
    let mut root = LauncherRoot::new(&images.disk_qcow2, &uid);
    root.config.kvm = kvm;
    root.config.allow_unsafe_tcg_vcpu_unplug = allow_unplug;
    let private = root.private.clone();
    let rt = testkit::in_process::runtime();
    let manager = Arc::new(SyncVmi::new(root.config.clone(), None));
    let kill = KillQemu(manager.clone());
    rt.block_on(manager.sync_vmi(vmi(&uid, cpu), None))
        .unwrap_or_else(|e| panic!("start: {e}"));
    let mut console = Console::connect(
        &private.join(&uid).join("virt-serial0"),
        Duration::from_secs(10),
    )
    .unwrap();
    console.send(b"\n").unwrap();
    Booted {
        rt,
        manager,
        _kill: kill,
        console,
        uid,
        _root: root,
    }
}

#[test]
fn vcpus_are_unplugged_down_to_the_first_socket() {
    log();
    // This machine's /dev/kvm does not run the guest, and under TCG this QEMU (7.2) aborts at
    // the first memory-topology change after an unplug: the launcher refuses such an unplug by
    // default (the second test). Here it is allowed, and nothing is plugged after it.
    let two_of_four = json!({"sockets": 2, "cores": 2, "threads": 1, "maxSockets": 4});
    let mut b = boot(false, true, 1, two_of_four);
    let (rt, manager, console) = (&b.rt, b.manager.clone(), &mut b.console);
    // Both boot sockets, QEMU's own first one and the second plugged before the guest ran.
    wait_present(console, "0-3");
    let domain = manager.domain().unwrap();
    assert_eq!(domain_vcpus(&domain), (vec![0, 1, 2, 3], 8));

    // Down to the first socket: vCPUs 3 and 2 go, each after its DEVICE_DELETED.
    let sockets = |n: u32| {
        vmi(
            &b.uid,
            json!({"sockets": n, "cores": 2, "threads": 1, "maxSockets": 4}),
        )
    };
    rt.block_on(manager.sync_vcpus(sockets(1), None))
        .unwrap_or_else(|e| panic!("unplug to one socket: {e}"));
    wait_present(console, "0-1");
    assert_eq!(guest(console, "cat /sys/devices/system/cpu/online"), "0-1");
    assert_eq!(domain_vcpus(&manager.domain().unwrap()), (vec![0, 1], 8));
    let logged = log_text();
    for id in ["vcpu3", "vcpu2"] {
        assert!(
            logged
                .lines()
                .any(|l| l.contains("vCPU unplugged") && l.contains(&format!("device={id}"))),
            "no unplug of {id} logged:\n{logged}"
        );
    }

    // Below the first socket: refused, naming the field; nothing changes.
    let one_core = vmi(
        &b.uid,
        json!({"sockets": 1, "cores": 1, "threads": 1, "maxSockets": 4}),
    );
    let err = rt
        .block_on(manager.sync_vcpus(one_core, None))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("spec.domain.cpu.sockets: 1 vCPUs is below the 2 vCPUs of the first socket"),
        "{err}"
    );
    assert_eq!(guest(console, "cat /sys/devices/system/cpu/present"), "0-1");
}

#[test]
fn tcg_on_qemu_7_2_refuses_the_unplug_and_the_next_device_add_works() {
    log();
    let mut b = boot(false, false, 2, json!({"sockets": 1, "maxSockets": 4}));
    let (rt, manager, console) = (&b.rt, b.manager.clone(), &mut b.console);
    wait_present(console, "0");
    let sockets = |n: u32| vmi(&b.uid, json!({"sockets": n, "maxSockets": 4}));

    rt.block_on(manager.sync_vcpus(sockets(2), None))
        .unwrap_or_else(|e| panic!("plug: {e}"));
    wait_present(console, "0-1");
    assert_eq!(domain_vcpus(&manager.domain().unwrap()), (vec![0, 1], 4));

    // The unplug would crash this QEMU at the next device_add: refused, naming the field and
    // the version; the vCPU stays.
    let err = rt
        .block_on(manager.sync_vcpus(sockets(1), None))
        .unwrap_err()
        .to_string();
    let qemu = std::process::Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&qemu.stdout).into_owned();
    let version = line.split_whitespace().nth(3).unwrap_or("").to_string();
    let crashes = version
        .split('.')
        .map(|n| n.parse::<u64>().unwrap_or(0))
        .collect::<Vec<_>>();
    assert!(
        crashes[..2] < [10, 2][..],
        "QEMU {version} has the fix: this test is for a QEMU without it"
    );
    assert!(
        err.contains(&format!(
            "spec.domain.cpu.sockets: unplugging vCPUs is refused under TCG (no KVM) on QEMU {version}"
        )) && err.contains("QEMU issue 2517"),
        "{err}"
    );
    assert_eq!(guest(console, "cat /sys/devices/system/cpu/present"), "0-1");
    // The next device_add works: one more vCPU.
    rt.block_on(manager.sync_vcpus(sockets(3), None))
        .unwrap_or_else(|e| panic!("plug after the refused unplug: {e}"));
    wait_present(console, "0-2");

    // Graceful shutdown with the agent's channel not connected: the power button at once, the
    // agent not tried (libvirt's default shutdown mode).
    stop_agent(console);
    wait_agent_channel(&manager, "disconnected");
    let before = log_text().len();
    let at = console.position();
    rt.block_on(manager.shutdown_vmi(sockets(3)))
        .unwrap_or_else(|e| panic!("shutdown: {e}"));
    console
        .wait_for_marker_after(at, "poweroff", guest::BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}"));
    let logged = log_text()[before..].to_string();
    assert!(
        logged.contains(
            "graceful shutdown: the guest agent's channel is not connected, pressing the ACPI power button"
        ),
        "{logged}"
    );
    assert!(!logged.contains("no agent shutdown"), "{logged}");
}

/// Soft reboot without a guest agent (its channel not connected): KubeVirt's `SoftRebootVMI`
/// presses the ACPI button, and the guest's power-off resets the machine (libvirt's fake reboot).
#[test]
fn soft_reboot_without_agent_presses_the_acpi_button() {
    log();
    let mut b = boot(false, false, 3, json!({"sockets": 1, "maxSockets": 4}));
    let (rt, manager, console) = (&b.rt, b.manager.clone(), &mut b.console);
    wait_present(console, "0");
    let sockets = |n: u32| vmi(&b.uid, json!({"sockets": n, "maxSockets": 4}));

    // No guest agent: its channel closes when qemu-ga stops (the guest's restart loop first).
    stop_agent(console);
    wait_agent_channel(&manager, "disconnected");

    // Soft reboot without AgentConnected: the ACPI button, and the guest's power-off resets the
    // machine instead of ending QEMU (libvirt's fake reboot).
    let pid = manager.qemu_pid().unwrap();
    let booted_once = console.position();
    rt.block_on(manager.soft_reboot_vmi(sockets(3)))
        .unwrap_or_else(|e| panic!("soft reboot: {e}"));
    console
        .wait_for_marker_after(booted_once, "poweroff", guest::BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}"));
    let after_poweroff = console.position();
    console
        .wait_for_marker_after(after_poweroff, "boot ok", guest::BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("the guest did not boot again: {e}"));
    assert_eq!(manager.qemu_pid(), Some(pid), "QEMU was replaced");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = manager.domain().unwrap().status.status;
        if state == LifeCycle::Running {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "domain {state:?} after the soft reboot"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
