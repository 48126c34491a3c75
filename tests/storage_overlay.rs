//! Overlays, empty disks, host disks and image facts, checked with the real qemu-img and qemu-io.
//! Needs root (chown, chattr, losetup, mount).

use std::path::{Path, PathBuf};

use qlauncher::storage::{
    create_cbt_overlay, create_empty_disk, create_overlay, direct_io_supported, prepare_host_disk,
    probe_disk, probe_image, CbtOverlaySpec, ChainPolicy, EmptyDiskSpec, HostDiskSpec,
    HostDiskType, ImageFormat, Outcome, OverlaySpec, Owner, StorageError, StorageKind,
};
use testkit::storage::*;

const MIB: u64 = 1 << 20;

/// containerDisk-like layout: `<scratch>/container-disks/` holds bases, overlays go under
/// `<scratch>/ephemeral/disk-data/<volume>/disk.qcow2`.
struct Layout {
    scratch: Scratch,
    bases: PathBuf,
    ephemeral: PathBuf,
}

fn layout(prefix: &str) -> Layout {
    let scratch = Scratch::new(prefix);
    let bases = scratch.dir("container-disks");
    let ephemeral = scratch.dir("ephemeral");
    Layout {
        scratch,
        bases,
        ephemeral,
    }
}

fn spec(l: &Layout, volume: &str, base: &Path) -> OverlaySpec {
    let mut spec = OverlaySpec::at_kubevirt_path(volume, base, &l.ephemeral);
    spec.policy = ChainPolicy {
        allowed_roots: vec![l.bases.clone()],
        max_depth: 8,
    };
    spec
}

fn raw_base(path: &Path, len: u64) {
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    std::fs::write(path, data).unwrap();
}

/// What qemu-img reports about an overlay: (format, virtual size, backing file, backing format).
fn overlay_info(path: &Path) -> (String, u64, String, String) {
    let info = qemu_img_info(path);
    (
        info["format"].as_str().unwrap_or_default().to_string(),
        info["virtual-size"].as_u64().unwrap_or_default(),
        info["backing-filename"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        info["backing-filename-format"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// GHSA-qv98-3369-g364: a containerDisk image that records its own backing file (here
/// `/etc/shadow`) is refused by KubeVirt's default overlay spec before anything below the base is
/// opened, naming the volume, and no overlay (nor its directory) is left behind. An overlay kept
/// from an earlier run does not let a base swapped for a hostile one through either.
#[test]
fn a_container_disk_with_its_own_backing_file_is_refused() {
    let l = layout("ov-hostile");
    let base = l.bases.join("disk_0.img");
    qemu_img_create_unchecked(&base, "16M", "/etc/shadow", "raw");
    let spec = OverlaySpec::at_kubevirt_path("containerdisk", &base, &l.ephemeral);
    let err = create_overlay(&spec).unwrap_err();
    match &err {
        StorageError::BaseHasBackingFile {
            volume,
            path,
            backing,
        } => {
            assert_eq!(
                (volume.as_str(), path, backing.as_str()),
                ("containerdisk", &base, "/etc/shadow")
            );
        }
        other => panic!("{other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.starts_with("volume containerdisk: ") && text.contains("/etc/shadow"),
        "{text}"
    );
    assert!(!l.ephemeral.join("disk-data").exists());

    // An overlay kept from an earlier run over a good base: the base is checked again.
    let good = l.bases.join("disk_1.img");
    raw_base(&good, MIB);
    let spec = OverlaySpec::at_kubevirt_path("second", &good, &l.ephemeral);
    assert_eq!(create_overlay(&spec).unwrap().0, Outcome::Created);
    std::fs::remove_file(&good).unwrap();
    std::fs::copy(&base, &good).unwrap();
    assert!(matches!(
        create_overlay(&spec).unwrap_err(),
        StorageError::BaseHasBackingFile { .. }
    ));
}

#[test]
fn overlay_over_qcow2_base_reads_through_and_never_writes_the_base() {
    let l = layout("ov-qcow2");
    let base = l.bases.join("disk_0.img");
    qemu_img_create(&base, "64M", None);
    qemu_io(&base, "qcow2", "write -P 0xab 0 1M");
    // The base may not even be opened for writing: make it immutable (root included).
    run("chattr", &["+i", base.to_str().unwrap()]);
    let before = std::fs::read(&base).unwrap();

    let spec = spec(&l, "containerdisk", &base);
    let (outcome, facts) = create_overlay(&spec).unwrap();
    assert_eq!(outcome, Outcome::Created);
    let facts = facts.unwrap();
    assert_eq!(
        (
            facts.format,
            facts.virtual_size,
            facts.kind,
            facts.chain_depth
        ),
        (ImageFormat::Qcow2, 64 * MIB, StorageKind::File, 0)
    );
    let overlay = l.ephemeral.join("disk-data/containerdisk/disk.qcow2");
    assert_eq!(spec.overlay, overlay);
    assert_eq!(
        overlay_info(&overlay),
        (
            "qcow2".to_string(),
            64 * MIB,
            base.display().to_string(),
            "qcow2".to_string()
        )
    );
    assert_eq!(
        qemu_img_info(&overlay)["format-specific"]["data"]["compat"],
        "1.1"
    );
    assert_qemu_img_check_clean(&overlay);
    assert_eq!(mode_owner(&overlay), (0o640, 107, 107));

    qemu_io(&overlay, "qcow2", "read -P 0xab 0 1M");
    qemu_io(&overlay, "qcow2", "write -P 0xcd 4096 128k");
    qemu_io(&overlay, "qcow2", "read -P 0xcd 4096 128k");
    qemu_io(&overlay, "qcow2", "read -P 0xab 0 4096");
    assert_qemu_img_check_clean(&overlay);
    assert!(std::fs::read(&base).unwrap() == before, "base changed");
}

#[test]
fn overlay_over_raw_base_records_raw_and_the_rounded_size() {
    let l = layout("ov-raw");
    let base = l.bases.join("disk_1.img");
    raw_base(&base, 3 * MIB + 1000);
    let before = std::fs::read(&base).unwrap();
    let spec = spec(&l, "ephemeral-vol", &base);
    let (outcome, facts) = create_overlay(&spec).unwrap();
    assert_eq!(outcome, Outcome::Created);
    // QEMU rounds a raw image's length up to 512 bytes; qemu-img agrees on the base.
    let rounded = (3 * MIB + 1000).div_ceil(512) * 512;
    assert_eq!(facts.unwrap().virtual_size, rounded);
    assert_eq!(qemu_img_info(&base)["virtual-size"].as_u64(), Some(rounded));
    assert_eq!(
        overlay_info(&spec.overlay),
        (
            "qcow2".to_string(),
            rounded,
            base.display().to_string(),
            "raw".to_string()
        )
    );
    assert_qemu_img_check_clean(&spec.overlay);
    qemu_io(&spec.overlay, "qcow2", "write -P 0x11 0 2M");
    qemu_io(&spec.overlay, "qcow2", "read -P 0x11 0 2M");
    assert!(std::fs::read(&base).unwrap() == before, "base changed");
}

#[test]
fn existing_overlay_is_kept_with_the_guest_writes() {
    let l = layout("ov-keep");
    let base = l.bases.join("disk_0.img");
    raw_base(&base, MIB);
    let spec = spec(&l, "vol", &base);
    assert_eq!(create_overlay(&spec).unwrap().0, Outcome::Created);
    qemu_io(&spec.overlay, "qcow2", "write -P 0x5a 0 64k");
    let before = std::fs::read(&spec.overlay).unwrap();
    let (outcome, facts) = create_overlay(&spec).unwrap();
    assert_eq!(
        (outcome, facts.map(|f| f.virtual_size)),
        (Outcome::Kept, Some(MIB))
    );
    assert!(std::fs::read(&spec.overlay).unwrap() == before);
    qemu_io(&spec.overlay, "qcow2", "read -P 0x5a 0 64k");
    // The base is checked again on every run (QEMU opens it through the overlay): a missing
    // base is an error naming the volume, and the overlay with the guest's writes stays.
    std::fs::remove_file(&base).unwrap();
    assert!(matches!(
        create_overlay(&spec).unwrap_err(),
        StorageError::MissingBase { .. }
    ));
    assert!(std::fs::read(&spec.overlay).unwrap() == before);
}

#[test]
fn missing_and_unusable_bases_are_named_errors_and_leave_nothing() {
    let l = layout("ov-errors");
    let missing = l.bases.join("nope.img");
    let err = create_overlay(&spec(&l, "vol-a", &missing)).unwrap_err();
    assert!(matches!(err, StorageError::MissingBase { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "volume vol-a: base image {} does not exist",
            missing.display()
        )
    );

    let file = l.bases.join("file");
    std::fs::write(&file, b"x").unwrap();
    let not_dir = file.join("child");
    let err = create_overlay(&spec(&l, "vol-b", &not_dir)).unwrap_err();
    assert!(
        matches!(err, StorageError::UnreadableBase { .. }),
        "{err:?}"
    );

    let fifo = l.bases.join("fifo");
    run("mkfifo", &[fifo.to_str().unwrap()]);
    let err = create_overlay(&spec(&l, "vol-c", &fifo)).unwrap_err();
    assert!(
        matches!(err, StorageError::UnsupportedFormat { .. }),
        "{err:?}"
    );

    let garbage = l.bases.join("garbage.qcow2");
    let mut bytes = b"QFI\xfb".to_vec();
    bytes.extend([0u8; 100]);
    std::fs::write(&garbage, bytes).unwrap();
    let err = create_overlay(&spec(&l, "vol-d", &garbage)).unwrap_err();
    assert!(
        matches!(err, StorageError::UnsupportedFormat { .. }),
        "{err:?}"
    );

    let vmdk = l.bases.join("disk.vmdk");
    run(
        "qemu-img",
        &["create", "-q", "-f", "vmdk", vmdk.to_str().unwrap(), "1M"],
    );
    let err = create_overlay(&spec(&l, "vol-e", &vmdk)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "volume vol-e: image {} has an unsupported format: vmdk",
            vmdk.display()
        )
    );
    let mut relative = spec(&l, "vol-f", Path::new("container-disks/disk_0.img"));
    relative.policy.allowed_roots.clear();
    let err = create_overlay(&relative).unwrap_err();
    assert!(matches!(err, StorageError::CreateOverlay { .. }), "{err:?}");
    // No overlay directory got a file.
    let data = l.ephemeral.join("disk-data");
    let leftovers: Vec<_> = walk(&data);
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path);
            }
        }
    }
    out
}

#[test]
fn chains_deeper_than_the_policy_are_rejected() {
    let l = layout("ov-chain");
    let mut below = l.bases.join("b0.raw");
    raw_base(&below, MIB);
    let mut format = "raw";
    for i in 1..=3 {
        let next = l.bases.join(format!("b{i}.qcow2"));
        qemu_img_create(&next, "", Some((&below, format)));
        below = next;
        format = "qcow2";
    }
    // b3 -> b2 -> b1 -> b0: depth 3, so the overlay is the 4th level.
    let facts = probe_image("vol", &below, &ChainPolicy::default()).unwrap();
    assert_eq!((facts.format, facts.chain_depth), (ImageFormat::Qcow2, 3));
    assert_eq!(
        facts
            .backing
            .as_ref()
            .map(|b| (b.format, b.format_recorded)),
        Some((ImageFormat::Qcow2, true))
    );

    let mut tight = spec(&l, "deep", &below);
    tight.policy.max_depth = 3;
    let err = create_overlay(&tight).unwrap_err();
    assert!(
        matches!(err, StorageError::ChainTooDeep { limit: 3, .. }),
        "{err:?}"
    );
    assert!(!tight.overlay.exists());

    // containerDisk policy (KubeVirt VerifyQCOW2): a qcow2 base with any backing file is refused.
    let mut container = spec(&l, "cd", &l.bases.join("b1.qcow2"));
    container.policy.max_depth = ChainPolicy::container_disk().max_depth;
    assert!(matches!(
        create_overlay(&container).unwrap_err(),
        StorageError::BaseHasBackingFile { .. }
    ));
    let mut flat = spec(&l, "cd", &l.bases.join("b0.raw"));
    flat.policy.max_depth = ChainPolicy::container_disk().max_depth;
    assert_eq!(create_overlay(&flat).unwrap().0, Outcome::Created);

    let mut enough = spec(&l, "deep", &below);
    enough.policy.max_depth = 4;
    assert_eq!(create_overlay(&enough).unwrap().0, Outcome::Created);
    let chain = run(
        "qemu-img",
        &[
            "info",
            "--backing-chain",
            "--output=json",
            enough.overlay.to_str().unwrap(),
        ],
    );
    let chain: serde_json::Value = serde_json::from_str(&chain).unwrap();
    assert_eq!(chain.as_array().map(Vec::len), Some(5));
    assert_qemu_img_check_clean(&enough.overlay);
}

#[test]
fn backing_files_outside_the_allowed_roots_are_rejected() {
    let l = layout("ov-roots");
    let outside = l.scratch.dir("elsewhere");
    let secret = outside.join("host-secret.raw");
    raw_base(&secret, MIB);

    // A base whose backing file lies outside the roots.
    let base = l.bases.join("sneaky.qcow2");
    qemu_img_create(&base, "", Some((&secret, "raw")));
    let err = create_overlay(&spec(&l, "vol", &base)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "volume vol: backing file {} (of {}) is not a local file under the allowed roots {:?}",
            secret.display(),
            base.display(),
            vec![l.bases.clone()]
        )
    );

    // A relative name climbing out of the root.
    let relative = l.bases.join("relative.qcow2");
    qemu_img_create_unchecked(&relative, "1M", "../elsewhere/host-secret.raw", "raw");
    assert!(matches!(
        create_overlay(&spec(&l, "vol2", &relative)).unwrap_err(),
        StorageError::OutsideAllowedRoots { .. }
    ));

    // A symlink in the root pointing outside.
    let link = l.bases.join("link.img");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    assert!(matches!(
        create_overlay(&spec(&l, "vol3", &link)).unwrap_err(),
        StorageError::OutsideAllowedRoots {
            what: "base image",
            ..
        }
    ));

    // A protocol backing name.
    let nbd = l.bases.join("nbd.qcow2");
    qemu_img_create_unchecked(&nbd, "1M", "nbd://127.0.0.1:10809/x", "raw");
    assert!(matches!(
        create_overlay(&spec(&l, "vol4", &nbd)).unwrap_err(),
        StorageError::OutsideAllowedRoots { .. }
    ));
    assert!(walk(&l.ephemeral).is_empty());
}

#[test]
fn empty_disk_is_a_sparse_aligned_qcow2_and_is_kept() {
    let scratch = Scratch::new("empty");
    let dir = scratch.join("empty-disks");
    let spec = EmptyDiskSpec::at_kubevirt_path("scratch-disk", 100 * MIB + 12345, &dir);
    assert_eq!(spec.path, dir.join("scratch-disk.qcow2"));
    assert_eq!(
        create_empty_disk(&spec).unwrap(),
        (Outcome::Created, 100 * MIB)
    );
    let info = qemu_img_info(&spec.path);
    assert_eq!(info["format"], "qcow2");
    assert_eq!(info["virtual-size"].as_u64(), Some(100 * MIB));
    assert_eq!(info.get("backing-filename"), None);
    assert!(info["actual-size"].as_u64().unwrap() < MIB, "{info}");
    assert_qemu_img_check_clean(&spec.path);
    assert_eq!(mode_owner(&spec.path), (0o644, 107, 107));
    qemu_io(&spec.path, "qcow2", "write -P 0x77 99M 1M");
    let before = std::fs::read(&spec.path).unwrap();
    assert_eq!(create_empty_disk(&spec).unwrap().0, Outcome::Kept);
    assert!(std::fs::read(&spec.path).unwrap() == before);

    let tiny = EmptyDiskSpec::at_kubevirt_path("tiny", MIB - 1, &dir);
    assert_eq!(
        create_empty_disk(&tiny).unwrap_err().to_string(),
        "volume tiny: capacity of 1048575 bytes is too low, must be at least 1 MiB"
    );
}

#[test]
fn host_disks_are_created_sparse_or_must_exist() {
    let scratch = Scratch::new("hostdisk");
    let path = scratch.join("vmi-disks/pvc-vol/disk.img");
    let spec = HostDiskSpec {
        volume: "pvc-vol".into(),
        path: path.clone(),
        kind: HostDiskType::DiskOrCreate {
            capacity: 10 * MIB + 5,
        },
        tolerance_percent: 10,
        reserve_bytes: MIB,
        owner: Some(Owner::QEMU),
    };
    assert_eq!(
        prepare_host_disk(&spec).unwrap(),
        (Outcome::Created, 10 * MIB)
    );
    let info = qemu_img_info(&path);
    assert_eq!(info["format"], "raw");
    assert_eq!(info["virtual-size"].as_u64(), Some(10 * MIB));
    assert!(info["actual-size"].as_u64().unwrap() <= 64 * 1024, "{info}");
    assert_eq!(mode_owner(&path), (0o644, 107, 107));
    assert_eq!(prepare_host_disk(&spec).unwrap(), (Outcome::Kept, 10 * MIB));

    let missing = HostDiskSpec {
        volume: "hd".into(),
        path: scratch.join("absent.img"),
        kind: HostDiskType::Disk,
        ..spec.clone()
    };
    assert!(matches!(
        prepare_host_disk(&missing).unwrap_err(),
        StorageError::HostDiskMissing { .. }
    ));

    let huge = HostDiskSpec {
        volume: "huge".into(),
        path: scratch.join("huge.img"),
        kind: HostDiskType::DiskOrCreate { capacity: 1 << 60 },
        ..spec.clone()
    };
    assert!(matches!(
        prepare_host_disk(&huge).unwrap_err(),
        StorageError::HostDiskTooLarge { .. }
    ));
    assert!(!scratch.join("huge.img").exists());
}

#[test]
fn host_disk_within_the_tolerance_shrinks_to_the_free_space() {
    let fs = Tmpfs::new("8m");
    let spec = HostDiskSpec {
        volume: "small-pv".into(),
        path: fs.path.join("disk.img"),
        kind: HostDiskType::DiskOrCreate { capacity: 8 * MIB },
        tolerance_percent: 10,
        reserve_bytes: 512 * 1024,
        owner: None,
    };
    let (outcome, size) = prepare_host_disk(&spec).unwrap();
    assert_eq!(outcome, Outcome::Created);
    assert_eq!(size, 8 * MIB - 512 * 1024);
    assert_eq!(std::fs::metadata(&spec.path).unwrap().len(), size);
}

#[test]
fn facts_of_files_and_block_devices() {
    let scratch = Scratch::new("facts");
    let raw = scratch.join("disk.raw");
    raw_base(&raw, 4 * MIB);
    let facts = probe_image("vol", &raw, &ChainPolicy::default()).unwrap();
    assert_eq!(
        (facts.format, facts.kind, facts.virtual_size, facts.backing),
        (ImageFormat::Raw, StorageKind::File, 4 * MIB, None)
    );
    let qcow = scratch.join("disk.qcow2");
    qemu_img_create(&qcow, "1G", None);
    let facts = probe_image("vol", &qcow, &ChainPolicy::default()).unwrap();
    assert_eq!(
        (
            facts.format,
            facts.kind,
            facts.virtual_size,
            facts.chain_depth
        ),
        (ImageFormat::Qcow2, StorageKind::File, 1 << 30, 0)
    );

    let dev = LoopDevice::new(&raw);
    let facts = probe_image("blockvol", &dev.path, &ChainPolicy::default()).unwrap();
    assert_eq!(
        (facts.format, facts.kind, facts.virtual_size),
        (ImageFormat::Raw, StorageKind::Block, 4 * MIB)
    );
    let dev_q = LoopDevice::new(&qcow);
    let facts = probe_image("blockvol", &dev_q.path, &ChainPolicy::default()).unwrap();
    assert_eq!(
        (facts.format, facts.kind),
        (ImageFormat::Qcow2, StorageKind::Block)
    );
}

#[test]
fn direct_io_is_supported_on_ext4_but_not_on_ramfs() {
    let scratch = Scratch::new("dio");
    let file = scratch.join("disk.img");
    raw_base(&file, MIB);
    assert!(direct_io_supported(&scratch.path).unwrap());
    assert!(direct_io_supported(&file).unwrap());
    let fs = Tmpfs::ramfs();
    assert!(!direct_io_supported(&fs.path).unwrap());
    assert!(!direct_io_supported(&fs.path.join("not-yet.img")).unwrap());
    // A disk on ext4 over a base on ramfs: the backing file decides (KubeVirt checks both).
    let base = fs.path.join("base.raw");
    raw_base(&base, MIB);
    let overlay = scratch.join("overlay.qcow2");
    qemu_img_create(&overlay, "", Some((&base, "raw")));
    let disk = probe_disk("vol", &overlay, &ChainPolicy::default()).unwrap();
    assert_eq!((disk.image.chain_depth, disk.direct_io), (1, false));
    let alone = probe_disk("vol", &file, &ChainPolicy::default()).unwrap();
    assert!(alone.direct_io);
    std::fs::remove_file(&overlay).unwrap();
    std::fs::remove_file(&base).unwrap();
    // The probes left nothing behind.
    assert!(fs.listing().is_empty());
    assert_eq!(std::fs::read_dir(&scratch.path).unwrap().count(), 1);
}

/// `qemu-img info --output json` of an image with every `filename` member (they name the two
/// files apart) and `actual-size` (the file system's allocation, not the image) left out.
fn info_without_names(path: &Path) -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.remove("filename");
                map.remove("actual-size");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut info = qemu_img_info(path);
    strip(&mut info);
    info
}

/// The first differing byte of two files, for a readable failure.
fn first_difference(ours: &[u8], theirs: &[u8]) -> Option<usize> {
    if ours.len() != theirs.len() {
        return Some(ours.len().min(theirs.len()));
    }
    ours.iter().zip(theirs).position(|(a, b)| a != b)
}

/// Asserts `ours` holds exactly the bytes of `theirs` (qemu-img's file), that `qemu-img check`
/// finds both clean and that `qemu-img info` says the same of both.
fn assert_same_image(ours: &Path, theirs: &Path) {
    let (a, b) = (std::fs::read(ours).unwrap(), std::fs::read(theirs).unwrap());
    assert_eq!(
        first_difference(&a, &b),
        None,
        "{} ({} bytes) differs from qemu-img's {} ({} bytes)",
        ours.display(),
        a.len(),
        theirs.display(),
        b.len()
    );
    assert_qemu_img_check_clean(ours);
    assert_qemu_img_check_clean(theirs);
    assert_eq!(info_without_names(ours), info_without_names(theirs));
}

/// An overlay holds the bytes `qemu-img create -f qcow2 -b <base> -F <fmt>` writes (QEMU 7.2),
/// over raw bases of several lengths (sparse, up to 5 TiB, one not a multiple of 512) and qcow2
/// bases, so QEMU finds nothing it would not have written itself.
#[test]
fn overlays_are_byte_for_byte_what_qemu_img_creates() {
    let l = layout("ov-bytes");
    let theirs_dir = l.scratch.dir("qemu-img");
    let mut bases = Vec::new();
    for (i, len) in [MIB, 3 * MIB + 1000, 1 << 30, 7 << 30, 5 << 40]
        .into_iter()
        .enumerate()
    {
        let base = l.bases.join(format!("raw{i}.img"));
        std::fs::File::create(&base).unwrap().set_len(len).unwrap();
        bases.push((base, "raw"));
    }
    for (i, size) in ["64M", "10G", "2T"].into_iter().enumerate() {
        let base = l.bases.join(format!("qcow2-{i}.img"));
        qemu_img_create(&base, size, None);
        bases.push((base, "qcow2"));
    }
    for (i, (base, format)) in bases.iter().enumerate() {
        let spec = spec(&l, &format!("vol{i}"), base);
        assert_eq!(create_overlay(&spec).unwrap().0, Outcome::Created);
        let theirs = theirs_dir.join(format!("vol{i}.qcow2"));
        qemu_img_create(&theirs, "", Some((base, format)));
        assert_same_image(&spec.overlay, &theirs);
    }
}

/// An empty disk holds the bytes `qemu-img create -f qcow2 <file> <size>` writes, for sizes
/// from KubeVirt's 1 MiB minimum to 3 TiB.
#[test]
fn empty_disks_are_byte_for_byte_what_qemu_img_creates() {
    let scratch = Scratch::new("empty-bytes");
    let dir = scratch.join("empty-disks");
    let theirs_dir = scratch.dir("qemu-img");
    for (i, size) in [MIB, 100 * MIB, 10 << 30, 3 << 40].into_iter().enumerate() {
        let spec = EmptyDiskSpec::at_kubevirt_path(&format!("disk{i}"), size, &dir);
        assert_eq!(create_empty_disk(&spec).unwrap(), (Outcome::Created, size));
        let theirs = theirs_dir.join(format!("disk{i}.qcow2"));
        qemu_img_create(&theirs, &size.to_string(), None);
        assert_same_image(&spec.path, &theirs);
    }
}

/// The `query-named-block-nodes` entry of `node`.
async fn named_node(client: &qlauncher::qmp::QmpClient, node: &str) -> serde_json::Value {
    let nodes = client
        .execute("query-named-block-nodes", None)
        .await
        .expect("query-named-block-nodes");
    nodes
        .as_array()
        .expect("array")
        .iter()
        .find(|n| n["node-name"] == node)
        .cloned()
        .unwrap_or_else(|| panic!("no node {node} in {nodes}"))
}

/// QEMU itself (`-machine none`, QMP `blockdev-add` of the qcow2 over its file, as libvirt adds
/// a disk) opens an overlay with its backing chain (raw and qcow2 bases, the format taken from
/// the overlay's header) and an empty disk with none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_opens_overlays_with_their_backing_chain_and_empty_disks() {
    use serde_json::json;
    let l = layout("ov-qemu");
    let raw = l.bases.join("disk_0.img");
    raw_base(&raw, 2 * MIB);
    let qcow2 = l.bases.join("disk_1.img");
    qemu_img_create(&qcow2, "32M", None);
    let mut images = Vec::new();
    for (volume, base, format, size) in [
        ("raw-vol", &raw, "raw", 2 * MIB),
        ("qcow2-vol", &qcow2, "qcow2", 32 * MIB),
    ] {
        let spec = spec(&l, volume, base);
        create_overlay(&spec).unwrap();
        images.push((spec.overlay, Some((base.clone(), format)), size));
    }
    let empty = EmptyDiskSpec::at_kubevirt_path("scratch", 16 * MIB, &l.scratch.join("empty"));
    create_empty_disk(&empty).unwrap();
    images.push((empty.path, None, 16 * MIB));

    let args = ["-machine", "none", "-nodefaults", "-display", "none", "-S"]
        .map(String::from)
        .to_vec();
    let vm = testkit::qmp::TestVm::launch(args)
        .await
        .map_err(|(e, _)| e)
        .expect("launch QEMU");
    let client = vm.client();
    for (i, (image, backing, size)) in images.iter().enumerate() {
        let node = format!("disk{i}");
        client
            .execute(
                "blockdev-add",
                Some(json!({
                    "driver": "qcow2",
                    "node-name": node,
                    "read-only": true,
                    "file": {"driver": "file", "filename": image.to_str().unwrap()},
                })),
            )
            .await
            .unwrap_or_else(|e| panic!("blockdev-add {}: {e}", image.display()));
        let info = named_node(client, &node).await;
        assert_eq!(info["drv"], "qcow2", "{info}");
        assert_eq!(
            info["image"]["virtual-size"].as_u64(),
            Some(*size),
            "{info}"
        );
        match backing {
            Some((base, format)) => {
                assert_eq!(info["backing_file_depth"], 1, "{info}");
                assert_eq!(info["backing_file"], base.to_str().unwrap(), "{info}");
                let backing_image = &info["image"]["backing-image"];
                assert_eq!(backing_image["filename"], base.to_str().unwrap(), "{info}");
                assert_eq!(backing_image["format"], *format, "{info}");
            }
            None => {
                assert_eq!(info["backing_file_depth"], 0, "{info}");
                assert!(info["image"].get("backing-image").is_none(), "{info}");
            }
        }
    }
}

/// A CBT overlay over `image` at `<cbt>/<volume>.qcow2`, no root restriction.
fn cbt_spec(cbt: &Path, volume: &str, image: &Path) -> CbtOverlaySpec {
    let mut spec = CbtOverlaySpec::at_kubevirt_path(volume, image, cbt);
    spec.owner = None;
    spec
}

/// A CBT overlay holds the bytes `qemu-img create -f qcow2 -o data_file=<image>,data_file_raw=on`
/// writes (QEMU 7.2: the preallocated L1 and L2 tables of every guest cluster), for raw images
/// from 512 bytes to 100 GiB (one not a multiple of 512, one spanning many L2 tables); qemu-img
/// reports the raw data file, and the image itself is not changed.
#[test]
fn cbt_overlays_are_byte_for_byte_what_qemu_img_creates() {
    let scratch = Scratch::new("cbt-bytes");
    let disks = scratch.dir("vmi-disks");
    let cbt = scratch.join("libvirt/qemu/cbt");
    let theirs_dir = scratch.dir("qemu-img");
    for (i, len) in [512u64, 16 * MIB, 16 * MIB + 1000, 1 << 30, 100 << 30]
        .into_iter()
        .enumerate()
    {
        let image = disks.join(format!("vol{i}.img"));
        std::fs::File::create(&image).unwrap().set_len(len).unwrap();
        let spec = cbt_spec(&cbt, &format!("vol{i}"), &image);
        let (outcome, facts) = create_cbt_overlay(&spec).unwrap();
        assert_eq!(
            (outcome, facts.virtual_size),
            (Outcome::Created, len.div_ceil(512) * 512)
        );
        assert_eq!(spec.overlay, cbt.join(format!("vol{i}.qcow2")));
        assert_eq!(std::fs::metadata(&image).unwrap().len(), len);
        let info = qemu_img_info(&spec.overlay);
        let data = &info["format-specific"]["data"];
        assert_eq!(data["data-file"].as_str(), image.to_str(), "{info}");
        assert_eq!(data["data-file-raw"].as_bool(), Some(true), "{info}");
        assert_eq!(info["virtual-size"].as_u64(), Some(len.div_ceil(512) * 512));
        let theirs = theirs_dir.join(format!("vol{i}.qcow2"));
        let options = format!("data_file={},data_file_raw=on", image.display());
        run(
            "qemu-img",
            &[
                "create",
                "-q",
                "-f",
                "qcow2",
                "-o",
                &options,
                theirs.to_str().unwrap(),
                &(len.div_ceil(512) * 512).to_string(),
            ],
        );
        assert_same_image(&spec.overlay, &theirs);
    }
}

/// QEMU opens a CBT overlay and the guest's writes land in the raw image at their own offsets
/// (data-file-raw), while what the image held before reads through the overlay; a second call
/// keeps the overlay with its contents (as KubeVirt reuses it across restarts).
#[test]
fn cbt_overlay_writes_land_in_the_raw_image_and_the_overlay_is_reused() {
    let scratch = Scratch::new("cbt-io");
    let image = scratch.dir("vmi-disks/data").join("disk.img");
    raw_base(&image, 4 * MIB);
    let cbt = scratch.join("cbt");
    let spec = cbt_spec(&cbt, "data", &image);
    assert_eq!(create_cbt_overlay(&spec).unwrap().0, Outcome::Created);
    let before = std::fs::read(&image).unwrap();
    // What the image held reads through the overlay (cluster 0 untouched: byte 1 is 1 % 251).
    qemu_io(&spec.overlay, "qcow2", "read -P 0x01 1 1");
    qemu_io(&spec.overlay, "qcow2", "write -P 0x5a 65536 65536");
    qemu_io(&spec.overlay, "qcow2", "write -P 0xa5 1000 24");
    let after = std::fs::read(&image).unwrap();
    assert!(after[65536..131072].iter().all(|&b| b == 0x5a));
    assert!(after[1000..1024].iter().all(|&b| b == 0xa5));
    assert_eq!(after[..1000], before[..1000]);
    assert_eq!(after[131072..], before[131072..]);
    assert_qemu_img_check_clean(&spec.overlay);
    let overlay = std::fs::read(&spec.overlay).unwrap();
    assert_eq!(create_cbt_overlay(&spec).unwrap().0, Outcome::Kept);
    assert_eq!(std::fs::read(&spec.overlay).unwrap(), overlay);
}

/// A file at the overlay path that is not a qcow2 over exactly this raw image (another data
/// file, a plain qcow2, a symlink) is refused rather than handed to QEMU, and so is an image
/// that is not raw; nothing is written in either case.
#[test]
fn foreign_cbt_overlays_and_non_raw_images_are_refused() {
    let scratch = Scratch::new("cbt-foreign");
    let image = scratch.dir("vmi-disks/data").join("disk.img");
    raw_base(&image, MIB);
    let other = scratch.join("other.img");
    raw_base(&other, MIB);
    let cbt = scratch.dir("cbt");
    let spec = cbt_spec(&cbt, "data", &image);
    let options = format!("data_file={},data_file_raw=on", other.display());
    run(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-o",
            &options,
            spec.overlay.to_str().unwrap(),
            "1M",
        ],
    );
    let refused = |spec: &CbtOverlaySpec| match create_cbt_overlay(spec) {
        Err(StorageError::MalformedImage { volume, .. }) => assert_eq!(volume, "data"),
        other => panic!("{other:?}"),
    };
    refused(&spec);
    std::fs::remove_file(&spec.overlay).unwrap();
    qemu_img_create(&spec.overlay, "1M", None);
    refused(&spec);
    std::fs::remove_file(&spec.overlay).unwrap();
    std::os::unix::fs::symlink(&other, &spec.overlay).unwrap();
    refused(&spec);
    std::fs::remove_file(&spec.overlay).unwrap();

    let qcow2 = scratch.dir("vmi-disks/q").join("disk.img");
    qemu_img_create(&qcow2, "1M", None);
    let spec = cbt_spec(&cbt, "q", &qcow2);
    assert!(matches!(
        create_cbt_overlay(&spec),
        Err(StorageError::UnsupportedFormat { .. })
    ));
    assert_eq!(std::fs::read_dir(&cbt).unwrap().count(), 0);
}
