//! Controllers (pcie-root and its root ports, virtio-scsi, SATA, virtio-serial, USB) and `<interface>`.

use super::*;

pub(super) fn controllers(plan: &DomainPlan, out: &mut Vec<Device>) {
    let mut usb_model = "none".to_string();
    let mut rest = Vec::new();
    for d in plan.devices_of(DeviceClass::Controller) {
        match &d.device {
            other if other.driver() == "qemu-xhci" => usb_model = "qemu-xhci".into(),
            qemu::Device::VirtioScsi(s) => rest.push(Controller {
                type_: "scsi".into(),
                index: 0,
                model: Some(virtio_model(s.driver)),
                driver: (s.iothread.is_some() || s.num_queues.is_some()).then(|| {
                    ControllerDriver {
                        iothread: s
                            .iothread
                            .as_deref()
                            .and_then(|t| t.trim_start_matches("iothread").parse().ok()),
                        queues: s.num_queues,
                    }
                }),
                target: None,
                alias: None,
                address: address(d),
            }),
            other if other.driver() == "ahci" => rest.push(Controller {
                // The extra AHCI controllers (`sata<N>`) for SATA disks beyond q35's six.
                type_: "sata".into(),
                index: other.id().trim_start_matches("sata").parse().unwrap_or(1),
                model: None,
                driver: None,
                target: None,
                alias: None,
                address: address(d),
            }),
            other if other.driver().starts_with("virtio-serial") => rest.push(Controller {
                type_: "virtio-serial".into(),
                index: 0,
                model: Some(virtio_model(other.driver())),
                driver: None,
                target: None,
                alias: None,
                address: address(d),
            }),
            _ => {}
        }
    }
    let usb_address = plan
        .devices_of(DeviceClass::Controller)
        .find(|d| d.device.driver() == "qemu-xhci")
        .and_then(address);
    out.push(Device::Controller(Controller {
        type_: "usb".into(),
        index: 0,
        model: Some(usb_model),
        driver: None,
        target: None,
        alias: None,
        address: usb_address,
    }));
    out.extend(rest.into_iter().map(Device::Controller));
    // The PCIe topology as KubeVirt's domain has it after the placeholder pass.
    let ports: Vec<_> = plan.devices_of(DeviceClass::RootPort).collect();
    if ports.is_empty() {
        return;
    }
    out.push(Device::Controller(Controller {
        type_: "pci".into(),
        index: 0,
        model: Some("pcie-root".into()),
        driver: None,
        target: None,
        alias: None,
        address: None,
    }));
    for d in ports {
        if let qemu::Device::PcieRootPort(p) = &d.device {
            let index =
                p.id.strip_prefix("pci.")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(p.chassis);
            out.push(Device::Controller(Controller {
                type_: "pci".into(),
                index,
                model: Some("pcie-root-port".into()),
                driver: None,
                target: Some(ControllerTarget {
                    chassis: p.chassis,
                    port: format!("0x{:x}", p.port),
                }),
                alias: None,
                address: d
                    .address
                    .as_ref()
                    .map(|a| pci_address(a, p.multifunction == Some(true))),
            }));
        }
    }
}

pub(super) fn interface(
    ctx: &ConverterContext,
    plan: &DomainPlan,
    d: &PlannedDevice,
    ifaces: &[qlauncher_core::vmi::devices::Interface],
) -> Result<Interface, CompatError> {
    let qemu::Device::Nic(n) = &d.device else {
        return Err(CompatError::ExportUnnamedDevice {
            id: d.device.id().into(),
        });
    };
    let name = d
        .name
        .clone()
        .ok_or_else(|| CompatError::ExportUnnamedDevice { id: n.id.clone() })?;
    let index = ifaces.iter().position(|i| i.name == name).unwrap_or(0);
    let spec = ifaces.iter().find(|i| i.name == name);
    let model = if n.driver.starts_with("virtio") {
        virtio_model(n.driver)
    } else {
        n.driver.to_string()
    };
    let queues = match &d.backend {
        Backend::Netdev { argv, .. } => argv
            .fds
            .as_deref()
            .map(|f| f.split(':').count() as u32)
            .unwrap_or(1),
        _ => 1,
    };
    Ok(Interface {
        type_: "ethernet".into(),
        source: Empty::default(),
        // The tap virt-handler created (`tap0` for the pod network's eth0).
        target: Some(IfaceTarget {
            dev: format!("tap{index}"),
            managed: "no".into(),
        }),
        model: TypeAttr { type_: model },
        driver: (n.mq == Some(true)).then(|| IfaceDriver {
            name: "vhost".into(),
            queues: Some(queues),
        }),
        mac: n
            .mac
            .clone()
            .or_else(|| spec.and_then(|s| s.mac_address.clone()))
            .or_else(|| ctx.interfaces.get(&name).and_then(|f| f.mac.clone()))
            .map(|address| MacAddress { address }),
        mtu: n.host_mtu.map(|size| Mtu { size }),
        alias: alias(&n.id),
        boot: n.bootindex.map(|order| BootOrder { order }),
        rom: (n.romfile.as_deref() == Some("")).then(|| Rom {
            enabled: "no".into(),
        }),
        link: plan.links_down.contains(&n.id).then(|| State {
            state: "down".into(),
        }),
        acpi: n.acpi_index.map(|index| AcpiIndex { index }),
        address: address(d),
    })
}
