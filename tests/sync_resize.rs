//! Disk growth by diff on a real guest (TCG): a VMI with a filesystem PVC is synced with a 64 MiB
//! claim (the launcher creates `disk.img` with that capacity), then with the claim expanded to
//! 128 MiB and KubeVirt's default filesystem overhead 0.055: `disk.img` and the guest's disk grow
//! to the usable size, 128 MiB × 0.945 aligned down to 1 MiB = 120 MiB (KubeVirt's
//! `possibleGuestSize`). Repeating that sync changes nothing, and a smaller claim never shrinks
//! the disk. The guest's view is read through its shell on the serial console.
//!
//! Needs root and the test guest (`scripts/build-guest`).

use testkit::guest;

use guest::{Console, GuestImages};
use qlauncher::sync::rpc::manager::DomainManager;
use qlauncher::sync::SyncVmi;
use qlauncher::vmi::Vmi;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::in_process::LauncherRoot;
use testkit::launcher::KillQemu;

const MIB: u64 = 1 << 20;

/// The VMI as virt-handler sends it when the claim `data` has `capacity` (quantity string).
fn vmi(uid: &str, capacity: &str) -> Vmi {
    let json = json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "resize", "namespace": "default", "uid": uid},
        "spec": {
            "domain": {
                "resources": {"requests": {"memory": "128Mi"}},
                "devices": {
                    "autoattachPodInterface": false,
                    "disks": [
                        {"name": "rootdisk", "disk": {"bus": "virtio"}},
                        {"name": "data", "disk": {"bus": "virtio"}}
                    ]
                }
            },
            "volumes": [
                {"name": "rootdisk", "containerDisk": {"image": "qlauncher/test-guest:latest"}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-claim"}}
            ]
        },
        "status": {
            "volumeStatus": [{
                "name": "data",
                "target": "vdb",
                "persistentVolumeClaimInfo": {
                    "claimName": "data-claim",
                    "accessModes": ["ReadWriteOnce"],
                    "volumeMode": "Filesystem",
                    "capacity": {"storage": capacity},
                    "requests": {"storage": capacity},
                    "filesystemOverhead": "0.055"
                }
            }]
        }
    });
    Vmi::from_json_or_yaml(&json.to_string()).unwrap()
}

/// The guest's size of `vdb` in bytes (`/sys/block/vdb/size` is in 512-byte sectors), once it
/// equals `want` or `timeout` passed.
fn guest_size(console: &mut Console, want: u64, timeout: Duration) -> u64 {
    let deadline = Instant::now() + timeout;
    loop {
        let (status, out) = console
            .run("cat /sys/block/vdb/size", guest::BOOT_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e}; console:\n{}", console.transcript()));
        assert_eq!(status, 0, "{out}");
        let bytes = out.trim().parse::<u64>().expect("sectors") * 512;
        if bytes == want || Instant::now() >= deadline {
            return bytes;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

#[test]
fn a_grown_filesystem_claim_grows_the_guest_disk_and_never_shrinks() {
    let images = GuestImages::locate();
    let uid = format!("7e3d5b10-0000-4000-8000-{:012}", std::process::id());
    let root = LauncherRoot::new(&images.disk_qcow2, &uid);
    let private = root.private.clone();
    let image = private.join("vmi-disks/data/disk.img");

    let rt = testkit::in_process::runtime();
    let manager = Arc::new(SyncVmi::new(root.config.clone(), None));
    let _kill = KillQemu(manager.clone());
    let sync = |capacity: &str| {
        rt.block_on(manager.sync_vmi(vmi(&uid, capacity), None))
            .unwrap_or_else(|e| panic!("sync with {capacity}: {e}"));
    };

    sync("64Mi");
    assert_eq!(len(&image), 64 * MIB);
    let mut console = Console::connect(
        &private.join(&uid).join("virt-serial0"),
        Duration::from_secs(10),
    )
    .unwrap();
    // The prompt may have been printed before we connected: ask for a new one.
    console.send(b"\n").unwrap();
    assert_eq!(guest_size(&mut console, 64 * MIB, Duration::ZERO), 64 * MIB);

    // The claim was expanded: 128 MiB × (1 − 0.055) = 120.96 MiB, aligned down to 120 MiB.
    sync("128Mi");
    assert_eq!(len(&image), 120 * MIB);
    assert_eq!(
        guest_size(&mut console, 120 * MIB, Duration::from_secs(10)),
        120 * MIB
    );

    // The same sync again changes nothing.
    sync("128Mi");
    assert_eq!(len(&image), 120 * MIB);
    assert_eq!(
        guest_size(&mut console, 120 * MIB, Duration::ZERO),
        120 * MIB
    );

    // A smaller claim (usable 60 MiB) is refused: the disk never shrinks, the sync succeeds.
    sync("64Mi");
    assert_eq!(len(&image), 120 * MIB);
    assert_eq!(
        guest_size(&mut console, 120 * MIB, Duration::ZERO),
        120 * MIB
    );

    rt.block_on(manager.kill_vmi(vmi(&uid, "64Mi"))).unwrap();
}
