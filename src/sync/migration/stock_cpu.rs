//! The running host-model CPU in libvirt's terms, for the domain XML a stock libvirt target is
//! sent ([`crate::cmdline::plan::LibvirtCpu`], written by the exporter as
//! `<cpu mode='custom' match='exact' check='full'>`).
//!
//! libvirt's own source sends a running host-model domain's CPU already expanded: at start
//! `qemuProcessUpdateGuestCPU` turned host-model into the named model and features libvirt
//! decoded from QEMU's expansion of the host CPU (`virQEMUCapsInitCPUModelX86`, `x86Decode`,
//! `x86UpdateHostModel`: `mode='custom' match='exact'`, `<model fallback='forbid'>`,
//! `<vendor>`), and after start `virCPUUpdateLive` listed what QEMU turned on or off besides and
//! set `check='full'` (`src/qemu/qemu_process.c`, `src/cpu/cpu_x86.c`, libvirt 9.0 to 11.x).
//! qlauncher runs host-model as `-cpu host,migratable=on` (`max` under TCG), so the source has
//! QEMU's static expansion of it ([`super::outgoing::running_cpu_definition`]: model `base`
//! with every feature as a property) and decodes it here the way libvirt decodes its host CPU
//! ([`from_definition`]: [`crate::labeller::x86::decode`] over libvirt's CPU map, limited to the
//! models the source's QEMU has). The source's QEMU then expands the named model with those
//! features and [`reconcile`] lists every difference libvirt can name as `require`/`disable`,
//! so that the target's QEMU runs the same CPUID feature set; a difference libvirt cannot name
//! refuses the migration with the feature named.
//!
//! Properties that are no CPUID feature bit: `pmu` goes to `<features><pmu>` and `phys-bits` to
//! `<maxphysaddr mode='emulate'>`, so the target's QEMU gets the running values; `vendor`,
//! `family`, `model`, `stepping`, `model-id` and the levels have no element in libvirt's XML
//! (libvirt's own host-model guest runs the named model's): the target's vCPU has the named
//! model's, a difference in the CPUID signature and model name the guest can see (its feature
//! bits are the same). The CPU map is libvirt 9.0's as the image ships it
//! ([`crate::labeller::CPU_MAP_DIRS`]); libvirt 9.0 to 11.10 know all of its models and features.

use crate::cmdline::plan::{CpuModel, CpuProp, LibvirtCpu};
use crate::labeller::cpu_map::CpuMap;
use crate::labeller::x86::{self, libvirt_name, qemu_name, HostProp, Policy, QemuModel};

/// Properties of a definition that are no CPUID feature bit of their own: the CPUID identity
/// (`vendor`, signature, `model-id`, levels) and the running props `pmu`, `phys-bits`.
const IDENTITY_PROPS: &[&str] = &[
    "vendor",
    "family",
    "model",
    "stepping",
    "model-id",
    "level",
    "xlevel",
    "xlevel2",
    "min-level",
    "min-xlevel",
    "min-xlevel2",
    "pmu",
    "phys-bits",
];

/// Plan flags in a definition that other elements of the domain XML carry (the exporter writes
/// them from the VMI): the Hyper-V enlightenments (`<hyperv>`), `kvm=off` (`<kvm><hidden>`), and
/// QEMU's `migratable` option of `host`.
fn elsewhere(name: &str) -> bool {
    name.starts_with("hv-") || name == "kvm" || name == "migratable"
}

/// Whether `name` is one of KVM's paravirtual features (`kvmclock`, `kvm-pv-ipi`,
/// `kvm-pv-tlb-flush`, `kvm-poll-control`, ..., CPUID leaf `0x40000001`; QEMU's `kvm-*` and
/// `kvmclock*` properties). libvirt's CPU map names none of them and libvirt's own host-model
/// drops them (`virCPUx86DataAddFeature` skips bits its map lacks, `src/cpu/cpu_x86.c`), so a
/// stock target's QEMU runs only the ones QEMU turns on for every model under KVM
/// (`kvm_default_props`, `target/i386/kvm/kvm-cpu.c`). They are neither sent nor refused: a
/// guest keeps using one it found at boot, because KVM honours a paravirtual MSR or hypercall
/// whatever the vCPU's CPUID says unless `kvm-pv-enforce-cpuid` is on (`guest_pv_has`,
/// `arch/x86/kvm/cpuid.h`), which neither libvirt nor qlauncher turns on.
fn kvm_paravirt(name: &str) -> bool {
    name.starts_with("kvm-") || name.starts_with("kvmclock")
}

/// Whether `name` is a CPUID feature property sent to libvirt (neither [`IDENTITY_PROPS`],
/// [`elsewhere`] nor [`kvm_paravirt`]).
fn is_feature(name: &str) -> bool {
    !IDENTITY_PROPS.contains(&name) && !elsewhere(name) && !kvm_paravirt(name)
}

/// The feature libvirt refuses to migrate (`qemuMigrationSrcIsAllowed`: a domain with
/// `invtsc` and no fixed TSC frequency, which KubeVirt's host-model VMI has not).
const MIGRATION_BLOCKER: &str = "invtsc";

/// The running CPU `def` ([`super::outgoing::running_cpu_definition`]) in libvirt's terms:
///
/// - a static expansion (model `base`): decoded as libvirt decodes QEMU's expanded host CPU
///   (`virQEMUCapsGetCPUModelX86Data`, `x86Decode`): the CPU map model closest to the features
///   that are on, among `models` (QEMU's `query-cpu-definitions`) when given, with the features
///   it lacks as `require` and the ones it has that are off as `disable`, its vendor;
/// - a CPU adopted from a stock libvirt source (a named model and its features): sent on as it
///   came.
///
/// `pmu` and `phys-bits` are kept ([`LibvirtCpu::pmu`], [`LibvirtCpu::phys_bits`]).
///
/// Errors (the reason the migration is refused): a feature that is on and that libvirt's CPU
/// map has no name for (listed, in QEMU's spelling), `invtsc` on (libvirt refuses to migrate
/// it), an adopted model or feature the map does not know, or no model fits.
pub fn from_definition(
    map: &CpuMap,
    def: &CpuModel,
    models: Option<&[QemuModel]>,
) -> Result<LibvirtCpu, String> {
    let unnamed: Vec<&str> = def
        .props
        .iter()
        .filter(|(n, v)| is_feature(n) && **v == CpuProp::Bool(true))
        .map(|(n, _)| n.as_str())
        .filter(|n| map.feature(libvirt_name(n)).is_none())
        .collect();
    if !unnamed.is_empty() {
        return Err(format!(
            "the running CPU has features libvirt's CPU map has no name for, which the target's \
             QEMU would not give the guest: {}",
            unnamed.join(", ")
        ));
    }
    if def.props.get(MIGRATION_BLOCKER) == Some(&CpuProp::Bool(true)) {
        return Err("the running CPU has invtsc, which libvirt does not migrate".into());
    }
    let pmu = match def.props.get("pmu") {
        Some(CpuProp::Bool(on)) => Some(*on),
        _ => None,
    };
    let phys_bits = match def.props.get("phys-bits") {
        Some(CpuProp::Int(n)) => u32::try_from(*n).ok().filter(|n| *n != 0),
        _ => None,
    };
    if def.name != "base" {
        if map.model(&def.name).is_none() {
            return Err(format!("libvirt's CPU map has no model {}", def.name));
        }
        let features = def
            .props
            .iter()
            .filter(|(n, _)| is_feature(n))
            .filter_map(|(n, v)| match v {
                CpuProp::Bool(on) => Some((libvirt_name(n).to_owned(), *on)),
                _ => None,
            })
            .collect();
        return Ok(LibvirtCpu {
            model: def.name.clone(),
            vendor: None,
            features,
            pmu,
            phys_bits,
        });
    }
    let props: Vec<(&str, HostProp)> = def
        .props
        .iter()
        .filter(|(n, _)| !elsewhere(n) && !kvm_paravirt(n))
        .map(|(n, v)| {
            let p = match v {
                CpuProp::Bool(on) => HostProp::Bool {
                    on: *on,
                    non_migratable: false,
                },
                CpuProp::Int(i) => HostProp::Int(*i),
                CpuProp::Text(t) => HostProp::Text(t.clone()),
            };
            (n.as_str(), p)
        })
        .collect();
    let data = x86::data_from_props(map, props.iter().map(|(n, p)| (*n, p)))
        .map_err(|e| format!("the running CPU: {e}"))?;
    let cpu = x86::decode(map, &data, models, None)
        .map_err(|e| format!("no libvirt CPU model for the running CPU: {e}"))?;
    Ok(LibvirtCpu {
        model: cpu.model,
        vendor: cpu.vendor,
        features: cpu
            .features
            .into_iter()
            .map(|(n, p)| (n, p == Policy::Require))
            .collect(),
        pmu,
        phys_bits,
    })
}

/// The `query-cpu-model-expansion` model for what the target's QEMU will run for `cpu`: its
/// model with its features as boolean properties in QEMU's spelling (libvirt's `-cpu
/// Model,feature=on|off`, `qemuBuildCpuModelArgStr`).
pub fn expansion_request(cpu: &LibvirtCpu) -> CpuModel {
    CpuModel {
        name: cpu.model.clone(),
        props: cpu
            .features
            .iter()
            .map(|(n, on)| (qemu_name(n).to_owned(), CpuProp::Bool(*on)))
            .collect(),
    }
}

/// Makes `cpu` give the feature set of the `running` definition, from `target`, QEMU's static
/// expansion of [`expansion_request`] (on the source's QEMU): every CPUID feature property whose
/// value differs (absent counts as off) is listed as `require` or `disable` when libvirt's map
/// names it. Returns whether `cpu` changed.
///
/// Errors: the features that differ and that libvirt cannot name (QEMU's spelling, with the
/// running value): the target's QEMU would give the guest another CPU.
pub fn reconcile(
    map: &CpuMap,
    cpu: &mut LibvirtCpu,
    running: &CpuModel,
    target: &CpuModel,
) -> Result<bool, String> {
    let on = |m: &CpuModel, n: &str| m.props.get(n) == Some(&CpuProp::Bool(true));
    let mut names: Vec<&str> = running
        .props
        .iter()
        .chain(target.props.iter())
        .filter(|(n, v)| is_feature(n) && matches!(v, CpuProp::Bool(_)))
        .map(|(n, _)| n.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut changed = false;
    let mut unnamed = Vec::new();
    for n in names {
        let want = on(running, n);
        if want == on(target, n) {
            continue;
        }
        let name = libvirt_name(n);
        if map.feature(name).is_none() {
            unnamed.push(format!("{n} ({} here)", if want { "on" } else { "off" }));
            continue;
        }
        match cpu.features.iter_mut().find(|(f, _)| f == name) {
            Some(f) => f.1 = want,
            None => cpu.features.push((name.to_owned(), want)),
        }
        changed = true;
    }
    if !unnamed.is_empty() {
        return Err(format!(
            "the target's QEMU would run {} with other features, which libvirt has no name for: \
             {}",
            cpu.model,
            unnamed.join(", ")
        ));
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labeller::xml;

    /// A map with two vendors, five features and three models (newest last).
    fn map() -> CpuMap {
        let docs = [
            "<cpus><vendor name='Intel' string='GenuineIntel'/>\
             <vendor name='AMD' string='AuthenticAMD'/></cpus>",
            "<cpus>\
               <feature name='fpu'><cpuid eax_in='0x01' edx='0x00000001'/></feature>\
               <feature name='sse'><cpuid eax_in='0x01' edx='0x02000000'/></feature>\
               <feature name='pclmuldq'><cpuid eax_in='0x01' ecx='0x00000002'/></feature>\
               <feature name='lahf_lm'><cpuid eax_in='0x80000001' ecx='0x00000001'/></feature>\
               <feature name='avx'><cpuid eax_in='0x01' ecx='0x10000000'/></feature>\
               <feature name='invtsc' migratable='no'><cpuid eax_in='0x80000007' edx='0x00000100'/></feature>\
             </cpus>",
            "<cpus><model name='qemu64'><decode host='on' guest='on'/>\
               <feature name='fpu'/><feature name='sse'/></model></cpus>",
            "<cpus><model name='Zen'><decode host='on' guest='on'/>\
               <signature family='23' model='1'/><vendor name='AMD'/>\
               <feature name='fpu'/><feature name='sse'/><feature name='avx'/></model></cpus>",
        ];
        let docs: Vec<_> = docs.iter().map(|d| xml::parse(d).unwrap()).collect();
        CpuMap::from_documents(&docs).unwrap()
    }

    fn def(name: &str, props: &[(&str, CpuProp)]) -> CpuModel {
        CpuModel {
            name: name.into(),
            props: props
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    /// A Zen-like source: QEMU's static expansion (model `base`, QEMU's spelling), its running
    /// props and plan flags.
    fn running() -> CpuModel {
        use CpuProp::*;
        def(
            "base",
            &[
                ("vendor", Text("AuthenticAMD".into())),
                ("family", Int(23)),
                ("model", Int(1)),
                ("stepping", Int(2)),
                ("model-id", Text("AMD EPYC".into())),
                ("min-level", Int(13)),
                ("fpu", Bool(true)),
                ("sse", Bool(true)),
                ("pclmulqdq", Bool(true)),
                ("lahf-lm", Bool(true)),
                ("avx", Bool(false)),
                ("invtsc", Bool(false)),
                ("vmx-ept", Bool(false)),
                ("pmu", Bool(true)),
                ("phys-bits", Int(43)),
                ("migratable", Bool(true)),
                ("hv-spinlocks", Text("0x1000".into())),
            ],
        )
    }

    #[test]
    fn a_known_expansion_decodes_to_libvirts_model_and_names() {
        let cpu = from_definition(&map(), &running(), None).unwrap();
        assert_eq!(
            cpu,
            LibvirtCpu {
                model: "Zen".into(),
                vendor: Some("AMD".into()),
                features: vec![
                    ("pclmuldq".into(), true),
                    ("lahf_lm".into(), true),
                    ("avx".into(), false),
                ],
                pmu: Some(true),
                phys_bits: Some(43),
            }
        );
        // The target's QEMU is asked for Zen with them, in QEMU's spelling.
        let req = expansion_request(&cpu);
        assert_eq!(req.name, "Zen");
        assert_eq!(
            req.props.keys().collect::<Vec<_>>(),
            ["avx", "lahf-lm", "pclmulqdq"]
        );
        // QEMU's own model list limits the choice, as libvirt's host-model does.
        let only = [QemuModel {
            name: "qemu64".into(),
            usable: x86::Usable::Yes,
            blockers: vec![],
            deprecated: false,
        }];
        let cpu = from_definition(&map(), &running(), Some(&only)).unwrap();
        assert_eq!(cpu.model, "qemu64");
        assert_eq!(
            cpu.features,
            vec![("pclmuldq".into(), true), ("lahf_lm".into(), true)]
        );
    }

    #[test]
    fn a_feature_libvirt_cannot_name_is_refused_with_its_name() {
        let mut d = running();
        d.props.insert("vmx-ept".into(), CpuProp::Bool(true));
        d.props.insert("kvm-pv-ipi".into(), CpuProp::Bool(true));
        let e = from_definition(&map(), &d, None).unwrap_err();
        assert!(
            e.ends_with("no name for, which the target's QEMU would not give the guest: vmx-ept"),
            "{e}"
        );
        let mut d = running();
        d.props.insert("invtsc".into(), CpuProp::Bool(true));
        let e = from_definition(&map(), &d, None).unwrap_err();
        assert!(e.contains("invtsc"), "{e}");
    }

    #[test]
    fn kvms_paravirtual_features_are_neither_sent_nor_refused() {
        let m = map();
        let plain = from_definition(&m, &running(), None).unwrap();
        let mut d = running();
        for f in [
            "kvm-pv-ipi",
            "kvm-pv-tlb-flush",
            "kvm-poll-control",
            "kvmclock",
        ] {
            d.props.insert(f.into(), CpuProp::Bool(true));
        }
        let mut cpu = from_definition(&m, &d, None).unwrap();
        assert_eq!(cpu, plain);
        // The target's QEMU without them: no difference to list, none to refuse.
        assert_eq!(reconcile(&m, &mut cpu, &d, &running()), Ok(false));
        assert_eq!(cpu, plain);
    }

    #[test]
    fn a_cpu_adopted_from_a_stock_source_goes_back_as_it_came() {
        let adopted = def(
            "Zen",
            &[
                ("pclmulqdq", CpuProp::Bool(true)),
                ("lahf_lm", CpuProp::Bool(false)),
            ],
        );
        let cpu = from_definition(&map(), &adopted, None).unwrap();
        assert_eq!(cpu.model, "Zen");
        assert_eq!(
            cpu.features,
            vec![("lahf_lm".into(), false), ("pclmuldq".into(), true)]
        );
        let e = from_definition(&map(), &def("Nehalem", &[]), None).unwrap_err();
        assert!(e.contains("no model Nehalem"), "{e}");
    }

    #[test]
    fn what_the_target_model_adds_or_lacks_is_listed_or_refused() {
        let m = map();
        let mut cpu = from_definition(&m, &running(), None).unwrap();
        // The target's QEMU turns sse off and avx on for Zen (its definition differs from the
        // map's): both listed, the running values.
        let mut target = running();
        target.props.insert("sse".into(), CpuProp::Bool(false));
        target.props.insert("avx".into(), CpuProp::Bool(true));
        assert_eq!(reconcile(&m, &mut cpu, &running(), &target), Ok(true));
        assert!(cpu.features.contains(&("sse".into(), true)));
        assert!(cpu.features.contains(&("avx".into(), false)));
        assert_eq!(reconcile(&m, &mut cpu, &running(), &running()), Ok(false));
        // A difference libvirt cannot name: refused, named.
        let mut target = running();
        target.props.insert("vmx-ept".into(), CpuProp::Bool(true));
        let e = reconcile(&m, &mut cpu, &running(), &target).unwrap_err();
        assert!(e.ends_with("no name for: vmx-ept (off here)"), "{e}");
    }
}
