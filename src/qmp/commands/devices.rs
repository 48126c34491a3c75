//! Typed QMP commands of hotplug: adding and removing block nodes, devices, netdevs and
//! objects, cdrom media, link state, QOM properties (QEMU `qapi/block-core.json`,
//! `qapi/qdev.json`, `qapi/net.json`, `qapi/qom.json`, `qapi/misc.json`), and the typed replies
//! the hotplug code reads (`query-hotpluggable-cpus`, `query-chardev`).
//!
//! The add commands wrap their argument struct by reference: the converter's typed
//! [`Blockdev`](crate::cmdline::qemu::Blockdev), [`PlacedDevice`](crate::cmdline::render::PlacedDevice)
//! and [`NetdevTap`](crate::cmdline::qemu::NetdevTap), or (for the operator's `qlauncher hotplug`
//! CLI, which takes QEMU's JSON as typed by the user) a `serde_json::Value`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Command, Empty};

pub use crate::cmdline::qemu::{
    BlockSetIoThrottle, BlockdevDel, DeviceDel, NetdevDel, QomSet, SetLink,
};
use crate::cmdline::render::QmpCommand;

/// Declares the by-reference wrapper `$ty<'a, T>(&'a T)` a command named `$name` replying `{}`,
/// its `arguments` the wrapped value.
macro_rules! command_of {
    ($ty:ident, $name:literal) => {
        impl<T: Serialize> Command for $ty<'_, T> {
            type Reply = Empty;
            fn name(&self) -> &str {
                $name
            }
            fn arguments(&self) -> Result<Option<Value>, serde_json::Error> {
                serde_json::to_value(self.0).map(Some)
            }
        }
    };
}

/// `blockdev-add` of one node (its arguments are the node: `BlockdevOptions`).
#[derive(Debug, Clone, Copy)]
pub struct BlockdevAdd<'a, T>(pub &'a T);
command_of!(BlockdevAdd, "blockdev-add");

/// `device_add` of one device (its arguments are the device's properties).
#[derive(Debug, Clone, Copy)]
pub struct DeviceAdd<'a, T>(pub &'a T);
command_of!(DeviceAdd, "device_add");

/// `netdev_add` of one netdev (its arguments are the `Netdev`).
#[derive(Debug, Clone, Copy)]
pub struct NetdevAdd<'a, T>(pub &'a T);
command_of!(NetdevAdd, "netdev_add");

/// `object-add` of one object (its arguments are the `ObjectOptions`).
#[derive(Debug, Clone, Copy)]
pub struct ObjectAdd<'a, T>(pub &'a T);
command_of!(ObjectAdd, "object-add");

command!(DeviceDel, "device_del", Empty);
command!(BlockdevDel, "blockdev-del", Empty);
command!(NetdevDel, "netdev_del", Empty);
command!(SetLink, "set_link", Empty);
command!(QomSet, "qom-set", Empty);
command!(BlockSetIoThrottle, "block_set_io_throttle", Empty);

impl Command for QmpCommand {
    type Reply = Empty;
    fn name(&self) -> &str {
        match self {
            QmpCommand::SetLink(c) => c.name(),
            QmpCommand::QomSet(c) => c.name(),
            QmpCommand::BlockSetIoThrottle(c) => c.name(),
        }
    }
    fn arguments(&self) -> Result<Option<Value>, serde_json::Error> {
        match self {
            QmpCommand::SetLink(c) => c.arguments(),
            QmpCommand::QomSet(c) => c.arguments(),
            QmpCommand::BlockSetIoThrottle(c) => c.arguments(),
        }
    }
}

/// `closefd`: drops an fd passed with `getfd` that no netdev consumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Closefd {
    /// The fd's name.
    pub fdname: String,
}
command!(Closefd, "closefd", Empty);

/// `blockdev-open-tray` of a removable drive, by device id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockdevOpenTray {
    /// Device id.
    pub id: String,
    /// Open even when the guest locked the tray (libvirt always forces).
    pub force: bool,
}
command!(BlockdevOpenTray, "blockdev-open-tray", Empty);

/// `blockdev-remove-medium` of an open drive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockdevRemoveMedium {
    /// Device id.
    pub id: String,
}
command!(BlockdevRemoveMedium, "blockdev-remove-medium", Empty);

/// `blockdev-insert-medium`: puts the node `node-name` into the open drive `id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockdevInsertMedium {
    /// Device id.
    pub id: String,
    /// The medium's top node.
    #[serde(rename = "node-name")]
    pub node_name: String,
}
command!(BlockdevInsertMedium, "blockdev-insert-medium", Empty);

/// `blockdev-close-tray`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockdevCloseTray {
    /// Device id.
    pub id: String,
}
command!(BlockdevCloseTray, "blockdev-close-tray", Empty);

/// `block_resize` of a node (libvirt's `BlockResize`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockResize {
    /// The drive's top node.
    #[serde(rename = "node-name")]
    pub node_name: String,
    /// New size, bytes.
    pub size: u64,
}
command!(BlockResize, "block_resize", Empty);

/// `inject-nmi`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct InjectNmi {}
command!(InjectNmi, "inject-nmi", Empty);

/// `query-hotpluggable-cpus`: the vCPU slots.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueryHotpluggableCpus;
command!(
    QueryHotpluggableCpus,
    "query-hotpluggable-cpus",
    Vec<HotpluggableCpu>
);

/// One slot of `query-hotpluggable-cpus` (`HotpluggableCPU`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct HotpluggableCpu {
    /// The CPU device type (`max-x86_64-cpu`).
    #[serde(rename = "type")]
    pub driver: String,
    /// vCPUs the slot holds.
    #[serde(rename = "vcpus-count")]
    pub vcpus_count: u32,
    /// The slot's properties (`CpuInstanceProperties`: `socket-id`, `die-id`, `cluster-id`,
    /// `core-id`, `thread-id`, `node-id`, ...; all integers in QEMU's schema), by name.
    pub props: BTreeMap<String, i64>,
    /// The QOM path of the CPU in the slot; `None` when empty.
    #[serde(rename = "qom-path", default)]
    pub qom_path: Option<String>,
}

/// `device_add` of a vCPU into a slot of `query-hotpluggable-cpus`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CpuDeviceAdd {
    /// The slot's CPU type, e.g. `max-x86_64-cpu`.
    pub driver: String,
    /// The device id, `vcpu<index>`.
    pub id: String,
    /// The slot's properties (`socket-id`, `core-id`, `thread-id`, `node-id`, ...).
    #[serde(flatten)]
    pub props: BTreeMap<String, i64>,
}
command!(CpuDeviceAdd, "device_add", Empty);

/// `device_add` of a `virtio-mem-pci` device on a root port, as libvirt adds a
/// `<memory model='virtio-mem'>` (`qemuBuildMemoryDeviceProps`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VirtioMemPciAdd {
    /// Always `virtio-mem-pci`.
    pub driver: &'static str,
    /// Device id (`virtiomem0`).
    pub id: String,
    /// The memory backend's id (`memvirtiomem0`).
    pub memdev: String,
    /// Guest NUMA node.
    pub node: u32,
    /// Block size, bytes.
    #[serde(rename = "block-size")]
    pub block_size: u64,
    /// Memory the guest is asked to online, bytes.
    #[serde(rename = "requested-size")]
    pub requested_size: u64,
    /// The root port's id.
    pub bus: String,
    /// Slot on the root port (`0x0`).
    pub addr: String,
}
command!(VirtioMemPciAdd, "device_add", Empty);

/// `query-chardev`: every character device.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueryChardev;
command!(QueryChardev, "query-chardev", Vec<ChardevInfo>);

/// One entry of `query-chardev`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ChardevInfo {
    /// The chardev id (`charchannel0`).
    pub label: String,
    /// Its backend, e.g. `unix:/run/..,server=on`.
    #[serde(default)]
    pub filename: String,
    /// Whether the frontend (the guest side) has it open.
    #[serde(rename = "frontend-open", default)]
    pub frontend_open: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::qemu::{BackingNode, Blockdev, BlockdevFormat, FormatDriver};
    use crate::qmp::commands::tests::{wire, Wire};
    use serde_json::json;

    #[test]
    fn hotplug_commands_encode_as_qemu_schema_arguments() {
        let node = Blockdev::Format(BlockdevFormat {
            detect_zeroes: None,
            node_name: "libvirt-2-format".into(),
            read_only: false,
            discard: None,
            cache: None,
            driver: FormatDriver::Raw,
            file: "libvirt-2-storage".into(),
            data_file: None,
            backing: BackingNode::Absent,
        });
        let device = crate::sync::reconcile::disks::fixtures::virtio_blk(
            "libvirt-2-format",
            "ua-data",
            None,
            "pci.3",
        );
        let raw = json!({"node-name": "n", "driver": "null-co"});
        let cases: Vec<(Wire, (&str, Value))> = vec![
            (
                wire(&BlockdevAdd(&node)),
                (
                    "blockdev-add",
                    json!({"node-name": "libvirt-2-format", "read-only": false,
                           "driver": "raw", "file": "libvirt-2-storage"}),
                ),
            ),
            (wire(&BlockdevAdd(&raw)), ("blockdev-add", raw.clone())),
            (
                wire(&DeviceAdd(&device)),
                (
                    "device_add",
                    json!({"driver": "virtio-blk-pci-non-transitional",
                           "drive": "libvirt-2-format", "id": "ua-data",
                           "bus": "pci.3", "addr": "0x0"}),
                ),
            ),
            (
                wire(&BlockdevDel {
                    node_name: "libvirt-2-format".into(),
                }),
                ("blockdev-del", json!({"node-name": "libvirt-2-format"})),
            ),
            (
                wire(&BlockdevOpenTray {
                    id: "ua-cd".into(),
                    force: true,
                }),
                ("blockdev-open-tray", json!({"id": "ua-cd", "force": true})),
            ),
            (
                wire(&BlockdevInsertMedium {
                    id: "ua-cd".into(),
                    node_name: "libvirt-4-format".into(),
                }),
                (
                    "blockdev-insert-medium",
                    json!({"id": "ua-cd", "node-name": "libvirt-4-format"}),
                ),
            ),
            (
                wire(&BlockResize {
                    node_name: "libvirt-2-format".into(),
                    size: 1 << 30,
                }),
                (
                    "block_resize",
                    json!({"node-name": "libvirt-2-format", "size": 1u64 << 30}),
                ),
            ),
            (
                wire(&QmpCommand::SetLink(SetLink {
                    name: "ua-net1".into(),
                    up: false,
                })),
                ("set_link", json!({"name": "ua-net1", "up": false})),
            ),
            (
                wire(&Closefd {
                    fdname: "tapfd".into(),
                }),
                ("closefd", json!({"fdname": "tapfd"})),
            ),
            (
                wire(&CpuDeviceAdd {
                    driver: "max-x86_64-cpu".into(),
                    id: "vcpu1".into(),
                    props: [("socket-id".to_string(), 1), ("core-id".to_string(), 0)]
                        .into_iter()
                        .collect(),
                }),
                (
                    "device_add",
                    json!({"driver": "max-x86_64-cpu", "id": "vcpu1", "socket-id": 1, "core-id": 0}),
                ),
            ),
        ];
        for (got, (name, args)) in cases {
            assert_eq!(got, (name.to_string(), Some(args)));
        }
        assert_eq!(wire(&InjectNmi {}), ("inject-nmi".into(), Some(json!({}))));
    }

    #[test]
    fn hotplug_replies_decode() {
        let slots: Vec<HotpluggableCpu> = serde_json::from_value(json!([
            {"type": "max-x86_64-cpu", "vcpus-count": 1,
             "props": {"socket-id": 1, "core-id": 0, "thread-id": 0}},
            {"type": "max-x86_64-cpu", "vcpus-count": 1, "qom-path": "/machine/unattached/device[0]",
             "props": {"socket-id": 0, "core-id": 0, "thread-id": 0}}
        ]))
        .unwrap();
        assert_eq!(slots[0].props["socket-id"], 1);
        assert_eq!(slots[0].qom_path, None);
        assert_eq!(
            slots[1].qom_path.as_deref(),
            Some("/machine/unattached/device[0]")
        );
        let chardevs: Vec<ChardevInfo> = serde_json::from_value(json!([
            {"label": "charchannel0", "filename": "unix:/r/s,server=on", "frontend-open": true},
            {"label": "charserial0", "filename": "pty:/dev/pts/3", "frontend-open": false}
        ]))
        .unwrap();
        assert!(chardevs[0].frontend_open);
        assert_eq!(chardevs[1].label, "charserial0");
    }
}
