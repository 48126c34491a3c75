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
