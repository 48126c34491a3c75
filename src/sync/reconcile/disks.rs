//! Hot-pluggable disks by diff: KubeVirt's `hotPlugHostDevices` / `syncDisks` attach and detach
//! steps (`manager.go`, v1.9.0) over QMP: a disk that appeared in the plan is attached
//! (`blockdev-add` of its nodes, `device_add`), one that disappeared is detached (`device_del`,
//! `DEVICE_DELETED`, `blockdev-del`).
//!
//! libvirt numbers block nodes (`libvirt-<N>-storage`, `libvirt-<N>-format`) per domain and never
//! reuses an index; the converter numbers them per plan, so hot-plugged nodes are renumbered from
//! the running domain's next free index.

use std::collections::BTreeMap;

use tracing::info;

use crate::cmdline::plan::{Backend, DomainPlan, FirmwarePlan};
use crate::cmdline::qemu::node_index;
use crate::cmdline::render;
use crate::qmp::client::QmpClient;
use crate::sync::config::HOTPLUG_TIMEOUT;
use crate::sync::error::SyncError;
use crate::sync::state::Running;

/// One step of the disk diff.
#[derive(Debug, Clone, PartialEq)]
pub enum DiskStep {
    /// Detach the running disk with this device id (`device_del`, `DEVICE_DELETED`,
    /// `blockdev-del` of these node names, top first).
    Detach {
        /// Device id (`ua-<name>`).
        id: String,
        /// Its block nodes, top node first.
        node_names: Vec<String>,
    },
    /// Attach this disk of the new plan (nodes renumbered by the executor).
    Attach(Box<render::DiskHotplug>),
}

/// The disk diff: detach every running disk `wanted` (the new QMP plan's disks) lacks, in device
/// id order, then attach every disk of `wanted` that does not run, in device id order. Pure.
pub fn diff(
    running: &BTreeMap<String, render::DiskHotplug>,
    wanted: &[render::DiskHotplug],
) -> Vec<DiskStep> {
    let wanted: BTreeMap<&str, &render::DiskHotplug> =
        wanted.iter().map(|d| (d.id.as_str(), d)).collect();
    let mut steps: Vec<DiskStep> = running
        .iter()
        .filter(|(id, _)| !wanted.contains_key(id.as_str()))
        .map(|(id, d)| DiskStep::Detach {
            id: id.clone(),
            node_names: d.node_names_top_first(),
        })
        .collect();
    steps.extend(
        wanted
            .into_iter()
            .filter(|(id, _)| !running.contains_key(*id))
            .map(|(_, d)| DiskStep::Attach(Box::new(d.clone()))),
    );
    steps
}

/// Runs the [`diff`] of `running` against `wanted`: each detached disk leaves `running.disks`,
/// each attached one joins it with fresh node indices, on a free PCIe root port when its plan
/// put it on one.
pub(crate) async fn apply(
    client: &QmpClient,
    running: &mut Running,
    wanted: &[render::DiskHotplug],
) -> Result<(), SyncError> {
    for step in diff(&running.disks, wanted) {
        match step {
            DiskStep::Detach { id, node_names } => {
                let detach = crate::qmp::hotplug::DiskDetach {
                    device_id: id.clone(),
                    node_names,
                };
                crate::qmp::hotplug::detach_disk(client, &detach, HOTPLUG_TIMEOUT)
                    .await
                    .map_err(SyncError::Qmp)?;
                info!(device = %id, "disk detached");
                if let Some(gone) = running.disks.remove(&id) {
                    remove_cbt_overlays(&gone);
                }
            }
            DiskStep::Attach(d) => {
                let id = d.id.clone();
                let mut d = d.renumbered(&mut running.next_node);
                // The re-plan may place the disk on a port in use; take a free root port instead.
                if d.device.on_root_port() {
                    let ports = crate::qmp::hotplug::free_root_ports(client)
                        .await
                        .map_err(SyncError::Qmp)?;
                    let port = ports.first().ok_or_else(|| {
                        SyncError::Unsupported(format!("hotplug of {id}: no free PCIe root port"))
                    })?;
                    d.device.place_on_root_port(port);
                }
                let attach = crate::qmp::hotplug::DiskAttach {
                    blockdevs: d.blockdevs.clone(),
                    device: d.device.clone(),
                };
                crate::qmp::hotplug::attach_disk(client, &attach)
                    .await
                    .map_err(SyncError::Qmp)?;
                info!(device = %id, "disk attached");
                running.disks.insert(id, d);
            }
        }
    }
    Ok(())
}

/// The CBT overlays of a detached disk: the files of the qcow2 nodes that have a raw data file
/// (only qlauncher's own CBT overlays do), removed as KubeVirt's `DeleteQCOW2Overlay` does on
/// unplug (`manager.go:1507`); the data file (the volume) is left alone. A failure is logged,
/// not returned: the disk is already gone from the guest.
pub(crate) fn remove_cbt_overlays(disk: &render::DiskHotplug) {
    use crate::cmdline::qemu::Blockdev;
    for node in &disk.blockdevs {
        let Blockdev::Format(f) = node else { continue };
        if f.data_file.is_none() {
            continue;
        }
        let overlay = disk.blockdevs.iter().find_map(|b| match b {
            Blockdev::Protocol(p) if p.node_name == f.file => Some(&p.filename),
            _ => None,
        });
        if let Some(path) = overlay {
            match std::fs::remove_file(path) {
                Ok(()) => info!(device = %disk.id, overlay = %path, "CBT overlay removed"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(device = %disk.id, overlay = %path, error = %e, "CBT overlay not removed")
                }
            }
        }
    }
}

/// The first block node index no node of `plan` uses: one more than the highest `N` of its
/// `libvirt-N-*` node names (disk and cdrom chains; the firmware's `libvirt-pflash*` nodes carry
/// none), 1 for a plan without disks.
pub(crate) fn next_node_index(plan: &DomainPlan) -> u32 {
    let devices = plan.devices.iter().filter_map(|d| match &d.backend {
        Backend::Blockdevs(b) => Some(b.as_slice()),
        _ => None,
    });
    let firmware = match &plan.firmware {
        FirmwarePlan::Efi { blockdevs, .. } => Some(blockdevs.as_slice()),
        _ => None,
    };
    devices
        .chain(firmware)
        .flatten()
        .filter_map(|b| node_index(b.node_name()))
        .max()
        .map_or(1, |n| n + 1)
}

/// Test fixtures for hot-plugged disks, shared by the unit tests of the reconciler, the migration's
/// hotplug placement and the QMP device commands.
#[cfg(test)]
pub(crate) mod fixtures {
    use crate::cmdline::qemu::{
        BackingNode, Blockdev, BlockdevDel, BlockdevFormat, BlockdevProtocol, Device, DeviceDel,
        DeviceVirtioBlk, FormatDriver, ProtocolDriver,
    };
    use crate::cmdline::render::{DiskHotplug, PlacedDevice};

    /// A `virtio-blk-pci-non-transitional` device `id` on node `drive`, at `bus` slot `0x0`.
    pub(crate) fn virtio_blk(
        drive: &str,
        id: &str,
        serial: Option<String>,
        bus: &str,
    ) -> PlacedDevice {
        PlacedDevice {
            device: Device::VirtioBlk(DeviceVirtioBlk {
                driver: "virtio-blk-pci-non-transitional",
                share_rw: None,
                drive: drive.into(),
                id: id.into(),
                bootindex: None,
                write_cache: None,
                werror: None,
                rerror: None,
                serial,
                iothread: None,
                num_queues: None,
                logical_block_size: None,
                physical_block_size: None,
                discard_granularity: None,
            }),
            iommu_platform: None,
            bus: Some(bus.into()),
            addr: Some("0x0".into()),
        }
    }

    /// A hot-pluggable raw virtio disk `name` (id `ua-<name>`, no target) backed by the file
    /// `image`, on nodes `libvirt-<n>-storage` / `libvirt-<n>-format`, placed on `bus`.
    pub(crate) fn hotplug_disk(
        name: &str,
        n: u32,
        image: String,
        serial: Option<String>,
        bus: &str,
    ) -> DiskHotplug {
        let storage = format!("libvirt-{n}-storage");
        let format = format!("libvirt-{n}-format");
        DiskHotplug {
            name: name.into(),
            id: format!("ua-{name}"),
            target: None,
            blockdevs: vec![
                Blockdev::Protocol(BlockdevProtocol {
                    driver: ProtocolDriver::File,
                    filename: image,
                    node_name: storage.clone(),
                    aio: None,
                    cache: None,
                    auto_read_only: true,
                    discard: None,
                }),
                Blockdev::Format(BlockdevFormat {
                    detect_zeroes: None,
                    node_name: format.clone(),
                    read_only: false,
                    discard: None,
                    cache: None,
                    driver: FormatDriver::Raw,
                    file: storage.clone(),
                    data_file: None,
                    backing: BackingNode::Absent,
                }),
            ],
            device: virtio_blk(&format, &format!("ua-{name}"), serial, bus),
            device_del: DeviceDel {
                id: format!("ua-{name}"),
            },
            blockdev_del: vec![
                BlockdevDel { node_name: format },
                BlockdevDel { node_name: storage },
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::qemu::Device;

    /// A hot-plugged PVC of a CBT VMI whose overlay was made at mount time runs through
    /// `<private>/libvirt/qemu/cbt/<volume>.qcow2` over the mounted `<hotplug-disks>/<volume>.img`
    /// (the data file's protocol node added first); one without the overlay keeps its plain
    /// chain. At unplug the overlay file is removed and the volume's image is left.
    #[test]
    fn a_hotplugged_cbt_volume_runs_through_its_overlay_which_unplug_removes() {
        let dir = std::env::temp_dir().join(format!("qlauncher-cbt-hp-{}", std::process::id()));
        let vmi: crate::vmi::Vmi = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "t", "namespace": "ns", "uid": "u"},
            "spec": {"domain": {"memory": {"guest": "256Mi"}, "devices": {"disks": [
                        {"name": "root", "disk": {}}, {"name": "hp", "disk": {"bus": "scsi"}}]}},
                     "volumes": [{"name": "root", "containerDisk": {"image": "i"}},
                        {"name": "hp", "persistentVolumeClaim": {"claimName": "c", "hotpluggable": true}}]},
            "status": {"changedBlockTracking": {"state": "Enabled"},
                "volumeStatus": [{"name": "hp", "target": "", "phase": "MountedToPod", "hotplugVolume": {}}]}
        }))
        .unwrap();
        let mut ctx = crate::cmdline::ConverterContext::default();
        ctx.paths.private_dir = dir.join("private").display().to_string();
        ctx.paths.hotplug_disks = dir.join("hotplug").display().to_string();
        let hp_disk = |ctx: &crate::cmdline::ConverterContext| {
            let plan = crate::cmdline::convert(&vmi, ctx).unwrap();
            let qmp = render::qmp_plan(&plan);
            qmp.disks.into_iter().find(|d| d.name == "hp").unwrap()
        };
        let plain = hp_disk(&ctx);
        assert_eq!(plain.blockdevs.len(), 2, "{:?}", plain.blockdevs);
        ctx.volumes.insert(
            "hp".into(),
            crate::cmdline::context::VolumeFacts {
                cbt_overlay: true,
                ..Default::default()
            },
        );
        let disk = hp_disk(&ctx);
        let nodes = serde_json::to_value(&disk.blockdevs).unwrap();
        let image = dir.join("hotplug/hp.img");
        let overlay = dir.join("private/libvirt/qemu/cbt/hp.qcow2");
        assert_eq!(nodes[0]["filename"], image.display().to_string(), "{nodes}");
        assert_eq!(
            nodes[1]["filename"],
            overlay.display().to_string(),
            "{nodes}"
        );
        assert_eq!(nodes[2]["data-file"], nodes[0]["node-name"], "{nodes}");
        assert_eq!(nodes[2]["file"], nodes[1]["node-name"], "{nodes}");
        assert_eq!(disk.blockdev_del.len(), 3, "{:?}", disk.blockdev_del);

        std::fs::create_dir_all(overlay.parent().unwrap()).unwrap();
        std::fs::create_dir_all(image.parent().unwrap()).unwrap();
        std::fs::write(&overlay, b"o").unwrap();
        std::fs::write(&image, b"i").unwrap();
        remove_cbt_overlays(&plain);
        assert!(overlay.exists());
        remove_cbt_overlays(&disk);
        assert!(!overlay.exists());
        assert!(image.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A hot-pluggable virtio disk `name` on nodes `libvirt-<n>-storage` / `-format`.
    fn disk_on(name: &str, n: u32) -> render::DiskHotplug {
        fixtures::hotplug_disk(
            name,
            n,
            format!("/d/{name}.img"),
            Some(format!("libvirt-{n}-serial")),
            "pci.5",
        )
    }

    fn disk(name: &str) -> render::DiskHotplug {
        disk_on(name, 1)
    }

    #[test]
    fn a_plan_without_disks_starts_nodes_at_one() {
        assert_eq!(next_node_index(&DomainPlan::default()), 1);
    }

    #[test]
    fn disk_diff_detaches_then_attaches() {
        let running = |names: &[&str]| -> BTreeMap<String, render::DiskHotplug> {
            names.iter().map(|n| (format!("ua-{n}"), disk(n))).collect()
        };
        let detach = |n: &str| DiskStep::Detach {
            id: format!("ua-{n}"),
            node_names: vec!["libvirt-1-format".into(), "libvirt-1-storage".into()],
        };
        let attach = |n: &str| DiskStep::Attach(Box::new(disk(n)));
        let cases: Vec<(&[&str], Vec<render::DiskHotplug>, Vec<DiskStep>)> = vec![
            (&[], vec![], vec![]),
            (&["a"], vec![disk("a")], vec![]),
            (
                &[],
                vec![disk("b"), disk("a")],
                vec![attach("a"), attach("b")],
            ),
            (&["a", "b"], vec![], vec![detach("a"), detach("b")]),
            (&["a"], vec![disk("b")], vec![detach("a"), attach("b")]),
        ];
        for (run, wanted, steps) in cases {
            assert_eq!(diff(&running(run), &wanted), steps, "{run:?}");
        }
    }

    #[test]
    fn hotplugged_disk_nodes_get_fresh_indices() {
        let mut next = 4;
        let d = disk_on("hp1", 1).renumbered(&mut next);
        assert_eq!(next, 5);
        let mut want = disk_on("hp1", 4);
        // Only node names are renumbered: the serial is the user's.
        if let Device::VirtioBlk(b) = &mut want.device.device {
            b.serial = Some("libvirt-1-serial".into());
        }
        assert_eq!(d, want);
        assert_eq!(d.node_indices().into_iter().collect::<Vec<_>>(), vec![4]);
    }
}
