//! What an answer may change: the tier-1 differences and the tier-2 ones of each room
//! ([`disk`], [`nic`], [`features`], [`clock`]) as typed [`HookEdit`]s ([`diff_answer`]),
//! applied to a plan ([`apply`]).

use super::*;

mod clock;
mod disk;
mod features;
mod nic;
pub use clock::*;
pub use disk::*;
pub use features::*;
pub use nic::*;

/// Which keys of two keyed views [`keyed_diff`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keys {
    /// Keys both views have (a device only one side has is the device diff's business).
    Both,
    /// Keys either view has (a timer the answer adds or removes is an edit).
    Either,
}

/// A refusal of the `what` (`driver@io`, `mtu@size`) of the device `element` (`disk`,
/// `interface`) with alias `alias`: path `domain/devices/<element>[<alias>]/<what>`, an absent
/// value shown as `-`.
pub(super) fn device_refusal(
    element: &str,
    alias: &str,
    what: &str,
    sent: Option<&str>,
    answered: Option<&str>,
    why: &str,
) -> Refusal {
    Refusal {
        path: format!("domain/devices/{element}[{alias}]/{what}"),
        sent: sent.unwrap_or("-").into(),
        answered: answered.unwrap_or("-").into(),
        reason: why.into(),
    }
}

/// The edits between two views keyed alike (disks and interfaces by alias, timers by name):
/// `edit(key, sent, answered)` for each key of `keys` whose values differ, in key order; the
/// first refusal stops it.
pub(super) fn keyed_diff<K: Ord, V: PartialEq, E>(
    sent: &BTreeMap<K, V>,
    answered: &BTreeMap<K, V>,
    keys: Keys,
    mut edit: impl FnMut(&K, Option<&V>, Option<&V>) -> Result<Vec<E>, Refusal>,
) -> Result<Vec<E>, Refusal> {
    let all: std::collections::BTreeSet<&K> = match keys {
        Keys::Both => answered.keys().filter(|k| sent.contains_key(k)).collect(),
        Keys::Either => sent.keys().chain(answered.keys()).collect(),
    };
    let mut out = Vec::new();
    for k in all {
        let (a, b) = (sent.get(k), answered.get(k));
        if a != b {
            out.extend(edit(k, a, b)?);
        }
    }
    Ok(out)
}

/// SMBIOS mode (`<os><smbios mode=..>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmbiosMode {
    /// The `<sysinfo>` tables (KubeVirt's).
    Sysinfo,
    /// QEMU's own tables: no `-smbios`.
    Emulate,
}

/// A typed change of the plan a hook's answer asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookEdit {
    /// `<qemu:commandline><qemu:arg>`: the extra argv words, in order (replacing the previous).
    Args(Vec<String>),
    /// `<qemu:commandline><qemu:env>`: the extra environment, in order.
    Env(Vec<(String, String)>),
    /// A whole SMBIOS table (type 0, 1, 2, 3 or 11) with QEMU's field names, in order; empty
    /// removes the table (type 1 keeps its `uuid`).
    Smbios {
        /// The table type.
        table: u8,
        /// Field name (from the allow-list) and value.
        fields: Vec<(&'static str, String)>,
    },
    /// `<os><smbios mode>`.
    SmbiosMode(SmbiosMode),
    /// A change of the `<disk>` with QEMU id (alias) `alias` (tier 2: its driver's cache, io,
    /// discard, error policies and queues, its serial).
    Disk {
        /// The disk's alias (`ua-<disk name>`).
        alias: String,
        /// The change.
        edit: DiskEdit,
    },
    /// A change of the `<interface>` with QEMU id (alias) `alias` (tier 2: its model, MTU,
    /// queue sizes, ROM).
    Nic {
        /// The interface's alias (`ua-<interface name>`).
        alias: String,
        /// The change.
        edit: NicEdit,
    },
    /// A change of `<features>` that is a `-cpu` property (tier 2: KVM hidden, Hyper-V
    /// enlightenments).
    Feature(FeatureEdit),
    /// A change of `<clock>` (tier 2: offset, timers).
    Clock(ClockEdit),
}

impl std::fmt::Display for HookEdit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HookEdit::Args(a) => write!(f, "qemu:commandline args {a:?}"),
            HookEdit::Env(e) => write!(f, "qemu:commandline env {e:?}"),
            HookEdit::Smbios { table, fields } => write!(f, "smbios type {table} {fields:?}"),
            HookEdit::SmbiosMode(m) => write!(f, "os/smbios@mode {m:?}"),
            HookEdit::Disk { alias, edit } => write!(f, "disk {alias} {edit}"),
            HookEdit::Nic { alias, edit } => write!(f, "interface {alias} {edit}"),
            HookEdit::Feature(e) => write!(f, "{e}"),
            HookEdit::Clock(e) => write!(f, "{e}"),
        }
    }
}

/// The libvirt `<sysinfo>` section of an SMBIOS table, and the entry names QEMU's `-smbios`
/// accepts for it (libvirt's `qemuBuildSmbiosBiosStr` and siblings; same key names).
pub(super) const TABLES: [(u8, &str, &[&str]); 4] = [
    (0, "bios", &["vendor", "version", "date", "release"]),
    (
        1,
        "system",
        &[
            "manufacturer",
            "product",
            "version",
            "serial",
            "uuid",
            "sku",
            "family",
        ],
    ),
    (
        2,
        "baseBoard",
        &[
            "manufacturer",
            "product",
            "version",
            "serial",
            "asset",
            "location",
        ],
    ),
    (
        3,
        "chassis",
        &["manufacturer", "version", "serial", "asset", "sku"],
    ),
];

/// Options a `<qemu:arg>` may not carry: they take over what the launcher controls.
pub(super) const LAUNCHER_OPTIONS: [&str; 9] = [
    "-name",
    "-uuid",
    "-daemonize",
    "-pidfile",
    "-runas",
    "-chroot",
    "-incoming",
    "-sandbox",
    "-qmp",
];

/// The tier-1 view of a domain tree.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Tier1 {
    args: Vec<String>,
    env: Vec<(String, String)>,
    mode: Option<String>,
    /// `(section, entries)`: name (empty for `oemStrings`) and value, in order, empty values
    /// dropped.
    sections: BTreeMap<String, Vec<(String, String)>>,
    /// The tier-2 attributes of each disk with an alias, by alias.
    disks: BTreeMap<String, DiskView>,
    /// The tier-2 elements of each interface with an alias, by alias.
    nics: BTreeMap<String, NicView>,
    /// The tier-2 states of `<features>`.
    features: FeaturesView,
    /// The tier-2 offset and timers of `<clock>`.
    clock: ClockView,
}

/// Takes the tier-1 elements out of `d` (so the rest can be compared as a whole).
pub(super) fn take_tier1(d: &mut Node) -> Tier1 {
    let mut t = Tier1::default();
    d.children.retain(|c| {
        if c.name != "qemu:commandline" {
            return true;
        }
        for x in &c.children {
            let attr = |k: &str| x.attrs.get(k).cloned().unwrap_or_default();
            match x.name.as_str() {
                "qemu:arg" => t.args.push(attr("value")),
                "qemu:env" => t.env.push((attr("name"), attr("value"))),
                _ => t.args.push(format!("\0{}", x.name)),
            }
        }
        false
    });
    if let Some(os) = d.children.iter_mut().find(|c| c.name == "os") {
        os.children.retain(|c| {
            if c.name == "smbios" {
                t.mode = c.attrs.get("mode").cloned();
                return false;
            }
            true
        });
    }
    d.children.retain(|c| c.name != "metadata");
    t.disks = take_disks(d);
    t.nics = take_nics(d);
    t.features = take_features(d);
    t.clock = take_clock(d);
    if let Some(s) = d.children.iter_mut().find(|c| c.name == "sysinfo") {
        s.children.retain(|sec| {
            let known = matches!(
                sec.name.as_str(),
                "system" | "bios" | "baseBoard" | "chassis" | "oemStrings"
            );
            if !known || !sec.attrs.is_empty() {
                return true;
            }
            let entries: Vec<(String, String)> = sec
                .children
                .iter()
                .filter(|e| e.name == "entry" && !e.text.is_empty())
                .map(|e| {
                    (
                        e.attrs.get("name").cloned().unwrap_or_default(),
                        e.text.clone(),
                    )
                })
                .collect();
            let others = sec.children.iter().any(|e| e.name != "entry");
            if others {
                return true;
            }
            if !entries.is_empty() {
                t.sections.insert(sec.name.clone(), entries);
            }
            false
        });
    }
    t
}

/// Elements that mean the same empty as absent: `(parent, element)`. libvirtxml (the Go
/// library KubeVirt's `smbios` example and most Go hooks re-serialize with) drops an
/// interface's empty `<source>` and an empty cdrom's `<source>`, which `api.DomainSpec` always
/// writes.
const EMPTY_IS_ABSENT: &[(&str, &str)] = &[("interface", "source"), ("disk", "source")];

/// Attributes whose value means the same as their absence: `(element, attribute, value)`.
/// libvirtxml omits these defaults (`maxMemory@slots` 0, `filesystem@accessMode`
/// `passthrough`); an empty value is always the same as none (Go's `omitempty`).
const DEFAULT_IS_ABSENT: &[(&str, &str, &str)] = &[
    ("maxMemory", "slots", "0"),
    ("filesystem", "accessMode", "passthrough"),
];

/// Numbers written in hex either way: `(parent, element)` whose text is compared by value
/// (libvirtxml prints the SEV policy `0x5` as `0x0005`).
const HEX_TEXT: &[(&str, &str)] = &[("launchSecurity", "policy")];

/// Rewrites the differences that carry no meaning ([`EMPTY_IS_ABSENT`],
/// [`DEFAULT_IS_ABSENT`], [`HEX_TEXT`]) into one form, in both trees before they are compared,
/// so a hook that re-serializes the domain with another library is no change.
fn normalize(n: &mut Node, parent: &str) {
    let name = n.name.clone();
    n.attrs.retain(|k, v| {
        !v.is_empty()
            && !DEFAULT_IS_ABSENT
                .iter()
                .any(|(e, a, d)| *e == name && a == k && d == v)
    });
    if HEX_TEXT.iter().any(|(p, e)| *p == parent && *e == name) {
        if let Some(v) = n
            .text
            .strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
        {
            n.text = format!("{v:#x}");
        }
    }
    n.children.retain(|c| {
        let empty =
            c.attrs.values().all(String::is_empty) && c.children.is_empty() && c.text.is_empty();
        !(empty
            && EMPTY_IS_ABSENT
                .iter()
                .any(|(p, e)| *p == name && *e == c.name))
    });
    for c in &mut n.children {
        normalize(c, &name);
    }
}

/// Compares a hook's `answer` with the XML qlauncher `sent` and gives the plan edits it asks for.
///
/// # Errors
/// A [`Refusal`] when the answer cannot be read, or changes anything outside tier 1 (the first
/// such difference, with its path and both values), or a tier-1 change qlauncher cannot run.
pub fn diff_answer(sent: &str, answer: &str) -> Result<Vec<HookEdit>, Refusal> {
    let mut before = parse(sent).map_err(|mut r| {
        r.reason = format!("the sent XML does not parse: {}", r.reason);
        r
    })?;
    let mut after = parse(answer)?;
    let t0 = take_tier1(&mut before);
    let t1 = take_tier1(&mut after);
    normalize(&mut before, "");
    normalize(&mut after, "");
    if let Some(d) = diff(&before, &after).into_iter().next() {
        return Err(Refusal {
            path: d.path,
            sent: d.ours,
            answered: d.expected,
            reason: "qlauncher cannot run this change".into(),
        });
    }
    let mut edits = Vec::new();
    if t1.args != t0.args {
        check_args(&t1.args)?;
        edits.push(HookEdit::Args(t1.args.clone()));
    }
    if t1.env != t0.env {
        for (i, (name, _)) in t1.env.iter().enumerate() {
            let ok = !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !name.as_bytes()[0].is_ascii_digit();
            if !ok || ["PATH", "LD_PRELOAD", "LD_LIBRARY_PATH"].contains(&name.as_str()) {
                return Err(Refusal {
                    path: format!("domain/qemu:commandline/qemu:env[{i}]@name"),
                    sent: "-".into(),
                    answered: name.clone(),
                    reason: "not an environment variable qlauncher passes to QEMU".into(),
                });
            }
        }
        edits.push(HookEdit::Env(t1.env.clone()));
    }
    if t1.mode != t0.mode {
        let mode = match t1.mode.as_deref() {
            Some("sysinfo") => SmbiosMode::Sysinfo,
            Some("emulate") | None => SmbiosMode::Emulate,
            Some(other) => {
                return Err(Refusal {
                    path: "domain/os/smbios@mode".into(),
                    sent: t0.mode.clone().unwrap_or_else(|| "-".into()),
                    answered: other.into(),
                    reason: "only sysinfo and emulate are supported".into(),
                })
            }
        };
        edits.push(HookEdit::SmbiosMode(mode));
    }
    for (table, section, keys) in TABLES {
        let (a, b) = (t0.sections.get(section), t1.sections.get(section));
        if a == b {
            continue;
        }
        let mut fields = Vec::new();
        for (name, value) in b.into_iter().flatten() {
            let path = format!("domain/sysinfo/{section}/entry[{name}]#text");
            let sent = a
                .and_then(|a| a.iter().find(|(n, _)| n == name))
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| "-".into());
            let Some(key) = keys.iter().find(|k| **k == name) else {
                return Err(Refusal {
                    path,
                    sent,
                    answered: value.clone(),
                    reason: format!("not an SMBIOS type {table} field QEMU takes"),
                });
            };
            if *key == "uuid" {
                if sent != *value {
                    return Err(Refusal {
                        path,
                        sent,
                        answered: value.clone(),
                        reason: "the domain UUID is KubeVirt's".into(),
                    });
                }
                continue;
            }
            check_text(&path, &sent, value)?;
            fields.push((*key, value.clone()));
        }
        edits.push(HookEdit::Smbios { table, fields });
    }
    edits.extend(diff_disks(&t0.disks, &t1.disks)?);
    edits.extend(diff_nics(&t0.nics, &t1.nics)?);
    // KubeVirt's domain type `qemu` is TCG (`DomainPlan::accel`).
    let tcg = before.attrs.get("type").map(String::as_str) == Some("qemu");
    edits.extend(diff_features(
        &t0.features,
        &t1.features,
        (t0.clock.hypervclock(), t1.clock.hypervclock()),
        tcg,
    )?);
    edits.extend(diff_clock(&t0.clock, &t1.clock)?);
    let (a, b) = (t0.sections.get("oemStrings"), t1.sections.get("oemStrings"));
    if a != b {
        let mut fields = Vec::new();
        for (i, (_, v)) in b.into_iter().flatten().enumerate() {
            check_text(
                &format!("domain/sysinfo/oemStrings/entry[{i}]#text"),
                "-",
                v,
            )?;
            fields.push(("value", v.clone()));
        }
        edits.push(HookEdit::Smbios { table: 11, fields });
    }
    Ok(edits)
}

/// Refuses `qemu:arg` words that are not plain arguments, take over an option the launcher
/// controls, or touch its QMP monitor.
fn check_args(args: &[String]) -> Result<(), Refusal> {
    for (i, a) in args.iter().enumerate() {
        if let Some(name) = a.strip_prefix('\0') {
            return Err(Refusal {
                path: format!("domain/qemu:commandline/{name}"),
                sent: "-".into(),
                answered: "present".into(),
                reason: "only qemu:arg and qemu:env are supported".into(),
            });
        }
        let option = a
            .strip_prefix('-')
            .map(|o| format!("-{}", o.trim_start_matches('-')));
        if option.is_some_and(|o| LAUNCHER_OPTIONS.contains(&o.as_str())) {
            return Err(Refusal {
                path: format!("domain/qemu:commandline/qemu:arg[{i}]@value"),
                sent: "-".into(),
                answered: a.clone(),
                reason: "the launcher controls this QEMU option".into(),
            });
        }
        if a.contains("charmonitor") {
            return Err(Refusal {
                path: format!("domain/qemu:commandline/qemu:arg[{i}]@value"),
                sent: "-".into(),
                answered: a.clone(),
                reason: "the launcher's QMP monitor cannot be touched".into(),
            });
        }
    }
    Ok(())
}

pub(super) fn check_text(path: &str, sent: &str, value: &str) -> Result<(), Refusal> {
    let refuse = |reason: &str| Refusal {
        path: path.into(),
        sent: sent.into(),
        answered: value.into(),
        reason: reason.into(),
    };
    if value.len() > MAX_SMBIOS_TEXT {
        return Err(refuse("longer than 255 bytes"));
    }
    if value.chars().any(char::is_control) {
        return Err(refuse("control characters are not allowed"));
    }
    Ok(())
}

/// Applies hook edits to a plan (the argv, the QMP plan and the `api.Domain` are all made from
/// the edited plan afterwards).
pub fn apply(edits: &[HookEdit], plan: &mut DomainPlan) {
    for e in edits {
        match e {
            HookEdit::Args(a) => plan.extra_args = a.clone(),
            HookEdit::Env(v) => plan.extra_env = v.clone(),
            HookEdit::SmbiosMode(SmbiosMode::Emulate) => plan.smbios.clear(),
            HookEdit::SmbiosMode(SmbiosMode::Sysinfo) => {}
            HookEdit::Disk { alias, edit } => apply_disk(plan, alias, edit),
            HookEdit::Nic { alias, edit } => apply_nic(plan, alias, edit),
            HookEdit::Feature(e) => apply_feature(plan, e),
            HookEdit::Clock(e) => apply_clock(plan, e),
            HookEdit::Smbios { table, fields } => {
                let mut fields = fields.clone();
                if *table == 1 {
                    fields.push(("uuid", plan.uuid.clone()));
                }
                plan.smbios.retain(|t| t.table != *table);
                if !fields.is_empty() {
                    plan.smbios.push(SmbiosTable {
                        table: *table,
                        fields,
                    });
                    plan.smbios.sort_by_key(|t| t.table);
                }
            }
        }
    }
}

/// `qlauncher hook-diff`: the edits `after` asks for against `before`, one a line, or the refusal.
///
/// # Errors
/// The refusal.
pub fn hook_diff(before: &str, after: &str) -> Result<String, Refusal> {
    let edits = diff_answer(before, after)?;
    if edits.is_empty() {
        return Ok("no change\n".into());
    }
    Ok(edits.iter().map(|e| format!("{e}\n")).collect())
}
