//! Controllers (`converter/compute/controllers.go`): `qemu-xhci` (id `usb`) when a USB input or
//! disk exists, `virtio-scsi` (`scsi0`) unless `disableHotplug` and no SCSI disk, and
//! `virtio-serial` (`virtio-serial0`) for the guest agent channel (libvirt adds it for the
//! channel even when KubeVirt leaves it out).
//!
//! Reads: nothing from the context.

use super::super::context::ConverterContext;
use super::super::error::ConvertError;
use super::super::plan::{Backend, DeviceClass, DomainPlan, Placement, PlannedDevice};
use super::super::qemu::{Device, DeviceSimple, DeviceVirtioScsi};
use super::virtio_driver;
use crate::vmi::Vmi;

/// Adds the USB, SCSI and virtio-serial controllers.
pub struct ControllersConfigurator;

/// True when some disk or input sits on `bus`.
pub fn uses_bus(vmi: &Vmi, bus: &str) -> bool {
    let devs = &vmi.spec.domain.devices;
    let disks = devs.disks.as_deref().unwrap_or_default();
    let disk_bus = disks.iter().any(|d| {
        let b = d
            .disk
            .as_ref()
            .and_then(|t| t.bus.as_deref())
            .or(d.cdrom.as_ref().and_then(|t| t.bus.as_deref()))
            .or(d.lun.as_ref().map(|t| t.bus.as_deref().unwrap_or("scsi")));
        b == Some(bus)
    });
    let input_bus = devs
        .inputs
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|i| i.bus.as_deref().unwrap_or("usb") == bus);
    disk_bus || input_bus
}

fn controller(device: Device) -> PlannedDevice {
    PlannedDevice {
        class: DeviceClass::Controller,
        name: None,
        backend: Backend::None,
        device,
        placement: Placement::RootPort,
        address: None,
        hotpluggable: false,
        target: None,
        iommu_platform: false,
    }
}

impl super::super::convert::Configurator for ControllersConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        _ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let devs = &vmi.spec.domain.devices;
        if uses_bus(vmi, "usb") || devs.client_passthrough.is_some() {
            plan.devices.push(controller(Device::Simple(DeviceSimple {
                driver: "qemu-xhci",
                id: "usb".into(),
                bus: None,
                port: None,
            })));
        }
        if devs.disable_hotplug != Some(true) || uses_bus(vmi, "scsi") {
            plan.devices
                .push(controller(Device::VirtioScsi(DeviceVirtioScsi {
                    driver: virtio_driver(
                        vmi,
                        "virtio-scsi-pci-non-transitional",
                        "virtio-scsi-pci-transitional",
                    ),
                    id: "scsi0".into(),
                    iothread: None,
                    num_queues: None,
                })));
        }
        plan.devices.push(controller(Device::Simple(DeviceSimple {
            driver: virtio_driver(
                vmi,
                "virtio-serial-pci-non-transitional",
                "virtio-serial-pci-transitional",
            ),
            id: "virtio-serial0".into(),
            bus: None,
            port: None,
        })));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::testutil::configure;
    use serde_json::json;

    #[test]
    fn controllers_table() {
        let serial = "virtio-serial-pci-non-transitional";
        let scsi = "virtio-scsi-pci-non-transitional";
        // (devices fragment) -> the controller drivers, in order
        let cases = [
            (json!({}), vec![scsi, serial]),
            (json!({"disableHotplug": true}), vec![serial]),
            (
                json!({"disableHotplug": true, "disks": [{"name": "d", "lun": {}}]}),
                vec![scsi, serial],
            ),
            (
                json!({"inputs": [{"name": "t", "type": "tablet"}]}),
                vec!["qemu-xhci", scsi, serial],
            ),
            (
                json!({"inputs": [{"name": "t", "type": "tablet", "bus": "virtio"}]}),
                vec![scsi, serial],
            ),
            (
                json!({"disks": [{"name": "d", "disk": {"bus": "usb"}}]}),
                vec!["qemu-xhci", scsi, serial],
            ),
            (
                json!({"useVirtioTransitional": true}),
                vec![
                    "virtio-scsi-pci-transitional",
                    "virtio-serial-pci-transitional",
                ],
            ),
        ];
        for (devices, want) in cases {
            let plan = configure(
                &ControllersConfigurator,
                json!({ "devices": devices }),
                &ConverterContext::default(),
            )
            .unwrap();
            let got: Vec<&str> = plan.devices.iter().map(|d| d.device.driver()).collect();
            assert_eq!(got, want, "{devices}");
            assert!(plan
                .devices
                .iter()
                .all(|d| d.class == DeviceClass::Controller && d.placement == Placement::RootPort));
        }
    }
}
