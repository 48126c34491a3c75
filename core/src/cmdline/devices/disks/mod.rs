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
//! * `discard: unmap` unless preallocated; `errorPolicy` (default `stop`) -> `werror`/`rerror`;
//!   readonly; serial; bootOrder -> `bootindex`; dedicated/pooled IOThreads; `blockMultiQueue`
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
//! Reads: `ctx.volumes`, `ctx.paths`.

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
use crate::vmi::{Vmi, Volume};

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
}

impl crate::cmdline::convert::Configurator for DisksConfigurator {
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

        let mut node = items.iter().map(|it| it.chain.len()).sum::<usize>();
        for (it, (target, index)) in items.into_iter().zip(targets) {
            let d = &disks[it.i];
            let p = devices_path().key("disks").index(it.i);
            let opts = drive::options(d, &p, it.kind, !it.chain.is_empty(), &it.facts)?;
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
            let (blockdevs, drive) = drive::chain(&it.chain, &mut node, it.ro, it.kind, &opts);
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
                bootindex: d.boot_order,
                drive,
                opts,
                iothread: threads
                    .get(it.i)
                    .copied()
                    .flatten()
                    .map(|t| format!("iothread{t}")),
                num_queues: multiqueue.then_some(queues),
                hotplug: it.hotplug,
                storage: it.facts.kind,
            })?;
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
                target: Some(target),
                iommu_platform: false,
            });
        }
        Ok(())
    }
}
