//! The exporter: a `DomainPlan` (plus the VMI and context it was converted from) becomes the
//! libvirt domain XML KubeVirt v1.9's converter hands libvirt for the same VMI
//! (`pkg/virt-launcher/virtwrap/converter/`, golden file `converter/testdata/domain_x86_64.xml`).
//!
//! Device facts (paths, formats, cache modes, ids, boot order, PCI addresses) are read from the
//! plan, so libvirt's argv for the exported XML checks qlauncher's own rendering; the VMI supplies
//! what the plan does not carry in libvirt's terms (disk device kind, tray, CPU mode, clock
//! timers, Hyper-V states). PCI addresses and the `pcie-root-port` controllers are exported as
//! the plan assigned them, which is what KubeVirt's domain looks like after its placeholder pass
//! (`allocateHotplugPorts`: libvirt's addresses are read back and kept).
//!
//! Layout: this file holds [`export`] (the element order of `<domain>` and `<devices>`) and the
//! address helpers; `domain.rs` exports memory backing, `<os>`, `<sysinfo>` and `<clock>`,
//! `cpu.rs` `<features>`, `<cpu>` and `<vcpus>`, `devices.rs` controllers and interfaces,
//! `disks.rs` disks with their blockdev chains, `hostdevs.rs` GPUs, host devices and SR-IOV VFs.

mod cpu;
mod devices;
mod disks;
mod domain;
mod hostdevs;

use qlauncher_core::cmdline::plan::{
    Accel, Backend, DeviceClass, FirmwarePlan, PciAddress, PlannedDevice, WatchdogAction,
};
use qlauncher_core::cmdline::qemu::{
    self, Aio, Blockdev, BlockdevFormat, BlockdevProtocol, FormatDriver, Object, OnError,
    ProtocolDriver,
};
use qlauncher_core::cmdline::{ConverterContext, DomainPlan};
use qlauncher_core::vmi::Vmi;

use crate::schema::*;
use crate::CompatError;

use cpu::*;
use devices::*;
use disks::*;
use domain::*;
pub use hostdevs::host_pci_address;
use hostdevs::*;

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

fn on_off(b: bool) -> String {
    if b { "on" } else { "off" }.to_string()
}

/// libvirt's virtio `model` for a QEMU driver name (`virtio-blk-pci-non-transitional` ->
/// `virtio-non-transitional`, `...-transitional` -> `virtio-transitional`, else `virtio`).
pub fn virtio_model(driver: &str) -> String {
    if driver.ends_with("-non-transitional") {
        "virtio-non-transitional".into()
    } else if driver.ends_with("-transitional") {
        "virtio-transitional".into()
    } else {
        "virtio".into()
    }
}

/// The `<address type="pci">` for a QEMU `bus`/`addr` pair (`pci.5`/`0x0` -> bus 0x05 slot 0x00
/// function 0x0; `pcie.0`/`0x2.0x1` -> bus 0x00 slot 0x02 function 0x1).
pub fn pci_address(a: &PciAddress, multifunction: bool) -> Address {
    let bus: u32 = match a.bus.strip_prefix("pci.") {
        Some(n) => n.parse().unwrap_or(0),
        None => 0,
    };
    let parse = |s: &str| u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or(0);
    let (slot, function) = match a.addr.split_once('.') {
        Some((s, f)) => (parse(s), parse(f)),
        None => (parse(&a.addr), 0),
    };
    Address {
        type_: "pci".into(),
        domain: Some("0x0000".into()),
        bus: Some(format!("0x{bus:02x}")),
        slot: Some(format!("0x{slot:02x}")),
        function: Some(format!("0x{function:x}")),
        multifunction: multifunction.then(|| "on".into()),
        controller: None,
        unit: None,
    }
}

fn address(d: &PlannedDevice) -> Option<Address> {
    d.address.as_ref().map(|a| pci_address(a, false))
}

fn alias(id: &str) -> NameAttr {
    NameAttr { name: id.into() }
}

/// Exports the plan as KubeVirt's libvirt domain.
///
/// Errors: a disk whose frontend's `drive` is not among its blockdevs
/// ([`CompatError::ExportBlockdevChain`]), a device without the VMI name it needs, a plan that
/// needs host hardware the exporter does not write (SEV/SNP/TDX, virtiofs) or that the context
/// did not report (a GPU, host device or SR-IOV VF without its host address:
/// [`CompatError::ExportHardware`]).
pub fn export(vmi: &Vmi, ctx: &ConverterContext, plan: &DomainPlan) -> Result<Domain, CompatError> {
    if let Some(h) = plan
        .hardware
        .iter()
        .find(|h| h.missing.is_some() || !is_host_device_id(&h.id))
    {
        return Err(CompatError::ExportHardware {
            path: h.path.to_string(),
            what: match &h.missing {
                Some(why) => format!("{} ({why})", h.what),
                None => h.what.clone(),
            },
        });
    }
    let spec = &vmi.spec.domain;
    let features = spec.features.clone().unwrap_or_default();
    let mut devices = Vec::new();

    // interface
    let ifaces = vmi
        .spec
        .domain
        .devices
        .interfaces
        .as_deref()
        .unwrap_or_default();
    for d in plan.devices_of(DeviceClass::Nic) {
        devices.push(Device::Interface(interface(ctx, plan, d, ifaces)?));
    }
    // channel
    for d in plan.devices_of(DeviceClass::Channel) {
        if let qemu::Device::Virtserialport(p) = &d.device {
            let source = match (&d.backend, p.name.as_str()) {
                // KubeVirt leaves the guest agent's socket path to libvirt.
                (_, "org.qemu.guest_agent.0") => None,
                (Backend::Chardev(c), _) => match &c.addr {
                    qlauncher_core::cmdline::qemu::SocketAddr::Path(path) => Some(SourceModePath {
                        mode: "bind".into(),
                        path: path.clone(),
                    }),
                    qlauncher_core::cmdline::qemu::SocketAddr::Fd(_) => None,
                },
                _ => None,
            };
            devices.push(Device::Channel(Channel {
                type_: "unix".into(),
                source,
                target: ChannelTarget {
                    name: p.name.clone(),
                    type_: "virtio".into(),
                },
            }));
        }
    }
    // hostdev
    devices.extend(hostdevs(plan).into_iter().map(Device::HostDev));
    // controller
    controllers(plan, &mut devices);
    // video, graphics
    for d in plan.devices_of(DeviceClass::Video) {
        if let qemu::Device::Video(v) = &d.device {
            let (type_, vram) = match v.driver {
                "VGA" => ("vga", Some(16384)),
                "bochs-display" => ("bochs", None),
                _ => ("virtio", None),
            };
            devices.push(Device::Video(Video {
                model: VideoModel {
                    type_: type_.into(),
                    heads: Some(1),
                    vram,
                },
                address: address(d),
            }));
        }
    }
    if let Some(socket) = &plan.vnc {
        devices.push(Device::Graphics(Graphics {
            type_: "vnc".into(),
            listen: GraphicsListen {
                type_: "socket".into(),
                socket: socket.clone(),
            },
        }));
    }
    // memballoon
    let mut balloon = None;
    for d in plan.devices_of(DeviceClass::Balloon) {
        if let qemu::Device::VirtioBalloon(b) = &d.device {
            balloon = Some(Memballoon {
                model: virtio_model(b.driver),
                free_page_reporting: b.free_page_reporting.map(on_off),
                stats: plan.balloon_stats_period.map(|period| Stats { period }),
                address: address(d),
            });
        }
    }
    devices.push(Device::Memballoon(balloon.unwrap_or(Memballoon {
        model: "none".into(),
        free_page_reporting: None,
        stats: None,
        address: None,
    })));
    // disk
    for d in plan.devices_of(DeviceClass::Disk) {
        devices.push(Device::Disk(Box::new(disk(vmi, d)?)));
    }
    // input
    for d in plan.devices_of(DeviceClass::Input) {
        let (bus, model) = if d.device.driver().starts_with("virtio") {
            ("virtio", Some("virtio".to_string()))
        } else {
            ("usb", None)
        };
        devices.push(Device::Input(Input {
            type_: "tablet".into(),
            bus: bus.into(),
            model,
            alias: alias(d.device.id()),
            address: address(d),
        }));
    }
    // serial, console
    for d in plan.devices_of(DeviceClass::Serial) {
        if let (qemu::Device::IsaSerial(s), Backend::Chardev(c)) = (&d.device, &d.backend) {
            let path = match &c.addr {
                qlauncher_core::cmdline::qemu::SocketAddr::Path(p) => p.clone(),
                qlauncher_core::cmdline::qemu::SocketAddr::Fd(fd) => format!("/dev/fd/{fd}"),
            };
            devices.push(Device::Serial(Serial {
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
            }));
            devices.push(Device::Console(Console {
                type_: "pty".into(),
                target: PortTarget {
                    type_: Some("serial".into()),
                    port: s.index,
                },
            }));
        }
    }
    // watchdog
    for d in plan.devices_of(DeviceClass::Watchdog) {
        let action = match plan.watchdog_action.unwrap_or(WatchdogAction::Reset) {
            WatchdogAction::Reset => "reset",
            WatchdogAction::Poweroff => "poweroff",
            WatchdogAction::Pause => "pause",
            WatchdogAction::None => "none",
            WatchdogAction::InjectNmi => "inject-nmi",
            WatchdogAction::Shutdown => "shutdown",
        };
        devices.push(Device::Watchdog(Watchdog {
            model: d.device.driver().into(),
            action: action.into(),
            alias: alias(d.device.id()),
            address: address(d),
        }));
    }
    // rng
    for d in plan.devices_of(DeviceClass::Rng) {
        let source = match &d.backend {
            Backend::Object(Object::RngRandom(o)) => o.filename.clone(),
            _ => "/dev/urandom".into(),
        };
        devices.push(Device::Rng(Rng {
            model: virtio_model(d.device.driver()),
            backend: RngBackend {
                model: "random".into(),
                source,
            },
            address: address(d),
        }));
    }
    // sound (the card; its hda codec is implied by the model)
    for d in plan.devices_of(DeviceClass::Sound) {
        if let qemu::Device::Sound(s) = &d.device {
            let model = match s.driver {
                "ich9-intel-hda" => "ich9",
                "AC97" => "ac97",
                _ => continue,
            };
            devices.push(Device::Sound(Sound {
                model: model.into(),
                alias: alias(&s.id),
                address: address(d),
            }));
        }
    }
    // tpm
    for d in plan.devices_of(DeviceClass::Tpm) {
        let persistent = spec.devices.tpm.as_ref().and_then(|t| t.persistent) == Some(true);
        devices.push(Device::Tpm(Tpm {
            model: d.device.driver().into(),
            backend: TpmBackend {
                type_: "emulator".into(),
                version: "2.0".into(),
                persistent_state: persistent.then(|| "yes".into()),
            },
        }));
    }
    // vsock
    for d in plan.devices_of(DeviceClass::Vsock) {
        if let qemu::Device::VhostVsock(v) = &d.device {
            devices.push(Device::Vsock(Vsock {
                model: "virtio-non-transitional".into(),
                cid: Cid {
                    auto: "no".into(),
                    address: v.guest_cid,
                },
                address: address(d),
            }));
        }
    }

    Ok(Domain {
        type_: match plan.accel {
            Accel::Kvm => "kvm",
            Accel::Tcg => "qemu",
        }
        .into(),
        xmlns_qemu: "http://libvirt.org/schemas/domain/qemu/1.0".into(),
        name: plan.name.clone(),
        memory: Memory {
            unit: "b".into(),
            value: plan.memory.size,
        },
        max_memory: plan.memory.maxmem.map(|value| MaxMemory {
            unit: "b".into(),
            slots: 0,
            value,
        }),
        memory_backing: memory_backing(plan),
        os: os(vmi, plan),
        sysinfo: Some(sysinfo(plan)),
        devices: Devices { items: devices },
        clock: clock(vmi),
        metadata: Metadata {
            kubevirt: KubevirtMetadata {
                xmlns: "http://kubevirt.io".into(),
                uid: vmi.metadata.uid.clone().unwrap_or_default(),
            },
        },
        features: domain_features(&features, plan),
        cpu: cpu(vmi, plan),
        vcpu: Vcpu {
            placement: "static".into(),
            count: plan.smp.maxcpus.max(plan.smp.cpus),
        },
        vcpus: vcpus(plan),
        iothreads: {
            let n = plan
                .objects
                .iter()
                .filter(|o| matches!(o, Object::Iothread(_)))
                .count() as u32;
            (n > 0).then_some(n)
        },
        on_reboot: plan.no_reboot.then(|| "destroy".into()),
    })
}

/// Serialises a domain as indented XML (two spaces, like `xml.MarshalIndent` in KubeVirt).
pub fn to_xml(domain: &Domain) -> Result<String, CompatError> {
    let mut out = String::new();
    let mut ser = quick_xml::se::Serializer::new(&mut out);
    ser.indent(' ', 2);
    serde::Serialize::serialize(domain, ser).map_err(CompatError::SerializeXml)?;
    out.push('\n');
    Ok(out)
}
