//! The hook input ([`hooks::kubevirt_input`]) is Go's `encoding/xml` text of KubeVirt's
//! `api.DomainSpec`, byte for byte: each fixture in `tests/fixtures/hook-input/` is what Go's
//! `xml.MarshalIndent(spec, "", "\t")` (the call in KubeVirt's `pkg/hooks/manager.go`,
//! `onDefineDomainCallback`, v1.9.0) prints for the `api.DomainSpec` read from our export of the
//! same VMI (`tests/fixtures/hook-input/README.md` says how they were made). A hook that `sed`s
//! KubeVirt's text (`<baseBoard></baseBoard>`, `<shareable></shareable>`) must find the same
//! bytes in ours.
//!
//! `QLAUNCHER_HOOK_INPUT_DUMP=<dir>` writes our input of each case to `<dir>/<case>.xml`, the
//! input of the Go program that makes the fixtures.

mod support;

use std::path::PathBuf;

use qlauncher_libvirt_xml::{export, hooks};

/// (case, VMI fixture): `cmdline/` ones from the main crate, `own/` ones from this crate.
/// SMBIOS (`smbios-chassis`, `bios-serial`), disks (`cache-io`, `discard-kinds`, an empty cdrom
/// in `sata-cdroms`), interfaces (`nic-*`), host devices, CPU, firmware, and the devices whose
/// address `api.DomainSpec` cannot carry (`sound-ich9`, `vsock`), virtiofs and SEV-ES.
const CASES: &[(&str, &str)] = &[
    ("basic", "cmdline/basic.yaml"),
    ("smbios-chassis", "cmdline/smbios-chassis.yaml"),
    ("bios-serial", "cmdline/bios-serial.yaml"),
    ("cache-io", "cmdline/cache-io.yaml"),
    ("discard-kinds", "cmdline/discard-kinds.yaml"),
    ("sata-cdroms", "cmdline/sata-cdroms.yaml"),
    ("nic-models", "cmdline/nic-models.yaml"),
    ("nic-multiqueue", "cmdline/nic-multiqueue.yaml"),
    ("hostdevs", "cmdline/hostdevs.yaml"),
    ("cpu-named-features", "cmdline/cpu-named-features.yaml"),
    ("efi-secureboot", "cmdline/efi-secureboot.yaml"),
    ("reboot-paused", "cmdline/reboot-paused.yaml"),
    ("sound-ich9", "cmdline/sound-ich9.yaml"),
    ("vsock", "cmdline/vsock.yaml"),
    ("virtiofs", "cmdline/virtiofs.yaml"),
    ("sev-es", "cmdline/sev-es.yaml"),
    ("kubevirt-converter", "own/kubevirt-converter-testvmi.yaml"),
];

fn vmi_path(spec: &str) -> PathBuf {
    match spec.split_once('/') {
        Some(("cmdline", f)) => support::repo_root().join("tests/fixtures/cmdline").join(f),
        Some(("own", f)) => support::own_fixtures().join(f),
        _ => panic!("bad case path {spec}"),
    }
}

fn input(spec: &str) -> String {
    let f = support::load(&vmi_path(spec), None).expect("fixture converts");
    hooks::kubevirt_input(&export(&f.vmi, &f.ctx, &f.plan).unwrap()).unwrap()
}

#[test]
fn hook_input_is_gos_marshal_indent_byte_for_byte() {
    let dump = std::env::var_os("QLAUNCHER_HOOK_INPUT_DUMP").map(PathBuf::from);
    let mut failures = Vec::new();
    for (case, spec) in CASES {
        let ours = input(spec);
        if let Some(d) = &dump {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join(format!("{case}.xml")), &ours).unwrap();
        }
        let path = support::own_fixtures()
            .join("hook-input")
            .join(format!("{case}.xml"));
        let go = match std::fs::read_to_string(&path) {
            Ok(go) => go,
            Err(e) => {
                failures.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        if ours != go {
            let line = ours
                .lines()
                .zip(go.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| ours.lines().count().min(go.lines().count()));
            failures.push(format!(
                "{case}: first difference at line {}:\n  ours: {:?}\n  go:   {:?}",
                line + 1,
                ours.lines().nth(line).unwrap_or("<end>"),
                go.lines().nth(line).unwrap_or("<end>"),
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// KubeVirt's e2e hook (`tests/testdata/sidecar-hook-configmap.sh`) edits the text with `sed`
/// on `<baseBoard></baseBoard>`; on our input that `sed` is an SMBIOS type 2 edit.
#[test]
fn kubevirts_sed_on_our_input_is_an_smbios_edit() {
    let sent = input("cmdline/basic.yaml");
    assert!(sent.contains("\t\t<baseBoard></baseBoard>\n"), "{sent}");
    let answer = sent.replace(
        "<baseBoard></baseBoard>",
        "<baseBoard><entry name='manufacturer'>Radical Edward</entry></baseBoard>",
    );
    let edits = hooks::diff_answer(&sent, &answer).unwrap();
    assert_eq!(
        edits,
        vec![hooks::HookEdit::Smbios {
            table: 2,
            fields: vec![("manufacturer", "Radical Edward".into())],
        }]
    );
}

/// KubeVirt's own `smbios` example hook (`cmd/sidecars/smbios`, v1.9.0) re-serializes the domain
/// with libvirtxml: one line, its own element order, defaults and empty `<source>`s dropped, the
/// SEV policy as `0x0005`. Its answers to our input (`tests/fixtures/hook-input/smbios-example/`,
/// README there) are exactly its one SMBIOS edit.
#[test]
fn kubevirts_smbios_example_answer_is_its_one_edit() {
    let dir = support::own_fixtures().join("hook-input");
    let mut seen = 0;
    for (case, _) in CASES {
        let answer = dir.join("smbios-example").join(format!("{case}.xml"));
        let Ok(answer) = std::fs::read_to_string(&answer) else {
            continue;
        };
        let sent = std::fs::read_to_string(dir.join(format!("{case}.xml"))).unwrap();
        let edits = hooks::diff_answer(&sent, &answer).unwrap_or_else(|r| panic!("{case}: {r}"));
        assert_eq!(
            edits,
            vec![hooks::HookEdit::Smbios {
                table: 2,
                fields: vec![("manufacturer", "Radical Edward".into())],
            }],
            "{case}"
        );
        seen += 1;
    }
    assert_eq!(seen, 7);
}
