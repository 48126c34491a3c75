//! `<disk>`: the frontend, its blockdev chain (protocol, format, backing store) and cache mode.

use super::*;

/// Cache mode from the storage node's cache flags and the frontend's `write-cache`
/// (libvirt `qemuDomainDiskCachemodeFlags`, inverted).
pub(super) fn cache_mode(p: &BlockdevProtocol, write_cache: Option<&str>) -> Option<String> {
    let c = p.cache?;
    let wc = write_cache == Some("on");
    Some(
        match (c.direct, c.no_flush, wc) {
            (_, true, _) => "unsafe",
            (true, false, true) => "none",
            (true, false, false) => "directsync",
            (false, false, true) => "writeback",
            (false, false, false) => "writethrough",
        }
        .into(),
    )
}

pub(super) fn disk(vmi: &Vmi, d: &PlannedDevice) -> Result<Disk, CompatError> {
    let name = d
        .name
        .clone()
        .ok_or_else(|| CompatError::ExportUnnamedDevice {
            id: d.device.id().into(),
        })?;
    let spec = vmi
        .spec
        .domain
        .devices
        .disks
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|x| x.name == name);
    let nodes: &[Blockdev] = match &d.backend {
        Backend::Blockdevs(b) => b,
        _ => &[],
    };
    let format = |node: &str| {
        nodes.iter().find_map(|b| match b {
            Blockdev::Format(f) if f.node_name == node => Some(f),
            _ => None,
        })
    };
    let storage = |node: &str| {
        nodes.iter().find_map(|b| match b {
            Blockdev::Protocol(p) if p.node_name == node => Some(p),
            _ => None,
        })
    };
    let chain_err = |node: &str| CompatError::ExportBlockdevChain {
        disk: name.clone(),
        node: node.into(),
    };
    struct Front<'a> {
        drive: Option<&'a str>,
        bus: &'static str,
        write_cache: Option<&'static str>,
        werror: Option<OnError>,
        serial: Option<String>,
        iothread: Option<u32>,
        queues: Option<u32>,
        sizes: (Option<u32>, Option<u32>, Option<u32>),
        lun: Option<u32>,
        model: Option<String>,
    }
    let front = match &d.device {
        qemu::Device::VirtioBlk(v) => Front {
            drive: Some(&v.drive),
            bus: "virtio",
            write_cache: v.write_cache,
            werror: v.werror,
            serial: v.serial.clone(),
            iothread: v
                .iothread
                .as_deref()
                .and_then(|t| t.trim_start_matches("iothread").parse().ok()),
            queues: v.num_queues,
            sizes: (
                v.logical_block_size,
                v.physical_block_size,
                v.discard_granularity,
            ),
            lun: None,
            model: Some(virtio_model(v.driver)),
        },
        qemu::Device::DiskFrontend(f) => Front {
            drive: f.drive.as_deref(),
            bus: if f.driver.starts_with("scsi") {
                "scsi"
            } else if f.driver == "usb-storage" {
                "usb"
            } else {
                "sata"
            },
            write_cache: f.write_cache,
            werror: f.werror,
            serial: f.serial.clone(),
            iothread: None,
            queues: None,
            sizes: (
                f.logical_block_size,
                f.physical_block_size,
                f.discard_granularity,
            ),
            lun: f.lun,
            model: None,
        },
        other => {
            return Err(CompatError::ExportUnnamedDevice {
                id: other.id().into(),
            })
        }
    };
    let (device, tray) = match spec {
        Some(s) if s.cdrom.is_some() => (
            "cdrom",
            Some(
                s.cdrom
                    .as_ref()
                    .and_then(|c| c.tray.clone())
                    .unwrap_or_else(|| "closed".into()),
            ),
        ),
        // libvirt accepts `lun` only on block sources; qlauncher runs a LUN on a file as a plain
        // SCSI disk (scsi-hd), and so does the export.
        Some(s) if s.lun.is_some() && !matches!(d.device.driver(), "scsi-hd") => ("lun", None),
        _ => ("disk", None),
    };
    let top: Option<&BlockdevFormat> = match front.drive {
        Some(node) => Some(format(node).ok_or_else(|| chain_err(node))?),
        None => None,
    };
    let top_storage = match top {
        Some(f) => Some(storage(&f.file).ok_or_else(|| chain_err(&f.file))?),
        None => None,
    };
    let source_of = |p: &BlockdevProtocol| match p.driver {
        ProtocolDriver::File => (
            "file",
            DiskSource {
                file: Some(p.filename.clone()),
                dev: None,
                name: None,
            },
        ),
        ProtocolDriver::HostDevice => (
            "block",
            DiskSource {
                file: None,
                dev: Some(p.filename.clone()),
                // KubeVirt also writes `name="<volume>"` here; libvirt's schema has no such
                // attribute on block sources (libvirt ignores it), so it is left out.
                name: None,
            },
        ),
    };
    let (type_, source) = match top_storage {
        Some(p) => {
            let (t, s) = source_of(p);
            (t, Some(s))
        }
        None => ("block", None),
    };
    let backing_store = match top.map(|f| &f.backing) {
        Some(qlauncher_core::cmdline::qemu::BackingNode::Node(node)) => {
            let bf = format(node).ok_or_else(|| chain_err(node))?;
            let bs = storage(&bf.file).ok_or_else(|| chain_err(&bf.file))?;
            let (t, s) = source_of(bs);
            Some(BackingStore {
                type_: t.into(),
                format: TypeAttr {
                    type_: fmt_name(bf.driver).into(),
                },
                source: s,
            })
        }
        _ => None,
    };
    let error_policy = front.werror.map(|e| {
        match e {
            OnError::Stop => "stop",
            OnError::Report => "report",
            OnError::Ignore => "ignore",
            OnError::Enospc => "enospace",
        }
        .to_string()
    });
    let address = match (front.bus, front.lun) {
        ("scsi", Some(unit)) => Some(Address {
            type_: "drive".into(),
            domain: None,
            bus: Some("0".into()),
            slot: None,
            function: None,
            multifunction: None,
            controller: Some(0),
            unit: Some(unit),
        }),
        _ => address(d),
    };
    let (lbs, pbs, dg) = front.sizes;
    Ok(Disk {
        device: device.into(),
        type_: type_.into(),
        model: if device == "cdrom" { None } else { front.model },
        source,
        target: DiskTarget {
            bus: front.bus.into(),
            dev: d.target.clone().unwrap_or_default(),
            tray,
        },
        serial: front.serial,
        driver: DiskDriver {
            cache: top_storage.and_then(|p| cache_mode(p, front.write_cache)),
            error_policy,
            name: "qemu".into(),
            type_: top.map(|f| fmt_name(f.driver)).unwrap_or("raw").into(),
            io: top_storage.and_then(|p| p.aio).map(|a| {
                match a {
                    Aio::Native => "native",
                    Aio::Threads => "threads",
                }
                .into()
            }),
            iothread: front.iothread,
            discard: top.and_then(|f| f.discard).map(str::to_string),
            queues: front.queues,
        },
        // KubeVirt writes `<readonly/>` on a cdrom unless `readonly: false` (libvirt then opens
        // it read-only anyway, as the plan does).
        readonly: if device == "cdrom" {
            spec.and_then(|s| s.cdrom.as_ref())
                .and_then(|c| c.read_only)
                .unwrap_or(true)
        } else {
            top.is_some_and(|f| f.read_only)
        }
        .then(Empty::default),
        shareable: spec
            .and_then(|s| s.shareable)
            .filter(|s| *s)
            .map(|_| Empty::default()),
        alias: alias(d.device.id()),
        // The VMI's own `bootOrder` only: the plan's `bootindex=1` on the first disk when no
        // device has one is what libvirt derives from its default `<boot dev='hd'/>`, which
        // KubeVirt's domain leaves implicit.
        boot: spec
            .and_then(|s| s.boot_order)
            .map(|order| BootOrder { order }),
        address,
        backing_store,
        blockio: (lbs.is_some() || pbs.is_some() || dg.is_some()).then_some(BlockIo {
            logical_block_size: lbs,
            physical_block_size: pbs,
            discard_granularity: dg,
        }),
    })
}

pub(super) fn fmt_name(f: FormatDriver) -> &'static str {
    match f {
        FormatDriver::Raw => "raw",
        FormatDriver::Qcow2 => "qcow2",
    }
}
