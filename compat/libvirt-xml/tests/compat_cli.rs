//! The `qlauncher-compat` binary as a user runs it: `convert --format libvirt-xml --validate`,
//! `compare` (exit 0, table with the summary line) and `golden` against KubeVirt's XML.

mod support;

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qlauncher-compat"))
}

#[test]
fn convert_prints_a_valid_domain() {
    support::ensure_libvirt_tools();
    let fixture = support::repo_root().join("tests/fixtures/cmdline/basic.yaml");
    let out = bin()
        .args(["convert", "--format", "libvirt-xml", "--validate"])
        .arg(&fixture)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.trim(), "virt-xml-validate: valid");
    assert!(stdout.starts_with(
        "<domain type=\"kvm\" xmlns:qemu=\"http://libvirt.org/schemas/domain/qemu/1.0\">\n  <name>demo_basic</name>\n"
    ));
    assert!(stdout.contains("<alias name=\"ua-containerdisk\"/>"));
    assert!(stdout.contains("<target dev=\"tap0\" managed=\"no\"/>"));
}

#[test]
fn compare_and_golden_exit_zero_on_the_kubevirt_test_vmi() {
    support::ensure_libvirt_tools();
    let dir = support::TempDir::new("cli");
    let fixture = support::own_fixtures().join("kubevirt-converter-testvmi.yaml");
    let out = bin()
        .arg("compare")
        .arg(&fixture)
        .arg("--libvirt-root")
        .arg(dir.0.join("root"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.starts_with("STATUS "), "{stdout}");
    assert!(
        stdout.contains(" same, ") && stdout.contains("; 0 unexpected"),
        "{stdout}"
    );
    let out = bin()
        .arg("golden")
        .arg(&fixture)
        .arg(support::own_fixtures().join("kubevirt-converter-domain_x86_64.xml"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.ends_with("51 differences, 0 unexpected\n"),
        "{stdout}"
    );
}

#[test]
fn compare_fails_on_a_file_that_is_not_a_vmi() {
    let dir = support::TempDir::new("cli-bad");
    let f = dir.0.join("bad.yaml");
    std::fs::write(&f, "kind: ConfigMap\n").unwrap();
    let out = bin().arg("compare").arg(&f).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: cannot read the VMI"));
}
