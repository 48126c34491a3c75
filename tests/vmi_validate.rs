//! Rejected inputs: each case breaks one field of a valid, defaulted VMI and asserts the complete
//! list of errors (JSON path and reason).

use qlauncher::vmi::*;

const BASE: &str = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: base, namespace: default}
spec:
  hostname: base
  domain:
    resources:
      requests: {memory: 512Mi, cpu: "1"}
      limits: {memory: 1Gi, cpu: "2"}
    cpu: {sockets: 1, cores: 2, threads: 1}
    firmware:
      kernelBoot:
        kernelArgs: console=ttyS0
        container: {image: example/kernel, kernelPath: /boot/vmlinuz}
    clock: {utc: {}, timer: {rtc: {tickPolicy: catchup}}}
    features:
      hyperv: {synic: {}, vpindex: {}, spinlocks: {spinlocks: 8191}}
    devices:
      disks:
        - name: root
          disk: {bus: virtio}
          bootOrder: 1
        - name: iso
          cdrom: {bus: sata}
        - name: data
          disk: {bus: scsi}
          serial: DATA-1
      interfaces:
        - name: default
          masquerade: {}
          ports: [{name: http, port: 80}]
          macAddress: "02:00:00:00:00:01"
        - name: second
          bridge: {}
      inputs: [{name: tablet, type: tablet}]
      watchdog: {name: wd}
  networks:
    - {name: default, pod: {}}
    - {name: second, multus: {networkName: net2}}
  volumes:
    - {name: root, containerDisk: {image: example/guest}}
    - {name: iso, persistentVolumeClaim: {claimName: iso}}
    - {name: data, emptyDisk: {capacity: 1Gi}}
"#;

fn base() -> Vmi {
    let mut vmi = Vmi::from_json_or_yaml(BASE).unwrap();
    vmi.apply_defaults(&DefaultsConfig::default());
    vmi
}

fn disk(v: &mut Vmi, i: usize) -> &mut Disk {
    &mut v.spec.domain.devices.disks.as_mut().unwrap()[i]
}

fn iface(v: &mut Vmi, i: usize) -> &mut Interface {
    &mut v.spec.domain.devices.interfaces.as_mut().unwrap()[i]
}

fn volume(v: &mut Vmi, i: usize) -> &mut Volume {
    &mut v.spec.volumes.as_mut().unwrap()[i]
}

fn network(v: &mut Vmi, i: usize) -> &mut Network {
    &mut v.spec.networks.as_mut().unwrap()[i]
}

fn cpu(v: &mut Vmi) -> &mut Cpu {
    v.spec.domain.cpu.as_mut().unwrap()
}

fn memory(v: &mut Vmi) -> &mut Memory {
    v.spec.domain.memory.as_mut().unwrap()
}

fn q(s: &str) -> Quantity {
    Quantity::new(s)
}

fn s(v: &str) -> Option<String> {
    Some(v.to_string())
}

type Case = (
    &'static str,
    fn(&mut Vmi),
    &'static [(&'static str, &'static str)],
);

const SUBDOMAIN: &str = "must be a DNS-1123 subdomain (lowercase alphanumerics, '-' and '.', each dot-separated part starting and ending alphanumeric, at most 253 characters)";
const DNS: &str = "must be a DNS-1123 label (lowercase alphanumerics and '-', starting and ending alphanumeric, at most 63 characters)";

const CASES: &[Case] = &[
    ("vmi name", |v| v.metadata.name = s("Bad_Name"), &[("metadata.name", SUBDOMAIN)]),
    ("vmi name too long", |v| v.metadata.name = Some("a".repeat(254)), &[("metadata.name", SUBDOMAIN)]),
    ("vmi name empty part", |v| v.metadata.name = s("a..b"), &[("metadata.name", SUBDOMAIN)]),
    ("serial too long", |v| disk(v, 2).serial = Some("S".repeat(257)), &[("spec.domain.devices.disks[2].serial", "must be at most 256 characters long")]),
    ("scsi serial over 36", |v| disk(v, 2).serial = Some("S".repeat(37)), &[("spec.domain.devices.disks[2].serial", "is 37 characters long; a disk on bus scsi takes at most 36 (QEMU's scsi-hd and scsi-cd)")]),
    ("scsi cdrom serial over 36", |v| { disk(v, 1).cdrom.as_mut().unwrap().bus = s("scsi"); disk(v, 1).serial = Some("c".repeat(40)); }, &[("spec.domain.devices.disks[1].serial", "is 40 characters long; a disk on bus scsi takes at most 36 (QEMU's scsi-hd and scsi-cd)")]),
    ("lun serial over 36", |v| { let d = disk(v, 2); d.disk = None; d.lun = Some(Default::default()); d.serial = Some("L".repeat(37)); }, &[("spec.domain.devices.disks[2].serial", "is 37 characters long; a disk on bus scsi takes at most 36 (QEMU's scsi-hd and scsi-cd)")]),
    ("usb serial over 20", |v| { disk(v, 2).disk.as_mut().unwrap().bus = s("usb"); disk(v, 2).serial = Some("U".repeat(21)); }, &[("spec.domain.devices.disks[2].serial", "is 21 characters long; a disk on bus usb takes at most 20 (QEMU's usb-storage)")]),
    ("vmi name missing", |v| v.metadata.name = None, &[("metadata.name", "is required")]),
    ("hostname", |v| v.spec.hostname = s("-host"), &[("spec.hostname", DNS)]),
    ("subdomain", |v| v.spec.subdomain = s("a..b"), &[("spec.subdomain", "must be a DNS-1123 subdomain")]),
    ("architecture", |v| v.spec.architecture = s("riscv64"), &[("spec.architecture", "unsupported architecture: riscv64")]),
    ("grace period", |v| v.spec.termination_grace_period_seconds = Some(-1), &[("spec.terminationGracePeriodSeconds", "must be greater than or equal to 0")]),
    ("start strategy", |v| v.spec.start_strategy = s("Later"), &[("spec.startStrategy", "must be Paused if set")]),
    ("duplicate disk name", |v| disk(v, 2).name = "root".into(), &[
        ("spec.domain.devices.disks[2].name", "duplicates the name of spec.domain.devices.disks[0]"),
        ("spec.volumes[2].name", "no disk or filesystem uses this volume"),
    ]),
    ("disk without volume", |v| disk(v, 1).name = "nothere".into(), &[
        ("spec.domain.devices.disks[1].name", "no volume named 'nothere'"),
        ("spec.volumes[1].name", "no disk or filesystem uses this volume"),
    ]),
    ("disk name not a DNS label", |v| { disk(v, 2).name = "Data".into(); volume(v, 2).name = "Data".into(); }, &[
        ("spec.domain.devices.disks[2].name", DNS),
        ("spec.volumes[2].name", DNS),
    ]),
    ("unknown bus", |v| disk(v, 2).disk.as_mut().unwrap().bus = s("ide"), &[("spec.domain.devices.disks[2].disk.bus", "unrecognized bus \"ide\", must be one of: virtio, scsi, sata, usb")]),
    ("cdrom on virtio", |v| disk(v, 1).cdrom.as_mut().unwrap().bus = s("virtio"), &[("spec.domain.devices.disks[1].cdrom.bus", "bus virtio is invalid for a CD-ROM")]),
    ("two targets", |v| disk(v, 0).cdrom = Some(CdromTarget::default()), &[("spec.domain.devices.disks[0]", "can only have a single target type defined")]),
    ("sata read-only disk", |v| { let d = disk(v, 2).disk.as_mut().unwrap(); d.bus = s("sata"); d.read_only = Some(true); }, &[("spec.domain.devices.disks[2].disk.bus", "sata hard-disks do not support read-only")]),
    ("boot order zero", |v| disk(v, 0).boot_order = Some(0), &[("spec.domain.devices.disks[0].bootOrder", "must be greater than 0")]),
    ("boot order collision between disks", |v| disk(v, 2).boot_order = Some(1), &[("spec.domain.devices.disks[2].bootOrder", "boot order 1 is already used by spec.domain.devices.disks[0]")]),
    ("boot order collision disk and interface", |v| iface(v, 0).boot_order = Some(1), &[("spec.domain.devices.interfaces[0].bootOrder", "boot order 1 is already used by spec.domain.devices.disks[0]")]),
    ("serial characters", |v| disk(v, 2).serial = s("a b"), &[("spec.domain.devices.disks[2].serial", "must be made up of the characters [A-Za-z0-9_.+-]")]),
    ("cache mode", |v| disk(v, 0).cache = s("unsafe"), &[("spec.domain.devices.disks[0].cache", "must be one of none, writethrough, writeback")]),
    ("io mode", |v| disk(v, 0).io = s("io_uring"), &[("spec.domain.devices.disks[0].io", "must be one of native, threads")]),
    ("error policy", |v| disk(v, 0).error_policy = s("panic"), &[("spec.domain.devices.disks[0].errorPolicy", "must be one of stop, ignore, report, enospace")]),
    ("dedicated iothread on scsi", |v| disk(v, 2).dedicated_io_thread = Some(true), &[("spec.domain.devices.disks[2].dedicatedIOThread", "IOThreads are not supported for disks on a scsi bus")]),
    ("disk pci address", |v| disk(v, 0).disk.as_mut().unwrap().pci_address = s("00:05.0"), &[("spec.domain.devices.disks[0].disk.pciAddress", "malformed PCI address \"00:05.0\"")]),
    ("block size", |v| disk(v, 0).block_size = Some(BlockSize { custom: Some(CustomBlockSize { logical: Some(1000), physical: Some(4096), ..Default::default() }), ..Default::default() }), &[("spec.domain.devices.disks[0].blockSize.custom.logical", "must be a power of two between 512 and 2097152")]),
    ("duplicate volume name", |v| volume(v, 1).name = "root".into(), &[
        ("spec.domain.devices.disks[1].name", "no volume named 'iso'"),
        ("spec.volumes[1].name", "duplicates the name of spec.volumes[0]"),
    ]),
    ("volume with two sources", |v| volume(v, 0).empty_disk = Some(EmptyDiskSource { capacity: Some(q("1Gi")) }), &[("spec.volumes[0]", "must have exactly one source type set (found containerDisk, emptyDisk)")]),
    ("volume without source", |v| volume(v, 0).container_disk = None, &[("spec.volumes[0]", "must have exactly one source type set (found none)")]),
    ("container disk image", |v| volume(v, 0).container_disk.as_mut().unwrap().image.clear(), &[("spec.volumes[0].containerDisk.image", "is required")]),
    ("container disk path escapes", |v| volume(v, 0).container_disk.as_mut().unwrap().path = s("/disk/../../etc/shadow"), &[("spec.volumes[0].containerDisk.path", "must be an absolute path without '..'")]),
    ("empty disk capacity missing", |v| volume(v, 2).empty_disk.as_mut().unwrap().capacity = None, &[("spec.volumes[2].emptyDisk.capacity", "is required")]),
    ("empty disk capacity garbage", |v| volume(v, 2).empty_disk.as_mut().unwrap().capacity = Some(q("lots")), &[("spec.volumes[2].emptyDisk.capacity", "invalid quantity \"lots\": missing number")]),
    ("pvc claim name", |v| volume(v, 1).persistent_volume_claim.as_mut().unwrap().claim_name.clear(), &[("spec.volumes[1].persistentVolumeClaim.claimName", "is required")]),
    ("host disk type", |v| { let vol = volume(v, 2); vol.empty_disk = None; vol.host_disk = Some(HostDisk { path: "/var/disk.img".into(), r#type: "File".into(), ..Default::default() }); }, &[("spec.volumes[2].hostDisk.type", "must be one of Disk, DiskOrCreate")]),
    ("cloud-init base64", |v| { let vol = volume(v, 2); vol.empty_disk = None; vol.cloud_init_no_cloud = Some(CloudInitSource { user_data_base64: s("not base64!"), ..Default::default() }); }, &[("spec.volumes[2].cloudInitNoCloud.userDataBase64", "is not valid base64")]),
    ("cloud-init two user data", |v| { let vol = volume(v, 2); vol.empty_disk = None; vol.cloud_init_no_cloud = Some(CloudInitSource { user_data: s("#cloud-config"), user_data_base64: s("I2Nsb3VkLWNvbmZpZw=="), ..Default::default() }); }, &[("spec.volumes[2].cloudInitNoCloud", "must have only one userdata source set")]),
    ("interface without network", |v| iface(v, 1).name = "third".into(), &[
        ("spec.domain.devices.interfaces[1].name", "no network named 'third'"),
        ("spec.networks[1].name", "no interface named 'second'"),
    ]),
    ("duplicate interface name", |v| iface(v, 1).name = "default".into(), &[
        ("spec.domain.devices.interfaces[1].name", "duplicates the name of spec.domain.devices.interfaces[0]"),
        ("spec.networks[1].name", "no interface named 'second'"),
    ]),
    ("interface name characters", |v| { iface(v, 1).name = "sec ond".into(); network(v, 1).name = "sec ond".into(); }, &[("spec.domain.devices.interfaces[1].name", "may only contain letters, digits, '-' and '_'")]),
    ("two bindings", |v| iface(v, 0).bridge = Some(InterfaceBridge {}), &[("spec.domain.devices.interfaces[0]", "must have exactly one binding method (found bridge, masquerade)")]),
    ("masquerade on multus", |v| { let i = iface(v, 1); i.bridge = None; i.masquerade = Some(InterfaceMasquerade {}); }, &[("spec.domain.devices.interfaces[1].masquerade", "masquerade is only possible on the pod network")]),
    ("invalid mac", |v| iface(v, 0).mac_address = s("02:00:00:00:00"), &[("spec.domain.devices.interfaces[0].macAddress", "\"02:00:00:00:00\" is not a valid MAC address (aa:bb:cc:dd:ee:ff)")]),
    ("mac with garbage", |v| iface(v, 0).mac_address = s("zz:00:00:00:00:01"), &[("spec.domain.devices.interfaces[0].macAddress", "\"zz:00:00:00:00:01\" is not a valid MAC address (aa:bb:cc:dd:ee:ff)")]),
    ("port out of range", |v| iface(v, 0).ports.as_mut().unwrap()[0].port = 70000, &[("spec.domain.devices.interfaces[0].ports[0].port", "must be in range 0 < x < 65536")]),
    ("negative port", |v| iface(v, 0).ports.as_mut().unwrap()[0].port = -1, &[("spec.domain.devices.interfaces[0].ports[0].port", "must be in range 0 < x < 65536")]),
    ("port zero", |v| iface(v, 0).ports.as_mut().unwrap()[0].port = 0, &[("spec.domain.devices.interfaces[0].ports[0].port", "is required")]),
    ("port protocol", |v| iface(v, 0).ports.as_mut().unwrap()[0].protocol = s("SCTP"), &[("spec.domain.devices.interfaces[0].ports[0].protocol", "must be one of TCP, UDP")]),
    ("nic model", |v| iface(v, 0).model = s("virtio-net"), &[("spec.domain.devices.interfaces[0].model", "must be one of e1000, e1000e, igb, ne2k_pci, pcnet, rtl8139, virtio")]),
    ("nic pci address", |v| iface(v, 0).pci_address = s("0000:00:20.0"), &[("spec.domain.devices.interfaces[0].pciAddress", "malformed PCI address \"0000:00:20.0\"")]),
    ("dhcp private option", |v| iface(v, 0).dhcp_options = Some(DhcpOptions { private_options: Some(vec![DhcpPrivateOption { option: 100, value: "x".into() }]), ..Default::default() }), &[("spec.domain.devices.interfaces[0].dhcpOptions.privateOptions[0].option", "must be in range 224..=254")]),
    ("interface state", |v| iface(v, 0).state = s("sleeping"), &[("spec.domain.devices.interfaces[0].state", "must be one of up, down, absent")]),
    ("network without source", |v| network(v, 1).multus = None, &[("spec.networks[1]", "must have exactly one source (pod, multus or resourceClaim)")]),
    ("two pod networks", |v| { let n = network(v, 1); n.multus = None; n.pod = Some(PodNetwork::default()); }, &[("spec.networks[1].pod", "only one pod network is allowed (also spec.networks[0])")]),
    ("multus network name", |v| network(v, 1).multus.as_mut().unwrap().network_name.clear(), &[("spec.networks[1].multus.networkName", "is required")]),
    ("memory request below 1M", |v| { v.spec.domain.resources.requests.as_mut().unwrap().insert("memory".into(), q("512k")); memory(v).guest = Some(q("1Mi")); }, &[("spec.domain.resources.requests.memory", "must be greater than or equal to 1M")]),
    ("guest memory below 1M", |v| memory(v).guest = Some(q("1000")), &[("spec.domain.memory.guest", "must be greater than or equal to 1M")]),
    ("guest memory above limit", |v| memory(v).guest = Some(q("2Gi")), &[("spec.domain.memory.guest", "must be less than or equal to resources.limits.memory")]),
    ("no memory at all", |v| { v.spec.domain.resources = Default::default(); memory(v).guest = None; }, &[("spec.domain.memory.guest", "no memory requested: set domain.memory.guest, domain.memory.hugepages.pageSize or domain.resources.requests.memory")]),
    ("memory quantity garbage", |v| { v.spec.domain.resources.limits.as_mut().unwrap().insert("memory".into(), q("1 Gi")); }, &[("spec.domain.resources.limits.memory", "invalid quantity \"1 Gi\": unknown suffix")]),
    ("negative cpu request", |v| { v.spec.domain.resources.requests.as_mut().unwrap().insert("cpu".into(), q("-1")); }, &[("spec.domain.resources.requests.cpu", "invalid quantity \"-1\": negative quantity")]),
    ("cpu request above limit", |v| { v.spec.domain.resources.requests.as_mut().unwrap().insert("cpu".into(), q("3")); }, &[("spec.domain.resources.requests.cpu", "must be less than or equal to limits.cpu")]),
    ("max guest below guest", |v| memory(v).max_guest = Some(q("256Mi")), &[("spec.domain.memory.maxGuest", "must be greater than or equal to guest")]),
    ("hugepage size", |v| memory(v).hugepages = Some(Hugepages { page_size: s("3Q") }), &[("spec.domain.memory.hugepages.pageSize", "invalid hugepage size \"3Q\"")]),
    ("cores zero", |v| cpu(v).cores = Some(0), &[("spec.domain.cpu.cores", "must be greater than 0")]),
    ("threads zero", |v| cpu(v).threads = Some(0), &[("spec.domain.cpu.threads", "must be greater than 0")]),
    ("max sockets below sockets", |v| { cpu(v).sockets = Some(4); cpu(v).max_sockets = Some(2); }, &[("spec.domain.cpu.maxSockets", "must be greater than or equal to sockets")]),
    ("cpu feature policy", |v| cpu(v).features = Some(vec![CpuFeature { name: "pcid".into(), policy: s("maybe") }]), &[("spec.domain.cpu.features[0].policy", "must be one of force, require, optional, disable, forbid")]),
    ("isolate emulator thread", |v| cpu(v).isolate_emulator_thread = Some(true), &[("spec.domain.cpu.isolateEmulatorThread", "requires dedicatedCpuPlacement")]),
    ("firmware uuid", |v| v.spec.domain.firmware.as_mut().unwrap().uuid = s("not-a-uuid"), &[("spec.domain.firmware.uuid", "must be a UUID")]),
    ("bios and efi", |v| { v.spec.domain.firmware.as_mut().unwrap().bootloader = Some(Bootloader { bios: Some(Bios::default()), efi: Some(Efi { secure_boot: Some(false), ..Default::default() }) }); }, &[("spec.domain.firmware.bootloader", "has both EFI and BIOS configured, but they are mutually exclusive")]),
    ("secure boot without smm", |v| { v.spec.domain.firmware.as_mut().unwrap().bootloader = Some(Bootloader { efi: Some(Efi::default()), ..Default::default() }); }, &[("spec.domain.features.smm", "EFI secureBoot requires SMM, which is disabled")]),
    ("kernel path relative", |v| { v.spec.domain.firmware.as_mut().unwrap().kernel_boot.as_mut().unwrap().container.as_mut().unwrap().kernel_path = s("boot/vmlinuz"); }, &[("spec.domain.firmware.kernelBoot.container.kernelPath", "must be an absolute path without '..'")]),
    ("kernel args without container", |v| { v.spec.domain.firmware.as_mut().unwrap().kernel_boot.as_mut().unwrap().container = None; }, &[("spec.domain.firmware.kernelBoot.kernelArgs", "requires kernelBoot.container")]),
    ("hyperv dependency disabled", |v| { v.spec.domain.features.as_mut().unwrap().hyperv.as_mut().unwrap().vpindex = Some(FeatureState { enabled: Some(false) }); }, &[("spec.domain.features.hyperv.synic", "requires 'spec.domain.features.hyperv.vpindex', which was disabled")]),
    ("spinlock retries", |v| { v.spec.domain.features.as_mut().unwrap().hyperv.as_mut().unwrap().spinlocks.as_mut().unwrap().retries = Some(100); }, &[("spec.domain.features.hyperv.spinlocks.spinlocks", "must be greater than or equal to 4095")]),
    ("rtc tick policy", |v| { v.spec.domain.clock.as_mut().unwrap().timer.as_mut().unwrap().rtc.as_mut().unwrap().tick_policy = s("merge"); }, &[("spec.domain.clock.timer.rtc.tickPolicy", "must be one of delay, catchup")]),
    ("time zone escapes", |v| { let c = v.spec.domain.clock.as_mut().unwrap(); c.utc = None; c.timezone = s("../../etc/passwd"); }, &[("spec.domain.clock.timezone", "invalid time zone name")]),
    ("input bus", |v| v.spec.domain.devices.inputs.as_mut().unwrap()[0].bus = s("ps2"), &[("spec.domain.devices.inputs[0].bus", "must be one of usb, virtio")]),
    ("input type", |v| v.spec.domain.devices.inputs.as_mut().unwrap()[0].r#type = "mouse".into(), &[("spec.domain.devices.inputs[0].type", "must be one of tablet, keyboard")]),
    ("watchdog action", |v| v.spec.domain.devices.watchdog.as_mut().unwrap().i6300esb.as_mut().unwrap().action = s("explode"), &[("spec.domain.devices.watchdog.i6300esb.action", "must be one of poweroff, reset, shutdown")]),
    ("io threads policy", |v| v.spec.domain.io_threads_policy = s("dedicated"), &[("spec.domain.ioThreadsPolicy", "must be one of shared, auto, supplementalPool")]),
    ("sound model", |v| v.spec.domain.devices.sound = Some(SoundDevice { name: "snd".into(), model: s("sb16") }), &[("spec.domain.devices.sound.model", "must be one of ich9, ac97")]),
];

/// Every name Kubernetes accepts for an object (a DNS-1123 subdomain: dots, up to 253
/// characters, parts longer than 63) validates, and so does a serial of any length up to
/// KubeVirt's 256 on virtio and sata (libvirt passes it whole; the device cuts what the guest
/// reads), up to 36 on scsi and 20 on usb (what QEMU's devices take).
#[test]
fn kubernetes_names_and_kubevirt_serials_validate() {
    let long_label = format!("a{}", "b".repeat(99));
    let max = format!("{}.{}", "x".repeat(126), "y".repeat(126));
    assert_eq!(max.len(), 253);
    for name in [
        "web.prod",
        "a.b.c",
        long_label.as_str(),
        max.as_str(),
        "0vm",
    ] {
        let mut v = base();
        v.metadata.name = s(name);
        assert_eq!(v.validate(), Ok(()), "{name}");
    }
    for (i, bus, serial) in [
        (0, "virtio", "S".repeat(39)),
        (0, "virtio", "x".repeat(256)),
        (1, "sata", "x".repeat(256)),
        (2, "scsi", "a.b+c_d-e".into()),
        (2, "scsi", "s".repeat(36)),
        (2, "usb", "u".repeat(20)),
    ] {
        let mut v = base();
        if let Some(t) = disk(&mut v, i).disk.as_mut() {
            t.bus = s(bus);
        }
        disk(&mut v, i).serial = Some(serial.clone());
        assert_eq!(v.validate(), Ok(()), "{bus} {serial}");
    }
}

#[test]
fn base_vmi_is_valid() {
    assert_eq!(base().validate(), Ok(()));
}

#[test]
fn rejected_inputs_name_path_and_reason() {
    assert!(CASES.len() >= 30);
    let mut failures = Vec::new();
    for (name, mutate, expected) in CASES {
        let mut vmi = base();
        mutate(&mut vmi);
        let got: Vec<(String, String)> = match vmi.validate() {
            Ok(()) => Vec::new(),
            Err(errors) => errors.into_iter().map(|e| (e.path, e.reason)).collect(),
        };
        let want: Vec<(String, String)> = expected
            .iter()
            .map(|(p, r)| (p.to_string(), r.to_string()))
            .collect();
        if got != want {
            failures.push(format!("{name}:\n  want {want:?}\n  got  {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn all_errors_are_reported_at_once() {
    let mut vmi = base();
    disk(&mut vmi, 2).disk.as_mut().unwrap().bus = s("floppy");
    iface(&mut vmi, 0).mac_address = s("nope");
    volume(&mut vmi, 0)
        .container_disk
        .as_mut()
        .unwrap()
        .image
        .clear();
    let errors = vmi.validate().unwrap_err();
    let lines: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        lines,
        [
            "spec.domain.devices.disks[2].disk.bus: unrecognized bus \"floppy\", must be one of: virtio, scsi, sata, usb",
            "spec.volumes[0].containerDisk.image: is required",
            "spec.domain.devices.interfaces[0].macAddress: \"nope\" is not a valid MAC address (aa:bb:cc:dd:ee:ff)",
        ]
    );
}

#[test]
fn cpu_limit_of_zero_gives_a_zero_topology() {
    let text = r#"
kind: VirtualMachineInstance
metadata: {name: zero}
spec:
  domain:
    resources: {limits: {cpu: "0"}, requests: {memory: 64Mi}}
    devices: {autoattachPodInterface: false}
"#;
    let mut vmi = Vmi::from_json_or_yaml(text).unwrap();
    assert_eq!(vmi.validate(), Ok(()));
    vmi.apply_defaults(&DefaultsConfig::default());
    assert_eq!(
        vmi.validate(),
        Err(vec![FieldError {
            path: "spec.domain.cpu.sockets".into(),
            reason: "must be greater than 0".into(),
        }])
    );
}

#[test]
fn volumes_without_disks_are_valid_once_defaulted() {
    let text = r#"
kind: VirtualMachineInstance
metadata: {name: implicit}
spec:
  domain: {memory: {guest: 64Mi}}
  volumes: [{name: root, containerDisk: {image: img}}]
"#;
    let mut vmi = Vmi::from_json_or_yaml(text).unwrap();
    assert_eq!(
        vmi.validate(),
        Err(vec![FieldError {
            path: "spec.volumes[0].name".into(),
            reason: "no disk or filesystem uses this volume".into(),
        }])
    );
    vmi.apply_defaults(&DefaultsConfig::default());
    assert_eq!(vmi.validate(), Ok(()));
}
