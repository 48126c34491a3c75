//! Interrupted writes: a filesystem that fills up mid-creation (a tiny tmpfs) must leave nothing
//! at the final path and no temporary file. Needs root (mount).

use qlauncher::storage::{
    create_empty_disk, create_overlay, write_cloud_init_iso, write_config_volume_iso, ChainPolicy,
    CloudInitData, CloudInitSpec, ConfigVolumeKind, ConfigVolumeSpec, EmptyDiskSpec, OverlaySpec,
    StorageError, VmiIdentity,
};
use testkit::storage::*;

#[test]
fn overlay_on_a_full_filesystem_leaves_nothing() {
    let scratch = Scratch::new("int-ov");
    let base = scratch.join("base.raw");
    std::fs::write(&base, vec![1u8; 1 << 20]).unwrap();
    // The sparse qcow2 allocates one page for each of its three metadata parts; give it two.
    let fs = Tmpfs::new("8k");
    let mut spec = OverlaySpec::at_kubevirt_path("vol", &base, &fs.path);
    spec.policy = ChainPolicy::default();
    let err = create_overlay(&spec).unwrap_err();
    assert!(matches!(err, StorageError::NoSpace { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "volume vol: no space left to write {}; nothing was left behind",
            spec.overlay.display()
        )
    );
    assert_eq!(fs.listing(), vec!["disk-data", "disk-data/vol"]);
}

#[test]
fn empty_disk_on_a_full_filesystem_leaves_nothing() {
    // Two pages, one short of the three the sparse qcow2 allocates.
    let fs = Tmpfs::new("8k");
    let spec = EmptyDiskSpec::at_kubevirt_path("scratch", 1 << 30, &fs.path);
    let err = create_empty_disk(&spec).unwrap_err();
    assert!(matches!(err, StorageError::NoSpace { .. }), "{err:?}");
    assert!(fs.listing().is_empty(), "{:?}", fs.listing());
}

#[test]
fn cloud_init_iso_on_a_full_filesystem_leaves_nothing_and_keeps_the_old_image() {
    let fs = Tmpfs::new("1600k");
    let spec = CloudInitSpec {
        volume: "cloudinitdisk".into(),
        user_data: Some("#cloud-config\n".into()),
        ..CloudInitSpec::default()
    };
    let vmi = VmiIdentity {
        name: "v".into(),
        namespace: "ns".into(),
        ..VmiIdentity::default()
    };
    let data = CloudInitData::resolve(&spec, &vmi, &fs.path).unwrap();
    let iso = fs.path.join("noCloud.iso");
    // The first 1 MiB image fits; a second one cannot be staged beside it.
    write_cloud_init_iso(&data, &iso, None).unwrap();
    let before = std::fs::read(&iso).unwrap();
    let err = write_cloud_init_iso(&data, &iso, None).unwrap_err();
    assert!(matches!(err, StorageError::NoSpace { .. }), "{err:?}");
    assert_eq!(fs.listing(), vec!["noCloud.iso"]);
    assert!(std::fs::read(&iso).unwrap() == before);
}

#[test]
fn config_iso_on_a_full_filesystem_leaves_nothing() {
    let scratch = Scratch::new("int-cfg");
    let fs = Tmpfs::new("512k");
    let mut spec =
        ConfigVolumeSpec::at_kubevirt_paths("cm", ConfigVolumeKind::ConfigMap, None, &fs.path)
            .unwrap();
    spec.source = scratch.dir("cm");
    std::fs::write(spec.source.join("key"), "value").unwrap();
    let err = write_config_volume_iso(&spec).unwrap_err();
    assert!(matches!(err, StorageError::NoSpace { .. }), "{err:?}");
    assert_eq!(fs.listing(), vec!["config-map-disks"]);
}
