//! KubeVirt's cache and io modes for PVC disks (`converter.go SetDriverCacheMode`,
//! `SetOptimalIOMode`), decided from the launcher's own O_DIRECT probe of the real file system:
//! the facts the launcher gathers before QEMU starts (`sync::facts::volumes::prepare`), converted
//! into QEMU's argv, for a filesystem PVC on ext4 (a loop-mounted image), on tmpfs and on ramfs, a
//! block PVC (a loop device), and an explicit `none`, `writethrough`, `writeback`.
//!
//! The mode is read back from the argv as libvirt renders it: `none` = `cache.direct=true` with
//! the device's `write-cache=on`, `writethrough` = `direct=false`, `write-cache=off`,
//! `writeback` = `direct=false`, `write-cache=on`; `aio=native` or none (QEMU's `threads`).
//!
//! The ISOs the launcher writes (cloud-init NoCloud, a configMap) follow the same probe-based
//! rules, as KubeVirt runs `SetDriverCacheMode`/`SetOptimalIOMode` over every disk with a backend
//! file: `none` with `aio=native` (the ISO is fully written) where O_DIRECT works, `writethrough`
//! where it does not, and an explicit `none` refused there.
//!
//! Needs root (mount, losetup).

use std::path::{Path, PathBuf};

use qlauncher::cmdline::context::PathRoots;
use qlauncher::cmdline::{convert, render, ConverterContext};
use qlauncher::vmi::Vmi;
use testkit::storage::{run, LoopDevice, Scratch, Tmpfs};

/// A mounted ext4 file system on a loop-mounted image; unmounted on drop.
struct Ext4 {
    _scratch: Scratch,
    mnt: PathBuf,
}

impl Ext4 {
    fn new() -> Ext4 {
        let scratch = Scratch::new("cache-ext4");
        let image = scratch.join("fs.img");
        let f = std::fs::File::create(&image).unwrap();
        f.set_len(64 << 20).unwrap();
        run("mkfs.ext4", &["-q", "-F", image.to_str().unwrap()]);
        let mnt = scratch.dir("mnt");
        run(
            "mount",
            &["-o", "loop", image.to_str().unwrap(), mnt.to_str().unwrap()],
        );
        Ext4 {
            _scratch: scratch,
            mnt,
        }
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.mnt).output();
    }
}

fn vmi(cache: Option<&str>) -> Vmi {
    let mut disk = serde_json::json!({"name": "pvc", "disk": {"bus": "virtio"}});
    if let Some(c) = cache {
        disk["cache"] = c.into();
    }
    let json = serde_json::json!({
        "metadata": {"name": "cache", "namespace": "ns", "uid": "0d6a3c1e-7f1b-4a5e-9c55-5b7d2a6c9e01"},
        "spec": {"domain": {"devices": {"disks": [disk], "autoattachPodInterface": false}, "memory": {"guest": "128Mi"}},
                 "volumes": [{"name": "pvc", "persistentVolumeClaim": {"claimName": "c"}}]},
    });
    let mut vmi = Vmi::from_json_or_yaml(&json.to_string()).unwrap();
    let cfg = qlauncher::vmi::DefaultsConfig::for_vmi(&vmi);
    vmi.apply_defaults(&cfg);
    vmi
}

/// `(cache mode, aio)` of the PVC disk, or the converter's error.
fn mode(paths: &PathRoots, cache: Option<&str>) -> Result<(String, Option<String>), String> {
    let vmi = vmi(cache);
    let vol = &vmi.spec.volumes.as_ref().unwrap()[0];
    let facts = qlauncher::sync::facts::volumes::prepare(&vmi, vol, paths, None)
        .map_err(|e| e.to_string())?
        .expect("PVC facts");
    let mut ctx = ConverterContext {
        paths: paths.clone(),
        ..ConverterContext::default()
    };
    ctx.volumes.insert("pvc".into(), facts);
    let plan = convert(&vmi, &ctx).map_err(|e| e.to_string())?;
    let argv = render::argv(&plan);
    let json = |w: &String| serde_json::from_str::<serde_json::Value>(w).ok();
    let storage = argv
        .iter()
        .filter_map(json)
        .find(|v| {
            v["filename"]
                .as_str()
                .is_some_and(|f| f.ends_with("/pvc") || f.ends_with("/pvc/disk.img"))
        })
        .expect("the PVC's storage blockdev");
    let device = argv
        .iter()
        .filter_map(json)
        .find(|v| v["id"] == "ua-pvc")
        .expect("the PVC's device");
    let direct = storage["cache"]["direct"].as_bool().unwrap();
    let write_cache = device["write-cache"].as_str().unwrap_or("on");
    let mode = match (direct, write_cache) {
        (true, "on") => "none",
        (false, "off") => "writethrough",
        (false, "on") => "writeback",
        other => panic!("unexpected cache {other:?}"),
    };
    Ok((
        mode.to_string(),
        storage["aio"].as_str().map(str::to_string),
    ))
}

/// Path roots with the filesystem PVC's image `disk.img` (16 MiB, allocated when `prealloc`)
/// under `dir`.
fn file_pvc(dir: &Path, prealloc: bool) -> PathRoots {
    let image = dir.join("private/vmi-disks/pvc/disk.img");
    std::fs::create_dir_all(image.parent().unwrap()).unwrap();
    if prealloc {
        std::fs::write(&image, vec![1u8; 16 << 20]).unwrap();
    } else {
        std::fs::File::create(&image)
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
    }
    PathRoots {
        private_dir: dir.join("private").display().to_string(),
        dev: dir.join("dev").display().to_string(),
        ..PathRoots::default()
    }
}

fn m(mode: &str, aio: Option<&str>) -> Result<(String, Option<String>), String> {
    Ok((mode.to_string(), aio.map(str::to_string)))
}

#[test]
fn ext4_pvc_gets_none_and_native_io_when_preallocated() {
    let fs = Ext4::new();
    let sparse = file_pvc(&fs.mnt.join("sparse"), false);
    assert_eq!(mode(&sparse, None), m("none", None));
    let full = file_pvc(&fs.mnt.join("full"), true);
    assert_eq!(mode(&full, None), m("none", Some("native")));
    // Explicit modes are taken as given; `none` is accepted since O_DIRECT works.
    assert_eq!(mode(&sparse, Some("none")), m("none", None));
    assert_eq!(mode(&sparse, Some("writethrough")), m("writethrough", None));
    assert_eq!(mode(&sparse, Some("writeback")), m("writeback", None));
}

#[test]
fn a_file_system_without_o_direct_gets_writethrough_and_refuses_none() {
    // ramfs never supports O_DIRECT (tmpfs does since Linux 6.6, see below).
    let fs = Tmpfs::ramfs();
    let paths = file_pvc(&fs.path, false);
    assert_eq!(mode(&paths, None), m("writethrough", None));
    let err = mode(&paths, Some("none")).unwrap_err();
    assert!(
        err.contains("spec.domain.devices.disks[0].cache") && err.contains("O_DIRECT"),
        "{err}"
    );
    assert_eq!(mode(&paths, Some("writeback")), m("writeback", None));
}

#[test]
fn tmpfs_follows_the_kernels_o_direct_support() {
    let fs = Tmpfs::new("64M");
    let paths = file_pvc(&fs.path, false);
    // tmpfs accepts O_DIRECT since Linux 6.6: the probe decides, as in KubeVirt.
    let supported = qlauncher::storage::direct_io_supported(&fs.path).unwrap();
    let want = if supported { "none" } else { "writethrough" };
    assert_eq!(mode(&paths, None), m(want, None));
}

#[test]
fn block_pvc_gets_none_and_native_io() {
    let scratch = Scratch::new("cache-block");
    let backing = scratch.join("block.img");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let out = run("losetup", &["-f", "--show", backing.to_str().unwrap()]);
    let dev = LoopDevice {
        path: PathBuf::from(out.trim()),
    };
    // virt-handler puts a block PVC at /dev/<volume>; here a symlink to the loop device.
    let devdir = scratch.dir("dev");
    std::os::unix::fs::symlink(&dev.path, devdir.join("pvc")).unwrap();
    let paths = PathRoots {
        private_dir: scratch.dir("private").display().to_string(),
        dev: devdir.display().to_string(),
        ..PathRoots::default()
    };
    assert_eq!(mode(&paths, None), m("none", Some("native")));
    assert_eq!(mode(&paths, Some("writethrough")), m("writethrough", None));
}

/// A VMI with a cloud-init NoCloud disk `cidata` and a configMap disk `cm`, `cache` on both.
fn iso_vmi(cache: Option<&str>) -> Vmi {
    let mut disks = serde_json::json!([
        {"name": "cidata", "disk": {"bus": "virtio"}},
        {"name": "cm", "disk": {"bus": "virtio"}}
    ]);
    if let Some(c) = cache {
        for d in disks.as_array_mut().unwrap() {
            d["cache"] = c.into();
        }
    }
    let json = serde_json::json!({
        "metadata": {"name": "isos", "namespace": "ns", "uid": "0d6a3c1e-7f1b-4a5e-9c55-5b7d2a6c9e02"},
        "spec": {"domain": {"devices": {"disks": disks, "autoattachPodInterface": false}, "memory": {"guest": "128Mi"}},
                 "volumes": [
                     {"name": "cidata", "cloudInitNoCloud": {"userData": "#cloud-config\n"}},
                     {"name": "cm", "configMap": {"name": "app"}}
                 ]},
    });
    let mut vmi = Vmi::from_json_or_yaml(&json.to_string()).unwrap();
    let cfg = qlauncher::vmi::DefaultsConfig::for_vmi(&vmi);
    vmi.apply_defaults(&cfg);
    vmi
}

/// Path roots under `dir` with the configMap's mounted directory (one key).
fn iso_roots(dir: &Path) -> PathRoots {
    let source = dir.join("private/config-map/cm");
    std::fs::create_dir_all(&source).unwrap();
    std::fs::write(source.join("key"), "value").unwrap();
    PathRoots {
        private_dir: dir.join("private").display().to_string(),
        ephemeral_disks: dir.join("ephemeral").display().to_string(),
        cloud_init: dir.join("ephemeral/cloud-init-data").display().to_string(),
        dev: dir.join("dev").display().to_string(),
        ..PathRoots::default()
    }
}

/// `(cache mode, aio)` of the cloud-init ISO and of the configMap ISO the launcher wrote under
/// `paths` (`sync::facts::storage::prepare_storage`, as at the first sync), or the converter's
/// error.
#[allow(clippy::type_complexity)]
fn iso_modes(
    paths: &PathRoots,
    cache: Option<&str>,
) -> Result<[(String, Option<String>); 2], String> {
    let vmi = iso_vmi(cache);
    let volumes =
        qlauncher::sync::facts::storage::prepare_storage(&vmi, paths, None, &Default::default())
            .map_err(|e| e.to_string())?;
    let ctx = ConverterContext {
        paths: paths.clone(),
        volumes,
        ..ConverterContext::default()
    };
    let plan = convert(&vmi, &ctx).map_err(|e| e.to_string())?;
    let argv = render::argv(&plan);
    let json = |w: &String| serde_json::from_str::<serde_json::Value>(w).ok();
    let one = |suffix: &str, id: &str| {
        let storage = argv
            .iter()
            .filter_map(json)
            .find(|v| v["filename"].as_str().is_some_and(|f| f.ends_with(suffix)))
            .unwrap_or_else(|| panic!("no blockdev for {suffix}: {argv:?}"));
        // The ISO is really there, where the blockdev points.
        assert!(
            Path::new(storage["filename"].as_str().unwrap()).is_file(),
            "{storage}"
        );
        let device = argv
            .iter()
            .filter_map(json)
            .find(|v| v["id"] == id)
            .unwrap_or_else(|| panic!("no device {id}"));
        let direct = storage["cache"]["direct"].as_bool().unwrap();
        let mode = match (direct, device["write-cache"].as_str().unwrap_or("on")) {
            (true, "on") => "none",
            (false, "off") => "writethrough",
            (false, "on") => "writeback",
            other => panic!("unexpected cache {other:?}"),
        };
        (
            mode.to_string(),
            storage["aio"].as_str().map(str::to_string),
        )
    };
    Ok([
        one("/ns/isos/noCloud.iso", "ua-cidata"),
        one("/config-map-disks/cm.iso", "ua-cm"),
    ])
}

fn both(mode: &str, aio: Option<&str>) -> Result<[(String, Option<String>); 2], String> {
    let one = (mode.to_string(), aio.map(str::to_string));
    Ok([one.clone(), one])
}

#[test]
fn generated_isos_on_ext4_get_none_and_native_io() {
    let fs = Ext4::new();
    let paths = iso_roots(&fs.mnt);
    assert_eq!(iso_modes(&paths, None), both("none", Some("native")));
    assert_eq!(
        iso_modes(&paths, Some("none")),
        both("none", Some("native"))
    );
    assert_eq!(
        iso_modes(&paths, Some("writethrough")),
        both("writethrough", None)
    );
}

#[test]
fn generated_isos_without_o_direct_get_writethrough_and_refuse_none() {
    let fs = Tmpfs::ramfs();
    let paths = iso_roots(&fs.path);
    assert_eq!(iso_modes(&paths, None), both("writethrough", None));
    let err = iso_modes(&paths, Some("none")).unwrap_err();
    assert!(
        err.contains("spec.domain.devices.disks[0].cache") && err.contains("O_DIRECT"),
        "{err}"
    );
    assert_eq!(
        iso_modes(&paths, Some("writeback")),
        both("writeback", None)
    );
}
