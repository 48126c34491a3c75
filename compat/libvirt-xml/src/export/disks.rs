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

/// A disk of the VMI (`spec.domain.devices.disks`), as opposed to the libvirt `<disk>`.
type VmiDisk = qlauncher_core::vmi::devices::Disk;

/// One `<disk>` from the planned disk `d`: its kind (disk, cdrom with its tray, lun), the
/// source and driver of the top of its blockdev chain with the backing store below, the
/// frontend's bus, serial, WWN, error policy, queues, block sizes and address, the I/O limits
/// the plan sets over QMP, and what only the VMI's disk says (read-only cdrom, shareable, boot
/// order).
pub(super) fn disk(vmi: &Vmi, plan: &DomainPlan, d: &PlannedDevice) -> Result<Disk, CompatError> {
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
    let nodes = Nodes {
        disk: &name,
        nodes: match &d.backend {
            Backend::Blockdevs(b) => b,
            _ => &[],
        },
    };
    let front = front(d)?;
    let (device, tray) = kind(spec, d);
    let top: Option<&BlockdevFormat> = match front.drive {
        Some(node) => Some(nodes.format(node)?),
        None => None,
    };
    let top_storage = match top {
        Some(f) => Some(nodes.storage(&f.file)?),
        None => None,
    };
    let (type_, source) = match top_storage {
        Some(p) => {
            let (t, mut s) = source_of(p);
            if let Some(node) = top.and_then(|f| f.data_file.as_deref()) {
                let (dt, ds) = source_of(nodes.storage(node)?);
                s.data_store = Some(Box::new(DataStore {
                    type_: dt.into(),
                    format: TypeAttr {
                        type_: "raw".into(),
                    },
                    source: ds,
                }));
            }
            (t, Some(s))
        }
        None => ("block", None),
    };
    let backing_store = backing_store(&nodes, top)?;
    let driver = driver(&front, top, top_storage);
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
        wwn: front.wwn.map(|w| format!("{w:016x}")),
        driver,
        iotune: plan
            .io_throttles
            .iter()
            .find(|t| t.id == d.device.id())
            .map(|t| iotune(&t.limits)),
        readonly: read_only(spec, device, top).then(Empty::default),
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

/// A disk's blockdev nodes, found by node name; a node the chain names but the disk lacks is
/// [`CompatError::ExportBlockdevChain`].
struct Nodes<'a> {
    /// The disk's name, for the error.
    disk: &'a str,
    nodes: &'a [Blockdev],
}

impl Nodes<'_> {
    /// The format node `node`.
    fn format(&self, node: &str) -> Result<&BlockdevFormat, CompatError> {
        self.nodes
            .iter()
            .find_map(|b| match b {
                Blockdev::Format(f) if f.node_name == node => Some(f),
                _ => None,
            })
            .ok_or_else(|| self.missing(node))
    }

    /// The protocol (storage) node `node`.
    fn storage(&self, node: &str) -> Result<&BlockdevProtocol, CompatError> {
        self.nodes
            .iter()
            .find_map(|b| match b {
                Blockdev::Protocol(p) if p.node_name == node => Some(p),
                _ => None,
            })
            .ok_or_else(|| self.missing(node))
    }

    fn missing(&self, node: &str) -> CompatError {
        CompatError::ExportBlockdevChain {
            disk: self.disk.to_string(),
            node: node.into(),
        }
    }
}

/// What the `<disk>` takes from the QEMU frontend, whichever device it is.
struct Front<'a> {
    /// The top node of the chain (none: an empty cdrom).
    drive: Option<&'a str>,
    /// libvirt's bus: `virtio`, `scsi`, `usb` or `sata`.
    bus: &'static str,
    write_cache: Option<&'static str>,
    werror: Option<OnError>,
    rerror: Option<OnError>,
    serial: Option<String>,
    wwn: Option<u64>,
    /// The IOThread's number (`iothread<N>`).
    iothread: Option<u32>,
    queues: Option<u32>,
    /// Logical and physical block size, discard granularity.
    sizes: (Option<u32>, Option<u32>, Option<u32>),
    /// The SCSI LUN.
    lun: Option<u32>,
    /// The virtio model (virtio-blk only).
    model: Option<String>,
}

/// The frontend of `d`: a virtio-blk device, or an IDE/SATA, SCSI or USB storage device.
fn front(d: &PlannedDevice) -> Result<Front<'_>, CompatError> {
    Ok(match &d.device {
        qemu::Device::VirtioBlk(v) => Front {
            drive: Some(&v.drive),
            bus: "virtio",
            write_cache: v.write_cache,
            werror: v.werror,
            rerror: v.rerror,
            serial: v.serial.clone(),
            wwn: None,
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
            rerror: f.rerror,
            serial: f.serial.clone(),
            wwn: f.wwn,
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
    })
}

/// The `<disk device=...>` and a cdrom's tray (`closed` unless the VMI says otherwise).
fn kind(spec: Option<&VmiDisk>, d: &PlannedDevice) -> (&'static str, Option<String>) {
    match spec {
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
    }
}

/// A storage node as `<source>` with the disk's `type`: `file` for a file, `block` for a host
/// device.
fn source_of(p: &BlockdevProtocol) -> (&'static str, DiskSource) {
    match p.driver {
        ProtocolDriver::File => (
            "file",
            DiskSource {
                file: Some(p.filename.clone()),
                dev: None,
                name: None,
                data_store: None,
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
                data_store: None,
            },
        ),
    }
}

/// The `<backingStore>` under the top format node (`top`): the format and source of the node
/// it is backed by, when it has one.
fn backing_store(
    nodes: &Nodes<'_>,
    top: Option<&BlockdevFormat>,
) -> Result<Option<BackingStore>, CompatError> {
    let Some(qemu::BackingNode::Node(node)) = top.map(|f| &f.backing) else {
        return Ok(None);
    };
    let bf = nodes.format(node)?;
    let bs = nodes.storage(&bf.file)?;
    let (t, s) = source_of(bs);
    Ok(Some(BackingStore {
        type_: t.into(),
        format: TypeAttr {
            type_: fmt_name(bf.driver).into(),
        },
        source: s,
    }))
}

/// The `<driver>`: cache mode and `io` from the top storage node, format and discard from the
/// top format node, error policy, IOThread and queues from the frontend.
fn driver(
    front: &Front<'_>,
    top: Option<&BlockdevFormat>,
    top_storage: Option<&BlockdevProtocol>,
) -> DiskDriver {
    let name = |e: OnError| {
        match e {
            OnError::Stop => "stop",
            OnError::Report => "report",
            OnError::Ignore => "ignore",
            OnError::Enospc => "enospace",
        }
        .to_string()
    };
    // libvirt's `rerror` follows `error_policy` (none for `enospace`) unless `rerror_policy`
    // says otherwise (`qemuBuildDiskFrontendAttributeErrorPolicy`).
    let implied = front.werror.filter(|w| *w != OnError::Enospc);
    let rerror_policy = match (front.werror, front.rerror) {
        (Some(_), r) if r != implied => r.map(name),
        _ => None,
    };
    DiskDriver {
        cache: top_storage.and_then(|p| cache_mode(p, front.write_cache)),
        error_policy: front.werror.map(name),
        rerror_policy,
        name: "qemu".into(),
        type_: top.map(|f| fmt_name(f.driver)).unwrap_or("raw").into(),
        io: top_storage.and_then(|p| p.aio).map(|a| {
            match a {
                Aio::Native => "native",
                Aio::Threads => "threads",
                Aio::IoUring => "io_uring",
            }
            .into()
        }),
        iothread: front.iothread,
        discard: top.and_then(|f| f.discard).map(str::to_string),
        queues: front.queues,
    }
}

/// Whether the `<disk>` gets `<readonly/>`: KubeVirt writes it on a cdrom unless `readonly:
/// false` (libvirt then opens it read-only anyway, as the plan does); another disk when its
/// top node is read-only.
fn read_only(spec: Option<&VmiDisk>, device: &str, top: Option<&BlockdevFormat>) -> bool {
    if device == "cdrom" {
        spec.and_then(|s| s.cdrom.as_ref())
            .and_then(|c| c.read_only)
            .unwrap_or(true)
    } else {
        top.is_some_and(|f| f.read_only)
    }
}

pub(super) fn fmt_name(f: FormatDriver) -> &'static str {
    match f {
        FormatDriver::Raw => "raw",
        FormatDriver::Qcow2 => "qcow2",
    }
}

/// `<iotune>` of the plan's limits, libvirt's names ([`crate::hooks::IOTUNE`]), zeros left out.
fn iotune(t: &qemu::IoThrottle) -> IoTune {
    let n = |qemu: &str| t.number(qemu).filter(|v| *v != 0);
    IoTune {
        total_bytes_sec: n("bps"),
        read_bytes_sec: n("bps_rd"),
        write_bytes_sec: n("bps_wr"),
        total_iops_sec: n("iops"),
        read_iops_sec: n("iops_rd"),
        write_iops_sec: n("iops_wr"),
        total_bytes_sec_max: n("bps_max"),
        read_bytes_sec_max: n("bps_rd_max"),
        write_bytes_sec_max: n("bps_wr_max"),
        total_iops_sec_max: n("iops_max"),
        read_iops_sec_max: n("iops_rd_max"),
        write_iops_sec_max: n("iops_wr_max"),
        size_iops_sec: n("iops_size"),
        group_name: t.group.clone(),
        total_bytes_sec_max_length: n("bps_max_length"),
        read_bytes_sec_max_length: n("bps_rd_max_length"),
        write_bytes_sec_max_length: n("bps_wr_max_length"),
        total_iops_sec_max_length: n("iops_max_length"),
        read_iops_sec_max_length: n("iops_rd_max_length"),
        write_iops_sec_max_length: n("iops_wr_max_length"),
    }
}
