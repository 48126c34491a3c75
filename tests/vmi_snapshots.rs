//! Whole defaulted VMIs for fixtures with a deterministic firmware UUID (explicit, or derived
//! from the VM name), checked against committed snapshots (`tests/snapshots/`).

use qlauncher::vmi::{DefaultsConfig, Vmi};

fn defaulted(text: &str) -> Vmi {
    let mut vmi = Vmi::from_json_or_yaml(text).unwrap();
    vmi.apply_defaults(&DefaultsConfig::for_vmi(&vmi));
    vmi
}

#[test]
fn many_fields_defaulted() {
    insta::assert_json_snapshot!(defaulted(include_str!("fixtures/vmi/many-fields.yaml")));
}

#[test]
fn vm_containerdisk_cloudinit_defaulted() {
    insta::assert_json_snapshot!(defaulted(include_str!(
        "fixtures/vmi/vm-containerdisk-cloudinit.yaml"
    )));
}
