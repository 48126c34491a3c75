//! `qmp_plan(&DomainPlan)`: for every hot-pluggable disk and NIC, the QMP arguments that add
//! it and remove it, in libvirt's order (`qemuhotplugtest.c`, `qemu_hotplug.c`):
//! disk: `blockdev-add` (bottom node first) + `device_add`; removal: `device_del`, wait for
//! `DEVICE_DELETED`, then `blockdev-del` top node first.
//! NIC: `getfd` (one per fd name, the fd travels as SCM_RIGHTS) + `netdev_add` + `device_add`;
//! removal: `device_del`, `DEVICE_DELETED`, `netdev_del`.
//!
//! Every argument is a typed QEMU argument struct ([`crate::cmdline::qemu`]); the QMP client
//! serialises them. The plan serialises to the same JSON objects (`qlauncher convert
//! --format qmp`).

use std::collections::BTreeSet;

use crate::cmdline::plan::{Backend, DeviceClass, DomainPlan, PlannedDevice};
use crate::cmdline::qemu::{
    node_index, renamed_node, renumber_nodes, BlockSetIoThrottle, Blockdev, BlockdevDel, Device,
    DeviceDel, GetFd, NetdevDel, NetdevTap, QomSet, SetLink,
};
use serde::Serialize;

/// A device as `device_add` (and `-device`) takes it: the device struct with `iommu_platform`
/// (SEV guests) and the PCI address the PCI pass assigned (`bus`, `addr`) merged in.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlacedDevice {
    /// The device's own properties.
    #[serde(flatten)]
    pub device: Device,
    /// `iommu_platform=on` (SEV guests).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iommu_platform: Option<bool>,
    /// The PCI bus (`pcie.0`, a root port `pci.<n>`), when the PCI pass placed the device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    /// The slot and function on that bus (`0x0`, `0x1.0x2`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
}

impl PlacedDevice {
    /// The planned device `d` with its address.
    pub fn of(d: &PlannedDevice) -> PlacedDevice {
        PlacedDevice {
            device: d.device.clone(),
            iommu_platform: d.iommu_platform.then_some(true),
            bus: d.address.as_ref().map(|a| a.bus.clone()),
            addr: d.address.as_ref().map(|a| a.addr.clone()),
        }
    }

    /// The device id.
    pub fn id(&self) -> &str {
        self.device.id()
    }

    /// The bus the device goes on: the PCI bus of its address, else a disk frontend's own bus
    /// (`scsi0.0`, `ide.2`).
    pub fn bus(&self) -> Option<&str> {
        self.bus.as_deref().or(match &self.device {
            Device::DiskFrontend(f) => Some(f.bus.as_str()),
            _ => None,
        })
    }

    /// True when the plan put the device on a PCIe root port (`pci.<n>`).
    pub fn on_root_port(&self) -> bool {
        self.bus().is_some_and(|b| b.starts_with("pci."))
    }

    /// Moves the device to slot 0 of the root port `port` (a hot-plug into a free port).
    pub fn place_on_root_port(&mut self, port: &str) {
        self.bus = Some(port.to_string());
        self.addr = Some("0x0".to_string());
    }
}

/// QMP arguments to hot-plug and unplug one disk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiskHotplug {
    /// Disk name in the VMI.
    pub name: String,
    /// Device id (`ua-<name>`), the `device_del` argument and the `DEVICE_DELETED` id.
    pub id: String,
    /// Guest target name (`vdb`, `sdc`), for `status.volumeStatus[].target`.
    pub target: Option<String>,
    /// `blockdev-add` arguments, bottom node first.
    pub blockdevs: Vec<Blockdev>,
    /// `device_add` arguments.
    pub device: PlacedDevice,
    /// `device_del` arguments.
    pub device_del: DeviceDel,
    /// `blockdev-del` arguments, top node first (after `DEVICE_DELETED`).
    pub blockdev_del: Vec<BlockdevDel>,
}

impl DiskHotplug {
    /// The libvirt node indices (`libvirt-<N>-`) of the disk's nodes, ascending.
    pub fn node_indices(&self) -> BTreeSet<u32> {
        self.blockdevs
            .iter()
            .filter_map(|b| node_index(b.node_name()))
            .collect()
    }

    /// The node names to delete after the device, top node first.
    pub fn node_names_top_first(&self) -> Vec<String> {
        self.blockdev_del
            .iter()
            .map(|b| b.node_name.clone())
            .collect()
    }

    /// The disk with fresh node indices from `*next` on (libvirt numbers nodes per domain, the
    /// converter per plan): each distinct index, ascending, becomes the next free one, in the
    /// blockdevs, the device's `drive` and the `blockdev-del` arguments alike. `*next` ends past
    /// the last index used.
    pub fn renumbered(&self, next: &mut u32) -> DiskHotplug {
        let mut blockdevs = self.blockdevs.clone();
        let map = renumber_nodes(&mut blockdevs, next);
        self.with_nodes_renamed(|n| renamed_node(n, &map))
    }

    /// The disk with every node name for which `rename` returns a new name renamed, in the
    /// blockdevs (their `node-name`, `file`, `backing`), the device's `drive` and the
    /// `blockdev-del` arguments alike; other names stay.
    pub fn with_nodes_renamed(
        &self,
        mut rename: impl FnMut(&str) -> Option<String>,
    ) -> DiskHotplug {
        let mut d = self.clone();
        for b in &mut d.blockdevs {
            b.rename_nodes(&mut rename);
        }
        if let Some(drive) = d.device.device.drive_mut() {
            if let Some(new) = rename(drive) {
                *drive = new;
            }
        }
        for b in &mut d.blockdev_del {
            if let Some(new) = rename(&b.node_name) {
                b.node_name = new;
            }
        }
        d
    }
}

/// QMP arguments to hot-plug and unplug one NIC.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NicHotplug {
    /// Interface name in the VMI.
    pub name: String,
    /// Device id (`ua-<name>`).
    pub id: String,
    /// `getfd` arguments, one per tap/vhost fd, sent with the fd.
    pub getfd: Vec<GetFd>,
    /// `netdev_add` arguments.
    pub netdev: NetdevTap,
    /// `device_add` arguments.
    pub device: PlacedDevice,
    /// `device_del` arguments.
    pub device_del: DeviceDel,
    /// `netdev_del` arguments (after `DEVICE_DELETED`).
    pub netdev_del: NetdevDel,
}

/// One QMP command of the start-up sequence; serialises as `{"execute": .., "arguments": ..}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "execute", content = "arguments")]
pub enum QmpCommand {
    /// `set_link` of a NIC whose link starts down.
    #[serde(rename = "set_link")]
    SetLink(SetLink),
    /// `qom-set` (the balloon's stats period).
    #[serde(rename = "qom-set")]
    QomSet(QomSet),
    /// `block_set_io_throttle` of a disk with I/O limits.
    #[serde(rename = "block_set_io_throttle")]
    BlockSetIoThrottle(Box<BlockSetIoThrottle>),
}

/// The QMP device plan of a domain.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct QmpPlan {
    /// Commands to run after QMP negotiation and before `cont` (libvirt's start sequence):
    /// `set_link` for links that start down, `qom-set` of the balloon stats period.
    pub startup: Vec<QmpCommand>,
    /// Hot-pluggable disks in plan order.
    pub disks: Vec<DiskHotplug>,
    /// Hot-pluggable NICs in plan order.
    pub nics: Vec<NicHotplug>,
}

/// The QMP device plan for every hot-pluggable disk and NIC of `plan`.
pub fn qmp_plan(plan: &DomainPlan) -> QmpPlan {
    let mut out = QmpPlan::default();
    for id in &plan.links_down {
        out.startup.push(QmpCommand::SetLink(SetLink {
            name: id.clone(),
            up: false,
        }));
    }
    if let Some(period) = plan.balloon_stats_period {
        if let Some(b) = plan.devices_of(DeviceClass::Balloon).next() {
            out.startup.push(QmpCommand::QomSet(QomSet {
                path: format!("/machine/peripheral/{}", b.device.id()),
                property: "guest-stats-polling-interval".into(),
                value: period.into(),
            }));
        }
    }
    for t in &plan.io_throttles {
        // A virtio-blk-pci's block backend is its inner virtio-blk device's: libvirt names it
        // by QOM path (`qemuDomainDiskPrivate.qomName`, `.../virtio-backend`).
        let virtio = plan
            .devices
            .iter()
            .any(|d| d.device.id() == t.id && matches!(d.device, Device::VirtioBlk(_)));
        let mut t = t.clone();
        if virtio {
            t.id = format!("/machine/peripheral/{}/virtio-backend", t.id);
        }
        out.startup
            .push(QmpCommand::BlockSetIoThrottle(Box::new(t)));
    }
    for d in plan.devices.iter().filter(|d| d.hotpluggable) {
        let id = d.device.id().to_string();
        let name = d.name.clone().unwrap_or_default();
        match &d.backend {
            Backend::Blockdevs(bs) => out.disks.push(DiskHotplug {
                name,
                target: d.target.clone(),
                device: {
                    let mut placed = PlacedDevice::of(d);
                    // libvirt derives the default boot disk's `bootindex=1` at start only: the same
                    // disk attached later carries none (it would clash with the running one).
                    if plan.default_boot_disk.as_deref() == Some(id.as_str()) {
                        placed.device.clear_bootindex();
                    }
                    placed
                },
                device_del: DeviceDel { id: id.clone() },
                blockdevs: bs.clone(),
                blockdev_del: bs
                    .iter()
                    .rev()
                    .map(|b| BlockdevDel {
                        node_name: b.node_name().to_string(),
                    })
                    .collect(),
                id,
            }),
            Backend::Netdev {
                hotplug, fd_names, ..
            } => out.nics.push(NicHotplug {
                name,
                getfd: fd_names
                    .iter()
                    .map(|n| GetFd { fdname: n.clone() })
                    .collect(),
                netdev: (**hotplug).clone(),
                device: PlacedDevice::of(d),
                device_del: DeviceDel { id: id.clone() },
                netdev_del: NetdevDel {
                    id: hotplug.id.clone(),
                },
                id,
            }),
            _ => {}
        }
    }
    out
}
