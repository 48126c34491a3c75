//! cloud-init and config-volume ISOs, checked with isoinfo and blkid. Needs root (chown).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use qlauncher::storage::cloud_init::cloud_init_iso_path;
use qlauncher::storage::{
    write_cloud_init_iso, write_config_volume_iso, CloudInitData, CloudInitKind, CloudInitSpec,
    ConfigVolumeKind, ConfigVolumeSpec, Owner, StorageError, VmiIdentity,
};
use testkit::storage::*;

const UUID: &str = "5d307ca9-b3ef-428c-8861-06e72d69f223";

/// `blkid -o export` as a map.
fn blkid(iso: &Path) -> BTreeMap<String, String> {
    run("blkid", &["-o", "export", iso.to_str().unwrap()])
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The lines of `isoinfo -d` that identify label, Joliet and Rock Ridge.
fn isoinfo_d(iso: &Path) -> Vec<String> {
    let out = run("isoinfo", &["-d", "-i", iso.to_str().unwrap()]);
    out.lines()
        .filter(|l| {
            l.starts_with("Volume id:") || l.starts_with("Joliet") || l.starts_with("Rock Ridge")
        })
        .map(str::to_string)
        .collect()
}

/// (mode string, name) of every entry of a listing (`isoinfo -R -l` or `-J -l`), by directory.
fn listing(iso: &Path, flag: &str) -> Vec<(String, String)> {
    let out = run("isoinfo", &[flag, "-l", "-i", iso.to_str().unwrap()]);
    let mut entries = Vec::new();
    let mut dir = String::new();
    for line in out.lines() {
        if let Some(d) = line.strip_prefix("Directory listing of ") {
            dir = d.trim().to_string();
            continue;
        }
        // "-rw-------   1  153  153   14 Nov 30 2026 [     26 00]  user-data "
        let Some(close) = line.find(']') else {
            continue;
        };
        let name = line[close + 1..].trim().to_string();
        if name.is_empty() || name == "." || name == ".." {
            continue;
        }
        let mode = line.split_whitespace().next().unwrap_or("").to_string();
        entries.push((mode, format!("{dir}{name}")));
    }
    entries.sort_by(|a, b| a.1.cmp(&b.1));
    entries
}

fn extract(iso: &Path, flag: &str, path: &str) -> Vec<u8> {
    let out = std::process::Command::new("isoinfo")
        .args([flag, "-i", iso.to_str().unwrap(), "-x", path])
        .output()
        .unwrap();
    assert!(out.status.success());
    out.stdout
}

fn assert_iso_basics(iso: &Path, label: &str) {
    assert_eq!(
        isoinfo_d(iso),
        vec![
            format!("Volume id: {label}"),
            "Joliet with UCS level 3 found".to_string(),
            "Rock Ridge signatures version 1 found".to_string(),
        ]
    );
    let ids = blkid(iso);
    assert_eq!(ids.get("LABEL").map(String::as_str), Some(label));
    assert_eq!(ids.get("TYPE").map(String::as_str), Some("iso9660"));
    let len = std::fs::metadata(iso).unwrap().len();
    assert_eq!(len % (1 << 20), 0, "not cylinder aligned: {len}");
}

fn vmi() -> VmiIdentity {
    VmiIdentity {
        name: "testvmi".into(),
        namespace: "default".into(),
        firmware_uuid: Some(UUID.into()),
        ..VmiIdentity::default()
    }
}

#[test]
fn nocloud_iso_has_cidata_label_and_kubevirt_files() {
    let scratch = Scratch::new("nocloud");
    let secrets = scratch.dir("secret");
    let keys = scratch.dir("secret/my-keys-access-cred");
    std::fs::write(keys.join("key2"), "ssh-ed25519 BBBB b@x").unwrap();
    std::fs::write(keys.join("key1"), "ssh-rsa AAAA a@x").unwrap();
    std::fs::create_dir(keys.join("..2026_11_30")).unwrap();
    std::fs::write(keys.join("empty"), "").unwrap();

    let spec = CloudInitSpec {
        volume: "cloudinitdisk".into(),
        kind: Some(CloudInitKind::NoCloud),
        user_data: Some("#cloud-config\npassword: fedora\n".into()),
        network_data_base64: Some("dmVyc2lvbjogMgo=".into()),
        ..CloudInitSpec::default()
    };
    let identity = VmiIdentity {
        ssh_key_secrets: vec!["my-keys".into()],
        ..vmi()
    };
    let data = CloudInitData::resolve(&spec, &identity, &secrets).unwrap();
    let ephemeral = scratch.dir("ephemeral");
    let iso = cloud_init_iso_path(&ephemeral, &identity, CloudInitKind::NoCloud).unwrap();
    assert_eq!(
        iso,
        ephemeral.join("cloud-init-data/default/testvmi/noCloud.iso")
    );
    write_cloud_init_iso(&data, &iso, Some(Owner::QEMU)).unwrap();

    assert_iso_basics(&iso, "cidata");
    assert_eq!(mode_owner(&iso), (0o644, 107, 107));
    assert_eq!(
        listing(&iso, "-R"),
        vec![
            ("-rw-------".to_string(), "/meta-data".to_string()),
            ("-rw-------".to_string(), "/network-config".to_string()),
            ("-rw-------".to_string(), "/user-data".to_string()),
        ]
    );
    let joliet: Vec<String> = listing(&iso, "-J").into_iter().map(|e| e.1).collect();
    assert_eq!(joliet, vec!["/meta-data", "/network-config", "/user-data"]);
    assert_eq!(
        extract(&iso, "-R", "/user-data"),
        b"#cloud-config\npassword: fedora\n"
    );
    assert_eq!(extract(&iso, "-R", "/network-config"), b"version: 2\n");
    assert_eq!(
        String::from_utf8(extract(&iso, "-R", "/meta-data")).unwrap(),
        format!(
            r#"{{"instance-id":"{UUID}","local-hostname":"testvmi","public-keys":{{"0":"ssh-rsa AAAA a@x","1":"ssh-ed25519 BBBB b@x"}}}}"#
        )
    );
    assert_eq!(
        extract(&iso, "-J", "/user-data"),
        b"#cloud-config\npassword: fedora\n"
    );
    // Nothing but the ISO in its directory.
    let names: Vec<_> = std::fs::read_dir(iso.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("noCloud.iso")]);
}

#[test]
fn config_drive_iso_has_openstack_layout() {
    let scratch = Scratch::new("configdrive");
    let spec = CloudInitSpec {
        volume: "cloudinit".into(),
        kind: Some(CloudInitKind::ConfigDrive),
        user_data_base64: Some("I2Nsb3VkLWNvbmZpZwo=".into()),
        network_data: Some("{\"links\":[]}".into()),
        ..CloudInitSpec::default()
    };
    let identity = VmiIdentity {
        hostname: Some("myhost".into()),
        ..vmi()
    };
    let data = CloudInitData::resolve(&spec, &identity, &scratch.join("secret")).unwrap();
    let iso = cloud_init_iso_path(&scratch.path, &identity, CloudInitKind::ConfigDrive).unwrap();
    assert!(iso.ends_with("cloud-init-data/default/testvmi/configdrive.iso"));
    write_cloud_init_iso(&data, &iso, None).unwrap();
    assert_iso_basics(&iso, "config-2");
    assert_eq!(
        listing(&iso, "-R"),
        vec![
            ("drwxr-x---".to_string(), "/openstack".to_string()),
            ("drwxr-x---".to_string(), "/openstack/latest".to_string()),
            (
                "-rw-------".to_string(),
                "/openstack/latest/meta_data.json".to_string()
            ),
            (
                "-rw-------".to_string(),
                "/openstack/latest/network_data.json".to_string()
            ),
            (
                "-rw-------".to_string(),
                "/openstack/latest/user_data".to_string()
            ),
        ]
    );
    assert_eq!(
        extract(&iso, "-R", "/openstack/latest/user_data"),
        b"#cloud-config\n"
    );
    assert_eq!(
        extract(&iso, "-J", "/openstack/latest/network_data.json"),
        b"{\"links\":[]}"
    );
    assert_eq!(
        String::from_utf8(extract(&iso, "-R", "/openstack/latest/meta_data.json")).unwrap(),
        format!(r#"{{"instance_id":"testvmi.default","hostname":"myhost","uuid":"{UUID}"}}"#)
    );
}

#[test]
fn secret_referenced_user_data_is_read_from_the_secret_mount() {
    let scratch = Scratch::new("ci-secret");
    let secrets = scratch.dir("secret");
    let mount = scratch.dir("secret/cloudinitdisk");
    std::fs::write(mount.join("userData"), "#cloud-config\nfrom: secret\n").unwrap();
    let spec = CloudInitSpec {
        volume: "cloudinitdisk".into(),
        user_data_secret_ref: Some("my-userdata".into()),
        // Both refs to one secret holding only user data: KubeVirt accepts it.
        network_data_secret_ref: Some("my-userdata".into()),
        ..CloudInitSpec::default()
    };
    let data = CloudInitData::resolve(&spec, &vmi(), &secrets).unwrap();
    assert_eq!(data.user_data, b"#cloud-config\nfrom: secret\n");
    assert!(data.network_data.is_empty());
    let iso = scratch.join("noCloud.iso");
    write_cloud_init_iso(&data, &iso, None).unwrap();
    assert_eq!(
        extract(&iso, "-R", "/user-data"),
        b"#cloud-config\nfrom: secret\n"
    );

    // A secret over the 1 MiB Secret limit is refused.
    std::fs::write(mount.join("userData"), vec![b'a'; (1 << 20) + 1]).unwrap();
    let err = CloudInitData::resolve(&spec, &vmi(), &secrets).unwrap_err();
    assert!(
        matches!(err, StorageError::DataTooLarge { size, limit, .. } if size == (1 << 20) + 1 && limit == 1 << 20),
        "{err:?}"
    );
    // A missing secret mount is an error naming the volume.
    std::fs::remove_file(mount.join("userData")).unwrap();
    let err = CloudInitData::resolve(&spec, &vmi(), &secrets).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("volume cloudinitdisk: cannot read "),
        "{err}"
    );
}

/// A kubelet-style projected volume: `..<timestamp>/` holds the files, `..data` links to it and
/// each key links through `..data`.
fn kubelet_volume(dir: &Path, files: &[(&str, &str)]) {
    let stamp = dir.join("..2026_11_30_00_00_00.000000001");
    std::fs::create_dir_all(&stamp).unwrap();
    for (name, content) in files {
        std::fs::write(stamp.join(name), content).unwrap();
        std::fs::set_permissions(stamp.join(name), std::fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name)).unwrap();
    }
    std::os::unix::fs::symlink("..2026_11_30_00_00_00.000000001", dir.join("..data")).unwrap();
}

#[test]
fn config_volume_isos_carry_their_labels_and_files() {
    let scratch = Scratch::new("cfgvol");
    let private = scratch.dir("kubevirt-private");
    let cases = [
        (
            ConfigVolumeKind::ConfigMap,
            "config-map",
            Some("mylabel"),
            "mylabel",
        ),
        (ConfigVolumeKind::Secret, "secret", None, "cfgdata"),
        (
            ConfigVolumeKind::DownwardApi,
            "downwardapi",
            Some(""),
            "cfgdata",
        ),
        (ConfigVolumeKind::ServiceAccount, "", None, "cfgdata"),
        (
            ConfigVolumeKind::Sysprep,
            "sysprep",
            Some("ignored"),
            "unattendCD",
        ),
    ];
    for (kind, source_dir, volume_label, label) in cases {
        let volume = format!("vol-{label}-{source_dir}");
        let mut spec =
            ConfigVolumeSpec::at_kubevirt_paths(&volume, kind, volume_label, &private).unwrap();
        if kind == ConfigVolumeKind::ServiceAccount {
            spec.source = scratch.join("serviceaccount");
        }
        let files: &[(&str, &str)] = match kind {
            ConfigVolumeKind::Sysprep => &[("Autounattend.xml", "<unattend/>\n")],
            ConfigVolumeKind::ServiceAccount => {
                &[("token", "eyJhbGciOi"), ("namespace", "default")]
            }
            _ => &[("option1", "value1"), ("option2", "value2\n")],
        };
        kubelet_volume(&spec.source, files);
        write_config_volume_iso(&spec).unwrap();
        assert_iso_basics(&spec.iso, label);
        assert_eq!(mode_owner(&spec.iso), (0o644, 107, 107), "{kind:?}");
        let rr = listing(&spec.iso, "-R");
        for (name, content) in files {
            assert!(
                rr.contains(&("-rw-r-----".to_string(), format!("/{name}"))),
                "{kind:?}: {rr:?}"
            );
            assert!(rr.contains(&("-rw-r-----".to_string(), format!("/..data/{name}"))));
            assert_eq!(
                extract(&spec.iso, "-R", &format!("/{name}")),
                content.as_bytes()
            );
            assert_eq!(
                extract(&spec.iso, "-J", &format!("/{name}")),
                content.as_bytes()
            );
        }
    }
    let sa =
        ConfigVolumeSpec::at_kubevirt_paths("sa", ConfigVolumeKind::ServiceAccount, None, &private)
            .unwrap();
    assert!(private
        .join("service-account-disk/service-account.iso")
        .exists());
    assert_eq!(
        sa.iso,
        private.join("service-account-disk/service-account.iso")
    );
    assert!(private
        .join("config-map-disks/vol-mylabel-config-map.iso")
        .exists());
}

#[test]
fn sysprep_without_unattend_file_is_rejected_and_writes_nothing() {
    let scratch = Scratch::new("sysprep");
    let private = scratch.dir("kubevirt-private");
    let spec =
        ConfigVolumeSpec::at_kubevirt_paths("win", ConfigVolumeKind::Sysprep, None, &private)
            .unwrap();
    kubelet_volume(&spec.source, &[("other.xml", "<x/>")]);
    let err = write_config_volume_iso(&spec).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "volume win: sysprep source {} holds neither autounattend.xml nor unattend.xml",
            spec.source.display()
        )
    );
    assert!(!private.join("sysprep-disks").exists());
}

#[test]
fn missing_config_source_is_a_named_error() {
    let scratch = Scratch::new("cfg-missing");
    let spec =
        ConfigVolumeSpec::at_kubevirt_paths("cm", ConfigVolumeKind::ConfigMap, None, &scratch.path)
            .unwrap();
    let err = write_config_volume_iso(&spec).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("volume cm: cannot read {}", spec.source.display())
    );
}

#[test]
fn zeroed_placeholder_iso_for_migration_targets() {
    let scratch = Scratch::new("zeroed");
    let iso = scratch.join("config-map-disks/cm.iso");
    qlauncher::storage::iso::write_zeroed_iso("cm", &iso, 3 << 20, Some(Owner::QEMU)).unwrap();
    let data = std::fs::read(&iso).unwrap();
    assert_eq!(data.len(), 3 << 20);
    assert!(data.iter().all(|b| *b == 0));
    assert_eq!(mode_owner(&iso), (0o644, 107, 107));
    assert_eq!(
        std::fs::read_dir(scratch.join("config-map-disks"))
            .unwrap()
            .count(),
        1
    );
}
