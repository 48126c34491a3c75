//! The QMP client, launch, lifecycle and hotplug against a real qemu-system-x86_64 (TCG, q35 with
//! PCIe root ports), without a guest OS. Guest-dependent steps (PCIe unplug completion, ACPI
//! powerdown) are in `qmp_guest.rs`.

use std::os::fd::AsFd;
use std::time::Duration;

use qlauncher::qmp::hotplug::{self, DiskAttach, DiskDetach, NicAttach};
use qlauncher::qmp::lifecycle::{self, next_status};
use qlauncher::qmp::{tap, DomainState, DomainStatus, LifecycleInput, QmpError, StateReason};
use serde_json::{json, Value};
use testkit::qemu_launch::LaunchError;
use testkit::qmp::{block_of, node_names, q35_args, raw_image, unique, TestVm, MONITOR_FD};

async fn vm() -> TestVm {
    match TestVm::launch(q35_args()).await {
        Ok(vm) => vm,
        Err((e, dir)) => panic!(
            "launch failed: {e}\nlog: {}",
            std::fs::read_to_string(dir.path().join("qemu.log")).unwrap_or_default()
        ),
    }
}

fn proc_status_field(pid: i32, field: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn launch_hands_over_the_monitor_fd_runs_pre_start_and_cont() {
    // A canary fd without CLOEXEC must not leak into QEMU.
    let canary_path = std::env::temp_dir().join(format!("{}.canary", unique("qmp")));
    let c = std::ffi::CString::new(canary_path.to_str().unwrap()).unwrap();
    // SAFETY: open(2) with a valid C string; the fd is closed at the end of the test.
    let canary = unsafe { libc::open(c.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o600) };
    assert!(canary >= 0);
    let vm = TestVm::launch_with(q35_args(), |spec| {
        spec.pre_start = vec![(
            "set-action".into(),
            Some(json!({"shutdown": "pause", "panic": "pause"})),
        )];
        spec.env = vec![("QLTEST".into(), "1".into())];
        spec.pid_file = Some(spec.log.with_file_name("qemu.pid"));
    })
    .await
    .map_err(|(e, _)| e)
    .unwrap();
    let (status, st) = lifecycle::query_status(vm.client()).await.unwrap();
    assert_eq!(
        (status.as_str(), st),
        (
            "running",
            DomainStatus::new(DomainState::Running, StateReason::Unknown)
        )
    );
    let g = vm.client().greeting();
    assert_eq!((g.version.0, g.version.1), (7, 2));
    // The pid is QEMU's, and recorded.
    assert_eq!(
        std::fs::read_to_string(vm.path("qemu.pid")).unwrap(),
        format!("{}\n", vm.pid)
    );
    let exe = std::fs::read_link(format!("/proc/{}/exe", vm.pid)).unwrap();
    assert_eq!(exe, std::path::PathBuf::from("/usr/bin/qemu-system-x86_64"));
    // A clean environment: exactly what the spec gave.
    let env = std::fs::read(format!("/proc/{}/environ", vm.pid)).unwrap();
    assert_eq!(env, b"QLTEST=1\0");
    // The monitor listener is at fd 3 and the canary did not leak.
    let fd3 = std::fs::read_link(format!("/proc/{}/fd/{MONITOR_FD}", vm.pid)).unwrap();
    assert!(
        fd3.to_string_lossy().starts_with("socket:"),
        "fd 3 is {fd3:?}"
    );
    let leaked: Vec<_> = std::fs::read_dir(format!("/proc/{}/fd", vm.pid))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| *t == canary_path)
        .collect();
    assert_eq!(leaked, Vec::<std::path::PathBuf>::new());
    // SAFETY: closing the fd opened above.
    unsafe { libc::close(canary) };
    let _ = std::fs::remove_file(&canary_path);
}

#[tokio::test]
async fn launch_drops_to_the_runtime_user() {
    let vm = TestVm::launch_with(q35_args(), |spec| spec.user = Some((107, 107)))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    assert_eq!(proc_status_field(vm.pid, "Uid"), "107 107 107 107");
    assert_eq!(proc_status_field(vm.pid, "Gid"), "107 107 107 107");
    assert_eq!(proc_status_field(vm.pid, "Groups"), "107");
    lifecycle::query_status(vm.client()).await.unwrap();
}

#[tokio::test]
async fn early_exit_carries_the_last_stderr_lines() {
    let mut args = q35_args();
    args.extend(["-device".into(), "no-such-device,id=x".into()]);
    match TestVm::launch(args).await {
        Err((
            LaunchError::QemuExited {
                status,
                stderr_tail,
            },
            _dir,
        )) => {
            assert_eq!(status, "exit status: 1");
            assert_eq!(
                stderr_tail,
                "qemu-system-x86_64: -device no-such-device,id=x: 'no-such-device' is not a valid device model name"
            );
        }
        Err((e, _)) => panic!("unexpected error {e}"),
        Ok(_) => panic!("QEMU started with a bad device"),
    }
}

#[tokio::test]
async fn lifecycle_commands_provoke_events_that_map_to_domain_states() {
    let mut vm = vm().await;
    let client = vm.client().clone();
    let mut events = client.events();
    let mut state = DomainStatus::new(DomainState::Running, StateReason::Unknown);
    let t = Duration::from_secs(10);

    let mut tracked = lifecycle::track_status(client.events(), state);
    let mut step = |ev: qlauncher::qmp::Event| {
        state = next_status(state, &LifecycleInput::Event(ev));
        state
    };

    lifecycle::pause(&client).await.unwrap();
    tokio::time::timeout(t, tracked.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        *tracked.borrow(),
        DomainStatus::new(DomainState::Paused, StateReason::User)
    );
    let ev = events
        .wait_for("STOP", "vm", t, |e| e.name == "STOP")
        .await
        .unwrap();
    assert_eq!(
        step(ev),
        DomainStatus::new(DomainState::Paused, StateReason::User)
    );
    assert_eq!(lifecycle::query_status(&client).await.unwrap().0, "paused");

    lifecycle::resume(&client).await.unwrap();
    let ev = events
        .wait_for("RESUME", "vm", t, |e| e.name == "RESUME")
        .await
        .unwrap();
    assert_eq!(
        step(ev),
        DomainStatus::new(DomainState::Running, StateReason::Unknown)
    );
    assert_eq!(lifecycle::query_status(&client).await.unwrap().0, "running");

    lifecycle::reset(&client).await.unwrap();
    let ev = events
        .wait_for("RESET", "vm", t, |e| e.name == "RESET")
        .await
        .unwrap();
    assert_eq!(
        ev.data,
        json!({"guest": false, "reason": "host-qmp-system-reset"})
    );
    assert_eq!(
        step(ev),
        DomainStatus::new(DomainState::Running, StateReason::Unknown)
    );

    lifecycle::inject_nmi(&client).await.unwrap();

    lifecycle::quit(&client).await.unwrap();
    let ev = events
        .wait_for("SHUTDOWN", "vm", t, |e| e.name == "SHUTDOWN")
        .await
        .unwrap();
    assert_eq!(ev.data, json!({"guest": false, "reason": "host-qmp-quit"}));
    let st = step(ev);
    assert_eq!(
        (st.state, st.reason),
        (DomainState::ShuttingDown, StateReason::User)
    );
    let status = vm.proc().wait().await.unwrap();
    assert_eq!(status.code(), Some(0));
    let st = next_status(st, &LifecycleInput::QemuExited);
    assert_eq!(
        (st.state, st.reason),
        (DomainState::Shutoff, StateReason::Destroyed)
    );
    // The connection is gone: commands fail at once, the event stream ends.
    assert!(matches!(
        client.execute("query-status", None).await,
        Err(QmpError::Disconnected { .. })
    ));
    assert_eq!(events.recv().await, None);
}

#[tokio::test]
async fn kill_sends_sigterm_and_qemu_reports_host_signal() {
    let mut vm = vm().await;
    let mut events = vm.client().events();
    let status = vm.proc().kill(Duration::from_secs(10)).await.unwrap();
    let ev = events
        .wait_for("SHUTDOWN", "vm", Duration::from_secs(5), |e| {
            e.name == "SHUTDOWN"
        })
        .await
        .unwrap();
    assert_eq!(ev.data, json!({"guest": false, "reason": "host-signal"}));
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn sigkill_ends_qemu_without_shutdown_event() {
    let mut vm = vm().await;
    vm.proc().signal(libc::SIGKILL).unwrap();
    let status = vm.proc().wait().await.unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    // The state after an exit without SHUTDOWN is Shutoff/Crashed.
    let st = next_status(
        DomainStatus::new(DomainState::Running, StateReason::Unknown),
        &LifecycleInput::QemuExited,
    );
    assert_eq!(
        (st.state, st.reason),
        (DomainState::Shutoff, StateReason::Crashed)
    );
}

fn disk(vm: &TestVm, n: u32, bus: &str, size: u64) -> DiskAttach {
    let image = vm.path(&format!("disk{n}.raw"));
    raw_image(&image, size);
    DiskAttach {
        blockdevs: vec![
            json!({"driver": "file", "filename": image, "node-name": format!("libvirt-{n}-storage"),
                   "auto-read-only": true, "discard": "unmap", "cache": {"direct": false, "no-flush": false}}),
            json!({"driver": "raw", "file": format!("libvirt-{n}-storage"), "node-name": format!("libvirt-{n}-format"),
                   "read-only": false, "discard": "unmap"}),
        ],
        device: if bus.starts_with("scsi") {
            json!({"driver": "scsi-hd", "bus": bus, "channel": 0, "scsi-id": 0, "lun": n,
                   "drive": format!("libvirt-{n}-format"), "id": format!("ua-disk{n}"), "write-cache": "on"})
        } else {
            json!({"driver": "virtio-blk-pci", "bus": bus, "addr": "0x0",
                   "drive": format!("libvirt-{n}-format"), "id": format!("ua-disk{n}"), "write-cache": "on"})
        },
    }
}

#[tokio::test]
async fn virtio_disk_attach_resize_and_unplug_timeout_without_guest() {
    let vm = vm().await;
    let c = vm.client();
    assert_eq!(
        hotplug::free_root_ports(c).await.unwrap(),
        vec!["pci.1", "pci.2", "pci.3"]
    );
    hotplug::attach_disk(c, &disk(&vm, 1, "pci.1", 1 << 20))
        .await
        .unwrap();
    assert_eq!(
        hotplug::free_root_ports(c).await.unwrap(),
        vec!["pci.2", "pci.3"]
    );
    let drive = c
        .execute(
            "qom-get",
            Some(json!({"path": "/machine/peripheral/ua-disk1", "property": "drive"})),
        )
        .await
        .unwrap();
    assert_eq!(drive, json!("libvirt-1-format"));
    assert_eq!(
        node_names(c).await,
        vec!["libvirt-1-format", "libvirt-1-storage"]
    );

    hotplug::resize_disk(c, "libvirt-1-format", 4 << 20)
        .await
        .unwrap();
    let b = block_of(c, "ua-disk1").await;
    assert_eq!(b["inserted"]["image"]["virtual-size"], json!(4 << 20));
    assert_eq!(
        std::fs::metadata(vm.path("disk1.raw")).unwrap().len(),
        4 << 20
    );

    // Without a guest OS nobody acknowledges the PCIe unplug: the wait times out and names it.
    let err = hotplug::detach_disk(
        c,
        &DiskDetach {
            device_id: "ua-disk1".into(),
            node_names: vec!["libvirt-1-format".into(), "libvirt-1-storage".into()],
        },
        Duration::from_millis(500),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "hotplug of ua-disk1 failed at device_del ua-disk1"
    );
    match err {
        QmpError::Hotplug { source, .. } => assert_eq!(
            source.to_string(),
            "no DEVICE_DELETED event for ua-disk1 within 500ms"
        ),
        other => panic!("unexpected {other:?}"),
    }
    // Nodes stay while the device may still use them.
    assert_eq!(
        node_names(c).await,
        vec!["libvirt-1-format", "libvirt-1-storage"]
    );
}

#[tokio::test]
async fn scsi_disk_attach_and_detach_complete() {
    let vm = vm().await;
    let c = vm.client();
    hotplug::attach_disk(c, &disk(&vm, 1, "scsi0.0", 1 << 20))
        .await
        .unwrap();
    let b = block_of(c, "ua-disk1").await;
    assert_eq!(b["inserted"]["node-name"], json!("libvirt-1-format"));
    hotplug::detach_disk(
        c,
        &DiskDetach {
            device_id: "ua-disk1".into(),
            node_names: vec!["libvirt-1-format".into(), "libvirt-1-storage".into()],
        },
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(block_of(c, "ua-disk1").await, Value::Null);
    assert_eq!(node_names(c).await, Vec::<String>::new());
}

#[tokio::test]
async fn failed_disk_attach_rolls_back_added_nodes() {
    let vm = vm().await;
    let c = vm.client();
    // device_add fails (no such bus): both nodes are deleted again.
    let bad_bus = disk(&vm, 2, "pci.99", 1 << 20);
    let err = hotplug::attach_disk(c, &bad_bus).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "hotplug of ua-disk2 failed at device_add ua-disk2"
    );
    match &err {
        QmpError::Hotplug {
            source,
            rollback_errors,
            ..
        } => {
            assert_eq!(rollback_errors, &Vec::<String>::new());
            assert!(
                matches!(**source, QmpError::Command { ref class, .. } if class == "GenericError")
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(node_names(c).await, Vec::<String>::new());

    // The format node fails (missing backing node): the storage node is deleted again.
    let mut bad_format = disk(&vm, 3, "pci.1", 1 << 20);
    bad_format.blockdevs[1]["file"] = json!("no-such-node");
    let err = hotplug::attach_disk(c, &bad_format).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "hotplug of ua-disk3 failed at blockdev-add libvirt-3-format"
    );
    assert_eq!(node_names(c).await, Vec::<String>::new());

    // An argument object without node-name is rejected before anything is sent.
    let mut no_name = disk(&vm, 4, "pci.1", 1 << 20);
    no_name.blockdevs[0]
        .as_object_mut()
        .unwrap()
        .remove("node-name");
    let err = hotplug::attach_disk(c, &no_name).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "hotplug argument blockdevs[0]: missing string member \"node-name\""
    );
}

#[tokio::test]
async fn cdrom_media_change_and_eject() {
    let vm = vm().await;
    let c = vm.client();
    let iso = vm.path("cd.iso");
    raw_image(&iso, 2 << 20);
    let change = hotplug::CdromChange {
        device_id: "ua-cdrom".into(),
        old_node_names: vec![],
        new_blockdevs: vec![
            json!({"driver": "file", "filename": iso, "node-name": "libvirt-5-storage", "read-only": true}),
            json!({"driver": "raw", "file": "libvirt-5-storage", "node-name": "libvirt-5-format", "read-only": true}),
        ],
    };
    hotplug::change_cdrom(c, &change).await.unwrap();
    let b = block_of(c, "ua-cdrom").await;
    assert_eq!(
        (
            b["inserted"]["node-name"].clone(),
            b["inserted"]["ro"].clone(),
            b["tray_open"].clone()
        ),
        (json!("libvirt-5-format"), json!(true), json!(false))
    );
    let eject: hotplug::CdromChange = hotplug::CdromChange {
        device_id: "ua-cdrom".into(),
        old_node_names: vec!["libvirt-5-format".into(), "libvirt-5-storage".into()],
        new_blockdevs: vec![],
    };
    hotplug::change_cdrom(c, &eject).await.unwrap();
    let b = block_of(c, "ua-cdrom").await;
    assert_eq!(
        (b.get("inserted"), b["tray_open"].clone()),
        (None, json!(false))
    );
    assert_eq!(node_names(c).await, Vec::<String>::new());
}

/// A tap made with TUNSETIFF in this netns, unique per test; gone when the fd closes.
fn test_tap() -> (String, std::os::fd::OwnedFd) {
    let name = unique("qt");
    let fd = tap::open_tap(&name, true).unwrap();
    (name, fd)
}

#[tokio::test]
async fn nic_attach_set_link_and_rollback() {
    let vm = vm().await;
    let c = vm.client();
    let (_name, fd) = test_tap();
    let nic = NicAttach {
        tap_fd: fd,
        fd_name: "tapfd-net1".into(),
        extra_fds: vec![],
        netdev: json!({"type": "tap", "fd": "tapfd-net1", "id": "hostua-net1"}),
        device: json!({"driver": "virtio-net-pci", "netdev": "hostua-net1", "id": "ua-net1",
                       "mac": "02:00:00:00:00:11", "bus": "pci.2", "addr": "0x0", "romfile": ""}),
    };
    hotplug::attach_nic(c, &nic).await.unwrap();
    let mac = c
        .execute(
            "qom-get",
            Some(json!({"path": "/machine/peripheral/ua-net1", "property": "mac"})),
        )
        .await
        .unwrap();
    assert_eq!(mac, json!("02:00:00:00:00:11"));
    let rx = c
        .execute("query-rx-filter", Some(json!({"name": "ua-net1"})))
        .await
        .unwrap();
    assert_eq!(rx[0]["main-mac"], json!("02:00:00:00:00:11"));
    hotplug::set_link(c, "ua-net1", false).await.unwrap();
    hotplug::set_link(c, "ua-net1", true).await.unwrap();
    match hotplug::set_link(c, "ua-nope", false).await {
        Err(QmpError::Command { class, desc, .. }) => assert_eq!(
            (class.as_str(), desc.as_str()),
            ("DeviceNotFound", "Device 'ua-nope' not found")
        ),
        other => panic!("unexpected {other:?}"),
    }

    // device_add fails: the netdev is deleted again, so its id is free for a retry.
    let (_name2, fd2) = test_tap();
    let bad = NicAttach {
        tap_fd: fd2,
        fd_name: "tapfd-net2".into(),
        extra_fds: vec![],
        netdev: json!({"type": "tap", "fd": "tapfd-net2", "id": "hostua-net2"}),
        device: json!({"driver": "virtio-net-pci", "netdev": "hostua-net2", "id": "ua-net2",
                       "mac": "02:00:00:00:00:12", "bus": "pci.99"}),
    };
    let err = hotplug::attach_nic(c, &bad).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "hotplug of ua-net2 failed at device_add ua-net2"
    );
    match c
        .execute("netdev_del", Some(json!({"id": "hostua-net2"})))
        .await
    {
        Err(QmpError::Command { class, .. }) => assert_eq!(class, "DeviceNotFound"),
        other => panic!("netdev survived the rollback: {other:?}"),
    }
    // netdev_add fails (unknown fd name): the passed fd is closed again.
    let (_name3, fd3) = test_tap();
    let bad = NicAttach {
        tap_fd: fd3,
        fd_name: "tapfd-net3".into(),
        extra_fds: vec![(
            "tapfd-net3b".into(),
            std::os::fd::OwnedFd::from(tempfile::tempfile().unwrap()),
        )],
        netdev: json!({"type": "tap", "fd": "tapfd-other", "id": "hostua-net3"}),
        device: json!({"driver": "virtio-net-pci", "netdev": "hostua-net3", "id": "ua-net3"}),
    };
    let err = hotplug::attach_nic(c, &bad).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "hotplug of ua-net3 failed at netdev_add hostua-net3"
    );
    for name in ["tapfd-net3", "tapfd-net3b"] {
        match c.execute("closefd", Some(json!({ "fdname": name }))).await {
            Err(QmpError::Command { class, .. }) => assert_eq!(class, "GenericError"),
            other => panic!("fd {name} survived the rollback: {other:?}"),
        }
    }
}

#[tokio::test]
async fn add_fd_puts_the_descriptor_in_an_fdset() {
    let vm = vm().await;
    let c = vm.client();
    let f = tempfile::tempfile().unwrap();
    let (set, fd) = c.add_fd(f.as_fd(), None, Some("disk-a")).await.unwrap();
    let sets = c.execute("query-fdsets", None).await.unwrap();
    assert_eq!(
        sets,
        json!([{"fdset-id": set, "fds": [{"fd": fd, "opaque": "disk-a"}]}])
    );
    c.execute("remove-fd", Some(json!({"fdset-id": set})))
        .await
        .unwrap();
}

#[tokio::test]
async fn concurrent_commands_and_per_command_timeout_on_real_qemu() {
    let vm = vm().await;
    let c = vm.client().clone();
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move {
                let cmd = if i % 2 == 0 {
                    "query-status"
                } else {
                    "query-version"
                };
                (i, c.execute(cmd, None).await.unwrap())
            })
        })
        .collect();
    for call in calls {
        let (i, r) = call.await.unwrap();
        if i % 2 == 0 {
            assert_eq!(r["status"], json!("running"));
        } else {
            assert_eq!(r["qemu"]["major"], json!(7));
        }
    }
    match c.execute("no-such-command", None).await {
        Err(QmpError::Command { class, desc, .. }) => assert_eq!(
            (class.as_str(), desc.as_str()),
            (
                "CommandNotFound",
                "The command no-such-command has not been found"
            )
        ),
        other => panic!("unexpected {other:?}"),
    }
}
