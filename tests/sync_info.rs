//! The command server's read-only and guest-agent RPCs on a real guest (TCG), played the way
//! virt-handler calls them: `SyncVirtualMachine` of a VMI with a containerDisk, a configMap
//! volume, a `DiskOrCreate` hostDisk and a masquerade NIC; then `GetDomainStats` (vCPUs, balloon,
//! block and tap counters, names and aliases), `GuestPing`, `Exec` (output and exit code, the
//! configMap's file read back through its ISO, KubeVirt's timeout error), and `GetDomain` with the
//! guest agent's interfaces, which also reach virt-handler's notify server in a MODIFIED event. The launcher runs in-process in a private network namespace of the
//! test thread (its `eth0` one end of a veth pair), so the pod network, tap and nftables are real.
//!
//! Needs root and the test guest with its agent (`scripts/build-guest`).

use testkit::guest;
use testkit::handler::{get_domain, Client};
use testkit::in_process::{InProcess, LauncherRoot};

use guest::GuestImages;
use qlauncher::sync::rpc::proto::cmd::v1 as cmd;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use testkit::guest::wait_log_marker as wait_marker;

const CONFIG_TEXT: &str = "hello from a configMap\n";

fn vmi(uid: &str) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "info", "namespace": "default", "uid": uid},
        "spec": {
            "domain": {
                "cpu": {"sockets": 1, "cores": 2, "threads": 1},
                "resources": {"requests": {"memory": "256Mi"}},
                "devices": {
                    "disks": [
                        {"name": "rootdisk", "disk": {"bus": "virtio"}},
                        {"name": "app-config", "disk": {"bus": "virtio"}},
                        {"name": "scratch", "disk": {"bus": "virtio"}}
                    ],
                    "interfaces": [{"name": "default", "masquerade": {}}]
                }
            },
            "networks": [{"name": "default", "pod": {}}],
            "volumes": [
                {"name": "rootdisk", "containerDisk": {"image": "qlauncher/test-guest:latest"}},
                {"name": "app-config", "configMap": {"name": "app"}},
                {"name": "scratch", "hostDisk": {
                    "path": "/var/data/scratch.img", "type": "DiskOrCreate", "capacity": "64Mi"}}
            ]
        }
    })
}

async fn exec(
    client: &mut Client,
    command: &str,
    args: &[&str],
    timeout_seconds: i32,
) -> Result<cmd::ExecResponse, tonic::Status> {
    client
        .exec(cmd::ExecRequest {
            domain_name: "default_info".into(),
            command: command.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            timeout_seconds,
        })
        .await
        .map(|r| r.into_inner())
}

fn block<'a>(stats: &'a Value, alias: &str) -> &'a Value {
    stats["Block"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["Alias"] == alias)
        .unwrap_or_else(|| panic!("no block entry for {alias}: {stats:#}"))
}

#[test]
fn stats_guest_agent_config_volume_and_host_disk_on_a_real_guest() {
    // A network namespace for this thread only; the runtime's threads, the launcher's
    // netlink sockets and QEMU inherit it. It goes away with the thread and QEMU.
    testkit::netns::unshare_pod_eth0("10.244.0.7/24", Some("0a:58:0a:f4:00:07")).unwrap();
    testkit::in_process::runtime().block_on(scenario());
}

async fn scenario() {
    let images = GuestImages::locate();
    let uid = format!("5f0c1a2e-0000-4000-8000-{:012}", std::process::id());
    let mut root = LauncherRoot::new(&images.disk_qcow2, &uid);
    let resolv = root.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        "search default.svc.cluster.local\nnameserver 10.96.0.10\n",
    )
    .unwrap();
    root.config.resolv_conf = resolv;
    let private = root.private.clone();
    std::fs::create_dir_all(private.join("config-map/app-config")).unwrap();
    std::fs::write(private.join("config-map/app-config/greeting"), CONFIG_TEXT).unwrap();

    let launcher = InProcess::start(root.config.clone(), &root.share_dir()).await;
    let (manager, received) = (&launcher.manager, &launcher.received);
    let mut client = launcher.client.clone();

    let answer = client
        .sync_virtual_machine(testkit::handler::vmi_only(&vmi(&uid)))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.success, "{}", answer.message);
    let timings = manager.start_timings().expect("timings recorded");
    assert_eq!(
        timings.total,
        timings.storage + timings.network + timings.convert + timings.qemu
    );

    // The hostDisk was created with its capacity, the configMap imaged.
    let host_disk = private.join("vmi-disks/scratch/scratch.img");
    assert_eq!(std::fs::metadata(&host_disk).unwrap().len(), 64 << 20);
    let iso = private.join("config-map-disks/app-config.iso");
    assert!(iso.is_file(), "{} missing", iso.display());

    let serial = private.join(&uid).join("virt-serial0-log");
    let boot = guest::BOOT_TIMEOUT;
    let lease = wait_marker(&serial, "QLG: lease eth0", boot).await;
    assert!(lease.contains("ip=10.0.2.2/24"), "{lease}");
    wait_marker(&serial, "QLG: agent ready", boot).await;

    // GuestPing and Exec through the agent.
    let ping = client
        .guest_ping(cmd::GuestPingRequest {
            domain_name: "default_info".into(),
            timeout_seconds: 5,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ping.response.unwrap().success);
    let out = exec(&mut client, "/bin/sh", &["-c", "echo hello; exit 3"], 10)
        .await
        .unwrap();
    assert_eq!(
        (
            out.response.unwrap().success,
            out.exit_code,
            out.std_out.as_str()
        ),
        (true, 3, "hello\n")
    );
    let out = exec(
        &mut client,
        "/bin/sh",
        &[
            "-c",
            "mkdir -p /mnt/cm && mount -t iso9660 -o ro /dev/vdb /mnt/cm && cat /mnt/cm/greeting",
        ],
        20,
    )
    .await
    .unwrap();
    assert_eq!((out.exit_code, out.std_out.as_str()), (0, CONFIG_TEXT));
    let out = exec(&mut client, "/bin/cat", &["/sys/block/vdc/size"], 10)
        .await
        .unwrap();
    assert_eq!(out.std_out.trim(), ((64u64 << 20) / 512).to_string());
    let slow = exec(&mut client, "/bin/sleep", &["30"], 1)
        .await
        .unwrap_err();
    assert_eq!(slow.code(), tonic::Code::Unknown);
    assert!(
        slow.message()
            .starts_with("Timed out waiting for guest pid [")
            && slow
                .message()
                .ends_with("] for command [/bin/sleep] to exit"),
        "{}",
        slow.message()
    );

    // GetDomainStats.
    let answer = client
        .get_domain_stats(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(answer.response.as_ref().unwrap().success, "{answer:?}");
    let stats: Value = serde_json::from_str(&answer.domain_stats).unwrap();
    assert_eq!(stats["Name"], "default_info");
    assert_eq!(stats["Vcpu"].as_array().unwrap().len(), 2, "{stats:#}");
    assert!(stats["Vcpu"][0]["Time"].as_u64().unwrap() > 0, "{stats:#}");
    assert!(stats["Cpu"]["Time"].as_u64().unwrap() > 0);
    assert_eq!(stats["Memory"]["ActualBalloon"], 256 * 1024);
    assert!(stats["Memory"]["RSS"].as_u64().unwrap() > 10 * 1024);
    assert_eq!(stats["CPUMap"].as_array().unwrap().len(), 2);
    let root_disk = block(&stats, "rootdisk");
    assert_eq!(root_disk["Name"], "vda");
    assert!(root_disk["RdBytes"].as_u64().unwrap() > 0, "{root_disk:#}");
    let config_disk = block(&stats, "app-config");
    assert_eq!(config_disk["Name"], "vdb");
    assert!(
        config_disk["RdBytes"].as_u64().unwrap() > 0,
        "{config_disk:#}"
    );
    assert_eq!(config_disk["Path"], iso.display().to_string());
    let scratch = block(&stats, "scratch");
    assert_eq!(
        (&scratch["Name"], &scratch["Capacity"], &scratch["Path"]),
        (
            &json!("vdc"),
            &json!(64u64 << 20),
            &json!(host_disk.display().to_string())
        )
    );
    let net = &stats["Net"].as_array().unwrap()[0];
    assert_eq!(net["Alias"], "default");
    assert!(net["RxBytes"].as_u64().unwrap() > 0, "{net:#}");
    assert!(net["TxBytes"].as_u64().unwrap() > 0, "{net:#}");

    // GetDomain carries the guest agent's interfaces (refreshed in the background).
    let deadline = Instant::now() + Duration::from_secs(30);
    let domain = loop {
        let domain = get_domain(&mut client).await.expect("a domain");
        if !domain.status.interfaces.is_empty() {
            break domain;
        }
        assert!(Instant::now() < deadline, "no interfaces: {domain:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mac = domain.spec.devices.interfaces[0].mac.clone().unwrap().mac;
    let eth0 = &domain.status.interfaces[0];
    assert_eq!(
        (
            eth0.interface_name.as_str(),
            eth0.mac.as_str(),
            eth0.ip.as_str()
        ),
        ("eth0", mac.as_str(), "10.0.2.2")
    );
    assert!(eth0.ips.contains(&"10.0.2.2".to_string()), "{eth0:?}");
    // virt-handler learnt them from a MODIFIED domain event (its informer's source).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events = received.lock().unwrap().clone();
        if events
            .iter()
            .any(|(t, d)| t == "MODIFIED" && d.status.interfaces == domain.status.interfaces)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no MODIFIED event with the guest interfaces: {events:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let answer = client
        .kill_virtual_machine(testkit::handler::vmi_only(&vmi(&uid)))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.success, "{}", answer.message);
}
