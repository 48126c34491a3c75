//! Hot-plugged devices survive a launcher restart (issue 19): the restarted launcher adopts
//! the running QEMU and recovers, from QEMU's command line, QOM and `query-block`, which NICs and
//! disks were hot-plugged, where they sit and (disks) their block node names, so that the domain
//! still migrates with them, and, after a second restart (of the target's launcher, whose QEMU
//! was started `-incoming defer`), they still unplug.
//!
//! One boot of the test guest in a source pod with the Multus link of the secondary network
//! `blue` (as in `migration_hotplug.rs`): a sync plugs the bridge interface `blue` and the
//! hotplug volume `hp1`, the guest configures the NIC and writes a file on the disk, the source
//! launcher is killed and a new one adopts the QEMU; then `MigrateVirtualMachine` moves the
//! domain to the target pod, where the guest has the NIC and the disk at the same PCI paths,
//! pings over the target pod's secondary network and reads the file; the target's launcher is
//! killed and restarted, and a sync without `blue` and `hp1` unplugs both. Needs root and the
//! test guest (`scripts/build-guest`).

use std::time::Duration;

use qlauncher::sync::domain::{ApiDomain, LifeCycle as L};
use testkit::guest::GuestImages;
use testkit::handler::Client;
use testkit::launcher::{get_domain, sync, Pod};
use testkit::migration::{
    boot, exec_until_ok, metadata, migrating_vmi, options, plain_vmi, pod_pair, wait_notified,
    Relay, Rpc,
};

const BOOT: Duration = Duration::from_secs(240);
const MIGRATION: Duration = Duration::from_secs(240);

/// The pod interface Multus attaches for the network `blue` (`pod` + sha256("blue")[..11]).
const BLUE_POD_IFACE: &str = "pod16477688c0e";
/// The guest's address on `blue`, and the far end's (on each pod's node).
const BLUE_GUEST: &str = "192.168.77.10";
const BLUE_NODE: &str = "192.168.77.1";
/// The far end's MAC, the same on each pod's node (one secondary network).
const BLUE_NODE_MAC: &str = "02:00:00:77:00:01";

/// Gives `pod` the Multus link of `blue` with the pod-side MAC `mac` (each pod's differs).
fn attach_blue(pod: &Pod, mac: &str) {
    pod.net.add_multus_link(
        BLUE_POD_IFACE,
        mac,
        1400,
        "vblue",
        BLUE_NODE_MAC,
        &format!("{BLUE_NODE}/24"),
    );
}

/// Plays the target's virt-handler: sets up the bridge binding of `blue` in `pod` (pod link MAC
/// `mac`) before `SyncMigrationTarget`, which the launcher then adopts unchanged.
fn virt_handler_blue(pod: &Pod, mac: &str) {
    for args in testkit::net::kubevirt_bridge_links(BLUE_POD_IFACE, mac, 1400, 0) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        pod.net.pod.ip(&args);
    }
}

/// `vmi` with the bridge interface `blue` on the Multus network `blue-net`, reported attached
/// by Multus in `status.interfaces` (with the guest MAC `mac` once the domain reports one).
fn with_blue(mut vmi: serde_json::Value, mac: &str) -> serde_json::Value {
    vmi["spec"]["domain"]["devices"]["interfaces"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "blue", "bridge": {}}));
    vmi["spec"]["networks"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "blue", "multus": {"networkName": "blue-net"}}));
    if vmi["status"].is_null() {
        vmi["status"] = serde_json::json!({});
    }
    if vmi["status"]["interfaces"].is_null() {
        vmi["status"]["interfaces"] = serde_json::json!([]);
    }
    let mut status = serde_json::json!(
        {"name": "blue", "podInterfaceName": BLUE_POD_IFACE, "infoSource": "domain, multus-status"}
    );
    if !mac.is_empty() {
        status["mac"] = mac.into();
    }
    vmi["status"]["interfaces"]
        .as_array_mut()
        .unwrap()
        .push(status);
    vmi
}

/// The guest MAC of the `blue` interface of a domain.
fn blue_mac(d: &ApiDomain) -> Option<String> {
    d.spec
        .devices
        .interfaces
        .iter()
        .find(|i| i.alias.as_ref().is_some_and(|a| a.name == "blue"))
        .and_then(|i| i.mac.as_ref())
        .map(|m| m.mac.clone())
}

/// The guest's network interface with MAC `mac`: its name and sysfs device path (the PCI path).
fn nic_find(mac: &str) -> String {
    format!(
        "for n in /sys/class/net/*; do \
         [ \"$(cat $n/address)\" = {mac} ] && echo ${{n##*/}} $(readlink -f $n/device); \
         done"
    )
}

/// The guest pings the far end of `blue` (on the node of the pod it runs in) until it answers
/// (60 s; this machine has no `ping` of its own, the guest's busybox has).
async fn ping_blue(c: &mut Client) {
    exec_until_ok(
        c,
        &format!("ping -c 1 -W 2 {BLUE_NODE}"),
        Duration::from_secs(60),
    )
    .await;
}

const SERIAL: &str = "HP1SERIAL";
/// `vmi` with the hotplug volume `hp1` (a virtio disk with serial [`SERIAL`]) Ready, its
/// `volumeStatus` target `target` (empty until the domain reports one).
fn with_hotplug(mut vmi: serde_json::Value, target: &str) -> serde_json::Value {
    vmi["spec"]["domain"]["devices"]["disks"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "hp1", "disk": {"bus": "virtio"}, "serial": SERIAL}));
    vmi["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!(
            {"name": "hp1", "persistentVolumeClaim": {"claimName": "hp1", "hotpluggable": true}}
        ));
    if vmi["status"].is_null() {
        vmi["status"] = serde_json::json!({});
    }
    vmi["status"]["volumeStatus"] = serde_json::json!([
        {"name": "hp1", "target": target, "phase": "Ready", "hotplugVolume": {}}
    ]);
    vmi
}

/// The `hp1` disk of a domain: (target device, alias name, user-defined alias).
fn hp1(d: &ApiDomain) -> Option<(String, String, bool)> {
    d.spec
        .devices
        .disks
        .iter()
        .find(|d| d.alias.as_ref().is_some_and(|a| a.name == "hp1"))
        .filter(|d| !d.target.device.is_empty())
        .map(|d| {
            let a = d.alias.as_ref().unwrap();
            (d.target.device.clone(), a.name.clone(), a.user_defined)
        })
}

/// The guest's block device with serial [`SERIAL`] and its sysfs device path (the PCI path).
const FIND: &str = "for b in /sys/block/vd*; do \
     [ \"$(cat $b/serial 2>/dev/null)\" = HP1SERIAL ] && echo ${b##*/} $(readlink -f $b/device); \
     done";

/// Kills launcher `n` of `pod` and starts another, which adopts the running QEMU on the sync of
/// `vmi`; returns the new launcher and its client, checking the QEMU is the same process.
async fn restart(pod: &mut Pod, n: usize, vmi: &serde_json::Value) -> (usize, Client) {
    let qemu = pod.qemu_pids();
    assert_eq!(qemu.len(), 1, "{qemu:?}");
    pod.kill_launcher(n);
    let m = pod.start_launcher();
    let mut c = pod.client(m).await;
    assert_eq!(
        sync(&mut c, vmi).await,
        (true, String::new()),
        "{}",
        pod.log(m)
    );
    assert_eq!(
        pod.qemu_pids(),
        qemu,
        "the QEMU was replaced:\n{}",
        pod.log(m)
    );
    assert!(
        pod.log(m)
            .contains("hot-plugged NICs of the adopted QEMU recovered"),
        "{}",
        pod.log(m)
    );
    (m, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nic_and_disk_hot_plugged_before_a_launcher_restart_still_migrate_and_unplug() {
    let images = GuestImages::locate();
    let (mut source, mut target) = pod_pair(&images.disk_qcow2);
    attach_blue(&source, "0a:58:0a:f4:01:07");
    attach_blue(&target, "0a:58:0a:f4:02:07");
    virt_handler_blue(&target, "0a:58:0a:f4:02:07");
    let uid = source.uid.clone();
    let plain = plain_vmi(&uid);

    let (s, mut sc) = boot(&mut source, &plain, BOOT).await;
    let dir = source.share().join("hotplug-disks");
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("hp1.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    assert!(std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&image)
        .status()
        .unwrap()
        .success());
    let tdir = target.share().join("hotplug-disks");
    std::fs::create_dir_all(&tdir).unwrap();
    std::fs::hard_link(&image, tdir.join("hp1.img")).unwrap();
    assert_eq!(
        sync(&mut sc, &with_hotplug(with_blue(plain.clone(), ""), "")).await,
        (true, String::new())
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (nic_mac, dev_target) = loop {
        let d = get_domain(&mut sc).await;
        if let (Some(m), Some(h)) = (d.as_ref().and_then(blue_mac), d.as_ref().and_then(hp1)) {
            break (m, h.0);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "blue never in GetDomain"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let nic_seen = exec_until_ok(
        &mut sc,
        &format!("{} | grep .", nic_find(&nic_mac)),
        Duration::from_secs(60),
    )
    .await;
    let (nic_if, nic_pci) = nic_seen.trim().split_once(' ').unwrap();
    let (nic_if, nic_pci) = (nic_if.to_owned(), nic_pci.to_owned());
    exec_until_ok(
        &mut sc,
        &format!("ip addr add {BLUE_GUEST}/24 dev {nic_if} && ip link set {nic_if} up"),
        Duration::from_secs(30),
    )
    .await;
    ping_blue(&mut sc).await;
    let seen = exec_until_ok(
        &mut sc,
        &format!("{FIND} | grep ."),
        Duration::from_secs(60),
    )
    .await;
    let (dev, pci_path) = seen.trim().split_once(' ').unwrap();
    let (dev, pci_path) = (dev.to_owned(), pci_path.to_owned());
    exec_until_ok(
        &mut sc,
        &format!(
            "mkdir -p /mnt/hp && mount /dev/{dev} /mnt/hp && echo hotplug-file >/mnt/hp/f && sync"
        ),
        Duration::from_secs(30),
    )
    .await;
    let guest_mac = get_domain(&mut sc).await.unwrap().spec.devices.interfaces[0]
        .mac
        .clone()
        .unwrap()
        .mac;

    // The source launcher dies; its successor adopts QEMU and knows the NIC was hot-plugged.
    drop(sc);
    let (s, mut sc) = restart(
        &mut source,
        s,
        &with_hotplug(with_blue(plain.clone(), &nic_mac), &dev_target),
    )
    .await;
    ping_blue(&mut sc).await;

    // The migration sends the NIC as hot-plugged (else the target's boot view, without it,
    // would not be the source's argv and the target would refuse).
    let vmi = with_hotplug(
        with_blue(
            migrating_vmi(&uid, "mig-nr", &target.pod_name(), &guest_mac),
            &nic_mac,
        ),
        &dev_target,
    );
    let t = target.start_launcher();
    let mut tc = target.client(t).await;
    assert_eq!(Rpc::sync_target(&mut tc, &vmi).await, (true, String::new()));
    let _relay = Relay::start(&source, &target, &uid).await;
    assert_eq!(
        Rpc::migrate(&mut sc, &vmi, &options("0", 150)).await,
        (true, String::new())
    );
    let ended = wait_notified(&source, "source migration ended", MIGRATION, |d| {
        metadata(d).is_some_and(|m| m.end_timestamp.is_some())
    })
    .await;
    let m = metadata(&ended).unwrap();
    assert!(!m.failed, "{m:?}\nsource log:\n{}", source.log(s));
    wait_notified(
        &target,
        "target Running with EndTimestamp",
        MIGRATION,
        |d| d.status.status == L::Running && metadata(d).is_some_and(|m| m.end_timestamp.is_some()),
    )
    .await;
    assert_eq!(Rpc::finalize(&mut tc, &vmi).await, (true, String::new()));
    let nic_moved = exec_until_ok(
        &mut tc,
        &format!("{} | grep .", nic_find(&nic_mac)),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(nic_moved.trim(), format!("{nic_if} {nic_pci}"));
    let moved = exec_until_ok(
        &mut tc,
        &format!("{FIND} | grep ."),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(moved.trim(), format!("{dev} {pci_path}"));
    assert_eq!(
        exec_until_ok(&mut tc, "cat /mnt/hp/f", Duration::from_secs(30)).await,
        "hotplug-file\n"
    );
    ping_blue(&mut tc).await;
    assert_eq!(Rpc::delete(&mut sc, &vmi).await, (true, String::new()));
    source.wait_launcher(s, Duration::from_secs(60)).await;

    // The target's launcher dies too (its QEMU was started `-incoming defer` and got the NIC
    // before the stream); its successor still unplugs the NIC when the interface leaves.
    drop(tc);
    let (t, mut tc) = restart(&mut target, t, &vmi).await;
    exec_until_ok(&mut tc, "umount /mnt/hp", Duration::from_secs(30)).await;
    let mut unplugged = vmi.clone();
    unplugged["spec"] = plain["spec"].clone();
    unplugged["status"]["volumeStatus"] = serde_json::json!([]);
    unplugged["status"]["interfaces"] = vmi["status"]["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["name"] != "blue")
        .cloned()
        .collect();
    assert_eq!(sync(&mut tc, &unplugged).await, (true, String::new()));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while get_domain(&mut tc)
        .await
        .as_ref()
        .and_then(blue_mac)
        .is_some()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "blue still in GetDomain\n{}",
            target.log(t)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    exec_until_ok(
        &mut tc,
        &format!("test -z \"$({})\"", nic_find(&nic_mac)),
        Duration::from_secs(60),
    )
    .await;
    // And the disk, by the node names QEMU runs it with.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while get_domain(&mut tc).await.as_ref().and_then(hp1).is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "hp1 still in GetDomain\n{}",
            target.log(t)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    exec_until_ok(
        &mut tc,
        &format!("test -z \"$({FIND})\""),
        Duration::from_secs(60),
    )
    .await;
}
