//! `qmp_plan(&DomainPlan)`: for every hot-pluggable disk and NIC, the QMP argument objects that add
//! it and remove it, in libvirt's order (`qemuhotplugtest.c`, `qemu_hotplug.c`):
//! disk: `blockdev-add` (bottom node first) + `device_add`; removal: `device_del`, wait for
//! `DEVICE_DELETED`, then `blockdev-del` top node first.
//! NIC: `getfd` (one per fd name, the fd travels as SCM_RIGHTS) + `netdev_add` + `device_add`;
//! removal: `device_del`, `DEVICE_DELETED`, `netdev_del`.

use super::device_json;
use crate::cmdline::plan::{Backend, DeviceClass, DomainPlan};
use crate::cmdline::qemu::to_json;
use serde::Serialize;
use serde_json::{json, Value};

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
    pub blockdevs: Vec<Value>,
    /// `device_add` arguments.
    pub device: Value,
    /// `device_del` arguments.
    pub device_del: Value,
    /// `blockdev-del` arguments, top node first (after `DEVICE_DELETED`).
    pub blockdev_del: Vec<Value>,
}

/// QMP arguments to hot-plug and unplug one NIC.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NicHotplug {
    /// Interface name in the VMI.
    pub name: String,
    /// Device id (`ua-<name>`).
    pub id: String,
    /// `getfd` arguments (`{"fdname": ..}`), one per tap/vhost fd, sent with the fd.
    pub getfd: Vec<Value>,
    /// `netdev_add` arguments.
    pub netdev: Value,
    /// `device_add` arguments.
    pub device: Value,
    /// `device_del` arguments.
    pub device_del: Value,
    /// `netdev_del` arguments (after `DEVICE_DELETED`).
    pub netdev_del: Value,
}

/// One QMP command: `{"execute": .., "arguments": ..}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QmpCommand {
    /// Command name.
    pub execute: &'static str,
    /// Arguments object.
    pub arguments: Value,
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
        out.startup.push(QmpCommand {
            execute: "set_link",
            arguments: json!({ "name": id, "up": false }),
        });
    }
    if let Some(period) = plan.balloon_stats_period {
        if let Some(b) = plan.devices_of(DeviceClass::Balloon).next() {
            out.startup.push(QmpCommand {
                execute: "qom-set",
                arguments: json!({
                    "path": format!("/machine/peripheral/{}", b.device.id()),
                    "property": "guest-stats-polling-interval",
                    "value": period,
                }),
            });
        }
    }
    for d in plan.devices.iter().filter(|d| d.hotpluggable) {
        let id = d.device.id().to_string();
        let name = d.name.clone().unwrap_or_default();
        match &d.backend {
            Backend::Blockdevs(bs) => out.disks.push(DiskHotplug {
                name,
                target: d.target.clone(),
                device: {
                    let mut v = device_json(d);
                    if plan.default_boot_disk.as_deref() == Some(id.as_str()) {
                        if let Some(o) = v.as_object_mut() {
                            o.remove("bootindex");
                        }
                    }
                    v
                },
                device_del: json!({ "id": id }),
                blockdevs: bs.iter().map(to_json).collect(),
                blockdev_del: bs
                    .iter()
                    .rev()
                    .map(|b| json!({ "node-name": b.node_name() }))
                    .collect(),
                id,
            }),
            Backend::Netdev {
                hotplug, fd_names, ..
            } => out.nics.push(NicHotplug {
                name,
                getfd: fd_names.iter().map(|n| json!({ "fdname": n })).collect(),
                netdev: to_json(hotplug),
                device: device_json(d),
                device_del: json!({ "id": id }),
                netdev_del: json!({ "id": hotplug.id }),
                id,
            }),
            _ => {}
        }
    }
    out
}
