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
                running.disks.remove(&id);
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
