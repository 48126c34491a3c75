//! Parsing VMI manifests: field spelling, tolerance of unknown fields, holders of VMI templates.

use qlauncher::vmi::{Quantity, Vmi, VmiError};

const VMI_YAML: &str = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: testvmi
  namespace: default
  labels: {special: vmi}
  managedFields: [{manager: kubectl}]
spec:
  unknownSpecField: 3
  domain:
    cpu: {cores: 2, dedicatedCpuPlacement: true, model: host-passthrough}
    resources:
      requests: {memory: 1Gi, cpu: 500m}
      limits: {cpu: 2}
    firmware:
      bootloader: {efi: {secureBoot: false}}
    clock:
      utc: {}
      timer: {hpet: {present: false}, rtc: {tickPolicy: catchup}}
    features:
      hyperv: {spinlocks: {spinlocks: 8191}, synictimer: {direct: {}}}
    devices:
      autoattachVSOCK: true
      networkInterfaceMultiqueue: true
      disks:
        - name: root
          disk: {bus: virtio, readonly: true}
          bootOrder: 1
          dedicatedIOThread: true
        - name: cd
          cdrom: {bus: sata}
      interfaces:
        - name: default
          masquerade: {}
          ports: [{port: 80}]
          macAddress: "02:00:00:00:00:01"
      rng: {}
  networks:
    - name: default
      pod: {vmNetworkCIDR: 10.1.2.0/24}
  volumes:
    - name: root
      containerDisk: {image: qlauncher/test-guest:latest}
    - name: cd
      downwardAPI: {fields: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}
status:
  VSOCKCID: 3
  currentCPUTopology: {sockets: 1, cores: 2, threads: 1}
  volumeStatus: [{name: root, target: vda}]
"#;

#[test]
fn parses_yaml_vmi_with_kubevirt_spelling() {
    let vmi = Vmi::from_json_or_yaml(VMI_YAML).unwrap();
    assert_eq!(vmi.metadata.name.as_deref(), Some("testvmi"));
    let d = &vmi.spec.domain;
    let cpu = d.cpu.as_ref().unwrap();
    assert_eq!(cpu.cores, Some(2));
    assert_eq!(cpu.dedicated_cpu_placement, Some(true));
    assert_eq!(d.resources.request("memory"), Some(&Quantity::new("1Gi")));
    assert_eq!(d.resources.limit("cpu"), Some(&Quantity::new("2")));
    let timer = d.clock.as_ref().unwrap().timer.as_ref().unwrap();
    assert_eq!(timer.hpet.as_ref().unwrap().enabled, Some(false));
    let hv = d.features.as_ref().unwrap().hyperv.as_ref().unwrap();
    assert_eq!(hv.spinlocks.as_ref().unwrap().retries, Some(8191));
    let disks = d.devices.disks.as_ref().unwrap();
    assert_eq!(disks[0].disk.as_ref().unwrap().read_only, Some(true));
    assert_eq!(disks[0].dedicated_io_thread, Some(true));
    assert_eq!(disks[0].boot_order, Some(1));
    assert_eq!(d.devices.autoattach_vsock, Some(true));
    assert_eq!(d.devices.network_interface_multi_queue, Some(true));
    let iface = &d.devices.interfaces.as_ref().unwrap()[0];
    assert!(iface.masquerade.is_some());
    assert_eq!(iface.ports.as_ref().unwrap()[0].port, 80);
    let nets = vmi.spec.networks.as_ref().unwrap();
    assert_eq!(
        nets[0].pod.as_ref().unwrap().vm_network_cidr.as_deref(),
        Some("10.1.2.0/24")
    );
    let vols = vmi.spec.volumes.as_ref().unwrap();
    assert_eq!(vols[1].source_kinds(), vec!["downwardAPI"]);
    let st = vmi.status.as_ref().unwrap();
    assert_eq!(st.vsock_cid, Some(3));
    assert_eq!(st.volume_status.as_ref().unwrap()[0].target, "vda");
}

#[test]
fn json_round_trip_keeps_spelling() {
    let vmi = Vmi::from_json_or_yaml(VMI_YAML).unwrap();
    let json = serde_json::to_value(&vmi).unwrap();
    assert_eq!(json["spec"]["domain"]["devices"]["autoattachVSOCK"], true);
    assert_eq!(
        json["spec"]["domain"]["devices"]["disks"][0]["dedicatedIOThread"],
        true
    );
    assert_eq!(
        json["spec"]["domain"]["devices"]["disks"][0]["disk"]["readonly"],
        true
    );
    assert_eq!(
        json["spec"]["domain"]["clock"]["timer"]["hpet"]["present"],
        false
    );
    assert_eq!(
        json["spec"]["volumes"][1]["downwardAPI"]["fields"][0]["path"],
        "labels"
    );
    assert_eq!(json["status"]["VSOCKCID"], 3);
    assert_eq!(json["spec"]["domain"]["resources"]["limits"]["cpu"], "2");
    let back = Vmi::from_json_or_yaml(&serde_json::to_string(&json).unwrap()).unwrap();
    assert_eq!(back, vmi);
}

#[test]
fn virtual_machine_template_gets_vm_name_and_owner() {
    let vm = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: vm-cirros, namespace: ns1}
spec:
  runStrategy: Always
  template:
    metadata: {labels: {kubevirt.io/vm: vm-cirros}}
    spec:
      domain: {devices: {}, resources: {requests: {memory: 128Mi}}}
"#;
    let vmi = Vmi::from_json_or_yaml(vm).unwrap();
    assert_eq!(vmi.metadata.name.as_deref(), Some("vm-cirros"));
    assert_eq!(vmi.metadata.namespace.as_deref(), Some("ns1"));
    assert_eq!(vmi.owner_vm_name(), Some("vm-cirros"));
    assert_eq!(vmi.kind.as_deref(), Some("VirtualMachineInstance"));
}

#[test]
fn other_kinds_are_rejected_clearly() {
    let err =
        Vmi::from_json_or_yaml("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n").unwrap_err();
    assert!(matches!(err, VmiError::WrongKind { .. }));
    assert_eq!(
        err.to_string(),
        "no VirtualMachineInstance in manifest (kinds found: Pod)"
    );
}

#[test]
fn wrong_field_type_names_the_path() {
    let err = Vmi::from_json_or_yaml(
        r#"{"kind":"VirtualMachineInstance","spec":{"domain":{"cpu":{"cores":"two"}}}}"#,
    )
    .unwrap_err();
    match err {
        VmiError::Decode { path, .. } => assert_eq!(path, "spec.domain.cpu.cores"),
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn helper_accessors() {
    let vmi = Vmi::from_json_or_yaml(VMI_YAML).unwrap();
    let disks = vmi.spec.domain.devices.disks.as_ref().unwrap();
    assert_eq!(disks[0].target_kind(), Some("disk"));
    assert_eq!(disks[0].bus(), Some("virtio"));
    assert!(disks[0].read_only());
    assert_eq!(disks[1].target_kind(), Some("cdrom"));
    assert_eq!(disks[1].bus(), Some("sata"));
    assert!(!disks[1].read_only());
    let iface = &vmi.spec.domain.devices.interfaces.as_ref().unwrap()[0];
    assert_eq!(iface.bindings(), vec!["masquerade"]);
    assert!(vmi.volume("root").unwrap().container_disk.is_some());
    assert!(vmi.volume("nope").is_none());
    assert!(vmi.network("default").unwrap().pod.is_some());
    // cores: 2, sockets/threads unset → 1 each.
    let topo = vmi.vcpu_topology();
    assert_eq!(
        (topo.sockets, topo.cores, topo.threads, topo.vcpus()),
        (1, 2, 1, 2)
    );
}

#[test]
fn vcpu_topology_from_cpu_limit_or_request() {
    let with = |res: &str| {
        Vmi::from_json_or_yaml(&format!(
            "kind: VirtualMachineInstance\nspec: {{domain: {{resources: {res}}}}}\n"
        ))
        .unwrap()
        .vcpu_topology()
    };
    assert_eq!(
        with("{limits: {cpu: 2500m}, requests: {cpu: 1}}").vcpus(),
        3
    );
    assert_eq!(with("{requests: {cpu: 1200m}}").vcpus(), 2);
    assert_eq!(with("{}").vcpus(), 1);
}

#[test]
fn multi_document_yaml_picks_the_vmi() {
    let text = "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\nkind: VirtualMachineInstance\nmetadata: {name: x}\n---\n";
    let vmi = Vmi::from_json_or_yaml(text).unwrap();
    assert_eq!(vmi.metadata.name.as_deref(), Some("x"));
    let two = format!(
        "{text}kind: VirtualMachine\nmetadata: {{name: y}}\nspec: {{template: {{spec: {{}}}}}}\n"
    );
    assert_eq!(
        Vmi::from_json_or_yaml(&two).unwrap_err().to_string(),
        "manifest holds 2 VMIs; give one"
    );
    let no_template = "kind: VirtualMachine\nmetadata: {name: y}\nspec: {}\n";
    assert_eq!(
        Vmi::from_json_or_yaml(no_template).unwrap_err().to_string(),
        "VirtualMachine has no spec.template"
    );
}

#[test]
fn pool_and_replica_set_templates() {
    let pool = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/vmi/vm-pool.yaml"
    ))
    .unwrap();
    let vmi = Vmi::from_json_or_yaml(&pool).unwrap();
    assert_eq!(vmi.metadata.name.as_deref(), Some("pool-0"));
    assert_eq!(vmi.owner_vm_name(), Some("pool-0"));
    let rs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/vmi/replicaset.yaml"
    ))
    .unwrap();
    let vmi = Vmi::from_json_or_yaml(&rs).unwrap();
    assert_eq!(vmi.metadata.name, None);
    assert_eq!(vmi.metadata.generate_name.as_deref(), Some("replicaset"));
    assert_eq!(vmi.owner_vm_name(), None);
}

#[test]
fn malformed_text_is_an_error_not_a_panic() {
    assert!(matches!(
        Vmi::from_json_or_yaml("{\"kind\": "),
        Err(VmiError::ParseJson(_))
    ));
    assert!(matches!(
        Vmi::from_json_or_yaml("kind: [unclosed"),
        Err(VmiError::ParseManifest(_))
    ));
}

proptest::proptest! {
    #[test]
    fn arbitrary_text_never_panics(s in "(?s).{0,200}") {
        let _ = Vmi::from_json_or_yaml(&s);
    }

    #[test]
    fn arbitrary_yaml_vmi_fields_never_panic(
        cores in proptest::prelude::any::<i64>(),
        port in proptest::prelude::any::<i64>(),
        q in "[-+0-9.eEkKMGTPimun]{0,12}",
    ) {
        let text = format!(
            "kind: VirtualMachineInstance\nmetadata: {{name: p}}\nspec:\n  domain:\n    cpu: {{cores: {cores}}}\n    resources: {{requests: {{memory: '{q}', cpu: '{q}'}}}}\n    devices:\n      interfaces: [{{name: default, masquerade: {{}}, ports: [{{port: {port}}}]}}]\n  networks: [{{name: default, pod: {{}}}}]\n"
        );
        if let Ok(mut vmi) = Vmi::from_json_or_yaml(&text) {
            let _ = vmi.validate();
            vmi.apply_defaults(&qlauncher::vmi::DefaultsConfig::default());
            let _ = vmi.validate();
        }
    }
}
