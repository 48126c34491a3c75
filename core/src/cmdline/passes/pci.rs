//! The PCI pass: orders devices by class and gives every PCI device a bus and address.
//!
//! Reads `devices[].class`, `devices[].placement`, `nic_placeholders`, `large_memory`; writes
//! `devices` (sorted, root ports prepended), `devices[].address`, `spare_root_ports`.
//!
//! Placement mirrors KubeVirt + libvirt on q35 (`manager.go allocateHotplugPorts`,
//! `converter/pci-placement.go`, libvirt `qemu_domain_address.c`): each PCIe device gets its own
//! `pcie-root-port` (`pci.<n>`, `port` 0x10+n-1, `chassis` n, on `pcie.0` slot 2 upwards, eight
//! functions per slot, `multifunction` on function 0), NICs first, then `nic_placeholders` empty
//! ports so NIC addresses stay stable across hotplug, then the other devices; then spare empty
//! ports so that max(T - inUse, M) ports are free (T=8, M=3 up to 2 GiB of guest memory, T=16, M=6
//! above). Integrated devices sit on `pcie.0` (VGA at 0x1); conventional PCI devices take `pcie.0`
//! slots after the root ports.

use crate::cmdline::error::{ConvertError, FieldPath};
use crate::cmdline::plan::{
    Backend, DeviceClass, DomainPlan, PciAddress, Placement, PlannedDevice,
};
use crate::cmdline::qemu::{Device, DevicePcieRootPort};

/// Highest root-port bus index (libvirt/KubeVirt never go beyond bus 31).
const MAX_ROOT_PORTS: u32 = 31;

fn root_port_addr(n: u32) -> (u8, u8) {
    let slot = 2 + (n - 1) / 8;
    let func = (n - 1) % 8;
    (slot as u8, func as u8)
}

fn fmt_addr(slot: u8, func: u8) -> String {
    if func == 0 {
        format!("0x{slot:x}")
    } else {
        format!("0x{slot:x}.0x{func:x}")
    }
}

/// Runs the pass. Errors with [`ConvertError::PciExhausted`] when more than 31 root ports would
/// be needed.
pub fn assign(plan: &mut DomainPlan) -> Result<(), ConvertError> {
    plan.devices.sort_by_key(|d| d.class);

    // Root-port users: NICs first, then placeholders, then everything else in class order.
    let mut order: Vec<usize> = Vec::new();
    for (i, d) in plan.devices.iter().enumerate() {
        if d.placement == Placement::RootPort && d.class == DeviceClass::Nic {
            order.push(i);
        }
    }
    let nics = order.len() as u32;
    for (i, d) in plan.devices.iter().enumerate() {
        if d.placement == Placement::RootPort && d.class != DeviceClass::Nic {
            order.push(i);
        }
    }
    let in_use = order.len() as u32;
    let placeholders = plan.nic_placeholders;
    let (t, m): (u32, u32) = if plan.large_memory { (16, 6) } else { (8, 3) };
    let desired_free = std::cmp::max(t.saturating_sub(in_use), m);
    let spare = desired_free.saturating_sub(placeholders);
    let total = in_use + placeholders + spare;
    if total > MAX_ROOT_PORTS {
        let path = FieldPath::new("spec.domain.devices");
        return Err(ConvertError::PciExhausted {
            path,
            reason: format!("{in_use} PCIe devices need more than {MAX_ROOT_PORTS} root ports"),
        });
    }
    plan.spare_root_ports = placeholders + spare;

    // Port number per device in `order`: NICs 1..=nics, placeholders next, others after.
    for (k, &i) in order.iter().enumerate() {
        let k = k as u32;
        let n = if k < nics {
            k + 1
        } else {
            k + 1 + placeholders
        };
        plan.devices[i].address = Some(PciAddress {
            bus: format!("pci.{n}"),
            addr: "0x0".into(),
        });
    }

    // Root-complex devices.
    let last_slot = if total == 0 {
        1
    } else {
        root_port_addr(total).0
    };
    let mut next_slot = last_slot + 1;
    for d in plan.devices.iter_mut() {
        match d.placement {
            Placement::RootComplex(slot) => {
                d.address = Some(PciAddress {
                    bus: "pcie.0".into(),
                    addr: fmt_addr(slot, 0),
                })
            }
            Placement::RootComplexAny => {
                d.address = Some(PciAddress {
                    bus: "pcie.0".into(),
                    addr: fmt_addr(next_slot, 0),
                });
                next_slot += 1;
            }
            Placement::RootPort | Placement::NonPci => {}
        }
    }

    let mut ports: Vec<PlannedDevice> = Vec::with_capacity(total as usize);
    for n in 1..=total {
        let (slot, func) = root_port_addr(n);
        let more_in_slot = func == 0 && n < total;
        ports.push(PlannedDevice {
            class: DeviceClass::RootPort,
            name: None,
            backend: Backend::None,
            device: Device::PcieRootPort(DevicePcieRootPort {
                driver: "pcie-root-port",
                port: 0x10 + n - 1,
                chassis: n,
                id: format!("pci.{n}"),
                multifunction: more_in_slot.then_some(true),
            }),
            placement: Placement::RootComplex(slot),
            address: Some(PciAddress {
                bus: "pcie.0".into(),
                addr: fmt_addr(slot, func),
            }),
            hotpluggable: false,
            target: None,
            iommu_platform: false,
        });
    }
    ports.append(&mut plan.devices);
    plan.devices = ports;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::qemu::DeviceSimple;

    fn dev(class: DeviceClass, id: &str) -> PlannedDevice {
        PlannedDevice {
            class,
            name: None,
            backend: Backend::None,
            device: Device::Simple(DeviceSimple {
                driver: "x",
                id: id.into(),
                bus: None,
                port: None,
            }),
            placement: Placement::RootPort,
            address: None,
            hotpluggable: false,
            target: None,
            iommu_platform: false,
        }
    }

    #[test]
    fn nics_come_first_then_placeholders_then_others() {
        // KubeVirt's worked example: 1 NIC, 2 virtio disks, 3 controllers, rng, balloon = 8 in
        // use, <= 2 GiB: desired 3 free, placeholders 3, extra 0.
        let mut plan = DomainPlan {
            nic_placeholders: 3,
            devices: vec![
                dev(DeviceClass::Disk, "ua-a"),
                dev(DeviceClass::Nic, "ua-n"),
                dev(DeviceClass::Disk, "ua-b"),
                dev(DeviceClass::Controller, "usb"),
                dev(DeviceClass::Controller, "scsi0"),
                dev(DeviceClass::Controller, "virtio-serial0"),
                dev(DeviceClass::Rng, "rng0"),
                dev(DeviceClass::Balloon, "balloon0"),
            ],
            ..Default::default()
        };
        assign(&mut plan).unwrap();
        assert_eq!(plan.spare_root_ports, 3);
        let ports = plan.devices_of(DeviceClass::RootPort).count();
        assert_eq!(ports, 11);
        let bus = |id: &str| {
            plan.devices
                .iter()
                .find(|d| d.device.id() == id)
                .and_then(|d| d.address.clone())
                .map(|a| a.bus)
        };
        assert_eq!(bus("ua-n").as_deref(), Some("pci.1"));
        assert_eq!(bus("usb").as_deref(), Some("pci.5"));
        assert_eq!(bus("ua-a").as_deref(), Some("pci.8"));
        assert_eq!(bus("balloon0").as_deref(), Some("pci.10"));
    }

    #[test]
    fn too_many_devices_are_rejected() {
        let mut plan = DomainPlan {
            devices: (0..40)
                .map(|i| dev(DeviceClass::Disk, &format!("d{i}")))
                .collect(),
            ..Default::default()
        };
        assert!(matches!(
            assign(&mut plan),
            Err(ConvertError::PciExhausted { .. })
        ));
    }
}
