//! Disk growth by diff: the resize step of KubeVirt's `syncDisks` (`pkg/virt-launcher/virtwrap/
//! manager.go`, v1.9.0: `shouldExpandOnline`, `possibleGuestSize`, `getUsableDiskSize`), which
//! sends libvirt `BlockResize` when a volume backed by a persistent volume claim grew; libvirt
//! issues QMP `block_resize` on the drive's top node ([`crate::qmp::hotplug::resize_disk`]).
//!
//! Only disks whose volume has `status.volumeStatus[].persistentVolumeClaimInfo` are considered
//! (PVCs, DataVolumes, and the hostDisks KubeVirt makes of filesystem claims), and only when their
//! blockdev chain is a plain raw image (no overlay):
//! - a block claim (`host_device`) grows to the device's size when QEMU's is smaller;
//! - a filesystem claim (`file`) grows to its usable size: `min(capacity, allocated bytes of the
//!   image + free bytes of its filesystem) × (1 − filesystemOverhead)`, aligned down to 1 MiB
//!   (`kutil.AlignImageSizeTo1MiB`), where capacity is `min(capacity.storage, requests.storage)`
//!   (`pkg/storage/types/pvc.go GetDiskCapacity`). The image file is first extended to that size.
//!   Without capacity or overhead nothing is done, as in KubeVirt.
//!
//! At start, [`expand_offline`] extends a filesystem claim's image the same way before QEMU opens
//! it (KubeVirt's `expandDiskImagesOffline`).
//!
//! Disks never shrink: a usable size below QEMU's is logged and left alone. Failures are logged,
//! never returned, as KubeVirt logs a failed `BlockResize` and carries on with the sync.

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde_json::Value;
use tracing::{info, warn};

use crate::cmdline::plan::{Backend, DeviceClass, DomainPlan};
use crate::cmdline::qemu::to_json;
use crate::qmp::QmpClient;
use crate::vmi::status::PersistentVolumeClaimInfo;
use crate::vmi::Vmi;

/// 1 MiB, the alignment of KubeVirt's disk images.
const MIB: u64 = 1 << 20;

/// A drive as QEMU has it (`query-block`): its top node and its virtual size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct QemuDrive {
    node_name: String,
    size: u64,
}

/// How one disk should change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Growth {
    /// QEMU's size is the usable size.
    Unchanged,
    /// The usable size is below QEMU's: left alone (disks never shrink).
    RefusedShrink {
        /// QEMU's size, bytes.
        current: u64,
        /// The usable size, bytes.
        usable: u64,
    },
    /// Grow to this many bytes.
    Grow(u64),
}

/// Compares `usable` with QEMU's `current` size (both bytes).
pub fn growth(current: u64, usable: u64) -> Growth {
    match usable.cmp(&current) {
        std::cmp::Ordering::Greater => Growth::Grow(usable),
        std::cmp::Ordering::Equal => Growth::Unchanged,
        std::cmp::Ordering::Less => Growth::RefusedShrink { current, usable },
    }
}

/// The usable guest size in bytes of a filesystem claim (KubeVirt's `possibleGuestSize`):
/// `min(capacity, room) × (1 − overhead)` aligned down to 1 MiB, `room` being the image's
/// allocated bytes plus the free bytes of its filesystem (`None`: unknown, capacity is used).
///
/// # Errors
/// A reason when `overhead` is not a decimal in `[0, 1]` or the result is under 1 MiB.
pub fn usable_size(capacity: u64, room: Option<u64>, overhead: &str) -> Result<u64, String> {
    let o: f64 = overhead
        .trim()
        .parse()
        .map_err(|_| format!("filesystemOverhead {overhead:?} is not a number"))?;
    if !(0.0..=1.0).contains(&o) {
        return Err(format!(
            "filesystemOverhead {overhead:?} is not between 0 and 1"
        ));
    }
    let preferred = room.map_or(capacity, |r| r.min(capacity));
    // As KubeVirt: float product, truncated toward zero.
    let size = ((1.0 - o) * preferred as f64) as u64;
    let size = size - size % MIB;
    if size == 0 {
        return Err(format!("usable size of {preferred} bytes is under 1 MiB"));
    }
    Ok(size)
}

/// `min(capacity.storage, requests.storage)` of a claim in bytes (`GetDiskCapacity`); `None`
/// when either is missing or unreadable.
fn claim_capacity(info: &PersistentVolumeClaimInfo) -> Option<u64> {
    let get = |m: &Option<BTreeMap<String, crate::vmi::Quantity>>| {
        m.as_ref()?.get("storage")?.to_bytes().ok()
    };
    Some(get(&info.capacity)?.min(get(&info.requests)?))
}

fn pvc_info<'a>(vmi: &'a Vmi, volume: &str) -> Option<&'a PersistentVolumeClaimInfo> {
    vmi.status
        .as_ref()?
        .volume_status
        .as_ref()?
        .iter()
        .find(|v| v.name == volume)?
        .persistent_volume_claim_info
        .as_ref()
}

/// QEMU's drives by device id (`ua-<disk>`), from `query-block`'s `qdev`
/// (`/machine/peripheral/<id>/virtio-backend` or the id itself).
async fn qemu_drives(client: &QmpClient) -> Result<BTreeMap<String, QemuDrive>, String> {
    let list = client
        .run(&crate::qmp::commands::QueryBlock)
        .await
        .map_err(|e| format!("query-block: {e}"))?;
    Ok(parse_query_block(&list))
}

fn parse_query_block(list: &Value) -> BTreeMap<String, QemuDrive> {
    list.as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|b| {
            let qdev = b["qdev"].as_str()?;
            let id = qdev
                .strip_prefix("/machine/peripheral/")
                .map_or(qdev, |rest| rest.split('/').next().unwrap_or(rest));
            let inserted = &b["inserted"];
            let drive = QemuDrive {
                node_name: inserted["node-name"].as_str()?.to_string(),
                size: inserted["image"]["virtual-size"].as_u64()?,
            };
            Some((id.to_string(), drive))
        })
        .collect()
}

/// Size in bytes of the file or block device at `path`.
fn device_size(path: &Path) -> std::io::Result<u64> {
    std::fs::File::open(path)?.seek(SeekFrom::End(0))
}

/// The image's allocated bytes plus its filesystem's free bytes (KubeVirt's `getUsableDiskSize`).
fn room(image: &Path) -> std::io::Result<u64> {
    let allocated = std::fs::metadata(image)?.blocks().saturating_mul(512);
    let fs = nix::sys::statvfs::statvfs(image).map_err(std::io::Error::from)?;
    let free = fs.blocks_available().saturating_mul(fs.fragment_size());
    Ok(allocated.saturating_add(free))
}

/// Extends the file `image` to `size` bytes when it is shorter (sparse), and syncs it.
fn extend_image(image: &Path, size: u64) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new().write(true).open(image)?;
    if file.metadata()?.len() < size {
        file.set_len(size)?;
        file.sync_all()?;
    }
    Ok(())
}

/// What one planned disk is backed by, when it may be resized.
enum Source {
    /// A block device claim.
    Block(String),
    /// A raw image file of a filesystem claim.
    File(String),
}

/// The source of a raw, overlay-free blockdev chain (`file`/`host_device` under an optional
/// `raw` node); `None` otherwise.
fn source(blockdevs: &[Value]) -> Option<Source> {
    let bottom = blockdevs.first()?;
    let rest_raw = blockdevs[1..].iter().all(|b| b["driver"] == "raw");
    if !rest_raw || blockdevs.len() > 2 {
        return None;
    }
    let filename = bottom["filename"].as_str()?.to_string();
    match bottom["driver"].as_str()? {
        "host_device" => Some(Source::Block(filename)),
        "file" => Some(Source::File(filename)),
        _ => None,
    }
}

/// Grows every claim-backed disk of `plan` whose usable size exceeds QEMU's (module doc). Logs
/// what it does and every failure; returns nothing.
pub async fn grow_disks(client: &QmpClient, vmi: &Vmi, plan: &DomainPlan) {
    let mut drives = None;
    for d in &plan.devices {
        let (DeviceClass::Disk, Some(name), Backend::Blockdevs(bs)) =
            (d.class, &d.name, &d.backend)
        else {
            continue;
        };
        let Some(info) = pvc_info(vmi, name) else {
            continue;
        };
        let blockdevs: Vec<Value> = bs.iter().map(to_json).collect();
        let Some(source) = source(&blockdevs) else {
            info!(disk = %name, "not a raw image without overlay: not resized");
            continue;
        };
        if drives.is_none() {
            match qemu_drives(client).await {
                Ok(d) => drives = Some(d),
                Err(e) => {
                    warn!(error = %e, "cannot read the drives' sizes: no disk resized");
                    return;
                }
            }
        }
        let Some(drive) = drives.as_ref().and_then(|m| m.get(d.device.id())) else {
            warn!(disk = %name, device = d.device.id(), "QEMU has no such drive: not resized");
            continue;
        };
        let usable = match &source {
            Source::Block(path) => device_size(Path::new(path)).map_err(|e| format!("{path}: {e}")),
            Source::File(path) => file_usable_size(info, Path::new(path)),
        };
        let usable = match usable {
            Ok(u) => u,
            Err(e) => {
                info!(disk = %name, reason = %e, "no usable size: not resized");
                continue;
            }
        };
        match growth(drive.size, usable) {
            Growth::Unchanged => {}
            Growth::RefusedShrink { current, usable } => {
                info!(disk = %name, current, usable, "usable size below QEMU's: disks never shrink");
            }
            Growth::Grow(size) => {
                if let Source::File(path) = &source {
                    if let Err(e) = extend_image(Path::new(path), size) {
                        warn!(disk = %name, image = %path, error = %e, "cannot extend the image");
                        continue;
                    }
                }
                match crate::qmp::hotplug::resize_disk(client, &drive.node_name, size).await {
                    Ok(()) => info!(disk = %name, from = drive.size, to = size, "disk grown"),
                    Err(e) => warn!(disk = %name, size, error = %e, "block_resize failed"),
                }
            }
        }
    }
}

/// Offline expansion at start (KubeVirt's `expandDiskImagesOffline`, `manager.go` preStartHook):
/// the raw `image` of the filesystem claim `volume`, `size` bytes long, is extended to its usable
/// size when that is larger (sparse, as `qemu-img resize --preallocation=off`). Returns the
/// image's size afterwards; failures and missing claim facts are logged and leave it as it was.
pub fn expand_offline(vmi: &Vmi, volume: &str, image: &Path, size: u64) -> u64 {
    let Some(info) = pvc_info(vmi, volume) else {
        return size;
    };
    match file_usable_size(info, image) {
        Ok(usable) if usable > size => match extend_image(image, usable) {
            Ok(()) => {
                info!(
                    volume,
                    from = size,
                    to = usable,
                    "image expanded before start"
                );
                usable
            }
            Err(e) => {
                warn!(volume, image = %image.display(), error = %e, "cannot expand the image");
                size
            }
        },
        _ => size,
    }
}

/// The usable size of the image at `path` of a filesystem claim described by `info`.
fn file_usable_size(info: &PersistentVolumeClaimInfo, path: &Path) -> Result<u64, String> {
    let capacity =
        claim_capacity(info).ok_or("no capacity and request of storage in the claim info")?;
    let overhead = info
        .filesystem_overhead
        .as_deref()
        .ok_or("no filesystemOverhead in the claim info")?;
    let room = match room(path) {
        Ok(r) => Some(r),
        Err(e) => {
            warn!(image = %path.display(), error = %e, "free space unknown: using the capacity");
            None
        }
    };
    usable_size(capacity, room, overhead)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn usable_size_takes_off_the_overhead_and_aligns_down() {
        // 128 MiB × 0.945 = 120.96 MiB → 120 MiB.
        assert_eq!(usable_size(128 * MIB, None, "0.055"), Ok(120 * MIB));
        assert_eq!(usable_size(128 * MIB, Some(1 << 40), "0"), Ok(128 * MIB));
        // Less room on the filesystem than the claim's capacity.
        assert_eq!(
            usable_size(128 * MIB, Some(10 * MIB + 5), "0"),
            Ok(10 * MIB)
        );
        assert_eq!(
            usable_size(MIB, None, "0.5"),
            Err("usable size of 1048576 bytes is under 1 MiB".into())
        );
        assert_eq!(
            usable_size(MIB, None, "1.5"),
            Err("filesystemOverhead \"1.5\" is not between 0 and 1".into())
        );
        assert_eq!(
            usable_size(MIB, None, "x"),
            Err("filesystemOverhead \"x\" is not a number".into())
        );
    }

    #[test]
    fn offline_expansion_grows_a_short_image_only() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::write(&image, []).unwrap();
        extend_image(&image, 8 * MIB).unwrap();
        let vmi = |capacity: &str| {
            let json = json!({
                "metadata": {"name": "v", "namespace": "default"},
                "spec": {"domain": {"devices": {}}},
                "status": {"volumeStatus": [{"name": "data", "target": "",
                    "persistentVolumeClaimInfo": {"capacity": {"storage": capacity},
                        "requests": {"storage": capacity}, "filesystemOverhead": "0.055"}}]},
            });
            Vmi::from_json_or_yaml(&json.to_string()).unwrap()
        };
        // 16 MiB × 0.945 = 15.12 MiB → 15 MiB.
        assert_eq!(
            expand_offline(&vmi("16Mi"), "data", &image, 8 * MIB),
            15 * MIB
        );
        assert_eq!(std::fs::metadata(&image).unwrap().len(), 15 * MIB);
        // Smaller claim, or another volume: untouched.
        assert_eq!(
            expand_offline(&vmi("8Mi"), "data", &image, 15 * MIB),
            15 * MIB
        );
        assert_eq!(
            expand_offline(&vmi("64Mi"), "other", &image, 15 * MIB),
            15 * MIB
        );
        assert_eq!(std::fs::metadata(&image).unwrap().len(), 15 * MIB);
    }

    #[test]
    fn disks_only_grow() {
        assert_eq!(growth(64 * MIB, 120 * MIB), Growth::Grow(120 * MIB));
        assert_eq!(growth(64 * MIB, 64 * MIB), Growth::Unchanged);
        assert_eq!(
            growth(64 * MIB, 60 * MIB),
            Growth::RefusedShrink {
                current: 64 * MIB,
                usable: 60 * MIB
            }
        );
    }

    #[test]
    fn capacity_is_the_smaller_of_capacity_and_request() {
        let info: PersistentVolumeClaimInfo = serde_json::from_value(json!({
            "capacity": {"storage": "2Gi"}, "requests": {"storage": "1Gi"}}))
        .unwrap();
        assert_eq!(claim_capacity(&info), Some(1 << 30));
        let info: PersistentVolumeClaimInfo =
            serde_json::from_value(json!({"capacity": {"storage": "2Gi"}})).unwrap();
        assert_eq!(claim_capacity(&info), None);
    }

    #[test]
    fn query_block_drives_by_device_id() {
        let list = json!([
            {"device": "", "qdev": "/machine/peripheral/ua-data/virtio-backend",
             "inserted": {"node-name": "libvirt-2-format", "image": {"virtual-size": 67108864}}},
            {"device": "", "qdev": "ua-cd", "inserted": {"node-name": "libvirt-3-format",
             "image": {"virtual-size": 4096}}},
            {"device": "", "qdev": "ua-empty"}
        ]);
        let drives = parse_query_block(&list);
        assert_eq!(
            drives.into_iter().collect::<Vec<_>>(),
            vec![
                (
                    "ua-cd".to_string(),
                    QemuDrive {
                        node_name: "libvirt-3-format".into(),
                        size: 4096
                    }
                ),
                (
                    "ua-data".to_string(),
                    QemuDrive {
                        node_name: "libvirt-2-format".into(),
                        size: 64 << 20
                    }
                ),
            ]
        );
    }

    #[test]
    fn only_raw_chains_without_overlay_are_resized() {
        let file = json!({"driver": "file", "filename": "/d/disk.img", "node-name": "a"});
        let raw = json!({"driver": "raw", "file": "a", "node-name": "b"});
        let qcow2 = json!({"driver": "qcow2", "file": "a", "node-name": "b"});
        assert!(
            matches!(source(&[file.clone(), raw]), Some(Source::File(p)) if p == "/d/disk.img")
        );
        assert!(source(&[file.clone(), qcow2]).is_none());
        let dev = json!({"driver": "host_device", "filename": "/dev/data", "node-name": "a"});
        assert!(matches!(source(&[dev]), Some(Source::Block(p)) if p == "/dev/data"));
        assert!(source(&[]).is_none());
    }
}
