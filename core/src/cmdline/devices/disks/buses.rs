//! Disk kinds and buses: disk / cdrom / LUN on virtio, sata, scsi or usb (sata when empty, as
//! KubeVirt's amd64 defaults), guest target names (`vdX`/`sdX`, reusing
//! `status.volumeStatus[].target`, else the first free index per prefix, KubeVirt's
//! `makeDeviceName`), and the drive addresses libvirt derives from the target index
//! (`virDomainDiskDefAssignAddress`): SATA six units per AHCI controller (q35's built-in one is
//! `ide.0`-`ide.5`, libvirt adds `ahci` controllers `sata<N>` for the rest), SCSI unit = index
//! for disks and LUNs (KubeVirt's `assignDiskToSCSIController`), libvirt's 15-units mapping for
//! SCSI cdroms.

use std::collections::BTreeSet;

use crate::cmdline::devices::{devices_path, planned};
use crate::cmdline::error::{ConvertError, FieldPath};
use crate::cmdline::names::{device_index, device_suffix};
use crate::cmdline::plan::{Backend, DeviceClass, DomainPlan, Placement};
use crate::cmdline::qemu::{Device, DeviceSimple};
use crate::vmi::{Disk, Vmi};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Disk,
    Cdrom,
    Lun,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bus {
    Virtio,
    Sata,
    Scsi,
    Usb,
}

impl Bus {
    /// The bus as the VMI names it (`spec.domain.devices.disks[i].*.bus`).
    pub(super) fn name(self) -> &'static str {
        match self {
            Bus::Virtio => "virtio",
            Bus::Sata => "sata",
            Bus::Scsi => "scsi",
            Bus::Usb => "usb",
        }
    }

    fn prefix(self) -> &'static str {
        if self == Bus::Virtio {
            "vd"
        } else {
            "sd"
        }
    }
}

/// The disk's kind, bus and read-only flag (sata on amd64 when empty, KubeVirt's
/// `pkg/defaults/amd64.go`).
pub(super) fn kind_and_bus(d: &Disk, p: &FieldPath) -> Result<(Kind, Bus, bool), ConvertError> {
    let set = [d.disk.is_some(), d.cdrom.is_some(), d.lun.is_some()]
        .iter()
        .filter(|x| **x)
        .count();
    if set > 1 {
        return Err(ConvertError::invalid(
            p.clone(),
            "only one of disk, cdrom and lun may be set",
        ));
    }
    let (kind, bus, bus_path, ro) = if let Some(c) = &d.cdrom {
        // KubeVirt drops `<readonly/>` for `readonly: false`, but libvirt opens every cdrom
        // read-only whatever the XML says (its cdrom post-parse), so a cdrom is never writable.
        (
            Kind::Cdrom,
            c.bus.as_deref(),
            p.key("cdrom").key("bus"),
            true,
        )
    } else if let Some(l) = &d.lun {
        (
            Kind::Lun,
            Some(l.bus.as_deref().unwrap_or("scsi")),
            p.key("lun").key("bus"),
            l.read_only.unwrap_or(false),
        )
    } else {
        let t = d.disk.as_ref();
        (
            Kind::Disk,
            t.and_then(|t| t.bus.as_deref()),
            p.key("disk").key("bus"),
            t.and_then(|t| t.read_only).unwrap_or(false),
        )
    };
    let bus = match bus.unwrap_or("sata") {
        "" | "sata" => Bus::Sata,
        "virtio" => Bus::Virtio,
        "scsi" => Bus::Scsi,
        "usb" => Bus::Usb,
        other => {
            return Err(ConvertError::unsupported(
                bus_path,
                format!("bus {other:?}"),
            ))
        }
    };
    match (kind, bus) {
        (Kind::Cdrom, Bus::Virtio) => Err(ConvertError::unsupported(
            p.key("cdrom").key("bus"),
            "bus \"virtio\" for a cdrom",
        )),
        (Kind::Lun, Bus::Virtio | Bus::Sata | Bus::Usb) => Err(ConvertError::unsupported(
            p.key("lun").key("bus"),
            "a lun outside the scsi bus",
        )),
        _ => Ok((kind, bus, ro)),
    }
}

/// `status.volumeStatus[].target` of a volume, when it is a well-formed `vdX`/`sdX` name.
fn status_target<'a>(vmi: &'a Vmi, vol: &str) -> Option<&'a str> {
    vmi.status
        .as_ref()?
        .volume_status
        .as_ref()?
        .iter()
        .find(|s| s.name == vol)
        .map(|s| s.target.as_str())
        .filter(|t| {
            (t.starts_with("vd") || t.starts_with("sd"))
                && t.get(2..).and_then(device_index).is_some()
        })
}

/// Target names and their indexes for disks `(position in spec.domain.devices.disks, bus)`, in
/// that order: status targets first (when free), then the first free index per prefix.
pub(super) fn targets(
    vmi: &Vmi,
    disks: &[Disk],
    items: &[(usize, Bus)],
) -> Result<Vec<(String, usize)>, ConvertError> {
    let mut used: BTreeSet<String> = BTreeSet::new();
    let mut names: Vec<Option<String>> = vec![None; items.len()];
    for (k, (i, bus)) in items.iter().enumerate() {
        if let Some(t) = status_target(vmi, &disks[*i].name) {
            if t.starts_with(bus.prefix()) && !used.contains(t) {
                used.insert(t.to_string());
                names[k] = Some(t.to_string());
            }
        }
    }
    for (k, (_, bus)) in items.iter().enumerate() {
        if names[k].is_some() {
            continue;
        }
        let mut n = 0;
        let name = loop {
            let t = format!("{}{}", bus.prefix(), device_suffix(n));
            if !used.contains(&t) {
                break t;
            }
            n += 1;
        };
        used.insert(name.clone());
        names[k] = Some(name);
    }
    names
        .into_iter()
        .map(|t| {
            let t = t.unwrap_or_default();
            let index = t.get(2..).and_then(device_index);
            index.map(|i| (t, i))
        })
        .collect::<Option<_>>()
        .ok_or_else(|| ConvertError::invalid(devices_path().key("disks"), "more than 17576 disks"))
}

/// Adds the `ahci` controllers `sata1`.. libvirt adds for SATA targets beyond `sdf` (every
/// controller index up to the highest one used). `sata` holds `(disk position, target index)`.
pub(super) fn sata_controllers(
    sata: &[(usize, usize)],
    plan: &mut DomainPlan,
) -> Result<(), ConvertError> {
    let mut controllers = 0;
    for &(i, index) in sata {
        let controller = index / 6;
        if controller > 4 {
            return Err(ConvertError::unsupported(
                devices_path().key("disks").index(i).key("name"),
                "a sata target beyond the fifth AHCI controller (sdad)",
            ));
        }
        controllers = controllers.max(controller);
    }
    for controller in 1..=controllers {
        plan.devices.push(planned(
            DeviceClass::Controller,
            None,
            Backend::None,
            Device::Simple(DeviceSimple {
                driver: "ahci",
                id: format!("sata{controller}"),
                bus: None,
                port: None,
            }),
            Placement::RootPort,
        ));
    }
    Ok(())
}

/// The AHCI port of SATA target index `index`: `ide.<unit>` on q35's built-in controller,
/// `sata<N>.<unit>` beyond.
pub(super) fn sata_bus(index: usize) -> String {
    let (controller, unit) = (index / 6, index % 6);
    if controller == 0 {
        format!("ide.{unit}")
    } else {
        format!("sata{controller}.{unit}")
    }
}

/// The SCSI LUN of target index `index` on `scsi0`: KubeVirt gives disks and LUNs
/// `<address type="drive" unit=<index>>`; a cdrom gets libvirt's default mapping of the same
/// index (15 units per controller, unit 7 skipped).
pub(super) fn scsi_lun(kind: Kind, index: usize, p: &FieldPath) -> Result<u32, ConvertError> {
    let lun = if kind == Kind::Cdrom {
        if index >= 15 {
            return Err(ConvertError::unsupported(
                p.key("cdrom").key("bus"),
                "a scsi cdrom beyond target sdo (libvirt would add a second SCSI controller)",
            ));
        }
        if index >= 7 {
            index + 1
        } else {
            index
        }
    } else {
        index
    };
    u32::try_from(lun).map_err(|_| ConvertError::invalid(p.key("name"), "scsi unit out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sata_ports_follow_the_target_index() {
        assert_eq!(sata_bus(0), "ide.0");
        assert_eq!(sata_bus(5), "ide.5");
        assert_eq!(sata_bus(6), "sata1.0");
        assert_eq!(sata_bus(13), "sata2.1");
    }

    #[test]
    fn scsi_units_follow_kubevirt_for_disks_and_libvirt_for_cdroms() {
        let p = FieldPath::new("spec.domain.devices.disks[0]");
        assert_eq!(scsi_lun(Kind::Disk, 2, &p).unwrap(), 2);
        assert_eq!(scsi_lun(Kind::Lun, 9, &p).unwrap(), 9);
        assert_eq!(scsi_lun(Kind::Cdrom, 6, &p).unwrap(), 6);
        assert_eq!(scsi_lun(Kind::Cdrom, 7, &p).unwrap(), 8);
        assert_eq!(scsi_lun(Kind::Cdrom, 14, &p).unwrap(), 15);
        assert_eq!(
            scsi_lun(Kind::Cdrom, 15, &p).unwrap_err().path().as_str(),
            "spec.domain.devices.disks[0].cdrom.bus"
        );
    }
}
