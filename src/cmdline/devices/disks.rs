//! Disks (`converter.go:94-191, 567-946`, `Convert_v1_Volume_To_api_Disk`), rendered as libvirt
//! does with `-blockdev`: a protocol node and a format node per image layer
//! (`libvirt-N-storage`/`libvirt-N-format`, N counting down over all layers in disk order, the
//! backing layer before its overlay), then the frontend.
//!
//! * Paths per volume type (KubeVirt's): containerDisk = qcow2 overlay
//!   `<ephemeral>/disk-data/<vol>/disk.qcow2` over `<container-disks>/disk_<volumeIndex>.img`;
//!   ephemeral = the same overlay over the PVC; PVC/DataVolume = `/dev/<vol>` (block) or
//!   `<private>/vmi-disks/<vol>/disk.img`; hotplug volumes under `<hotplug-disks>`; hostDisk =
//!   `<private>/vmi-disks/<vol>/<basename>`; emptyDisk = `<empty-disks>/<vol>.qcow2`; cloud-init
//!   `<cloud-init>/<ns>/<name>/{noCloud,configdrive}.iso`; configMap/secret/downwardAPI/sysprep
//!   ISOs; serviceAccount; downwardMetrics `vhostmd0`.
//! * Buses: virtio (`virtio-blk-pci-non-transitional`, own root port, hot-pluggable), sata
//!   (`ide-hd`/`ide-cd` on q35's AHCI `ide.0`-`ide.5`, then extra `ahci` controllers `sata<N>`), scsi (`scsi-hd`/`scsi-cd`/`scsi-block` on
//!   `scsi0.0`, LUN = unit, hot-pluggable), usb (`usb-storage`).
//! * Cache: the spec's, else `none` when O_DIRECT works (`VolumeFacts::direct_io`), else
//!   `writethrough`; `none` without O_DIRECT is an error; `shareable` forces `none`. IO: the
//!   spec's, else `native` with cache `none` on a block device or preallocated image.
//! * `discard: unmap` unless preallocated; `errorPolicy` (default `stop`) -> `werror`/`rerror`;
//!   readonly; serial; bootOrder -> `bootindex`; dedicated/pooled IOThreads; `blockMultiQueue`
//!   -> `num-queues`; custom block sizes. Target names `vdX`/`sdX`, reusing
//!   `status.volumeStatus[].target`.
//! * Hotplug volumes (PVC/DataVolume `hotpluggable: true`, or a `hotplugVolume` status) are
//!   included once their phase is `MountedToPod` or `Ready`, and only they are marked
//!   hot-pluggable (virtio and scsi buses), so the QMP plan holds exactly what KubeVirt may
//!   attach or detach at runtime.
//!
//! Reads: `ctx.volumes`, `ctx.paths`.

use std::collections::BTreeSet;

use super::super::context::{Backing as FileOrBlock, ConverterContext, ImageFormat, VolumeFacts};
use super::super::error::{ConvertError, FieldPath};
use super::super::names::{alias, check_name, check_name_len, device_index, device_suffix};
use super::super::plan::{Backend, DeviceClass, DomainPlan, Placement, PlannedDevice};
use super::super::qemu::{
    Aio, Backing, Blockdev, BlockdevCache, BlockdevFormat, BlockdevProtocol, Device,
    DeviceDiskFrontend, DeviceVirtioBlk, FormatDriver, OnError, ProtocolDriver,
};
use super::{devices_path, iothreads, vcpus, virtio_driver, vmi_name, vmi_namespace};
use crate::vmi::{Disk, Vmi, Volume};

/// Adds one planned device per disk.
pub struct DisksConfigurator;

/// One image layer of a disk, bottom first.
#[derive(Debug, Clone, PartialEq)]
struct Layer {
    protocol: ProtocolDriver,
    path: String,
    format: FormatDriver,
    read_only: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Disk,
    Cdrom,
    Lun,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bus {
    Virtio,
    Sata,
    Scsi,
    Usb,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cache {
    None,
    Writethrough,
    Writeback,
}

fn file_or_block(f: &VolumeFacts) -> ProtocolDriver {
    match f.backing {
        FileOrBlock::File => ProtocolDriver::File,
        FileOrBlock::Block => ProtocolDriver::HostDevice,
    }
}

fn fmt_of(f: &VolumeFacts) -> FormatDriver {
    match f.format {
        ImageFormat::Raw => FormatDriver::Raw,
        ImageFormat::Qcow2 => FormatDriver::Qcow2,
    }
}

/// The disk's kind and bus (sata on amd64 when empty, KubeVirt's `pkg/defaults/amd64.go`).
fn kind_and_bus(d: &Disk, p: &FieldPath) -> Result<(Kind, Bus, bool), ConvertError> {
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

/// The image layers behind a volume, bottom first.
fn layers(
    vmi: &Vmi,
    ctx: &ConverterContext,
    vol: &Volume,
    vol_index: usize,
    vp: &FieldPath,
    hotplug: bool,
) -> Result<Vec<Layer>, ConvertError> {
    let facts = ctx.volumes.get(&vol.name).cloned().unwrap_or_default();
    let p = &ctx.paths;
    let name = &vol.name;
    let raw = |protocol, path: String| Layer {
        protocol,
        path,
        format: FormatDriver::Raw,
        read_only: false,
    };
    let iso = |dir: &str| {
        raw(
            ProtocolDriver::File,
            format!("{}/{dir}/{name}.iso", p.private_dir),
        )
    };
    let overlay = |base: Layer| {
        vec![
            Layer {
                read_only: true,
                ..base
            },
            Layer {
                protocol: ProtocolDriver::File,
                path: format!("{}/disk-data/{name}/disk.qcow2", p.ephemeral_disks),
                format: FormatDriver::Qcow2,
                read_only: false,
            },
        ]
    };
    let pvc = || {
        if hotplug {
            match facts.backing {
                FileOrBlock::Block => raw(
                    ProtocolDriver::HostDevice,
                    format!("{}/{name}", p.hotplug_disks),
                ),
                FileOrBlock::File => raw(
                    ProtocolDriver::File,
                    format!("{}/{name}.img", p.hotplug_disks),
                ),
            }
        } else {
            match facts.backing {
                FileOrBlock::Block => raw(ProtocolDriver::HostDevice, format!("{}/{name}", p.dev)),
                FileOrBlock::File => raw(
                    ProtocolDriver::File,
                    format!("{}/vmi-disks/{name}/disk.img", p.private_dir),
                ),
            }
        }
    };
    let kinds = vol.source_kinds();
    if kinds.len() != 1 {
        return Err(ConvertError::invalid(
            vp.clone(),
            format!("a volume needs exactly one source, found {}", kinds.len()),
        ));
    }
    Ok(if vol.container_disk.is_some() {
        overlay(Layer {
            protocol: ProtocolDriver::File,
            path: format!("{}/disk_{vol_index}.img", p.container_disks),
            format: fmt_of(&facts),
            read_only: true,
        })
    } else if let Some(e) = &vol.ephemeral {
        if e.persistent_volume_claim.is_none() {
            return Err(ConvertError::missing(
                vp.key("ephemeral").key("persistentVolumeClaim"),
                "the PVC of an ephemeral volume",
            ));
        }
        overlay(Layer {
            protocol: file_or_block(&facts),
            ..pvc()
        })
    } else if vol.persistent_volume_claim.is_some() || vol.data_volume.is_some() {
        vec![pvc()]
    } else if let Some(h) = &vol.host_disk {
        let hp = vp.key("hostDisk").key("path");
        let base = h.path.rsplit('/').next().unwrap_or_default();
        check_name_len(&hp, base, 255)?;
        vec![raw(
            ProtocolDriver::File,
            format!("{}/vmi-disks/{name}/{base}", p.private_dir),
        )]
    } else if vol.empty_disk.is_some() {
        vec![Layer {
            protocol: ProtocolDriver::File,
            path: format!("{}/{name}.qcow2", p.empty_disks),
            format: FormatDriver::Qcow2,
            read_only: false,
        }]
    } else if vol.cloud_init_no_cloud.is_some() || vol.cloud_init_config_drive.is_some() {
        let file = if vol.cloud_init_no_cloud.is_some() {
            "noCloud.iso"
        } else {
            "configdrive.iso"
        };
        vec![raw(
            ProtocolDriver::File,
            format!(
                "{}/{}/{}/{file}",
                p.cloud_init,
                vmi_namespace(vmi)?,
                vmi_name(vmi)?
            ),
        )]
    } else if vol.config_map.is_some() {
        vec![iso("config-map-disks")]
    } else if vol.secret.is_some() {
        vec![iso("secret-disks")]
    } else if vol.downward_api.is_some() {
        vec![iso("downwardapi-disks")]
    } else if vol.sysprep.is_some() {
        vec![iso("sysprep-disks")]
    } else if vol.service_account.is_some() {
        vec![raw(
            ProtocolDriver::File,
            format!("{}/service-account-disk/service-account.iso", p.private_dir),
        )]
    } else if vol.downward_metrics.is_some() {
        vec![Layer {
            read_only: true,
            ..raw(
                ProtocolDriver::File,
                format!("{}/downwardapi-disks/vhostmd0", p.private_dir),
            )
        }]
    } else {
        return Err(ConvertError::unsupported(
            vp.clone(),
            format!("volume source {} as a disk", kinds.join(", ")),
        ));
    })
}

/// Hotplug volume status: `(is_hotplug, ready)` (`converter.go:1170-1178`).
fn hotplug_state(vmi: &Vmi, vol: &Volume) -> (bool, bool) {
    let status = vmi
        .status
        .as_ref()
        .and_then(|s| s.volume_status.as_ref())
        .and_then(|v| v.iter().find(|s| s.name == vol.name));
    let declared = vol
        .persistent_volume_claim
        .as_ref()
        .and_then(|p| p.hotpluggable)
        .or(vol.data_volume.as_ref().and_then(|d| d.hotpluggable))
        .unwrap_or(false);
    let is_hotplug = declared || status.is_some_and(|s| s.hotplug_volume.is_some());
    let ready = status
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "MountedToPod" || p == "Ready");
    (is_hotplug, !is_hotplug || ready)
}

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

impl super::super::convert::Configurator for DisksConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let disks: &[crate::vmi::Disk] =
            vmi.spec.domain.devices.disks.as_deref().unwrap_or_default();
        let volumes: &[Volume] = vmi.spec.volumes.as_deref().unwrap_or_default();
        let vpath = FieldPath::new("spec.volumes");
        for (i, v) in volumes.iter().enumerate() {
            check_name(&vpath.index(i).key("name"), &v.name)?;
        }
        let (_, threads) = iothreads::assignment(vmi)?;
        let multiqueue = vmi.spec.domain.devices.block_multi_queue == Some(true);
        let queues = vcpus(vmi)?;

        struct Item {
            i: usize,
            kind: Kind,
            bus: Bus,
            ro: bool,
            chain: Vec<Layer>,
            hotplug: bool,
            facts: VolumeFacts,
        }
        let mut items = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, d) in disks.iter().enumerate() {
            let p = devices_path().key("disks").index(i);
            check_name(&p.key("name"), &d.name)?;
            if !seen.insert(d.name.clone()) {
                return Err(ConvertError::invalid(p.key("name"), "duplicate disk name"));
            }
            let (kind, bus, ro) = kind_and_bus(d, &p)?;
            let vol = volumes.iter().enumerate().find(|(_, v)| v.name == d.name);
            let (chain, hotplug, facts) = match vol {
                Some((vi, v)) => {
                    let (is_hotplug, ready) = hotplug_state(vmi, v);
                    if !ready {
                        continue;
                    }
                    let chain = layers(vmi, ctx, v, vi, &vpath.index(vi), is_hotplug)?;
                    (
                        chain,
                        is_hotplug,
                        ctx.volumes.get(&v.name).cloned().unwrap_or_default(),
                    )
                }
                None if kind == Kind::Cdrom => (vec![], false, VolumeFacts::default()),
                None => {
                    return Err(ConvertError::missing(
                        p.key("name"),
                        format!("no volume named {:?}", d.name),
                    ))
                }
            };
            items.push(Item {
                i,
                kind,
                bus,
                ro,
                chain,
                hotplug,
                facts,
            });
        }

        // Target names: reuse status targets, else the first free index per prefix.
        let mut used: BTreeSet<String> = BTreeSet::new();
        let mut targets: Vec<Option<String>> = vec![None; items.len()];
        for (k, it) in items.iter().enumerate() {
            let prefix = if it.bus == Bus::Virtio { "vd" } else { "sd" };
            if let Some(t) = status_target(vmi, &disks[it.i].name) {
                if t.starts_with(prefix) && !used.contains(t) {
                    used.insert(t.to_string());
                    targets[k] = Some(t.to_string());
                }
            }
        }
        for (k, it) in items.iter().enumerate() {
            if targets[k].is_some() {
                continue;
            }
            let prefix = if it.bus == Bus::Virtio { "vd" } else { "sd" };
            let mut n = 0;
            let name = loop {
                let t = format!("{prefix}{}", device_suffix(n));
                if !used.contains(&t) {
                    break t;
                }
                n += 1;
            };
            used.insert(name.clone());
            targets[k] = Some(name);
        }
        // The index behind each target name (`sdc` -> 2): libvirt derives SATA and SCSI drive
        // addresses from it, and KubeVirt passes it as the SCSI unit of disks and LUNs.
        let indexes: Vec<usize> = targets
            .iter()
            .map(|t| t.as_deref().and_then(|t| t.get(2..)).and_then(device_index))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                ConvertError::invalid(devices_path().key("disks"), "more than 17576 disks")
            })?;

        // libvirt's SATA mapping (`virDomainDiskDefAssignAddress`): six units per AHCI
        // controller; q35's built-in one (`ide.0`-`ide.5`) is controller 0, libvirt adds an
        // `ahci` controller `sata<N>` for every further index up to the highest one used.
        let mut sata_controllers = 0;
        for (k, it) in items.iter().enumerate() {
            if it.bus == Bus::Sata {
                let controller = indexes[k] / 6;
                if controller > 4 {
                    return Err(ConvertError::unsupported(
                        devices_path().key("disks").index(it.i).key("name"),
                        "a sata target beyond the fifth AHCI controller (sdad)",
                    ));
                }
                sata_controllers = sata_controllers.max(controller);
            }
        }
        for controller in 1..=sata_controllers {
            plan.devices.push(super::planned(
                DeviceClass::Controller,
                None,
                Backend::None,
                Device::Simple(super::super::qemu::DeviceSimple {
                    driver: "ahci",
                    id: format!("sata{controller}"),
                    bus: None,
                    port: None,
                }),
                Placement::RootPort,
            ));
        }

        let mut node = items.iter().map(|it| it.chain.len()).sum::<usize>();
        for (k, it) in items.into_iter().enumerate() {
            let index = indexes[k];
            let d = &disks[it.i];
            let p = devices_path().key("disks").index(it.i);
            let shareable = d.shareable == Some(true);
            let share_rw = shareable.then_some(true);
            let cache = match d.cache.as_deref() {
                None if it.chain.is_empty() => None,
                None if shareable || it.facts.direct_io => Some(Cache::None),
                None => Some(Cache::Writethrough),
                Some("none") => Some(Cache::None),
                Some("writethrough") => Some(Cache::Writethrough),
                Some("writeback") => Some(Cache::Writeback),
                Some(o) => {
                    return Err(ConvertError::unsupported(
                        p.key("cache"),
                        format!("cache mode {o:?}"),
                    ))
                }
            };
            if shareable && cache != Some(Cache::None) {
                return Err(ConvertError::invalid(
                    p.key("cache"),
                    "a shareable disk needs cache \"none\"",
                ));
            }
            if cache == Some(Cache::None)
                && !it.facts.direct_io
                && d.cache.is_some()
                && !it.chain.is_empty()
            {
                return Err(ConvertError::invalid(
                    p.key("cache"),
                    "cache \"none\" needs O_DIRECT, which the volume's file system does not support",
                ));
            }
            let aio = match d.io.as_deref() {
                None => (cache == Some(Cache::None)
                    && (it.facts.backing == FileOrBlock::Block || it.facts.preallocated))
                    .then_some(Aio::Native),
                Some("native") => {
                    if cache != Some(Cache::None) {
                        return Err(ConvertError::invalid(
                            p.key("io"),
                            "io \"native\" needs cache \"none\"",
                        ));
                    }
                    Some(Aio::Native)
                }
                Some("threads") => Some(Aio::Threads),
                Some(o) => {
                    return Err(ConvertError::unsupported(
                        p.key("io"),
                        format!("io mode {o:?}"),
                    ))
                }
            };
            let bc = cache.map(|c| BlockdevCache {
                direct: c == Cache::None,
                no_flush: false,
            });
            let write_cache = cache.map(|c| match c {
                Cache::None | Cache::Writeback => "on",
                Cache::Writethrough => "off",
            });
            let error = match d.error_policy.as_deref().unwrap_or("stop") {
                "stop" => OnError::Stop,
                "report" => OnError::Report,
                "ignore" => OnError::Ignore,
                "enospace" => OnError::Enospc,
                o => {
                    return Err(ConvertError::unsupported(
                        p.key("errorPolicy"),
                        format!("error policy {o:?}"),
                    ))
                }
            };
            let rerror = (error != OnError::Enospc).then_some(error);
            let discard = (it.kind != Kind::Cdrom && !it.facts.preallocated).then_some("unmap");
            let serial = match d.serial.as_deref() {
                None => None,
                Some(s) => {
                    if s.is_empty()
                        || s.len() > 20
                        || !s
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"_.+-".contains(&b))
                    {
                        return Err(ConvertError::invalid(
                            p.key("serial"),
                            "a serial is 1 to 20 letters, digits, '_', '.', '+' or '-'",
                        ));
                    }
                    Some(s.to_string())
                }
            };
            let (lbs, pbs, dg) = match &d.block_size {
                None => (None, None, None),
                Some(b)
                    if b.match_volume
                        .as_ref()
                        .is_some_and(|m| m.enabled.unwrap_or(true)) =>
                {
                    return Err(ConvertError::unsupported(
                        p.key("blockSize").key("matchVolume"),
                        "matching the volume's block size",
                    ))
                }
                Some(b) => {
                    let c = b.custom.clone().unwrap_or_default();
                    for (v, f) in [(c.logical, "logical"), (c.physical, "physical")] {
                        if let Some(v) = v {
                            if !(512..=65536).contains(&v) || !v.is_power_of_two() {
                                return Err(ConvertError::invalid(
                                    p.key("blockSize").key("custom").key(f),
                                    "block size must be a power of two from 512 to 65536",
                                ));
                            }
                        }
                    }
                    (c.logical, c.physical, c.discard_granularity)
                }
            };
            if d.disk
                .as_ref()
                .and_then(|t| t.pci_address.as_ref())
                .is_some()
            {
                return Err(ConvertError::unsupported(
                    p.key("disk").key("pciAddress"),
                    "a fixed PCI address",
                ));
            }

            // Blockdev chain, bottom first, node numbers counting down.
            let mut blockdevs = Vec::new();
            let mut below: Option<String> = None;
            let top_ro = it.ro;
            let n_layers = it.chain.len();
            for (li, layer) in it.chain.iter().enumerate() {
                let storage = format!("libvirt-{node}-storage");
                let format = format!("libvirt-{node}-format");
                node -= 1;
                let is_top = li + 1 == n_layers;
                blockdevs.push(Blockdev::Protocol(BlockdevProtocol {
                    driver: layer.protocol,
                    filename: layer.path.clone(),
                    node_name: storage.clone(),
                    aio,
                    cache: bc,
                    auto_read_only: true,
                    discard: Some("unmap"),
                }));
                let backing = match (layer.format, &below) {
                    (FormatDriver::Qcow2, Some(b)) => Backing::Node(b.clone()),
                    (FormatDriver::Qcow2, None) => Backing::Null,
                    (FormatDriver::Raw, _) => Backing::Absent,
                };
                let read_only = if is_top { top_ro } else { true };
                blockdevs.push(Blockdev::Format(BlockdevFormat {
                    node_name: format.clone(),
                    read_only,
                    discard: if read_only && it.kind == Kind::Cdrom {
                        None
                    } else {
                        discard
                    },
                    cache: bc,
                    driver: layer.format,
                    file: storage,
                    backing,
                }));
                below = Some(format);
            }
            let drive = below.clone();
            let id = alias(&d.name);
            let bootindex = d.boot_order;
            if bootindex == Some(0) {
                return Err(ConvertError::invalid(
                    p.key("bootOrder"),
                    "boot order starts at 1",
                ));
            }
            let (device, placement, hotpluggable) = match it.bus {
                Bus::Virtio => {
                    let drive = drive.ok_or_else(|| {
                        ConvertError::missing(p.key("name"), "a volume for a virtio disk")
                    })?;
                    (
                        Device::VirtioBlk(DeviceVirtioBlk {
                            driver: virtio_driver(
                                vmi,
                                "virtio-blk-pci-non-transitional",
                                "virtio-blk-pci-transitional",
                            ),
                            share_rw,
                            drive,
                            id,
                            bootindex,
                            write_cache,
                            werror: Some(error),
                            rerror,
                            serial,
                            iothread: threads
                                .get(it.i)
                                .copied()
                                .flatten()
                                .map(|t| format!("iothread{t}")),
                            num_queues: multiqueue.then_some(queues),
                            logical_block_size: lbs,
                            physical_block_size: pbs,
                            discard_granularity: dg,
                        }),
                        Placement::RootPort,
                        it.hotplug,
                    )
                }
                Bus::Sata => {
                    if it.kind == Kind::Disk && it.ro {
                        return Err(ConvertError::unsupported(
                            p.key("disk").key("readonly"),
                            "a read-only sata disk (ide-hd cannot be read-only; use a cdrom or virtio)",
                        ));
                    }
                    let (controller, unit) = (index / 6, index % 6);
                    let bus = if controller == 0 {
                        format!("ide.{unit}")
                    } else {
                        format!("sata{controller}.{unit}")
                    };
                    let dev = DeviceDiskFrontend {
                        driver: if it.kind == Kind::Cdrom {
                            "ide-cd"
                        } else {
                            "ide-hd"
                        },
                        bus,
                        channel: None,
                        scsi_id: None,
                        lun: None,
                        device_id: None,
                        port: None,
                        share_rw,
                        drive,
                        id,
                        bootindex,
                        write_cache,
                        werror: Some(error),
                        rerror,
                        serial,
                        logical_block_size: lbs,
                        physical_block_size: pbs,
                        discard_granularity: dg,
                        removable: None,
                    };
                    (Device::DiskFrontend(dev), Placement::NonPci, false)
                }
                Bus::Scsi => {
                    let driver = match it.kind {
                        Kind::Cdrom => "scsi-cd",
                        Kind::Lun if it.facts.backing == FileOrBlock::Block => "scsi-block",
                        _ => "scsi-hd",
                    };
                    let passthrough = driver == "scsi-block";
                    // KubeVirt gives disks and LUNs `<address type="drive" unit=<target index>>`
                    // (`assignDiskToSCSIController`); a cdrom gets libvirt's default mapping
                    // of the same index (15 units per controller, unit 7 skipped).
                    let lun = if it.kind == Kind::Cdrom {
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
                    let lun = u32::try_from(lun).map_err(|_| {
                        ConvertError::invalid(p.key("name"), "scsi unit out of range")
                    })?;
                    let dev = DeviceDiskFrontend {
                        driver,
                        bus: "scsi0.0".into(),
                        channel: Some(0),
                        scsi_id: Some(0),
                        lun: Some(lun),
                        // libvirt's VPD device id: the serial, else `drive-<alias>`.
                        device_id: (!passthrough)
                            .then(|| serial.clone().unwrap_or_else(|| format!("drive-{id}"))),
                        port: None,
                        share_rw,
                        drive: drive.clone(),
                        id,
                        bootindex,
                        write_cache: if passthrough { None } else { write_cache },
                        werror: Some(error),
                        rerror,
                        serial: if passthrough { None } else { serial },
                        logical_block_size: lbs,
                        physical_block_size: pbs,
                        discard_granularity: dg,
                        removable: None,
                    };
                    (
                        Device::DiskFrontend(dev),
                        Placement::NonPci,
                        drive.is_some(),
                    )
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
                        share_rw,
                        drive,
                        id,
                        bootindex,
                        write_cache,
                        werror: Some(error),
                        rerror,
                        serial,
                        logical_block_size: lbs,
                        physical_block_size: pbs,
                        discard_granularity: dg,
                        removable: (it.kind == Kind::Cdrom).then_some(true),
                    }),
                    Placement::NonPci,
                    false,
                ),
            };
            plan.devices.push(PlannedDevice {
                class: DeviceClass::Disk,
                name: Some(d.name.clone()),
                backend: if blockdevs.is_empty() {
                    Backend::None
                } else {
                    Backend::Blockdevs(blockdevs)
                },
                device,
                placement,
                address: None,
                hotpluggable,
                target: targets[k].clone(),
                iommu_platform: false,
            });
        }
        Ok(())
    }
}
