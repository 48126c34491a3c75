//! Hot-plugged devices across a live migration.
//!
//! A disk hot-plugged into the running source (a KubeVirt hotplug volume, attached by a
//! `SyncVirtualMachine` after the start) is not in the argv QEMU was started with, yet its device
//! state is in the migration stream: the target must have the same device, with the same qdev id
//! on the same bus and address, before `migrate-incoming`. libvirt carries it in the migrated
//! XML, so the target's command line has it (`qemuMigrationSrcBeginPhase`,
//! `qemuMigrationDstPrepare`); KubeVirt's target virt-handler mounts the volume into the target
//! pod before `SyncMigrationTarget` (`migration-target.go`, v1.9.0).
//!
//! qlauncher's target never runs words it received: the source sends the placement of each
//! hot-plugged disk ([`HotpluggedDevice`]); the target converts the VMI itself, once without
//! those disks (which must then equal the source's boot argv) and once with them (its own
//! hot-plug plan, with the image path in its own pod), takes the source's bus, address and node
//! names for them after checking serial and read-only agree, and attaches them to its
//! `-S -incoming defer` QEMU before `migrate-incoming`.
//!
//! Hot-plugged NICs are not carried yet: the target's conversion has the NIC at boot while the
//! source's boot argv lacks it, so the argv comparison refuses the migration before QEMU starts;
//! a definition listing a NIC is refused by [`refuse_hotplugged_nics`].

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::cmdline::render::DiskHotplug;
use crate::sync::migration::protocol::{HotplugKind, HotpluggedDevice};
use crate::sync::migration::MigrationError;
use crate::sync::reconcile::disks::node_indices;
use crate::vmi::Vmi;

/// The qdev ids of the `-device` words of `argv` (each a JSON object, as the argv renderer
/// writes them).
pub fn argv_device_ids(argv: &[String]) -> BTreeSet<String> {
    argv.windows(2)
        .filter(|w| w[0] == "-device")
        .filter_map(|w| serde_json::from_str::<Value>(&w[1]).ok())
        .filter_map(|v| v["id"].as_str().map(str::to_owned))
        .collect()
}

/// The hot-pluggable disks of the running domain (`running`, by device id) that are not in the
/// argv QEMU started with (`boot_argv`): the disks hot-plugged since, with their placement as
/// they run, in device id order.
pub fn hotplugged_disks(
    running: &BTreeMap<String, DiskHotplug>,
    boot_argv: &[String],
) -> Vec<HotpluggedDevice> {
    let at_boot = argv_device_ids(boot_argv);
    running
        .values()
        .filter(|d| !at_boot.contains(&d.id))
        .map(describe_disk)
        .collect()
}

/// The placement of one running disk.
pub fn describe_disk(d: &DiskHotplug) -> HotpluggedDevice {
    let s = |k: &str| d.device[k].as_str().map(str::to_owned);
    HotpluggedDevice {
        kind: HotplugKind::Disk,
        name: d.name.clone(),
        id: d.id.clone(),
        bus: s("bus"),
        addr: s("addr"),
        lun: d.device["lun"].as_u64(),
        node_names: node_names(d),
        serial: s("serial"),
        read_only: read_only(d),
        mac: None,
    }
}

fn node_names(d: &DiskHotplug) -> Vec<String> {
    d.blockdevs
        .iter()
        .filter_map(|b| b["node-name"].as_str().map(str::to_owned))
        .collect()
}

fn read_only(d: &DiskHotplug) -> bool {
    d.blockdevs
        .iter()
        .any(|b| b["read-only"].as_bool() == Some(true))
}

/// Fails when the source's definition lists a hot-plugged NIC (not carried by this version).
pub fn refuse_hotplugged_nics(devices: &[HotpluggedDevice]) -> Result<(), MigrationError> {
    match devices.iter().find(|d| d.kind == HotplugKind::Nic) {
        Some(d) => Err(MigrationError::Peer(format!(
            "interface {} was hot-plugged into the running domain; qlauncher cannot migrate \
             hot-plugged interfaces yet",
            d.name
        ))),
        None => Ok(()),
    }
}

/// `view` (the VMI as the converter sees it) without the hot-plugged disks of `devices` and
/// their volumes: the VMI as the source converted it when QEMU started.
pub fn boot_view(view: &Vmi, devices: &[HotpluggedDevice]) -> Vmi {
    let hot: BTreeSet<&str> = devices
        .iter()
        .filter(|d| d.kind == HotplugKind::Disk)
        .map(|d| d.name.as_str())
        .collect();
    let mut v = view.clone();
    if let Some(disks) = v.spec.domain.devices.disks.as_mut() {
        disks.retain(|d| !hot.contains(d.name.as_str()));
    }
    if let Some(volumes) = v.spec.volumes.as_mut() {
        volumes.retain(|vol| !hot.contains(vol.name.as_str()));
    }
    v
}

/// The target's own hot-plug plan of disk `sent.name` (`local`, from converting the VMI with
/// its hotplug volumes), placed as the source runs it: the source's bus, address, LUN and block
/// node names. Errors (the migration is refused before QEMU starts): the target has no such
/// disk, its serial, read-only flag, device id or node count differs from the source's, or a
/// name the source sent is not a `libvirt-<N>-` node name or a plain bus word.
pub fn place_like_source(
    local: &[DiskHotplug],
    sent: &HotpluggedDevice,
) -> Result<DiskHotplug, MigrationError> {
    let refuse = |why: String| {
        MigrationError::Peer(format!(
            "hot-plugged disk {} of the source cannot be recreated here: {why}",
            sent.name
        ))
    };
    let d = local
        .iter()
        .find(|d| d.name == sent.name)
        .ok_or_else(|| refuse("the target pod has no such hotplug volume ready".into()))?;
    let mine = describe_disk(d);
    if mine.id != sent.id {
        return Err(refuse(format!(
            "device id {} here, {} there",
            mine.id, sent.id
        )));
    }
    if mine.serial != sent.serial || mine.read_only != sent.read_only {
        return Err(refuse(format!(
            "serial {:?} read-only {} here, serial {:?} read-only {} there",
            mine.serial, mine.read_only, sent.serial, sent.read_only
        )));
    }
    if mine.node_names.len() != sent.node_names.len()
        || sent
            .node_names
            .iter()
            .any(|n| node_indices(n).len() != 1 || !n.starts_with("libvirt-") || !plain(n))
    {
        return Err(refuse(format!(
            "block nodes {:?} here, {:?} there",
            mine.node_names, sent.node_names
        )));
    }
    for w in [&sent.bus, &sent.addr].into_iter().flatten() {
        if !plain(w) {
            return Err(refuse(format!("invalid bus or address {w:?}")));
        }
    }
    // Node names: each of ours replaced by the source's at the same position.
    let rename: BTreeMap<&str, &str> = mine
        .node_names
        .iter()
        .map(String::as_str)
        .zip(sent.node_names.iter().map(String::as_str))
        .collect();
    let renamed = |v: &Value| -> Value { rename_nodes(v, &rename) };
    let mut device = renamed(&d.device);
    for (key, value) in [("bus", &sent.bus), ("addr", &sent.addr)] {
        match value {
            Some(x) => device[key] = x.clone().into(),
            None => {
                if let Some(o) = device.as_object_mut() {
                    o.remove(key);
                }
            }
        }
    }
    if let Some(lun) = sent.lun {
        device["lun"] = lun.into();
    }
    Ok(DiskHotplug {
        blockdevs: d.blockdevs.iter().map(renamed).collect(),
        device,
        blockdev_del: d.blockdev_del.iter().map(renamed).collect(),
        ..d.clone()
    })
}

/// A bus, address or node name word: ASCII letters, digits, `.`, `-`, `_`.
fn plain(w: &str) -> bool {
    !w.is_empty()
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
}

/// `v` with every string equal to a key of `rename` replaced by its value.
fn rename_nodes(v: &Value, rename: &BTreeMap<&str, &str>) -> Value {
    match v {
        Value::String(s) => {
            Value::String(rename.get(s.as_str()).map_or(s.clone(), |n| (*n).into()))
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| rename_nodes(x, rename)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (k.clone(), rename_nodes(x, rename)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The first block node index none of `disks` uses (at least `floor`).
pub fn next_node_after(disks: &BTreeMap<String, DiskHotplug>, floor: u32) -> u32 {
    disks
        .values()
        .flat_map(node_names_of)
        .flat_map(|n| node_indices(&n))
        .map(|n| n + 1)
        .fold(floor, u32::max)
}

fn node_names_of(d: &DiskHotplug) -> Vec<String> {
    node_names(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn disk(name: &str, n: u32, bus: &str) -> DiskHotplug {
        DiskHotplug {
            name: name.into(),
            id: format!("ua-{name}"),
            target: Some("vdb".into()),
            blockdevs: vec![
                json!({"node-name": format!("libvirt-{n}-storage"), "driver": "file",
                       "filename": format!("/pod/hotplug-disks/{name}.img")}),
                json!({"node-name": format!("libvirt-{n}-format"), "driver": "raw",
                       "file": format!("libvirt-{n}-storage"), "read-only": false}),
            ],
            device: json!({"driver": "virtio-blk-pci", "id": format!("ua-{name}"),
                           "bus": bus, "addr": "0x0", "drive": format!("libvirt-{n}-format"),
                           "serial": "HP1"}),
            device_del: json!({"id": format!("ua-{name}")}),
            blockdev_del: vec![
                json!({"node-name": format!("libvirt-{n}-format")}),
                json!({"node-name": format!("libvirt-{n}-storage")}),
            ],
        }
    }

    #[test]
    fn only_disks_missing_from_the_boot_argv_are_hotplugged() {
        let running: BTreeMap<String, DiskHotplug> =
            [disk("boot", 2, "pci.5"), disk("hp1", 7, "pci.8")]
                .into_iter()
                .map(|d| (d.id.clone(), d))
                .collect();
        let argv = vec![
            "-device".to_owned(),
            r#"{"driver":"virtio-blk-pci","id":"ua-boot","bus":"pci.5"}"#.to_owned(),
        ];
        let hot = hotplugged_disks(&running, &argv);
        assert_eq!(hot.len(), 1);
        let h = &hot[0];
        assert_eq!(
            (h.id.as_str(), h.bus.as_deref(), h.addr.as_deref()),
            ("ua-hp1", Some("pci.8"), Some("0x0"))
        );
        assert_eq!(h.node_names, ["libvirt-7-storage", "libvirt-7-format"]);
        assert_eq!(h.serial.as_deref(), Some("HP1"));
        assert!(!h.read_only);
        assert_eq!(next_node_after(&running, 3), 8);
    }

    #[test]
    fn the_targets_disk_takes_the_sources_placement_and_keeps_its_own_path() {
        let source = describe_disk(&disk("hp1", 7, "pci.8"));
        let mut local = disk("hp1", 3, "pci.6");
        local.blockdevs[0]["filename"] = "/target/hotplug-disks/hp1.img".into();
        let placed = place_like_source(&[local], &source).unwrap();
        assert_eq!(placed.device["bus"], "pci.8");
        assert_eq!(placed.device["drive"], "libvirt-7-format");
        assert_eq!(
            placed.blockdevs[0]["filename"],
            "/target/hotplug-disks/hp1.img"
        );
        assert_eq!(placed.blockdevs[1]["file"], "libvirt-7-storage");
        assert_eq!(placed.blockdev_del[0]["node-name"], "libvirt-7-format");
        assert_eq!(describe_disk(&placed), source);
    }

    #[test]
    fn a_disk_that_differs_or_is_missing_is_refused() {
        let source = describe_disk(&disk("hp1", 7, "pci.8"));
        assert!(place_like_source(&[], &source).is_err());
        let mut other = disk("hp1", 3, "pci.6");
        other.device["serial"] = "OTHER".into();
        let e = place_like_source(&[other], &source)
            .unwrap_err()
            .to_string();
        assert!(e.contains("serial"), "{e}");
        let mut bad = source.clone();
        bad.bus = Some("pci.8,x=y".into());
        assert!(place_like_source(&[disk("hp1", 3, "pci.6")], &bad).is_err());
        let mut bad = source.clone();
        bad.node_names[0] = "evil".into();
        assert!(place_like_source(&[disk("hp1", 3, "pci.6")], &bad).is_err());
        let nic = HotpluggedDevice {
            kind: HotplugKind::Nic,
            ..source
        };
        assert!(refuse_hotplugged_nics(&[nic]).is_err());
    }
}
