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
//!   (`ide-hd`/`ide-cd` on q35's AHCI `ide.0`-`ide.5`, then extra `ahci` controllers `sata<N>`,
//!   the port from the target index), scsi (`scsi-hd`/`scsi-cd`/`scsi-block` on `scsi0.0`, LUN
//!   from the target index, hot-pluggable), usb (`usb-storage`).
//! * Cache: the spec's, else `none` when O_DIRECT works (`VolumeFacts::direct_io`), else
//!   `writethrough`; `none` without O_DIRECT is an error; `shareable` forces `none`. IO: the
//!   spec's, else `native` with cache `none` on a block device or preallocated image.
//! * `discard: unmap` by KubeVirt's two-stage rule (`drive::discard`: a disk or lun device
//!   unless `status.volumeStatus[].persistentVolumeClaimInfo.preallocated`, then per volume
//!   kind; a table test below lists every kind); `errorPolicy` (default `stop`) -> `werror`/`rerror`;
//!   readonly; serial; bootOrder -> `bootindex` (with none on any disk or NIC, `bootindex=1` on
//!   the first disk or lun in libvirt's disk order, `default_boot_disk`); downwardMetrics read-only
//!   with a bare driver; dedicated/pooled IOThreads; `blockMultiQueue`
//!   -> `num-queues`; custom block sizes. Target names `vdX`/`sdX`, reusing
//!   `status.volumeStatus[].target`.
//! * Hotplug volumes (PVC/DataVolume `hotpluggable: true`, or a `hotplugVolume` status) are
//!   included once their phase is `MountedToPod` or `Ready`, and only they are marked
//!   hot-pluggable (virtio and scsi buses), so the QMP plan holds exactly what KubeVirt may
//!   attach or detach at runtime.
//!
//! Layout: `sources.rs` (volume -> image layers at KubeVirt's paths, hotplug readiness),
//! `buses.rs` (kind and bus, target names, SATA/SCSI addresses, AHCI controllers),
//! `drive.rs` (cache/io/error/discard/serial/block-size options and the blockdev chain),
//! `frontend.rs` (the QEMU device per bus); this file runs them per disk.
//!
//! Reads: `ctx.volumes`, `ctx.paths`, `status.volumeStatus` (hotplug phase, preallocation).

mod buses;
mod drive;
mod frontend;
mod sources;

use std::collections::BTreeSet;

use buses::{kind_and_bus, Bus, Kind};
use sources::{hotplug_state, layers, Layer};

use super::{devices_path, iothreads, vcpus};
use crate::cmdline::context::{ConverterContext, VolumeFacts};
use crate::cmdline::error::{ConvertError, FieldPath};
use crate::cmdline::names::{alias, check_name};
use crate::cmdline::plan::{Backend, DeviceClass, DomainPlan, PlannedDevice};
use crate::vmi::{Disk, Vmi, Volume};

/// Adds one planned device per disk.
pub struct DisksConfigurator;

/// One disk whose volume is ready.
struct Item {
    /// Position in `spec.domain.devices.disks`.
    i: usize,
    kind: Kind,
    bus: Bus,
    ro: bool,
    chain: Vec<Layer>,
    hotplug: bool,
    facts: VolumeFacts,
    discard: Option<&'static str>,
    /// A downwardMetrics volume: KubeVirt replaces the whole disk driver
    /// (`Convert_v1_DownwardMetricSource_To_api_Disk`, `converter.go:871-884`), so the spec's
    /// cache, io and `blockMultiQueue` queues are dropped (cache and io come only from the later
    /// defaulting, `SetDriverCacheMode`/`SetOptimalIOMode`); the error policy and IOThread are
    /// set after it (`converter.go:1179-1184`) and stay.
    bare_driver: bool,
}

/// The disk libvirt gives `bootindex=1` when no device has a boot order, as a position in
/// `items` (`(candidate, bus, target index)` in VMI disk order; a candidate is a `disk` or `lun`
/// device). KubeVirt's converter never writes `<os><boot dev=...>` (nothing sets
/// `api.OS.BootOrder`), so libvirt's post-parse adds its default `<boot dev='hd'/>` when no
/// device has a `<boot order>` (`domain_postparse.c` `virDomainDefBootOrderPostParse`), and its
/// QEMU driver turns `hd` into `bootindex=1` on the first `disk` or `lun` of `def->disks` (a
/// cdrom would need `cdrom`, a NIC `network`). `def->disks` is not XML order: each parsed disk
/// goes after the last one on its bus, before one with a higher target index
/// (`virDomainDiskInsertPreAlloced`), so disks group by bus in the order the buses first appear,
/// by target index within a bus. Checked against libvirt 9's argv by the compat tests
/// (`boot-order-default` fixture: a sata disk listed after a virtio one boots).
fn default_boot_disk(items: &[(bool, Bus, usize)]) -> Option<usize> {
    let mut order: Vec<usize> = Vec::with_capacity(items.len());
    for (k, &(_, bus, index)) in items.iter().enumerate() {
        let mut at = None;
        for (pos, &j) in order.iter().enumerate().rev() {
            let (_, b, i) = items[j];
            if b != bus {
                continue;
            }
            if i > index {
                at = Some(pos);
            } else if at.is_none() {
                at = Some(pos + 1);
            }
        }
        order.insert(at.unwrap_or(order.len()), k);
    }
    order.into_iter().find(|&k| items[k].0)
}

impl crate::cmdline::convert::Configurator for DisksConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let disks: &[Disk] = vmi.spec.domain.devices.disks.as_deref().unwrap_or_default();
        let volumes: &[Volume] = vmi.spec.volumes.as_deref().unwrap_or_default();
        let vpath = FieldPath::new("spec.volumes");
        for (i, v) in volumes.iter().enumerate() {
            check_name(&vpath.index(i).key("name"), &v.name)?;
        }
        let (_, threads) = iothreads::assignment(vmi)?;
        let queues = Queues {
            threads,
            multiqueue: vmi.spec.domain.devices.block_multi_queue == Some(true),
            queues: vcpus(vmi)?,
        };
        let items = ready_disks(vmi, ctx, disks, volumes)?;
        let targets = buses::targets(
            vmi,
            disks,
            &items.iter().map(|it| (it.i, it.bus)).collect::<Vec<_>>(),
        )?;
        let sata: Vec<(usize, usize)> = items
            .iter()
            .zip(&targets)
            .filter(|(it, _)| it.bus == Bus::Sata)
            .map(|(it, (_, index))| (it.i, *index))
            .collect();
        buses::sata_controllers(&sata, plan)?;
        let default_boot = default_boot(vmi, disks, &items, &targets);
        let mut node = items
            .iter()
            .flat_map(|it| &it.chain)
            .map(|l| 1 + usize::from(l.data_file.is_some()))
            .sum::<usize>();
        for (k, (it, target)) in items.into_iter().zip(targets).enumerate() {
            let boots = default_boot == Some(k);
            let device = planned_disk(vmi, &disks[it.i], it, target, &mut node, boots, &queues)?;
            if boots {
                plan.default_boot_disk = Some(device.device.id().to_string());
            }
            plan.devices.push(device);
        }
        Ok(())
    }
}

/// The VMI's disks whose volume is ready, in disk order: each disk's kind and bus, its image
/// layers at KubeVirt's paths, whether it is a hotplug volume, its facts and discard rule. A
/// hotplug volume not yet mounted is left out; a disk without a volume is refused, unless it
/// is an empty CD-ROM.
fn ready_disks(
    vmi: &Vmi,
    ctx: &ConverterContext,
    disks: &[Disk],
    volumes: &[Volume],
) -> Result<Vec<Item>, ConvertError> {
    let vpath = FieldPath::new("spec.volumes");
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
        let ignored = drive::discard_ignored(vmi, &d.name);
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
        let vd = drive::VolumeDiscard::of(vol.map(|(_, v)| v), hotplug);
        let bare_driver = vol.is_some_and(|(_, v)| v.downward_metrics.is_some());
        items.push(Item {
            i,
            kind,
            bus,
            // KubeVirt's downwardMetrics disk is read-only whatever the disk says.
            ro: ro || bare_driver,
            chain,
            hotplug,
            facts,
            discard: drive::discard(kind, vd, ignored),
            bare_driver,
        });
    }
    Ok(items)
}

/// The position in `items` of the disk that gets `bootindex=1` ([`default_boot_disk`]), or
/// none when any device has a boot order. Only the devices in the domain count: disks planned
/// here and every interface (KubeVirt copies `bootOrder` onto NICs and SR-IOV host devices
/// alike).
fn default_boot(
    vmi: &Vmi,
    disks: &[Disk],
    items: &[Item],
    targets: &[(String, usize)],
) -> Option<usize> {
    let explicit_boot = items.iter().any(|it| disks[it.i].boot_order.is_some())
        || vmi
            .spec
            .domain
            .devices
            .interfaces
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|n| n.boot_order.is_some());
    if explicit_boot {
        return None;
    }
    default_boot_disk(
        &items
            .iter()
            .zip(targets)
            .map(|(it, (_, index))| (matches!(it.kind, Kind::Disk | Kind::Lun), it.bus, *index))
            .collect::<Vec<_>>(),
    )
}

/// What every disk's frontend takes from the whole VMI: the IOThread of each disk (by disk
/// position) and, with `blockMultiQueue`, one queue per vCPU.
struct Queues {
    threads: Vec<Option<u32>>,
    multiqueue: bool,
    queues: u32,
}

/// One ready disk's planned device: its drive options, the blockdev chain (node names
/// counting down from `node`), and its frontend at `target` (name and index on the bus);
/// `boots` gives it `bootindex=1` when it has no boot order.
fn planned_disk(
    vmi: &Vmi,
    d: &Disk,
    it: Item,
    (target, index): (String, usize),
    node: &mut usize,
    boots: bool,
    q: &Queues,
) -> Result<PlannedDevice, ConvertError> {
    let p = devices_path().key("disks").index(it.i);
    let bare;
    let spec = if it.bare_driver {
        bare = Disk {
            cache: None,
            io: None,
            ..d.clone()
        };
        &bare
    } else {
        d
    };
    let opts = drive::options(
        spec,
        &p,
        it.bus,
        !it.chain.is_empty(),
        &it.facts,
        it.discard,
    )?;
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
    let (blockdevs, drive) = drive::chain(&it.chain, node, it.ro, &opts);
    if d.boot_order == Some(0) {
        return Err(ConvertError::invalid(
            p.key("bootOrder"),
            "boot order starts at 1",
        ));
    }
    let (device, placement, hotpluggable) = frontend::device(frontend::Frontend {
        vmi,
        path: p,
        kind: it.kind,
        bus: it.bus,
        read_only: it.ro,
        index,
        id: alias(&d.name),
        bootindex: d.boot_order.or(boots.then_some(1)),
        drive,
        opts,
        iothread: q
            .threads
            .get(it.i)
            .copied()
            .flatten()
            .map(|t| format!("iothread{t}")),
        num_queues: (q.multiqueue && !it.bare_driver).then_some(q.queues),
        hotplug: it.hotplug,
        storage: it.facts.kind,
    })?;
    Ok(PlannedDevice {
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
        target: Some(target),
        iommu_platform: false,
    })
}

#[cfg(test)]
mod tests;
