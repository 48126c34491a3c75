//! Conversion time per fixture VMI (`tests/fixtures/cmdline/`): `convert` (configurators + PCI
//! pass) plus rendering the argv and the QMP plan. Target: well under 100 µs for a typical VMI.
//! Run: `cargo bench --bench cmdline_convert`.

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use qlauncher::cmdline::{convert, render, ConverterContext, FactsFile};
use qlauncher::vmi::{DefaultsConfig, Vmi};

/// Every fixture VMI, defaulted as virt-api would, with the context its `NAME.facts.json` gives.
fn fixtures() -> Vec<(String, Vmi, ConverterContext)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cmdline");
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .expect("fixture dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .filter_map(|p| {
            let name = p.file_stem()?.to_string_lossy().to_string();
            let mut vmi = Vmi::from_json_or_yaml(&std::fs::read_to_string(&p).ok()?).ok()?;
            vmi.apply_defaults(&DefaultsConfig::for_manifest(&vmi, &name));
            let facts = match std::fs::read_to_string(p.with_extension("facts.json")) {
                Ok(text) => FactsFile::from_json(&text).ok()?,
                Err(_) => FactsFile::default(),
            };
            let ctx = facts.context(&vmi);
            Some((name, vmi, ctx))
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("convert+render");
    for (name, vmi, ctx) in fixtures() {
        if convert(&vmi, &ctx).is_err() {
            continue;
        }
        group.bench_function(&name, |b| {
            b.iter(|| {
                let plan = convert(&vmi, &ctx).expect("converts");
                let argv = render::argv(&plan);
                let qmp = render::qmp_plan(&plan);
                (argv.len(), qmp.disks.len())
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(200))
        .measurement_time(std::time::Duration::from_millis(500));
    targets = bench
}
criterion_main!(benches);
