//! Smoke test of `scripts/bench` without running it: the report it writes into BENCHMARKS.md is
//! rendered from a stored results file (`tests/fixtures/bench/results.json`, a real run's
//! `target/bench-results.json`), and its `--help` runs. The measuring itself is `scripts/bench`.

fn script() -> String {
    testkit::repo_root()
        .join("scripts/bench")
        .display()
        .to_string()
}

#[test]
fn help_runs() {
    let text = testkit::run(&["python3", &script(), "--help"]);
    assert!(text.contains("--skip-libvirt"), "{text}");
}

#[test]
fn report_renders_from_stored_results() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out_md = dir.path().join("BENCHMARKS.md");
    let fixture = testkit::repo_root().join("tests/fixtures/bench/results.json");
    testkit::run(&[
        "python3",
        &script(),
        "--render-from",
        fixture.to_str().unwrap(),
        "--out",
        out_md.to_str().unwrap(),
    ]);
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
    // The memory of a kernel without UFFD_FEATURE_WP_ASYNC (6.1), with and without the trim's
    // MADV_RANDOM fallback, measured through the trim's switch.
    let kernel61_rss = md
        .lines()
        .filter(|l| l.starts_with("| non-QEMU processes, RSS, as on a 6.1 kernel"))
        .count();
    assert_eq!(kernel61_rss, 2, "{md}");
}
