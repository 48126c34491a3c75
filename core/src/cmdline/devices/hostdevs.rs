//! Host devices passed through with VFIO (`compute/host_device.go`, `device/hostdevice/`):
//! `devices.gpus[]` (`ua-gpu-<name>`), `devices.hostDevices[]` (`ua-hostdevice-<name>`) and
//! interfaces with the `sriov` binding (`ua-sriov-<name>`, with the interface's boot order),
//! rendered as libvirt renders KubeVirt's `<hostdev mode="subsystem" type="pci" managed="no">`:
//! `vfio-pci` with `host=<DDDD:BB:SS.F>` on its own root port; a mediated device (vGPU) as
//! `vfio-pci` with `sysfsdev=/sys/bus/mdev/devices/<uuid>`, and for GPUs KubeVirt's default
//! display (`display=on`, plus `ramfb`, which libvirt puts on `vfio-pci-nohotplug`).
//!
//! The host address comes from the context (`ctx.host_devices`, filled from the device plugins'
//! `PCI_RESOURCE_*` variables by `context::host_devices_from_env`). A device the context does not
//! know is still planned (without `host`) and listed in `plan.hardware` as missing, so the
//! launcher refuses to start with the VMI field path (`DomainPlan::missing_hardware`) while
//! conversion itself stays a pure function of the VMI. DRA claims and fixed guest PCI addresses
//! are rejected.
//!
//! Reads: `ctx.host_devices`.

use super::super::context::{host_device_id, ConverterContext, HostDeviceKind, HostDeviceSource};
use super::super::error::{ConvertError, FieldPath};
use super::super::names::check_name;
use super::super::plan::{
    Backend, DeviceClass, DomainPlan, HardwareNeed, Placement, PlannedDevice,
};
use super::super::qemu::{Device, DeviceVfioPci};
use super::devices_path;
use crate::vmi::Vmi;

/// Adds one VFIO device per GPU, host device and SR-IOV interface.
pub struct HostDevicesConfigurator;

/// `DDDD:BB:SS.F` in hex (the form device plugins and libvirt use).
fn is_pci_address(a: &str) -> bool {
    let b = a.as_bytes();
    let hex = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_hexdigit);
    b.len() == 12
        && hex(0..4)
        && b[4] == b':'
        && hex(5..7)
        && b[7] == b':'
        && hex(8..10)
        && b[10] == b'.'
        && (b'0'..=b'7').contains(&b[11])
}

/// A mediated device UUID (`8-4-4-4-12` hex digits).
fn is_uuid(u: &str) -> bool {
    let parts: Vec<&str> = u.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// What one VMI entry asks for.
struct Request<'a> {
    kind: HostDeviceKind,
    name: &'a str,
    path: FieldPath,
    what: String,
    bootindex: Option<u32>,
    /// vGPU display (`virtualGPUOptions.display`): `(display, ramfb)`.
    display: (bool, bool),
}

fn plan_device(ctx: &ConverterContext, r: Request<'_>, plan: &mut DomainPlan) {
    let id = host_device_id(r.kind, r.name);
    let mut dev = DeviceVfioPci {
        driver: "vfio-pci",
        host: None,
        id: id.clone(),
        sysfsdev: None,
        display: None,
        ramfb: None,
        bootindex: r.bootindex,
    };
    let missing = match ctx.host_devices.get(&id) {
        Some(HostDeviceSource::Pci(a)) if is_pci_address(a) => {
            dev.host = Some(a.to_ascii_lowercase());
            None
        }
        Some(HostDeviceSource::Mdev(u)) if is_uuid(u) => {
            dev.sysfsdev = Some(format!("/sys/bus/mdev/devices/{}", u.to_ascii_lowercase()));
            let (display, ramfb) = r.display;
            if display {
                dev.display = Some("on");
                if ramfb {
                    dev.driver = "vfio-pci-nohotplug";
                    dev.ramfb = Some(true);
                }
            }
            None
        }
        Some(HostDeviceSource::Pci(a) | HostDeviceSource::Mdev(a)) => {
            Some(format!("the pod reported a malformed address {a:?}"))
        }
        None => Some("no such device is allocated to the pod on this node".to_string()),
    };
    plan.hardware.push(HardwareNeed {
        path: r.path,
        id,
        what: r.what,
        missing,
    });
    plan.devices.push(PlannedDevice {
        class: DeviceClass::HostDevice,
        name: Some(r.name.to_string()),
        backend: Backend::None,
        device: Device::VfioPci(dev),
        placement: Placement::RootPort,
        address: None,
        hotpluggable: false,
        target: None,
        iommu_platform: false,
    });
}

/// The resource name of a device-plugin device; DRA claims are rejected.
fn resource<'a>(
    device_name: Option<&'a str>,
    claim: Option<&str>,
    p: &FieldPath,
) -> Result<&'a str, ConvertError> {
    if claim.is_some() {
        return Err(ConvertError::unsupported(
            p.key("claimName"),
            "devices from DRA resource claims",
        ));
    }
    match device_name {
        Some(r) if !r.is_empty() => Ok(r),
        _ => Err(ConvertError::missing(
            p.key("deviceName"),
            "the device plugin resource name",
        )),
    }
}

impl super::super::convert::Configurator for HostDevicesConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let devs = &vmi.spec.domain.devices;
        let gpus = devs.gpus.as_deref().unwrap_or_default();
        // KubeVirt's vGPU display (`CreateMDEVHostDevices` with the GPUs' default display on,
        // `createMDEVHostDeviceWithDisplay`): a GPU with display options has the display unless
        // it is disabled, with ramfb unless that is disabled; when no GPU sets display options,
        // only the first mediated GPU gets one (display and ramfb: QEMU has one ramfb).
        let display_set = gpus.iter().any(|g| {
            g.virtual_gpu_options
                .as_ref()
                .is_some_and(|o| o.display.is_some())
        });
        let mut default_display = !display_set;
        for (i, g) in gpus.iter().enumerate() {
            let p = devices_path().key("gpus").index(i);
            check_name(&p.key("name"), &g.name)?;
            let r = resource(g.device_name.as_deref(), g.claim_name.as_deref(), &p)?;
            let mdev = matches!(
                ctx.host_devices
                    .get(&host_device_id(HostDeviceKind::Gpu, &g.name)),
                Some(HostDeviceSource::Mdev(_))
            );
            let display = match g
                .virtual_gpu_options
                .as_ref()
                .and_then(|o| o.display.as_ref())
            {
                Some(d) if d.enabled != Some(false) => (
                    true,
                    d.ram_fb.as_ref().is_none_or(|f| f.enabled != Some(false)),
                ),
                Some(_) => (false, false),
                None if mdev && default_display => {
                    default_display = false;
                    (true, true)
                }
                None => (false, false),
            };
            plan_device(
                ctx,
                Request {
                    kind: HostDeviceKind::Gpu,
                    name: &g.name,
                    path: p,
                    what: format!("a GPU of resource {r}"),
                    bootindex: None,
                    display,
                },
                plan,
            );
        }
        for (i, h) in devs
            .host_devices
            .as_deref()
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let p = devices_path().key("hostDevices").index(i);
            check_name(&p.key("name"), &h.name)?;
            let r = resource(h.device_name.as_deref(), h.claim_name.as_deref(), &p)?;
            plan_device(
                ctx,
                Request {
                    kind: HostDeviceKind::Generic,
                    name: &h.name,
                    path: p,
                    what: format!("a host device of resource {r}"),
                    bootindex: None,
                    display: (false, false),
                },
                plan,
            );
        }
        for (i, iface) in devs
            .interfaces
            .as_deref()
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            if iface.sriov.is_none() || iface.state.as_deref() == Some("absent") {
                continue;
            }
            let p = devices_path().key("interfaces").index(i);
            check_name(&p.key("name"), &iface.name)?;
            if iface.pci_address.is_some() {
                return Err(ConvertError::unsupported(
                    p.key("pciAddress"),
                    "a fixed PCI address",
                ));
            }
            if iface.boot_order == Some(0) {
                return Err(ConvertError::invalid(
                    p.key("bootOrder"),
                    "boot order starts at 1",
                ));
            }
            plan_device(
                ctx,
                Request {
                    kind: HostDeviceKind::Sriov,
                    name: &iface.name,
                    path: p,
                    what: format!("an SR-IOV VF for network {:?}", iface.name),
                    bootindex: iface.boot_order,
                    display: (false, false),
                },
                plan,
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::convert;
    use crate::cmdline::plan::MissingHardware;
    use serde_json::{json, Value};

    fn vmi(spec: Value) -> Vmi {
        serde_json::from_value(json!({
            "metadata": {"name": "t", "namespace": "ns", "uid": "uid1"},
            "spec": spec
        }))
        .unwrap()
    }

    fn gpu_vmi() -> Vmi {
        vmi(json!({
            "domain": {
                "devices": {
                    "gpus": [{"name": "gpu1", "deviceName": "nvidia.com/GA102GL_A10"}],
                    "hostDevices": [{"name": "nic1", "deviceName": "intel.com/x710"}],
                    "interfaces": [{"name": "vf", "sriov": {}, "bootOrder": 2}]
                },
                "memory": {"guest": "256Mi"}
            },
            "networks": [{"name": "vf", "multus": {"networkName": "sriov-net"}}]
        }))
    }

    #[test]
    fn devices_the_pod_lacks_are_planned_and_reported_missing() {
        let plan = convert(&gpu_vmi(), &ConverterContext::default()).unwrap();
        let missing = plan.missing_hardware();
        let reason = "no such device is allocated to the pod on this node";
        assert_eq!(
            missing,
            vec![
                MissingHardware {
                    path: FieldPath::new("spec.domain.devices.gpus[0]"),
                    id: "ua-gpu-gpu1".into(),
                    reason: format!("a GPU of resource nvidia.com/GA102GL_A10: {reason}"),
                },
                MissingHardware {
                    path: FieldPath::new("spec.domain.devices.hostDevices[0]"),
                    id: "ua-hostdevice-nic1".into(),
                    reason: format!("a host device of resource intel.com/x710: {reason}"),
                },
                MissingHardware {
                    path: FieldPath::new("spec.domain.devices.interfaces[0]"),
                    id: "ua-sriov-vf".into(),
                    reason: format!("an SR-IOV VF for network \"vf\": {reason}"),
                },
            ]
        );
        assert_eq!(
            missing[0].to_string(),
            format!(
                "spec.domain.devices.gpus[0]: a GPU of resource nvidia.com/GA102GL_A10: {reason} (ua-gpu-gpu1)"
            )
        );
    }

    #[test]
    fn devices_the_pod_has_render_with_their_host_address() {
        let mut ctx = ConverterContext::default();
        ctx.host_devices.insert(
            "ua-gpu-gpu1".into(),
            HostDeviceSource::Mdev("53764D0E-85a0-42b4-af5c-2046b460b1dc".into()),
        );
        ctx.host_devices.insert(
            "ua-hostdevice-nic1".into(),
            HostDeviceSource::Pci("0000:81:00.1".into()),
        );
        ctx.host_devices.insert(
            "ua-sriov-vf".into(),
            HostDeviceSource::Pci("0000:3B:02.7".into()),
        );
        let plan = convert(&gpu_vmi(), &ctx).unwrap();
        assert_eq!(plan.missing_hardware(), vec![]);
        let vfio: Vec<_> = plan
            .devices_of(DeviceClass::HostDevice)
            .map(crate::cmdline::render::device_json)
            .collect();
        assert_eq!(
            vfio,
            vec![
                json!({"driver": "vfio-pci-nohotplug", "id": "ua-gpu-gpu1",
                    "sysfsdev": "/sys/bus/mdev/devices/53764d0e-85a0-42b4-af5c-2046b460b1dc",
                    "display": "on", "ramfb": true, "bus": "pci.6", "addr": "0x0"}),
                json!({"driver": "vfio-pci", "host": "0000:81:00.1", "id": "ua-hostdevice-nic1",
                    "bus": "pci.7", "addr": "0x0"}),
                json!({"driver": "vfio-pci", "host": "0000:3b:02.7", "id": "ua-sriov-vf",
                    "bootindex": 2, "bus": "pci.8", "addr": "0x0"}),
            ]
        );
    }

    /// KubeVirt's vGPU display: by default only the first mediated GPU has one (with ramfb);
    /// display options decide for their GPU, ramfb on unless disabled.
    #[test]
    fn vgpu_displays_follow_kubevirts_defaults() {
        let uuid = |n: u32| format!("53764d0e-85a0-42b4-af5c-2046b460b1d{n}");
        let displays = |gpus: Value| {
            let v =
                vmi(json!({"domain": {"devices": {"gpus": gpus}, "memory": {"guest": "256Mi"}}}));
            let mut ctx = ConverterContext::default();
            for (i, g) in v.spec.domain.devices.gpus.iter().flatten().enumerate() {
                let source = if g.name.starts_with('p') {
                    HostDeviceSource::Pci(format!("0000:81:00.{i}"))
                } else {
                    HostDeviceSource::Mdev(uuid(i as u32))
                };
                ctx.host_devices
                    .insert(host_device_id(HostDeviceKind::Gpu, &g.name), source);
            }
            let plan = convert(&v, &ctx).unwrap();
            plan.devices_of(DeviceClass::HostDevice)
                .map(|d| match &d.device {
                    Device::VfioPci(v) => (v.display, v.ramfb),
                    _ => unreachable!(),
                })
                .collect::<Vec<_>>()
        };
        let gpu = |name: &str| json!({"name": name, "deviceName": "nvidia.com/x"});
        let on = (Some("on"), Some(true));
        let off = (None, None);
        assert_eq!(
            displays(json!([gpu("p0"), gpu("v1"), gpu("v2")])),
            [off, on, off]
        );
        let mut with = gpu("v1");
        with["virtualGPUOptions"] = json!({"display": {"enabled": true}});
        assert_eq!(displays(json!([gpu("v0"), with.clone()])), [off, on]);
        with["virtualGPUOptions"] = json!({"display": {"ramFB": {"enabled": false}}});
        assert_eq!(displays(json!([with.clone()])), [(Some("on"), None)]);
        with["virtualGPUOptions"] = json!({"display": {"enabled": false}});
        assert_eq!(displays(json!([with, gpu("v1")])), [off, off]);
    }

    #[test]
    fn malformed_addresses_are_missing_not_rendered() {
        let mut ctx = ConverterContext::default();
        for bad in ["0000:81:00.1,x", "81:00.1", "0000:81:00.8"] {
            ctx.host_devices
                .insert("ua-gpu-gpu1".into(), HostDeviceSource::Pci(bad.into()));
            let plan = convert(&gpu_vmi(), &ctx).unwrap();
            let m = plan.missing_hardware();
            assert_eq!(m[0].id, "ua-gpu-gpu1", "{bad}");
            assert!(m[0].reason.contains("malformed"), "{bad}: {}", m[0].reason);
        }
    }

    #[test]
    fn dra_claims_and_fixed_addresses_are_rejected_with_their_path() {
        let v = vmi(json!({
            "domain": {"devices": {"gpus": [{"name": "g", "claimName": "c", "requestName": "r"}]},
                "memory": {"guest": "256Mi"}}
        }));
        let e = convert(&v, &ConverterContext::default()).unwrap_err();
        assert_eq!(e.path().as_str(), "spec.domain.devices.gpus[0].claimName");
        let v = vmi(json!({
            "domain": {"devices": {"interfaces": [{"name": "vf", "sriov": {}, "pciAddress": "0000:00:05.0"}]},
                "memory": {"guest": "256Mi"}},
            "networks": [{"name": "vf", "multus": {"networkName": "n"}}]
        }));
        let e = convert(&v, &ConverterContext::default()).unwrap_err();
        assert_eq!(
            e.path().as_str(),
            "spec.domain.devices.interfaces[0].pciAddress"
        );
    }
}
