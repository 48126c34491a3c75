//! Tier 2, features: what an answer may change in `<features>` that maps cleanly to a `-cpu`
//! property, as libvirt renders it (`qemu_command.c` `qemuBuildCpuCommandLine`):
//! `<kvm><hidden state>` (`kvm=off`), the Hyper-V enlightenments that are a plain on/off
//! state ([`HYPERV`], `hv-<name>=on`), and those with values or sub-features ([`HYPERV_VALUES`]):
//! `<spinlocks state retries>` (`hv-spinlocks=0x<retries>`), `<stimer state>` with `<direct
//! state>` (`hv-stimer`, `hv-stimer-direct`), `<vendor_id state value>` (`hv-vendor-id=`),
//! `<tlbflush state>` with `<direct state>` and `<extended state>` (`hv-tlbflush`,
//! `hv-tlbflush-direct`, `hv-tlbflush-ext`). Checked as libvirt's parser and
//! `qemuValidateDomainDefHypervFeatures` check them. Everything else in `<features>` stays
//! refused.

use super::*;
use qlauncher_core::cmdline::plan::CpuFlag;

/// The Hyper-V enlightenments a hook may turn on or off: libvirt's element and QEMU's `-cpu`
/// property (`virDomainHyperv` names, `qemuBuildCpuCommandLine`).
pub const HYPERV: [(&str, &str); 9] = [
    ("relaxed", "hv-relaxed"),
    ("vapic", "hv-vapic"),
    ("vpindex", "hv-vpindex"),
    ("runtime", "hv-runtime"),
    ("synic", "hv-synic"),
    ("reset", "hv-reset"),
    ("frequencies", "hv-frequencies"),
    ("reenlightenment", "hv-reenlightenment"),
    ("ipi", "hv-ipi"),
];

/// The Hyper-V enlightenments with a value or sub-features: libvirt's element, its attributes
/// besides `state`, its children (each a `<name state>`).
pub const HYPERV_VALUES: [(&str, &[&str], &[&str]); 4] = [
    ("spinlocks", &["retries"], &[]),
    ("stimer", &[], &["direct"]),
    ("vendor_id", &["value"], &[]),
    ("tlbflush", &[], &["direct", "extended"]),
];

/// The fewest spinlock retries libvirt takes (`virDomainFeaturesHyperVDefParse`).
pub const MIN_SPINLOCK_RETRIES: u32 = 4095;

/// The longest Hyper-V vendor id (libvirt's `VIR_DOMAIN_HYPERV_VENDOR_ID_MAX`, the 12 bytes of
/// QEMU's CPUID leaf 0x40000000 signature).
pub const MAX_VENDOR_ID: usize = 12;

/// One change of `<features>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeatureEdit {
    /// `<kvm><hidden state>`: `kvm=off` when on.
    KvmHidden(bool),
    /// `<hyperv><name state>`: the `-cpu` property `flag` (from [`HYPERV`]) on, or absent.
    HyperV {
        /// QEMU's property (`hv-relaxed`).
        flag: &'static str,
        /// On.
        on: bool,
    },
    /// `<spinlocks state retries>`: `hv-spinlocks=0x<retries>` (at least
    /// [`MIN_SPINLOCK_RETRIES`]), or absent (`None`, state off).
    Spinlocks(Option<u32>),
    /// `<stimer state><direct state>`: `hv-stimer=on` and `hv-stimer-direct=on`, or absent.
    Stimer {
        /// `hv-stimer`.
        on: bool,
        /// `hv-stimer-direct` (only with `on`).
        direct: bool,
    },
    /// `<vendor_id state value>`: `hv-vendor-id=<value>` (1 to [`MAX_VENDOR_ID`] printable
    /// ASCII characters, no comma), or absent (`None`, state off).
    VendorId(Option<String>),
    /// `<tlbflush state><direct state><extended state>`: `hv-tlbflush=on`,
    /// `hv-tlbflush-direct=on`, `hv-tlbflush-ext=on`, or absent.
    TlbFlush {
        /// `hv-tlbflush`.
        on: bool,
        /// `hv-tlbflush-direct` (only with `on`).
        direct: bool,
        /// `hv-tlbflush-ext` (only with `on`).
        extended: bool,
    },
}

impl std::fmt::Display for FeatureEdit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = |on: &bool| if *on { "on" } else { "off" };
        match self {
            FeatureEdit::KvmHidden(on) => write!(f, "kvm/hidden {}", s(on)),
            FeatureEdit::HyperV { flag, on } => write!(f, "hyperv {flag} {}", s(on)),
            FeatureEdit::Spinlocks(Some(r)) => write!(f, "hyperv hv-spinlocks retries={r}"),
            FeatureEdit::Spinlocks(None) => write!(f, "hyperv hv-spinlocks off"),
            FeatureEdit::Stimer { on, direct } => {
                write!(f, "hyperv hv-stimer {} direct={}", s(on), s(direct))
            }
            FeatureEdit::VendorId(Some(v)) => write!(f, "hyperv hv-vendor-id {v:?}"),
            FeatureEdit::VendorId(None) => write!(f, "hyperv hv-vendor-id off"),
            FeatureEdit::TlbFlush {
                on,
                direct,
                extended,
            } => write!(
                f,
                "hyperv hv-tlbflush {} direct={} extended={}",
                s(on),
                s(direct),
                s(extended)
            ),
        }
    }
}

/// The tier-2 view of `<features>`: `kvm/hidden@state` and the Hyper-V states, by libvirt's
/// name (`hyperv/relaxed`; absent: off), the values and sub-feature states of an on
/// [`HYPERV_VALUES`] element (`hyperv/spinlocks@retries`, `hyperv/stimer/direct`); whether
/// Hyper-V runs in passthrough mode.
#[derive(Debug, Default, PartialEq)]
pub(in crate::hooks) struct FeaturesView {
    states: BTreeMap<String, String>,
    values: BTreeMap<String, String>,
    passthrough: bool,
}

/// A `<name state="..">` with nothing else but the attributes `extra`.
fn state_only(c: &Node, extra: &[&str]) -> bool {
    c.children.is_empty()
        && c.text.is_empty()
        && c.attrs
            .keys()
            .all(|k| k == "state" || extra.contains(&k.as_str()))
}

/// Whether `c` is a [`HYPERV_VALUES`] element of this shape: its attributes, and `<child
/// state>` children, each at most once.
fn value_shaped(c: &Node, attrs: &[&str], children: &[&str]) -> bool {
    c.text.is_empty()
        && c.attrs
            .keys()
            .all(|k| k == "state" || attrs.contains(&k.as_str()))
        && c.children.iter().enumerate().all(|(i, x)| {
            children.contains(&x.name.as_str())
                && state_only(x, &[])
                && !c.children[..i].iter().any(|y| y.name == x.name)
        })
}

/// Takes the tier-2 states out of `<features>`.
pub(in crate::hooks) fn take_features(d: &mut Node) -> FeaturesView {
    let mut v = FeaturesView::default();
    let Some(features) = d.children.iter_mut().find(|c| c.name == "features") else {
        return v;
    };
    for group in features.children.iter_mut() {
        let names: Vec<&str> = match group.name.as_str() {
            "kvm" => vec!["hidden"],
            "hyperv" => {
                // libvirt's `mode="custom"` is its default: the listed enlightenments.
                if group.attrs.get("mode").map(String::as_str) == Some("custom") {
                    group.attrs.remove("mode");
                }
                v.passthrough |= group.attrs.get("mode").map(String::as_str) == Some("passthrough");
                HYPERV.iter().map(|(n, _)| *n).collect()
            }
            _ => continue,
        };
        let prefix = group.name.clone();
        group.children.retain(|c| {
            let key = format!("{prefix}/{}", c.name);
            let state = c.attrs.get("state").map(String::as_str);
            let mut record = |k: String, s: Option<&str>| match s {
                None | Some("off") => {}
                Some(s) => {
                    v.states.insert(k, s.into());
                }
            };
            if names.contains(&c.name.as_str()) && state_only(c, &[]) {
                record(key, state);
                return false;
            }
            let shape = HYPERV_VALUES
                .iter()
                .find(|(n, _, _)| prefix == "hyperv" && *n == c.name);
            let Some((_, attrs, children)) = shape else {
                return true;
            };
            if !value_shaped(c, attrs, children) {
                return true;
            }
            record(key.clone(), state);
            // libvirt reads the value and the sub-features of an enlightenment that is on only.
            if state == Some("on") {
                for a in *attrs {
                    if let Some(x) = c.attrs.get(*a) {
                        v.values.insert(format!("{key}@{a}"), x.clone());
                    }
                }
                for x in &c.children {
                    match x.attrs.get("state").map(String::as_str) {
                        None | Some("off") => {}
                        Some(s) => {
                            v.values.insert(format!("{key}/{}", x.name), s.into());
                        }
                    }
                }
            }
            false
        });
    }
    // An absent `<kvm>` or `<hyperv>` means the same as an emptied one: emptied ones go, and
    // both trees get one, so what is left in them is compared child by child.
    features.children.retain(|g| {
        !(matches!(g.name.as_str(), "kvm" | "hyperv")
            && g.children.is_empty()
            && g.attrs.is_empty())
    });
    for g in ["kvm", "hyperv"] {
        if !features.children.iter().any(|c| c.name == g) {
            features.children.push(Node {
                name: g.into(),
                ..Node::default()
            });
        }
    }
    v
}

/// The Hyper-V enlightenments that need another one on (libvirt's
/// `qemuValidateDomainDefHypervFeatures`; QEMU's `kvm_hyperv_expand_features` refuses them
/// too): (feature, the one it requires).
pub const HYPERV_REQUIRES: [(&str, &str); 4] = [
    ("synic", "vpindex"),
    ("stimer", "synic"),
    ("tlbflush", "vpindex"),
    ("ipi", "vpindex"),
];

/// The edits between the `sent` and `answered` features; `hypervclock` says whether the sent
/// and the answered clock have the `hypervclock` timer present (libvirt's condition for
/// `stimer`); `tcg`, whether QEMU runs without KVM (it then takes no `hv-vpindex`).
pub(in crate::hooks) fn diff_features(
    sent: &FeaturesView,
    answered: &FeaturesView,
    hypervclock: (bool, bool),
    tcg: bool,
) -> Result<Vec<HookEdit>, Refusal> {
    let mut edits = Vec::new();
    let keys: std::collections::BTreeSet<&String> =
        sent.states.keys().chain(answered.states.keys()).collect();
    let valued = |k: &str| {
        HYPERV_VALUES
            .iter()
            .any(|(n, _, _)| k == format!("hyperv/{n}"))
    };
    for k in keys.iter().filter(|k| !valued(k)) {
        let (a, b) = (sent.states.get(*k), answered.states.get(*k));
        if a == b {
            continue;
        }
        let bad = |why: &str| state_refusal(k, a, b, why);
        let on = match b.map(String::as_str) {
            None => false,
            Some("on") => true,
            Some(_) => return Err(bad("not on or off")),
        };
        let edit = if k.as_str() == "kvm/hidden" {
            FeatureEdit::KvmHidden(on)
        } else {
            if answered.passthrough {
                return Err(bad("Hyper-V passthrough sets every enlightenment itself"));
            }
            let name = k.trim_start_matches("hyperv/");
            let (_, flag) = HYPERV
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| bad("not a Hyper-V enlightenment qlauncher runs"))?;
            FeatureEdit::HyperV { flag, on }
        };
        edits.push(HookEdit::Feature(edit));
    }
    for (name, _, _) in HYPERV_VALUES {
        let key = format!("hyperv/{name}");
        let of = |v: &FeaturesView| -> (Option<String>, Vec<(String, String)>) {
            let values = v
                .values
                .iter()
                .filter(|(k, _)| {
                    k.starts_with(&format!("{key}@")) || k.starts_with(&format!("{key}/"))
                })
                .map(|(k, x)| (k.clone(), x.clone()))
                .collect();
            (v.states.get(&key).cloned(), values)
        };
        let (a, b) = (of(sent), of(answered));
        if a == b {
            continue;
        }
        edits.push(HookEdit::Feature(value_edit(name, &key, sent, answered)?));
    }
    check_requires(sent, answered, hypervclock, tcg)?;
    Ok(edits)
}

/// Refuses an answer whose change breaks a [`HYPERV_REQUIRES`] rule or `stimer`'s need of the
/// `hypervclock` timer: a rule is checked when the hook changed either side of it (what the VMI
/// had, KubeVirt's defaults already made consistent).
fn check_requires(
    sent: &FeaturesView,
    answered: &FeaturesView,
    hypervclock: (bool, bool),
    tcg: bool,
) -> Result<(), Refusal> {
    let on = |v: &FeaturesView, f: &str| {
        v.states.get(&format!("hyperv/{f}")).map(String::as_str) == Some("on")
    };
    let changed = |f: &str| on(sent, f) != on(answered, f);
    let refuse = |f: &str, why: String| {
        let key = format!("hyperv/{f}");
        state_refusal(&key, sent.states.get(&key), answered.states.get(&key), &why)
    };
    if tcg && on(answered, "vpindex") && changed("vpindex") {
        return Err(refuse(
            "vpindex",
            "QEMU without KVM takes no hv-vpindex (\"kernel doesn't allow setting HyperV \
             VP_INDEX\"); synic, stimer, tlbflush and ipi need it"
                .into(),
        ));
    }
    for (f, r) in HYPERV_REQUIRES {
        if on(answered, f) && !on(answered, r) && (changed(f) || changed(r)) {
            return Err(refuse(
                f,
                format!("'{f}' hyperv feature requires '{r}' feature (libvirt)"),
            ));
        }
    }
    let (clock_sent, clock_answered) = hypervclock;
    if on(answered, "stimer") && !clock_answered && (changed("stimer") || clock_sent) {
        return Err(refuse(
            "stimer",
            "'stimer' hyperv feature requires 'hypervclock' timer (libvirt): add <timer \
             name=\"hypervclock\" present=\"yes\"/> to <clock>"
                .into(),
        ));
    }
    Ok(())
}

/// A refusal of the `state` of feature `key` (`hyperv/relaxed`): absent is off.
fn state_refusal(
    key: &str,
    sent: Option<&String>,
    answered: Option<&String>,
    why: &str,
) -> Refusal {
    Refusal {
        path: format!("domain/features/{key}@state"),
        sent: sent.cloned().unwrap_or_else(|| "off".into()),
        answered: answered.cloned().unwrap_or_else(|| "off".into()),
        reason: why.into(),
    }
}

/// The edit of the changed [`HYPERV_VALUES`] element `name` (view key `key`), from the answer.
fn value_edit(
    name: &str,
    key: &str,
    sent: &FeaturesView,
    answered: &FeaturesView,
) -> Result<FeatureEdit, Refusal> {
    let (a, b) = (sent.states.get(key), answered.states.get(key));
    let on = match b.map(String::as_str) {
        None => false,
        Some("on") => true,
        Some(_) => return Err(state_refusal(key, a, b, "not on or off")),
    };
    if answered.passthrough {
        return Err(state_refusal(
            key,
            a,
            b,
            "Hyper-V passthrough sets every enlightenment itself",
        ));
    }
    let value = |attr: &str| {
        let k = format!("{key}@{attr}");
        (
            sent.values.get(&k).cloned(),
            answered.values.get(&k).cloned(),
        )
    };
    let value_refusal = |attr: &str, why: &str| {
        let (s, n) = value(attr);
        Refusal {
            path: format!("domain/features/{key}@{attr}"),
            sent: s.unwrap_or_else(|| "-".into()),
            answered: n.unwrap_or_else(|| "-".into()),
            reason: why.into(),
        }
    };
    let sub = |child: &str| -> Result<bool, Refusal> {
        let k = format!("{key}/{child}");
        match answered.values.get(&k).map(String::as_str) {
            None => Ok(false),
            Some("on") => Ok(true),
            Some(_) => Err(state_refusal(
                &k,
                sent.values.get(&k),
                answered.values.get(&k),
                "not on or off",
            )),
        }
    };
    Ok(match name {
        "spinlocks" => {
            if !on {
                return Ok(FeatureEdit::Spinlocks(None));
            }
            let retries = value("retries")
                .1
                .and_then(|r| r.parse::<u32>().ok())
                .filter(|r| *r >= MIN_SPINLOCK_RETRIES)
                .ok_or_else(|| {
                    value_refusal(
                        "retries",
                        "not a retry count from 4095 to 4294967295 (libvirt needs one with state on)",
                    )
                })?;
            FeatureEdit::Spinlocks(Some(retries))
        }
        "vendor_id" => {
            if !on {
                return Ok(FeatureEdit::VendorId(None));
            }
            let v = value("value").1.unwrap_or_default();
            let ok = !v.is_empty()
                && v.len() <= MAX_VENDOR_ID
                && v.bytes().all(|c| c.is_ascii_graphic() && c != b',');
            if !ok {
                return Err(value_refusal(
                    "value",
                    "not 1 to 12 printable ASCII characters without a comma (QEMU's \
                     hv-vendor-id is a 12-byte signature; its -cpu option has no comma escape)",
                ));
            }
            FeatureEdit::VendorId(Some(v))
        }
        "stimer" => {
            let direct = sub("direct")?;
            FeatureEdit::Stimer {
                on,
                direct: on && direct,
            }
        }
        _ => {
            let (direct, extended) = (sub("direct")?, sub("extended")?);
            FeatureEdit::TlbFlush {
                on,
                direct: on && direct,
                extended: on && extended,
            }
        }
    })
}

/// Sets the `-cpu` flag `name` to `value` (in place, or last when new), or removes it.
fn set_flag(plan: &mut DomainPlan, name: &str, value: Option<String>) {
    let flags = &mut plan.cpu.flags;
    match (flags.iter_mut().find(|f| f.name == name), value) {
        (Some(f), Some(v)) => f.value = v,
        (None, Some(v)) => flags.push(CpuFlag {
            name: name.into(),
            value: v,
        }),
        (_, None) => flags.retain(|f| f.name != name),
    }
}

/// Applies `edit` to the plan's CPU flags: the flags set (`kvm=off`, `hv-<name>=on`,
/// `hv-spinlocks=0x<retries>`, `hv-vendor-id=<value>`) or removed.
pub(in crate::hooks) fn apply_feature(plan: &mut DomainPlan, edit: &FeatureEdit) {
    let on = |b: bool| b.then(|| "on".to_string());
    match edit {
        FeatureEdit::KvmHidden(hidden) => set_flag(plan, "kvm", hidden.then(|| "off".into())),
        FeatureEdit::HyperV { flag, on: o } => set_flag(plan, flag, on(*o)),
        FeatureEdit::Spinlocks(r) => set_flag(plan, "hv-spinlocks", r.map(|r| format!("{r:#x}"))),
        FeatureEdit::VendorId(v) => set_flag(plan, "hv-vendor-id", v.clone()),
        FeatureEdit::Stimer { on: o, direct } => {
            set_flag(plan, "hv-stimer", on(*o));
            set_flag(plan, "hv-stimer-direct", on(*o && *direct));
        }
        FeatureEdit::TlbFlush {
            on: o,
            direct,
            extended,
        } => {
            set_flag(plan, "hv-tlbflush", on(*o));
            set_flag(plan, "hv-tlbflush-direct", on(*o && *direct));
            set_flag(plan, "hv-tlbflush-ext", on(*o && *extended));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::*;

    const SENT: &str = "<domain type=\"kvm\"><name>ns_vm</name><features><acpi></acpi>\
        <hyperv><relaxed state=\"on\"></relaxed><spinlocks state=\"on\" retries=\"4096\"></spinlocks></hyperv>\
        </features></domain>";

    #[test]
    fn kvm_hidden_and_hyperv_states_are_cpu_flags() {
        let answer = SENT
            .replace("<relaxed state=\"on\">", "<relaxed state=\"off\">")
            .replace("</hyperv>", "<synic state=\"on\"/><vpindex state=\"on\"/></hyperv><kvm><hidden state=\"on\"/></kvm>");
        assert_eq!(
            hook_diff(SENT, &answer).unwrap(),
            "hyperv hv-relaxed off\nhyperv hv-synic on\nhyperv hv-vpindex on\nkvm/hidden on\n"
        );
        // `state="off"` and absent are one; so are an empty `<kvm>` and none.
        let same = SENT.replace(
            "</features>",
            "<kvm><hidden state=\"off\"/></kvm><hyperv><ipi state=\"off\"/></hyperv></features>",
        );
        assert_eq!(diff_answer(SENT, &same).unwrap(), vec![]);
    }

    #[test]
    fn other_features_stay_refused() {
        for (answer, path) in [
            (
                SENT.replace("<relaxed state=\"on\">", "<relaxed state=\"maybe\">"),
                "domain/features/hyperv/relaxed@state",
            ),
            (
                SENT.replace("<acpi></acpi>", "<acpi></acpi><pmu state=\"off\"/>"),
                "domain/features/pmu",
            ),
            (
                SENT.replace("</hyperv>", "<evmcs state=\"on\"/></hyperv>"),
                "domain/features/hyperv/evmcs",
            ),
        ] {
            let r = diff_answer(SENT, &answer).unwrap_err();
            assert!(r.path.starts_with(path), "{path}: {r}");
        }
        let pt = "<domain type=\"kvm\"><features><hyperv mode=\"passthrough\"></hyperv></features></domain>";
        let answer = pt.replace("</hyperv>", "<relaxed state=\"on\"/></hyperv>");
        assert_eq!(
            diff_answer(pt, &answer).unwrap_err().path,
            "domain/features/hyperv/relaxed@state"
        );
    }

    fn flags(edits: &[HookEdit]) -> Vec<String> {
        let mut plan = DomainPlan::default();
        apply(edits, &mut plan);
        plan.cpu
            .flags
            .iter()
            .map(|f| format!("{}={}", f.name, f.value))
            .collect()
    }

    #[test]
    fn hyperv_values_are_cpu_flags() {
        let answer = SENT.replace("retries=\"4096\"", "retries=\"8191\"").replace(
            "</hyperv>",
            "<vpindex state=\"on\"/><vendor_id state=\"on\" value=\"KVMKVMKVM\"/>\
             <tlbflush state=\"on\"><direct state=\"on\"/><extended state=\"off\"/></tlbflush></hyperv>",
        );
        assert_eq!(
            hook_diff(SENT, &answer).unwrap(),
            "hyperv hv-vpindex on\nhyperv hv-spinlocks retries=8191\n\
             hyperv hv-vendor-id \"KVMKVMKVM\"\nhyperv hv-tlbflush on direct=on extended=off\n"
        );
        assert_eq!(
            flags(&diff_answer(SENT, &answer).unwrap()),
            [
                "hv-vpindex=on",
                "hv-spinlocks=0x1fff",
                "hv-vendor-id=KVMKVMKVM",
                "hv-tlbflush=on",
                "hv-tlbflush-direct=on"
            ]
        );
        // Off drops the flag; the retries of an off element mean nothing (libvirt reads them
        // only when on).
        let off = SENT.replace(
            "<spinlocks state=\"on\" retries=\"4096\">",
            "<spinlocks state=\"off\" retries=\"1\">",
        );
        assert_eq!(
            diff_answer(SENT, &off).unwrap(),
            vec![HookEdit::Feature(FeatureEdit::Spinlocks(None))]
        );
        let again = SENT.replace(
            "<spinlocks state=\"on\" retries=\"4096\">",
            "<spinlocks state=\"off\">",
        );
        assert_eq!(diff_answer(&off, &again).unwrap(), vec![]);
        // stimer needs synic and the hypervclock timer (libvirt).
        let stimer = SENT.replace(
            "</hyperv>",
            "<vpindex state=\"on\"/><synic state=\"on\"/><stimer state=\"on\"><direct state=\"on\"/></stimer></hyperv>",
        );
        let r = diff_answer(SENT, &stimer).unwrap_err();
        assert_eq!(r.path, "domain/features/hyperv/stimer@state", "{r}");
        assert!(r.reason.contains("hypervclock"), "{r}");
        let with_clock = stimer.replace(
            "</features>",
            "</features><clock offset=\"utc\"><timer name=\"hypervclock\" present=\"yes\"/></clock>",
        );
        let edits = diff_answer(SENT, &with_clock).unwrap();
        assert_eq!(
            flags(&edits),
            [
                "hv-synic=on",
                "hv-vpindex=on",
                "hv-stimer=on",
                "hv-stimer-direct=on",
                "hv-time=on"
            ]
        );
    }

    #[test]
    fn bad_hyperv_values_are_refused_with_the_path() {
        let add = |x: &str| SENT.replace("</hyperv>", &format!("{x}</hyperv>"));
        for (answer, path) in [
            (
                SENT.replace("retries=\"4096\"", "retries=\"100\""),
                "domain/features/hyperv/spinlocks@retries",
            ),
            (
                SENT.replace(" retries=\"4096\"", ""),
                "domain/features/hyperv/spinlocks@retries",
            ),
            (
                add("<vendor_id state=\"on\" value=\"a,b\"/>"),
                "domain/features/hyperv/vendor_id@value",
            ),
            (
                add("<vendor_id state=\"on\" value=\"1234567890123\"/>"),
                "domain/features/hyperv/vendor_id@value",
            ),
            (
                add("<vendor_id state=\"on\"/>"),
                "domain/features/hyperv/vendor_id@value",
            ),
            (
                add("<tlbflush state=\"on\"><direct state=\"yes\"/></tlbflush>"),
                "domain/features/hyperv/tlbflush/direct@state",
            ),
            (
                add("<stimer state=\"on\"/>"),
                "domain/features/hyperv/stimer@state",
            ),
            (
                add("<synic state=\"on\"/>"),
                "domain/features/hyperv/synic@state",
            ),
            (
                add("<ipi state=\"on\"/>"),
                "domain/features/hyperv/ipi@state",
            ),
            (
                add("<tlbflush state=\"on\"/>"),
                "domain/features/hyperv/tlbflush@state",
            ),
            (
                add("<tlbflush state=\"on\"><flush state=\"on\"/></tlbflush>"),
                "domain/features/hyperv/tlbflush",
            ),
        ] {
            let r = diff_answer(SENT, &answer).unwrap_err();
            assert!(r.path.starts_with(path), "{path}: {r}");
        }
        // Under TCG QEMU takes no hv-vpindex.
        let tcg = SENT.replace("type=\"kvm\"", "type=\"qemu\"");
        let r = diff_answer(
            &tcg,
            &add("<vpindex state=\"on\"/>").replace("type=\"kvm\"", "type=\"qemu\""),
        )
        .unwrap_err();
        assert_eq!(r.path, "domain/features/hyperv/vpindex@state", "{r}");
        // A rule is the hook's business only when it changes one of its sides; libvirt's
        // `mode="custom"` is its default.
        let sent = add("<synic state=\"on\"/>");
        let answer = sent
            .replace("<relaxed state=\"on\">", "<relaxed state=\"off\">")
            .replace("<hyperv>", "<hyperv mode=\"custom\">");
        assert_eq!(
            hook_diff(&sent, &answer).unwrap(),
            "hyperv hv-relaxed off\n"
        );
    }
}
