//! The hot-plugged devices of the migration tests (`migration_hotplug.rs`,
//! `migration_nic_restart.rs`) and `sync_e2e.rs`: the bridge interface `blue` on the Multus
//! network `blue-net` (the pod's Multus link, virt-handler's bridge binding, the guest's view) and
//! the hotplug volume `hp1` (its VMI fields, its `api.Domain` disk, the guest's block device).

use std::time::Duration;

use qlauncher::sync::domain::ApiDomain;

use crate::handler::Client;
use crate::launcher::{get_domain, Pod};
use crate::migration::exec_until_ok;

/// The pod interface Multus attaches for the network `blue` (`pod` + sha256("blue")[..11]).
pub const BLUE_POD_IFACE: &str = "pod16477688c0e";
/// The guest's address on `blue`.
pub const BLUE_GUEST: &str = "192.168.77.10";
/// The far end's address on `blue` (on each pod's node).
pub const BLUE_NODE: &str = "192.168.77.1";
/// The far end's MAC, the same on each pod's node (one secondary network).
pub const BLUE_NODE_MAC: &str = "02:00:00:77:00:01";
/// The serial of the `hp1` disk of [`with_hotplug`].
pub const SERIAL: &str = "HP1SERIAL";
/// The guest's block device with serial [`SERIAL`] and its sysfs device path (the PCI path).
pub const FIND: &str = "for b in /sys/block/vd*; do \
     [ \"$(cat $b/serial 2>/dev/null)\" = HP1SERIAL ] && echo ${b##*/} $(readlink -f $b/device); \
     done";

/// Gives `pod` the Multus link of `blue` with the pod-side MAC `mac` (each pod's differs).
pub fn attach_blue(pod: &Pod, mac: &str) {
    pod.net.add_multus_link(
        BLUE_POD_IFACE,
        mac,
        1400,
        "vblue",
        BLUE_NODE_MAC,
        &format!("{BLUE_NODE}/24"),
    );
}

/// The pods of a migration with `blue`: the Multus link in `source` (pod-side MAC
/// `0a:58:0a:f4:01:07`) and in `target` (`0a:58:0a:f4:02:07`), where virt-handler also set up its
/// bridge binding ([`virt_handler_blue`]); in a non-root source too, whose launcher (without
/// `NET_ADMIN`) cannot build it when the NIC is hot-plugged.
pub fn blue_pods(source: &Pod, target: &Pod) {
    attach_blue(source, "0a:58:0a:f4:01:07");
    if source.nonroot {
        virt_handler_blue(source, "0a:58:0a:f4:01:07");
    }
    attach_blue(target, "0a:58:0a:f4:02:07");
    virt_handler_blue(target, "0a:58:0a:f4:02:07");
}

/// Plays the source's virt-handler mounting the hotplug volume `hp1` into `pod`: an empty 16 MiB
/// ext4 image `hotplug-disks/hp1.img` in its share. Returns the image's path.
pub fn hp1_image(pod: &Pod) -> std::path::PathBuf {
    let dir = pod.share().join("hotplug-disks");
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("hp1.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let mkfs = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&image)
        .status()
        .unwrap();
    assert!(mkfs.success());
    // virt-handler gives a mounted hotplug volume to QEMU's user (107 in a non-root pod).
    if pod.nonroot {
        let id = Some(crate::kubelet::QEMU_ID);
        std::os::unix::fs::chown(&image, id, id).unwrap();
    }
    image
}

/// The same volume (a shared claim) mounted into `pod` too: `image` hard-linked as its
/// `hotplug-disks/hp1.img`.
pub fn share_hp1(pod: &Pod, image: &std::path::Path) {
    let dir = pod.share().join("hotplug-disks");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::hard_link(image, dir.join("hp1.img")).unwrap();
}

/// Plays the target's virt-handler: sets up the bridge binding of `blue` in `pod` (pod link MAC
/// `mac`) before `SyncMigrationTarget`, which the launcher then adopts unchanged.
pub fn virt_handler_blue(pod: &Pod, mac: &str) {
    // The tap is QEMU's user's: 107 in a non-root pod.
    let owner = if pod.nonroot {
        crate::kubelet::QEMU_ID
    } else {
        0
    };
    for args in crate::net::kubevirt_bridge_links(BLUE_POD_IFACE, mac, 1400, owner) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        pod.net.pod.ip(&args);
    }
}

/// Appends to `vmi`'s spec the bridge interface `blue` and its Multus network `blue-net` (the
/// status left as it is).
pub fn push_blue_spec(vmi: &mut serde_json::Value) {
    vmi["spec"]["domain"]["devices"]["interfaces"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "blue", "bridge": {}}));
    vmi["spec"]["networks"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "blue", "multus": {"networkName": "blue-net"}}));
}

/// `vmi` with the bridge interface `blue` on the Multus network `blue-net`, reported attached
/// by Multus in `status.interfaces` (with the guest MAC `mac` once the domain reports one).
pub fn with_blue(mut vmi: serde_json::Value, mac: &str) -> serde_json::Value {
    push_blue_spec(&mut vmi);
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
pub fn blue_mac(d: &ApiDomain) -> Option<String> {
    d.spec
        .devices
        .interfaces
        .iter()
        .find(|i| i.alias.as_ref().is_some_and(|a| a.name == "blue"))
        .and_then(|i| i.mac.as_ref())
        .map(|m| m.mac.clone())
}

/// The guest's network interface with MAC `mac`: its name and sysfs device path (the PCI path).
pub fn nic_find(mac: &str) -> String {
    format!(
        "for n in /sys/class/net/*; do \
         [ \"$(cat $n/address)\" = {mac} ] && echo ${{n##*/}} $(readlink -f $n/device); \
         done"
    )
}

/// The guest pings the far end of `blue` (on the node of the pod it runs in) until it answers
/// (60 s; this machine has no `ping` of its own, the guest's busybox has).
pub async fn ping_blue(c: &mut Client) {
    exec_until_ok(
        c,
        &format!("ping -c 1 -W 2 {BLUE_NODE}"),
        Duration::from_secs(60),
    )
    .await;
}

/// Runs `find` ([`FIND`] or a [`nic_find`]) in the guest until it prints a device (60 s): the
/// device's name and its sysfs device path (the PCI path).
pub async fn guest_device(c: &mut Client, find: &str) -> (String, String) {
    let seen = exec_until_ok(c, &format!("{find} | grep ."), Duration::from_secs(60)).await;
    let (name, path) = seen.trim().split_once(' ').unwrap();
    (name.to_owned(), path.to_owned())
}

/// The guest gives its interface `nic_if` the address [`BLUE_GUEST`] on `blue`, brings it up and
/// pings the far end ([`ping_blue`]).
pub async fn configure_blue(c: &mut Client, nic_if: &str) {
    exec_until_ok(
        c,
        &format!("ip addr add {BLUE_GUEST}/24 dev {nic_if} && ip link set {nic_if} up"),
        Duration::from_secs(30),
    )
    .await;
    ping_blue(c).await;
}

/// The guest mounts the `hp1` disk `dev` at `/mnt/hp` and writes the file `f` on it.
pub async fn mount_and_write_hp1(c: &mut Client, dev: &str) {
    exec_until_ok(
        c,
        &format!(
            "mkdir -p /mnt/hp && mount /dev/{dev} /mnt/hp && echo hotplug-file >/mnt/hp/f && sync"
        ),
        Duration::from_secs(30),
    )
    .await;
}

/// Waits (60 s each) until `GetDomain` no longer lists the NIC `blue` (else panics with `log()`,
/// the launcher's log), then until the guest has no interface with MAC `mac`.
pub async fn wait_blue_unplugged(c: &mut Client, mac: &str, log: impl Fn() -> String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while get_domain(c).await.as_ref().and_then(blue_mac).is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "blue still in GetDomain\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    exec_until_ok(
        c,
        &format!("test -z \"$({})\"", nic_find(mac)),
        Duration::from_secs(60),
    )
    .await;
}

/// Waits (60 s each) until `GetDomain` no longer lists the disk `hp1` (else panics with `log()`,
/// the launcher's log), then until the guest has no block device with serial [`SERIAL`].
pub async fn wait_hp1_unplugged(c: &mut Client, log: impl Fn() -> String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while get_domain(c).await.as_ref().and_then(hp1).is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "hp1 still in GetDomain\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    exec_until_ok(
        c,
        &format!("test -z \"$({FIND})\""),
        Duration::from_secs(60),
    )
    .await;
}

/// Appends to `vmi`'s spec the virtio disk `hp1` (with `serial`, if any) and its hotpluggable
/// volume, the PVC `hp1` (the status left as it is).
pub fn push_hp1_spec(vmi: &mut serde_json::Value, serial: Option<&str>) {
    let mut disk = serde_json::json!({"name": "hp1", "disk": {"bus": "virtio"}});
    if let Some(serial) = serial {
        disk["serial"] = serial.into();
    }
    vmi["spec"]["domain"]["devices"]["disks"]
        .as_array_mut()
        .unwrap()
        .push(disk);
    vmi["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!(
            {"name": "hp1", "persistentVolumeClaim": {"claimName": "hp1", "hotpluggable": true}}
        ));
}

/// `vmi` with the hotplug volume `hp1` (a virtio disk with serial [`SERIAL`]) Ready, its
/// `volumeStatus` target `target` (empty until the domain reports one).
pub fn with_hotplug(mut vmi: serde_json::Value, target: &str) -> serde_json::Value {
    push_hp1_spec(&mut vmi, Some(SERIAL));
    if vmi["status"].is_null() {
        vmi["status"] = serde_json::json!({});
    }
    vmi["status"]["volumeStatus"] = serde_json::json!([
        {"name": "hp1", "target": target, "phase": "Ready", "hotplugVolume": {}}
    ]);
    vmi
}

/// The `hp1` disk of a domain: (target device, alias name, user-defined alias).
pub fn hp1(d: &ApiDomain) -> Option<(String, String, bool)> {
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
