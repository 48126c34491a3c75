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

#[test]
fn a_later_migration_run_replaces_the_section_and_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let results = dir.path().join("results.json");
    std::fs::copy(
        testkit::repo_root().join("tests/fixtures/bench/results.json"),
        &results,
    )
    .expect("copy the fixture");
    let section = dir.path().join("migration.md");
    std::fs::write(
        &section,
        "## Live migration (512 MiB guest, TCG, idle after boot, unix sockets, this machine)\n\n\
         Medians of 15 interleaved runs (min–max); `scripts/bench-migration`.\n",
    )
    .unwrap();
    let out_md = dir.path().join("BENCHMARKS.md");
    testkit::run(&[
        "python3",
        &script(),
        "--render-from",
        results.to_str().unwrap(),
        "--migration-result",
        section.to_str().unwrap(),
        "--out",
        out_md.to_str().unwrap(),
    ]);
    let md = std::fs::read_to_string(&out_md).expect("report written");
    assert!(md.contains("Medians of 15 interleaved runs"), "{md}");
    assert!(
        md.contains("This section is from a separate `scripts/bench-migration` run"),
        "{md}"
    );
}

/// `scripts/bench-migration`'s rank test of the downtimes: a clear shift is a difference, the
/// same samples are none, and issue 32's 15-run pre-copy figures give p = 0.38.
#[test]
fn the_migration_downtime_rank_test_separates_shift_from_spread() {
    let bench = testkit::repo_root().join("scripts/bench-migration");
    let code = format!(
        "from importlib.machinery import SourceFileLoader\n\
         m = SourceFileLoader('bm', {:?}).load_module()\n\
         print(round(m.mann_whitney(list(range(1, 9)), list(range(9, 17))), 4))\n\
         print(m.mann_whitney([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8]))\n\
         print(round(m.mann_whitney([121, 62, 80, 266, 16, 70, 91, 58, 117, 62, 73, 125, 28, 70, 63], \
         [41, 100, 95, 87, 59, 144, 89, 95, 120, 29, 81, 36, 116, 94, 159]), 2))\n\
         print(m.mann_whitney([1], [2, 3]))\n",
        bench.display().to_string()
    );
    let out = testkit::run(&["python3", "-B", "-c", &code]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, vec!["0.0009", "1.0", "0.38", "None"], "{out}");
}
