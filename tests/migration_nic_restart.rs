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
//! killed and restarted, and a sync without `blue` and `hp1` unplugs both. The pods are KubeVirt's
//! default non-root ones (launcher and QEMU as 107 over kubelet-made emptyDirs; virt-handler makes
//! the bridge binding). Needs root and the test guest (`scripts/build-guest`).

use std::time::Duration;

use testkit::guest::GuestImages;
use testkit::handler::Client;
use testkit::hotplug::{
    blue_mac, blue_pods, configure_blue, guest_device, hp1, hp1_image, mount_and_write_hp1,
    nic_find, ping_blue, share_hp1, wait_blue_unplugged, wait_hp1_unplugged, with_blue,
    with_hotplug, FIND,
};
use testkit::launcher::{get_domain, sync, Pod};
use testkit::migration::{
    boot, exec_until_ok, migrate_and_finalize, migrating_vmi, options, plain_vmi, pod_pair, Rpc,
};

const BOOT: Duration = Duration::from_secs(240);
const MIGRATION: Duration = Duration::from_secs(240);

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
    blue_pods(&source, &target);
    let uid = source.uid.clone();
    let plain = plain_vmi(&uid);

    let (s, mut sc) = boot(&mut source, &plain, BOOT).await;
    let image = hp1_image(&source);
    share_hp1(&target, &image);
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
    let (nic_if, nic_pci) = guest_device(&mut sc, &nic_find(&nic_mac)).await;
    configure_blue(&mut sc, &nic_if).await;
    let (dev, pci_path) = guest_device(&mut sc, FIND).await;
    mount_and_write_hp1(&mut sc, &dev).await;
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
    let (t, mut tc, _relay) = migrate_and_finalize(
        &source,
        s,
        &mut sc,
        &mut target,
        &vmi,
        &options("0", 150),
        MIGRATION,
    )
    .await;
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
    wait_blue_unplugged(&mut tc, &nic_mac, || target.log(t)).await;
    // And the disk, by the node names QEMU runs it with.
    wait_hp1_unplugged(&mut tc, || target.log(t)).await;
}
