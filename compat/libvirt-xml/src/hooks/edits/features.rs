//! Tier 2, features: what an answer may change in `<features>` that maps cleanly to a `-cpu`
//! property, as libvirt renders it (`qemu_command.c` `qemuBuildCpuCommandLine`):
//! `<kvm><hidden state>` (`kvm=off`) and the Hyper-V enlightenments that are a plain on/off
//! state ([`HYPERV`], `hv-<name>=on`). Everything else in `<features>` stays refused.

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
}

impl std::fmt::Display for FeatureEdit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = |on: &bool| if *on { "on" } else { "off" };
        match self {
            FeatureEdit::KvmHidden(on) => write!(f, "kvm/hidden {}", s(on)),
            FeatureEdit::HyperV { flag, on } => write!(f, "hyperv {flag} {}", s(on)),
        }
    }
}

/// The tier-2 view of `<features>`: `kvm/hidden@state` and the [`HYPERV`] states, by
/// libvirt's name (absent: off); whether Hyper-V runs in passthrough mode.
#[derive(Debug, Default, PartialEq)]
pub(in crate::hooks) struct FeaturesView {
    states: BTreeMap<String, String>,
    passthrough: bool,
}

/// A `<name state="..">` with nothing else.
fn state_only(c: &Node) -> bool {
    c.children.is_empty() && c.text.is_empty() && c.attrs.keys().all(|k| k == "state")
}

/// Takes the tier-2 states out of `<features>` (an emptied `<kvm>` or `<hyperv>` goes too, as
/// an absent one means the same).
pub(in crate::hooks) fn take_features(d: &mut Node) -> FeaturesView {
    let mut v = FeaturesView::default();
    let Some(features) = d.children.iter_mut().find(|c| c.name == "features") else {
        return v;
    };
    for group in features.children.iter_mut() {
        let names: Vec<&str> = match group.name.as_str() {
            "kvm" => vec!["hidden"],
            "hyperv" => {
                v.passthrough |= group.attrs.get("mode").map(String::as_str) == Some("passthrough");
                HYPERV.iter().map(|(n, _)| *n).collect()
            }
            _ => continue,
        };
        let prefix = group.name.clone();
        group.children.retain(|c| {
            if !names.contains(&c.name.as_str()) || !state_only(c) {
                return true;
            }
            let on = c.attrs.get("state").map(String::as_str) == Some("on");
            if on {
                v.states.insert(format!("{prefix}/{}", c.name), "on".into());
            } else if c.attrs.get("state").is_some_and(|s| s != "off") {
                v.states
                    .insert(format!("{prefix}/{}", c.name), c.attrs["state"].clone());
            }
            false
        });
    }
    features.children.retain(|g| {
        !(matches!(g.name.as_str(), "kvm" | "hyperv")
            && g.children.is_empty()
            && g.attrs.is_empty())
    });
    v
}

/// The edits between the `sent` and `answered` features.
pub(in crate::hooks) fn diff_features(
    sent: &FeaturesView,
    answered: &FeaturesView,
) -> Result<Vec<HookEdit>, Refusal> {
    let mut edits = Vec::new();
    let keys: std::collections::BTreeSet<&String> =
        sent.states.keys().chain(answered.states.keys()).collect();
    for k in keys {
        let (a, b) = (sent.states.get(k), answered.states.get(k));
        if a == b {
            continue;
        }
        let bad = |why: &str| Refusal {
            path: format!("domain/features/{k}@state"),
            sent: a.cloned().unwrap_or_else(|| "off".into()),
            answered: b.cloned().unwrap_or_else(|| "off".into()),
            reason: why.into(),
        };
        let on = match b.map(String::as_str) {
            None => false,
            Some("on") => true,
            Some(_) => return Err(bad("not on or off")),
        };
        let edit = if k == "kvm/hidden" {
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
    Ok(edits)
}

/// Applies `edit` to the plan's CPU flags: the flag set (`kvm=off`, `hv-<name>=on`) or removed.
pub(in crate::hooks) fn apply_feature(plan: &mut DomainPlan, edit: &FeatureEdit) {
    let (name, value) = match edit {
        FeatureEdit::KvmHidden(on) => ("kvm", on.then_some("off")),
        FeatureEdit::HyperV { flag, on } => (*flag, on.then_some("on")),
    };
    let flags = &mut plan.cpu.flags;
    match (flags.iter_mut().find(|f| f.name == name), value) {
        (Some(f), Some(v)) => f.value = v.into(),
        (None, Some(v)) => flags.push(CpuFlag {
            name: name.into(),
            value: v.into(),
        }),
        (_, None) => flags.retain(|f| f.name != name),
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
                SENT.replace("retries=\"4096\"", "retries=\"8191\""),
                "domain/features/hyperv/spinlocks@retries",
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
}
