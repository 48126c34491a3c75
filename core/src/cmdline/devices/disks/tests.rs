//! Table tests of the disk configurator ([`super`]): buses, sources, boot order, discard.

use super::*;
use crate::cmdline::context::StorageKind;
use crate::cmdline::convert::Configurator;
use crate::cmdline::qemu::{Aio, Blockdev, FormatDriver, OnError, ProtocolDriver};
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

fn bootindex(d: &PlannedDevice) -> Option<u32> {
    match &d.device {
        crate::cmdline::qemu::Device::VirtioBlk(v) => v.bootindex,
        crate::cmdline::qemu::Device::DiskFrontend(f) => f.bootindex,
        other => panic!("not a disk: {other:?}"),
    }
}

/// (disks, interfaces, status targets, per disk (name, bootindex)).
type BootCase<'a> = (Value, Value, Value, Vec<(&'a str, Option<u32>)>);

/// The boot order libvirt derives from KubeVirt's domain: the VMI's `bootOrder` where any
/// disk or interface has one, else `bootindex=1` on the first `disk`/`lun` of libvirt's
/// disk order (grouped by bus, by target index within a bus; cdroms skipped).
#[test]
fn boot_order_table() {
    let cd = |n: &str, bus: &str| json!({"name": n, "cdrom": {"bus": bus}});
    let disk = |n: &str, bus: &str| json!({"name": n, "disk": {"bus": bus}});
    let with_boot = |mut d: Value, order: u32| {
        d["bootOrder"] = json!(order);
        d
    };
    #[rustfmt::skip]
    let cases: Vec<BootCase> = vec![
        // No bootOrder anywhere: the first disk boots.
        (json!([disk("a", "virtio"), disk("b", "virtio")]), json!([]), json!([]),
         vec![("a", Some(1)), ("b", None)]),
        // A cdrom first: libvirt's default `hd` skips it.
        (json!([cd("cd", "sata"), disk("root", "virtio")]), json!([]), json!([]),
         vec![("cd", None), ("root", Some(1))]),
        // Only cdroms: nothing boots by index.
        (json!([cd("cd1", "sata"), cd("cd2", "scsi")]), json!([]), json!([]),
         vec![("cd1", None), ("cd2", None)]),
        // Buses in the order they first appear: the sata disk before the virtio one.
        (json!([cd("cd", "sata"), disk("s", "sata"), disk("v", "virtio")]), json!([]), json!([]),
         vec![("cd", None), ("s", Some(1)), ("v", None)]),
        // Within a bus by target index: `y` reuses no target and gets vda, before x's vdb.
        (json!([disk("x", "virtio"), disk("y", "virtio")]), json!([]),
         json!([{"name": "x", "target": "vdb"}]),
         vec![("x", None), ("y", Some(1))]),
        // A lun counts as a disk.
        (json!([cd("cd", "scsi"), {"name": "l", "lun": {"bus": "scsi"}}]), json!([]), json!([]),
         vec![("cd", None), ("l", Some(1))]),
        // bootOrder on some disks: exactly those, nothing derived.
        (json!([disk("a", "virtio"), with_boot(disk("b", "virtio"), 2), with_boot(cd("cd", "sata"), 1)]),
         json!([]), json!([]),
         vec![("a", None), ("b", Some(2)), ("cd", Some(1))]),
        // bootOrder on a NIC only: no disk gets one.
        (json!([disk("a", "virtio")]),
         json!([{"name": "default", "masquerade": {}, "bootOrder": 1}]), json!([]),
         vec![("a", None)]),
        // A NIC without bootOrder changes nothing.
        (json!([disk("a", "virtio")]), json!([{"name": "default", "masquerade": {}}]), json!([]),
         vec![("a", Some(1))]),
    ];
    for (disks, ifaces, status, want) in cases {
        let volumes: Vec<Value> = disks
            .as_array()
            .unwrap()
            .iter()
            .map(|d| json!({"name": d["name"], "emptyDisk": {"capacity": "1Gi"}}))
            .collect();
        let mut v = vmi(disks.clone(), json!(volumes));
        v.spec.domain.devices.interfaces = serde_json::from_value(ifaces.clone()).unwrap();
        if status != json!([]) {
            v.status = Some(serde_json::from_value(json!({"volumeStatus": status})).unwrap());
        }
        let mut plan = DomainPlan::default();
        DisksConfigurator
            .configure(&v, &ConverterContext::default(), &mut plan)
            .unwrap_or_else(|e| panic!("{disks}: {e}"));
        let got: Vec<(String, Option<u32>)> = plan
            .devices_of(DeviceClass::Disk)
            .map(|d| (d.name.clone().unwrap(), bootindex(d)))
            .collect();
        let want: Vec<(String, Option<u32>)> =
            want.into_iter().map(|(n, b)| (n.to_string(), b)).collect();
        // The derived boot disk is recorded only where no device has a bootOrder.
        let explicit = format!("{disks}{ifaces}").contains("bootOrder");
        let derived = want
            .iter()
            .find(|(_, b)| *b == Some(1) && !explicit)
            .map(|(n, _)| format!("ua-{n}"));
        assert_eq!(plan.default_boot_disk, derived, "{disks} {ifaces}");
        assert_eq!(got, want, "{disks} {ifaces}");
    }
}

/// A hotplug volume ready at start can be libvirt's default boot disk (here the scsi `hp`
/// groups with the scsi cdrom, before the sata root): the argv carries `bootindex=1` as
/// libvirt's start does, the QMP plan's `device_add` none, as KubeVirt's later attach.
#[test]
fn a_default_boot_hotplug_disk_attaches_without_bootindex() {
    let mut v = vmi(
        json!([{"name": "cd", "cdrom": {"bus": "scsi"}},
               {"name": "root", "disk": {"bus": "sata"}},
               {"name": "hp", "disk": {"bus": "scsi"}}]),
        json!([{"name": "cd", "containerDisk": {"image": "i"}},
               {"name": "root", "containerDisk": {"image": "i"}},
               {"name": "hp", "persistentVolumeClaim": {"claimName": "c", "hotpluggable": true}}]),
    );
    v.status = Some(
        serde_json::from_value(json!({"volumeStatus": [
            {"name": "hp", "target": "", "phase": "Ready", "hotplugVolume": {}}]}))
        .unwrap(),
    );
    let mut plan = DomainPlan::default();
    DisksConfigurator
        .configure(&v, &ConverterContext::default(), &mut plan)
        .unwrap();
    let got: Vec<(String, Option<u32>)> = plan
        .devices_of(DeviceClass::Disk)
        .map(|d| (d.name.clone().unwrap(), bootindex(d)))
        .collect();
    assert_eq!(
        got,
        vec![
            ("cd".to_string(), None),
            ("root".to_string(), None),
            ("hp".to_string(), Some(1))
        ]
    );
    assert_eq!(plan.default_boot_disk.as_deref(), Some("ua-hp"));
    let qmp = crate::cmdline::render::qmp_plan(&plan);
    let hp = qmp.disks.iter().find(|d| d.name == "hp").unwrap();
    let device = serde_json::to_value(&hp.device).unwrap();
    assert_eq!(device.get("bootindex"), None, "{device}");
    assert_eq!(hp.device.id(), "ua-hp");
}

/// KubeVirt's downwardMetrics disk (`converter.go:871-884`): read-only, a fresh driver (the
/// spec's cache, io and `blockMultiQueue` queues are gone, cache and io come from the later
/// defaulting), the error policy set after it (`setErrorPolicy`, `:1179`); an ordinary disk
/// with the same spec keeps them.
#[test]
fn downward_metrics_disk_has_a_bare_driver() {
    let spec = |name: &str| {
        json!({"name": name, "disk": {"bus": "virtio"}, "cache": "writeback", "io": "threads",
               "errorPolicy": "report"})
    };
    let mut v = vmi(
        json!([spec("metrics"), spec("data")]),
        json!([{"name": "metrics", "downwardMetrics": {}},
               {"name": "data", "emptyDisk": {"capacity": "1Gi"}}]),
    );
    v.spec.domain.devices.block_multi_queue = Some(true);
    let facts = VolumeFacts {
        direct_io: true,
        ..Default::default()
    };
    let ctx = ConverterContext {
        volumes: [
            ("metrics".to_string(), facts.clone()),
            ("data".to_string(), facts),
        ]
        .into(),
        ..Default::default()
    };
    let mut plan = DomainPlan::default();
    DisksConfigurator.configure(&v, &ctx, &mut plan).unwrap();
    // (name, format read-only, O_DIRECT, aio, werror, rerror, num-queues)
    type Row = (
        String,
        bool,
        bool,
        Option<Aio>,
        Option<OnError>,
        Option<OnError>,
        Option<u32>,
    );
    let rows: Vec<Row> = plan
        .devices_of(DeviceClass::Disk)
        .map(|d| {
            let Backend::Blockdevs(nodes) = &d.backend else {
                panic!("no blockdevs")
            };
            let (mut ro, mut direct, mut aio) = (false, false, None);
            for n in nodes {
                match n {
                    Blockdev::Format(f) => ro = f.read_only,
                    Blockdev::Protocol(p) => {
                        direct = p.cache.is_some_and(|c| c.direct);
                        aio = p.aio;
                    }
                }
            }
            let crate::cmdline::qemu::Device::VirtioBlk(b) = &d.device else {
                panic!("not virtio-blk")
            };
            (
                d.name.clone().unwrap(),
                ro,
                direct,
                aio,
                b.werror,
                b.rerror,
                b.num_queues,
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (
                "metrics".to_string(),
                true,
                true,
                None,
                Some(OnError::Report),
                Some(OnError::Report),
                None
            ),
            (
                "data".to_string(),
                false,
                false,
                Some(Aio::Threads),
                Some(OnError::Report),
                Some(OnError::Report),
                Some(1)
            ),
        ]
    );
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

/// CBT Initializing/Enabled (`convertVolumeWithCBT`): a PVC (file and block) and a hostDisk run
/// through `<private>/libvirt/qemu/cbt/<volume>.qcow2` with the volume's image as the qcow2
/// node's raw `data-file` (its own protocol node, no backing); a containerDisk, a hot-plugged
/// PVC and a VMI with CBT Disabled keep their usual chains.
#[test]
fn cbt_volumes_run_through_their_overlay_with_the_image_as_data_file() {
    let disks = json!([{"name": "root", "disk": {}}, {"name": "data", "disk": {}},
                       {"name": "blk", "disk": {}}, {"name": "host", "disk": {}},
                       {"name": "cd", "disk": {}}, {"name": "hp", "disk": {}}]);
    let volumes = json!([{"name": "root", "containerDisk": {"image": "i"}},
                         {"name": "data", "persistentVolumeClaim": {"claimName": "c"}},
                         {"name": "blk", "dataVolume": {"name": "dv"}},
                         {"name": "host", "hostDisk": {"path": "/h/my.img", "type": "Disk"}},
                         {"name": "cd", "persistentVolumeClaim": {"claimName": "c2"}},
                         {"name": "hp", "persistentVolumeClaim": {"claimName": "c3", "hotpluggable": true}}]);
    let mut ctx = ConverterContext::default();
    ctx.volumes.insert(
        "blk".into(),
        VolumeFacts {
            kind: StorageKind::Block,
            ..VolumeFacts::default()
        },
    );
    let chain = |state: &str| {
        let mut v = vmi(disks.clone(), volumes.clone());
        v.status = Some(
            serde_json::from_value(json!({
                "changedBlockTracking": {"state": state},
                "volumeStatus": [{"name": "hp", "target": "", "phase": "MountedToPod", "hotplugVolume": {}}]}))
            .unwrap(),
        );
        let mut plan = DomainPlan::default();
        DisksConfigurator.configure(&v, &ctx, &mut plan).unwrap();
        plan.devices_of(DeviceClass::Disk)
            .map(|d| {
                let Backend::Blockdevs(nodes) = &d.backend else {
                    panic!("{d:?}")
                };
                (
                    d.name.clone().unwrap(),
                    serde_json::to_value(nodes).unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    let cbt = "/var/run/kubevirt-private/libvirt/qemu/cbt";
    let enabled = chain("Enabled");
    assert_eq!(enabled, chain("Initializing"));
    for (name, image, protocol) in [
        (
            "data",
            "/var/run/kubevirt-private/vmi-disks/data/disk.img",
            "file",
        ),
        ("blk", "/dev/blk", "host_device"),
        (
            "host",
            "/var/run/kubevirt-private/vmi-disks/host/my.img",
            "file",
        ),
    ] {
        let (_, nodes) = enabled.iter().find(|(n, _)| n == name).unwrap();
        let nodes = nodes.as_array().unwrap();
        assert_eq!(nodes.len(), 3, "{name}: {nodes:?}");
        let (data, overlay, format) = (&nodes[0], &nodes[1], &nodes[2]);
        assert_eq!(data["driver"], protocol, "{name}");
        assert_eq!(data["filename"], image, "{name}");
        assert_eq!(overlay["driver"], "file", "{name}");
        assert_eq!(overlay["filename"], format!("{cbt}/{name}.qcow2"), "{name}");
        assert_eq!(format["driver"], "qcow2", "{name}");
        assert_eq!(format["file"], overlay["node-name"], "{name}");
        assert_eq!(format["data-file"], data["node-name"], "{name}");
        assert_eq!(format["backing"], Value::Null, "{name}");
        assert_eq!(format["read-only"], false, "{name}");
    }
    let disabled = chain("Disabled");
    // The same nodes apart from their numbers.
    let files = |nodes: &Value| -> Vec<(Value, Value)> {
        let nodes = nodes.as_array().unwrap();
        nodes
            .iter()
            .map(|n| (n["driver"].clone(), n["filename"].clone()))
            .collect()
    };
    for name in ["root", "hp"] {
        let e = &enabled.iter().find(|(n, _)| n == name).unwrap().1;
        let d = &disabled.iter().find(|(n, _)| n == name).unwrap().1;
        assert_eq!(files(e), files(d), "{name}");
    }
    for (name, nodes) in &disabled {
        assert!(!nodes.to_string().contains("data-file"), "{name}: {nodes}");
    }
}
