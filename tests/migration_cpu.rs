//! The host-model CPU across a migration, against real qemu-system-x86_64 (TCG) without a guest
//! OS: the source's static expansion (`query-cpu-model-expansion`, typed) rendered as the target's
//! `-cpu` (`devices::cpu::adopted_cpu_plan` through the argv renderer) gives a vCPU with the
//! source's CPUID identity (every CPUID feature word, family, model, stepping, vendor, model id,
//! levels, PMU, physical address bits), expands to the same definition again (a migration onwards sends it unchanged), and a
//! property the accelerator cannot provide stops QEMU at start with QEMU's reason. Towards a stock
//! libvirt target, the same expansion named in libvirt's terms (`sync::migration::stock_cpu`)
//! and run as libvirt runs it gives the source's CPUID feature words. The whole
//! migration with a booted guest is in `migration_launchers.rs`.

use qlauncher::cmdline::devices::cpu::{adopted_cpu_plan, RUNNING_CPU_PROPS};
use qlauncher::cmdline::plan::{CpuModel, CpuPlan, CpuProp, DomainPlan};
use qlauncher::qmp::commands::{CpuModelExpansionType, QomGet, QueryCpuModelExpansion};
use qlauncher::qmp::QmpClient;
use qlauncher::sync::migration::outgoing::running_cpu_definition;
use serde_json::Value;
use testkit::qmp::{machine_args, TestVm};

/// The CPUID identity of the first vCPU, as QOM reports it.
const IDENTITY: [&str; 12] = [
    "feature-words",
    "family",
    "model",
    "stepping",
    "vendor",
    "model-id",
    "level",
    "xlevel",
    "min-level",
    "min-xlevel",
    "pmu",
    "phys-bits",
];

async fn launch(cpu: &str) -> TestVm {
    let mut args = machine_args();
    args.extend(["-cpu".to_owned(), cpu.to_owned()]);
    match TestVm::launch(args).await {
        Ok(vm) => vm,
        Err((e, _dir)) => panic!("-cpu {cpu}: {e}"),
    }
}

async fn identity(client: &QmpClient) -> Vec<(&'static str, Value)> {
    let cpus = client.execute("query-cpus-fast", None).await.unwrap();
    let path = cpus[0]["qom-path"].as_str().unwrap().to_owned();
    let mut out = Vec::new();
    for property in IDENTITY {
        let q = QomGet {
            path: path.clone(),
            property: property.into(),
        };
        out.push((property, client.run(&q).await.unwrap()));
    }
    out
}

/// What the source sends for its running CPU `plan`.
async fn definition(client: &QmpClient, plan: &CpuPlan) -> CpuModel {
    running_cpu_definition(client, plan)
        .await
        .unwrap()
        .expect("a host-model CPU has a definition")
}

/// The `-cpu` value the target renders for `def`.
fn rendered(def: &CpuModel) -> String {
    let plan = DomainPlan {
        cpu: adopted_cpu_plan(def).unwrap(),
        ..Default::default()
    };
    let argv = qlauncher::cmdline::render::argv(&plan);
    let i = argv.iter().position(|w| w == "-cpu").unwrap();
    argv[i + 1].clone()
}

#[tokio::test]
async fn the_expanded_host_model_cpu_has_the_sources_cpuid_identity() {
    // The source: host-model under TCG, with a feature the VMI disables.
    let source_plan = CpuPlan {
        model: "max".into(),
        flags: vec![qlauncher::cmdline::plan::CpuFlag {
            name: "pdpe1gb".into(),
            value: "off".into(),
        }],
        host_model: true,
        adopted: None,
        libvirt: None,
    };
    let source = launch("max,pdpe1gb=off").await;
    let def = definition(source.client(), &source_plan).await;
    assert_eq!(def.name, "base");
    assert_eq!(def.props.get("pdpe1gb"), Some(&CpuProp::Bool(false)));
    assert!(def.props.len() > 100, "{} properties", def.props.len());
    let want = identity(source.client()).await;

    let cpu = rendered(&def);
    assert!(
        cpu.starts_with("base,") && cpu.ends_with(",enforce=on"),
        "{cpu}"
    );
    let target = launch(&cpu).await;
    let got = identity(target.client()).await;
    for ((name, a), (_, b)) in want.iter().zip(&got) {
        assert_eq!(a, b, "{name} differs");
    }
    // Onwards: the adopted CPU is sent on as adopted, and it is what the target's QEMU expands
    // its own CPU to (the running properties aside, which no static expansion lists).
    let adopted = adopted_cpu_plan(&def).unwrap();
    let again = definition(target.client(), &adopted).await;
    assert_eq!(again, def);
    let mut static_part = def.clone();
    for p in RUNNING_CPU_PROPS {
        static_part.props.remove(p);
    }
    let expanded = target
        .client()
        .run(&QueryCpuModelExpansion {
            kind: CpuModelExpansionType::Static,
            model: CpuModel {
                name: "base".into(),
                props: def.props.clone(),
            },
        })
        .await
        .unwrap();
    assert_eq!(expanded.model, static_part, "the target's own expansion");
    // host-passthrough and named models send none (both sides render them from the VMI).
    for model in ["max", "Skylake-Server"] {
        let plan = CpuPlan {
            model: model.into(),
            host_model: false,
            ..Default::default()
        };
        assert_eq!(
            running_cpu_definition(source.client(), &plan)
                .await
                .unwrap(),
            None
        );
    }
}

#[tokio::test]
async fn a_property_the_accelerator_cannot_provide_stops_the_target_at_start() {
    let source = launch("max").await;
    let plan = CpuPlan {
        model: "max".into(),
        host_model: true,
        ..Default::default()
    };
    let mut def = definition(source.client(), &plan).await;
    // A source host with AVX-512 (TCG has none).
    def.props.insert("avx512f".into(), CpuProp::Bool(true));
    let mut args = machine_args();
    args.extend(["-cpu".to_owned(), rendered(&def)]);
    let Err((e, _dir)) = TestVm::launch(args).await else {
        panic!("QEMU started with a CPU TCG cannot provide");
    };
    let text = e.to_string();
    assert!(
        text.contains("doesn't support requested feature") && text.contains("avx512f"),
        "{text}"
    );
}

/// Towards a stock libvirt target: the running host-model CPU (TCG's `max`, a feature the VMI
/// disables) decoded over libvirt's CPU map (Debian's libvirt 9.0, `/usr/share/libvirt/cpu_map`)
/// among QEMU's models, reconciled with QEMU's expansion of the named model, and run as libvirt
/// runs it (`-cpu Model,feature=on|off,...`): the vCPU's CPUID feature words are the source's.
/// A feature that is on and libvirt cannot name refuses, named.
#[tokio::test]
async fn the_running_cpu_named_in_libvirts_terms_has_the_same_feature_words() {
    use qlauncher::labeller::cpu_map::CpuMap;
    use qlauncher::sync::migration::stock_cpu::{expansion_request, from_definition, reconcile};
    let map = CpuMap::load(std::path::Path::new("/usr/share/libvirt/cpu_map"))
        .expect("libvirt's CPU map (scripts/install-deps: libvirt0)");
    let plan = CpuPlan {
        model: "max".into(),
        flags: vec![qlauncher::cmdline::plan::CpuFlag {
            name: "pdpe1gb".into(),
            value: "off".into(),
        }],
        host_model: true,
        ..Default::default()
    };
    let source = launch("max,pdpe1gb=off").await;
    let def = definition(source.client(), &plan).await;
    let defs = source
        .client()
        .run(&qlauncher::qmp::commands::QueryCpuDefinitions)
        .await
        .unwrap();
    let models = qlauncher::labeller::probe::qemu_models(defs);
    let mut cpu = from_definition(&map, &def, Some(&models)).unwrap();
    assert!(models.iter().any(|m| m.name == cpu.model), "{}", cpu.model);
    let mut rounds = 0;
    loop {
        let target = source
            .client()
            .run(&QueryCpuModelExpansion {
                kind: CpuModelExpansionType::Static,
                model: expansion_request(&cpu),
            })
            .await
            .unwrap();
        if !reconcile(&map, &mut cpu, &def, &target.model).unwrap() {
            break;
        }
        rounds += 1;
        assert!(rounds < 3, "no fixed point: {cpu:?}");
    }
    // libvirt's -cpu for it (qemuBuildCpuModelArgStr), with `pmu` and `phys-bits`.
    let req = expansion_request(&cpu);
    let mut arg = req.name.clone();
    for (name, value) in &req.props {
        let on = matches!(value, CpuProp::Bool(true));
        arg.push_str(&format!(",{name}={}", if on { "on" } else { "off" }));
    }
    if let Some(pmu) = cpu.pmu {
        arg.push_str(if pmu { ",pmu=on" } else { ",pmu=off" });
    }
    if let Some(bits) = cpu.phys_bits {
        arg.push_str(&format!(",phys-bits={bits}"));
    }
    let target = launch(&arg).await;
    let words = |v: &[(&'static str, Value)]| {
        v.iter()
            .filter(|(n, _)| ["feature-words", "pmu", "phys-bits"].contains(n))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        words(&identity(target.client()).await),
        words(&identity(source.client()).await),
        "-cpu {arg}"
    );

    // A feature libvirt 9.0's map has no name for (a nested VMX capability `host` has under
    // KVM on Intel) refuses; KVM's paravirtual bits are neither sent nor refused.
    let mut nested = def.clone();
    nested.props.insert("vmx-ept".into(), CpuProp::Bool(true));
    let e = from_definition(&map, &nested, Some(&models)).unwrap_err();
    assert!(e.ends_with(": vmx-ept"), "{e}");
    let mut kvm = def.clone();
    kvm.props.insert("kvm-pv-ipi".into(), CpuProp::Bool(true));
    assert_eq!(
        from_definition(&map, &kvm, Some(&models)),
        from_definition(&map, &def, Some(&models))
    );
}
