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
//! Layout: this file holds [`export`] (the element order of `<domain>`), the walk of
//! `<devices>` class by class (`devices`) and the address helpers; `domain.rs` exports memory
//! backing, `<os>`, `<sysinfo>` and `<clock>`, `cpu.rs` `<features>`, `<cpu>` and `<vcpus>`,
//! `devices.rs` controllers, interfaces and the other single-element devices (channels, video,
//! graphics, memballoon, input, serial and console, watchdog, rng, sound, TPM, vsock),
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
    check_hardware(plan)?;
    let features = vmi.spec.domain.features.clone().unwrap_or_default();
    let devices = devices(vmi, ctx, plan)?;

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
        clock: clock(plan),
        commandline: commandline(plan),
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
        launch_security: launch_security(plan),
        on_reboot: plan.no_reboot.then(|| "destroy".into()),
    })
}

/// Refuses a plan that needs host hardware the context did not report, or hardware the exporter
/// does not write (TDX) ([`CompatError::ExportHardware`], naming the field).
fn check_hardware(plan: &DomainPlan) -> Result<(), CompatError> {
    let written = |id: &str| {
        is_host_device_id(id)
            || plan
                .devices_of(DeviceClass::Filesystem)
                .any(|d| d.device.id() == id)
            || plan
                .launch_security
                .as_ref()
                .is_some_and(|l| l.id == id && launch_security_type(l.qom_type).is_some())
    };
    if let Some(h) = plan
        .hardware
        .iter()
        .find(|h| h.missing.is_some() || !written(&h.id))
    {
        return Err(CompatError::ExportHardware {
            path: h.path.to_string(),
            what: match &h.missing {
                Some(why) => format!("{} ({why})", h.what),
                None => h.what.clone(),
            },
        });
    }
    Ok(())
}

/// libvirt's `<launchSecurity type>` for QEMU's confidential-guest object type (`None`: TDX,
/// which the exporter does not write).
fn launch_security_type(qom_type: &str) -> Option<&'static str> {
    match qom_type {
        "sev-guest" => Some("sev"),
        "sev-snp-guest" => Some("sev-snp"),
        _ => None,
    }
}

/// `<launchSecurity>` of an SEV or SEV-SNP guest: the type and the policy in hex, as KubeVirt's
/// `amd64LaunchSecurity` writes it, with the host's C-bit position and reduced physical bits
/// libvirt adds.
fn launch_security(plan: &DomainPlan) -> Option<LaunchSecurity> {
    let l = plan.launch_security.as_ref()?;
    Some(LaunchSecurity {
        type_: launch_security_type(l.qom_type)?.into(),
        cbitpos: l.cbitpos,
        reduced_phys_bits: l.reduced_phys_bits,
        policy: l.policy.map(|p| format!("{p:#x}")),
    })
}

/// The `<devices>` children in KubeVirt's order, class by class: interfaces, channels, host
/// devices, controllers, video and graphics, the memballoon, disks, inputs, serial ports with
/// their consoles, watchdog, rng, filesystems, sound, TPM, vsock. A device class that is not walked here is
/// missing from the export (and from GetDomain).
fn devices(
    vmi: &Vmi,
    ctx: &ConverterContext,
    plan: &DomainPlan,
) -> Result<Vec<Device>, CompatError> {
    let mut devices = Vec::new();
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
    let channels = plan.devices_of(DeviceClass::Channel).filter_map(channel);
    devices.extend(channels.map(Device::Channel));
    devices.extend(hostdevs(plan).into_iter().map(Device::HostDev));
    controllers(plan, &mut devices);
    let videos = plan.devices_of(DeviceClass::Video).filter_map(video);
    devices.extend(videos.map(Device::Video));
    devices.extend(graphics(plan).map(Device::Graphics));
    devices.push(Device::Memballoon(memballoon(plan)));
    for d in plan.devices_of(DeviceClass::Disk) {
        devices.push(Device::Disk(Box::new(disk(vmi, plan, d)?)));
    }
    devices.extend(
        plan.devices_of(DeviceClass::Input)
            .map(|d| Device::Input(input(d))),
    );
    for (serial, console) in plan
        .devices_of(DeviceClass::Serial)
        .filter_map(serial_console)
    {
        devices.push(Device::Serial(serial));
        devices.push(Device::Console(console));
    }
    let watchdogs = plan.devices_of(DeviceClass::Watchdog);
    devices.extend(watchdogs.map(|d| Device::Watchdog(watchdog(plan, d))));
    devices.extend(
        plan.devices_of(DeviceClass::Rng)
            .map(|d| Device::Rng(rng(d))),
    );
    for d in plan.devices_of(DeviceClass::Filesystem) {
        devices.push(Device::Filesystem(filesystem(d)?));
    }
    let sounds = plan.devices_of(DeviceClass::Sound).filter_map(sound);
    devices.extend(sounds.map(Device::Sound));
    devices.extend(
        plan.devices_of(DeviceClass::Tpm)
            .map(|d| Device::Tpm(tpm(vmi, d))),
    );
    let vsocks = plan.devices_of(DeviceClass::Vsock).filter_map(vsock);
    devices.extend(vsocks.map(Device::Vsock));
    Ok(devices)
}

/// `<qemu:commandline>` of the words and variables a hook added (`DomainPlan::extra_args`,
/// `extra_env`); `None` when there are none, as KubeVirt writes no element then.
fn commandline(plan: &DomainPlan) -> Option<Commandline> {
    if plan.extra_args.is_empty() && plan.extra_env.is_empty() {
        return None;
    }
    Some(Commandline {
        env: plan
            .extra_env
            .iter()
            .map(|(name, value)| QemuEnv {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
        arg: plan
            .extra_args
            .iter()
            .map(|value| QemuArg {
                value: value.clone(),
            })
            .collect(),
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
