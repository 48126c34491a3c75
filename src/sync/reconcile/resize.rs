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

use tracing::{info, warn};

use crate::cmdline::plan::{Backend, DeviceClass, DomainPlan};
use crate::cmdline::qemu::{Blockdev, FormatDriver, ProtocolDriver};
use crate::qmp::commands::BlockInfo;
use crate::qmp::QmpClient;
use crate::vmi::status::PersistentVolumeClaimInfo;
use crate::vmi::Vmi;

/// 1 MiB, the alignment of KubeVirt's disk images.
const MIB: u64 = 1 << 20;

/// A drive as QEMU has it (`query-block`): its top node and its virtual size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuDrive {
    /// The top node.
    pub node_name: String,
    /// Virtual size, bytes.
    pub size: u64,
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

fn parse_query_block(list: &[BlockInfo]) -> BTreeMap<String, QemuDrive> {
    list.iter()
        .filter_map(|b| {
            let qdev = b.qdev.as_deref()?;
            let id = qdev
                .strip_prefix("/machine/peripheral/")
                .map_or(qdev, |rest| rest.split('/').next().unwrap_or(rest));
            let inserted = b.inserted.as_ref()?;
            let drive = QemuDrive {
                node_name: inserted.node_name.clone()?,
                size: inserted.image.as_ref()?.virtual_size?,
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A block device claim.
    Block(String),
    /// A raw image file of a filesystem claim.
    File(String),
}

/// The source of a raw, overlay-free blockdev chain (`file`/`host_device` under an optional
/// `raw` node); `None` otherwise.
fn source(blockdevs: &[Blockdev]) -> Option<Source> {
    let (Blockdev::Protocol(bottom), rest) = blockdevs.split_first()? else {
        return None;
    };
    let rest_raw = rest
        .iter()
        .all(|b| matches!(b, Blockdev::Format(f) if f.driver == FormatDriver::Raw));
    if !rest_raw || rest.len() > 1 {
        return None;
    }
    let filename = bottom.filename.clone();
    Some(match bottom.driver {
        ProtocolDriver::HostDevice => Source::Block(filename),
        ProtocolDriver::File => Source::File(filename),
    })
}

/// A claim-backed disk of the plan and the size it may have: the facts the diff needs, read from
/// the pod (the device's size, the image's filesystem).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimDisk {
    /// Disk name in the VMI.
    pub disk: String,
    /// Device id (`ua-<name>`).
    pub device_id: String,
    /// What backs it.
    pub source: Source,
    /// Its usable size in bytes, or why it has none.
    pub usable: Result<u64, String>,
}

/// Why the resize diff leaves a disk as it is (logged by the executor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leave {
    /// QEMU has no drive with the disk's device id.
    NoDrive,
    /// The usable size is unknown.
    NoUsableSize(String),
    /// The usable size is below QEMU's: disks never shrink.
    Shrink {
        /// QEMU's size, bytes.
        current: u64,
        /// The usable size, bytes.
        usable: u64,
    },
}

/// One step of the resize diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResizeStep {
    /// Grow the disk: extend the image file first (filesystem claims), then `block_resize`.
    Grow {
        /// Disk name.
        disk: String,
        /// The drive's top node.
        node_name: String,
        /// QEMU's size, bytes.
        from: u64,
        /// The new size, bytes.
        to: u64,
        /// The image file to extend to `to` first (`None`: a block device).
        image: Option<String>,
    },
    /// Leave the disk alone.
    Leave {
        /// Disk name.
        disk: String,
        /// Why.
        why: Leave,
    },
}

/// The resize diff of QEMU's drives (`running`, by device id) against the claim-backed disks of
/// the plan and their usable sizes (`wanted`), in `wanted` order; a disk already at its usable
/// size gives no step. Pure.
pub fn diff(running: &BTreeMap<String, QemuDrive>, wanted: &[ClaimDisk]) -> Vec<ResizeStep> {
    wanted
        .iter()
        .filter_map(|c| {
            let leave = |why| {
                Some(ResizeStep::Leave {
                    disk: c.disk.clone(),
                    why,
                })
            };
            let Some(drive) = running.get(&c.device_id) else {
                return leave(Leave::NoDrive);
            };
            let usable = match &c.usable {
                Ok(u) => *u,
                Err(e) => return leave(Leave::NoUsableSize(e.clone())),
            };
            match growth(drive.size, usable) {
                Growth::Unchanged => None,
                Growth::RefusedShrink { current, usable } => {
                    leave(Leave::Shrink { current, usable })
                }
                Growth::Grow(to) => Some(ResizeStep::Grow {
                    disk: c.disk.clone(),
                    node_name: drive.node_name.clone(),
                    from: drive.size,
                    to,
                    image: match &c.source {
                        Source::File(path) => Some(path.clone()),
                        Source::Block(_) => None,
                    },
                }),
            }
        })
        .collect()
}

/// The claim-backed disks of `plan` with a raw, overlay-free chain, and their usable sizes
/// (module doc): reads each block device's size or each image's filesystem.
fn claim_disks(vmi: &Vmi, plan: &DomainPlan) -> Vec<ClaimDisk> {
    let mut out = Vec::new();
    for d in &plan.devices {
        let (DeviceClass::Disk, Some(name), Backend::Blockdevs(bs)) =
            (d.class, &d.name, &d.backend)
        else {
            continue;
        };
        let Some(info) = pvc_info(vmi, name) else {
            continue;
        };
        let Some(source) = source(bs) else {
            info!(disk = %name, "not a raw image without overlay: not resized");
            continue;
        };
        let usable = match &source {
            Source::Block(path) => device_size(Path::new(path)).map_err(|e| format!("{path}: {e}")),
            Source::File(path) => file_usable_size(info, Path::new(path)),
        };
        out.push(ClaimDisk {
            disk: name.clone(),
            device_id: d.device.id().to_string(),
            source,
            usable,
        });
    }
    out
}

/// Grows every claim-backed disk of `plan` whose usable size exceeds QEMU's (module doc): the
/// [`diff`] of QEMU's drives against the plan's claim disks, run. Logs what it does and every
/// failure; returns nothing.
pub async fn grow_disks(client: &QmpClient, vmi: &Vmi, plan: &DomainPlan) {
    let wanted = claim_disks(vmi, plan);
    if wanted.is_empty() {
        return;
    }
    let drives = match qemu_drives(client).await {
        Ok(d) => d,
        Err(e) => {
            warn!(error = %e, "cannot read the drives' sizes: no disk resized");
            return;
        }
    };
    for step in diff(&drives, &wanted) {
        match step {
            ResizeStep::Leave { disk, why } => match why {
                Leave::NoDrive => warn!(disk = %disk, "QEMU has no such drive: not resized"),
                Leave::NoUsableSize(reason) => {
                    info!(disk = %disk, reason = %reason, "no usable size: not resized");
                }
                Leave::Shrink { current, usable } => {
                    info!(disk = %disk, current, usable, "usable size below QEMU's: disks never shrink");
                }
            },
            ResizeStep::Grow {
                disk,
                node_name,
                from,
                to,
                image,
            } => {
                if let Some(path) = &image {
                    if let Err(e) = extend_image(Path::new(path), to) {
                        warn!(disk = %disk, image = %path, error = %e, "cannot extend the image");
                        continue;
                    }
                }
                match crate::qmp::hotplug::resize_disk(client, &node_name, to).await {
                    Ok(()) => info!(disk = %disk, from, to, "disk grown"),
                    Err(e) => warn!(disk = %disk, size = to, error = %e, "block_resize failed"),
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
        let list: Vec<BlockInfo> = serde_json::from_value(json!([
            {"device": "", "qdev": "/machine/peripheral/ua-data/virtio-backend",
             "inserted": {"node-name": "libvirt-2-format", "image": {"virtual-size": 67108864}}},
            {"device": "", "qdev": "ua-cd", "inserted": {"node-name": "libvirt-3-format",
             "image": {"virtual-size": 4096}}},
            {"device": "", "qdev": "ua-empty"}
        ]))
        .unwrap();
        let drives = parse_query_block(&list);
        assert_eq!(
            drives.into_iter().collect::<Vec<_>>(),
            vec![
                ("ua-cd".to_string(), drive("libvirt-3-format", 4096)),
                ("ua-data".to_string(), drive("libvirt-2-format", 64 << 20)),
            ]
        );
    }

    fn drive(node_name: &str, size: u64) -> QemuDrive {
        QemuDrive {
            node_name: node_name.into(),
            size,
        }
    }

    fn protocol(driver: ProtocolDriver, filename: &str) -> Blockdev {
        Blockdev::Protocol(crate::cmdline::qemu::BlockdevProtocol {
            driver,
            filename: filename.into(),
            node_name: "a".into(),
            aio: None,
            cache: None,
            auto_read_only: true,
            discard: None,
        })
    }

    fn format(driver: FormatDriver) -> Blockdev {
        Blockdev::Format(crate::cmdline::qemu::BlockdevFormat {
            detect_zeroes: None,
            node_name: "b".into(),
            read_only: false,
            discard: None,
            cache: None,
            driver,
            file: "a".into(),
            data_file: None,
            backing: crate::cmdline::qemu::BackingNode::Absent,
        })
    }

    #[test]
    fn only_raw_chains_without_overlay_are_resized() {
        let file = protocol(ProtocolDriver::File, "/d/disk.img");
        let dev = protocol(ProtocolDriver::HostDevice, "/dev/data");
        let cases = [
            (
                vec![file.clone(), format(FormatDriver::Raw)],
                Some(Source::File("/d/disk.img".into())),
            ),
            (vec![file.clone(), format(FormatDriver::Qcow2)], None),
            (
                vec![
                    file.clone(),
                    format(FormatDriver::Raw),
                    format(FormatDriver::Raw),
                ],
                None,
            ),
            (vec![dev], Some(Source::Block("/dev/data".into()))),
            (vec![format(FormatDriver::Raw)], None),
            (vec![], None),
        ];
        for (chain, want) in cases {
            assert_eq!(source(&chain), want, "{chain:?}");
        }
    }

    #[test]
    fn resize_diff_grows_only_what_qemu_has_smaller() {
        let claim = |disk: &str, source: Source, usable: Result<u64, String>| ClaimDisk {
            disk: disk.into(),
            device_id: format!("ua-{disk}"),
            source,
            usable,
        };
        let file = || Source::File("/d/disk.img".into());
        let block = || Source::Block("/dev/data".into());
        let running: BTreeMap<String, QemuDrive> = [
            ("ua-data".to_string(), drive("libvirt-2-format", 64 * MIB)),
            ("ua-blk".to_string(), drive("libvirt-3-storage", 64 * MIB)),
        ]
        .into_iter()
        .collect();
        let leave = |disk: &str, why| ResizeStep::Leave {
            disk: disk.into(),
            why,
        };
        let cases = [
            // A filesystem claim grown: the image is extended, then the node resized.
            (
                vec![claim("data", file(), Ok(120 * MIB))],
                vec![ResizeStep::Grow {
                    disk: "data".into(),
                    node_name: "libvirt-2-format".into(),
                    from: 64 * MIB,
                    to: 120 * MIB,
                    image: Some("/d/disk.img".into()),
                }],
            ),
            // A block claim grown: only the node.
            (
                vec![claim("blk", block(), Ok(128 * MIB))],
                vec![ResizeStep::Grow {
                    disk: "blk".into(),
                    node_name: "libvirt-3-storage".into(),
                    from: 64 * MIB,
                    to: 128 * MIB,
                    image: None,
                }],
            ),
            // Already at its size: nothing.
            (vec![claim("data", file(), Ok(64 * MIB))], vec![]),
            // Smaller, unknown, or not in QEMU: left alone.
            (
                vec![
                    claim("data", file(), Ok(60 * MIB)),
                    claim("blk", block(), Err("no capacity".into())),
                    claim("gone", file(), Ok(MIB)),
                ],
                vec![
                    leave(
                        "data",
                        Leave::Shrink {
                            current: 64 * MIB,
                            usable: 60 * MIB,
                        },
                    ),
                    leave("blk", Leave::NoUsableSize("no capacity".into())),
                    leave("gone", Leave::NoDrive),
                ],
            ),
        ];
        for (wanted, steps) in cases {
            assert_eq!(diff(&running, &wanted), steps, "{wanted:?}");
        }
    }
}
