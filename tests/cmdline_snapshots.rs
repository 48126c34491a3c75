//! insta snapshots of the QEMU argv and the QMP device plan of every fixture VMI in
//! `tests/fixtures/cmdline/` (converted with the launch-path facts of `NAME.facts.json`), or of
//! the error for fixtures that must be rejected. Each snapshot was reviewed by hand against
//! libvirt's rendering of the equivalent domain and KubeVirt's converter rules.

use qlauncher::cmdline::{convert, render};
use serde_json::json;

#[test]
fn every_fixture_matches_its_snapshot() {
    let fixtures = testkit::cmdline::fixtures();
    assert!(fixtures.len() >= 40, "only {} fixtures", fixtures.len());
    for (name, vmi, facts) in fixtures {
        let ctx = facts.context(&vmi);
        let value = match convert(&vmi, &ctx) {
            Ok(plan) => {
                assert!(!facts.rejected, "{name}: expected a rejection");
                let mut v = json!({
                    "qemu": format!("{}.{}", ctx.qemu.major, ctx.qemu.minor),
                    "argv": render::argv(&plan),
                    "qmp": render::qmp_plan(&plan),
                });
                // What the launch-time check would refuse (only fixtures that lack hardware).
                let missing: Vec<String> = plan
                    .missing_hardware()
                    .iter()
                    .map(|m| m.to_string())
                    .collect();
                if !missing.is_empty() {
                    v["missing_hardware"] = json!(missing);
                }
                v
            }
            Err(e) => {
                assert!(facts.rejected, "{name}: unexpected error: {e}");
                json!({ "error": e.to_string(), "path": e.path().to_string() })
            }
        };
        insta::with_settings!({ snapshot_suffix => name.clone(), prepend_module_to_snapshot => false }, {
            insta::assert_json_snapshot!("cmdline", value);
        });
    }
}

#[test]
fn converting_twice_gives_the_same_plan() {
    for (name, vmi, facts) in testkit::cmdline::fixtures() {
        let ctx = facts.context(&vmi);
        assert_eq!(convert(&vmi, &ctx), convert(&vmi, &ctx), "{name}");
    }
}
