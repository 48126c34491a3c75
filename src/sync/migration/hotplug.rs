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
//! A NIC hot-plugged into the source (a bridge interface on a Multus network, plugged by diff)
//! is carried the same way. KubeVirt's target virt-handler sets up the target pod's network for
//! every interface of the VMI, the hot-plugged ones included (bridge `k6t-<hash>`, tap
//! `tap<hash>`), and libvirt's migratable XML has the interface with its alias `ua-<name>`, MAC,
//! model and PCI address. Here the source sends each hot-plugged NIC's placement (qdev id, netdev
//! id, bus, address, MAC, model; [`describe_nic`]); the target converts the VMI without those
//! interfaces for the boot argv ([`boot_views`]), makes its own hot-plug plan of each on its own
//! pod's tap (set up, or adopted from virt-handler, as for a first start), checks MAC and model
//! agree and takes the source's bus and address ([`place_nic_like_source`]), and plugs netdev and
//! device before `migrate-incoming`.

use std::collections::{BTreeMap, BTreeSet};

use crate::cmdline::qemu::{node_index, Blockdev, Device};
use crate::cmdline::render::{DiskHotplug, NicHotplug};
use crate::sync::migration::protocol::{HotplugKind, HotpluggedDevice};
use crate::sync::migration::MigrationError;
use crate::sync::recover::argv_device_ids;
use crate::vmi::Vmi;

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

/// The placement of one running disk: its bus (the PCI bus of its address, else a frontend's
/// own bus), address, SCSI LUN, node names (bottom first), serial and read-only flag.
pub fn describe_disk(d: &DiskHotplug) -> HotpluggedDevice {
    HotpluggedDevice {
        kind: HotplugKind::Disk,
        name: d.name.clone(),
        id: d.id.clone(),
        bus: d.device.bus().map(str::to_owned),
        addr: d.device.addr.clone(),
        lun: match &d.device.device {
            Device::DiskFrontend(f) => f.lun.map(u64::from),
            _ => None,
        },
        node_names: d
            .blockdevs
            .iter()
            .map(|b| b.node_name().to_owned())
            .collect(),
        serial: serial(&d.device.device).map(str::to_owned),
        read_only: d
            .blockdevs
            .iter()
            .any(|b| matches!(b, Blockdev::Format(f) if f.read_only)),
        mac: None,
        model: None,
        netdev: None,
    }
}

/// The NICs hot-plugged into the running domain (`running`, as plugged) that are not in the
/// argv QEMU started with (`boot_argv`), with their placement, in interface name order.
pub fn hotplugged_nics<'a>(
    running: impl IntoIterator<Item = &'a NicHotplug>,
    boot_argv: &[String],
) -> Vec<HotpluggedDevice> {
    let at_boot = argv_device_ids(boot_argv);
    running
        .into_iter()
        .filter(|n| !at_boot.contains(&n.id))
        .map(describe_nic)
        .collect()
}

/// The placement of one running NIC: its qdev id and netdev id, PCI bus and address, guest MAC
/// and model (the QEMU driver).
pub fn describe_nic(n: &NicHotplug) -> HotpluggedDevice {
    let (mac, model) = match &n.device.device {
        Device::Nic(d) => (d.mac.clone(), Some(d.driver.to_owned())),
        other => (None, Some(other.driver().to_owned())),
    };
    HotpluggedDevice {
        kind: HotplugKind::Nic,
        name: n.name.clone(),
        id: n.id.clone(),
        bus: n.device.bus.clone(),
        addr: n.device.addr.clone(),
        lun: None,
        node_names: Vec::new(),
        serial: None,
        read_only: false,
        mac,
        model,
        netdev: Some(n.netdev.id.clone()),
    }
}

/// The target's own hot-plug plan of NIC `sent.name` (`local`: its QMP plan's NICs, on its own
/// pod's tap passed by fd), placed as the source runs it: the source's PCI bus and address.
/// Errors (the migration is refused before QEMU starts): the target has no such NIC (the
/// interface is not attached to the target pod), its device id, netdev id, MAC or model differs
/// from the source's, or the bus or address is not a plain word.
pub fn place_nic_like_source(
    local: &[NicHotplug],
    sent: &HotpluggedDevice,
) -> Result<NicHotplug, MigrationError> {
    let refuse = |why: String| {
        MigrationError::Peer(format!(
            "hot-plugged interface {} of the source cannot be recreated here: {why}",
            sent.name
        ))
    };
    let n = local
        .iter()
        .find(|n| n.name == sent.name)
        .ok_or_else(|| refuse("the target pod has no such interface attached".into()))?;
    let mine = describe_nic(n);
    if mine.id != sent.id || mine.netdev != sent.netdev {
        return Err(refuse(format!(
            "device {} netdev {:?} here, device {} netdev {:?} there",
            mine.id, mine.netdev, sent.id, sent.netdev
        )));
    }
    let same_mac = match (&mine.mac, &sent.mac) {
        (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
        _ => false,
    };
    if !same_mac || mine.model != sent.model {
        return Err(refuse(format!(
            "MAC {:?} model {:?} here, MAC {:?} model {:?} there",
            mine.mac, mine.model, sent.mac, sent.model
        )));
    }
    let (Some(bus), Some(addr)) = (&sent.bus, &sent.addr) else {
        return Err(refuse("no PCI bus and address".into()));
    };
    for w in [bus, addr] {
        if !plain(w) {
            return Err(refuse(format!("invalid bus or address {w:?}")));
        }
    }
    let mut placed = n.clone();
    placed.device.bus = Some(bus.clone());
    placed.device.addr = Some(addr.clone());
    Ok(placed)
}

/// The serial of a disk device.
fn serial(d: &Device) -> Option<&str> {
    match d {
        Device::VirtioBlk(b) => b.serial.as_deref(),
        Device::DiskFrontend(f) => f.serial.as_deref(),
        _ => None,
    }
}

/// The VMI as the source converted it when QEMU started: `view` (the VMI as the converter
/// sees it) without the hot-plugged disks of `devices` and their volumes, and without its
/// hot-plugged NICs. A NIC hot-plugged by diff either was not in the spec when QEMU started
/// (the interface and its network are left out) or was in it but not yet attached to the pod
/// (`state: absent` then, as [`crate::sync::facts::secondary::convert_view`] sees a pending
/// one): the two differ in the NIC placeholder count, so with hot-plugged NICs both views are
/// returned, the first as KubeVirt's hotplug flow has it. Without hot-plugged NICs: one view.
pub fn boot_views(view: &Vmi, devices: &[HotpluggedDevice]) -> Vec<Vmi> {
    let hot = |kind: HotplugKind| -> BTreeSet<&str> {
        devices
            .iter()
            .filter(|d| d.kind == kind)
            .map(|d| d.name.as_str())
            .collect()
    };
    let (disks, nics) = (hot(HotplugKind::Disk), hot(HotplugKind::Nic));
    let mut v = view.clone();
    if let Some(d) = v.spec.domain.devices.disks.as_mut() {
        d.retain(|d| !disks.contains(d.name.as_str()));
    }
    if let Some(volumes) = v.spec.volumes.as_mut() {
        volumes.retain(|vol| !disks.contains(vol.name.as_str()));
    }
    if nics.is_empty() {
        return vec![v];
    }
    let mut pending = v.clone();
    for iface in pending.spec.domain.devices.interfaces.iter_mut().flatten() {
        if nics.contains(iface.name.as_str()) {
            iface.state = Some("absent".into());
        }
    }
    if let Some(ifaces) = v.spec.domain.devices.interfaces.as_mut() {
        ifaces.retain(|i| !nics.contains(i.name.as_str()));
    }
    if let Some(networks) = v.spec.networks.as_mut() {
        networks.retain(|n| !nics.contains(n.name.as_str()));
    }
    vec![v, pending]
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
            .any(|n| node_index(n).is_none() || !plain(n))
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
    let mut placed = d.with_nodes_renamed(|n| rename.get(n).map(|s| (*s).to_owned()));
    let device = &mut placed.device;
    match (&mut device.device, device.bus.is_none()) {
        // A frontend on its controller's bus (`scsi0.0`, `usb.0`), not on a PCI address.
        (Device::DiskFrontend(f), true) => {
            f.bus = sent
                .bus
                .clone()
                .ok_or_else(|| refuse(format!("no bus for the {} frontend", f.driver)))?;
        }
        _ => device.bus = sent.bus.clone(),
    }
    device.addr = sent.addr.clone();
    match (&mut device.device, sent.lun) {
        (_, None) => {}
        (Device::DiskFrontend(f), Some(lun)) => {
            f.lun = Some(u32::try_from(lun).map_err(|_| refuse(format!("invalid LUN {lun}")))?);
        }
        (other, Some(lun)) => {
            return Err(refuse(format!(
                "LUN {lun} for a {} device, which has none",
                other.driver()
            )))
        }
    }
    Ok(placed)
}

/// A bus, address or node name word: ASCII letters, digits, `.`, `-`, `_`.
fn plain(w: &str) -> bool {
    !w.is_empty()
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
}

/// The first block node index none of `disks` uses (at least `floor`).
pub fn next_node_after(disks: &BTreeMap<String, DiskHotplug>, floor: u32) -> u32 {
    disks
        .values()
        .flat_map(DiskHotplug::node_indices)
        .map(|n| n + 1)
        .fold(floor, u32::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::qemu::DeviceDiskFrontend;
    use crate::cmdline::render::PlacedDevice;
    use crate::sync::reconcile::disks::fixtures;
    use crate::sync::reconcile::nics::fixtures::nic;

    /// A hot-pluggable virtio disk `name` on nodes `libvirt-<n>-storage` / `-format`, on `bus`.
    fn disk(name: &str, n: u32, bus: &str) -> DiskHotplug {
        DiskHotplug {
            target: Some("vdb".into()),
            ..fixtures::hotplug_disk(
                name,
                n,
                format!("/pod/hotplug-disks/{name}.img"),
                Some("HP1".into()),
                bus,
            )
        }
    }

    /// The same disk as a `scsi-hd` on `scsi0.0`, unit `lun`.
    fn scsi_disk(name: &str, n: u32, lun: u32) -> DiskHotplug {
        let mut d = disk(name, n, "unused");
        d.device = PlacedDevice {
            device: Device::DiskFrontend(DeviceDiskFrontend {
                driver: "scsi-hd",
                bus: "scsi0.0".into(),
                channel: Some(0),
                scsi_id: Some(0),
                lun: Some(lun),
                device_id: Some("HP1".into()),
                port: None,
                removable: None,
                wwn: None,
                share_rw: None,
                drive: Some(format!("libvirt-{n}-format")),
                id: format!("ua-{name}"),
                bootindex: None,
                write_cache: None,
                werror: None,
                rerror: None,
                serial: Some("HP1".into()),
                logical_block_size: None,
                physical_block_size: None,
                discard_granularity: None,
            }),
            iommu_platform: None,
            bus: None,
            addr: None,
        };
        d
    }

    fn drive(d: &DiskHotplug) -> Option<String> {
        d.device.device.clone().drive_mut().cloned()
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
        if let Blockdev::Protocol(p) = &mut local.blockdevs[0] {
            p.filename = "/target/hotplug-disks/hp1.img".into();
        }
        let placed = place_like_source(&[local], &source).unwrap();
        assert_eq!(placed.device.bus.as_deref(), Some("pci.8"));
        assert_eq!(drive(&placed).as_deref(), Some("libvirt-7-format"));
        match &placed.blockdevs[..] {
            [Blockdev::Protocol(p), Blockdev::Format(f)] => {
                assert_eq!(p.filename, "/target/hotplug-disks/hp1.img");
                assert_eq!(p.node_name, "libvirt-7-storage");
                assert_eq!(f.file, "libvirt-7-storage");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(placed.blockdev_del[0].node_name, "libvirt-7-format");
        assert_eq!(describe_disk(&placed), source);
    }

    #[test]
    fn a_scsi_disk_takes_the_sources_controller_bus_and_lun() {
        let source = describe_disk(&scsi_disk("hp1", 7, 2));
        assert_eq!(
            (source.bus.as_deref(), source.addr.as_deref(), source.lun),
            (Some("scsi0.0"), None, Some(2))
        );
        let placed = place_like_source(&[scsi_disk("hp1", 3, 0)], &source).unwrap();
        assert_eq!(describe_disk(&placed), source);
        assert_eq!(placed.device.bus, None);
        assert_eq!(drive(&placed).as_deref(), Some("libvirt-7-format"));
        // A LUN for a virtio disk cannot be placed.
        let mut bad = describe_disk(&disk("hp1", 7, "pci.8"));
        bad.lun = Some(1);
        assert!(place_like_source(&[disk("hp1", 3, "pci.6")], &bad).is_err());
    }

    #[test]
    fn a_disk_that_differs_or_is_missing_is_refused() {
        let source = describe_disk(&disk("hp1", 7, "pci.8"));
        assert!(place_like_source(&[], &source).is_err());
        let mut other = disk("hp1", 3, "pci.6");
        if let Device::VirtioBlk(b) = &mut other.device.device {
            b.serial = Some("OTHER".into());
        }
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
    }

    #[test]
    fn only_nics_missing_from_the_boot_argv_are_hotplugged_nics() {
        let running = [
            nic("boot2", "02:00:00:00:00:01", Some("pci.3")),
            nic("blue", "0a:58:0a:f4:01:07", Some("pci.9")),
        ];
        let argv = vec![
            "-device".to_owned(),
            r#"{"driver":"virtio-net-pci-non-transitional","id":"ua-boot2"}"#.to_owned(),
        ];
        let hot = hotplugged_nics(&running, &argv);
        assert_eq!(hot.len(), 1);
        let h = &hot[0];
        assert_eq!(h.kind, HotplugKind::Nic);
        assert_eq!(
            (h.name.as_str(), h.id.as_str(), h.netdev.as_deref()),
            ("blue", "ua-blue", Some("hostua-blue"))
        );
        assert_eq!(
            (h.bus.as_deref(), h.addr.as_deref()),
            (Some("pci.9"), Some("0x0"))
        );
        assert_eq!(h.mac.as_deref(), Some("0a:58:0a:f4:01:07"));
        assert_eq!(h.model.as_deref(), Some("virtio-net-pci-non-transitional"));
    }

    #[test]
    fn the_targets_nic_takes_the_sources_bus_and_address_after_identity_checks() {
        let source = describe_nic(&nic("blue", "0a:58:0a:f4:01:07", Some("pci.9")));
        // The target's own plan (its tap by fd, the PCI pass's address).
        let local = nic("blue", "0A:58:0A:F4:01:07", Some("pci.4"));
        let placed = place_nic_like_source(std::slice::from_ref(&local), &source).unwrap();
        assert_eq!(placed.device.bus.as_deref(), Some("pci.9"));
        assert_eq!(placed.device.addr.as_deref(), Some("0x0"));
        assert_eq!(placed.netdev, local.netdev);
        assert_eq!(placed.getfd, local.getfd);

        // Missing, another MAC, another model, another netdev, a bad bus: refused.
        assert!(place_nic_like_source(&[], &source).is_err());
        let other_mac = nic("blue", "02:00:00:00:00:99", Some("pci.4"));
        let e = place_nic_like_source(&[other_mac], &source)
            .unwrap_err()
            .to_string();
        assert!(e.contains("MAC"), "{e}");
        let mut other_model = local.clone();
        if let Device::Nic(d) = &mut other_model.device.device {
            d.driver = "e1000e";
        }
        assert!(place_nic_like_source(&[other_model], &source).is_err());
        let mut bad = source.clone();
        bad.netdev = Some("hostua-red".into());
        assert!(place_nic_like_source(std::slice::from_ref(&local), &bad).is_err());
        let mut bad = source.clone();
        bad.bus = Some("pci.9,x=y".into());
        assert!(place_nic_like_source(std::slice::from_ref(&local), &bad).is_err());
        let mut bad = source;
        bad.addr = None;
        assert!(place_nic_like_source(&[local], &bad).is_err());
    }

    #[test]
    fn boot_views_leave_the_hot_plugged_nic_out_or_pending() {
        let vmi: Vmi = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "v"},
            "spec": {
                "domain": {"devices": {
                    "interfaces": [{"name": "default", "masquerade": {}},
                                   {"name": "blue", "bridge": {}}],
                    "disks": [{"name": "root"}, {"name": "hp1"}]
                }},
                "networks": [{"name": "default", "pod": {}},
                             {"name": "blue", "multus": {"networkName": "blue-net"}}],
                "volumes": [{"name": "root", "emptyDisk": {"capacity": "1Gi"}},
                            {"name": "hp1", "emptyDisk": {"capacity": "1Gi"}}]
            }
        }))
        .unwrap();
        let disk = describe_disk(&disk("hp1", 7, "pci.8"));
        let views = boot_views(&vmi, std::slice::from_ref(&disk));
        assert_eq!(views.len(), 1);
        assert_eq!(
            views[0].spec.domain.devices.disks.as_ref().unwrap().len(),
            1
        );
        assert_eq!(
            views[0].spec.domain.devices.interfaces,
            vmi.spec.domain.devices.interfaces
        );

        let blue = describe_nic(&nic("blue", "0a:58:0a:f4:01:07", Some("pci.9")));
        let views = boot_views(&vmi, &[disk, blue]);
        let names = |v: &Vmi| -> Vec<(String, Option<String>)> {
            v.spec
                .domain
                .devices
                .interfaces
                .iter()
                .flatten()
                .map(|i| (i.name.clone(), i.state.clone()))
                .collect()
        };
        assert_eq!(names(&views[0]), vec![("default".to_owned(), None)]);
        assert_eq!(views[0].spec.networks.as_ref().unwrap().len(), 1);
        assert_eq!(
            names(&views[1]),
            vec![
                ("default".to_owned(), None),
                ("blue".to_owned(), Some("absent".to_owned()))
            ]
        );
        assert_eq!(views[1].spec.volumes.as_ref().unwrap().len(), 1);
    }
}
