//! The second renderer: every converter fixture's exported domain as KubeVirt's `api.DomainSpec`
//! JSON, and KubeVirt's converter test domain compared with ours element by element in that form.

mod support;

use qlauncher_libvirt_xml::api_json::{key_paths, xml_to_api_spec};
use qlauncher_libvirt_xml::{export, to_api_spec, to_xml};

/// What the exporter writes for libvirt that KubeVirt's Go structs have no field for (its decoder
/// drops them the same way): PCI root ports' `<target chassis port>`, `multifunction`, and the
/// addresses of video, sound and vsock devices.
const NO_GO_FIELD: [&str; 7] = [
    "domain/devices/controller/address/@multifunction",
    "domain/devices/controller/target/@chassis",
    "domain/devices/controller/target/@port",
    "domain/devices/video/address",
    "domain/devices/sound/address",
    "domain/devices/vsock/address",
    "domain/devices/filesystem/address",
];

/// What KubeVirt's converter writes but libvirt drops from the live domain XML virt-launcher reads
/// back and reports: `name` on block disk sources (not in libvirt's schema).
const NOT_IN_LIVE_DOMAIN: [&str; 1] = ["Devices.Disks[].Source.Name"];

/// Every fixture renders without an element the Go structs cannot carry, and with what virt-handler
/// reads: one disk entry with target and alias per VMI disk, machine type, vCPUs, ACPI.
#[test]
fn every_fixture_renders_as_api_domain_spec() {
    let fixtures = support::converter_fixtures(None);
    assert!(fixtures.len() >= 50, "only {} fixtures", fixtures.len());
    let mut failures = Vec::new();
    for f in &fixtures {
        let domain = match export(&f.vmi, &f.ctx, &f.plan) {
            Ok(d) => d,
            Err(_) => continue, // host hardware the exporter does not write
        };
        let api = to_api_spec(&domain).unwrap();
        let unexpected: Vec<_> = api
            .dropped
            .iter()
            .filter(|d| !NO_GO_FIELD.contains(&d.as_str()))
            .collect();
        if !unexpected.is_empty() {
            failures.push(format!("{}: dropped {unexpected:?}", f.name));
        }
        // The JSON renderer and the XML renderer agree: XML -> JSON gives the same spec.
        let via_xml = xml_to_api_spec(&to_xml(&domain).unwrap()).unwrap();
        if key_paths(&via_xml.spec) != key_paths(&api.spec) {
            let a = key_paths(&api.spec);
            let b = key_paths(&via_xml.spec);
            failures.push(format!(
                "{}: renderers disagree: only JSON {:?}, only XML {:?}",
                f.name,
                a.difference(&b).collect::<Vec<_>>(),
                b.difference(&a).collect::<Vec<_>>()
            ));
        }
        let spec = &api.spec;
        let disks = spec["Devices"]["Disks"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let vmi_disks: Vec<String> = f
            .vmi
            .spec
            .domain
            .devices
            .disks
            .iter()
            .flatten()
            .map(|d| d.name.clone())
            .collect();
        // Hotplugged volumes join later, so the domain has at most the VMI's disks.
        if disks.is_empty() != vmi_disks.is_empty() || disks.len() > vmi_disks.len() {
            failures.push(format!(
                "{}: {} disks, VMI has {vmi_disks:?}",
                f.name,
                disks.len()
            ));
        }
        for d in &disks {
            if d["Target"]["Device"].as_str().unwrap_or("").is_empty()
                || d["Alias"]["Name"].is_null()
            {
                failures.push(format!("{}: disk without target or alias: {d}", f.name));
            }
        }
        for key in ["Type", "Name", "Memory", "OS", "CPU", "VCPU", "Features"] {
            if spec.get(key).is_none() {
                failures.push(format!("{}: no {key}", f.name));
            }
        }
        if spec["OS"]["Type"]["Machine"]
            .as_str()
            .unwrap_or("")
            .is_empty()
        {
            failures.push(format!("{}: no OS.Type.Machine", f.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// KubeVirt's converter test VMI: every element of KubeVirt's expected domain, in api.Domain JSON
/// form, is in ours.
#[test]
fn kubevirts_converter_domain_elements_are_all_in_ours() {
    let dir = support::own_fixtures();
    let f = support::load(&dir.join("kubevirt-converter-testvmi.yaml"), None).unwrap();
    let ours = to_api_spec(&export(&f.vmi, &f.ctx, &f.plan).unwrap()).unwrap();
    let expected =
        std::fs::read_to_string(dir.join("kubevirt-converter-domain_x86_64.xml")).unwrap();
    let theirs = xml_to_api_spec(&expected).unwrap();
    assert!(theirs.dropped.is_empty(), "{:?}", theirs.dropped);
    assert!(
        ours.dropped
            .iter()
            .all(|d| NO_GO_FIELD.contains(&d.as_str())),
        "{:?}",
        ours.dropped
    );
    let ours_paths = key_paths(&ours.spec);
    let missing: Vec<_> = key_paths(&theirs.spec)
        .into_iter()
        .filter(|p| !ours_paths.contains(p) && !NOT_IN_LIVE_DOMAIN.contains(&p.as_str()))
        .collect();
    assert!(missing.is_empty(), "missing in ours: {missing:#?}");
    // Spot checks of values virt-handler reads.
    let disks = ours.spec["Devices"]["Disks"].as_array().unwrap();
    let myvolume = disks
        .iter()
        .find(|d| d["Alias"]["Name"] == "myvolume")
        .unwrap();
    assert_eq!(myvolume["Target"]["Device"], "vda");
    assert_eq!(myvolume["Alias"]["UserDefined"], true);
    assert_eq!(myvolume["Driver"]["IOThread"], 2);
    assert_eq!(ours.spec["Memory"]["Value"], theirs.spec["Memory"]["Value"]);
    assert_eq!(
        ours.spec["VCPU"]["Placement"],
        theirs.spec["VCPU"]["Placement"]
    );
    assert_eq!(ours.spec["OS"]["Type"]["Machine"], "q35");
    assert!(ours.spec["Features"]["ACPI"].is_object());
    let channel = &ours.spec["Devices"]["Channels"][0];
    assert_eq!(channel["Target"]["Name"], "org.qemu.guest_agent.0");
}
