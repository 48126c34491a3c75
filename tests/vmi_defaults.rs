//! KubeVirt's defaults (virt-api mutating webhook, amd64): exact values, and idempotence and
//! JSON round trip as properties over generated VMIs.

use proptest::prelude::*;
use qlauncher::vmi::*;
use serde_json::json;

fn load(text: &str) -> Vmi {
    Vmi::from_json_or_yaml(text).unwrap()
}

fn defaulted(text: &str, cfg: &DefaultsConfig) -> serde_json::Value {
    let mut vmi = load(text);
    vmi.apply_defaults(cfg);
    serde_json::to_value(&vmi).unwrap()
}

const MINIMAL: &str = r#"
kind: VirtualMachineInstance
metadata: {name: minimal}
spec:
  domain:
    resources: {requests: {memory: 128Mi}}
  volumes:
    - name: root
      containerDisk: {image: example/guest}
"#;

#[test]
fn minimal_vmi_gets_kubevirt_defaults() {
    let mut v = defaulted(MINIMAL, &DefaultsConfig::default());
    let uuid = v["spec"]["domain"]["firmware"]["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(uuid::Uuid::parse_str(&uuid).unwrap().get_version_num(), 4);
    v["spec"]["domain"]["firmware"]["uuid"] = json!("<random>");
    assert_eq!(
        v,
        json!({
            "kind": "VirtualMachineInstance",
            "metadata": {
                "name": "minimal",
                "annotations": {"kubevirt.io/pci-topology-version": "v3"}
            },
            "spec": {
                "architecture": "amd64",
                "domain": {
                    "resources": {"requests": {"memory": "128Mi"}},
                    "cpu": {"sockets": 1, "cores": 1, "threads": 1, "maxSockets": 4, "model": "host-model"},
                    "memory": {"guest": "128Mi"},
                    "machine": {"type": "q35"},
                    "firmware": {"uuid": "<random>"},
                    "features": {"acpi": {"enabled": true}},
                    "devices": {
                        "disks": [{"name": "root", "disk": {"bus": "sata"}}],
                        "interfaces": [{"name": "default", "bridge": {}}]
                    }
                },
                "networks": [{"name": "default", "pod": {}}],
                "volumes": [{"name": "root", "containerDisk": {"image": "example/guest", "imagePullPolicy": "Always"}}]
            },
            "status": {
                "runtimeUser": 107,
                "currentCPUTopology": {"sockets": 1, "cores": 1, "threads": 1},
                "memory": {"guestAtBoot": "128Mi", "guestCurrent": "128Mi", "guestRequested": "128Mi"}
            }
        })
    );
}

#[test]
fn masquerade_binding_is_configurable() {
    let cfg = DefaultsConfig {
        default_binding: DefaultBinding::Masquerade,
        ..Default::default()
    };
    let v = defaulted(MINIMAL, &cfg);
    assert_eq!(
        v["spec"]["domain"]["devices"]["interfaces"],
        json!([{"name": "default", "masquerade": {}}])
    );
}

#[test]
fn no_default_interface_when_autoattach_is_off_or_networks_exist() {
    let off = MINIMAL.replace(
        "resources:",
        "devices: {autoattachPodInterface: false}\n    resources:",
    );
    let v = defaulted(&off, &DefaultsConfig::default());
    assert_eq!(v["spec"]["networks"], json!(null));
    assert_eq!(v["spec"]["domain"]["devices"]["interfaces"], json!(null));
}

#[test]
fn sockets_from_cpu_limit_rounded_up_and_hotplug_limits() {
    let v = defaulted(
        include_str!("fixtures/vmi/cpu-from-limits.yaml"),
        &DefaultsConfig::default(),
    );
    let d = &v["spec"]["domain"];
    assert_eq!(
        d["cpu"],
        json!({"sockets": 3, "cores": 1, "threads": 1, "maxSockets": 12, "model": "host-model"})
    );
    assert_eq!(d["resources"]["requests"], json!({"cpu": "2500m"}));
    assert_eq!(d["memory"], json!({"guest": "2Gi", "maxGuest": "8Gi"}));
}

#[test]
fn cpu_request_used_when_no_limit() {
    let text = MINIMAL.replace("{memory: 128Mi}", "{memory: 128Mi, cpu: 1200m}");
    let v = defaulted(&text, &DefaultsConfig::default());
    assert_eq!(v["spec"]["domain"]["cpu"]["sockets"], 2);
}

#[test]
fn max_sockets_capped_at_512_vcpus() {
    let text = MINIMAL.replace(
        "resources:",
        "cpu: {sockets: 100, cores: 2, threads: 2}\n    resources:",
    );
    let v = defaulted(&text, &DefaultsConfig::default());
    // 100 × 4 × 2 × 2 > 512 → 512 / 4 = 128.
    assert_eq!(v["spec"]["domain"]["cpu"]["maxSockets"], 128);
}

#[test]
fn cluster_max_cpu_sockets_and_max_guest() {
    let cfg = DefaultsConfig {
        max_cpu_sockets: Some(6),
        max_guest: Some(Quantity::new("4Gi")),
        ..Default::default()
    };
    let text = MINIMAL.replace("128Mi", "1Gi");
    let v = defaulted(&text, &cfg);
    assert_eq!(v["spec"]["domain"]["cpu"]["maxSockets"], 6);
    assert_eq!(v["spec"]["domain"]["memory"]["maxGuest"], "4Gi");
}

#[test]
fn memory_hotplug_needs_1gi_aligned_amd64_guest() {
    // 128Mi is below 1Gi: no maxGuest.
    let v = defaulted(MINIMAL, &DefaultsConfig::default());
    assert_eq!(v["spec"]["domain"]["memory"], json!({"guest": "128Mi"}));
    // 1000M is not 2Mi aligned.
    let v = defaulted(
        &MINIMAL.replace("128Mi", "1500M"),
        &DefaultsConfig::default(),
    );
    assert_eq!(v["spec"]["domain"]["memory"], json!({"guest": "1500M"}));
    // 1.5Gi qualifies: ×4 = 6Gi.
    let v = defaulted(
        &MINIMAL.replace("128Mi", "1.5Gi"),
        &DefaultsConfig::default(),
    );
    assert_eq!(v["spec"]["domain"]["memory"]["maxGuest"], "6Gi");
    // Not with live update off.
    let cfg = DefaultsConfig {
        live_update: false,
        ..Default::default()
    };
    let v = defaulted(&MINIMAL.replace("128Mi", "2Gi"), &cfg);
    assert_eq!(v["spec"]["domain"]["memory"], json!({"guest": "2Gi"}));
    assert_eq!(v["spec"]["domain"]["cpu"]["maxSockets"], json!(null));
}

#[test]
fn guest_memory_from_limits_then_hugepages() {
    let text = MINIMAL.replace("requests: {memory: 128Mi}", "limits: {memory: 256Mi}");
    let v = defaulted(&text, &DefaultsConfig::default());
    assert_eq!(v["spec"]["domain"]["memory"]["guest"], "256Mi");
    let text = MINIMAL.replace(
        "resources: {requests: {memory: 128Mi}}",
        "memory: {hugepages: {pageSize: 2Mi}}",
    );
    let v = defaulted(&text, &DefaultsConfig::default());
    assert_eq!(v["spec"]["domain"]["memory"]["guest"], "2Mi");
}

#[test]
fn vm_firmware_uuid_is_derived_from_the_vm_name() {
    let vm = r#"
kind: VirtualMachine
metadata: {name: vm-cirros}
spec:
  template:
    spec:
      domain: {memory: {guest: 128Mi}}
"#;
    let vmi = load(vm);
    let cfg = DefaultsConfig::for_vmi(&vmi);
    assert_eq!(cfg.vm_name.as_deref(), Some("vm-cirros"));
    let v = defaulted(vm, &cfg);
    // uuid.NewSHA1(6a1a24a1-4061-4607-8bf4-a3963d0c5895, "vm-cirros")
    assert_eq!(
        v["spec"]["domain"]["firmware"]["uuid"],
        "0d2a2043-41c0-59c3-9b17-025022203668"
    );
    let v = defaulted(
        include_str!("fixtures/vmi/vm-firmware-uuid.yaml"),
        &DefaultsConfig::for_vmi(&load(include_str!("fixtures/vmi/vm-firmware-uuid.yaml"))),
    );
    assert_eq!(
        v["spec"]["domain"]["firmware"]["uuid"],
        "5d307ca9-b3ef-428c-8861-06e72d69f223"
    );
}

#[test]
fn disks_cdrom_inputs_watchdog_timers_and_pull_policy() {
    let text = r#"
kind: VirtualMachineInstance
metadata: {name: devs}
spec:
  domain:
    memory: {guest: 64Mi}
    clock: {timer: {hpet: {present: false}, rtc: {}}}
    devices:
      disks:
        - {name: a}
        - {name: b, cdrom: {}}
        - {name: c, lun: {}}
      inputs: [{name: in}]
      watchdog: {name: wd}
  volumes:
    - {name: a, containerDisk: {image: "reg/x:1.0"}}
    - {name: b, containerDisk: {image: "reg/x@sha256:00"}}
    - {name: c, persistentVolumeClaim: {claimName: pvc}}
    - {name: d, emptyDisk: {capacity: 1Gi}}
"#;
    let v = defaulted(text, &DefaultsConfig::default());
    let dev = &v["spec"]["domain"]["devices"];
    assert_eq!(
        dev["disks"],
        json!([
            {"name": "a", "disk": {"bus": "sata"}},
            {"name": "b", "cdrom": {"bus": "sata", "readonly": true, "tray": "closed"}},
            {"name": "c", "lun": {"bus": "sata"}},
            {"name": "d", "disk": {"bus": "sata"}}
        ])
    );
    assert_eq!(
        dev["inputs"],
        json!([{"name": "in", "bus": "usb", "type": "tablet"}])
    );
    assert_eq!(
        dev["watchdog"],
        json!({"name": "wd", "i6300esb": {"action": "reset"}})
    );
    assert_eq!(
        v["spec"]["domain"]["clock"],
        json!({"timer": {"hpet": {"present": false}, "rtc": {"present": true}}})
    );
    let vols = &v["spec"]["volumes"];
    assert_eq!(vols[0]["containerDisk"]["imagePullPolicy"], "IfNotPresent");
    assert_eq!(vols[1]["containerDisk"]["imagePullPolicy"], "IfNotPresent");
}

#[test]
fn hyperv_dependencies_and_spinlocks() {
    let text = r#"
kind: VirtualMachineInstance
metadata: {name: hv}
spec:
  domain:
    memory: {guest: 64Mi}
    features:
      hyperv:
        synictimer: {}
        spinlocks: {}
        evmcs: {}
"#;
    let v = defaulted(text, &DefaultsConfig::default());
    assert_eq!(
        v["spec"]["domain"]["features"]["hyperv"],
        json!({
            "vapic": {"enabled": true},
            "spinlocks": {"enabled": true, "spinlocks": 4096},
            "vpindex": {"enabled": true},
            "synic": {"enabled": true},
            "synictimer": {"enabled": true},
            "evmcs": {"enabled": true}
        })
    );
    assert_eq!(
        v["spec"]["domain"]["cpu"]["features"],
        json!([{"name": "vmx", "policy": "require"}])
    );
}

#[test]
fn arm64_defaults() {
    let v = defaulted(
        include_str!("fixtures/vmi/arm64.yaml"),
        &DefaultsConfig::default(),
    );
    let d = &v["spec"]["domain"];
    assert_eq!(d["machine"]["type"], "virt");
    assert_eq!(d["cpu"]["model"], "host-passthrough");
    assert_eq!(d["cpu"]["maxSockets"], json!(null));
    assert_eq!(
        d["firmware"]["bootloader"],
        json!({"efi": {"secureBoot": false}})
    );
    assert_eq!(d["devices"]["disks"][0]["disk"]["bus"], "virtio");
}

#[test]
fn root_feature_gate_leaves_runtime_user_unset() {
    let cfg = DefaultsConfig {
        root: true,
        cpu_model: Some("Haswell".into()),
        ..Default::default()
    };
    let v = defaulted(MINIMAL, &cfg);
    assert_eq!(v["status"]["runtimeUser"], json!(null));
    assert_eq!(v["spec"]["domain"]["cpu"]["model"], "Haswell");
}

#[test]
fn binary_si_formatting() {
    assert_eq!(defaults::binary_si(4 << 30).as_str(), "4Gi");
    assert_eq!(defaults::binary_si(1536 << 20).as_str(), "1536Mi");
    assert_eq!(defaults::binary_si(1000).as_str(), "1000");
    assert_eq!(defaults::binary_si(0).as_str(), "0");
}

// ---- properties over generated VMIs ----

fn opt<T: Clone + std::fmt::Debug + 'static>(
    s: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<Option<T>> {
    prop_oneof![Just(None), s.prop_map(Some)].boxed()
}

fn quantity(choices: &'static [&'static str]) -> BoxedStrategy<Quantity> {
    prop::sample::select(choices)
        .prop_map(Quantity::new)
        .boxed()
}

/// Small CPU counts, plus a few huge ones that must not overflow anything.
fn count() -> BoxedStrategy<u32> {
    prop_oneof![8 => 0u32..5, 1 => Just(u32::MAX), 1 => Just(1 << 20), 1 => 5u32..200].boxed()
}

fn state() -> BoxedStrategy<Option<FeatureState>> {
    opt(opt(any::<bool>()).prop_map(|enabled| FeatureState { enabled }))
}

prop_compose! {
    fn arb_disk()(
        name in prop::sample::select(&["a", "b", "c", "d"][..]),
        kind in 0u8..4,
        bus in opt(prop::sample::select(&["virtio", "sata", "scsi", ""][..])),
        boot in opt(0u32..4),
    ) -> Disk {
        let bus = bus.map(str::to_string);
        let mut d = Disk { name: name.to_string(), boot_order: boot, ..Default::default() };
        match kind {
            0 => {}
            1 => d.disk = Some(DiskTarget { bus, ..Default::default() }),
            2 => d.cdrom = Some(CdromTarget { bus, ..Default::default() }),
            _ => d.lun = Some(LunTarget { bus, ..Default::default() }),
        }
        d
    }
}

prop_compose! {
    fn arb_vmi()(
        arch in opt(prop::sample::select(&["amd64", "arm64", "s390x", ""][..])),
        topo in opt((opt(count()), opt(count()), opt(count()), opt(count()))),
        cpu_limit in opt(quantity(&["500m", "2", "0", "2500m", "garbage", "1.5"])),
        cpu_request in opt(quantity(&["100m", "1", "3"])),
        mem_request in opt(quantity(&["64Mi", "1Gi", "2Gi", "1.5Gi", "1000M", "bad"])),
        mem_limit in opt(quantity(&["128Mi", "2Gi", "4Gi"])),
        guest in opt(quantity(&["1Gi", "3Gi", "100Mi"])),
        hugepages in opt(prop::sample::select(&["2Mi", "1Gi", "junk"][..])),
        disks in prop::collection::vec(arb_disk(), 0..4),
        volumes in prop::collection::vec(prop::sample::select(&["a", "b", "e", "f"][..]), 0..4),
        iface in opt(prop::sample::select(&["bridge", "masquerade"][..])),
        autoattach in opt(any::<bool>()),
        hv in opt((state(), state(), state(), state(), state(), state())),
        timers in opt((opt(opt(any::<bool>())), opt(opt(any::<bool>())))),
        watchdog in any::<bool>(),
        uuid in opt(Just("6a5b4c3d-2e1f-4a0b-9c8d-7e6f5a4b3c2d".to_string())),
    ) -> Vmi {
        let mut vmi = Vmi { metadata: ObjectMeta { name: Some("gen".into()), ..Default::default() }, ..Default::default() };
        let spec = &mut vmi.spec;
        spec.architecture = arch.map(str::to_string);
        let d = &mut spec.domain;
        if let Some((s, c, t, m)) = topo {
            d.cpu = Some(Cpu { sockets: s, cores: c, threads: t, max_sockets: m, ..Default::default() });
        }
        let mut req = std::collections::BTreeMap::new();
        let mut lim = std::collections::BTreeMap::new();
        if let Some(q) = cpu_limit { lim.insert("cpu".to_string(), q); }
        if let Some(q) = cpu_request { req.insert("cpu".to_string(), q); }
        if let Some(q) = mem_request { req.insert("memory".to_string(), q); }
        if let Some(q) = mem_limit { lim.insert("memory".to_string(), q); }
        if !req.is_empty() { d.resources.requests = Some(req); }
        if !lim.is_empty() { d.resources.limits = Some(lim); }
        if guest.is_some() || hugepages.is_some() {
            d.memory = Some(Memory {
                guest,
                hugepages: hugepages.map(|p| Hugepages { page_size: Some(p.to_string()) }),
                ..Default::default()
            });
        }
        if !disks.is_empty() { d.devices.disks = Some(disks); }
        d.devices.autoattach_pod_interface = autoattach;
        if let Some(b) = iface {
            let mut i = Interface { name: "default".into(), ..Default::default() };
            if b == "bridge" { i.bridge = Some(InterfaceBridge {}) } else { i.masquerade = Some(InterfaceMasquerade {}) }
            d.devices.interfaces = Some(vec![i]);
        }
        if let Some((relaxed, vapic, synic, vpindex, ipi, evmcs)) = hv {
            let features = d.features.get_or_insert_with(Default::default);
            features.hyperv = Some(FeatureHyperv {
                relaxed, vapic, synic, vpindex, ipi, evmcs,
                synictimer: Some(SyNicTimer::default()),
                spinlocks: Some(FeatureSpinlocks::default()),
                ..Default::default()
            });
        }
        if let Some((hpet, rtc)) = timers {
            d.clock = Some(Clock { timer: Some(Timer {
                hpet: hpet.map(|enabled| TickTimer { enabled, ..Default::default() }),
                rtc: rtc.map(|enabled| RtcTimer { enabled, ..Default::default() }),
                ..Default::default()
            }), ..Default::default() });
        }
        if watchdog {
            d.devices.watchdog = Some(Watchdog { name: "wd".into(), ..Default::default() });
        }
        if let Some(u) = uuid {
            d.firmware = Some(Firmware { uuid: Some(u), ..Default::default() });
        }
        let vols: Vec<Volume> = volumes.iter().map(|n| Volume {
            name: n.to_string(),
            container_disk: Some(ContainerDiskSource { image: "img".into(), ..Default::default() }),
            ..Default::default()
        }).collect();
        if !vols.is_empty() { spec.volumes = Some(vols); }
        vmi
    }
}

prop_compose! {
    fn arb_cfg()(
        masquerade in any::<bool>(),
        max_cpu_sockets in opt(1u32..16),
        max_guest in opt(quantity(&["8Gi", "3Gi", "1000M"])),
        vm_name in opt(Just("some-vm".to_string())),
        live_update in any::<bool>(),
        root in any::<bool>(),
        cpu_request in opt(quantity(&["100m", "250m"])),
    ) -> DefaultsConfig {
        DefaultsConfig {
            default_binding: if masquerade { DefaultBinding::Masquerade } else { DefaultBinding::Bridge },
            max_cpu_sockets, max_guest, vm_name, live_update, root, cpu_request,
            ..Default::default()
        }
    }
}

proptest! {
    #[test]
    fn applying_defaults_twice_equals_once(vmi in arb_vmi(), cfg in arb_cfg()) {
        let mut once = vmi.clone();
        once.apply_defaults(&cfg);
        let mut twice = once.clone();
        twice.apply_defaults(&cfg);
        prop_assert_eq!(twice, once);
    }

    #[test]
    fn defaulted_vmi_round_trips_through_json(vmi in arb_vmi(), cfg in arb_cfg()) {
        let mut vmi = vmi;
        vmi.apply_defaults(&cfg);
        let json = serde_json::to_string(&vmi).unwrap();
        prop_assert_eq!(&Vmi::from_json_or_yaml(&json).unwrap(), &vmi);
        let yaml = serde_yaml_ng::to_string(&vmi).unwrap();
        prop_assert_eq!(&Vmi::from_json_or_yaml(&yaml).unwrap(), &vmi);
    }

    #[test]
    fn validate_never_panics(vmi in arb_vmi(), cfg in arb_cfg()) {
        let _ = vmi.validate();
        let mut vmi = vmi;
        vmi.apply_defaults(&cfg);
        let _ = vmi.validate();
    }
}
