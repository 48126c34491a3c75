//! End to end through `qlauncher run` (monitor, launcher, SyncVmi, QEMU under TCG) in a throwaway
//! "pod" network namespace whose `eth0` is a veth to a "node" namespace, with a notify server
//! playing virt-handler on the launcher's `domain-notify-pipe.sock` and a command client on
//! `launcher-sock`. One guest boot serves every assertion: DHCP lease with the pod's DNS and search
//! list, the cloud-init user-data, the guest's HTTP reply fetched from the node through the pod IP
//! (masquerade DNAT of the listed port 80), 20 concurrent identical syncs that change nothing, QEMU
//! a child of the monitor, a hotplug disk and a bridge NIC on a Multus network attached and
//! detached by diff (the guest reports both; the pod's links are restored), the NIC's link taken
//! down and up, a missing Multus pod link refused, a cdrom medium ejected and inserted, a vCPU
//! hot-plugged (the guest brings it online), virtio-mem plugged and resized, pause and unpause,
//! SIGTERM to the monitor leading to `QLG: poweroff` and a clean exit, and the domain
//! notifications in order ending with KubeVirt's final delete notification.
//!
//! A second test boots a VMI whose Multus interface is attached from the start (tap opened by
//! QEMU by name) and unplugs it by diff.
//!
//! Needs root and the test guest (`scripts/build-guest`).

use testkit::guest;
use testkit::notify;
use testkit::notify::Received;

use base64::Engine as _;
use guest::GuestImages;
use qlauncher::monitor::procfs;
use qlauncher::sync::domain::{ApiDomain, LifeCycle, StateChangeReason};
use qlauncher::sync::rpc::proto::cmd::v1 as cmd;
use qlauncher::sync::rpc::proto::cmd::v1::cmd_client::CmdClient;
use qlauncher::sync::rpc::uds;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use testkit::guest::wait_log_marker as wait_marker;
use testkit::hotplug::{push_blue_spec, push_hp1_spec, BLUE_POD_IFACE};
use testkit::netns::{Netns, PodNet, PodNetSpec, KUBELET_RESOLV_CONF};
use testkit::process::Running;

/// The pod: `eth0` 10.244.0.5/24 (MTU 1450) on a veth to the node's `vpod` 10.244.0.1, a
/// resolv.conf as Kubernetes writes it (bind-mounted by `ip netns exec`), and the Multus link of
/// the secondary network `blue`.
fn pod_net() -> PodNet {
    let net = PodNet::with(&PodNetSpec {
        resolv_conf: Some(KUBELET_RESOLV_CONF.into()),
        ..PodNetSpec::default()
    });
    let (node, pod) = (&net.node, &net.pod);
    // What Multus attaches for the secondary network `blue` (KubeVirt's hashed pod interface
    // name), an L2 link without addresses.
    node.ip(&[
        "link",
        "add",
        "vblue",
        "type",
        "veth",
        "peer",
        "name",
        BLUE_POD_IFACE,
        "netns",
        &pod.name,
    ]);
    node.ip(&["link", "set", "vblue", "mtu", "1400", "up"]);
    pod.ip(&[
        "link",
        "set",
        BLUE_POD_IFACE,
        "address",
        BLUE_POD_MAC,
        "mtu",
        "1400",
        "up",
    ]);
    net
}

/// Starts `qlauncher run VMI_FILE --root ROOT` in the pod with the guest's qcow2 as the
/// containerDisk, its stderr to `ROOT/run.log`; the whole process tree is killed on drop.
fn start_run(net: &PodNet, root: &Path, vmi_file: &Path, images: &GuestImages) -> Running {
    let mut command = net.pod.command(testkit::qlauncher_bin());
    command
        .arg("run")
        .arg(vmi_file)
        .arg("--root")
        .arg(root)
        .args(["--emulation", "on", "--container-disk"])
        .arg(format!("rootdisk={}", images.disk_qcow2.display()));
    Running::start(command, &root.join("run.log"))
}

/// Its MAC, which the hot-plugged guest NIC takes (bridge binding, no MAC in the spec).
const BLUE_POD_MAC: &str = "0a:58:0a:f4:01:07";

/// `(name, mac, master)` of the pod's links, sorted.
fn pod_links(ns: &Netns) -> Vec<(String, String, String)> {
    let out = ns.ip(&["-j", "link", "show"]);
    let links: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let mut v: Vec<(String, String, String)> = links
        .iter()
        .map(|l| {
            let s = |k: &str| l[k].as_str().unwrap_or_default().to_string();
            (s("ifname"), s("address"), s("master"))
        })
        .collect();
    v.sort();
    v
}

/// Runs `command` in the guest's shell on the serial console; returns its output.
async fn guest_shell(socket: &Path, command: &str) -> String {
    let socket = socket.to_path_buf();
    let command = command.to_string();
    tokio::task::spawn_blocking(move || {
        let mut console = guest::Console::connect(&socket, Duration::from_secs(10)).unwrap();
        // The prompt was printed before we connected: ask for a new one.
        console.send(b"\n").unwrap();
        let (status, out) = console.run(&command, Duration::from_secs(60)).unwrap();
        assert_eq!(status, 0, "{command}: {out}");
        out.trim().to_string()
    })
    .await
    .unwrap()
}

const USER_DATA: &str = "#cloud-config\nhostname: demo\n";

fn demo_vmi() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "demo", "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 60,
            "domain": {
                // 1 GiB: the least KubeVirt allows memory hotplug for (maxGuest defaults to 4 GiB).
                "resources": {"requests": {"memory": "1Gi"}},
                "devices": {
                    "rng": {},
                    "disks": [
                        {"name": "rootdisk", "disk": {"bus": "virtio"}},
                        {"name": "cloudinit", "disk": {"bus": "virtio"}},
                        {"name": "cd1", "cdrom": {"bus": "sata"}}
                    ],
                    "interfaces": [{
                        "name": "default",
                        "masquerade": {},
                        "ports": [{"name": "http", "port": 80}]
                    }]
                }
            },
            "networks": [{"name": "default", "pod": {}}],
            "volumes": [
                {"name": "rootdisk", "containerDisk": {"image": "qlauncher/test-guest:latest"}},
                {"name": "cloudinit", "cloudInitNoCloud": {"userData": USER_DATA}},
                {"name": "cd1", "persistentVolumeClaim": {"claimName": "cd1", "hotpluggable": true}}
            ]
        },
        "status": {"volumeStatus": [cd1_status("Ready")]}
    })
}

/// The volume status of the cdrom's hotplug volume `cd1` in `phase`.
fn cd1_status(phase: &str) -> serde_json::Value {
    serde_json::json!({"name": "cd1", "target": "", "phase": phase, "hotplugVolume": {}})
}

/// The guest's serial console log under a `qlauncher run` root. The VMI's uid is derived from
/// namespace/name by `run`, so its private directory is found rather than named; waits up to 60 s.
async fn serial_log(root: &Path) -> PathBuf {
    let private = root.join("var/run/kubevirt-private");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let found = std::fs::read_dir(&private).ok().and_then(|d| {
            d.flatten()
                .map(|e| e.path().join("virt-serial0-log"))
                .find(|p| p.exists())
        });
        if let Some(p) = found {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "no serial log; run.log:\n{}",
            std::fs::read_to_string(root.join("run.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `(pid, comm)` of the children of `pid`, sorted.
fn children_of(pid: u32) -> Vec<(u32, String)> {
    let mut out: Vec<(u32, String)> = procfs::children(pid as i32)
        .into_iter()
        .map(|c| (c.pid as u32, c.comm))
        .collect();
    out.sort();
    out
}

async fn futures_join_all<T>(handles: impl Iterator<Item = tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::new();
    for h in handles.collect::<Vec<_>>() {
        out.push(h.await.unwrap());
    }
    out
}

/// The notifications as `(event type, domain without guest-agent data)`, leaving out MODIFIED
/// events that only carried new guest-agent data (the test guest runs an agent, whose interfaces,
/// OS info and freeze state arrive at a time of their own).
fn domain_events(received: &Received) -> Vec<(String, ApiDomain)> {
    let mut out: Vec<(String, ApiDomain)> = Vec::new();
    for (t, d) in received.lock().unwrap().iter() {
        let d = without_agent_data(d);
        if out.last().is_some_and(|(lt, ld)| lt == t && *ld == d) {
            continue;
        }
        out.push((t.clone(), d));
    }
    out
}

/// The lifecycle state of each of [`domain_events`].
fn state_events(received: &Received) -> Vec<(String, (LifeCycle, StateChangeReason, bool))> {
    domain_events(received)
        .iter()
        .map(|(t, d)| (t.clone(), state_of(d)))
        .collect()
}

/// `d` without what the guest agent reports (it changes on its own schedule).
fn without_agent_data(d: &ApiDomain) -> ApiDomain {
    let mut d = d.clone();
    d.status.interfaces.clear();
    d.status.os_info = Default::default();
    d.status.fs_freeze_status = Default::default();
    // The agent channel's state follows the guest agent opening and closing its port.
    for c in &mut d.spec.devices.channels {
        c.target.state = None;
    }
    d
}

fn state_of(d: &ApiDomain) -> (LifeCycle, StateChangeReason, bool) {
    (
        d.status.status,
        d.status.reason,
        d.object_meta.deletion_timestamp.is_some(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_vmi_boots_serves_http_resyncs_idempotently_and_shuts_down_on_sigterm() {
    let images = GuestImages::locate();
    let net = pod_net();
    let root = tempfile::tempdir().unwrap();
    let share = root.path().join("var/run/kubevirt");
    std::fs::create_dir_all(&share).unwrap();
    let (received, _stop_notify) = notify::start(&share.join("domain-notify-pipe.sock"));
    let vmi_file = root.path().join("demo.json");
    std::fs::write(&vmi_file, serde_json::to_vec(&demo_vmi()).unwrap()).unwrap();

    // The cdrom's hotplug volume, mounted into the pod before the domain starts.
    let hotplug_dir = root.path().join("var/run/kubevirt/hotplug-disks");
    std::fs::create_dir_all(&hotplug_dir).unwrap();
    std::fs::File::create(hotplug_dir.join("cd1.img"))
        .unwrap()
        .set_len(2 << 20)
        .unwrap();
    let mut guard = start_run(&net, root.path(), &vmi_file, &images);
    let monitor_pid = guard.child.id();

    let serial_log = serial_log(root.path()).await;

    let boot = Duration::from_secs(240);
    let lease = wait_marker(&serial_log, "QLG: lease eth0", boot).await;
    assert_eq!(
        lease,
        "QLG: lease eth0 ip=10.0.2.2/24 router=10.0.2.1 dns=10.96.0.10 \
         search=default.svc.cluster.local,svc.cluster.local,cluster.local mtu=1450 \
         hostname=demo domain=default.svc.cluster.local"
    );
    let user_data = wait_marker(&serial_log, "QLG: user-data ", boot).await;
    let user_data = base64::engine::general_purpose::STANDARD
        .decode(user_data.trim_start_matches("QLG: user-data "))
        .unwrap();
    assert_eq!(String::from_utf8(user_data).unwrap(), USER_DATA);
    wait_marker(&serial_log, "QLG: http ready", boot).await;

    // Node -> pod IP:80 -> DNAT to the guest (retried: the guest's httpd may still be starting).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let http = net.node.exec(&[
            "timeout",
            "10",
            "busybox",
            "wget",
            "-q",
            "-O",
            "-",
            "http://10.244.0.5/",
        ]);
        if http.status.success() {
            assert_eq!(String::from_utf8_lossy(&http.stdout), "qlg-http-ok\n");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no HTTP reply through the pod IP: {:?} {}",
            http.status,
            String::from_utf8_lossy(&http.stderr)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // QEMU is a child of the monitor (PID 1 of the pod), next to the launcher.
    let qemu_pids = || -> Vec<u32> {
        children_of(monitor_pid)
            .into_iter()
            .filter(|(_, comm)| comm.starts_with("qemu"))
            .map(|(p, _)| p)
            .collect()
    };
    let qemu_before = qemu_pids();
    assert_eq!(qemu_before.len(), 1, "{:?}", children_of(monitor_pid));

    // virt-handler syncs the same VMI again: success, nothing restarted, the domain unchanged.
    let launcher_sock = share.join("sockets/launcher-sock");
    let channel = uds::connect(&launcher_sock, Duration::from_secs(5))
        .await
        .unwrap();
    let client = CmdClient::new(channel);
    let get_domain = |mut c: CmdClient<tonic::transport::Channel>| async move {
        let answer = c
            .get_domain(cmd::EmptyRequest {})
            .await
            .unwrap()
            .into_inner();
        serde_json::from_str::<ApiDomain>(&answer.domain).unwrap()
    };
    let before = get_domain(client.clone()).await;
    assert_eq!(
        (before.status.status, before.status.reason),
        (LifeCycle::Running, StateChangeReason::Unknown)
    );
    // virt-handler copies the domain's machine into status.machine, and migration target pods
    // are pinned to machine-type.node.kubevirt.io/<it>: the node labeller labels it for this QEMU.
    let machine = before
        .spec
        .machine()
        .expect("the domain's machine")
        .to_owned();
    assert!(
        machine.starts_with("pc-q35-"),
        "q35 as QEMU resolved it: {machine}"
    );
    let qemu = qlauncher::sync::config::find_in_path("qemu-system-x86_64");
    let labelled = testkit::labels::labelled_machines(&qemu);
    assert!(labelled.contains(&machine), "{machine} not in {labelled:?}");
    let mut vmi = demo_vmi();
    vmi["metadata"]["uid"] = before.object_meta.uid.clone().into();
    let events_before = state_events(&received).len();
    let sync = |mut c: CmdClient<tonic::transport::Channel>, vmi: serde_json::Value| async move {
        let answer = c
            .sync_virtual_machine(testkit::handler::vmi_request(&vmi))
            .await
            .unwrap()
            .into_inner();
        (answer.success, answer.message)
    };
    // 20 identical syncs at once: one QEMU, nothing restarted.
    let answers =
        futures_join_all((0..20).map(|_| tokio::spawn(sync(client.clone(), vmi.clone())))).await;
    assert_eq!(answers, vec![(true, String::new()); 20]);
    assert_eq!(
        without_agent_data(&get_domain(client.clone()).await),
        without_agent_data(&before)
    );
    assert_eq!(qemu_pids(), qemu_before);
    assert_eq!(state_events(&received).len(), events_before);

    // Hotplug by diff: a hotpluggable volume appears (virt-handler mounted it) and a bridge
    // interface on the Multus network `blue` (Multus attached it to the pod), then both go away.
    std::fs::File::create(hotplug_dir.join("hp1.img"))
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let links_before = pod_links(&net.pod);
    let mut with_devices = vmi.clone();
    push_hp1_spec(&mut with_devices, None);
    push_blue_spec(&mut with_devices);
    with_devices["status"] = serde_json::json!({
        "volumeStatus": [
            cd1_status("Ready"),
            {"name": "hp1", "target": "", "phase": "Ready", "hotplugVolume": {}}
        ],
        "interfaces": [{"name": "blue", "podInterfaceName": BLUE_POD_IFACE,
                        "infoSource": "multus-status"}]
    });
    assert_eq!(
        sync(client.clone(), with_devices.clone()).await,
        (true, String::new())
    );
    assert_eq!(
        wait_marker(&serial_log, "QLG: disk-added", Duration::from_secs(60)).await,
        "QLG: disk-added vdc size=16777216"
    );
    assert_eq!(
        wait_marker(&serial_log, "QLG: nic-added", Duration::from_secs(60)).await,
        format!("QLG: nic-added eth1 mac={BLUE_POD_MAC}")
    );
    // The bridge binding of `blue` in the pod: the pod link renamed and enslaved, a stand-in
    // with the pod MAC, the tap on the bridge.
    let bridge = "k6t-16477688c0e";
    let blue_links: Vec<(String, String)> = pod_links(&net.pod)
        .into_iter()
        .filter(|(n, _, _)| n.contains("16477688c0e"))
        .map(|(n, _, m)| (n, m))
        .collect();
    assert_eq!(
        blue_links,
        vec![
            ("16477688c0e-nic".to_string(), bridge.to_string()),
            (bridge.to_string(), String::new()),
            (BLUE_POD_IFACE.to_string(), String::new()),
            ("tap16477688c0e".to_string(), bridge.to_string()),
        ]
    );
    let with_nic = get_domain(client.clone()).await;
    let ifaces: Vec<(String, Option<String>)> = with_nic
        .spec
        .devices
        .interfaces
        .iter()
        .map(|i| {
            (
                i.alias.as_ref().unwrap().name.clone(),
                i.mac.as_ref().map(|m| m.mac.clone()),
            )
        })
        .collect();
    assert_eq!(
        ifaces,
        vec![
            ("default".to_string(), Some("0a:58:0a:f4:00:05".to_string())),
            ("blue".to_string(), Some(BLUE_POD_MAC.to_string())),
        ]
    );
    // Link state by diff: `state: down` takes the guest's carrier away, `up` gives it back.
    let serial_sock = serial_log.with_file_name("virt-serial0");
    let carrier = "cat /sys/class/net/eth1/carrier";
    let mut link_down = with_devices.clone();
    link_down["spec"]["domain"]["devices"]["interfaces"][1]["state"] = "down".into();
    assert_eq!(sync(client.clone(), link_down).await, (true, String::new()));
    assert_eq!(guest_shell(&serial_sock, carrier).await, "0");
    assert_eq!(
        sync(client.clone(), with_devices.clone()).await,
        (true, String::new())
    );
    assert_eq!(guest_shell(&serial_sock, carrier).await, "1");

    // Removal: the volume leaves the spec, the interface turns `absent` (KubeVirt's unplug).
    let mut without = vmi.clone();
    without["spec"]["domain"]["devices"]["interfaces"] =
        with_devices["spec"]["domain"]["devices"]["interfaces"].clone();
    without["spec"]["domain"]["devices"]["interfaces"][1]["state"] = "absent".into();
    without["spec"]["networks"] = with_devices["spec"]["networks"].clone();
    without["status"] = serde_json::json!({
        "volumeStatus": [cd1_status("Ready")],
        "interfaces": with_devices["status"]["interfaces"]
    });
    assert_eq!(sync(client.clone(), without).await, (true, String::new()));
    assert_eq!(
        wait_marker(&serial_log, "QLG: disk-removed", Duration::from_secs(60)).await,
        "QLG: disk-removed vdc"
    );
    assert_eq!(
        wait_marker(&serial_log, "QLG: nic-removed", Duration::from_secs(60)).await,
        "QLG: nic-removed eth1"
    );
    // The pod link is back as Multus made it; nothing of the binding is left.
    assert_eq!(pod_links(&net.pod), links_before);
    assert_eq!(
        get_domain(client.clone()).await.spec.devices.interfaces,
        before.spec.devices.interfaces
    );
    assert_eq!(qemu_pids(), qemu_before);

    // A Multus interface whose pod link is missing: the sync fails naming it, nothing changes.
    let mut red = vmi.clone();
    red["spec"]["domain"]["devices"]["interfaces"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "red", "bridge": {}}));
    red["spec"]["networks"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "red", "multus": {"networkName": "red-net"}}));
    red["status"]["interfaces"] =
        serde_json::json!([{"name": "red", "infoSource": "domain, multus-status"}]);
    assert_eq!(
        sync(client.clone(), red).await,
        (
            false,
            "interface red: setting up the network: pod interface \"podb1f51a511f1\" not found"
                .to_string()
        )
    );
    assert_eq!(pod_links(&net.pod), links_before);

    // cdrom media by diff: the hotplug volume of the sata cdrom `cd1` stops being ready (ejected),
    // then is ready again (inserted). The test guest has no AHCI driver, so QEMU's acceptance of
    // the tray and medium commands is what is checked.
    let mut detaching = vmi.clone();
    detaching["status"]["volumeStatus"] = serde_json::json!([cd1_status("Detaching")]);
    assert_eq!(sync(client.clone(), detaching).await, (true, String::new()));
    assert_eq!(
        sync(client.clone(), vmi.clone()).await,
        (true, String::new())
    );

    // vCPU hotplug (SyncVirtualMachineCPUs): 1 socket at boot, maxSockets 4 by default; two
    // sockets asked for, the guest sees a second CPU it can bring online.
    let cpus = "cat /sys/devices/system/cpu/present";
    assert_eq!(guest_shell(&serial_sock, cpus).await, "0");
    let mut two_cpus = vmi.clone();
    two_cpus["spec"]["domain"]["cpu"] = serde_json::json!({"sockets": 2});
    let answer = client
        .clone()
        .sync_virtual_machine_cp_us(testkit::handler::vmi_only(&two_cpus))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((answer.success, answer.message), (true, String::new()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while guest_shell(&serial_sock, cpus).await != "0-1" {
        assert!(
            Instant::now() < deadline,
            "the guest did not see the new vCPU"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        guest_shell(
            &serial_sock,
            "echo 1 > /sys/devices/system/cpu/cpu1/online; cat /sys/devices/system/cpu/online"
        )
        .await,
        "0-1"
    );

    // Memory hotplug (SyncVirtualMachineMemory): QEMU takes the virtio-mem device plugged with
    // 1 GiB requested above the boot memory, then its resize to 2 GiB (the test guest has no
    // virtio-mem driver, so only QEMU's acceptance is checked).
    for guest_memory in ["2Gi", "3Gi"] {
        let mut more_memory = vmi.clone();
        more_memory["spec"]["domain"]["memory"] = serde_json::json!({"guest": guest_memory});
        let answer = client
            .clone()
            .sync_virtual_machine_memory(testkit::handler::vmi_only(&more_memory))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (answer.success, answer.message),
            (true, String::new()),
            "{guest_memory}"
        );
    }

    // Pause and unpause on user request.
    let vmi_request = || testkit::handler::vmi_only(&vmi);
    let answer = client
        .clone()
        .pause_virtual_machine(vmi_request())
        .await
        .unwrap();
    assert!(answer.into_inner().success);
    // The state follows QMP's STOP event, which may arrive just after the reply.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let paused = get_domain(client.clone()).await;
        let state = (paused.status.status, paused.status.reason);
        if state == (LifeCycle::Paused, StateChangeReason::User) {
            break;
        }
        assert!(Instant::now() < deadline, "domain not paused: {state:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = client
        .clone()
        .unpause_virtual_machine(vmi_request())
        .await
        .unwrap();
    assert!(answer.into_inner().success);

    // SIGTERM to PID 1: ACPI power button, the guest powers off, everything exits cleanly.
    testkit::run(&["kill", "-TERM", &monitor_pid.to_string()]);
    wait_marker(&serial_log, "QLG: poweroff", Duration::from_secs(60)).await;
    let child = &mut guard.child;
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "qlauncher run did not exit");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        status.success(),
        "exit {status:?}; run.log:\n{}",
        std::fs::read_to_string(root.path().join("run.log")).unwrap_or_default()
    );
    for pid in qemu_before {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "QEMU alive");
    }

    // The lifecycle as virt-handler sees it. Between two state changes the domain may be
    // MODIFIED with the same state (a NIC plugged or unplugged, the agent channel connecting,
    // the graceful-shutdown metadata): those events each carry a changed domain (identical
    // consecutive events are folded by `domain_events`), so the states are compared folded.
    let mut events = state_events(&received);
    events.dedup();
    use LifeCycle as L;
    use StateChangeReason as R;
    let m = |s, r, deleted| ("MODIFIED".to_string(), (s, r, deleted));
    assert_eq!(
        events,
        vec![
            ("ADDED".to_string(), (L::Paused, R::StartingUp, false)),
            m(L::Running, R::Unknown, false),
            m(L::Paused, R::User, false),
            m(L::Running, R::Unknown, false),
            m(L::ShuttingDown, R::User, false),
            m(L::Shutoff, R::Shutdown, false),
            m(L::NoState, R::NonExistent, true),
        ]
    );
    let received = domain_events(&received);
    // NIC plugged, then NIC unplugged, each notified.
    let plugged = received
        .iter()
        .position(|(_, d)| d.spec.devices.interfaces == with_nic.spec.devices.interfaces)
        .expect("a notification with the plugged NIC");
    assert!(
        received[plugged..]
            .iter()
            .any(|(_, d)| d.spec.devices.interfaces == before.spec.devices.interfaces),
        "a notification with the NIC unplugged after the one with it plugged"
    );
    let last = &received.last().expect("notifications").1;
    assert_eq!(last.spec.name, "default_demo");
    assert_eq!(
        last.spec
            .metadata
            .kubevirt
            .grace_period
            .as_ref()
            .and_then(|g| g.marked_for_graceful_shutdown),
        Some(true)
    );
}

/// A VMI that boots with a bridge interface on the Multus network `blue` (already attached to the
/// pod): the guest sees it at boot with the pod link's MAC; turning it `absent` unplugs it and
/// gives the pod link back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multus_interface_present_at_boot_is_unplugged_by_diff() {
    let images = GuestImages::locate();
    let net = pod_net();
    let root = tempfile::tempdir().unwrap();
    let share = root.path().join("var/run/kubevirt");
    std::fs::create_dir_all(share.join("hotplug-disks")).unwrap();
    std::fs::File::create(share.join("hotplug-disks/cd1.img"))
        .unwrap()
        .set_len(2 << 20)
        .unwrap();
    let (_received, _stop_notify) = notify::start(&share.join("domain-notify-pipe.sock"));
    let mut vmi = demo_vmi();
    push_blue_spec(&mut vmi);
    vmi["status"]["interfaces"] =
        serde_json::json!([{"name": "blue", "infoSource": "domain, multus-status"}]);
    let vmi_file = root.path().join("demo.json");
    std::fs::write(&vmi_file, serde_json::to_vec(&vmi).unwrap()).unwrap();
    let _guard = start_run(&net, root.path(), &vmi_file, &images);
    let serial_log = serial_log(root.path()).await;
    let boot = Duration::from_secs(240);
    assert_eq!(
        wait_marker(&serial_log, "QLG: nic eth1", boot).await,
        format!("QLG: nic eth1 mac={BLUE_POD_MAC}")
    );
    wait_marker(&serial_log, "QLG: http ready", boot).await;
    let channel = uds::connect(&share.join("sockets/launcher-sock"), Duration::from_secs(5))
        .await
        .unwrap();
    let mut client = CmdClient::new(channel);
    let domain = client
        .get_domain(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    let domain: ApiDomain = serde_json::from_str(&domain.domain).unwrap();
    vmi["metadata"]["uid"] = domain.object_meta.uid.clone().into();
    vmi["spec"]["domain"]["devices"]["interfaces"][1]["state"] = "absent".into();
    let answer = client
        .sync_virtual_machine(testkit::handler::vmi_only(&vmi))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((answer.success, answer.message), (true, String::new()));
    assert_eq!(
        wait_marker(&serial_log, "QLG: nic-removed", Duration::from_secs(60)).await,
        "QLG: nic-removed eth1"
    );
    // Of `blue`'s binding only the pod link is left, as Multus made it.
    let blue_links: Vec<(String, String, String)> = pod_links(&net.pod)
        .into_iter()
        .filter(|(n, _, _)| n.contains("16477688c0e"))
        .collect();
    assert_eq!(
        blue_links,
        vec![(
            BLUE_POD_IFACE.to_string(),
            BLUE_POD_MAC.to_string(),
            String::new()
        )]
    );
}
