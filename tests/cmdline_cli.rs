//! The `qlauncher convert` subcommand: formats and errors, run as a user would.

use std::process::Command;

fn qlauncher(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_qlauncher"))
        .args(args)
        .output()
        .expect("run qlauncher");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn fixture(name: &str) -> String {
    format!(
        "{}/tests/fixtures/cmdline/{name}.yaml",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn argv_format_prints_one_word_per_line_for_the_chosen_qemu() {
    let (ok, out, err) = qlauncher(&["convert", &fixture("acpi-off"), "--qemu-version", "7.2"]);
    assert!(ok, "{err}");
    let words: Vec<&str> = out.lines().collect();
    assert_eq!(
        &words[..3],
        &["-name", "guest=ns1_acpi-off,debug-threads=on", "-S"]
    );
    assert!(words.contains(&"-no-acpi") && words.contains(&"-no-hpet"));
    assert!(words.contains(&"-nodefaults") && words.contains(&"-no-user-config"));

    let (ok, out, _) = qlauncher(&["convert", &fixture("acpi-off"), "--qemu-version", "10.1"]);
    assert!(ok);
    assert!(!out.lines().any(|l| l == "-no-acpi"));
    assert!(out
        .lines()
        .any(|l| l.starts_with("q35,") && l.ends_with(",hpet=off,acpi=off")));
}

#[test]
fn shell_format_quotes_json_words() {
    let (ok, out, err) = qlauncher(&["convert", &fixture("basic"), "--format", "shell"]);
    assert!(ok, "{err}");
    assert!(out
        .starts_with("qemu-system-x86_64 \\\n-name guest=demo_basic,debug-threads=on \\\n-S \\\n"));
    assert!(out.contains("-device '{\"driver\":\"virtio-rng-pci-non-transitional\""));
}

#[test]
fn plan_json_format_is_the_qmp_plan() {
    let (ok, out, err) = qlauncher(&[
        "convert",
        &fixture("hotplug-volumes"),
        "--format",
        "plan-json",
    ]);
    assert!(ok, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let ids: Vec<&str> = plan["disks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["ua-hp-ready", "ua-hp-virtio"]);
    assert_eq!(plan["disks"][0]["target"], "sdc");
}

#[test]
fn rejected_vmis_exit_non_zero_with_the_field_path() {
    let (ok, out, err) = qlauncher(&["convert", &fixture("reject-sriov")]);
    assert!(!ok);
    assert!(out.is_empty());
    assert_eq!(
        err.trim_end(),
        "error: cannot convert the VMI\n  caused by: spec.domain.devices.interfaces[0].pciAddress: a fixed PCI address is not supported"
    );
}

fn compat_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("compat/libvirt-xml/tests/fixtures")
        .join(name)
}

#[test]
fn libvirt_xml_format_prints_the_compat_export() {
    let file = fixture("acpi-off");
    let (ok, out, err) = qlauncher(&["convert", &file, "--format", "libvirt-xml"]);
    assert!(ok, "{err}");
    let common = qlauncher_libvirt_xml::cli::Common {
        file: file.into(),
        qemu_version: None,
        tcg: false,
    };
    let (vmi, ctx, plan) = qlauncher_libvirt_xml::cli::load(&common, false).unwrap();
    let expected =
        qlauncher_libvirt_xml::to_xml(&qlauncher_libvirt_xml::export(&vmi, &ctx, &plan).unwrap())
            .unwrap();
    assert_eq!(out, expected);
    assert!(out.contains("<name>ns1_acpi-off</name>"), "{out}");

    let (ok, _, err) = qlauncher(&["convert", &fixture("acpi-off"), "--validate"]);
    assert!(!ok);
    assert!(
        err.contains("--validate applies to --format libvirt-xml only"),
        "{err}"
    );
}

#[test]
fn compare_and_golden_subcommands_pass_on_the_kubevirt_test_vmi() {
    let root = std::env::temp_dir().join(format!("qlauncher-cli-compare-{}", std::process::id()));
    let file = compat_fixture("kubevirt-converter-testvmi.yaml");
    let file = file.to_str().unwrap();
    let (ok, out, err) = qlauncher(&["compare", file, "--libvirt-root", root.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&root);
    assert!(ok, "{out}{err}");
    assert!(out.starts_with("STATUS "), "{out}");
    assert!(out.contains("; 0 unexpected"), "{out}");

    let expected = compat_fixture("kubevirt-converter-domain_x86_64.xml");
    let (ok, out, err) = qlauncher(&["golden", file, expected.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(out.ends_with(" differences, 0 unexpected\n"), "{out}");
}
