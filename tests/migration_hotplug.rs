//! Live migration of a domain with a hot-plugged disk (issue 19), between two real launchers, the
//! test playing both virt-handlers and the migration proxy ([`testkit::migration`]).
//!
//! The source boots without the disk; a `SyncVirtualMachine` with a hotplug volume Ready (the
//! image mounted into the pod, as virt-handler does) attaches it; the guest mounts it and writes
//! a file. The target pod has the same volume mounted (the same image: a shared PVC) at its own
//! path. After `MigrateVirtualMachine` the target's guest has the disk with the same serial at
//! the same PCI path, the file readable on the still-mounted file system, and `GetDomain` on the
//! target lists the disk with its target and alias. The domain then moves on to a third pod (the
//! former target sends the disk on as hot-plugged), where the disk unplugs by a sync without the
//! volume.
//!
//! The same boot carries a hot-plugged NIC: each pod has the Multus link of the secondary
//! network `blue` (a veth whose far end, on the pod's node, is 192.168.77.1), the same sync
//! plugs a bridge interface on it into the running source (the launcher adopts the bridge
//! binding virt-handler made in the pod, tap passed by fd), and the guest gives it
//! 192.168.77.10. The target pod's link has another MAC, and its bridge binding was made by
//! "virt-handler" (the test, with KubeVirt's names) before `SyncMigrationTarget`, which adopts
//! it; the target boots without the NIC and plugs it on its own pod's tap at the source's PCI
//! address with the source's guest MAC before the device state arrives. The third pod is set up
//! the same way. On the target (and the third pod) the guest has the NIC with the same MAC and
//! PCI path, it pings the far end over the target pod's secondary network, `GetDomain` lists
//! it, and it unplugs with the disk.
//!
//! The pods are KubeVirt's default non-root ones (launcher and QEMU as 107 over kubelet-made
//! emptyDirs, without `NET_ADMIN`: virt-handler makes every pod binding). Needs root
//! and the test guest (`scripts/build-guest`).

use std::time::Duration;

use testkit::guest::GuestImages;
use testkit::hotplug::{
    attach_blue, blue_mac, blue_pods, configure_blue, guest_device, hp1, hp1_image,
    mount_and_write_hp1, nic_find, ping_blue, share_hp1, virt_handler_blue, wait_blue_unplugged,
    wait_hp1_unplugged, with_blue, with_hotplug, FIND,
};
use testkit::launcher::{get_domain, sync, Pod};
use testkit::migration::{
    boot, exec_until_ok, migrate_and_finalize, migrate_on, migrating_vmi, options, plain_vmi,
    pod_pair, Rpc,
};

const BOOT: Duration = Duration::from_secs(240);
const MIGRATION: Duration = Duration::from_secs(240);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_plugged_disk_and_nic_migrate_with_their_addresses_data_and_traffic() {
    let images = GuestImages::locate();
    let (mut source, mut target) = pod_pair(&images.disk_qcow2);
    // The target's virt-handler sets up the pod network of every interface, `blue` included.
    blue_pods(&source, &target);
    let uid = source.uid.clone();
    let plain = plain_vmi(&uid);

    let (s, mut sc) = boot(&mut source, &plain, BOOT).await;

    // virt-handler mounts the hotplug volume into the pod (an ext4 image here), then syncs.
    let image = hp1_image(&source);
    // Multus attached `blue` to the pod: the same sync plugs the NIC.
    assert_eq!(
        sync(&mut sc, &with_blue(with_hotplug(plain.clone(), ""), "")).await,
        (true, String::new())
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let ((dev_target, _, _), nic_mac) = loop {
        let d = get_domain(&mut sc).await;
        if let Some(h) = d.as_ref().and_then(hp1) {
            if let Some(m) = d.as_ref().and_then(blue_mac) {
                break (h, m);
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "hp1 and blue never in GetDomain"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The bridge binding takes the pod link's MAC.
    assert_eq!(nic_mac, "0a:58:0a:f4:01:07");
    let (nic_if, nic_pci) = guest_device(&mut sc, &nic_find(&nic_mac)).await;
    configure_blue(&mut sc, &nic_if).await;

    // The guest sees it, mounts it and writes a file.
    let (dev, pci_path) = guest_device(&mut sc, FIND).await;
    mount_and_write_hp1(&mut sc, &dev).await;
    let guest_mac = get_domain(&mut sc).await.unwrap().spec.devices.interfaces[0]
        .mac
        .clone()
        .unwrap()
        .mac;
    let vmi = with_blue(
        with_hotplug(
            migrating_vmi(&uid, "mig-hp", &target.pod_name(), &guest_mac),
            &dev_target,
        ),
        &nic_mac,
    );

    // The target pod has the same volume (the shared claim) at its own path.
    share_hp1(&target, &image);
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

    // On the target: the same disk (serial, PCI path), the file on the mounted file system.
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
    // And it still takes writes.
    exec_until_ok(
        &mut tc,
        "echo after >/mnt/hp/g && sync && cat /mnt/hp/g",
        Duration::from_secs(30),
    )
    .await;
    let d = get_domain(&mut tc).await.unwrap();
    assert_eq!(
        hp1(&d),
        Some((dev_target.clone(), "hp1".to_owned(), true)),
        "{:?}",
        d.spec.devices.disks
    );
    // The NIC: the source's MAC at the same PCI path, still configured, and traffic over the
    // target pod's secondary network.
    assert_eq!(blue_mac(&d).as_deref(), Some(nic_mac.as_str()));
    let nic_moved = exec_until_ok(
        &mut tc,
        &format!("{} | grep .", nic_find(&nic_mac)),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(nic_moved.trim(), format!("{nic_if} {nic_pci}"));
    ping_blue(&mut tc).await;
    // The target used virt-handler's binding of `blue` as it was.
    assert!(
        target
            .log(t)
            .contains("adopting the pod network virt-handler set up"),
        "{}",
        target.log(t)
    );
    assert_eq!(Rpc::delete(&mut sc, &vmi).await, (true, String::new()));
    source.wait_launcher(s, Duration::from_secs(60)).await;

    // On to a third pod: the former target knows the disk was hot-plugged (its own QEMU started
    // without it) and sends it on.
    let mut third = Pod::new(&images.disk_qcow2, true);
    third.uid = uid.clone();
    attach_blue(&third, "0a:58:0a:f4:03:07");
    virt_handler_blue(&third, "0a:58:0a:f4:03:07");
    share_hp1(&third, &image);
    let vmi2 = with_blue(
        with_hotplug(
            migrating_vmi(&uid, "mig-hp2", &third.pod_name(), &guest_mac),
            &dev_target,
        ),
        &nic_mac,
    );
    let (h, mut hc, _relay2) = migrate_on(
        &target,
        &mut tc,
        &mut third,
        &vmi2,
        "mig-hp2",
        &options("0", 150),
        MIGRATION,
    )
    .await;
    let again = exec_until_ok(
        &mut hc,
        &format!("{FIND} | grep ."),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(again.trim(), format!("{dev} {pci_path}"));
    assert_eq!(
        exec_until_ok(&mut hc, "cat /mnt/hp/f /mnt/hp/g", Duration::from_secs(30)).await,
        "hotplug-file\nafter\n"
    );
    let nic_again = exec_until_ok(
        &mut hc,
        &format!("{} | grep .", nic_find(&nic_mac)),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(nic_again.trim(), format!("{nic_if} {nic_pci}"));
    ping_blue(&mut hc).await;

    // The migrated disk unplugs like any hot-plugged one (its block nodes are the ones that run),
    // and so does the NIC (the interface leaves the spec).
    exec_until_ok(&mut hc, "umount /mnt/hp", Duration::from_secs(30)).await;
    let mut unplugged = vmi2.clone();
    unplugged["spec"] = plain["spec"].clone();
    unplugged["status"]["volumeStatus"] = serde_json::json!([]);
    assert_eq!(sync(&mut hc, &unplugged).await, (true, String::new()));
    wait_hp1_unplugged(&mut hc, || third.log(h)).await;
    wait_blue_unplugged(&mut hc, &nic_mac, || third.log(h)).await;
}
