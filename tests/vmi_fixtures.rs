//! Every fixture VMI and every example parses, defaults, validates, is stable under a second
//! round of defaults, and round-trips through JSON unchanged.

use std::path::{Path, PathBuf};

use qlauncher::vmi::{DefaultsConfig, Vmi};

fn manifests(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            )
        })
        .collect();
    files.sort();
    files
}

fn check(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut vmi =
        Vmi::from_json_or_yaml(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let cfg = DefaultsConfig::for_vmi(&vmi);
    vmi.apply_defaults(&cfg);
    if let Err(errors) = vmi.validate() {
        let lines: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        panic!("{} is invalid:\n{}", path.display(), lines.join("\n"));
    }
    let mut again = vmi.clone();
    again.apply_defaults(&cfg);
    assert_eq!(
        again,
        vmi,
        "{}: defaults are not idempotent",
        path.display()
    );
    let json = serde_json::to_string(&vmi).unwrap();
    let back = Vmi::from_json_or_yaml(&json).unwrap();
    assert_eq!(
        back,
        vmi,
        "{}: JSON round trip changed the VMI",
        path.display()
    );
}

#[test]
fn every_fixture_parses_defaults_and_validates() {
    let files = manifests("tests/fixtures/vmi");
    assert!(files.len() >= 18, "fixtures missing: {files:?}");
    for f in &files {
        check(f);
    }
}

#[test]
fn every_example_parses_defaults_and_validates() {
    let files = manifests("examples");
    let names: Vec<_> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
        .collect();
    for want in [
        "bridge.yaml",
        "demo.yaml",
        "empty-disk.yaml",
        "kernel-boot.yaml",
    ] {
        assert!(names.iter().any(|n| n == want), "examples/{want} missing");
    }
    for f in &files {
        check(f);
    }
}
