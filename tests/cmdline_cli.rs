//! The `qlauncher convert` and `qlauncher hook-diff` subcommands: formats and errors, run as a user
//! would.

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

/// A VMI whose name Kubernetes accepts (dots, 253 characters) with serials of the longest
/// lengths each bus takes (KubeVirt's 256 on virtio, sata; QEMU's 36 on scsi, 20 on usb):
/// `validate` and `convert` agree (one rule), and QEMU gets the serials whole; a serial over 256,
/// or over the bus's limit, is refused by both at the same field.
#[test]
fn kubernetes_names_and_serials_on_every_bus_pass_validate_and_convert_alike() {
    let name = format!("{}.{}", "w".repeat(126), "p".repeat(126));
    let dir = std::env::temp_dir().join(format!("qlauncher-cli-names-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let serial = |bus: &str, len: usize| format!("{bus}-{}", "s".repeat(len - bus.len() - 1));
    let write = |tag: &str, serials: [String; 4]| {
        let disks: Vec<serde_json::Value> = ["virtio", "sata", "scsi", "usb"]
            .iter()
            .zip(&serials)
            .enumerate()
            .map(|(i, (bus, serial))| {
                serde_json::json!({"name": format!("d{i}"), "disk": {"bus": bus}, "serial": serial})
            })
            .collect();
        let volumes: Vec<serde_json::Value> = (0..4)
            .map(|i| serde_json::json!({"name": format!("d{i}"), "containerDisk": {"image": "x"}}))
            .collect();
        let vmi = serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "ns", "uid": "0d6a3c1e-7f1b-4a5e-9c55-5b7d2a6c9e01"},
            "spec": {"domain": {"devices": {"disks": disks}, "memory": {"guest": "128Mi"}},
                     "volumes": volumes}
        });
        let path = dir.join(format!("vmi-{tag}.json"));
        std::fs::write(&path, vmi.to_string()).unwrap();
        path
    };
    let longest = [
        "V".repeat(256),
        serial("sata", 256),
        serial("scsi", 36),
        serial("usb", 20),
    ];
    let good = write("good", longest.clone());
    let good = good.to_str().unwrap();
    let (ok, _, err) = qlauncher(&["validate", good]);
    assert!(ok, "{err}");
    let (ok, out, err) = qlauncher(&["convert", good]);
    assert!(ok, "{err}");
    for s in &longest {
        assert!(out.contains(&format!("\"serial\":\"{s}\"")), "{s}");
    }
    assert!(out.contains(&format!("guest=ns_{name},")));

    let mut over_256 = longest.clone();
    over_256[0] = "V".repeat(257);
    let mut over_scsi = longest.clone();
    over_scsi[2] = serial("scsi", 37);
    let mut over_usb = longest.clone();
    over_usb[3] = serial("usb", 21);
    for (tag, serials, want) in [
        (
            "256",
            over_256,
            "spec.domain.devices.disks[0].serial: must be at most 256 characters long",
        ),
        (
            "scsi",
            over_scsi,
            "spec.domain.devices.disks[2].serial: is 37 characters long; a disk on bus scsi takes at most 36 (QEMU's scsi-hd and scsi-cd)",
        ),
        (
            "usb",
            over_usb,
            "spec.domain.devices.disks[3].serial: is 21 characters long; a disk on bus usb takes at most 20 (QEMU's usb-storage)",
        ),
    ] {
        let bad = write(tag, serials);
        let bad = bad.to_str().unwrap();
        for cmd in ["validate", "convert"] {
            let (ok, _, err) = qlauncher(&[cmd, bad]);
            assert!(!ok, "{cmd} accepted the {tag} case");
            assert!(err.contains(want), "{cmd}: {err}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A user checks a hook script without a cluster: `convert --format hook-xml` gives what the hook
/// gets (Go's text, so KubeVirt's e2e `sed` on `<baseBoard></baseBoard>` matches), `hook-diff`
/// what the launcher makes of the answer.
#[test]
fn hook_xml_and_hook_diff_check_a_hook_without_a_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, before, err) = qlauncher(&["convert", &fixture("basic"), "--format", "hook-xml"]);
    assert!(ok, "{err}");
    assert!(
        before.starts_with("<domain type=\"kvm\" xmlns:qemu="),
        "{before}"
    );
    assert!(
        before.contains("\n\t\t<baseBoard></baseBoard>\n"),
        "{before}"
    );
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    };
    let b = write("before.xml", &before);
    let sed = before.replace(
        "<baseBoard></baseBoard>",
        "<baseBoard><entry name=\"manufacturer\">Radical Edward</entry></baseBoard>",
    );
    let (ok, out, err) = qlauncher(&["hook-diff", &b, &write("after.xml", &sed)]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "smbios type 2 [(\"manufacturer\", \"Radical Edward\")]\n"
    );
    let (ok, out, _) = qlauncher(&["hook-diff", &b, &b]);
    assert!(ok);
    assert_eq!(out, "no change\n");
    // A clock and Hyper-V hook: the tier-2 clock and feature edits, one a line.
    let clocked = before.replacen(
        "\t<features>",
        "\t<clock offset=\"utc\" adjustment=\"3600\"><timer name=\"hpet\" present=\"no\"/></clock>\n\
         \t<features><hyperv><spinlocks state=\"on\" retries=\"8191\"/>\
         <vendor_id state=\"on\" value=\"MyVendor\"/></hyperv>",
        1,
    );
    let (ok, out, err) = qlauncher(&["hook-diff", &b, &write("clock.xml", &clocked)]);
    assert!(ok, "{out}{err}");
    assert_eq!(
        out,
        "hyperv hv-spinlocks retries=8191\nhyperv hv-vendor-id \"MyVendor\"\n\
         clock offset utc adjustment=3600\nclock timer hpet present=no tickpolicy=- track=-\n"
    );
    let (ok, out, _) = qlauncher(&[
        "hook-diff",
        &b,
        &write("vendor.xml", &clocked.replace("MyVendor", "My,Vendor")),
    ]);
    assert!(!ok);
    assert!(
        out.starts_with("refused: domain/features/hyperv/vendor_id@value: "),
        "{out}"
    );
    let renamed = before.replace("<name>demo_basic</name>", "<name>x</name>");
    let (ok, out, _) = qlauncher(&["hook-diff", &b, &write("bad.xml", &renamed)]);
    assert!(!ok);
    assert!(out.starts_with("refused: domain/name#text: "), "{out}");
    assert!(
        out.contains("\"demo_basic\"") && out.contains("\"x\""),
        "{out}"
    );
    let huge = write("huge.xml", &" ".repeat(5 << 20));
    let (ok, out, _) = qlauncher(&["hook-diff", &b, &huge]);
    assert!(!ok);
    assert!(out.contains("more than"), "{out}");
}
