//! Transactional hotplug of disks, cdrom media and NICs over QMP.
//!
//! The command order is the one libvirt issues for KubeVirt's `AttachDeviceFlags`,
//! `DetachDeviceFlags` and `UpdateDeviceFlags` (libvirt `qemu_hotplug.c`): `blockdev-add` bottom
//! node first then `device_add`; `device_del`, wait for `DEVICE_DELETED`, then `blockdev-del` top
//! node first; for NICs `getfd` + `netdev_add` + `device_add`, and `device_del` +
//! `DEVICE_DELETED` + `netdev_del`. The argument objects come ready-made from the converter's QMP
//! plan; this module only needs their `node-name` / `id` members to roll back. When a step fails,
//! what was added before is removed again (newest first) and the error names the failed step.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use serde_json::{json, Value};

use super::client::QmpClient;
use super::QmpError;

/// Default wait for `DEVICE_DELETED` after `device_del` (the guest must release a PCIe device;
/// Linux takes about 5 s for the attention-button delay).
pub const DEFAULT_UNPLUG_TIMEOUT: Duration = Duration::from_secs(30);

/// A disk to hotplug: `blockdev-add` arguments bottom node first (protocol node, then format node),
/// then the `device_add` arguments (`virtio-blk-pci` on a free root port or `scsi-hd` on the bus).
#[derive(Debug, Clone, PartialEq)]
pub struct DiskAttach {
    /// `blockdev-add` argument objects, each with a `node-name`, bottom node first.
    pub blockdevs: Vec<Value>,
    /// `device_add` argument object, with `id` and `drive` (the top node-name).
    pub device: Value,
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
pub struct NicAttach {
    /// The open tap (`/dev/net/tun` after `TUNSETIFF`); handed to QEMU with `getfd`.
    pub tap_fd: OwnedFd,
    /// Name the fd gets in QEMU, referenced by `netdev["fd"]`.
    pub fd_name: String,
    /// More named fds sent with `getfd` after the tap (vhost-net fds, more queues'
    /// taps: `netdev["vhostfd"]`, `netdev["fds"]`); usually empty.
    pub extra_fds: Vec<(String, OwnedFd)>,
    /// `netdev_add` arguments (`{"type": "tap", "fd": fd_name, "id": "hostua-<name>", ...}`).
    pub netdev: Value,
    /// `device_add` arguments (`virtio-net-pci` with `netdev`, `id`, `mac`, `bus`).
    pub device: Value,
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
pub struct CdromChange {
    /// The cdrom device id (`ua-<name>`).
    pub device_id: String,
    /// Nodes of the current medium to delete afterwards, top first (empty if the drive was empty).
    pub old_node_names: Vec<String>,
    /// `blockdev-add` arguments of the new medium, bottom first; the last one is inserted.
    pub new_blockdevs: Vec<Value>,
}

fn str_field(v: &Value, field: &str, object: &str) -> Result<String, QmpError> {
    v.get(field)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| QmpError::HotplugArgs {
            object: object.to_string(),
            reason: format!("missing string member \"{field}\""),
        })
}

/// Runs the undo steps (newest first) and collects their errors.
async fn rollback(client: &QmpClient, undo: Vec<(String, Value)>) -> Vec<String> {
    let mut errors = Vec::new();
    for (cmd, args) in undo.into_iter().rev() {
        if let Err(e) = client.execute(&cmd, Some(args)).await {
            errors.push(e.to_string());
        }
    }
    errors
}

async fn fail(
    client: &QmpClient,
    what: &str,
    step: String,
    undo: Vec<(String, Value)>,
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
async fn add_blockdevs(
    client: &QmpClient,
    what: &str,
    blockdevs: &[Value],
    undo: &mut Vec<(String, Value)>,
) -> Result<(), QmpError> {
    for (i, bd) in blockdevs.iter().enumerate() {
        let node = str_field(bd, "node-name", &format!("blockdevs[{i}]"))?;
        if let Err(e) = client.execute("blockdev-add", Some(bd.clone())).await {
            let undo = std::mem::take(undo);
            return Err(fail(client, what, format!("blockdev-add {node}"), undo, e).await);
        }
        undo.push(("blockdev-del".into(), json!({ "node-name": node })));
    }
    Ok(())
}

/// Hotplugs a disk. On failure every node added so far is deleted again.
pub async fn attach_disk(client: &QmpClient, disk: &DiskAttach) -> Result<(), QmpError> {
    let id = str_field(&disk.device, "id", "device")?;
    for (i, bd) in disk.blockdevs.iter().enumerate() {
        str_field(bd, "node-name", &format!("blockdevs[{i}]"))?;
    }
    let mut undo = Vec::new();
    add_blockdevs(client, &id, &disk.blockdevs, &mut undo).await?;
    if let Err(e) = client
        .execute("device_add", Some(disk.device.clone()))
        .await
    {
        return Err(fail(client, &id, format!("device_add {id}"), undo, e).await);
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
    client
        .execute("device_del", Some(json!({ "id": id })))
        .await?;
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
            .execute("blockdev-del", Some(json!({ "node-name": node })))
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
pub async fn attach_nic(client: &QmpClient, nic: &NicAttach) -> Result<(), QmpError> {
    let id = str_field(&nic.device, "id", "device")?;
    let netdev_id = str_field(&nic.netdev, "id", "netdev")?;
    let fds = std::iter::once((&nic.fd_name, &nic.tap_fd))
        .chain(nic.extra_fds.iter().map(|(n, f)| (n, f)));
    let mut undo = Vec::new();
    for (name, fd) in fds {
        if let Err(e) = client.getfd(name, fd.as_fd()).await {
            return Err(fail(client, &id, format!("getfd {name}"), undo, e).await);
        }
        undo.push(("closefd".to_string(), json!({ "fdname": name })));
    }
    if let Err(e) = client.execute("netdev_add", Some(nic.netdev.clone())).await {
        return Err(fail(client, &id, format!("netdev_add {netdev_id}"), undo, e).await);
    }
    // netdev_add consumed the named fd; from here the netdev is what to undo.
    let undo = vec![("netdev_del".to_string(), json!({ "id": netdev_id }))];
    if let Err(e) = client.execute("device_add", Some(nic.device.clone())).await {
        return Err(fail(client, &id, format!("device_add {id}"), undo, e).await);
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
        .execute("netdev_del", Some(json!({ "id": nic.netdev_id })))
        .await
        .map_err(step(format!("netdev_del {}", nic.netdev_id)))?;
    Ok(())
}

/// Changes or ejects a cdrom medium (libvirt's sequence for `UpdateDeviceFlags` on a cdrom).
/// If adding or inserting the new medium fails, the new nodes are deleted again; the old medium
/// stays removed (as with libvirt) and the tray is closed.
pub async fn change_cdrom(client: &QmpClient, change: &CdromChange) -> Result<(), QmpError> {
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
        new_top = Some(str_field(bd, "node-name", &format!("new_blockdevs[{i}]"))?);
    }
    client
        .execute(
            "blockdev-open-tray",
            Some(json!({ "id": id, "force": true })),
        )
        .await
        .map_err(step("blockdev-open-tray".into()))?;
    client
        .execute("blockdev-remove-medium", Some(json!({ "id": id })))
        .await
        .map_err(step("blockdev-remove-medium".into()))?;
    if let Some(top) = new_top {
        let mut undo = vec![("blockdev-close-tray".to_string(), json!({ "id": id }))];
        add_blockdevs(client, &id, &change.new_blockdevs, &mut undo).await?;
        if let Err(e) = client
            .execute(
                "blockdev-insert-medium",
                Some(json!({ "id": id, "node-name": top })),
            )
            .await
        {
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
        .execute("blockdev-close-tray", Some(json!({ "id": id })))
        .await
        .map_err(step("blockdev-close-tray".into()))?;
    for node in &change.old_node_names {
        client
            .execute("blockdev-del", Some(json!({ "node-name": node })))
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
    client
        .execute(
            "block_resize",
            Some(json!({ "node-name": node_name, "size": size_bytes })),
        )
        .await
        .map(drop)
}

/// `set_link`: link up or down of a NIC (by device id; KubeVirt's interface `state: down`).
pub async fn set_link(client: &QmpClient, id: &str, up: bool) -> Result<(), QmpError> {
    client
        .execute("set_link", Some(json!({ "name": id, "up": up })))
        .await
        .map(drop)
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
            .execute("qom-list", Some(json!({ "path": container })))
            .await?;
        for child in children.as_array().map(Vec::as_slice).unwrap_or_default() {
            let (Some(name), Some(ty)) = (child["name"].as_str(), child["type"].as_str()) else {
                continue;
            };
            if !ty.starts_with("child<") {
                continue;
            }
            let path = format!("{container}/{name}");
            if ty == "child<pcie-root-port>" && container == "/machine/peripheral" {
                ports.push(name.to_string());
            }
            let bus = client
                .execute(
                    "qom-get",
                    Some(json!({ "path": path, "property": "parent_bus" })),
                )
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
