//! Conversion time per fixture VMI (`tests/fixtures/cmdline/`): `convert` (configurators + PCI
//! pass) plus rendering the argv and the QMP plan. Target: well under 100 µs for a typical VMI.
//! Run: `cargo bench --bench cmdline_convert`.

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use qlauncher::cmdline::context::{IfaceFacts, TapSource};
use qlauncher::cmdline::{convert, render, ConverterContext};
use qlauncher::vmi::Vmi;

fn fixtures() -> Vec<(String, Vmi)> {
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
            let vmi = Vmi::from_json_or_yaml(&std::fs::read_to_string(&p).ok()?).ok()?;
            Some((name, vmi))
        })
        .collect()
}

fn context(vmi: &Vmi) -> ConverterContext {
    let mut ctx = ConverterContext::default();
    let queues = if vmi.spec.domain.devices.network_interface_multi_queue == Some(true) {
        qlauncher::cmdline::devices::vcpus(vmi).unwrap_or(1) as i32
    } else {
        1
    };
    for (i, iface) in vmi
        .spec
        .domain
        .devices
        .interfaces
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let virtio = matches!(iface.model.as_deref(), None | Some("virtio"));
        let n = if virtio { queues } else { 1 };
        let base = 10 + 10 * i as i32;
        ctx.interfaces.insert(
            iface.name.clone(),
            IfaceFacts {
                mac: None,
                mtu: Some(1500),
                tap: TapSource::Fds {
                    fds: (base..base + n).collect(),
                    vhostfds: vec![],
                },
            },
        );
    }
    ctx
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("convert+render");
    for (name, vmi) in fixtures() {
        let ctx = context(&vmi);
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
