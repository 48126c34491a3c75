//! Containment: every path derived from a VMI stays inside its root. A corpus of hostile names
//! goes through volume-name validation, the KubeVirt path helpers, VMI validation (volume
//! names, namespace and name, hostDisk paths), and the image prober's root check with `..`
//! and symlinks.

use std::path::{Component, Path, PathBuf};

use qlauncher::storage::paths::{
    cloud_init_dir, empty_disk_path, ephemeral_base_path, host_disk_path, overlay_path,
};
use qlauncher::storage::{probe_image, validate_volume_name, ChainPolicy, StorageError};
use qlauncher::vmi::{DefaultsConfig, Vmi};
use serde_json::json;

/// Hostile names: traversal, absolute paths, separators, NUL, control characters, QEMU and
/// shell metacharacters, very long values.
pub fn hostile_names() -> Vec<String> {
    let mut v: Vec<String> = [
        "..",
        ".",
        "../etc",
        "../../../../etc/passwd",
        "/etc/passwd",
        "/",
        "a/../../b",
        "a/b",
        "a\0b",
        "\0",
        "~root",
        "$(reboot)",
        "`id`",
        "a;b",
        "a|b",
        "a b",
        "a\nb",
        "a\tb",
        "a,b",
        "a,,b",
        "a=b",
        "id=x,driver=y",
        "file=/etc/shadow",
        "\"quoted\"",
        "'q'",
        "a\\b",
        "-S",
        "--help",
        "%2e%2e",
        "..\u{2215}x",
        "\u{202e}evil",
        "é",
        "*",
        "?",
        "[a]",
        "{a}",
        "#a",
        "disk.qcow2",
        "..a",
        "a..",
        "...",
        " ",
        "",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("a".repeat(254));
    v.push("a".repeat(4096));
    v.push("../".repeat(100));
    v
}

/// `path` is `root` joined with normal components only (no `..`, no root reset).
fn inside(root: &Path, path: &Path) {
    let rest = path
        .strip_prefix(root)
        .unwrap_or_else(|_| panic!("{} escapes {}", path.display(), root.display()));
    for c in rest.components() {
        assert!(
            matches!(c, Component::Normal(_)),
            "{} has {c:?} below {}",
            path.display(),
            root.display()
        );
    }
}

#[test]
fn storage_paths_of_accepted_volume_names_stay_inside_their_roots() {
    let root = Path::new("/root-under-test");
    let mut accepted = 0;
    for name in hostile_names() {
        if validate_volume_name(&name).is_err() {
            assert!(
                name.is_empty()
                    || name == "."
                    || name == ".."
                    || name.contains('/')
                    || name.contains('\0')
                    || name.len() > 253,
                "{name:?} rejected"
            );
            continue;
        }
        accepted += 1;
        inside(root, &overlay_path(root, &name));
        inside(root, &empty_disk_path(root, &name));
        inside(root, &ephemeral_base_path(root, &name, false));
        inside(Path::new("/dev"), &ephemeral_base_path(root, &name, true));
        inside(root, &cloud_init_dir(root, &name, &name));
        for host in [
            "/data/disk.img",
            "/data/../../etc/shadow",
            "disk.img",
            "/a/b/..",
        ] {
            if let Some(p) = host_disk_path(root, &name, Path::new(host)) {
                inside(root, &p);
            }
        }
    }
    assert!(accepted > 20, "{accepted}");
}

fn vmi(volume: &str, namespace: &str, name: &str, host_path: &str) -> serde_json::Value {
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": namespace, "uid": "u1"},
        "spec": {
            "domain": {"memory": {"guest": "128Mi"}, "devices": {"disks": [
                {"name": volume, "disk": {"bus": "virtio"}},
                {"name": "h", "disk": {"bus": "virtio"}}
            ]}},
            "volumes": [
                {"name": volume, "emptyDisk": {"capacity": "1Gi"}},
                {"name": "h", "hostDisk": {"path": host_path, "type": "DiskOrCreate", "capacity": "1Gi"}}
            ]
        }
    })
}

/// Every hostile volume name, namespace, VMI name and hostDisk path: the VMI is rejected, or
/// every storage path derived from it stays inside its root.
#[test]
fn validated_vmis_only_derive_contained_paths() {
    let root = Path::new("/root-under-test");
    let mut checked = 0;
    for s in hostile_names() {
        for (vol, ns, name, host) in [
            (s.as_str(), "ns", "vm", "/data/disk.img"),
            ("v", s.as_str(), "vm", "/data/disk.img"),
            ("v", "ns", s.as_str(), "/data/disk.img"),
            ("v", "ns", "vm", s.as_str()),
        ] {
            let Ok(mut v) = Vmi::from_json_or_yaml(&vmi(vol, ns, name, host).to_string()) else {
                continue;
            };
            let cfg = DefaultsConfig::for_vmi(&v);
            v.apply_defaults(&cfg);
            if v.validate().is_err() {
                continue;
            }
            checked += 1;
            validate_volume_name(vol).expect("a valid VMI has storage-valid volume names");
            inside(root, &overlay_path(root, vol));
            inside(root, &empty_disk_path(root, vol));
            inside(
                root,
                &cloud_init_dir(
                    root,
                    &v.metadata.namespace.clone().unwrap_or_default(),
                    &v.metadata.name.clone().unwrap_or_default(),
                ),
            );
            if let Some(p) = host_disk_path(root, "h", Path::new(host)) {
                inside(root, &p);
            }
        }
    }
    assert!(checked > 0);
}

/// `..` in a backing file name and a symlinked image both resolve outside the allowed root
/// and are refused before anything is opened for writing.
#[test]
fn backing_dotdot_and_symlinks_out_of_the_root_are_refused() {
    let top = tempfile::tempdir().expect("tempdir");
    let root = top.path().join("root");
    std::fs::create_dir(&root).expect("root");
    let outside = top.path().join("outside.raw");
    std::fs::write(&outside, [0u8; 4096]).expect("outside");
    let policy = ChainPolicy {
        allowed_roots: vec![root.clone()],
        ..ChainPolicy::default()
    };

    // A symlink inside the root pointing out of it.
    let link = root.join("disk.img");
    std::os::unix::fs::symlink(&outside, &link).expect("symlink");
    let err = probe_image("vol", &link, &policy).expect_err("symlink out of the root");
    assert!(
        matches!(err, StorageError::OutsideAllowedRoots { .. }),
        "{err:?}"
    );

    // A path with `..` that leaves the root.
    let dotdot: PathBuf = root.join("..").join("outside.raw");
    let err = probe_image("vol", &dotdot, &policy).expect_err("`..` out of the root");
    assert!(
        matches!(err, StorageError::OutsideAllowedRoots { .. }),
        "{err:?}"
    );

    // A qcow2 inside the root whose backing file is `../outside.raw`.
    let img = root.join("top.qcow2");
    testkit::storage::qemu_img_create(&img, "", Some((Path::new("../outside.raw"), "raw")));
    let err = probe_image("vol", &img, &policy).expect_err("backing `..` out of the root");
    assert!(
        matches!(err, StorageError::OutsideAllowedRoots { .. }),
        "{err:?}"
    );
}

/// Regression (found by `validated_vmis_only_derive_contained_paths`): a namespace of `..`
/// passed validation and put the cloud-init directory outside the ephemeral-disk root.
#[test]
fn namespace_dotdot_is_rejected() {
    let mut v = Vmi::from_json_or_yaml(&vmi("v", "..", "vm", "/data/disk.img").to_string())
        .expect("parses");
    let cfg = DefaultsConfig::for_vmi(&v);
    v.apply_defaults(&cfg);
    let errs = v.validate().expect_err("namespace `..` is invalid");
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, vec!["metadata.namespace"]);
}

/// Prints the corpus size for `scripts/reliability` (`HARDEN_CORPUS hostile-names=N`).
#[test]
fn corpus_size() {
    let n = hostile_names().len();
    assert!(n > 40);
    println!("HARDEN_CORPUS hostile-names={n}");
}
