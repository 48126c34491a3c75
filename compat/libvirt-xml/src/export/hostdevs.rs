//! `<hostdev>`: GPUs, `hostDevices` and SR-IOV interfaces passed through with VFIO, as KubeVirt
//! v1.9's `device/hostdevice` package writes them (`generic/`, `gpu/`, `sriov/`, `hostdev.go`) and
//! its converter lists them (`compute/host_device.go`: generic host devices, then GPUs, then
//! SR-IOV; within each, PCI functions before mediated devices).
//!
//! Read from the plan's `vfio-pci` devices: `host=DDDD:BB:SS.F` is a PCI function
//! (`managed="no"`, `<source><address domain bus slot function/>`), `sysfsdev=/sys/bus/mdev/
//! devices/<uuid>` a mediated device (`model="vfio-pci"`, `<source><address uuid/>`, the vGPU's
//! `display` and `ramfb`); the QEMU id is the alias, `bootindex` the `<boot order>` KubeVirt gives
//! an SR-IOV interface with a `bootOrder`, and the PCI pass's address the guest address. KubeVirt
//! sets no MAC and no ROM on a host device: an SR-IOV VF's MAC is the VF's own (set by the SR-IOV
//! CNI), and `api.HostDevice` has no `<rom>`.

use super::*;

/// KubeVirt's alias prefixes (`ua-` + `generic.AliasPrefix`, `gpu.AliasPrefix`,
/// `deviceinfo.SRIOVAliasPrefix`), in the converter's order.
pub(super) const HOST_DEVICE_PREFIXES: [&str; 3] = ["ua-hostdevice-", "ua-gpu-", "ua-sriov-"];

/// True for the QEMU id of a GPU, host device or SR-IOV VF.
pub(super) fn is_host_device_id(id: &str) -> bool {
    HOST_DEVICE_PREFIXES.iter().any(|p| id.starts_with(p))
}

/// `DDDD:BB:SS.F` as libvirt's source address (`0x0000`, `0x65`, `0x00`, `0x0`); `None` for a
/// malformed address (the converter plans none: it lists the device as missing).
pub fn host_pci_address(bdf: &str) -> Option<HostAddress> {
    let (domain, rest) = bdf.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (slot, function) = rest.split_once('.')?;
    let hex = |s: &str, n: usize| {
        (s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| format!("0x{}", s.to_ascii_lowercase()))
    };
    Some(HostAddress {
        domain: Some(hex(domain, 4)?),
        bus: Some(hex(bus, 2)?),
        slot: Some(hex(slot, 2)?),
        function: Some(hex(function, 1)?),
        uuid: None,
    })
}

/// The `<hostdev>` of one planned VFIO device; `None` for a device without a host side (the
/// context did not report it: [`export`] refuses such plans first).
pub(super) fn hostdev(d: &PlannedDevice) -> Option<HostDev> {
    let qemu::Device::VfioPci(v) = &d.device else {
        return None;
    };
    let (type_, managed, model, host) = match (&v.host, &v.sysfsdev) {
        (Some(host), _) => ("pci", Some("no"), None, host_pci_address(host)?),
        (None, Some(sysfs)) => {
            let uuid = sysfs.rsplit('/').next().unwrap_or_default();
            let address = HostAddress {
                domain: None,
                bus: None,
                slot: None,
                function: None,
                uuid: Some(uuid.to_string()),
            };
            ("mdev", None, Some("vfio-pci"), address)
        }
        (None, None) => return None,
    };
    Some(HostDev {
        mode: "subsystem".into(),
        type_: type_.into(),
        managed: managed.map(Into::into),
        model: model.map(Into::into),
        display: v.display.map(Into::into),
        ramfb: v.ramfb.map(on_off),
        source: HostDevSource { address: host },
        boot: v.bootindex.map(|order| BootOrder { order }),
        alias: alias(&v.id),
        address: address(d),
    })
}

/// The plan's host devices in KubeVirt's order (see the module doc).
pub(super) fn hostdevs(plan: &DomainPlan) -> Vec<HostDev> {
    let mut out: Vec<(usize, bool, HostDev)> = plan
        .devices_of(DeviceClass::HostDevice)
        .filter_map(hostdev)
        .filter_map(|h| {
            let rank = HOST_DEVICE_PREFIXES
                .iter()
                .position(|p| h.alias.name.starts_with(p))?;
            Some((rank, h.type_ == "mdev", h))
        })
        .collect();
    // Stable: the VMI's order within a rank and kind.
    out.sort_by_key(|(rank, mdev, _)| (*rank, *mdev));
    out.into_iter().map(|(_, _, h)| h).collect()
}
