//! GPUs, host devices and SR-IOV VFs in the exported domain, as KubeVirt v1.9.0's
//! `device/hostdevice` package builds them and libvirt reports them: the `<hostdev>` XML and the
//! `api.Domain` JSON virt-handler reads (`Devices.HostDevices`: the `sriov-<interface>` aliases
//! give the SR-IOV interfaces' status and drive `HotplugHostDevices`). No VFIO hardware is
//! needed: the plan's `vfio-pci` devices carry the host addresses from the context.

mod support;

use qlauncher_core::cmdline::context::HostDeviceSource;
use qlauncher_core::cmdline::{convert, ConverterContext};
use qlauncher_core::vmi::Vmi;
use qlauncher_libvirt_xml::api_json::{key_paths, xml_to_api_spec};
use qlauncher_libvirt_xml::{export, libvirt, to_api_spec, to_xml, CompatError};
use serde_json::{json, Value};

fn vmi(devices: Value, networks: Value) -> Vmi {
    let v = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "hd", "namespace": "ns", "uid": "uid-hd"},
        "spec": {"domain": {"devices": devices, "memory": {"guest": "256Mi"}},
                 "networks": networks}
    });
    Vmi::from_json_or_yaml(&v.to_string()).unwrap()
}

fn ctx(devices: &[(&str, HostDeviceSource)]) -> ConverterContext {
    let mut ctx = ConverterContext::default();
    for (id, source) in devices {
        ctx.host_devices.insert(id.to_string(), source.clone());
    }
    ctx
}

fn pci(a: &str) -> HostDeviceSource {
    HostDeviceSource::Pci(a.into())
}

fn mdev(u: &str) -> HostDeviceSource {
    HostDeviceSource::Mdev(u.into())
}

/// `Devices.HostDevices` of the exported domain, with each entry's guest `Address` removed
/// (the PCI pass's slot; checked separately).
fn host_devices(vmi: &Vmi, ctx: &ConverterContext) -> Vec<Value> {
    let plan = convert(vmi, ctx).unwrap();
    let api = to_api_spec(&export(vmi, ctx, &plan).unwrap()).unwrap();
    assert_no_hostdev_dropped(&api.dropped);
    let mut list = api.spec["Devices"]["HostDevices"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for d in &mut list {
        let address = d.as_object_mut().unwrap().remove("Address").unwrap();
        assert_eq!(address["Type"], "pci", "{address}");
        assert_eq!(address["Slot"], "0x00", "{address}");
    }
    list
}

/// Every `<hostdev>` element and attribute has its `api.HostDevice` field (the others dropped are
/// the root ports' and video's, listed in `api_json.rs`).
fn assert_no_hostdev_dropped(dropped: &[String]) {
    let lost: Vec<_> = dropped.iter().filter(|d| d.contains("hostdev")).collect();
    assert!(lost.is_empty(), "{lost:?}");
}

fn alias(name: &str) -> Value {
    json!({"Name": name, "UserDefined": true})
}

fn pci_source(domain: &str, bus: &str, slot: &str, function: &str) -> Value {
    json!({"Address": {"Domain": domain, "Bus": bus, "Slot": slot, "Function": function}})
}

/// The main crate's `hostdevs` fixture (a PCI GPU, a vGPU, a generic host device, an SR-IOV
/// interface with a boot order): its `<hostdev>` elements exactly, in KubeVirt's order (generic
/// host devices, then GPUs with PCI functions before mediated devices, then SR-IOV), each on
/// its own root port.
#[test]
fn the_hostdevs_fixture_exports_kubevirts_hostdev_elements() {
    let f = support::load(
        &support::repo_root().join("tests/fixtures/cmdline/hostdevs.yaml"),
        None,
    )
    .expect("the fixture has all its devices");
    let xml = to_xml(&export(&f.vmi, &f.ctx, &f.plan).unwrap()).unwrap();
    let hostdevs: String = xml
        .lines()
        .skip_while(|l| !l.contains("<hostdev "))
        .take_while(|l| !l.contains("<controller "))
        .map(|l| format!("{}\n", l.trim()))
        .collect();
    let expected = r#"<hostdev type="pci" managed="no" mode="subsystem">
<source>
<address domain="0x0000" bus="0xb1" slot="0x00" function="0x0"/>
</source>
<address type="pci" domain="0x0000" bus="0x09" slot="0x00" function="0x0"/>
<alias name="ua-hostdevice-fpga"/>
</hostdev>
<hostdev type="pci" managed="no" mode="subsystem">
<source>
<address domain="0x0000" bus="0x65" slot="0x00" function="0x0"/>
</source>
<address type="pci" domain="0x0000" bus="0x07" slot="0x00" function="0x0"/>
<alias name="ua-gpu-gpu1"/>
</hostdev>
<hostdev type="mdev" mode="subsystem" model="vfio-pci" display="on" ramfb="on">
<source>
<address uuid="4b20d080-1b54-4048-85b3-a6a62d165c01"/>
</source>
<address type="pci" domain="0x0000" bus="0x08" slot="0x00" function="0x0"/>
<alias name="ua-gpu-vgpu1"/>
</hostdev>
<hostdev type="pci" managed="no" mode="subsystem">
<source>
<address domain="0x0000" bus="0x3b" slot="0x02" function="0x3"/>
</source>
<boot order="2"/>
<address type="pci" domain="0x0000" bus="0x0a" slot="0x00" function="0x0"/>
<alias name="ua-sriov-vf"/>
</hostdev>
"#;
    assert_eq!(hostdevs, expected, "{xml}");
    // The guest addresses are the plan's: the root ports QEMU's argv puts the devices on.
    for (id, bus) in [
        ("ua-hostdevice-fpga", "pci.9"),
        ("ua-gpu-gpu1", "pci.7"),
        ("ua-gpu-vgpu1", "pci.8"),
        ("ua-sriov-vf", "pci.10"),
    ] {
        let d = f.plan.devices.iter().find(|d| d.device.id() == id).unwrap();
        assert_eq!(d.address.as_ref().unwrap().bus, bus, "{id}");
    }
    // libvirt's schema accepts it (no VFIO needed to validate).
    support::ensure_libvirt_tools();
    libvirt::validate(&libvirt::for_libvirt9(&xml)).unwrap();
    // Both renderers agree, and nothing is lost on the way to JSON.
    let api = to_api_spec(&export(&f.vmi, &f.ctx, &f.plan).unwrap()).unwrap();
    assert_no_hostdev_dropped(&api.dropped);
    let via_xml = xml_to_api_spec(&xml).unwrap();
    assert_eq!(key_paths(&via_xml.spec), key_paths(&api.spec));
    assert_eq!(
        via_xml.spec["Devices"]["HostDevices"],
        api.spec["Devices"]["HostDevices"]
    );
}

/// `api.Domain` JSON of each kind, the fields KubeVirt's `createPCIHostDevice` /
/// `createMDEVHostDevice` set (plus libvirt's `Mode` on PCI), the host address as
/// `NewPciAddressField` spells it (lower-case hex) without libvirt's dropped `type`.
#[test]
fn each_kind_renders_as_kubevirts_api_host_device() {
    let v = vmi(
        json!({
            "gpus": [{"name": "gpu1", "deviceName": "nvidia.com/GA102GL_A10"},
                     {"name": "vgpu1", "deviceName": "nvidia.com/GRID_A10-4Q"}],
            "hostDevices": [{"name": "fpga", "deviceName": "intel.com/n3000"},
                            {"name": "mdev1", "deviceName": "intel.com/gvt"}],
            "interfaces": [{"name": "vf", "sriov": {}, "bootOrder": 3},
                           {"name": "vf2", "sriov": {}}],
            "autoattachPodInterface": false
        }),
        json!([{"name": "vf", "multus": {"networkName": "sriov-net"}},
               {"name": "vf2", "multus": {"networkName": "sriov-net2"}}]),
    );
    let c = ctx(&[
        ("ua-gpu-gpu1", pci("0000:AF:00.0")),
        ("ua-gpu-vgpu1", mdev("4B20D080-1b54-4048-85b3-a6a62d165c01")),
        ("ua-hostdevice-fpga", pci("0001:b1:1f.7")),
        (
            "ua-hostdevice-mdev1",
            mdev("53764d0e-85a0-42b4-af5c-2046b460b1dc"),
        ),
        ("ua-sriov-vf", pci("0000:3b:02.3")),
        ("ua-sriov-vf2", pci("0000:3b:02.4")),
    ]);
    let pci_dev = |name: &str, source: Value| {
        json!({"Type": "pci", "Managed": "no", "Mode": "subsystem", "Source": source,
               "Alias": alias(name)})
    };
    let mdev_dev = |name: &str, uuid: &str| {
        json!({"Type": "mdev", "Mode": "subsystem", "Model": "vfio-pci",
               "Source": {"Address": {"UUID": uuid}}, "Alias": alias(name)})
    };
    let mut vgpu = mdev_dev("gpu-vgpu1", "4b20d080-1b54-4048-85b3-a6a62d165c01");
    vgpu["Display"] = json!("on");
    vgpu["RamFB"] = json!("on");
    let mut vf = pci_dev("sriov-vf", pci_source("0x0000", "0x3b", "0x02", "0x3"));
    vf["BootOrder"] = json!({"Order": 3});
    assert_eq!(
        host_devices(&v, &c),
        vec![
            pci_dev(
                "hostdevice-fpga",
                pci_source("0x0001", "0xb1", "0x1f", "0x7")
            ),
            // A generic mediated device has no display (KubeVirt's `DefaultDisplayOff`).
            mdev_dev("hostdevice-mdev1", "53764d0e-85a0-42b4-af5c-2046b460b1dc"),
            pci_dev("gpu-gpu1", pci_source("0x0000", "0xaf", "0x00", "0x0")),
            vgpu,
            vf,
            pci_dev("sriov-vf2", pci_source("0x0000", "0x3b", "0x02", "0x4")),
        ]
    );
}

/// The vGPU display as the plan has it: turned off, no `display`/`ramfb`; on without ramfb, only
/// `display`.
#[test]
fn vgpu_display_options_reach_the_hostdev() {
    let c = ctx(&[("ua-gpu-vgpu1", mdev("4b20d080-1b54-4048-85b3-a6a62d165c01"))]);
    for (options, display, ramfb) in [
        (json!({"display": {"enabled": false}}), None, None),
        (
            json!({"display": {"enabled": true, "ramFB": {"enabled": false}}}),
            Some("on"),
            None,
        ),
        (
            json!({"display": {"ramFB": {"enabled": true}}}),
            Some("on"),
            Some("on"),
        ),
    ] {
        let v = vmi(
            json!({"gpus": [{"name": "vgpu1", "deviceName": "nvidia.com/GRID_A10-4Q",
                             "virtualGPUOptions": options}]}),
            json!([]),
        );
        let list = host_devices(&v, &c);
        assert_eq!(list.len(), 1);
        assert_eq!(list[0]["Display"].as_str(), display, "{options}");
        assert_eq!(list[0]["RamFB"].as_str(), ramfb, "{options}");
    }
}

/// A device the pod lacks is still refused: the launcher never starts such a domain, and the
/// exporter names the VMI field and why.
#[test]
fn a_device_the_pod_lacks_is_refused_with_its_field() {
    let v = vmi(
        json!({"gpus": [{"name": "gpu1", "deviceName": "nvidia.com/GA102GL_A10"}],
               "hostDevices": [{"name": "fpga", "deviceName": "intel.com/n3000"}]}),
        json!([]),
    );
    let c = ctx(&[("ua-gpu-gpu1", pci("0000:65:00.0"))]);
    let plan = convert(&v, &c).unwrap();
    let e = export(&v, &c, &plan).unwrap_err();
    assert!(matches!(e, CompatError::ExportHardware { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.starts_with("spec.domain.devices.hostDevices[0]: exporting a host device of resource intel.com/n3000"),
        "{text}"
    );
    assert!(text.contains("no such device is allocated"), "{text}");
}

/// libvirt's own argv for the exported `<hostdev>` elements (`virsh domxml-to-native`, libvirt 9.0
/// with QEMU 7.2's capabilities) is qlauncher's, device for device, and the rest of the argv
/// matches up to the harness's allowlist (the backend named: `support::with_vfio_backend`).
#[test]
fn libvirts_argv_for_the_hostdevs_is_ours() {
    use qlauncher_core::cmdline::render;
    use qlauncher_libvirt_xml::{argv, harness};
    support::ensure_libvirt_tools();
    let qemu = libvirt::installed_qemu().expect("qemu-system-x86_64 --version");
    let f = support::load(
        &support::repo_root().join("tests/fixtures/cmdline/hostdevs.yaml"),
        Some(qemu),
    )
    .unwrap();
    let xml = to_xml(&export(&f.vmi, &f.ctx, &f.plan).unwrap()).unwrap();
    let xml = support::with_vfio_backend(&libvirt::for_libvirt9(&xml));
    let dir = support::TempDir::new("hostdevs");
    let root = libvirt::EmbedRoot::temporary(&dir.0.join("root")).unwrap();
    let theirs = root.domxml_to_native(&xml).unwrap();
    let root_s = root.dir().to_string_lossy().to_string();
    let ours = argv::records(&render::argv(&f.plan), None).unwrap();
    let theirs = argv::records(&theirs, Some(&root_s)).unwrap();
    let report = harness::compare(&ours, &theirs);
    assert!(report.ok(), "{}", report.table());
    // Each VFIO device exactly as libvirt renders it: driver (`vfio-pci-nohotplug` for the vGPU
    // with ramfb), host address or sysfsdev, display, ramfb, bootindex, bus and slot.
    for id in [
        "ua-gpu-gpu1",
        "ua-gpu-vgpu1",
        "ua-hostdevice-fpga",
        "ua-sriov-vf",
    ] {
        let key = format!("device {id}");
        let row = report.rows.iter().find(|r| r.key == key);
        assert!(
            row.is_some_and(|r| r.kind == harness::Kind::Same),
            "{key}:\n{}",
            report.table()
        );
    }
}
