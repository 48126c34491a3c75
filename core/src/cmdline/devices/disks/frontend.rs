//! The guest-visible half of a disk, one QEMU device per bus as libvirt renders KubeVirt's
//! `<disk>`: `virtio-blk-pci[-non-transitional]` on its own root port (hot-pluggable when the
//! volume is), `ide-hd`/`ide-cd` on an AHCI port, `scsi-hd`/`scsi-cd`/`scsi-block` on `scsi0.0`
//! (hot-pluggable when it has an image; `device_id` is libvirt's VPD id, the serial or
//! `drive-<alias>`), `usb-storage` on the xHCI bus.

use super::buses::{sata_bus, scsi_lun, Bus, Kind};
use super::drive::DriveOptions;
use crate::cmdline::context::StorageKind;
use crate::cmdline::devices::virtio_driver;
use crate::cmdline::error::{ConvertError, FieldPath};
use crate::cmdline::plan::Placement;
use crate::cmdline::qemu::{Device, DeviceDiskFrontend, DeviceVirtioBlk};
use crate::vmi::Vmi;

/// Everything the frontend of one disk depends on.
pub(super) struct Frontend<'a> {
    /// The VMI (virtio model).
    pub(super) vmi: &'a Vmi,
    /// `spec.domain.devices.disks[i]`.
    pub(super) path: FieldPath,
    /// Disk, cdrom or LUN.
    pub(super) kind: Kind,
    /// The bus.
    pub(super) bus: Bus,
    /// Read-only (disk and LUN `readonly`; cdroms always).
    pub(super) read_only: bool,
    /// The index of the target name (`sdc` -> 2).
    pub(super) index: usize,
    /// The QEMU id (`ua-<name>`).
    pub(super) id: String,
    /// Boot order.
    pub(super) bootindex: Option<u32>,
    /// The top blockdev node (none for an empty cdrom).
    pub(super) drive: Option<String>,
    /// Drive options.
    pub(super) opts: DriveOptions,
    /// IOThread id (virtio).
    pub(super) iothread: Option<String>,
    /// Queue count (virtio, `blockMultiQueue`).
    pub(super) num_queues: Option<u32>,
    /// The volume is a hotplug volume.
    pub(super) hotplug: bool,
    /// File or block device (a LUN on a block device is `scsi-block`).
    pub(super) storage: StorageKind,
}

/// The frontend device, its placement and whether it is hot-pluggable.
pub(super) fn device(f: Frontend<'_>) -> Result<(Device, Placement, bool), ConvertError> {
    let o = f.opts;
    let (lbs, pbs, dg) = o.block_sizes;
    let p = &f.path;
    Ok(match f.bus {
        Bus::Virtio => {
            let drive = f.drive.ok_or_else(|| {
                ConvertError::missing(p.key("name"), "a volume for a virtio disk")
            })?;
            (
                Device::VirtioBlk(DeviceVirtioBlk {
                    driver: virtio_driver(
                        f.vmi,
                        "virtio-blk-pci-non-transitional",
                        "virtio-blk-pci-transitional",
                    ),
                    share_rw: o.share_rw,
                    drive,
                    id: f.id,
                    bootindex: f.bootindex,
                    write_cache: o.write_cache,
                    werror: Some(o.werror),
                    rerror: o.rerror,
                    serial: o.serial,
                    iothread: f.iothread,
                    num_queues: f.num_queues,
                    logical_block_size: lbs,
                    physical_block_size: pbs,
                    discard_granularity: dg,
                }),
                Placement::RootPort,
                f.hotplug,
            )
        }
        Bus::Sata => {
            if f.kind == Kind::Disk && f.read_only {
                return Err(ConvertError::unsupported(
                    p.key("disk").key("readonly"),
                    "a read-only sata disk (ide-hd cannot be read-only; use a cdrom or virtio)",
                ));
            }
            let dev = DeviceDiskFrontend {
                driver: if f.kind == Kind::Cdrom {
                    "ide-cd"
                } else {
                    "ide-hd"
                },
                bus: sata_bus(f.index),
                channel: None,
                scsi_id: None,
                lun: None,
                device_id: None,
                port: None,
                share_rw: o.share_rw,
                drive: f.drive,
                id: f.id,
                bootindex: f.bootindex,
                write_cache: o.write_cache,
                werror: Some(o.werror),
                rerror: o.rerror,
                serial: o.serial,
                logical_block_size: lbs,
                physical_block_size: pbs,
                discard_granularity: dg,
                removable: None,
                wwn: None,
            };
            (Device::DiskFrontend(dev), Placement::NonPci, false)
        }
        Bus::Scsi => {
            let driver = match f.kind {
                Kind::Cdrom => "scsi-cd",
                Kind::Lun if f.storage == StorageKind::Block => "scsi-block",
                _ => "scsi-hd",
            };
            let passthrough = driver == "scsi-block";
            let lun = scsi_lun(f.kind, f.index, p)?;
            let hotpluggable = f.drive.is_some();
            let dev = DeviceDiskFrontend {
                driver,
                bus: "scsi0.0".into(),
                channel: Some(0),
                scsi_id: Some(0),
                lun: Some(lun),
                // libvirt's VPD device id: the serial, else `drive-<alias>`.
                device_id: (!passthrough).then(|| {
                    o.serial
                        .clone()
                        .unwrap_or_else(|| format!("drive-{}", f.id))
                }),
                port: None,
                share_rw: o.share_rw,
                drive: f.drive,
                id: f.id,
                bootindex: f.bootindex,
                write_cache: if passthrough { None } else { o.write_cache },
                werror: Some(o.werror),
                rerror: o.rerror,
                serial: if passthrough { None } else { o.serial },
                logical_block_size: lbs,
                physical_block_size: pbs,
                discard_granularity: dg,
                removable: None,
                wwn: None,
            };
            (Device::DiskFrontend(dev), Placement::NonPci, hotpluggable)
        }
        Bus::Usb => (
            Device::DiskFrontend(DeviceDiskFrontend {
                driver: "usb-storage",
                bus: "usb.0".into(),
                channel: None,
                scsi_id: None,
                lun: None,
                device_id: None,
                port: None,
                share_rw: o.share_rw,
                drive: f.drive,
                id: f.id,
                bootindex: f.bootindex,
                write_cache: o.write_cache,
                werror: Some(o.werror),
                rerror: o.rerror,
                serial: o.serial,
                logical_block_size: lbs,
                physical_block_size: pbs,
                discard_granularity: dg,
                removable: (f.kind == Kind::Cdrom).then_some(true),
                wwn: None,
            }),
            Placement::NonPci,
            false,
        ),
    })
}
