//! The `api.Domain` spec of a defined plan: the converter's model rendered as KubeVirt's JSON
//! (`qlauncher_libvirt_xml::to_api_spec`, the same model the libvirt XML export writes) and
//! KubeVirt's grace-period metadata, and [`qemu_pci_address`], a running device's place as an
//! `api.Address`. What QEMU reports into a running domain's spec (hot-plugged devices'
//! addresses, the resolved machine, channel states) is added by `domain_live.rs`.
//!
//! Identity of running devices: libvirt's live XML keeps each device's address, alias and target
//! from the moment it was created; a hotplug adds a device and changes no other. A re-converted plan
//! numbers PCI slots, SCSI units and targets afresh, so [`apply_converted`] carries over every
//! device's identity from the spec it replaces ([`carry_identity`]); [`added_pci_devices`] and
//! [`set_device_address`] let `domain_live.rs` put the devices a hotplug added where QEMU did.

use serde_json::Value;
use tracing::warn;

use crate::cmdline::{ConverterContext, DomainPlan};
use crate::qmp::client::QmpClient;
use crate::qmp::commands::QomGet;
use crate::sync::domain::identity::{Address, DeviceIdentity, DeviceKey};
use crate::sync::domain::{ApiDomain, ApiDomainSpec, Devices, GracePeriodMetadata};
use crate::sync::error::SyncError;
use crate::vmi::Vmi;

/// Device lists QEMU cannot change while running, kept whole once reported (hotplug adds ports'
/// devices, never ports: the spare root ports were made at start).
const FIXED_LISTS: [&str; 1] = ["Controllers"];

/// KubeVirt's grace period when the VMI sets none (`v1.DefaultGracePeriodSeconds`).
pub const DEFAULT_GRACE_PERIOD_SECONDS: i64 = 30;

/// Replaces `domain`'s spec with the converter's for `vmi` (the VMI the plan was converted from)
/// and sets the grace-period metadata.
///
/// SR-IOV VFs are live state, as in libvirt's live XML: the first conversion lists the plan's
/// (QEMU starts with them); a re-conversion keeps the VFs the spec it replaces lists (plugged
/// by `HotplugHostDevices`, or unplugged for a migration), whatever the plan says, so
/// virt-handler sees a VF missing exactly when QEMU lacks it.
///
/// # Errors
/// [`SyncError::DomainSpec`]: the exporter cannot write the plan (a device it has no element
/// for, host hardware it does not model), or its JSON does not decode as `api.DomainSpec`;
/// `domain` is unchanged then.
pub(crate) fn apply_converted(
    domain: &mut ApiDomain,
    vmi: &Vmi,
    ctx: &ConverterContext,
    plan: &DomainPlan,
) -> Result<(), SyncError> {
    let previous = domain.spec.clone();
    // Every converted spec has controllers (the USB controller at least).
    let reconverted = previous.devices.rest.contains_key("Controllers");
    let api = qlauncher_libvirt_xml::export(vmi, ctx, plan)
        .and_then(|d| qlauncher_libvirt_xml::to_api_spec(&d))
        .map_err(|e| SyncError::DomainSpec(Box::new(e)))?;
    domain
        .spec
        .set_converted(api.spec)
        .map_err(|e| SyncError::DomainSpec(Box::new(e)))?;
    if domain.spec.domain_type.is_empty() {
        domain.spec.domain_type = if ctx.kvm { "kvm" } else { "qemu" }.into();
    }
    // libvirt reports the current memory next to the memory (`<currentMemory>`).
    if !domain.spec.rest.contains_key("CurrentMemory") {
        if let Some(memory) = domain.spec.rest.get("Memory").cloned() {
            domain.spec.rest.insert("CurrentMemory".into(), memory);
        }
    }
    let seconds = vmi
        .spec
        .termination_grace_period_seconds
        .unwrap_or(DEFAULT_GRACE_PERIOD_SECONDS);
    let grace = domain
        .spec
        .metadata
        .kubevirt
        .grace_period
        .get_or_insert_with(GracePeriodMetadata::default);
    grace.deletion_grace_period_seconds = seconds;
    carry_identity(&previous, &mut domain.spec);
    if reconverted {
        // The virtio-mem device is live state (plugged by SyncVirtualMachineMemory), as SR-IOV
        // VFs are below.
        if let Some(memory) = previous.devices.rest.get("Memory") {
            domain
                .spec
                .devices
                .rest
                .insert("Memory".into(), memory.clone());
        }
        let devices = &mut domain.spec.devices;
        devices.drop_sriov_host_devices();
        let live = previous
            .devices
            .host_devices
            .iter()
            .filter(|h| h.is_sriov());
        devices.host_devices.extend(live.cloned());
    }
    Ok(())
}

/// Gives the devices of `next` (a re-converted spec) the identity they have in `previous` (the
/// spec the running domain was reported with): for each device found in both (by its
/// [`DeviceKey`]: alias, else type and rank), its [`DeviceIdentity`]; the `Controllers` list
/// whole; the domain UUID. A device new in `next` keeps what the converter gave it. `previous`
/// empty (a first report): nothing changes.
pub(crate) fn carry_identity(previous: &ApiDomainSpec, next: &mut ApiDomainSpec) {
    if !previous.uuid.is_empty() {
        next.uuid = previous.uuid.clone();
    }
    let (Ok(Value::Object(old)), Ok(Value::Object(mut new))) = (
        serde_json::to_value(&previous.devices),
        serde_json::to_value(&next.devices),
    ) else {
        return;
    };
    if old.is_empty() {
        return;
    }
    for (list, value) in new.iter_mut() {
        let Some(before) = old.get(list) else {
            continue;
        };
        if FIXED_LISTS.contains(&list.as_str()) {
            *value = before.clone();
            continue;
        }
        match (value, before) {
            (Value::Array(devices), Value::Array(before)) => {
                let keys_before = DeviceKey::of_list(before);
                let keys = DeviceKey::of_list(devices);
                for (device, key) in devices.iter_mut().zip(&keys) {
                    if let Some(i) = keys_before.iter().position(|k| k == key) {
                        DeviceIdentity::of(&before[i]).write_into(device);
                    }
                }
            }
            (device @ Value::Object(_), before @ Value::Object(_)) => {
                DeviceIdentity::of(before).write_into(device);
            }
            _ => {}
        }
    }
    match serde_json::from_value::<Devices>(Value::Object(new)) {
        Ok(devices) => next.devices = devices,
        Err(e) => warn!(error = %e, "cannot keep the running devices' identity"),
    }
}

/// Every device of `spec`, each list's and the single ones, as KubeVirt's JSON.
fn all_devices(spec: &ApiDomainSpec) -> Vec<Value> {
    let Ok(Value::Object(devices)) = serde_json::to_value(&spec.devices) else {
        return Vec::new();
    };
    devices
        .into_iter()
        .flat_map(|(_, v)| match v {
            Value::Array(list) => list,
            other => vec![other],
        })
        .collect()
}

/// The QEMU ids of the PCI devices (disks, interfaces, host devices...) `after` has and `before`
/// had not: the devices a hotplug added.
pub(crate) fn added_pci_devices(before: &ApiDomainSpec, after: &ApiDomainSpec) -> Vec<String> {
    let known: Vec<String> = all_devices(before)
        .iter()
        .filter_map(|d| DeviceIdentity::of(d).qemu_id())
        .collect();
    all_devices(after)
        .iter()
        .map(DeviceIdentity::of)
        .filter(|id| id.address.as_ref().is_some_and(Address::is_pci))
        .filter_map(|id| id.qemu_id())
        .filter(|id| !known.contains(id))
        .collect()
}

/// Sets the `Address` of the device whose QEMU id is `id`. True when it changed.
pub(crate) fn set_device_address(spec: &mut ApiDomainSpec, id: &str, address: &Address) -> bool {
    let Ok(Value::Object(mut devices)) = serde_json::to_value(&spec.devices) else {
        return false;
    };
    let mut changed = false;
    for value in devices.values_mut() {
        let list: Vec<&mut Value> = match value {
            Value::Array(list) => list.iter_mut().collect(),
            other => vec![other],
        };
        for device in list {
            let mut identity = DeviceIdentity::of(device);
            if identity.qemu_id().as_deref() == Some(id)
                && identity.address.as_ref() != Some(address)
            {
                identity.address = Some(address.clone());
                identity.write_into(device);
                changed = true;
            }
        }
    }
    if changed {
        match serde_json::from_value::<Devices>(Value::Object(devices)) {
            Ok(d) => spec.devices = d,
            Err(_) => return false,
        }
    }
    changed
}

/// Where QEMU has the PCI device `id`, as an `api.Address` (`Bus` is libvirt's controller index:
/// the `N` of root port `pci.N`, 0 on `pcie.0`). `None` when QEMU does not answer (unplugged
/// meanwhile, or not a PCI device).
pub(crate) async fn qemu_pci_address(client: &QmpClient, id: &str) -> Option<Address> {
    let path = format!("/machine/peripheral/{id}");
    let get = |property: &'static str| QomGet {
        path: path.clone(),
        property: property.into(),
    };
    let bus = client.run(&get("parent_bus")).await.ok()?;
    let devfn = client.run(&get("addr")).await.ok()?;
    pci_address(bus.as_str()?, &devfn)
}

/// The `api.Address` of a device on QOM bus `parent_bus` (`/machine/peripheral/pci.5/pci.5`,
/// `/machine/q35/pcie.0`) at `addr` (QEMU 7.2 answers the devfn as a number: 34 is slot 4
/// function 2; a `04.2` string is read too).
fn pci_address(parent_bus: &str, addr: &Value) -> Option<Address> {
    let bus = parent_bus.rsplit('/').next()?;
    let bus: u32 = match bus.strip_prefix("pci.") {
        Some(n) => n.parse().ok()?,
        None if bus.starts_with("pcie.") => 0,
        None => return None,
    };
    let devfn = match addr {
        Value::Number(n) => u32::try_from(n.as_u64()?).ok()?,
        Value::String(s) => {
            let (slot, function) = s.split_once('.').unwrap_or((s, "0"));
            u32::from_str_radix(slot, 16).ok()? << 3 | u32::from_str_radix(function, 16).ok()?
        }
        _ => return None,
    };
    Some(Address::pci(bus, devfn >> 3, devfn & 7))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::context::{IfaceFacts, ImageFormat, StorageKind, TapSource, VolumeFacts};
    use crate::cmdline::convert;
    use serde_json::json;

    fn vmi(hotplugged: bool) -> Vmi {
        let mut disks = vec![
            json!({"name": "rootdisk", "disk": {"bus": "virtio"}}),
            json!({"name": "data", "disk": {"bus": "virtio"}}),
        ];
        let mut volumes = vec![
            json!({"name": "rootdisk", "containerDisk": {"image": "guest"}}),
            json!({"name": "data", "emptyDisk": {"capacity": "1Gi"}}),
        ];
        let mut interfaces = vec![json!({"name": "default", "masquerade": {}})];
        let mut networks = vec![json!({"name": "default", "pod": {}})];
        if hotplugged {
            // Listed first: a fresh conversion would give them the lowest slots.
            disks.insert(0, json!({"name": "hp1", "disk": {"bus": "virtio"}}));
            volumes.insert(
                0,
                json!({"name": "hp1", "persistentVolumeClaim": {"claimName": "hp1", "hotpluggable": true}}),
            );
            interfaces.insert(0, json!({"name": "blue", "bridge": {}}));
            networks.insert(
                0,
                json!({"name": "blue", "multus": {"networkName": "blue-net"}}),
            );
        }
        let vmi = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm", "namespace": "default", "uid": "uid-1"},
            "spec": {
                "domain": {
                    "firmware": {"uuid": "5d307ca9-b3ef-428c-8861-06e72d69f223"},
                    "resources": {"requests": {"memory": "256Mi"}},
                    "devices": {"disks": disks, "interfaces": interfaces, "rng": {}}
                },
                "networks": networks,
                "volumes": volumes
            },
            "status": {"volumeStatus": if hotplugged {
                json!([{"name": "hp1", "target": "", "phase": "Ready", "hotplugVolume": {}}])
            } else {
                json!([])
            }}
        });
        let mut vmi = Vmi::from_json_or_yaml(&vmi.to_string()).unwrap();
        vmi.apply_defaults(&crate::vmi::DefaultsConfig::for_vmi(&vmi));
        vmi
    }

    fn ctx() -> ConverterContext {
        let mut ctx = ConverterContext::default();
        for (name, mac, fd) in [
            ("default", "0a:58:0a:00:00:02", 7),
            ("blue", "02:00:00:00:00:0b", 9),
        ] {
            ctx.interfaces.insert(
                name.into(),
                IfaceFacts {
                    mac: Some(mac.into()),
                    mtu: Some(1400),
                    tap: TapSource::Fds {
                        fds: vec![fd],
                        vhostfds: vec![],
                    },
                },
            );
        }
        for name in ["rootdisk", "data", "hp1"] {
            ctx.volumes.insert(
                name.into(),
                VolumeFacts {
                    kind: StorageKind::File,
                    format: ImageFormat::Raw,
                    virtual_size: Some(1 << 30),
                    direct_io: true,
                    preallocated: false,
                    cbt_overlay: false,
                },
            );
        }
        ctx
    }

    fn reported(vmi: &Vmi, domain: &mut ApiDomain) -> Value {
        let plan = convert(vmi, &ctx()).unwrap();
        apply_converted(domain, vmi, &ctx(), &plan).unwrap();
        serde_json::to_value(&domain.spec.devices).unwrap()
    }

    /// Every device's address and alias, by list and rank.
    fn identities(devices: &Value) -> Vec<(String, Value, Value)> {
        let mut out = Vec::new();
        for (list, value) in devices.as_object().unwrap() {
            let items = match value {
                Value::Array(items) => items.clone(),
                other => vec![other.clone()],
            };
            for item in items {
                out.push((list.clone(), item["Alias"].clone(), item["Address"].clone()));
            }
        }
        out
    }

    fn sriov_vmi() -> Vmi {
        let v = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm", "namespace": "default", "uid": "uid-1"},
            "spec": {
                "domain": {
                    "resources": {"requests": {"memory": "256Mi"}},
                    "devices": {
                        "gpus": [{"name": "gpu1", "deviceName": "nvidia.com/GA102GL_A10"}],
                        "interfaces": [{"name": "vf", "sriov": {}, "bootOrder": 2}],
                        "autoattachPodInterface": false
                    }
                },
                "networks": [{"name": "vf", "multus": {"networkName": "sriov-net"}}]
            }
        });
        let mut vmi = Vmi::from_json_or_yaml(&v.to_string()).unwrap();
        vmi.apply_defaults(&crate::vmi::DefaultsConfig::for_vmi(&vmi));
        vmi
    }

    fn sriov_ctx() -> ConverterContext {
        use crate::cmdline::context::HostDeviceSource;
        let mut ctx = ConverterContext::default();
        ctx.host_devices.insert(
            "ua-gpu-gpu1".into(),
            HostDeviceSource::Pci("0000:65:00.0".into()),
        );
        ctx.host_devices.insert(
            "ua-sriov-vf".into(),
            HostDeviceSource::Pci("0000:3b:02.3".into()),
        );
        ctx
    }

    fn host_device_aliases(domain: &ApiDomain) -> Vec<String> {
        let devices = &domain.spec.devices.host_devices;
        devices
            .iter()
            .map(|h| h.alias.as_ref().unwrap().name.clone())
            .collect()
    }

    /// A virtiofs share is in the reported domain as KubeVirt's converter writes it (socket, tag,
    /// queue; no address in Go's type), and a plan the `api.Domain` cannot show is an error,
    /// never a partial domain.
    #[test]
    fn filesystems_are_reported_and_an_unshown_plan_is_refused() {
        let vmi = json!({
            "metadata": {"name": "vm", "namespace": "default", "uid": "uid-1"},
            "spec": {
                "domain": {
                    "resources": {"requests": {"memory": "256Mi"}},
                    "devices": {"disks": [{"name": "rootdisk", "disk": {"bus": "virtio"}}],
                        "filesystems": [{"name": "data", "virtiofs": {}}]}
                },
                "volumes": [{"name": "rootdisk", "persistentVolumeClaim": {"claimName": "r"}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]
            }
        });
        let mut vmi = Vmi::from_json_or_yaml(&vmi.to_string()).unwrap();
        vmi.apply_defaults(&crate::vmi::DefaultsConfig::for_vmi(&vmi));
        let mut ctx = ctx();
        ctx.virtiofs_ready.insert("data".into());
        let plan = convert(&vmi, &ctx).unwrap();
        let mut domain = ApiDomain::for_vmi("default", "vm", "uid-1");
        apply_converted(&mut domain, &vmi, &ctx, &plan).unwrap();
        let json = serde_json::to_value(&domain.spec.devices).unwrap();
        let fs = &json["Filesystems"][0];
        assert_eq!(fs["Type"], "mount");
        assert_eq!(fs["Driver"], json!({"Type": "virtiofs", "Queue": "1024"}));
        assert_eq!(fs["Target"], json!({"Dir": "data"}));
        assert!(fs["Source"]["Socket"]
            .as_str()
            .unwrap()
            .ends_with("/data.sock"));
        assert!(fs.get("Address").is_none(), "{fs}");

        // The same plan with its virtiofsd socket missing: the exporter refuses, the domain
        // keeps what it had.
        let mut plan = plan;
        for h in &mut plan.hardware {
            h.missing = Some("the virtiofs container has not created it".into());
        }
        let before = domain.clone();
        let e = apply_converted(&mut domain, &vmi, &ctx, &plan).unwrap_err();
        assert!(matches!(e, SyncError::DomainSpec(_)), "{e}");
        assert_eq!(domain, before);
    }

    /// With CBT Initializing, a PVC disk is reported as KubeVirt's `convertVolumeWithCBT` writes
    /// it: `Source.File` = the overlay and `Source.DataStore` = the raw volume image, which is
    /// what virt-handler's `HandleChangedBlockTracking` waits for (by alias) before it sets `Enabled`.
    #[test]
    fn cbt_disks_report_their_overlay_and_data_store() {
        let vmi = json!({
            "metadata": {"name": "vm", "namespace": "default", "uid": "uid-1"},
            "spec": {
                "domain": {
                    "resources": {"requests": {"memory": "256Mi"}},
                    "devices": {"disks": [{"name": "rootdisk", "disk": {"bus": "virtio"}}]}
                },
                "volumes": [{"name": "rootdisk", "persistentVolumeClaim": {"claimName": "r"}}]
            },
            "status": {"changedBlockTracking": {"state": "Initializing"}}
        });
        let mut vmi = Vmi::from_json_or_yaml(&vmi.to_string()).unwrap();
        vmi.apply_defaults(&crate::vmi::DefaultsConfig::for_vmi(&vmi));
        let ctx = ctx();
        let plan = convert(&vmi, &ctx).unwrap();
        let mut domain = ApiDomain::for_vmi("default", "vm", "uid-1");
        apply_converted(&mut domain, &vmi, &ctx, &plan).unwrap();
        let json = serde_json::to_value(&domain.spec.devices).unwrap();
        let disk = &json["Disks"][0];
        assert_eq!(disk["Type"], "file", "{disk}");
        assert_eq!(disk["Driver"]["Type"], "qcow2", "{disk}");
        assert_eq!(disk["Alias"]["Name"], "rootdisk", "{disk}");
        assert_eq!(
            disk["Source"],
            json!({
                "File": "/var/run/kubevirt-private/libvirt/qemu/cbt/rootdisk.qcow2",
                "DataStore": {"Type": "file", "Format": {"Type": "raw"},
                    "Source": {"File": "/var/run/kubevirt-private/vmi-disks/rootdisk/disk.img"}}
            }),
            "{disk}"
        );
        assert!(disk.get("BackingStore").is_none(), "{disk}");
    }

    /// The first report lists the plan's host devices with their source, alias, boot order and
    /// guest address; later re-conversions keep the SR-IOV VFs as the running domain has them
    /// (unplugged for a migration: gone until `HotplugHostDevices` lists them again).
    #[test]
    fn host_devices_are_reported_and_sriov_vfs_stay_live_state() {
        let vmi = sriov_vmi();
        let ctx = sriov_ctx();
        let plan = convert(&vmi, &ctx).unwrap();
        let mut domain = ApiDomain::for_vmi("default", "vm", "uid-1");
        apply_converted(&mut domain, &vmi, &ctx, &plan).unwrap();
        assert_eq!(host_device_aliases(&domain), ["gpu-gpu1", "sriov-vf"]);
        let json = serde_json::to_value(&domain.spec.devices).unwrap();
        let vf = &json["HostDevices"][1];
        assert_eq!(vf["Type"], "pci");
        assert_eq!(vf["Managed"], "no");
        assert_eq!(vf["Mode"], "subsystem");
        assert_eq!(
            vf["Source"]["Address"],
            json!({"Domain": "0x0000", "Bus": "0x3b", "Slot": "0x02", "Function": "0x3"})
        );
        assert_eq!(vf["BootOrder"], json!({"Order": 2}));
        assert_eq!(vf["Address"]["Type"], "pci");
        assert_eq!(
            vf["Alias"],
            json!({"Name": "sriov-vf", "UserDefined": true})
        );

        // A resync of the same VMI changes nothing.
        let before = domain.spec.clone();
        apply_converted(&mut domain, &vmi, &ctx, &plan).unwrap();
        assert_eq!(domain.spec, before);

        // Unplugged for a migration that then failed: a re-conversion does not bring it back.
        assert!(domain.spec.devices.drop_sriov_host_devices());
        assert!(!domain.spec.devices.drop_sriov_host_devices());
        apply_converted(&mut domain, &vmi, &ctx, &plan).unwrap();
        assert_eq!(host_device_aliases(&domain), ["gpu-gpu1"]);

        // Plugged again by `HotplugHostDevices`: kept as it was listed.
        let mut replugged = before.devices.host_devices[1].clone();
        replugged.rest.remove("BootOrder");
        domain.spec.devices.host_devices.push(replugged.clone());
        apply_converted(&mut domain, &vmi, &ctx, &plan).unwrap();
        assert_eq!(host_device_aliases(&domain), ["gpu-gpu1", "sriov-vf"]);
        assert_eq!(domain.spec.devices.host_devices[1], replugged);
    }

    #[test]
    fn a_hotplug_changes_no_other_devices_address_alias_or_target() {
        let mut domain = ApiDomain::for_vmi("default", "vm", "uid-1");
        let boot = reported(&vmi(false), &mut domain);
        let boot_ids = identities(&boot);
        assert!(
            boot_ids
                .iter()
                .filter(|(_, _, a)| a["Type"] == "pci")
                .count()
                >= 4
        );

        // The same VMI with a disk and a NIC more, converted afresh: its own slots move.
        let mut fresh = ApiDomain::for_vmi("default", "vm", "uid-1");
        let fresh_ids = identities(&reported(&vmi(true), &mut fresh));
        let moved = boot_ids
            .iter()
            .filter(|b| b.1.is_object() && !fresh_ids.contains(b));
        assert!(
            moved.count() > 0,
            "the fixture must renumber: {fresh_ids:#?}"
        );

        let after = reported(&vmi(true), &mut domain);
        let after_ids = identities(&after);
        for id in &boot_ids {
            assert!(after_ids.contains(id), "{id:?} changed: {after_ids:#?}");
        }
        for (i, disk) in boot["Disks"].as_array().unwrap().iter().enumerate() {
            let name = &disk["Alias"]["Name"];
            let now = after["Disks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| &d["Alias"]["Name"] == name);
            assert_eq!(now.unwrap()["Target"], disk["Target"], "disk {i}");
        }
        assert_eq!(after["Controllers"], boot["Controllers"]);
        for name in ["hp1", "blue"] {
            assert!(
                after_ids.iter().any(|(_, alias, _)| alias["Name"] == name),
                "{name} is reported: {after_ids:#?}"
            );
        }

        // The added devices get the address QEMU gave them.
        let added = added_pci_devices(
            &serde_json::from_value::<ApiDomainSpec>(json!({"Devices": boot})).unwrap(),
            &domain.spec,
        );
        assert_eq!(added.len(), 2, "{added:?}");
        assert!(added.contains(&"ua-hp1".to_owned()) && added.contains(&"ua-blue".to_owned()));
        let port = Address::pci(11, 0, 0);
        assert!(set_device_address(&mut domain.spec, "ua-hp1", &port));
        assert!(!set_device_address(&mut domain.spec, "ua-hp1", &port));
        let port = serde_json::to_value(&port).unwrap();
        let json = serde_json::to_value(&domain.spec.devices).unwrap();
        let hp1 = json["Disks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["Alias"]["Name"] == "hp1");
        assert_eq!(hp1.unwrap()["Address"], port);
        // A resync of the same VMI keeps it there.
        let again = reported(&vmi(true), &mut domain);
        assert_eq!(again, json);
    }

    #[test]
    fn qemu_buses_and_devfns_become_libvirt_addresses() {
        let address = |bus: &str, slot: &str, function: &str| {
            Some(
                json!({"Type": "pci", "Domain": "0x0000", "Bus": bus, "Slot": slot, "Function": function}),
            )
        };
        let pci_address = |bus: &str, devfn: &Value| {
            pci_address(bus, devfn).map(|a| serde_json::to_value(a).unwrap())
        };
        assert_eq!(
            pci_address("/machine/peripheral/pci.5/pci.5", &json!(0)),
            address("0x05", "0x00", "0x0")
        );
        assert_eq!(
            pci_address("/machine/q35/pcie.0", &json!(34)),
            address("0x00", "0x04", "0x2")
        );
        assert_eq!(
            pci_address("/machine/peripheral/pci.12/pci.12", &json!("00.0")),
            address("0x0c", "0x00", "0x0")
        );
        assert_eq!(
            pci_address("/machine/peripheral/scsi0/scsi0.0", &json!(0)),
            None
        );
    }
}
