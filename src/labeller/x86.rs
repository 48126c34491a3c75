//! libvirt's x86 CPU decoding, baseline and feature expansion over a [`CpuMap`], as
//! `src/cpu/cpu_x86.c` (libvirt 9.0 to 11.x: `x86Decode`, `x86DataToCPU`,
//! `x86DecodeUseCandidate`, `virCPUx86CompareCandidateFeatureList`, `virCPUx86Baseline`,
//! `virCPUx86ExpandFeatures`) and `src/qemu/qemu_capabilities.c`
//! (`virQEMUCapsGetCPUModelX86Data`) compute them. The node labeller's host-model
//! (`virsh domcapabilities`) is [`decode`] of QEMU's expanded host CPU, and its supported features
//! (`virsh hypervisor-cpu-baseline --features`) are [`expand_features`] of [`baseline`] of that
//! host-model. Every rule here is libvirt's, including its tie-breaks, so that a labeller node and a
//! libvirt node label the same CPU with the same names.

use super::cpu_map::{vendor_data, CpuData, CpuMap, Model};

/// How a CPU definition treats a feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The CPU must have it (`policy='require'`).
    Require,
    /// The CPU must not have it (`policy='disable'`).
    Disable,
}

impl Policy {
    /// libvirt's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Require => "require",
            Policy::Disable => "disable",
        }
    }
}

/// A guest CPU definition: a model, its vendor and the features added to or removed from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuDef {
    /// The `cpu_map` model (`EPYC`).
    pub model: String,
    /// The `cpu_map` vendor (`AMD`), when known.
    pub vendor: Option<String>,
    /// Features in the order libvirt lists them.
    pub features: Vec<(String, Policy)>,
}

/// Whether QEMU can run a CPU model with the current accelerator (`query-cpu-definitions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usable {
    /// `unavailable-features` is empty.
    Yes,
    /// Some features are missing (the blockers).
    No,
    /// QEMU did not say.
    Unknown,
}

impl Usable {
    /// libvirt's word for it (`usable='..'`).
    pub fn as_str(self) -> &'static str {
        match self {
            Usable::Yes => "yes",
            Usable::No => "no",
            Usable::Unknown => "unknown",
        }
    }
}

/// A CPU model as QEMU reports it for one accelerator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuModel {
    /// QEMU's model name.
    pub name: String,
    /// Whether it runs here.
    pub usable: Usable,
    /// The features that keep it from running, in libvirt's spelling.
    pub blockers: Vec<String>,
    /// Deprecated by QEMU.
    pub deprecated: bool,
}

/// A property of QEMU's static CPU model expansion, after the two expansions are merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostProp {
    /// A feature: on or off, and whether it is on only when migratability is not required.
    Bool {
        /// On.
        on: bool,
        /// On only in the `migratable: false` expansion (`invtsc`).
        non_migratable: bool,
    },
    /// An integer (`family`, `model`, `stepping`).
    Int(i64),
    /// A string (`vendor`).
    Text(String),
}

/// Why a decode, baseline or expansion failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum X86Error {
    /// No `cpu_map` model is allowed by QEMU, matches the vendor and may be decoded to.
    #[error("no CPU model fits the CPU data")]
    NoModel,
    /// A definition names a model the map does not have.
    #[error("unknown CPU model {0}")]
    UnknownModel(String),
    /// A definition names a feature the map does not have.
    #[error("unknown CPU feature {0}")]
    UnknownFeature(String),
    /// A definition names a vendor the map does not have.
    #[error("unknown CPU vendor {0}")]
    UnknownVendor(String),
    /// QEMU's `vendor` property is not a 12-byte CPUID vendor string.
    #[error("invalid CPU vendor string {0:?}")]
    VendorString(String),
    /// The same feature would be listed twice.
    #[error("CPU feature {0} specified more than once")]
    Duplicate(String),
    /// Nothing is left after intersecting with QEMU's features.
    #[error("CPUs are incompatible")]
    Incompatible,
}

/// QEMU's spelling → libvirt's, for the x86 features whose names differ
/// (`virQEMUCapsCPUFeaturesX86`, libvirt 9.0; the `vmx-` and `hv-` ones are libvirt 11's).
const QEMU_TO_LIBVIRT: &[(&str, &str)] = &[
    ("cmp-legacy", "cmp_legacy"),
    ("ds-cpl", "ds_cpl"),
    ("fxsr-opt", "fxsr_opt"),
    ("kvm-pv-eoi", "kvm_pv_eoi"),
    ("kvm-pv-unhalt", "kvm_pv_unhalt"),
    ("lahf-lm", "lahf_lm"),
    ("nodeid-msr", "nodeid_msr"),
    ("pclmulqdq", "pclmuldq"),
    ("perfctr-core", "perfctr_core"),
    ("perfctr-nb", "perfctr_nb"),
    ("tsc-adjust", "tsc_adjust"),
    (
        "vmx-invept-single-context-noglobals",
        "vmx-invvpid-single-context-noglobals",
    ),
    ("hv-vendor-id", "hv-vendor_id"),
    ("hv-emsr-bitmap", "hv-emsr_bitmap"),
    ("hv-xmm-input", "hv-xmm_input"),
];

/// libvirt's name of QEMU's property `name` (`virQEMUCapsCPUFeatureFromQEMU`).
pub fn libvirt_name(name: &str) -> &str {
    QEMU_TO_LIBVIRT
        .iter()
        .find(|(q, _)| *q == name)
        .map_or(name, |(_, l)| l)
}

/// QEMU's name of libvirt's feature `name` (`virQEMUCapsCPUFeatureToQEMU`): the inverse of
/// [`libvirt_name`].
pub fn qemu_name(name: &str) -> &str {
    QEMU_TO_LIBVIRT
        .iter()
        .find(|(_, l)| *l == name)
        .map_or(name, |(q, _)| q)
}

/// Host CPU features libvirt never gives a QEMU guest (`virQEMUCapsCPUFilterFeatures`); dropped
/// from a host-model decoded from the host's own CPUID.
pub const HOST_ONLY_FEATURES: &[&str] = &["cmt", "mbm_total", "mbm_local", "osxsave", "ospke"];

/// The CPU data of QEMU's expanded host CPU (`virQEMUCapsGetCPUModelX86Data` with
/// `migratable=false`): every feature that is on (translated; names the map does not have are
/// ignored), the `vendor` string as leaf 0 and `family`/`model`/`stepping` as the
/// leaf 1 signature. Errors: [`X86Error::VendorString`].
pub fn data_from_props<'a>(
    map: &CpuMap,
    props: impl IntoIterator<Item = (&'a str, &'a HostProp)>,
) -> Result<CpuData, X86Error> {
    let mut data = CpuData::default();
    let (mut family, mut model, mut stepping) = (0, 0, 0);
    for (qname, value) in props {
        let name = libvirt_name(qname);
        match value {
            HostProp::Bool { on: true, .. } => {
                if let Some(f) = map.feature(name) {
                    data.add(&f.data);
                }
            }
            HostProp::Bool { .. } => {}
            HostProp::Text(s) if name == "vendor" => {
                let v = vendor_data(s).ok_or_else(|| X86Error::VendorString(s.clone()))?;
                data.add(&v);
            }
            HostProp::Text(_) => {}
            HostProp::Int(n) => {
                let n = u32::try_from(*n).unwrap_or(0);
                match name {
                    "family" => family = n,
                    "model" => model = n,
                    "stepping" => stepping = n,
                    _ => {}
                }
            }
        }
    }
    data.set_signature(family, model, stepping);
    Ok(data)
}

/// Removes the vendor string from `data` and returns the vendor it names (`x86DataToVendor`).
fn take_vendor(map: &CpuMap, data: &mut CpuData) -> Option<usize> {
    let i = map.vendors.iter().position(|v| data.contains(&v.data))?;
    data.subtract(&map.vendors[i].data);
    Some(i)
}

/// Drops TSX from Intel CPUs whose TSX is broken (`x86DataFilterTSX`: family 6, models 60, 69,
/// 70, and 63 before stepping 4).
fn filter_tsx(map: &CpuMap, data: &mut CpuData, vendor: Option<usize>) {
    if vendor.map(|v| map.vendors[v].name.as_str()) != Some("Intel") {
        return;
    }
    let (family, model, stepping) =
        super::cpu_map::split_signature(data.get(super::cpu_map::LEAF1)[0]);
    if family == 6 && ((model == 63 && stepping < 4) || matches!(model, 60 | 69 | 70)) {
        for name in ["hle", "rtm"] {
            if let Some(f) = map.feature(name) {
                data.subtract(&f.data);
            }
        }
    }
}

/// Appends, in map order, every feature whose bits are all in `data` with `policy`, taking its
/// bits out of `data` (`x86DataToCPUFeatures`). Errors: [`X86Error::Duplicate`].
fn take_features(
    map: &CpuMap,
    policy: Policy,
    data: &mut CpuData,
    out: &mut Vec<(String, Policy)>,
) -> Result<(), X86Error> {
    for f in &map.features {
        if data.contains(&f.data) {
            data.subtract(&f.data);
            if out.iter().any(|(n, _)| *n == f.name) {
                return Err(X86Error::Duplicate(f.name.clone()));
            }
            out.push((f.name.clone(), policy));
        }
    }
    Ok(())
}

/// `data` as model `model` plus required and minus disabled features (`x86DataToCPU`, guest
/// CPU): host bits the model lacks are required, model bits the host lacks and QEMU's blockers
/// the host lacks are disabled, and the model's removed features are disabled unless listed.
fn to_cpu(
    map: &CpuMap,
    data: &CpuData,
    model: &Model,
    hv: Option<&QemuModel>,
) -> Result<CpuDef, X86Error> {
    let mut extra = data.clone();
    extra.subtract(&model.data);
    let mut missing = model.data.clone();
    missing.subtract(data);
    if let Some(hv) = hv {
        for b in &hv.blockers {
            if let Some(f) = map.feature(b) {
                if !extra.contains(&f.data) {
                    missing.add(&f.data);
                }
            }
        }
    }
    let mut features = Vec::new();
    take_features(map, Policy::Require, &mut extra, &mut features)?;
    take_features(map, Policy::Disable, &mut missing, &mut features)?;
    for r in &model.removed {
        if !features.iter().any(|(n, _)| n == r) {
            features.push((r.clone(), Policy::Disable));
        }
    }
    Ok(CpuDef {
        model: model.name.clone(),
        vendor: None,
        features,
    })
}

/// libvirt's score of a candidate: enabled features plus disabled ones weighted 2, 3, 4, ...
/// (`virCPUx86CompareCandidateFeatureList`). The loop bound shrinks with every disabled feature,
/// exactly as libvirt's does, so the last features of a long disable list may go uncounted.
fn score(cpu: &CpuDef) -> (usize, usize) {
    let mut enabled = cpu.features.len();
    let mut disabled = 0;
    let mut penalty = 2;
    let mut i = 0;
    while i < enabled {
        if cpu.features[i].1 == Policy::Disable {
            enabled -= 1;
            disabled += penalty;
            penalty += 1;
        }
        i += 1;
    }
    (enabled + disabled, disabled)
}

/// Whether `candidate` beats the current pick (`x86DecodeUseCandidate`, guest CPU): 0 no, 1 yes,
/// 2 yes and stop (the single preferred model).
fn use_candidate(
    current: Option<&(&Model, CpuDef)>,
    candidate: &Model,
    cpu: &CpuDef,
    signature: u32,
    preferred: Option<&str>,
) -> u8 {
    if !candidate.decode_guest {
        return 0;
    }
    if preferred == Some(candidate.name.as_str()) {
        return 2;
    }
    let Some((cur_model, cur_cpu)) = current else {
        return 1;
    };
    if signature != 0 {
        let cur = cur_model.matches_signature(signature);
        let cand = candidate.matches_signature(signature);
        if cur && !cand {
            return 0;
        }
        if !cur && cand {
            return 1;
        }
    }
    let (cur_score, cur_disabled) = score(cur_cpu);
    let (cand_score, cand_disabled) = score(cpu);
    u8::from(cand_score < cur_score || (cand_score == cur_score && cand_disabled < cur_disabled))
}

/// The guest CPU definition closest to `data` (`x86Decode`): the `cpu_map` models are tried
/// newest first, limited to `models` (QEMU's list for the accelerator) when given and to the
/// vendor of `data`; a model whose signature matches wins over one that does not, otherwise the
/// lowest [`score`]. `preferred` (the baseline's input model) is taken as soon as it is reached.
/// Errors: [`X86Error::NoModel`], [`X86Error::Duplicate`].
pub fn decode(
    map: &CpuMap,
    data: &CpuData,
    models: Option<&[QemuModel]>,
    preferred: Option<&str>,
) -> Result<CpuDef, X86Error> {
    let mut data = data.clone();
    let vendor = take_vendor(map, &mut data);
    let signature = data.signature();
    filter_tsx(map, &mut data, vendor);
    let mut best: Option<(&Model, CpuDef)> = None;
    for candidate in map.models.iter().rev() {
        let hv = match models {
            Some(list) => match list.iter().find(|m| m.name == candidate.name) {
                Some(m) => Some(m),
                None => continue,
            },
            None => None,
        };
        if let (Some(v), Some(cv)) = (vendor, candidate.vendor) {
            if v != cv {
                continue;
            }
        }
        let cpu = to_cpu(map, &data, candidate, hv)?;
        match use_candidate(best.as_ref(), candidate, &cpu, signature, preferred) {
            0 => {}
            1 => best = Some((candidate, cpu)),
            _ => {
                best = Some((candidate, cpu));
                break;
            }
        }
    }
    let (_, mut cpu) = best.ok_or(X86Error::NoModel)?;
    cpu.vendor = vendor.map(|v| map.vendors[v].name.clone());
    Ok(cpu)
}

/// The baseline of one CPU definition for this QEMU (`virCPUx86Baseline` with one CPU, as
/// `virsh hypervisor-cpu-baseline` runs it): the model's bits plus its required and minus its
/// disabled features, limited to `qemu_features` (every property name of QEMU's expansion, in
/// libvirt's spelling) when given, decoded again with the input's model preferred. Errors:
/// [`X86Error`].
pub fn baseline(
    map: &CpuMap,
    cpu: &CpuDef,
    models: Option<&[QemuModel]>,
    qemu_features: Option<&[String]>,
) -> Result<CpuDef, X86Error> {
    let model = map
        .model(&cpu.model)
        .ok_or_else(|| X86Error::UnknownModel(cpu.model.clone()))?;
    let mut data = model.data.clone();
    for (name, policy) in &cpu.features {
        let f = map
            .feature(name)
            .ok_or_else(|| X86Error::UnknownFeature(name.clone()))?;
        match policy {
            Policy::Require => data.add(&f.data),
            Policy::Disable => data.subtract(&f.data),
        }
    }
    let vendor = match &cpu.vendor {
        Some(v) => Some(
            map.vendor_index(v)
                .ok_or_else(|| X86Error::UnknownVendor(v.clone()))?,
        ),
        None => None,
    };
    if let Some(names) = qemu_features {
        let mut known = CpuData::default();
        for n in names {
            if let Some(f) = map.feature(n) {
                known.add(&f.data);
            }
        }
        data.intersect(&known);
    }
    if data.is_empty() {
        return Err(X86Error::Incompatible);
    }
    if let Some(v) = vendor {
        data.add(&map.vendors[v].data);
    }
    let mut out = decode(map, &data, models, Some(&cpu.model))?;
    if cpu.vendor.is_none() {
        out.vendor = None;
    }
    Ok(out)
}

/// `cpu` with every feature of its model listed (`virCPUx86ExpandFeatures`, guest CPU): the
/// model's features as `require`, then `cpu`'s own policies over them, then the model's removed
/// features as `disable` unless listed. Errors: [`X86Error::UnknownModel`].
pub fn expand_features(map: &CpuMap, cpu: &CpuDef) -> Result<CpuDef, X86Error> {
    let model = map
        .model(&cpu.model)
        .ok_or_else(|| X86Error::UnknownModel(cpu.model.clone()))?;
    let mut data = model.data.clone();
    let mut features = Vec::new();
    take_features(map, Policy::Require, &mut data, &mut features)?;
    for (name, policy) in &cpu.features {
        match features.iter_mut().find(|(n, _)| n == name) {
            Some(f) => f.1 = *policy,
            None => features.push((name.clone(), *policy)),
        }
    }
    for r in &model.removed {
        if !features.iter().any(|(n, _)| n == r) {
            features.push((r.clone(), Policy::Disable));
        }
    }
    Ok(CpuDef {
        model: cpu.model.clone(),
        vendor: cpu.vendor.clone(),
        features,
    })
}

#[cfg(test)]
mod tests {
    use super::super::xml;
    use super::*;

    /// A map with two vendors, five features and four models (newest last), enough to exercise
    /// each rule.
    fn map() -> CpuMap {
        let docs = [
            "<cpus><vendor name='Intel' string='GenuineIntel'/>\
             <vendor name='AMD' string='AuthenticAMD'/></cpus>",
            "<cpus>\
               <feature name='fpu'><cpuid eax_in='0x01' edx='0x00000001'/></feature>\
               <feature name='sse'><cpuid eax_in='0x01' edx='0x02000000'/></feature>\
               <feature name='pclmuldq'><cpuid eax_in='0x01' ecx='0x00000002'/></feature>\
               <feature name='avx'><cpuid eax_in='0x01' ecx='0x10000000'/></feature>\
               <feature name='hle'><cpuid eax_in='0x07' ecx_in='0x00' ebx='0x00000010'/></feature>\
               <feature name='rtm'><cpuid eax_in='0x07' ecx_in='0x00' ebx='0x00000800'/></feature>\
               <feature name='invtsc' migratable='no'><cpuid eax_in='0x80000007' edx='0x00000100'/></feature>\
             </cpus>",
            "<cpus><model name='base64'><decode host='on' guest='on'/>\
               <feature name='fpu'/><feature name='sse'/></model></cpus>",
            "<cpus><model name='Old'><decode host='on' guest='on'/>\
               <signature family='6' model='60'/><vendor name='Intel'/>\
               <feature name='fpu'/><feature name='sse'/><feature name='pclmuldq'/>\
               <feature name='hle'/><feature name='rtm'/></model></cpus>",
            "<cpus><model name='Zen'><decode host='on' guest='on'/>\
               <signature family='23' model='1'/><vendor name='AMD'/>\
               <feature name='fpu'/><feature name='sse'/><feature name='pclmuldq'/>\
               <feature name='avx'/><feature name='hle' removed='yes'/></model></cpus>",
            "<cpus><model name='Zen-v2'><decode host='on' guest='off'/><model name='Zen'/>\
               <feature name='rtm'/></model></cpus>",
        ];
        let docs: Vec<_> = docs.iter().map(|d| xml::parse(d).unwrap()).collect();
        CpuMap::from_documents(&docs).unwrap()
    }

    fn on() -> HostProp {
        HostProp::Bool {
            on: true,
            non_migratable: false,
        }
    }

    fn host(vendor: &str, family: i64, model: i64, features: &[&str]) -> CpuData {
        let mut props: Vec<(String, HostProp)> = vec![
            ("vendor".into(), HostProp::Text(vendor.into())),
            ("family".into(), HostProp::Int(family)),
            ("model".into(), HostProp::Int(model)),
            ("stepping".into(), HostProp::Int(1)),
            ("model-id".into(), HostProp::Text("x".into())),
            ("sse4a".into(), on()),
        ];
        props.extend(features.iter().map(|f| (f.to_string(), on())));
        data_from_props(&map(), props.iter().map(|(n, v)| (n.as_str(), v))).unwrap()
    }

    fn names(cpu: &CpuDef, p: Policy) -> Vec<&str> {
        cpu.features
            .iter()
            .filter(|(_, q)| *q == p)
            .map(|(n, _)| n.as_str())
            .collect()
    }

    #[test]
    fn decodes_to_the_signature_match_and_libvirts_names() {
        let m = map();
        // QEMU spells pclmuldq "pclmulqdq"; sse4a is not in this map and is ignored.
        let data = host(
            "AuthenticAMD",
            23,
            1,
            &["fpu", "sse", "pclmulqdq", "invtsc"],
        );
        let cpu = decode(&m, &data, None, None).unwrap();
        assert_eq!(cpu.model, "Zen");
        assert_eq!(cpu.vendor.as_deref(), Some("AMD"));
        assert_eq!(names(&cpu, Policy::Require), vec!["invtsc"]);
        // avx is missing; hle is removed from Zen and disabled explicitly.
        assert_eq!(names(&cpu, Policy::Disable), vec!["avx", "hle"]);
        // Without a matching signature the lowest score wins (base64: one feature extra).
        let data = host("AuthenticAMD", 25, 17, &["fpu", "sse", "pclmulqdq"]);
        assert_eq!(decode(&m, &data, None, None).unwrap().model, "base64");
    }

    #[test]
    fn qemu_model_list_and_blockers_limit_the_choice() {
        let m = map();
        let data = host("AuthenticAMD", 23, 1, &["fpu", "sse", "pclmulqdq", "avx"]);
        let only_base = [QemuModel {
            name: "base64".into(),
            usable: Usable::Yes,
            blockers: vec![],
            deprecated: false,
        }];
        assert_eq!(
            decode(&m, &data, Some(&only_base), None).unwrap().model,
            "base64"
        );
        let zen_blocked = [QemuModel {
            name: "Zen".into(),
            usable: Usable::No,
            blockers: vec!["rtm".into()],
            deprecated: false,
        }];
        let cpu = decode(&m, &data, Some(&zen_blocked), None).unwrap();
        assert_eq!(names(&cpu, Policy::Disable), vec!["rtm", "hle"]);
        assert_eq!(decode(&m, &data, Some(&[]), None), Err(X86Error::NoModel));
    }

    #[test]
    fn broken_tsx_is_dropped_on_intel_only() {
        let m = map();
        let data = host(
            "GenuineIntel",
            6,
            60,
            &["fpu", "sse", "pclmulqdq", "hle", "rtm"],
        );
        let cpu = decode(&m, &data, None, None).unwrap();
        assert_eq!(cpu.model, "Old");
        assert_eq!(names(&cpu, Policy::Disable), vec!["hle", "rtm"]);
    }

    #[test]
    fn baseline_and_expansion_give_the_supported_features() {
        let m = map();
        let data = host(
            "AuthenticAMD",
            23,
            1,
            &["fpu", "sse", "pclmulqdq", "invtsc"],
        );
        let hm = decode(&m, &data, None, None).unwrap();
        let known: Vec<String> = ["fpu", "sse", "pclmuldq", "avx", "invtsc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let b = baseline(&m, &hm, None, Some(&known)).unwrap();
        assert_eq!(b.model, "Zen");
        let e = expand_features(&m, &b).unwrap();
        assert_eq!(
            names(&e, Policy::Require),
            vec!["fpu", "sse", "pclmuldq", "invtsc"]
        );
        assert_eq!(names(&e, Policy::Disable), vec!["avx", "hle"]);
        // A QEMU that does not know invtsc drops it from the baseline.
        let b = baseline(&m, &hm, None, Some(&known[..4])).unwrap();
        assert!(!names(&expand_features(&m, &b).unwrap(), Policy::Require).contains(&"invtsc"));
        assert_eq!(
            baseline(&m, &hm, None, Some(&[])),
            Err(X86Error::Incompatible)
        );
    }

    #[test]
    fn the_score_loop_is_libvirts() {
        let cpu = |p: &[Policy]| CpuDef {
            model: "x".into(),
            vendor: None,
            features: p.iter().map(|p| ("f".to_string(), *p)).collect(),
        };
        use Policy::*;
        // [R, R, D, D]: libvirt counts the first D (penalty 2) and stops: 3 enabled + 2.
        assert_eq!(score(&cpu(&[Require, Require, Disable, Disable])), (5, 2));
        assert_eq!(score(&cpu(&[Disable])), (2, 2));
        assert_eq!(score(&cpu(&[Require, Require])), (2, 0));
    }

    #[test]
    fn a_bad_vendor_string_is_an_error() {
        let props = [("vendor", HostProp::Text("AMD".into()))];
        assert_eq!(
            data_from_props(&map(), props.iter().map(|(n, v)| (*n, v))),
            Err(X86Error::VendorString("AMD".into()))
        );
    }
}
