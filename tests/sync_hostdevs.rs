//! GetDomain and the notified domain of a VMI with a PCI GPU, a vGPU, a generic host device and
//! an SR-IOV interface, which need VFIO hardware this machine lacks. The launcher runs in-process
//! as virt-handler drives it (`SyncVirtualMachine`, then `GetDomain`) with the device plugins'
//! variables in its environment (`PCI_RESOURCE_*`, `MDEV_PCI_RESOURCE_*`,
//! `KUBEVIRT_RESOURCE_NAME_<interface>`); its QEMU is a scripted QMP peer held by a stand-in
//! process named `qemu-system-x86_64` that holds the launcher's QMP socket, which the launcher's
//! recovery adopts as the domain's running QEMU (`sync/recover.rs`): the spec reported is the
//! converter's, so it is the one a real start reports. The domain must be complete (every
//! element a domain without host devices has) and list each host device as KubeVirt's
//! converter does and libvirt reports it (`Devices.HostDevices`: type, `managed`, `mode`,
//! source, alias, boot order, guest address), the SR-IOV VF as `sriov-<interface>`, which
//! virt-handler reads for the interface's status and SR-IOV hotplug.
//!
//! Needs root (the launcher's private directories are given to the qemu user).

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::handler::{get_domain, sync};
use testkit::in_process::{InProcess, LauncherRoot};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const UUID: &str = "5d307ca9-b3ef-428c-8861-06e72d69f2a1";
const GREETING: &str = r#"{"QMP": {"version": {"qemu": {"micro": 0, "minor": 1, "major": 10}, "package": "scripted"}, "capabilities": []}}"#;

fn vmi(uid: &str) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "hostdevs", "namespace": "default", "uid": uid},
        "spec": {
            "domain": {
                "firmware": {"uuid": UUID},
                "resources": {"requests": {"memory": "128Mi"}},
                "devices": {
                    "autoattachPodInterface": false,
                    "gpus": [
                        {"name": "gpu1", "deviceName": "nvidia.com/GA102GL_A10"},
                        {"name": "vgpu1", "deviceName": "nvidia.com/GRID_A10-4Q"}
                    ],
                    "hostDevices": [{"name": "fpga", "deviceName": "intel.com/n3000"}],
                    "interfaces": [{"name": "vf", "sriov": {}, "bootOrder": 2}]
                }
            },
            "networks": [{"name": "vf", "multus": {"networkName": "sriov-net"}}]
        },
        // Multus reports the VF's network in the pod (virt-handler's view).
        "status": {"interfaces": [{"name": "vf", "infoSource": "multus-status"}]}
    })
}

/// The device plugins' variables of a pod that got one device of each resource.
fn device_plugin_env() -> [(&'static str, &'static str); 5] {
    [
        ("PCI_RESOURCE_NVIDIA_COM_GA102GL_A10", "0000:65:00.0"),
        (
            "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_A10-4Q",
            "4b20d080-1b54-4048-85b3-a6a62d165c01",
        ),
        ("PCI_RESOURCE_INTEL_COM_N3000", "0000:b1:00.0"),
        ("KUBEVIRT_RESOURCE_NAME_vf", "intel.com/sriov_vf"),
        ("PCI_RESOURCE_INTEL_COM_SRIOV_VF", "0000:3b:02.3"),
    ]
}

/// What the scripted QEMU answers: a running domain with the planned UUID and the VFIO devices
/// of its command line; `None` for a command outside the script (answered with an error).
fn answer(cmd: &Value) -> Option<Value> {
    let args = &cmd["arguments"];
    Some(match cmd["execute"].as_str()? {
        "qmp_capabilities" => json!({}),
        "query-uuid" => json!({"UUID": UUID}),
        "query-status" => json!({"status": "running", "running": true, "singlestep": false}),
        "query-named-block-nodes" | "query-chardev" | "query-block" => json!([]),
        "qom-list" if args["path"] == "/machine/peripheral" => json!([
            {"name": "type", "type": "string"},
            {"name": "ua-gpu-gpu1", "type": "child<vfio-pci>"},
            {"name": "ua-gpu-vgpu1", "type": "child<vfio-pci-nohotplug>"},
            {"name": "ua-hostdevice-fpga", "type": "child<vfio-pci>"},
            {"name": "ua-sriov-vf", "type": "child<vfio-pci>"}
        ]),
        "qom-get" => match (args["path"].as_str()?, args["property"].as_str()?) {
            ("/machine", "type") => json!("pc-q35-7.2-machine"),
            ("/machine/peripheral/ua-sriov-vf", "host") => json!("0000:3b:02.3"),
            _ => return None,
        },
        _ => return None,
    })
}

/// Every command the scripted QEMU got (`execute`, and whether it was in the script).
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(String, bool)>>>;

/// Serves QMP on every connection of `listener`, recording the commands.
fn serve_qmp(listener: tokio::net::UnixListener) -> Seen {
    let all = Seen::default();
    let seen = all.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let (r, mut w) = s.into_split();
                let mut lines = BufReader::new(r).lines();
                if w.write_all(format!("{GREETING}\n").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
                while let Ok(Some(line)) = lines.next_line().await {
                    let Ok(cmd) = serde_json::from_str::<Value>(&line) else {
                        continue;
                    };
                    let answered = answer(&cmd);
                    let execute = cmd["execute"].as_str().unwrap_or_default().to_owned();
                    seen.lock().unwrap().push((execute, answered.is_some()));
                    let mut reply = match answered {
                        Some(r) => json!({"return": r}),
                        None => json!({"error": {"class": "GenericError", "desc": "not scripted"}}),
                    };
                    reply["id"] = cmd["id"].clone();
                    if w.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    all
}

/// The stand-in QEMU process: `sleep` named `qemu-system-x86_64`, holding the QMP listening
/// socket at fd 3 (as QEMU holds the launcher's pre-bound socket). Killed on drop.
struct StandIn(std::process::Child);

impl StandIn {
    fn start(listener: &std::os::unix::net::UnixListener) -> StandIn {
        let raw = listener.as_raw_fd();
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg0("qemu-system-x86_64").arg("600");
        // SAFETY: only dup2 between fork and exec (async-signal-safe); `raw` stays open.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(raw, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        StandIn(cmd.spawn().expect("spawn the stand-in QEMU"))
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn host_device<'a>(devices: &'a [Value], alias: &str) -> &'a Value {
    devices
        .iter()
        .find(|d| d["Alias"]["Name"] == alias)
        .unwrap_or_else(|| panic!("no host device {alias}: {devices:#?}"))
}

#[test]
fn get_domain_lists_gpus_host_devices_and_sriov_vfs() {
    // The only test of this binary: the environment is the pod's.
    for (k, v) in device_plugin_env() {
        std::env::set_var(k, v);
    }
    testkit::in_process::runtime().block_on(scenario());
}

async fn scenario() {
    let uid = format!("7e3c9a10-0000-4000-8000-{:012}", std::process::id());
    let root = LauncherRoot::new(std::path::Path::new("/dev/null"), &uid);
    let qmp = root.config.qmp_socket.clone();
    std::fs::create_dir_all(qmp.parent().unwrap()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&qmp).unwrap();
    let _qemu = StandIn::start(&listener);
    listener.set_nonblocking(true).unwrap();
    let seen = serve_qmp(tokio::net::UnixListener::from_std(listener).unwrap());

    let mut launcher = InProcess::start(root.config.clone(), &root.share_dir()).await;
    let (ok, message) = sync(&mut launcher.client, &vmi(&uid)).await;
    assert!(ok, "SyncVirtualMachine: {message}");
    let domain = get_domain(&mut launcher.client).await.expect("a domain");
    let spec = serde_json::to_value(&domain.spec).unwrap();

    // Complete: what every converted domain has, not only the host devices.
    for key in [
        "Name", "UUID", "Memory", "OS", "CPU", "VCPU", "Features", "Devices",
    ] {
        assert!(spec.get(key).is_some(), "no {key}: {spec:#}");
    }
    assert_eq!(spec["UUID"], UUID);
    assert!(spec["OS"]["Type"]["Machine"]
        .as_str()
        .is_some_and(|m| m.contains("q35")));
    let devices = &spec["Devices"];
    for list in ["Controllers", "Channels", "Serials", "Consoles"] {
        assert!(
            devices[list].as_array().is_some_and(|l| !l.is_empty()),
            "no {list}: {devices:#}"
        );
    }

    let host = devices["HostDevices"].as_array().expect("HostDevices");
    let aliases: Vec<&str> = host
        .iter()
        .map(|d| d["Alias"]["Name"].as_str().unwrap())
        .collect();
    // KubeVirt's order: generic host devices, GPUs (PCI, then mediated), SR-IOV.
    assert_eq!(
        aliases,
        ["hostdevice-fpga", "gpu-gpu1", "gpu-vgpu1", "sriov-vf"]
    );
    for d in host {
        assert_eq!(d["Alias"]["UserDefined"], true, "{d}");
        assert_eq!(d["Mode"], "subsystem", "{d}");
        assert_eq!(d["Address"]["Type"], "pci", "guest address: {d}");
    }
    let pci = |bus: &str, slot: &str, function: &str| json!({"Domain": "0x0000", "Bus": bus, "Slot": slot, "Function": function});
    let fpga = host_device(host, "hostdevice-fpga");
    assert_eq!(fpga["Type"], "pci");
    assert_eq!(fpga["Managed"], "no");
    assert_eq!(fpga["Source"]["Address"], pci("0xb1", "0x00", "0x0"));
    let gpu = host_device(host, "gpu-gpu1");
    assert_eq!(gpu["Source"]["Address"], pci("0x65", "0x00", "0x0"));
    let vgpu = host_device(host, "gpu-vgpu1");
    assert_eq!(vgpu["Type"], "mdev");
    assert_eq!(vgpu["Model"], "vfio-pci");
    assert_eq!(
        vgpu["Source"]["Address"],
        json!({"UUID": "4b20d080-1b54-4048-85b3-a6a62d165c01"})
    );
    assert_eq!(
        (&vgpu["Display"], &vgpu["RamFB"]),
        (&json!("on"), &json!("on"))
    );
    let vf = host_device(host, "sriov-vf");
    assert_eq!(vf["Type"], "pci");
    assert_eq!(vf["Managed"], "no");
    assert_eq!(vf["Source"]["Address"], pci("0x3b", "0x02", "0x3"));
    assert_eq!(vf["BootOrder"], json!({"Order": 2}));

    // virt-handler's notify server got the same domain (ADDED of the adopted QEMU).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events = launcher.received.lock().unwrap().clone();
        if let Some((_, d)) = events.last() {
            let notified = serde_json::to_value(&d.spec.devices).unwrap();
            assert_eq!(notified["HostDevices"], devices["HostDevices"]);
            break;
        }
        assert!(Instant::now() < deadline, "no domain event");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // virt-handler's SR-IOV hotplug finds the VF listed and running (QEMU's `host` of
    // `ua-sriov-vf`): nothing is plugged, and the domain lists it once.
    let asked = |seen: &Seen| {
        let seen = seen.lock().unwrap();
        seen.iter().filter(|(c, _)| c == "qom-get").count()
    };
    let before = asked(&seen);
    let r = launcher
        .client
        .hotplug_host_devices(testkit::handler::vmi_request(&vmi(&uid)))
        .await
        .expect("HotplugHostDevices")
        .into_inner();
    assert!(r.success, "{}", r.message);
    let deadline = Instant::now() + Duration::from_secs(10);
    while asked(&seen) == before {
        assert!(
            Instant::now() < deadline,
            "the hotplug never looked: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = get_domain(&mut launcher.client).await.expect("a domain");
    assert_eq!(
        after.spec.devices.host_devices,
        domain.spec.devices.host_devices
    );
    let seen = seen.lock().unwrap().clone();
    assert!(
        !seen.iter().any(|(c, _)| c == "device_add"),
        "nothing is plugged: {seen:?}"
    );
    eprintln!("QMP commands: {seen:?}");
}
