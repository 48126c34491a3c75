//! Hotplug and lifecycle with the test guest booted (kernelBoot of `scripts/build-guest`'s
//! vmlinuz + initrd.img under TCG): a disk and a NIC hotplugged onto PCIe root ports and seen by the
//! guest (its `QLG: disk-added` / `QLG: nic-added` markers on ttyS0), a disk read error pausing
//! the VM with IOError, both devices unplugged (DEVICE_DELETED, `QLG: ...-removed`), a guest panic
//! reported by pvpanic-pci (GUEST_PANICKED, Crashed/Panicked), and the ACPI power button ending in
//! SHUTDOWN(guest-shutdown) and Shutoff/Shutdown.

use std::time::{Duration, Instant};

use qlauncher::qmp::hotplug::{self, DiskAttach, DiskDetach, NicAttach, NicDetach};
use qlauncher::qmp::lifecycle::{self, next_status};
use qlauncher::qmp::{tap, DomainState, DomainStatus, LifecycleInput, StateReason};
use serde_json::json;
use testkit::guest::GuestImages;
use testkit::qmp::{node_names, q35_args, raw_image, unique, TestVm};

fn serial_tail(serial: &std::path::Path) -> String {
    let text = std::fs::read_to_string(serial).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(15).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// Waits until the serial log has a line equal to `line`, or fails naming the last lines.
async fn wait_serial(serial: &std::path::Path, line: &str, timeout: Duration) {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(serial).unwrap_or_default();
        // A marker may follow the shell prompt on the same line: compare from "QLG: " on.
        let found = text.lines().any(|l| {
            l.find("QLG: ")
                .is_some_and(|i| l[i..].trim_end_matches('\r') == line)
        });
        if found {
            return;
        }
        if start.elapsed() > timeout {
            panic!(
                "no serial line {line:?} within {timeout:?}; last lines:\n{}",
                serial_tail(serial)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn guest_sees_hotplugged_disk_and_nic_then_unplug_and_acpi_powerdown() {
    let guest = GuestImages::locate();
    let mut args: Vec<String> = q35_args()
        .into_iter()
        .filter(|a| a != "-no-shutdown")
        .map(|a| if a == "128" { "256".into() } else { a })
        .collect();
    let dir_hint = tempfile::Builder::new()
        .prefix(&format!("qmp-guest-{}-", std::process::id()))
        .tempdir()
        .unwrap();
    let serial = dir_hint.path().join("serial.log");
    // The serial port is a socket chardev: a task copies what the guest prints into serial.log;
    // the test types shell commands into the other half.
    let serial_sock = dir_hint.path().join("serial.sock");
    args.extend(guest.kernel_boot_args());
    args.extend([
        "-chardev".into(),
        format!(
            "socket,id=charserial0,path={},server=on,wait=off",
            serial_sock.display()
        ),
        "-device".into(),
        "isa-serial,chardev=charserial0,id=serial0".into(),
        "-device".into(),
        "pvpanic-pci,bus=pcie.0,addr=0x5,id=panic0".into(),
    ]);
    let mut vm = TestVm::launch_with(args, |spec| {
        spec.pre_start = vec![("set-action".into(), Some(json!({"panic": "pause"})))];
        spec.start = false;
    })
    .await
    .map_err(|(e, _)| e)
    .unwrap();
    let (mut serial_rx, mut console) = tokio::net::UnixStream::connect(&serial_sock)
        .await
        .unwrap()
        .into_split();
    let _serial_copy = tokio::spawn({
        let serial = serial.clone();
        async move {
            let mut out = tokio::fs::File::create(&serial).await.unwrap();
            let _ = tokio::io::copy(&mut serial_rx, &mut out).await;
        }
    });
    lifecycle::resume(vm.client()).await.unwrap();
    let c = vm.client().clone();
    let mut events = c.events();
    let boot = Duration::from_secs(240);
    wait_serial(&serial, "QLG: boot ok", boot).await;
    wait_serial(&serial, "QLG: http ready", boot).await;

    // Disk on a root port: the guest reports it.
    let image = vm.path("hot.raw");
    raw_image(&image, 3 << 20);
    let disk = DiskAttach {
        blockdevs: vec![
            json!({"driver": "file", "filename": image, "node-name": "libvirt-1-storage", "auto-read-only": true}),
            json!({"driver": "raw", "file": "libvirt-1-storage", "node-name": "libvirt-1-format"}),
        ],
        device: json!({"driver": "virtio-blk-pci", "bus": "pci.1", "addr": "0x0",
                       "drive": "libvirt-1-format", "id": "ua-hotdisk"}),
    };
    hotplug::attach_disk(&c, &disk).await.unwrap();
    wait_serial(
        &serial,
        "QLG: disk-added vda size=3145728",
        Duration::from_secs(60),
    )
    .await;

    // NIC on a tap (made here with TUNSETIFF, unique name, gone when the fd closes).
    let tap_name = unique("qg");
    let nic = NicAttach {
        tap_fd: tap::open_tap(&tap_name, true).unwrap(),
        fd_name: "tapfd-net1".into(),
        extra_fds: vec![],
        netdev: json!({"type": "tap", "fd": "tapfd-net1", "id": "hostua-net1"}),
        device: json!({"driver": "virtio-net-pci", "netdev": "hostua-net1", "id": "ua-net1",
                       "mac": "02:00:00:00:00:21", "bus": "pci.2", "addr": "0x0", "romfile": ""}),
    };
    hotplug::attach_nic(&c, &nic).await.unwrap();
    wait_serial(
        &serial,
        "QLG: nic-added eth0 mac=02:00:00:00:00:21",
        Duration::from_secs(60),
    )
    .await;
    // The guest bringing the link up changes its receive filter.
    let ev = events
        .wait_for(
            "NIC_RX_FILTER_CHANGED",
            "ua-net1",
            Duration::from_secs(60),
            |e| e.name == "NIC_RX_FILTER_CHANGED",
        )
        .await
        .unwrap();
    assert_eq!(ev.data["name"], json!("ua-net1"));
    hotplug::set_link(&c, "ua-net1", false).await.unwrap();
    hotplug::set_link(&c, "ua-net1", true).await.unwrap();

    // Unplug both: the guest releases them (PCIe native hotplug), QEMU reports DEVICE_DELETED.
    let unplug = Duration::from_secs(60);
    hotplug::detach_disk(
        &c,
        &DiskDetach {
            device_id: "ua-hotdisk".into(),
            node_names: vec!["libvirt-1-format".into(), "libvirt-1-storage".into()],
        },
        unplug,
    )
    .await
    .unwrap();
    wait_serial(&serial, "QLG: disk-removed vda", Duration::from_secs(30)).await;
    assert_eq!(node_names(&c).await, Vec::<String>::new());
    hotplug::detach_nic(
        &c,
        &NicDetach {
            device_id: "ua-net1".into(),
            netdev_id: "hostua-net1".into(),
        },
        unplug,
    )
    .await
    .unwrap();
    wait_serial(&serial, "QLG: nic-removed eth0", Duration::from_secs(30)).await;

    // A disk whose first read of sector 2 fails (blkdebug; QEMU's own geometry probe reads only
    // sector 0) with rerror=stop: the guest's partition scan pauses the VM with BLOCK_IO_ERROR + STOP -> Paused/IOError; cont retries and succeeds.
    let mut state = DomainStatus::new(DomainState::Running, StateReason::Unknown);
    let bad = vm.path("bad.raw");
    raw_image(&bad, 1 << 20);
    let faulty = DiskAttach {
        blockdevs: vec![
            json!({"driver": "file", "filename": bad, "node-name": "libvirt-2-storage"}),
            json!({"driver": "blkdebug", "image": "libvirt-2-storage", "node-name": "libvirt-2-debug",
                   "inject-error": [{"event": "read_aio", "errno": 5, "sector": 2, "once": true}]}),
            json!({"driver": "raw", "file": "libvirt-2-debug", "node-name": "libvirt-2-format"}),
        ],
        device: json!({"driver": "virtio-blk-pci", "bus": "pci.3", "addr": "0x0",
                       "drive": "libvirt-2-format", "id": "ua-faulty", "rerror": "stop", "werror": "stop"}),
    };
    hotplug::attach_disk(&c, &faulty).await.unwrap();
    let io = events
        .wait_for(
            "BLOCK_IO_ERROR",
            "ua-faulty",
            Duration::from_secs(60),
            |e| e.name == "BLOCK_IO_ERROR",
        )
        .await
        .unwrap_or_else(|e| panic!("{e}; serial:\n{}", serial_tail(&serial)));
    assert_eq!(
        (
            io.data["node-name"].clone(),
            io.data["operation"].clone(),
            io.data["action"].clone()
        ),
        (json!("libvirt-2-format"), json!("read"), json!("stop"))
    );
    state = next_status(state, &LifecycleInput::Event(io));
    let stop = events
        .wait_for("STOP", "vm", Duration::from_secs(10), |e| e.name == "STOP")
        .await
        .unwrap();
    state = next_status(state, &LifecycleInput::Event(stop));
    assert_eq!(
        state,
        DomainStatus::new(DomainState::Paused, StateReason::IoError)
    );
    assert_eq!(lifecycle::query_status(&c).await.unwrap().0, "io-error");
    lifecycle::resume(&c).await.unwrap();
    wait_serial(
        &serial,
        "QLG: disk-added vda size=1048576",
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(lifecycle::query_status(&c).await.unwrap().0, "running");

    // Guest panic, reported through pvpanic-pci: the guest shell writes PVPANIC_PANICKED into the
    // device's BAR (busybox devmem). With panic=pause: GUEST_PANICKED, Crashed/Panicked.
    use tokio::io::AsyncWriteExt;
    let script = [
        "",
        "for d in /sys/bus/pci/devices/*; do grep -q 0x1b36 $d/vendor && grep -q 0x0011 $d/device && P=$d; done",
        "echo \"QLG: pvpanic $P $(head -n1 $P/resource)\"",
        "echo 1 >$P/enable; devmem $(cut -d' ' -f1 $P/resource | head -n1) 8 1",
    ];
    for line in script {
        console
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ev = events
        .wait_for("GUEST_PANICKED", "vm", Duration::from_secs(60), |e| {
            e.name == "GUEST_PANICKED"
        })
        .await
        .unwrap_or_else(|e| panic!("{e}; serial:\n{}", serial_tail(&serial)));
    assert_eq!(ev.data["action"], json!("pause"));
    state = next_status(state, &LifecycleInput::Event(ev));
    assert_eq!(state.state, DomainState::Crashed);
    assert_eq!(state.reason, StateReason::Panicked);
    assert_eq!(
        lifecycle::query_status(&c).await.unwrap().0,
        "guest-panicked"
    );
    lifecycle::resume(&c).await.unwrap();
    let ev = events
        .wait_for("RESUME", "vm", Duration::from_secs(10), |e| {
            e.name == "RESUME"
        })
        .await
        .unwrap();
    state = next_status(state, &LifecycleInput::Event(ev));
    assert_eq!(
        state,
        DomainStatus::new(DomainState::Running, StateReason::Unknown)
    );

    // ACPI power button: the guest powers off.
    lifecycle::powerdown(&c).await.unwrap();
    let ev = events
        .wait_for("POWERDOWN", "vm", Duration::from_secs(10), |e| {
            e.name == "POWERDOWN"
        })
        .await
        .unwrap();
    state = next_status(state, &LifecycleInput::Event(ev));
    wait_serial(&serial, "QLG: poweroff", Duration::from_secs(60)).await;
    let ev = events
        .wait_for("SHUTDOWN", "vm", Duration::from_secs(60), |e| {
            e.name == "SHUTDOWN"
        })
        .await
        .unwrap();
    assert_eq!(ev.data, json!({"guest": true, "reason": "guest-shutdown"}));
    state = next_status(state, &LifecycleInput::Event(ev));
    assert_eq!(
        (state.state, state.reason),
        (DomainState::ShuttingDown, StateReason::User)
    );
    let status = vm
        .proc()
        .wait_timeout(Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(0));
    state = next_status(state, &LifecycleInput::QemuExited);
    assert_eq!(
        (state.state, state.reason),
        (DomainState::Shutoff, StateReason::Shutdown)
    );
}
