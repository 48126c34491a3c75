//! Smoke test of `scripts/bench` without running it: the report it writes into BENCHMARKS.md is
//! rendered from a stored results file (`tests/fixtures/bench/results.json`, a real run's
//! `target/bench-results.json`), and its `--help` runs. The measuring itself is `scripts/bench`.

use std::path::Path;
use std::process::Command;

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench")
}

#[test]
fn help_runs() {
    let out = Command::new("python3")
        .arg(script())
        .arg("--help")
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("--skip-libvirt"), "{text}");
}

#[test]
fn report_renders_from_stored_results() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out_md = dir.path().join("BENCHMARKS.md");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bench/results.json");
    let out = Command::new("python3")
        .arg(script())
        .arg("--render-from")
        .arg(&fixture)
        .arg("--out")
        .arg(&out_md)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = std::fs::read_to_string(&out_md).expect("report written");
    let headings: Vec<&str> = md.lines().filter(|l| l.starts_with("## ")).collect();
    assert_eq!(
        headings,
        vec![
            "## Machine and versions",
            "## Start latency (same guest, TCG, 128 MiB, kernel boot, no NIC)",
            "## Memory while the guest runs (after `QLG: boot ok`)",
            "## Per operation",
            "## Scaling (qlauncher, small TCG guests, 128 MiB each)",
            "## Where qlauncher is not ahead",
            "## The domain XML used for libvirt",
        ]
    );
    let start_rows = md
        .lines()
        .filter(|l| {
            l.starts_with("| qlauncher (")
                || l.starts_with("| libvirtd ")
                || l.starts_with("| bare ")
        })
        .count();
    assert_eq!(start_rows, 3, "{md}");
}
