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
    discard: Option<&'static str>,
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
            items.push(Item {
                i,
                kind,
                bus,
                ro,
                chain,
                hotplug,
                facts,
                discard: drive::discard(kind, vd, ignored),
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
            let opts = drive::options(d, &p, !it.chain.is_empty(), &it.facts, it.discard)?;
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
            let (blockdevs, drive) = drive::chain(&it.chain, &mut node, it.ro, &opts);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::context::StorageKind;
    use crate::cmdline::convert::Configurator;
    use crate::cmdline::qemu::{Blockdev, FormatDriver, ProtocolDriver};
    use serde_json::{json, Value};

    fn vmi(disks: Value, volumes: Value) -> Vmi {
        serde_json::from_value(json!({
            "metadata": {"name": "t", "namespace": "ns", "uid": "uid1"},
            "spec": {"domain": {"memory": {"guest": "256Mi"}, "devices": {"disks": disks}},
                     "volumes": volumes}
        }))
        .unwrap()
    }

    /// Per disk: (name, QEMU driver, target, hot-pluggable, protocol nodes bottom first as
    /// (driver, filename, O_DIRECT), format drivers bottom first).
    type DiskSummary = (
        String,
        &'static str,
        Option<String>,
        bool,
        Vec<(ProtocolDriver, String, bool)>,
        Vec<FormatDriver>,
    );

    fn summary(plan: &DomainPlan) -> Vec<DiskSummary> {
        plan.devices_of(DeviceClass::Disk)
            .map(|d| {
                let (mut protocols, mut formats) = (vec![], vec![]);
                if let Backend::Blockdevs(nodes) = &d.backend {
                    for n in nodes {
                        match n {
                            Blockdev::Protocol(p) => protocols.push((
                                p.driver,
                                p.filename.clone(),
                                p.cache.is_some_and(|c| c.direct),
                            )),
                            Blockdev::Format(f) => formats.push(f.driver),
                        }
                    }
                }
                (
                    d.name.clone().unwrap_or_default(),
                    d.device.driver(),
                    d.target.clone(),
                    d.hotpluggable,
                    protocols,
                    formats,
                )
            })
            .collect()
    }

    #[test]
    fn disks_table() {
        use FormatDriver::{Qcow2, Raw};
        use ProtocolDriver::{File, HostDevice};
        let s = |v: &str| v.to_string();
        let blk = "virtio-blk-pci-non-transitional";
        let block_pvc = ConverterContext {
            volumes: [(
                s("data"),
                VolumeFacts {
                    kind: StorageKind::Block,
                    direct_io: true,
                    ..Default::default()
                },
            )]
            .into(),
            ..Default::default()
        };
        // (disks, volumes, context) -> per-disk summary
        let cases: Vec<(Value, Value, ConverterContext, Vec<DiskSummary>)> = vec![
            (
                json!([{"name": "root", "disk": {"bus": "virtio"}}]),
                json!([{"name": "root", "containerDisk": {"image": "i"}}]),
                ConverterContext::default(),
                vec![(
                    s("root"),
                    blk,
                    Some(s("vda")),
                    false,
                    vec![
                        (
                            File,
                            s("/var/run/kubevirt/container-disks/disk_0.img"),
                            false,
                        ),
                        (
                            File,
                            s("/var/run/kubevirt-ephemeral-disks/disk-data/root/disk.qcow2"),
                            false,
                        ),
                    ],
                    vec![Raw, Qcow2],
                )],
            ),
            (
                json!([{"name": "data", "disk": {"bus": "virtio"}}]),
                json!([{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]),
                block_pvc,
                vec![(
                    s("data"),
                    blk,
                    Some(s("vda")),
                    false,
                    vec![(HostDevice, s("/dev/data"), true)],
                    vec![Raw],
                )],
            ),
            (
                json!([{"name": "data", "disk": {"bus": "virtio"}}]),
                json!([{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]),
                ConverterContext::default(),
                vec![(
                    s("data"),
                    blk,
                    Some(s("vda")),
                    false,
                    vec![(
                        File,
                        s("/var/run/kubevirt-private/vmi-disks/data/disk.img"),
                        false,
                    )],
                    vec![Raw],
                )],
            ),
            (
                json!([{"name": "scratch", "disk": {"bus": "scsi"}}, {"name": "cd", "cdrom": {"bus": "sata"}}]),
                json!([{"name": "scratch", "emptyDisk": {"capacity": "1Gi"}}, {"name": "cd", "containerDisk": {"image": "i"}}]),
                ConverterContext::default(),
                vec![
                    (
                        s("scratch"),
                        "scsi-hd",
                        Some(s("sda")),
                        // A SCSI disk with a drive is hot-pluggable whether or not its volume
                        // is a hotplug volume (frontend.rs).
                        true,
                        vec![(File, s("/var/run/libvirt/empty-disks/scratch.qcow2"), false)],
                        vec![Qcow2],
                    ),
                    (
                        s("cd"),
                        "ide-cd",
                        Some(s("sdb")),
                        false,
                        vec![
                            (
                                File,
                                s("/var/run/kubevirt/container-disks/disk_1.img"),
                                false,
                            ),
                            (
                                File,
                                s("/var/run/kubevirt-ephemeral-disks/disk-data/cd/disk.qcow2"),
                                false,
                            ),
                        ],
                        vec![Raw, Qcow2],
                    ),
                ],
            ),
        ];
        for (disks, volumes, ctx, want) in cases {
            let mut plan = DomainPlan::default();
            DisksConfigurator
                .configure(&vmi(disks.clone(), volumes), &ctx, &mut plan)
                .unwrap();
            assert_eq!(summary(&plan), want, "{disks}");
        }
    }

    /// (kind, device, volume source, status preallocated, image fully allocated, discard).
    type DiscardCase<'a> = (&'a str, &'a Value, Value, bool, bool, Option<&'static str>);

    /// KubeVirt's discard per volume kind, device and `preallocated` status (`drive::discard`,
    /// `converter.go:157-160` then the volume conversion): the discard of every format node.
    #[test]
    fn discard_by_volume_kind() {
        const U: Option<&str> = Some("unmap");
        let disk = json!({"disk": {"bus": "virtio"}});
        let cdrom = json!({"cdrom": {"bus": "scsi"}});
        let lun = json!({"lun": {"bus": "scsi"}});
        let hotplug = json!({"persistentVolumeClaim": {"claimName": "c", "hotpluggable": true}});
        #[rustfmt::skip]
        let cases: Vec<DiscardCase> = vec![
            ("containerDisk", &disk, json!({"containerDisk": {"image": "i"}}), false, false, U),
            ("containerDisk", &cdrom, json!({"containerDisk": {"image": "i"}}), false, false, U),
            ("ephemeral", &disk, json!({"ephemeral": {"persistentVolumeClaim": {"claimName": "c"}}}), false, false, U),
            ("ephemeral", &cdrom, json!({"ephemeral": {"persistentVolumeClaim": {"claimName": "c"}}}), false, false, U),
            ("ephemeral", &disk, json!({"ephemeral": {"persistentVolumeClaim": {"claimName": "c"}}}), true, false, U),
            ("emptyDisk", &disk, json!({"emptyDisk": {"capacity": "1Gi"}}), false, false, U),
            ("emptyDisk", &disk, json!({"emptyDisk": {"capacity": "1Gi"}}), true, false, U),
            ("persistentVolumeClaim", &disk, json!({"persistentVolumeClaim": {"claimName": "c"}}), false, false, U),
            ("persistentVolumeClaim", &disk, json!({"persistentVolumeClaim": {"claimName": "c"}}), false, true, U),
            ("persistentVolumeClaim", &cdrom, json!({"persistentVolumeClaim": {"claimName": "c"}}), false, false, U),
            ("persistentVolumeClaim", &lun, json!({"persistentVolumeClaim": {"claimName": "c"}}), false, false, U),
            ("persistentVolumeClaim", &disk, json!({"persistentVolumeClaim": {"claimName": "c"}}), true, true, None),
            ("persistentVolumeClaim", &cdrom, json!({"persistentVolumeClaim": {"claimName": "c"}}), true, false, None),
            ("dataVolume", &disk, json!({"dataVolume": {"name": "dv"}}), false, false, U),
            ("dataVolume", &disk, json!({"dataVolume": {"name": "dv"}}), true, false, None),
            ("hotplug PVC", &disk, hotplug.clone(), false, false, U),
            ("hotplug PVC", &disk, hotplug, true, false, None),
            ("hostDisk", &disk, json!({"hostDisk": {"path": "/d/disk.img", "type": "Disk"}}), false, false, U),
            ("hostDisk", &cdrom, json!({"hostDisk": {"path": "/d/disk.img", "type": "Disk"}}), false, false, None),
            ("hostDisk", &disk, json!({"hostDisk": {"path": "/d/disk.img", "type": "Disk"}}), true, false, None),
            ("cloudInitNoCloud", &disk, json!({"cloudInitNoCloud": {"userData": "x"}}), false, true, U),
            ("cloudInitNoCloud", &cdrom, json!({"cloudInitNoCloud": {"userData": "x"}}), false, true, None),
            ("cloudInitConfigDrive", &disk, json!({"cloudInitConfigDrive": {"userData": "x"}}), false, true, U),
            ("cloudInitConfigDrive", &cdrom, json!({"cloudInitConfigDrive": {"userData": "x"}}), false, true, None),
            ("configMap", &disk, json!({"configMap": {"name": "cm"}}), false, true, U),
            ("configMap", &cdrom, json!({"configMap": {"name": "cm"}}), false, true, None),
            ("secret", &disk, json!({"secret": {"secretName": "s"}}), false, true, U),
            ("secret", &cdrom, json!({"secret": {"secretName": "s"}}), false, true, None),
            ("serviceAccount", &disk, json!({"serviceAccount": {"serviceAccountName": "sa"}}), false, true, U),
            ("serviceAccount", &cdrom, json!({"serviceAccount": {"serviceAccountName": "sa"}}), false, true, None),
            ("downwardAPI", &disk, json!({"downwardAPI": {"fields": []}}), false, true, U),
            ("downwardAPI", &cdrom, json!({"downwardAPI": {"fields": []}}), false, true, None),
            ("sysprep", &disk, json!({"sysprep": {"configMap": {"name": "cm"}}}), false, true, U),
            ("sysprep", &cdrom, json!({"sysprep": {"configMap": {"name": "cm"}}}), false, true, None),
            ("downwardMetrics", &disk, json!({"downwardMetrics": {}}), false, false, None),
        ];
        for (kind, device, source, status_preallocated, allocated, want) in cases {
            let mut d = device.clone();
            d["name"] = json!("v");
            let mut v = source;
            v["name"] = json!("v");
            let mut vmi = vmi(json!([d]), json!([v]));
            let mut status = json!({"name": "v", "target": "",
                "persistentVolumeClaimInfo": {"preallocated": status_preallocated}});
            if kind == "hotplug PVC" {
                status["phase"] = json!("Ready");
                status["hotplugVolume"] = json!({});
            }
            vmi.status = Some(serde_json::from_value(json!({"volumeStatus": [status]})).unwrap());
            let lun_block = device.get("lun").is_some();
            let ctx = ConverterContext {
                volumes: [(
                    "v".to_string(),
                    VolumeFacts {
                        kind: if lun_block {
                            StorageKind::Block
                        } else {
                            StorageKind::File
                        },
                        direct_io: true,
                        preallocated: allocated,
                        ..Default::default()
                    },
                )]
                .into(),
                ..Default::default()
            };
            let mut plan = DomainPlan::default();
            DisksConfigurator
                .configure(&vmi, &ctx, &mut plan)
                .unwrap_or_else(|e| panic!("{kind} {device}: {e}"));
            let disk = plan.devices_of(DeviceClass::Disk).next().unwrap();
            let Backend::Blockdevs(nodes) = &disk.backend else {
                panic!("{kind} {device}: no blockdevs");
            };
            let formats: Vec<Option<&str>> = nodes
                .iter()
                .filter_map(|n| match n {
                    Blockdev::Format(f) => Some(f.discard),
                    Blockdev::Protocol(_) => None,
                })
                .collect();
            assert!(!formats.is_empty(), "{kind} {device}");
            assert!(
                formats.iter().all(|f| *f == want),
                "{kind} on {device}, preallocated {status_preallocated}: {formats:?}, want {want:?}"
            );
        }
    }

    #[test]
    fn bad_disks_name_the_field() {
        let cases = [
            (
                json!([{"name": "a", "disk": {}}, {"name": "a", "disk": {}}]),
                json!([{"name": "a", "emptyDisk": {"capacity": "1Gi"}}]),
                "spec.domain.devices.disks[1].name",
            ),
            (
                json!([{"name": "a", "disk": {}}]),
                json!([]),
                "spec.domain.devices.disks[0].name",
            ),
        ];
        for (disks, volumes, path) in cases {
            let err = DisksConfigurator
                .configure(
                    &vmi(disks.clone(), volumes),
                    &ConverterContext::default(),
                    &mut DomainPlan::default(),
                )
                .unwrap_err();
            assert_eq!(err.path().as_str(), path, "{disks}");
        }
    }
}
