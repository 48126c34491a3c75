//! Changed block tracking at start on a real guest (TCG): a VMI with
//! `status.changedBlockTracking.state: Initializing` and a filesystem PVC boots with the PVC's
//! `disk.img` behind `<private>/libvirt/qemu/cbt/data.qcow2` (qcow2, the image as raw data
//! file). The domain JSON shows `Source.DataStore` for the disk (what virt-handler waits for to
//! set `Enabled`), the guest's writes land in `disk.img` at their own offsets (data-file-raw),
//! and a later sync with `Enabled` keeps the overlay. A volume hot-plugged into the running VMI
//! runs through its own overlay too (the guest's write lands in its image), and unplugging it
//! removes that overlay and leaves the image.
//!
//! Needs root and the test guest (`scripts/build-guest`).

use testkit::guest;

use guest::{Console, GuestImages};
use qlauncher::sync::rpc::manager::DomainManager;
use qlauncher::sync::SyncVmi;
use qlauncher::vmi::Vmi;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use testkit::in_process::LauncherRoot;
use testkit::launcher::KillQemu;
use testkit::storage::{assert_qemu_img_check_clean, contains_bytes, qemu_img_info};

/// The VMI as virt-handler sends it with CBT in `state` and a 16 MiB filesystem claim `data`.
fn vmi(uid: &str, state: &str) -> Vmi {
    Vmi::from_json_or_yaml(&testkit::backup::cbt_vmi("cbt", uid, state).to_string()).unwrap()
}

#[test]
fn a_cbt_vmi_boots_on_its_overlay_and_the_guest_writes_land_in_the_raw_image() {
    let images = GuestImages::locate();
    let uid = format!("7e3d5b31-0000-4000-8000-{:012}", std::process::id());
    let root = LauncherRoot::new(&images.disk_qcow2, &uid);
    let private = root.private.clone();
    let image = private.join("vmi-disks/data/disk.img");
    let overlay = private.join("libvirt/qemu/cbt/data.qcow2");

    let rt = testkit::in_process::runtime();
    let manager = Arc::new(SyncVmi::new(root.config.clone(), None));
    let _kill = KillQemu(manager.clone());
    rt.block_on(manager.sync_vmi(vmi(&uid, "Initializing"), None))
        .unwrap_or_else(|e| panic!("sync: {e}"));

    let info = qemu_img_info(&overlay);
    let data = &info["format-specific"]["data"];
    assert_eq!(data["data-file"].as_str(), image.to_str(), "{info}");
    assert_eq!(data["data-file-raw"].as_bool(), Some(true), "{info}");

    let domain = rt
        .block_on(manager.get_domain())
        .unwrap()
        .expect("a domain");
    let disks = serde_json::to_value(&domain.spec.devices).unwrap()["Disks"].clone();
    let disk = disks
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["Alias"]["Name"] == "data")
        .unwrap_or_else(|| panic!("{disks}"))
        .clone();
    assert_eq!(
        disk["Source"],
        json!({"File": overlay.to_str().unwrap(),
               "DataStore": {"Type": "file", "Format": {"Type": "raw"},
                             "Source": {"File": image.to_str().unwrap()}}}),
        "{disk}"
    );
    assert_eq!(disk["Driver"]["Type"], "qcow2", "{disk}");

    let mut console = Console::connect(
        &private.join(&uid).join("virt-serial0"),
        Duration::from_secs(10),
    )
    .unwrap();
    // The prompt may have been printed before we connected: ask for a new one.
    console.send(b"\n").unwrap();
    let (status, out) = console
        .run(
            "printf qlauncher-cbt31-marker | dd of=/dev/vdb bs=512 seek=2048 conv=fsync",
            guest::BOOT_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("{e}; console:\n{}", console.transcript()));
    assert_eq!(status, 0, "{out}");
    // data-file-raw: guest offset 1 MiB is byte 1 MiB of disk.img.
    let raw = std::fs::read(&image).unwrap();
    assert_eq!(&raw[1 << 20..(1 << 20) + 22], b"qlauncher-cbt31-marker");
    assert_eq!(raw[(1 << 20) + 22], 0);
    assert!(!contains_bytes(
        &std::fs::read(&overlay).unwrap(),
        b"qlauncher-cbt31-marker"
    ));

    // virt-handler then sends the VMI with `Enabled`: the overlay is kept as it is.
    let before = std::fs::read(&overlay).unwrap();
    rt.block_on(manager.sync_vmi(vmi(&uid, "Enabled"), None))
        .unwrap_or_else(|e| panic!("sync Enabled: {e}"));
    assert_eq!(std::fs::read(&overlay).unwrap(), before);

    // Hotplug: virt-handler mounted `hp1.img` (raw, 1 MiB) and sends the VMI with the volume.
    let hotplug_dir = std::path::PathBuf::from(&root.config.paths.hotplug_disks);
    std::fs::create_dir_all(&hotplug_dir).unwrap();
    let hp_image = hotplug_dir.join("hp1.img");
    std::fs::File::create(&hp_image)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let hp_overlay = private.join("libvirt/qemu/cbt/hp1.qcow2");
    let with_hp1 = with_hotplug(&uid);
    rt.block_on(manager.sync_vmi(with_hp1, None))
        .unwrap_or_else(|e| panic!("sync with hp1: {e}"));
    let info = qemu_img_info(&hp_overlay);
    assert_eq!(
        info["format-specific"]["data"]["data-file"].as_str(),
        hp_image.to_str(),
        "{info}"
    );
    let domain = rt
        .block_on(manager.get_domain())
        .unwrap()
        .expect("a domain");
    let disks = serde_json::to_value(&domain.spec.devices).unwrap()["Disks"].clone();
    let hp = disks
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["Alias"]["Name"] == "hp1")
        .unwrap_or_else(|| panic!("{disks}"))
        .clone();
    assert_eq!(hp["Source"]["File"], hp_overlay.to_str().unwrap(), "{hp}");
    assert_eq!(
        hp["Source"]["DataStore"]["Source"]["File"],
        hp_image.to_str().unwrap(),
        "{hp}"
    );
    // The guest writes the hot-plugged disk (its third virtio disk) at 4 KiB.
    let (status, out) = console
        .run(
            "until [ -b /dev/vdc ]; do sleep 0.2; done; \
             printf qlauncher-cbt-hotplug | dd of=/dev/vdc bs=512 seek=8 conv=fsync",
            guest::BOOT_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("{e}; console:\n{}", console.transcript()));
    assert_eq!(status, 0, "{out}");
    let raw = std::fs::read(&hp_image).unwrap();
    assert_eq!(&raw[4096..4096 + 21], b"qlauncher-cbt-hotplug");

    // Unplug: the overlay goes, the volume's image stays.
    rt.block_on(manager.sync_vmi(vmi(&uid, "Enabled"), None))
        .unwrap_or_else(|e| panic!("sync without hp1: {e}"));
    assert!(!hp_overlay.exists(), "the hotplug overlay is removed");
    assert!(hp_image.exists());

    rt.block_on(manager.kill_vmi(vmi(&uid, "Enabled"))).unwrap();
    assert_qemu_img_check_clean(&overlay);
}

/// [`vmi`] `Enabled` with the hotpluggable virtio disk `hp1` (PVC `hp1`) mounted and ready.
fn with_hotplug(uid: &str) -> Vmi {
    let mut v = serde_json::to_value(vmi(uid, "Enabled")).unwrap();
    v["spec"]["domain"]["devices"]["disks"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "hp1", "disk": {"bus": "virtio"}}));
    v["spec"]["volumes"].as_array_mut().unwrap().push(
        json!({"name": "hp1", "persistentVolumeClaim": {"claimName": "hp1", "hotpluggable": true}}),
    );
    v["status"]["volumeStatus"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "hp1", "target": "", "phase": "Ready", "hotplugVolume": {}}));
    Vmi::from_json_or_yaml(&v.to_string()).unwrap()
}
