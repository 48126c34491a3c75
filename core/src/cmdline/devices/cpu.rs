//! CPU model, features and topology (`converter/compute/cpu.go`, `vcpu/vcpu.go`,
//! `hypervisor_features.go`).
//!
//! * `host-model` and `host-passthrough` become `-cpu host,migratable=on` under KVM (libvirt
//!   expands host-model to a named model from its capability probe; QEMU's `host` with
//!   `migratable=on` is the probe-free equivalent) and `-cpu max` under TCG.
//! * A named model is passed through, with `mpx=off` on amd64 unless the user listed `mpx`.
//! * Features: `require`/`force`/`optional` -> `on`, `disable`/`forbid` -> `off`.
//! * Hyper-V enlightenments become `hv-*` flags, `features.kvm.hidden` `kvm=off`,
//!   `pvspinlock` `kvm-pv-unhalt` (the timers' `kvmclock`/`hv-time` are the clock's, `clock.rs`).
//! * CPU hotplug (`maxSockets`): `-smp <boot vCPUs>,maxcpus=<maxSockets*cores*threads>`.
//! * Migration of a host-model CPU ([`expansion_request`], [`source_definition`],
//!   [`adopted_cpu_plan`]): the source sends the static expansion of the CPU it runs (libvirt's
//!   migration cookie carries the expanded host-model CPU the same way) and the target renders
//!   `-cpu base,<every property>,enforce=on`, so its vCPUs have the source's CPUID identity or
//!   QEMU refuses to start.
//!
//! Reads: `ctx.kvm`, `ctx.allow_emulation`.

use super::super::context::ConverterContext;
use super::super::error::{ConvertError, FieldPath};
use super::super::names::check_token;
use super::super::plan::{Accel, CpuFlag, CpuModel, CpuPlan, CpuProp, DomainPlan, SmpPlan};
use super::{accel, topology};
use crate::vmi::{Cpu, CpuFeature, FeatureHyperv, FeatureState, Features, Vmi};

/// Sets `cpu` and `smp`.
pub struct CpuConfigurator;

fn flag(name: &str, on: bool) -> CpuFlag {
    CpuFlag {
        name: name.into(),
        value: if on { "on" } else { "off" }.into(),
    }
}

fn enabled(s: &Option<FeatureState>) -> Option<bool> {
    s.as_ref().map(|s| s.enabled.unwrap_or(true))
}

impl super::super::convert::Configurator for CpuConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let base = FieldPath::new("spec.domain.cpu");
        let cpu = vmi.spec.domain.cpu.clone().unwrap_or_default();
        let acc = accel(ctx)?;
        let host_model = cpu.model.as_deref().unwrap_or("host-model") == "host-model";
        let mut flags = Vec::new();
        let model = model(&cpu, acc, &base, &mut flags)?;
        let named = model != "host" && model != "max";
        features(&cpu, named, &base, &mut flags)?;
        if let Some(feat) = vmi.spec.domain.features.as_ref() {
            hypervisor_features(feat, acc, &mut flags)?;
        }
        plan.cpu = CpuPlan {
            model,
            flags,
            host_model,
            adopted: None,
            libvirt: None,
        };
        plan.smp = smp(vmi, &cpu, &base)?;
        Ok(())
    }
}

/// The `-cpu` model: `host-model` (the default) and `host-passthrough` become `host` with
/// `migratable=on` under KVM and `max` under TCG; a named model is passed through once it is
/// a plain token.
fn model(
    cpu: &Cpu,
    acc: Accel,
    base: &FieldPath,
    flags: &mut Vec<CpuFlag>,
) -> Result<String, ConvertError> {
    Ok(match (cpu.model.as_deref().unwrap_or("host-model"), acc) {
        ("host-model" | "host-passthrough", Accel::Kvm) => {
            flags.push(flag("migratable", true));
            "host".to_string()
        }
        ("host-model" | "host-passthrough", Accel::Tcg) => "max".to_string(),
        (named, _) => {
            check_token(&base.key("model"), named)?;
            named.to_string()
        }
    })
}

/// `spec.domain.cpu.features`: `require`/`force`/`optional` (the default `require`) turn a
/// feature on, `disable`/`forbid` off; a `named` model also gets `mpx=off` unless `mpx` is
/// listed.
fn features(
    cpu: &Cpu,
    named: bool,
    base: &FieldPath,
    flags: &mut Vec<CpuFlag>,
) -> Result<(), ConvertError> {
    let features: &[CpuFeature] = cpu.features.as_deref().unwrap_or_default();
    for (i, f) in features.iter().enumerate() {
        let p = base.key("features").index(i);
        check_token(&p.key("name"), &f.name)?;
        let on = match f.policy.as_deref().unwrap_or("require") {
            "require" | "force" | "optional" => true,
            "disable" | "forbid" => false,
            other => {
                return Err(ConvertError::unsupported(
                    p.key("policy"),
                    format!("policy {other:?}"),
                ))
            }
        };
        flags.push(flag(&f.name, on));
    }
    if named && !features.iter().any(|f| f.name == "mpx") {
        flags.push(flag("mpx", false));
    }
    Ok(())
}

/// `spec.domain.features` as CPU flags (KubeVirt's `hypervisor_features.go`):
/// `hv-passthrough`, the Hyper-V enlightenments ([`hyperv`]), `kvm=off` for a hidden KVM and
/// `kvm-pv-unhalt` for `pvspinlock`.
fn hypervisor_features(
    feat: &Features,
    acc: Accel,
    flags: &mut Vec<CpuFlag>,
) -> Result<(), ConvertError> {
    if enabled(&feat.hyperv_passthrough) == Some(true) {
        flags.push(flag("hv-passthrough", true));
    }
    if let Some(h) = feat.hyperv.as_ref() {
        hyperv(h, acc, flags)?;
    }
    if feat.kvm.as_ref().and_then(|k| k.hidden) == Some(true) {
        flags.push(flag("kvm", false));
    }
    if let Some(on) = enabled(&feat.pvspinlock) {
        flags.push(flag("kvm-pv-unhalt", on));
    }
    Ok(())
}

/// The Hyper-V enlightenments (`spec.domain.features.hyperv`), KVM only: each enabled one
/// becomes its `hv-*` flag; spinlocks carry their retries (at least 4095, 4096 by default),
/// the vendor id 1 to 12 letters or digits, and synic timers and TLB flush their sub-flags.
fn hyperv(h: &FeatureHyperv, acc: Accel, flags: &mut Vec<CpuFlag>) -> Result<(), ConvertError> {
    let hp = FieldPath::new("spec.domain.features").key("hyperv");
    if acc == Accel::Tcg {
        return Err(ConvertError::unsupported(
            hp,
            "Hyper-V enlightenments without KVM",
        ));
    }
    let simple: [(&Option<FeatureState>, &str); 9] = [
        (&h.relaxed, "hv-relaxed"),
        (&h.vapic, "hv-vapic"),
        (&h.vpindex, "hv-vpindex"),
        (&h.runtime, "hv-runtime"),
        (&h.synic, "hv-synic"),
        (&h.reset, "hv-reset"),
        (&h.frequencies, "hv-frequencies"),
        (&h.reenlightenment, "hv-reenlightenment"),
        (&h.ipi, "hv-ipi"),
    ];
    for (s, name) in simple {
        if enabled(s) == Some(true) {
            flags.push(flag(name, true));
        }
    }
    if let Some(s) = &h.spinlocks {
        if s.enabled.unwrap_or(true) {
            let retries = s.retries.unwrap_or(4096);
            if retries < 4095 {
                return Err(ConvertError::invalid(
                    hp.key("spinlocks").key("spinlocks"),
                    "retries must be at least 4095",
                ));
            }
            flags.push(CpuFlag {
                name: "hv-spinlocks".into(),
                value: format!("0x{retries:x}"),
            });
        }
    }
    if let Some(t) = &h.synictimer {
        if t.enabled.unwrap_or(true) {
            flags.push(flag("hv-stimer", true));
            if enabled(&t.direct) == Some(true) {
                flags.push(flag("hv-stimer-direct", true));
            }
        }
    }
    if let Some(v) = &h.vendorid {
        if v.enabled.unwrap_or(true) {
            let vp = hp.key("vendorid").key("vendorid");
            let id = v.vendorid.as_deref().unwrap_or_default();
            if id.is_empty() || id.len() > 12 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return Err(ConvertError::invalid(
                    vp,
                    "vendor id must be 1 to 12 letters or digits",
                ));
            }
            flags.push(CpuFlag {
                name: "hv-vendor-id".into(),
                value: id.into(),
            });
        }
    }
    if let Some(t) = &h.tlbflush {
        if t.enabled.unwrap_or(true) {
            flags.push(flag("hv-tlbflush", true));
            if enabled(&t.direct) == Some(true) {
                flags.push(flag("hv-tlbflush-direct", true));
            }
            if enabled(&t.extended) == Some(true) {
                flags.push(flag("hv-tlbflush-ext", true));
            }
        }
    }
    if enabled(&h.evmcs) == Some(true) {
        flags.push(flag("hv-evmcs", true));
    }
    Ok(())
}

/// `-smp` (KubeVirt's `vcpu.GetCPUTopology`): the topology's vCPUs; with CPU hotplug
/// (`maxSockets` above `sockets`) QEMU starts with one socket's vCPUs and may grow to
/// `maxSockets` sockets, at most 1024 vCPUs.
fn smp(vmi: &Vmi, cpu: &Cpu, base: &FieldPath) -> Result<SmpPlan, ConvertError> {
    let (sockets, cores, threads) = topology(vmi)?;
    let cpus = sockets * cores * threads;
    let max_sockets = cpu.max_sockets.unwrap_or(0);
    let (smp_sockets, maxcpus, stable) = if max_sockets > sockets {
        let max = max_sockets
            .checked_mul(cores * threads)
            .filter(|m| *m <= 1024)
            .ok_or_else(|| ConvertError::invalid(base.key("maxSockets"), "more than 1024 vCPUs"))?;
        (max_sockets, max, cores * threads)
    } else if max_sockets != 0 && max_sockets < sockets {
        return Err(ConvertError::invalid(
            base.key("maxSockets"),
            "maxSockets is smaller than sockets",
        ));
    } else {
        (sockets, cpus, cpus)
    };
    Ok(SmpPlan {
        cpus,
        stable,
        maxcpus,
        sockets: smp_sockets,
        cores,
        threads,
    })
}

/// `-cpu` properties a migration source's definition may not carry: the target sets `enforce`
/// itself, and `check` would weaken it.
const RESERVED_CPU_PROPS: [&str; 2] = ["enforce", "check"];

/// Properties of a running vCPU that belong to its CPUID identity but that the static expansion
/// does not list: `pmu` (leaf 0xA; `max` and `host` turn it on, `base` leaves it off) and
/// `phys-bits` (leaf 0x80000008; `host` takes the host's with `host-phys-bits`). A migration
/// source reads them from its vCPU (`qom-get`) and adds them to the expansion
/// ([`with_running_props`]).
pub const RUNNING_CPU_PROPS: [&str; 2] = ["pmu", "phys-bits"];

/// `expanded` with the running vCPU's [`RUNNING_CPU_PROPS`] values `running` (name and QOM value)
/// added where the expansion has none; a `phys-bits` of 0 (QEMU's default, not a width) is left
/// out.
pub fn with_running_props(mut expanded: CpuModel, running: Vec<(String, CpuProp)>) -> CpuModel {
    for (name, value) in running {
        if value == CpuProp::Int(0) {
            continue;
        }
        expanded.props.entry(name).or_insert(value);
    }
    expanded
}

/// At most this many properties in an adopted definition (QEMU 10.1's x86 static expansion has
/// about 330).
const MAX_CPU_PROPS: usize = 4096;

/// The `query-cpu-model-expansion` model for the CPU `plan` runs: its model with its on/off flags
/// as boolean properties (QEMU applies them before expanding, as it did at start). Flags with other
/// values (`hv-spinlocks=0x1000`) are left out: their QOM types are not strings, and they are no
/// feature bits the static expansion lists; [`source_definition`] adds them back.
pub fn expansion_request(plan: &CpuPlan) -> CpuModel {
    let props = plan
        .flags
        .iter()
        .filter_map(|f| match f.value.as_str() {
            "on" => Some((f.name.clone(), CpuProp::Bool(true))),
            "off" => Some((f.name.clone(), CpuProp::Bool(false))),
            _ => None,
        })
        .collect();
    CpuModel {
        name: plan.model.clone(),
        props,
    }
}

/// The definition a migration source sends for the CPU `plan` runs, from QEMU's static expansion
/// of [`expansion_request`]: the expansion's model (`base`) and properties, plus the flags of
/// `plan` the expansion does not list (`migratable`, Hyper-V enlightenments), so that the target's
/// `-cpu` sets everything the source's did. An adopted CPU is sent on as adopted.
pub fn source_definition(plan: &CpuPlan, expanded: CpuModel) -> CpuModel {
    if let Some(adopted) = &plan.adopted {
        return adopted.clone();
    }
    let mut def = expanded;
    for f in &plan.flags {
        if def.props.contains_key(&f.name) || RESERVED_CPU_PROPS.contains(&f.name.as_str()) {
            continue;
        }
        let value = match f.value.as_str() {
            "on" => CpuProp::Bool(true),
            "off" => CpuProp::Bool(false),
            v => CpuProp::Text(v.to_owned()),
        };
        def.props.insert(f.name.clone(), value);
    }
    def
}

/// The target's `-cpu` for a migration source's CPU definition `def`: `<name>,<prop>=<value>,...`
/// in property order (booleans `on`/`off`, integers in decimal), then `enforce=on`, so that QEMU
/// refuses to start when its accelerator cannot provide a property instead of running another
/// CPU (QEMU's `enforce`, libvirt's `check='full'` for a migrated host-model CPU).
///
/// The definition comes from another launcher and reaches QEMU's `-cpu` parser, which has no
/// comma escape: a model or property name that is not a plain token, a string value with a comma
/// or a control character, `enforce`/`check` themselves, or more than 4096 properties are refused
/// with the property's path (`migration.cpu.props.<name>`), before QEMU runs.
pub fn adopted_cpu_plan(def: &CpuModel) -> Result<CpuPlan, ConvertError> {
    let base = FieldPath::new("migration.cpu");
    check_token(&base.key("name"), &def.name)?;
    if def.props.len() > MAX_CPU_PROPS {
        return Err(ConvertError::invalid(
            base.key("props"),
            format!("more than {MAX_CPU_PROPS} properties"),
        ));
    }
    let mut flags = Vec::with_capacity(def.props.len() + 1);
    for (name, value) in &def.props {
        let p = base.key("props").key(name);
        check_token(&p, name)?;
        if RESERVED_CPU_PROPS.contains(&name.as_str()) {
            return Err(ConvertError::invalid(
                p,
                "the target sets enforce itself; the definition may not carry it",
            ));
        }
        let value = match value {
            CpuProp::Bool(on) => if *on { "on" } else { "off" }.to_owned(),
            CpuProp::Int(n) => n.to_string(),
            CpuProp::Text(t) => {
                if t.contains(',') || t.chars().any(char::is_control) || t.len() > 256 {
                    return Err(ConvertError::invalid(
                        p,
                        format!(
                            "{t:?} cannot be a -cpu value (a comma, a control character, or \
                             longer than 256 bytes)"
                        ),
                    ));
                }
                t.clone()
            }
        };
        flags.push(CpuFlag {
            name: name.clone(),
            value,
        });
    }
    flags.push(flag("enforce", true));
    Ok(CpuPlan {
        model: def.name.clone(),
        flags,
        host_model: true,
        adopted: Some(def.clone()),
        libvirt: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::convert::Configurator;
    use crate::cmdline::testutil::vmi_with;
    use serde_json::json;

    fn run(domain: serde_json::Value, ctx: &ConverterContext) -> Result<DomainPlan, ConvertError> {
        let mut plan = DomainPlan::default();
        CpuConfigurator.configure(&vmi_with(domain), ctx, &mut plan)?;
        Ok(plan)
    }

    #[test]
    fn host_model_is_host_under_kvm_and_max_under_tcg() {
        let kvm = run(json!({}), &ConverterContext::default()).unwrap();
        assert_eq!(
            kvm.cpu,
            CpuPlan {
                model: "host".into(),
                flags: vec![flag("migratable", true)],
                host_model: true,
                adopted: None,
                libvirt: None,
            }
        );
        let tcg_ctx = ConverterContext {
            kvm: false,
            allow_emulation: true,
            ..Default::default()
        };
        let tcg = run(json!({}), &tcg_ctx).unwrap();
        assert_eq!(tcg.cpu.model, "max");
    }

    #[test]
    fn named_model_gets_mpx_off_and_feature_policies() {
        let plan = run(
            json!({"cpu": {"model": "Skylake-Server", "features": [
                {"name": "vmx"}, {"name": "svm", "policy": "forbid"}]}}),
            &ConverterContext::default(),
        )
        .unwrap();
        assert_eq!(
            plan.cpu.flags,
            vec![flag("vmx", true), flag("svm", false), flag("mpx", false)]
        );
    }

    #[test]
    fn topology_and_hotplug_maxcpus() {
        let plan = run(
            json!({"cpu": {"sockets": 2, "cores": 2, "threads": 1, "maxSockets": 6}}),
            &ConverterContext::default(),
        )
        .unwrap();
        assert_eq!(
            plan.smp,
            SmpPlan {
                cpus: 4,
                stable: 2,
                maxcpus: 12,
                sockets: 6,
                cores: 2,
                threads: 1
            }
        );
        let plan = run(
            json!({"resources": {"limits": {"cpu": "2500m"}}}),
            &ConverterContext::default(),
        )
        .unwrap();
        assert_eq!(plan.smp.cpus, 3, "CPU limit rounded up to sockets");
    }

    #[test]
    fn bad_feature_names_are_rejected_with_path() {
        let e = run(
            json!({"cpu": {"model": "qemu64", "features": [{"name": "vmx,kvm=off"}]}}),
            &ConverterContext::default(),
        )
        .unwrap_err();
        assert_eq!(e.path().as_str(), "spec.domain.cpu.features[0].name");
    }

    fn model(name: &str, props: &[(&str, CpuProp)]) -> CpuModel {
        CpuModel {
            name: name.into(),
            props: props
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    #[test]
    fn host_passthrough_and_named_models_are_not_host_model() {
        let tcg_ctx = ConverterContext {
            kvm: false,
            allow_emulation: true,
            ..Default::default()
        };
        assert!(run(json!({}), &tcg_ctx).unwrap().cpu.host_model);
        for m in ["host-passthrough", "Skylake-Server"] {
            let plan = run(json!({"cpu": {"model": m}}), &ConverterContext::default()).unwrap();
            assert!(!plan.cpu.host_model, "{m}");
        }
    }

    #[test]
    fn the_expansion_request_carries_the_on_off_flags_only() {
        let plan = CpuPlan {
            model: "host".into(),
            flags: vec![
                flag("migratable", true),
                flag("vmx", false),
                CpuFlag {
                    name: "hv-spinlocks".into(),
                    value: "0x1000".into(),
                },
            ],
            host_model: true,
            adopted: None,
            libvirt: None,
        };
        assert_eq!(
            expansion_request(&plan),
            model(
                "host",
                &[
                    ("migratable", CpuProp::Bool(true)),
                    ("vmx", CpuProp::Bool(false))
                ]
            )
        );
        // The source's definition: the expansion, plus what it does not list.
        let expanded = model(
            "base",
            &[("vmx", CpuProp::Bool(false)), ("family", CpuProp::Int(6))],
        );
        let def = source_definition(&plan, expanded);
        assert_eq!(
            def,
            model(
                "base",
                &[
                    ("family", CpuProp::Int(6)),
                    ("hv-spinlocks", CpuProp::Text("0x1000".into())),
                    ("migratable", CpuProp::Bool(true)),
                    ("vmx", CpuProp::Bool(false)),
                ]
            )
        );
        // An adopted CPU goes on as it came.
        let adopted = adopted_cpu_plan(&def).unwrap();
        assert_eq!(source_definition(&adopted, CpuModel::default()), def);
    }

    #[test]
    fn running_props_fill_in_what_the_expansion_lacks() {
        let expanded = model("base", &[("pmu", CpuProp::Bool(false))]);
        let running = vec![
            ("pmu".to_owned(), CpuProp::Bool(true)),
            ("phys-bits".to_owned(), CpuProp::Int(46)),
        ];
        assert_eq!(
            with_running_props(expanded.clone(), running),
            model(
                "base",
                &[
                    ("pmu", CpuProp::Bool(false)),
                    ("phys-bits", CpuProp::Int(46))
                ]
            )
        );
        let unset = vec![("phys-bits".to_owned(), CpuProp::Int(0))];
        assert_eq!(with_running_props(expanded.clone(), unset), expanded);
    }

    #[test]
    fn an_expansion_renders_as_base_with_every_property_and_enforce() {
        // (definition, the -cpu argument)
        let cases: Vec<(CpuModel, &str)> = vec![
            (
                model(
                    "base",
                    &[
                        ("family", CpuProp::Int(15)),
                        ("model", CpuProp::Int(107)),
                        ("stepping", CpuProp::Int(1)),
                        ("vendor", CpuProp::Text("AuthenticAMD".into())),
                        (
                            "model-id",
                            CpuProp::Text("QEMU TCG CPU version 2.5+".into()),
                        ),
                        ("sse4.2", CpuProp::Bool(true)),
                        ("vmx", CpuProp::Bool(false)),
                        ("min-xlevel", CpuProp::Int(2147483658)),
                    ],
                ),
                "base,family=15,min-xlevel=2147483658,model=107,model-id=QEMU TCG CPU version \
                 2.5+,sse4.2=on,stepping=1,vendor=AuthenticAMD,vmx=off,enforce=on",
            ),
            (model("base", &[]), "base,enforce=on"),
        ];
        for (def, want) in cases {
            let mut plan = DomainPlan {
                cpu: adopted_cpu_plan(&def).unwrap(),
                ..Default::default()
            };
            plan.accel = Accel::Tcg;
            let argv = crate::cmdline::render::argv(&plan);
            let i = argv.iter().position(|w| w == "-cpu").unwrap();
            assert_eq!(argv[i + 1], want);
            assert_eq!(plan.cpu.adopted.as_ref(), Some(&def));
            assert!(plan.cpu.host_model);
        }
    }

    #[test]
    fn a_definition_that_would_inject_a_cpu_option_is_refused() {
        // (definition, the path named)
        let cases: Vec<(CpuModel, &str)> = vec![
            (model("base,vmx=on", &[]), "migration.cpu.name"),
            (model("", &[]), "migration.cpu.name"),
            (
                model("base", &[("vmx=on,svm", CpuProp::Bool(true))]),
                "migration.cpu.props.vmx=on,svm",
            ),
            (
                model("base", &[("+vmx", CpuProp::Bool(true))]),
                "migration.cpu.props.+vmx",
            ),
            (
                model(
                    "base",
                    &[("model-id", CpuProp::Text("x,enforce=off".into()))],
                ),
                "migration.cpu.props.model-id",
            ),
            (
                model("base", &[("model-id", CpuProp::Text("a\nb".into()))]),
                "migration.cpu.props.model-id",
            ),
            (
                model("base", &[("enforce", CpuProp::Bool(false))]),
                "migration.cpu.props.enforce",
            ),
            (
                model("base", &[("check", CpuProp::Bool(false))]),
                "migration.cpu.props.check",
            ),
        ];
        for (def, path) in cases {
            let e = adopted_cpu_plan(&def).unwrap_err();
            assert_eq!(e.path().as_str(), path, "{def:?}: {e}");
        }
    }

    #[test]
    fn cpu_models_decode_as_qemu_answers_them() {
        let m: CpuModel = serde_json::from_value(json!({"name": "base", "props": {
            "vmx": false, "family": 6, "vendor": "GenuineIntel"}}))
        .unwrap();
        assert_eq!(m.props["vmx"], CpuProp::Bool(false));
        assert_eq!(m.props["family"], CpuProp::Int(6));
        assert_eq!(m.props["vendor"], CpuProp::Text("GenuineIntel".into()));
        assert_eq!(
            serde_json::to_value(model("max", &[])).unwrap(),
            json!({"name": "max"})
        );
    }
}
