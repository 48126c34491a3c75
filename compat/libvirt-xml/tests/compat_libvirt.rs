//! The exporter against libvirt itself: every converter fixture VMI exports to a domain XML that
//! passes libvirt's schema (`virt-xml-validate`), libvirt's argv for it (`virsh domxml-to-native`,
//! libvirt 9.0 + the installed QEMU 7.2) matches qlauncher's argv record by record up to the
//! documented allowlist, and the export of KubeVirt's converter test VMI matches KubeVirt's
//! expected XML element by element up to the golden allowlist.

mod support;

use qlauncher_core::cmdline::render;
use qlauncher_libvirt_xml::harness::Kind;
use qlauncher_libvirt_xml::libvirt::{self, EmbedRoot};
use qlauncher_libvirt_xml::{argv, export, golden, harness, to_xml, CompatError};

/// Fixtures libvirt 9.0 cannot turn into an argv on this machine: (fixture, libvirt's error,
/// why). The XML of each still validates (test above).
/// Hugepage domains get a private hugetlbfs, memory hotplug gets `slots=1`
/// (`libvirt::for_libvirt9`), and swtpm comes from `scripts/install-deps`.
const LIBVIRT_CANNOT: &[(&str, &str, &str)] = &[(
    "sev-es",
    "SEV launch security is not supported with this QEMU binary",
    "libvirt asks QEMU for SEV capabilities, which a host without AMD SEV lacks",
)];

#[test]
fn every_fixture_exports_and_validates_against_libvirts_schema() {
    support::ensure_libvirt_tools();
    let fixtures = support::converter_fixtures(None);
    assert!(fixtures.len() >= 50, "only {} fixtures", fixtures.len());
    for f in &fixtures {
        let xml = to_xml(&export(&f.vmi, &f.ctx, &f.plan).unwrap()).unwrap();
        assert!(xml.starts_with("<domain type=\""), "{}: {xml}", f.name);
        if let Err(e) = libvirt::validate(&libvirt::for_libvirt9(&xml)) {
            panic!("{}: {e}\n{xml}", f.name);
        }
    }
}

#[test]
fn every_fixture_matches_libvirts_argv_up_to_the_allowlist() {
    support::ensure_libvirt_tools();
    let qemu = libvirt::installed_qemu().expect("qemu-system-x86_64 --version");
    let dir = support::TempDir::new("embed");
    let root = EmbedRoot::temporary(&dir.0.join("root")).unwrap();
    let root_s = root.dir().to_string_lossy().to_string();
    let mut compared = 0;
    let mut same_rows = 0;
    let mut failures = Vec::new();
    let mut fixtures = support::converter_fixtures(Some(qemu));
    fixtures.extend(support::load(
        &support::own_fixtures().join("kubevirt-converter-testvmi.yaml"),
        Some(qemu),
    ));
    for f in fixtures {
        let xml = to_xml(&export(&f.vmi, &f.ctx, &f.plan).unwrap()).unwrap();
        let xml = support::with_vfio_backend(&libvirt::for_libvirt9(&xml));
        let theirs = match root.domxml_to_native(&xml) {
            Ok(t) => t,
            Err(CompatError::ToolFailed { stderr, .. }) => {
                match LIBVIRT_CANNOT.iter().find(|(n, _, _)| *n == f.name) {
                    Some((_, msg, _)) if stderr.contains(msg) => continue,
                    _ => {
                        failures.push(format!("{}: virsh failed: {stderr}", f.name));
                        continue;
                    }
                }
            }
            Err(e) => panic!("{}: {e}", f.name),
        };
        let ours = argv::records(&render::argv(&f.plan), None).unwrap();
        let theirs = argv::records(&theirs, Some(&root_s)).unwrap();
        let report = harness::compare(&ours, &theirs);
        compared += 1;
        same_rows += report.rows.iter().filter(|r| r.kind == Kind::Same).count();
        if !report.ok() {
            failures.push(format!("{}:\n{}", f.name, report.table()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let skipped = LIBVIRT_CANNOT.len();
    assert!(
        compared + skipped >= 55,
        "only {compared} fixtures compared ({skipped} skipped)"
    );
    // Most records must match exactly, not just be allowlisted.
    assert!(
        same_rows >= compared * 25,
        "{same_rows} same rows over {compared} fixtures"
    );
}

#[test]
fn kubevirts_converter_test_vmi_exports_kubevirts_expected_xml() {
    let dir = support::own_fixtures();
    let f = support::load(&dir.join("kubevirt-converter-testvmi.yaml"), None).unwrap();
    let ours = to_xml(&export(&f.vmi, &f.ctx, &f.plan).unwrap()).unwrap();
    let expected =
        std::fs::read_to_string(dir.join("kubevirt-converter-domain_x86_64.xml")).unwrap();
    let diffs = golden::diff(
        &golden::parse(&ours, "export").unwrap(),
        &golden::parse(&expected, "expected").unwrap(),
    );
    assert!(
        golden::unexpected(&diffs).is_empty(),
        "{}",
        golden::table(&diffs)
    );
    // The comparison really looked at the device elements: these match exactly.
    for path in [
        "domain/devices/disk[ua-myvolume]/driver@iothread",
        "domain/devices/disk[ua-cdrom_tray_open]/target@tray",
        // KubeVirt's discard: `unmap` on ISOs on a disk device, none on a cdrom hostDisk.
        "domain/devices/disk[ua-nocloud]/driver@discard",
        "domain/devices/disk[ua-secret_test]/driver@discard",
        "domain/devices/disk[ua-cdrom_tray_open]/driver@discard",
        "domain/devices/disk[ua-cdrom_tray_unspecified]/driver@discard",
        "domain/devices/memballoon@freePageReporting",
        "domain/features/hyperv/stimer/direct@state",
        "domain/clock/timer[hpet]@present",
    ] {
        assert!(!diffs.iter().any(|d| d.path == path), "{path} differs");
    }
    assert_eq!(diffs.len(), 51, "{}", golden::table(&diffs));
}

/// The exported `<driver discard>` per volume kind is KubeVirt's (`converter.go:157-160` for the
/// device, then the volume conversion; the rule is `drive::discard` in the converter), and
/// libvirt's argv for it matches ours (the fixture is in the argv comparison above).
#[test]
fn discard_follows_kubevirts_rule_per_volume_kind() {
    use qlauncher_libvirt_xml::schema::Device;
    let f = support::load(
        &support::repo_root().join("tests/fixtures/cmdline/discard-kinds.yaml"),
        None,
    )
    .unwrap();
    let domain = export(&f.vmi, &f.ctx, &f.plan).unwrap();
    let got: Vec<(String, Option<String>)> = domain
        .devices
        .items
        .iter()
        .filter_map(|d| match d {
            Device::Disk(d) => Some((d.alias.name.clone(), d.driver.discard.clone())),
            _ => None,
        })
        .collect();
    let unmap = || Some("unmap".to_string());
    assert_eq!(
        got,
        vec![
            ("ua-root".into(), unmap()),      // containerDisk, disk
            ("ua-installer".into(), unmap()), // containerDisk, cdrom
            ("ua-pvccd".into(), unmap()),     // PVC (file), cdrom
            ("ua-hostcd".into(), None),       // hostDisk, cdrom
            ("ua-cloudinit".into(), unmap()), // NoCloud ISO, disk (fully allocated)
            ("ua-thick".into(), None),        // DataVolume marked preallocated
        ]
    );
}

#[test]
fn golden_diff_reports_a_changed_attribute_and_a_missing_element() {
    let a = golden::parse(
        r#"<domain><devices><disk><alias name="ua-a"/><driver cache="none"/></disk></devices></domain>"#,
        "a",
    )
    .unwrap();
    let b = golden::parse(
        r#"<domain><devices><disk><driver cache="writeback"/><alias name="ua-a"/></disk><rng/></devices></domain>"#,
        "b",
    )
    .unwrap();
    let d = golden::diff(&a, &b);
    assert_eq!(
        d,
        vec![
            golden::Difference {
                path: "domain/devices/disk[ua-a]/driver@cache".into(),
                ours: "none".into(),
                expected: "writeback".into(),
            },
            golden::Difference {
                path: "domain/devices/rng".into(),
                ours: "-".into(),
                expected: "present".into(),
            },
        ]
    );
}

#[test]
fn an_unlisted_difference_fails_the_harness() {
    let r = |k: &str, v: &str| argv::Record {
        key: k.into(),
        props: [("x".to_string(), v.to_string())].into(),
    };
    let report = harness::compare(&[r("device ua-a", "1")], &[r("device ua-a", "2")]);
    assert!(!report.ok());
    assert_eq!(report.unexpected().count(), 1);
    let report = harness::compare(&[r("machine", "1")], &[r("object masterKey0", "1")]);
    assert_eq!(
        report
            .rows
            .iter()
            .map(|r| (r.key.as_str(), r.kind, r.allowed.is_some()))
            .collect::<Vec<_>>(),
        vec![
            ("machine", Kind::OnlyOurs, false),
            ("object masterKey0", Kind::OnlyLibvirt, true)
        ]
    );
}

/// A running host-model CPU named for a stock target (`CpuPlan::libvirt`, set by the migration
/// source from QEMU's expansion): the XML is libvirt's own live form of such a CPU, libvirt 9.0's
/// schema takes it, and libvirt's QEMU gets the model, each feature, `pmu` and `phys-bits`.
#[test]
fn a_named_host_model_cpu_exports_as_libvirts_live_cpu() {
    support::ensure_libvirt_tools();
    let qemu = libvirt::installed_qemu().expect("qemu-system-x86_64 --version");
    let mut f = support::converter_fixtures(Some(qemu))
        .into_iter()
        .find(|f| f.name == "emulation-tcg")
        .expect("the emulation-tcg fixture");
    assert!(f.plan.cpu.host_model);
    f.plan.cpu.libvirt = Some(qlauncher_core::cmdline::plan::LibvirtCpu {
        model: "EPYC".into(),
        vendor: Some("AMD".into()),
        features: vec![
            ("pclmuldq".into(), true),
            ("lahf_lm".into(), true),
            ("xsavec".into(), false),
        ],
        pmu: Some(true),
        phys_bits: Some(40),
    });
    let xml = to_xml(&export(&f.vmi, &f.ctx, &f.plan).unwrap()).unwrap();
    for want in [
        r#"<cpu mode="custom" match="exact" check="full">"#,
        r#"<model fallback="forbid">EPYC</model>"#,
        "<vendor>AMD</vendor>",
        r#"<feature name="pclmuldq" policy="require"/>"#,
        r#"<feature name="lahf_lm" policy="require"/>"#,
        r#"<feature name="xsavec" policy="disable"/>"#,
        r#"<maxphysaddr mode="emulate" bits="40"/>"#,
        r#"<pmu state="on"/>"#,
    ] {
        assert!(xml.contains(want), "{want} not in\n{xml}");
    }
    libvirt::validate(&libvirt::for_libvirt9(&xml)).unwrap_or_else(|e| panic!("{e}\n{xml}"));
    let dir = support::TempDir::new("embed-cpu");
    let root = EmbedRoot::temporary(&dir.0.join("root")).unwrap();
    let argv = root
        .domxml_to_native(&libvirt::for_libvirt9(&xml))
        .unwrap_or_else(|e| panic!("{e}\n{xml}"));
    let i = argv.iter().position(|w| w == "-cpu").expect("-cpu");
    let cpu = &argv[i + 1];
    assert!(cpu.starts_with("EPYC,"), "{cpu}");
    for want in [
        "pclmulqdq=on",
        "lahf-lm=on",
        "xsavec=off",
        "pmu=on",
        "phys-bits=40",
    ] {
        assert!(
            cpu.split(',').any(|w| w == want),
            "{want} not in -cpu {cpu}"
        );
    }
    // Without it, host-model as before.
    f.plan.cpu.libvirt = None;
    let xml = to_xml(&export(&f.vmi, &f.ctx, &f.plan).unwrap()).unwrap();
    assert!(xml.contains(r#"<cpu mode="host-model">"#), "{xml}");
}
