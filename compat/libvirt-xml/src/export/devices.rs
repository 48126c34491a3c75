//! Controllers (pcie-root and its root ports, virtio-scsi, SATA, virtio-serial, USB),
//! `<interface>`, and one function per other device element of `<devices>` (disks and host
//! devices have their own files), each from one planned device.

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
        driver: (n.mq == Some(true) || n.rx_queue_size.is_some() || n.tx_queue_size.is_some())
            .then(|| IfaceDriver {
                name: (n.mq == Some(true)).then(|| "vhost".into()),
                queues: (n.mq == Some(true)).then_some(queues),
                rx_queue_size: n.rx_queue_size,
                tx_queue_size: n.tx_queue_size,
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
        rom: match (n.romfile.as_deref(), n.rombar) {
            (Some(""), _) => Some(Rom {
                enabled: "no".into(),
                bar: None,
                file: None,
            }),
            (None, None) => None,
            (file, bar) => Some(Rom {
                enabled: "yes".into(),
                bar: bar.map(|b| if b == 0 { "off" } else { "on" }.into()),
                file: file.map(str::to_string),
            }),
        },
        link: plan.links_down.contains(&n.id).then(|| State {
            state: "down".into(),
        }),
        acpi: n.acpi_index.map(|index| AcpiIndex { index }),
        address: address(d),
    })
}

/// A `<channel>` for a virtio serial port: a unix socket the launcher binds, except the guest
/// agent's, whose socket path KubeVirt leaves to libvirt.
pub(super) fn channel(d: &PlannedDevice) -> Option<Channel> {
    let qemu::Device::Virtserialport(p) = &d.device else {
        return None;
    };
    let source = match (&d.backend, p.name.as_str()) {
        // KubeVirt leaves the guest agent's socket path to libvirt.
        (_, "org.qemu.guest_agent.0") => None,
        (Backend::Chardev(c), _) => match &c.addr {
            qemu::SocketAddr::Path(path) => Some(SourceModePath {
                mode: "bind".into(),
                path: path.clone(),
            }),
            qemu::SocketAddr::Fd(_) => None,
        },
        _ => None,
    };
    Some(Channel {
        type_: "unix".into(),
        source,
        target: ChannelTarget {
            name: p.name.clone(),
            type_: "virtio".into(),
        },
    })
}

/// A `<video>`: `vga` (with libvirt's 16 MiB of VRAM), `bochs` or `virtio`, one head.
pub(super) fn video(d: &PlannedDevice) -> Option<Video> {
    let qemu::Device::Video(v) = &d.device else {
        return None;
    };
    let (type_, vram) = match v.driver {
        "VGA" => ("vga", Some(16384)),
        "bochs-display" => ("bochs", None),
        _ => ("virtio", None),
    };
    Some(Video {
        model: VideoModel {
            type_: type_.into(),
            heads: Some(1),
            vram,
        },
        address: address(d),
    })
}

/// The VNC `<graphics>` on its unix socket, when the plan has one.
pub(super) fn graphics(plan: &DomainPlan) -> Option<Graphics> {
    plan.vnc.as_ref().map(|socket| Graphics {
        type_: "vnc".into(),
        listen: GraphicsListen {
            type_: "socket".into(),
            socket: socket.clone(),
        },
    })
}

/// The `<memballoon>` (the plan's last balloon device, with its free page reporting and stats
/// period), or model `none` when there is none: libvirt adds a balloon unless told not to.
pub(super) fn memballoon(plan: &DomainPlan) -> Memballoon {
    let balloon = plan
        .devices_of(DeviceClass::Balloon)
        .filter_map(|d| match &d.device {
            qemu::Device::VirtioBalloon(b) => Some(Memballoon {
                model: virtio_model(b.driver),
                free_page_reporting: b.free_page_reporting.map(on_off),
                stats: plan.balloon_stats_period.map(|period| Stats { period }),
                address: address(d),
            }),
            _ => None,
        })
        .last();
    balloon.unwrap_or(Memballoon {
        model: "none".into(),
        free_page_reporting: None,
        stats: None,
        address: None,
    })
}

/// The tablet `<input>`, on the virtio or the USB bus.
pub(super) fn input(d: &PlannedDevice) -> Input {
    let (bus, model) = if d.device.driver().starts_with("virtio") {
        ("virtio", Some("virtio".to_string()))
    } else {
        ("usb", None)
    };
    Input {
        type_: "tablet".into(),
        bus: bus.into(),
        model,
        alias: alias(d.device.id()),
        address: address(d),
    }
}

/// An ISA serial port as `<serial>` (a unix socket the launcher binds, with its log file) and
/// the `<console>` on it.
pub(super) fn serial_console(d: &PlannedDevice) -> Option<(Serial, Console)> {
    let (qemu::Device::IsaSerial(s), Backend::Chardev(c)) = (&d.device, &d.backend) else {
        return None;
    };
    let path = match &c.addr {
        qemu::SocketAddr::Path(p) => p.clone(),
        qemu::SocketAddr::Fd(fd) => format!("/dev/fd/{fd}"),
    };
    let serial = Serial {
        type_: "unix".into(),
        target: PortTarget {
            type_: None,
            port: s.index,
        },
        source: SourceModePath {
            mode: "bind".into(),
            path,
        },
        log: c.logfile.as_ref().map(|f| Log {
            file: f.clone(),
            append: "on".into(),
        }),
    };
    let console = Console {
        type_: "pty".into(),
        target: PortTarget {
            type_: Some("serial".into()),
            port: s.index,
        },
    };
    Some((serial, console))
}

/// The `<watchdog>` with the plan's action (libvirt's default `reset`).
pub(super) fn watchdog(plan: &DomainPlan, d: &PlannedDevice) -> Watchdog {
    let action = plan.watchdog_action.unwrap_or(WatchdogAction::Reset).name();
    Watchdog {
        model: d.device.driver().into(),
        action: action.into(),
        alias: alias(d.device.id()),
        address: address(d),
    }
}

/// The `<rng>` with its random backend (the plan's file, else `/dev/urandom`).
pub(super) fn rng(d: &PlannedDevice) -> Rng {
    let source = match &d.backend {
        Backend::Object(Object::RngRandom(o)) => o.filename.clone(),
        _ => "/dev/urandom".into(),
    };
    Rng {
        model: virtio_model(d.device.driver()),
        backend: RngBackend {
            model: "random".into(),
            source,
        },
        address: address(d),
    }
}

/// The `<sound>` card, `ich9` or `ac97` (its hda codec is implied by the model); another
/// card has no element.
pub(super) fn sound(d: &PlannedDevice) -> Option<Sound> {
    let qemu::Device::Sound(s) = &d.device else {
        return None;
    };
    let model = match s.driver {
        "ich9-intel-hda" => "ich9",
        "AC97" => "ac97",
        _ => return None,
    };
    Some(Sound {
        model: model.into(),
        alias: alias(&s.id),
        address: address(d),
    })
}

/// The `<tpm>` on libvirt's 2.0 emulator, with persistent state when the VMI's TPM asks for it.
pub(super) fn tpm(vmi: &Vmi, d: &PlannedDevice) -> Tpm {
    let tpm = vmi.spec.domain.devices.tpm.as_ref();
    let persistent = tpm.and_then(|t| t.persistent) == Some(true);
    Tpm {
        model: d.device.driver().into(),
        backend: TpmBackend {
            type_: "emulator".into(),
            version: "2.0".into(),
            persistent_state: persistent.then(|| "yes".into()),
        },
    }
}

/// The `<vsock>` with the plan's guest CID (not `auto`).
pub(super) fn vsock(d: &PlannedDevice) -> Option<Vsock> {
    let qemu::Device::VhostVsock(v) = &d.device else {
        return None;
    };
    Some(Vsock {
        model: "virtio-non-transitional".into(),
        cid: Cid {
            auto: "no".into(),
            address: v.guest_cid,
        },
        address: address(d),
    })
}

/// The `<filesystem>` of a virtiofs share: its virtiofsd socket and mount tag, with KubeVirt's
/// queue size (`converter/storage/virtiofs.go`).
///
/// Errors: a planned filesystem device that is not a vhost-user-fs device on a socket path
/// ([`CompatError::ExportUnshown`]).
pub(super) fn filesystem(d: &PlannedDevice) -> Result<Filesystem, CompatError> {
    let (qemu::Device::VhostUserFs(fs), Backend::Chardev(c)) = (&d.device, &d.backend) else {
        return Err(CompatError::ExportUnshown {
            id: d.device.id().to_owned(),
            why: "a filesystem that is not a vhost-user-fs device on a chardev".into(),
        });
    };
    let qemu::SocketAddr::Path(socket) = &c.addr else {
        return Err(CompatError::ExportUnshown {
            id: fs.id.clone(),
            why: "a virtiofs chardev without a socket path".into(),
        });
    };
    Ok(Filesystem {
        type_: "mount".into(),
        access_mode: None,
        source: FilesystemSource {
            dir: None,
            socket: Some(socket.clone()),
        },
        target: FilesystemTarget {
            dir: fs.tag.clone(),
        },
        driver: FilesystemDriver {
            type_: "virtiofs".into(),
            queue: Some(fs.queue_size.to_string()),
        },
        address: address(d),
    })
}
