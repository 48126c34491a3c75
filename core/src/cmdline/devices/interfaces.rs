//! Interfaces (`converter/network/`, `nichotplug.go`), for tap-attached bindings (masquerade,
//! bridge): a `tap` netdev `hostua-<name>` on the inherited tap fd(s) (or the tap's name), and
//! a NIC `ua-<name>`: `virtio-net-pci-non-transitional` by default, or the user's model
//! (`e1000`, `e1000e`, `igb`, `ne2k_pci`, `pcnet`, `rtl8139`, `virtio`); MAC from the spec or
//! the pod facts; `host_mtu` from the pod link (virtio); option ROM off (`romfile: ""`) when the
//! interface has no boot order; multiqueue (`networkInterfaceMultiqueue`: queues = vCPUs, max
//! 256); `acpi-index`; `state: down` -> `set_link` after start; `state: absent` -> no NIC. The QMP
//! plan uses `getfd` names `tapfd-<id>-<i>`/`vhostfd-<id>-<i>`.
//!
//! SR-IOV interfaces are VFIO host devices (`hostdevs.rs`); passt, slirp, macvtap and network
//! binding plugins are rejected with the field path.
//!
//! Reads: `ctx.interfaces`. Also sets `nic_placeholders` (KubeVirt: max(0, 4 - #interfaces)).

use std::collections::BTreeSet;

use super::super::context::{ConverterContext, TapSource};
use super::super::error::{ConvertError, FieldPath};
use super::super::names::{alias, check_name};
use super::super::plan::{Backend, DeviceClass, DomainPlan, Placement, PlannedDevice};
use super::super::qemu::{Device, DeviceNic, NetdevTap};
use super::{annotation, devices_path, vcpus, virtio_driver};
use crate::vmi::{Interface, Vmi};

/// Adds one NIC per tap-attached interface.
pub struct InterfacesConfigurator;

fn check_mac(p: &FieldPath, mac: &str) -> Result<String, ConvertError> {
    let parts: Vec<&str> = mac.split([':', '-']).collect();
    if parts.len() != 6
        || !parts
            .iter()
            .all(|x| x.len() == 2 && x.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(ConvertError::invalid(
            p.clone(),
            format!("{mac:?} is not a MAC address"),
        ));
    }
    Ok(parts.join(":").to_ascii_lowercase())
}

fn binding(iface: &Interface, p: &FieldPath) -> Result<(), ConvertError> {
    if iface.masquerade.is_some() || iface.bridge.is_some() {
        return Ok(());
    }
    let what = if iface.passt.is_some() || iface.passt_binding.is_some() {
        "passt binding"
    } else if iface.slirp.is_some() {
        "slirp binding"
    } else if iface.macvtap.is_some() {
        "macvtap binding"
    } else if iface.binding.is_some() {
        "network binding plugins"
    } else {
        return Err(ConvertError::missing(
            p.clone(),
            "a binding (masquerade or bridge)",
        ));
    };
    Err(ConvertError::unsupported(p.clone(), what))
}

impl super::super::convert::Configurator for InterfacesConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let ifaces = vmi
            .spec
            .domain
            .devices
            .interfaces
            .clone()
            .unwrap_or_default();
        let on_root_complex =
            annotation(vmi, "kubevirt.io/placePCIDevicesOnRootComplex") == Some("true");
        plan.nic_placeholders = nic_placeholders(vmi, ifaces.len(), on_root_complex)?;
        let mut seen = BTreeSet::new();
        let mut acpi_seen = BTreeSet::new();
        for (i, iface) in ifaces.iter().enumerate() {
            let p = devices_path().key("interfaces").index(i);
            check_name(&p.key("name"), &iface.name)?;
            if !seen.insert(iface.name.clone()) {
                return Err(ConvertError::invalid(
                    p.key("name"),
                    "duplicate interface name",
                ));
            }
            if !is_tap_nic(iface, &p)? {
                continue;
            }
            let device = nic(vmi, ctx, iface, &p, on_root_complex, &mut acpi_seen)?;
            if iface.state.as_deref() == Some("down") {
                plan.links_down.push(alias(&iface.name));
            }
            plan.devices.push(device);
        }
        Ok(())
    }
}

/// The empty root ports kept for NIC hotplug (KubeVirt's placeholders): none without
/// interfaces or on the root complex; else `kubevirt.io/pci-interface-slot-count` less the
/// interfaces (at most 31), or by default 4 less the interfaces.
fn nic_placeholders(vmi: &Vmi, ifaces: usize, on_root_complex: bool) -> Result<u32, ConvertError> {
    Ok(
        match annotation(vmi, "kubevirt.io/pci-interface-slot-count") {
            _ if ifaces == 0 || on_root_complex => 0,
            Some(n) => n
                .parse::<u32>()
                .map_err(|_| {
                    ConvertError::invalid(
                        FieldPath::new("metadata.annotations"),
                        "kubevirt.io/pci-interface-slot-count is not a number",
                    )
                })?
                .saturating_sub(ifaces as u32)
                .min(31),
            None => 4u32.saturating_sub(ifaces as u32),
        },
    )
}

/// Whether the interface becomes a tap NIC here: not when its `state` is `absent`, nor for an
/// SR-IOV interface (a VF passed through with VFIO: `hostdevs.rs`). Any other state than
/// up, down or unset is refused.
fn is_tap_nic(iface: &Interface, p: &FieldPath) -> Result<bool, ConvertError> {
    match iface.state.as_deref() {
        Some("absent") => return Ok(false),
        None | Some("") | Some("up") | Some("down") => {}
        Some(o) => {
            return Err(ConvertError::unsupported(
                p.key("state"),
                format!("state {o:?}"),
            ))
        }
    }
    Ok(iface.sriov.is_none())
}

/// One tap-attached interface's NIC `ua-<name>` and its `hostua-<name>` tap netdev (at
/// `p`), checked in KubeVirt's order: binding, PCI address, the pod's facts, model, MAC,
/// queues, tap, ACPI index, boot order.
fn nic(
    vmi: &Vmi,
    ctx: &ConverterContext,
    iface: &Interface,
    p: &FieldPath,
    on_root_complex: bool,
    acpi_seen: &mut BTreeSet<i64>,
) -> Result<PlannedDevice, ConvertError> {
    binding(iface, p)?;
    if iface.pci_address.is_some() {
        return Err(ConvertError::unsupported(
            p.key("pciAddress"),
            "a fixed PCI address",
        ));
    }
    let facts = ctx.interfaces.get(&iface.name).ok_or_else(|| {
        ConvertError::missing(
            p.clone(),
            "the pod's tap for this interface (network facts)",
        )
    })?;
    let (driver, virtio) = model(vmi, iface, p)?;
    let mac = match (iface.mac_address.as_deref(), facts.mac.as_deref()) {
        (Some(m), _) if !m.is_empty() => Some(check_mac(&p.key("macAddress"), m)?),
        (_, Some(m)) => Some(check_mac(&p.key("macAddress"), m)?),
        _ => None,
    };
    let queues = if virtio && vmi.spec.domain.devices.network_interface_multi_queue == Some(true) {
        vcpus(vmi)?.min(256)
    } else {
        1
    };
    let id = alias(&iface.name);
    let netdev_id = format!("host{id}");
    let (argv, hotplug, fd_names) = tap_netdev(&facts.tap, &id, &netdev_id, queues, p)?;
    let acpi_index = acpi_index(iface, p, acpi_seen)?;
    if iface.boot_order == Some(0) {
        return Err(ConvertError::invalid(
            p.key("bootOrder"),
            "boot order starts at 1",
        ));
    }
    let device = Device::Nic(DeviceNic {
        driver,
        netdev: netdev_id,
        id,
        mac,
        host_mtu: if virtio { facts.mtu } else { None },
        romfile: iface.boot_order.is_none().then(String::new),
        rombar: None,
        rx_queue_size: None,
        tx_queue_size: None,
        bootindex: iface.boot_order,
        mq: (queues > 1).then_some(true),
        vectors: (queues > 1).then_some(2 * queues + 2),
        acpi_index,
    });
    Ok(PlannedDevice {
        class: DeviceClass::Nic,
        name: Some(iface.name.clone()),
        backend: Backend::Netdev {
            argv: Box::new(argv),
            hotplug: Box::new(hotplug),
            fd_names,
        },
        device,
        placement: if on_root_complex {
            Placement::RootComplexAny
        } else {
            Placement::RootPort
        },
        address: None,
        // KubeVirt hot-plugs virtio NICs only, and only on root ports.
        hotpluggable: virtio && !on_root_complex,
        target: None,
        iommu_platform: false,
    })
}

/// The NIC's QEMU driver for the interface's `model`, and whether it is virtio (virtio is
/// the default: non-transitional, or transitional when the VMI asks for it).
fn model(
    vmi: &Vmi,
    iface: &Interface,
    p: &FieldPath,
) -> Result<(&'static str, bool), ConvertError> {
    let virtio = matches!(iface.model.as_deref(), None | Some("") | Some("virtio"));
    let driver = match iface.model.as_deref() {
        None | Some("") | Some("virtio") => virtio_driver(
            vmi,
            "virtio-net-pci-non-transitional",
            "virtio-net-pci-transitional",
        ),
        Some("e1000") => "e1000",
        Some("e1000e") => "e1000e",
        Some("igb") => "igb",
        Some("ne2k_pci") => "ne2k_pci",
        Some("pcnet") => "pcnet",
        Some("rtl8139") => "rtl8139",
        Some(o) => {
            return Err(ConvertError::unsupported(
                p.key("model"),
                format!("model {o:?}"),
            ))
        }
    };
    Ok((driver, virtio))
}

/// The `tap` netdev `netdev_id` for argv and for hotplug, and the `getfd` names the hotplug
/// one uses. Inherited fds: one tap fd per queue (`fd`, or `fds` joined by `:` when more than
/// one) and as many vhost fds or none; hotplug names them `tapfd-<id>-<q>` and
/// `vhostfd-<id>-<q>`. A tap by name: QEMU opens it (`ifname=`, no scripts), `queues` when
/// more than one.
fn tap_netdev(
    tap: &TapSource,
    id: &str,
    netdev_id: &str,
    queues: u32,
    p: &FieldPath,
) -> Result<(NetdevTap, NetdevTap, Vec<String>), ConvertError> {
    let join = |v: &[i32]| {
        v.iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join(":")
    };
    let mut fd_names = Vec::new();
    let (argv, hotplug) = match tap {
        TapSource::Fds { fds, vhostfds } => {
            if fds.is_empty() || (fds.len() as u32 != queues) {
                return Err(ConvertError::invalid(
                    p.clone(),
                    format!("{} tap fds given for {queues} queues", fds.len()),
                ));
            }
            if !vhostfds.is_empty() && vhostfds.len() != fds.len() {
                return Err(ConvertError::invalid(
                    p.clone(),
                    "vhost fds do not match the tap fds",
                ));
            }
            let tap_names: Vec<String> =
                (0..fds.len()).map(|q| format!("tapfd-{id}-{q}")).collect();
            let vhost_names: Vec<String> = (0..vhostfds.len())
                .map(|q| format!("vhostfd-{id}-{q}"))
                .collect();
            fd_names.extend(tap_names.iter().cloned());
            fd_names.extend(vhost_names.iter().cloned());
            let multi = fds.len() > 1;
            let vhost = !vhostfds.is_empty();
            let mk = |tap: String, vh: String| NetdevTap {
                type_: "tap",
                id: netdev_id.to_string(),
                fd: (!multi).then(|| tap.clone()),
                fds: multi.then_some(tap),
                ifname: None,
                script: None,
                downscript: None,
                vhost: vhost.then_some(true),
                vhostfd: (vhost && !multi).then(|| vh.clone()),
                vhostfds: (vhost && multi).then_some(vh),
                queues: None,
            };
            (
                mk(join(fds), join(vhostfds)),
                mk(tap_names.join(":"), vhost_names.join(":")),
            )
        }
        TapSource::Ifname(name) => {
            if name.is_empty() || name.len() > 15 || name.contains(['/', ',', ' ']) {
                return Err(ConvertError::invalid(p.clone(), "bad tap name in facts"));
            }
            let t = NetdevTap {
                type_: "tap",
                id: netdev_id.to_string(),
                fd: None,
                fds: None,
                ifname: Some(name.clone()),
                script: Some("no"),
                downscript: Some("no"),
                vhost: None,
                vhostfd: None,
                vhostfds: None,
                queues: (queues > 1).then_some(queues),
            };
            (t.clone(), t)
        }
    };
    Ok((argv, hotplug, fd_names))
}

/// The interface's `acpiIndex`: 1 to 16383 and unique among the VMI's interfaces
/// (`acpi_seen` holds those taken).
fn acpi_index(
    iface: &Interface,
    p: &FieldPath,
    acpi_seen: &mut BTreeSet<i64>,
) -> Result<Option<u32>, ConvertError> {
    match iface.acpi_index {
        None => Ok(None),
        Some(n) if (1..=16383).contains(&n) => {
            if !acpi_seen.insert(n) {
                return Err(ConvertError::invalid(
                    p.key("acpiIndex"),
                    "duplicate acpi index",
                ));
            }
            Ok(Some(n as u32))
        }
        Some(_) => Err(ConvertError::invalid(
            p.key("acpiIndex"),
            "acpi index must be between 1 and 16383",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::convert::Configurator;
    use crate::cmdline::testutil::vmi_with;
    use serde_json::json;

    fn ctx() -> ConverterContext {
        let mut ctx = ConverterContext::default();
        ctx.interfaces.insert(
            "default".into(),
            IfaceFacts {
                mac: Some("0A:58:0A:00:00:02".into()),
                mtu: Some(1400),
                tap: TapSource::Fds {
                    fds: vec![7],
                    vhostfds: vec![8],
                },
            },
        );
        ctx
    }

    use crate::cmdline::context::IfaceFacts;

    #[test]
    fn masquerade_nic_gets_tap_fd_mac_mtu_and_rom_off() {
        let mut plan = DomainPlan::default();
        InterfacesConfigurator
            .configure(
                &vmi_with(
                    json!({"devices": {"interfaces": [{"name": "default", "masquerade": {}}]}}),
                ),
                &ctx(),
                &mut plan,
            )
            .unwrap();
        assert_eq!(plan.nic_placeholders, 3);
        let d = &plan.devices[0];
        assert_eq!(
            d.device,
            Device::Nic(DeviceNic {
                driver: "virtio-net-pci-non-transitional",
                netdev: "hostua-default".into(),
                id: "ua-default".into(),
                mac: Some("0a:58:0a:00:00:02".into()),
                host_mtu: Some(1400),
                romfile: Some(String::new()),
                rombar: None,
                rx_queue_size: None,
                tx_queue_size: None,
                bootindex: None,
                mq: None,
                vectors: None,
                acpi_index: None,
            })
        );
        let Backend::Netdev {
            argv,
            hotplug,
            fd_names,
        } = &d.backend
        else {
            panic!("netdev backend")
        };
        assert_eq!(argv.fd.as_deref(), Some("7"));
        assert_eq!(argv.vhostfd.as_deref(), Some("8"));
        assert_eq!(hotplug.fd.as_deref(), Some("tapfd-ua-default-0"));
        assert_eq!(fd_names, &["tapfd-ua-default-0", "vhostfd-ua-default-0"]);
        assert!(d.hotpluggable);
    }

    /// The NIC of each planned interface, with the tap fds of its netdev.
    fn nics(plan: &DomainPlan) -> Vec<(DeviceNic, Option<String>)> {
        plan.devices_of(DeviceClass::Nic)
            .map(|d| {
                let Device::Nic(n) = &d.device else {
                    panic!("not a NIC: {d:?}")
                };
                let Backend::Netdev { argv, .. } = &d.backend else {
                    panic!("no netdev: {d:?}")
                };
                (n.clone(), argv.fds.clone().or(argv.fd.clone()))
            })
            .collect()
    }

    #[test]
    fn interfaces_table() {
        use crate::cmdline::FactsFile;
        let nic =
            |driver, mac: Option<&str>, host_mtu, romfile: Option<&str>, bootindex| DeviceNic {
                driver,
                netdev: "hostua-default".into(),
                id: "ua-default".into(),
                mac: mac.map(str::to_string),
                host_mtu,
                romfile: romfile.map(str::to_string),
                rombar: None,
                rx_queue_size: None,
                tx_queue_size: None,
                bootindex,
                mq: None,
                vectors: None,
                acpi_index: None,
            };
        let virtio = "virtio-net-pci-non-transitional";
        let facts = r#"{"interfaces": {"default": {"mac": "02:00:00:00:00:01", "mtu": 9000}}}"#;
        // (domain fragment, facts file) -> (NIC, tap fds), placeholders, links down
        let cases = [
            (
                json!({"devices": {"interfaces": [{"name": "default", "bridge": {}}]}}),
                facts,
                vec![(
                    nic(
                        virtio,
                        Some("02:00:00:00:00:01"),
                        Some(9000),
                        Some(""),
                        None,
                    ),
                    Some("10".to_string()),
                )],
                3,
                vec![],
            ),
            (
                json!({"devices": {"interfaces": [{"name": "default", "bridge": {}, "model": "e1000", "bootOrder": 2, "macAddress": "02-00-00-00-00-AA"}]}}),
                facts,
                vec![(
                    nic("e1000", Some("02:00:00:00:00:aa"), None, None, Some(2)),
                    Some("10".to_string()),
                )],
                3,
                vec![],
            ),
            (
                json!({"devices": {"interfaces": [{"name": "default", "masquerade": {}, "state": "down"}]}}),
                "{}",
                vec![(
                    nic(virtio, None, Some(1500), Some(""), None),
                    Some("10".to_string()),
                )],
                3,
                vec!["ua-default".to_string()],
            ),
            (
                json!({"devices": {"interfaces": [{"name": "default", "masquerade": {}, "state": "absent"}]}}),
                "{}",
                vec![],
                3,
                vec![],
            ),
            (
                json!({"cpu": {"cores": 2}, "devices": {"networkInterfaceMultiqueue": true, "interfaces": [{"name": "default", "masquerade": {}}]}}),
                "{}",
                vec![(
                    DeviceNic {
                        mq: Some(true),
                        vectors: Some(6),
                        ..nic(virtio, None, Some(1500), Some(""), None)
                    },
                    Some("10:11".to_string()),
                )],
                3,
                vec![],
            ),
        ];
        for (domain, facts, want, placeholders, down) in cases {
            let vmi = vmi_with(domain.clone());
            let ctx = FactsFile::from_json(facts).unwrap().context(&vmi);
            let mut plan = DomainPlan::default();
            InterfacesConfigurator
                .configure(&vmi, &ctx, &mut plan)
                .unwrap();
            assert_eq!(nics(&plan), want, "{domain}");
            assert_eq!(plan.nic_placeholders, placeholders, "{domain}");
            assert_eq!(plan.links_down, down, "{domain}");
        }
    }

    #[test]
    fn unsupported_bindings_and_bad_macs_are_rejected_with_path() {
        for (iface, path) in [
            (
                json!({"name": "default", "macvtap": {}}),
                "spec.domain.devices.interfaces[0]",
            ),
            (
                json!({"name": "default", "bridge": {}, "macAddress": "02:00:00:00:00:0g"}),
                "spec.domain.devices.interfaces[0].macAddress",
            ),
            (
                json!({"name": "default", "bridge": {}, "model": "virtio,x=y"}),
                "spec.domain.devices.interfaces[0].model",
            ),
        ] {
            let mut plan = DomainPlan::default();
            let e = InterfacesConfigurator
                .configure(
                    &vmi_with(json!({"devices": {"interfaces": [iface]}})),
                    &ctx(),
                    &mut plan,
                )
                .unwrap_err();
            assert_eq!(e.path().as_str(), path);
        }
    }
}
