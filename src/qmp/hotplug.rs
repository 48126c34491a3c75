//! Transactional hotplug of disks, cdrom media and NICs over QMP.
//!
//! The command order is the one libvirt issues for KubeVirt's `AttachDeviceFlags`,
//! `DetachDeviceFlags` and `UpdateDeviceFlags` (libvirt `qemu_hotplug.c`): `blockdev-add` bottom
//! node first then `device_add`; `device_del`, wait for `DEVICE_DELETED`, then `blockdev-del` top
//! node first; for NICs `getfd` + `netdev_add` + `device_add`, and `device_del` +
//! `DEVICE_DELETED` + `netdev_del`. The argument objects come ready-made from the converter's QMP
//! plan (typed) or from the operator's CLI (JSON); this module only needs their `node-name` / `id`
//! members to roll back. When a step fails,
//! what was added before is removed again (newest first) and the error names the failed step.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::client::QmpClient;
use super::commands::{
    BlockResize, BlockdevAdd, BlockdevCloseTray, BlockdevDel, BlockdevInsertMedium,
    BlockdevOpenTray, BlockdevRemoveMedium, Closefd, DeviceAdd, DeviceDel, NetdevAdd, NetdevDel,
    ObjectPropertyInfo, QomGet, QomList, SetLink,
};
use super::QmpError;
use crate::cmdline::qemu::{Blockdev, NetdevTap};
use crate::cmdline::render::PlacedDevice;

/// Default wait for `DEVICE_DELETED` after `device_del` (the guest must release a PCIe device;
/// Linux takes about 5 s for the attention-button delay).
pub const DEFAULT_UNPLUG_TIMEOUT: Duration = Duration::from_secs(30);

/// `blockdev-add` arguments: the converter's typed [`Blockdev`], or QEMU's JSON as an operator
/// typed it (`qlauncher hotplug disk attach --blockdev`).
pub trait BlockdevArgs: Serialize {
    /// The `node-name` member; `None` when the JSON lacks it.
    fn node_name(&self) -> Option<&str>;
}

impl BlockdevArgs for Blockdev {
    fn node_name(&self) -> Option<&str> {
        Some(Blockdev::node_name(self))
    }
}

impl BlockdevArgs for Value {
    fn node_name(&self) -> Option<&str> {
        self.get("node-name")?.as_str()
    }
}

/// `device_add` arguments: the converter's typed [`PlacedDevice`], or QEMU's JSON.
pub trait DeviceArgs: Serialize {
    /// The `id` member; `None` when the JSON lacks it.
    fn device_id(&self) -> Option<&str>;
}

impl DeviceArgs for PlacedDevice {
    fn device_id(&self) -> Option<&str> {
        Some(self.id())
    }
}

impl DeviceArgs for Value {
    fn device_id(&self) -> Option<&str> {
        self.get("id")?.as_str()
    }
}

/// `netdev_add` arguments: the converter's typed [`NetdevTap`], or QEMU's JSON.
pub trait NetdevArgs: Serialize {
    /// The `id` member; `None` when the JSON lacks it.
    fn netdev_id(&self) -> Option<&str>;
}

impl NetdevArgs for NetdevTap {
    fn netdev_id(&self) -> Option<&str> {
        Some(&self.id)
    }
}

impl NetdevArgs for Value {
    fn netdev_id(&self) -> Option<&str> {
        self.get("id")?.as_str()
    }
}

/// A disk to hotplug: `blockdev-add` arguments bottom node first (protocol node, then format node),
/// then the `device_add` arguments (`virtio-blk-pci` on a free root port or `scsi-hd` on the bus).
/// Typed ([`Blockdev`], [`PlacedDevice`]) from the sync; JSON (the default) from the CLI.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskAttach<B = Value, D = Value> {
    /// `blockdev-add` arguments, each with a `node-name`, bottom node first.
    pub blockdevs: Vec<B>,
    /// `device_add` arguments, with `id` and `drive` (the top node-name).
    pub device: D,
}

/// A disk to unplug.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskDetach {
    /// The device id (`ua-<name>`).
    pub device_id: String,
    /// Node names to delete after the device is gone, top node first.
    pub node_names: Vec<String>,
}

/// A NIC to hotplug on an existing tap.
#[derive(Debug)]
pub struct NicAttach<N = Value, D = Value> {
    /// The open tap (`/dev/net/tun` after `TUNSETIFF`); handed to QEMU with `getfd`.
    pub tap_fd: OwnedFd,
    /// Name the fd gets in QEMU, referenced by the netdev's `fd`.
    pub fd_name: String,
    /// More named fds sent with `getfd` after the tap (vhost-net fds, more queues'
    /// taps: the netdev's `vhostfd`, `fds`); usually empty.
    pub extra_fds: Vec<(String, OwnedFd)>,
    /// `netdev_add` arguments (`{"type": "tap", "fd": fd_name, "id": "hostua-<name>", ...}`).
    pub netdev: N,
    /// `device_add` arguments (`virtio-net-pci` with `netdev`, `id`, `mac`, `bus`).
    pub device: D,
}

/// A NIC to unplug.
#[derive(Debug, Clone, PartialEq)]
pub struct NicDetach {
    /// The device id (`ua-<name>`).
    pub device_id: String,
    /// The netdev id (`hostua-<name>`).
    pub netdev_id: String,
}

/// A cdrom media change: the tray is opened (forced), the medium removed, the new nodes added
/// and inserted, the tray closed, and the old nodes deleted. With no `new_blockdevs` it is an eject.
#[derive(Debug, Clone, PartialEq)]
pub struct CdromChange<B = Value> {
    /// The cdrom device id (`ua-<name>`).
    pub device_id: String,
    /// Nodes of the current medium to delete afterwards, top first (empty if the drive was empty).
    pub old_node_names: Vec<String>,
    /// `blockdev-add` arguments of the new medium, bottom first; the last one is inserted.
    pub new_blockdevs: Vec<B>,
}

/// What to undo when a later hotplug step fails.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Undo {
    /// `blockdev-del` of a node added.
    BlockdevDel(String),
    /// `closefd` of an fd passed.
    Closefd(String),
    /// `netdev_del` of a netdev added.
    NetdevDel(String),
    /// `blockdev-close-tray` of a drive opened.
    CloseTray(String),
}

impl Undo {
    async fn run(self, client: &QmpClient) -> Result<(), QmpError> {
        match self {
            Undo::BlockdevDel(node_name) => client.run(&BlockdevDel { node_name }).await,
            Undo::Closefd(fdname) => client.run(&Closefd { fdname }).await,
            Undo::NetdevDel(id) => client.run(&NetdevDel { id }).await,
            Undo::CloseTray(id) => client.run(&BlockdevCloseTray { id }).await,
        }
        .map(drop)
    }
}

fn member<'a>(v: Option<&'a str>, field: &str, object: &str) -> Result<&'a str, QmpError> {
    v.ok_or_else(|| QmpError::HotplugArgs {
        object: object.to_string(),
        reason: format!("missing string member \"{field}\""),
    })
}

/// Runs the undo steps (newest first) and collects their errors.
async fn rollback(client: &QmpClient, undo: Vec<Undo>) -> Vec<String> {
    let mut errors = Vec::new();
    for step in undo.into_iter().rev() {
        if let Err(e) = step.run(client).await {
            errors.push(e.to_string());
        }
    }
    errors
}

async fn fail(
    client: &QmpClient,
    what: &str,
    step: String,
    undo: Vec<Undo>,
    source: QmpError,
) -> QmpError {
    let rollback_errors = rollback(client, undo).await;
    QmpError::Hotplug {
        what: what.to_string(),
        step,
        rollback_errors,
        source: Box::new(source),
    }
}

/// Adds blockdevs in order, recording their undo; on failure rolls back and returns the error.
async fn add_blockdevs<B: BlockdevArgs>(
    client: &QmpClient,
    what: &str,
    blockdevs: &[B],
    undo: &mut Vec<Undo>,
) -> Result<(), QmpError> {
    for (i, bd) in blockdevs.iter().enumerate() {
        let node = member(bd.node_name(), "node-name", &format!("blockdevs[{i}]"))?;
        if let Err(e) = client.run(&BlockdevAdd(bd)).await {
            let undo = std::mem::take(undo);
            return Err(fail(client, what, format!("blockdev-add {node}"), undo, e).await);
        }
        undo.push(Undo::BlockdevDel(node.to_string()));
    }
    Ok(())
}

/// Hotplugs a disk. On failure every node added so far is deleted again.
pub async fn attach_disk<B: BlockdevArgs, D: DeviceArgs>(
    client: &QmpClient,
    disk: &DiskAttach<B, D>,
) -> Result<(), QmpError> {
    let id = member(disk.device.device_id(), "id", "device")?;
    for (i, bd) in disk.blockdevs.iter().enumerate() {
        member(bd.node_name(), "node-name", &format!("blockdevs[{i}]"))?;
    }
    let mut undo = Vec::new();
    add_blockdevs(client, id, &disk.blockdevs, &mut undo).await?;
    if let Err(e) = client.run(&DeviceAdd(&disk.device)).await {
        return Err(fail(client, id, format!("device_add {id}"), undo, e).await);
    }
    Ok(())
}

/// `device_del` and wait for `DEVICE_DELETED` for `id` (subscribed before the command, so a fast
/// unplug is not missed).
pub async fn unplug_device(
    client: &QmpClient,
    id: &str,
    timeout: Duration,
) -> Result<(), QmpError> {
    let mut events = client.events();
    client.run(&DeviceDel { id: id.to_string() }).await?;
    events
        .wait_for("DEVICE_DELETED", id, timeout, |ev| {
            ev.name == "DEVICE_DELETED" && ev.data["device"] == id
        })
        .await
        .map(drop)
}

/// Unplugs a disk: `device_del`, waits up to `timeout` for `DEVICE_DELETED`, then `blockdev-del`
/// of each node, top first. Errors name the step; nodes are left in place if the device stays.
pub async fn detach_disk(
    client: &QmpClient,
    disk: &DiskDetach,
    timeout: Duration,
) -> Result<(), QmpError> {
    unplug_device(client, &disk.device_id, timeout)
        .await
        .map_err(|e| QmpError::Hotplug {
            what: disk.device_id.clone(),
            step: format!("device_del {}", disk.device_id),
            rollback_errors: vec![],
            source: Box::new(e),
        })?;
    for node in &disk.node_names {
        client
            .run(&BlockdevDel {
                node_name: node.clone(),
            })
            .await
            .map_err(|e| QmpError::Hotplug {
                what: disk.device_id.clone(),
                step: format!("blockdev-del {node}"),
                rollback_errors: vec![],
                source: Box::new(e),
            })?;
    }
    Ok(())
}

/// Hotplugs a NIC: `getfd` (tap, then `extra_fds`), `netdev_add`, `device_add`. On failure the
/// netdev is deleted or the named fds closed again.
pub async fn attach_nic<N: NetdevArgs, D: DeviceArgs>(
    client: &QmpClient,
    nic: &NicAttach<N, D>,
) -> Result<(), QmpError> {
    let id = member(nic.device.device_id(), "id", "device")?;
    let netdev_id = member(nic.netdev.netdev_id(), "id", "netdev")?;
    let fds = std::iter::once((&nic.fd_name, &nic.tap_fd))
        .chain(nic.extra_fds.iter().map(|(n, f)| (n, f)));
    let mut undo = Vec::new();
    for (name, fd) in fds {
        if let Err(e) = client.getfd(name, fd.as_fd()).await {
            return Err(fail(client, id, format!("getfd {name}"), undo, e).await);
        }
        undo.push(Undo::Closefd(name.clone()));
    }
    if let Err(e) = client.run(&NetdevAdd(&nic.netdev)).await {
        return Err(fail(client, id, format!("netdev_add {netdev_id}"), undo, e).await);
    }
    // netdev_add consumed the named fd; from here the netdev is what to undo.
    let undo = vec![Undo::NetdevDel(netdev_id.to_string())];
    if let Err(e) = client.run(&DeviceAdd(&nic.device)).await {
        return Err(fail(client, id, format!("device_add {id}"), undo, e).await);
    }
    Ok(())
}

/// Unplugs a NIC: `device_del`, waits for `DEVICE_DELETED`, then `netdev_del`.
pub async fn detach_nic(
    client: &QmpClient,
    nic: &NicDetach,
    timeout: Duration,
) -> Result<(), QmpError> {
    let step = |step: String| {
        let what = nic.device_id.clone();
        move |e| QmpError::Hotplug {
            what,
            step,
            rollback_errors: vec![],
            source: Box::new(e),
        }
    };
    unplug_device(client, &nic.device_id, timeout)
        .await
        .map_err(step(format!("device_del {}", nic.device_id)))?;
    client
        .run(&NetdevDel {
            id: nic.netdev_id.clone(),
        })
        .await
        .map_err(step(format!("netdev_del {}", nic.netdev_id)))?;
    Ok(())
}

/// Changes or ejects a cdrom medium (libvirt's sequence for `UpdateDeviceFlags` on a cdrom).
/// If adding or inserting the new medium fails, the new nodes are deleted again; the old medium
/// stays removed (as with libvirt) and the tray is closed.
pub async fn change_cdrom<B: BlockdevArgs>(
    client: &QmpClient,
    change: &CdromChange<B>,
) -> Result<(), QmpError> {
    let id = change.device_id.clone();
    let step = |step: String| {
        let what = id.clone();
        move |e| QmpError::Hotplug {
            what,
            step,
            rollback_errors: vec![],
            source: Box::new(e),
        }
    };
    let mut new_top = None;
    for (i, bd) in change.new_blockdevs.iter().enumerate() {
        new_top = Some(member(
            bd.node_name(),
            "node-name",
            &format!("new_blockdevs[{i}]"),
        )?);
    }
    client
        .run(&BlockdevOpenTray {
            id: id.clone(),
            force: true,
        })
        .await
        .map_err(step("blockdev-open-tray".into()))?;
    client
        .run(&BlockdevRemoveMedium { id: id.clone() })
        .await
        .map_err(step("blockdev-remove-medium".into()))?;
    if let Some(top) = new_top {
        let mut undo = vec![Undo::CloseTray(id.clone())];
        add_blockdevs(client, &id, &change.new_blockdevs, &mut undo).await?;
        let insert = BlockdevInsertMedium {
            id: id.clone(),
            node_name: top.to_string(),
        };
        if let Err(e) = client.run(&insert).await {
            return Err(fail(
                client,
                &id,
                format!("blockdev-insert-medium {top}"),
                undo,
                e,
            )
            .await);
        }
    }
    client
        .run(&BlockdevCloseTray { id: id.clone() })
        .await
        .map_err(step("blockdev-close-tray".into()))?;
    for node in &change.old_node_names {
        client
            .run(&BlockdevDel {
                node_name: node.clone(),
            })
            .await
            .map_err(step(format!("blockdev-del {node}")))?;
    }
    Ok(())
}

/// `block_resize` of `node_name` to `size_bytes` (KubeVirt's `BlockResize` on volume expansion).
pub async fn resize_disk(
    client: &QmpClient,
    node_name: &str,
    size_bytes: u64,
) -> Result<(), QmpError> {
    let resize = BlockResize {
        node_name: node_name.to_string(),
        size: size_bytes,
    };
    client.run(&resize).await.map(drop)
}

/// `set_link`: link up or down of a NIC (by device id; KubeVirt's interface `state: down`).
pub async fn set_link(client: &QmpClient, id: &str, up: bool) -> Result<(), QmpError> {
    let link = SetLink {
        name: id.to_string(),
        up,
    };
    client.run(&link).await.map(drop)
}

/// The ids of PCIe root ports with nothing plugged in, sorted: where a hotplugged
/// (natural order) `virtio-blk-pci` / `virtio-net-pci` can go (`bus: <id>, addr: 0x0`). KubeVirt reserves such
/// ports at start (`manager.go` root port placeholders). Found through QOM (`qom-list` of
/// `/machine/peripheral` and `/machine/peripheral-anon`, `qom-get parent_bus`), which, unlike
/// `query-pci`, does not depend on the guest having numbered the buses. A port whose device is
/// still being unplugged counts as busy until `DEVICE_DELETED`.
pub async fn free_root_ports(client: &QmpClient) -> Result<Vec<String>, QmpError> {
    let mut ports = Vec::new();
    let mut busy_buses = std::collections::BTreeSet::new();
    for container in ["/machine/peripheral", "/machine/peripheral-anon"] {
        let children = client
            .run(&QomList {
                path: container.to_string(),
            })
            .await?;
        for ObjectPropertyInfo { name, kind: ty } in &children {
            if !ty.starts_with("child<") {
                continue;
            }
            let path = format!("{container}/{name}");
            if ty == "child<pcie-root-port>" && container == "/machine/peripheral" {
                ports.push(name.to_string());
            }
            let bus = client
                .run(&QomGet {
                    path,
                    property: "parent_bus".into(),
                })
                .await?;
            if let Some(bus) = bus.as_str() {
                busy_buses.insert(bus.to_string());
            }
        }
    }
    ports.retain(|id| !busy_buses.contains(&format!("/machine/peripheral/{id}/{id}")));
    // Natural order: pci.2 before pci.10.
    ports.sort_by_key(|id| {
        let digits = id.len() - id.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (stem, num) = id.split_at(id.len() - digits);
        (
            stem.to_string(),
            num.parse::<u64>().unwrap_or(0),
            id.clone(),
        )
    });
    Ok(ports)
}
