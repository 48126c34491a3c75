//! The domain XML a hook sidecar's `OnDefineDomain` sees and what its answer may change.
//!
//! KubeVirt sends `xml.MarshalIndent(api.DomainSpec, "", "\t")` (`pkg/hooks/manager.go`,
//! `onDefineDomainCallback`, v1.9.0): Go's `encoding/xml` text form, which scripts that `sed` the
//! XML depend on. [`go_xml`] prints the exporter's model that way: tab indent, no declaration,
//! empty elements as a start/end pair (`<baseBoard></baseBoard>`), attributes in the schema's
//! (Go struct) order, and Go's escaping (`"` as `&#34;`, `'` as `&#39;`, tab/LF/CR as character
//! references). [`kubevirt_input`] adds the empty `<bios>`, `<baseBoard>` and `<chassis>` KubeVirt
//! always writes.
//!
//! The answer is untrusted: [`diff_answer`] parses it namespace-aware ([`parse`]: size and depth
//! bounded, prefixes resolved, so ElementTree's `ns0:commandline` is `qemu:commandline`; an
//! unbound `qemu:` prefix, as Go `api.DomainSpec` hooks write it, is read as libvirt's QEMU
//! namespace), compares it with what was sent, and turns each difference into a typed
//! [`HookEdit`] or a [`Refusal`] naming the element path and both values. Tier 1 of the mapping
//! (`../shared/reference/kubevirt-hook-sidecars.md` §4.5): `qemu:commandline` args and env,
//! SMBIOS `sysinfo` types 0, 1, 2, 3, 11, `os/smbios@mode` `sysinfo`/`emulate`. Everything else
//! that differs is refused.

use std::collections::BTreeMap;

use qlauncher_core::cmdline::plan::SmbiosTable;
use qlauncher_core::cmdline::DomainPlan;
use quick_xml::events::{BytesStart, Event};
use quick_xml::name::ResolveResult;
use quick_xml::{NsReader, Reader};

use crate::golden::{diff, Node};
use crate::schema::{Device, DiskSource, Domain, Entries};
use crate::CompatError;

/// libvirt's QEMU namespace (`<qemu:commandline>`).
pub const QEMU_NS: &str = "http://libvirt.org/schemas/domain/qemu/1.0";
/// KubeVirt's metadata namespace (`<metadata><kubevirt xmlns=..>`).
pub const KUBEVIRT_NS: &str = "http://kubevirt.io";
/// Largest hook answer read (bytes); a domain XML is tens of KiB.
pub const MAX_ANSWER_BYTES: usize = 4 << 20;
/// Deepest element nesting read (a domain XML nests 7 levels).
pub const MAX_DEPTH: usize = 32;
/// Most elements read from one answer.
pub const MAX_ELEMENTS: usize = 100_000;
/// Longest SMBIOS string accepted from a hook (QEMU's SMBIOS strings are bytes up to 255 in a
/// table's string area).
pub const MAX_SMBIOS_TEXT: usize = 255;

/// The domain printed as Go's `xml.MarshalIndent(v, "", "\t")` prints KubeVirt's `api.DomainSpec`.
///
/// # Errors
/// The serializer's error when the model cannot be written.
pub fn go_xml(domain: &Domain) -> Result<String, CompatError> {
    let mut flat = String::new();
    let ser = quick_xml::se::Serializer::new(&mut flat);
    serde::Serialize::serialize(domain, ser).map_err(CompatError::SerializeXml)?;
    Ok(go_print(&flat))
}

/// The hook input for `domain`: [`go_xml`] of the domain with KubeVirt's always-present empty
/// SMBIOS sections (`api.SysInfo`'s `bios>entry`, `baseBoard>entry`, `chassis>entry` tags make Go
/// write `<bios></bios><baseBoard></baseBoard><chassis></chassis>` even when empty).
/// It holds only what `api.DomainSpec` carries (no `GO_LACKS` entry), as the text KubeVirt
/// sends does; `tests/hook_input.rs` checks it byte for byte against Go's own output.
///
/// # Errors
/// As [`go_xml`].
pub fn kubevirt_input(domain: &Domain) -> Result<String, CompatError> {
    let mut d = domain.clone();
    // `api.Disk.Source` is a struct, not a pointer: Go writes `<source></source>` for an empty
    // cdrom too.
    for dev in &mut d.devices.items {
        // KubeVirt's `accessMode` (which libvirt ignores) and the always-written `dir`.
        if let Device::Filesystem(fs) = dev {
            fs.access_mode = Some("passthrough".into());
            fs.source.dir.get_or_insert_with(String::new);
        }
        if let Device::Disk(disk) = dev {
            disk.source.get_or_insert(DiskSource {
                file: None,
                dev: None,
                name: None,
            });
        }
    }
    if let Some(s) = d.sysinfo.as_mut() {
        let empty = || Some(Entries { entry: Vec::new() });
        if s.bios.is_none() {
            s.bios = empty();
        }
        if s.base_board.is_none() {
            s.base_board = empty();
        }
        if s.chassis.is_none() {
            s.chassis = empty();
        }
    }
    go_xml(&d)
}

/// What KubeVirt's `api.DomainSpec` (v1.9.0 `virtwrap/api/schema.go`) has no field for, so it is
/// never in KubeVirt's hook input: `(parent, element, attribute)`, `None` for the whole element,
/// `*` for any parent. `api.Address` has no `multifunction`, `api.ControllerTarget` only `busNr`
/// and `node` (a root port's `<target>` is an empty pair), `api.Video`, `api.SoundCard` and
/// `api.VSOCK` and `api.FilesystemDevice` no `<address>`.
const GO_LACKS: &[(&str, &str, Option<&str>)] = &[
    ("*", "address", Some("multifunction")),
    ("controller", "target", Some("chassis")),
    ("controller", "target", Some("port")),
    ("video", "address", None),
    ("sound", "address", None),
    ("vsock", "address", None),
    ("filesystem", "address", None),
];

fn go_lacks(parent: Option<&str>, element: &str, attribute: Option<&str>) -> bool {
    GO_LACKS
        .iter()
        .any(|(p, e, a)| (*p == "*" || Some(*p) == parent) && *e == element && *a == attribute)
}

/// Re-prints the serializer's flat output in Go's form (the serializer's own attribute order is
/// kept: it is the schema's, i.e. Go's struct order), without what [`GO_LACKS`] lists.
fn go_print(flat: &str) -> String {
    let mut reader = Reader::from_str(flat);
    let mut out = String::with_capacity(flat.len() * 2);
    let mut depth = 0usize;
    // Element names from the root, and how deep inside a left-out element the reader is.
    let mut names: Vec<String> = Vec::new();
    let mut skipping = 0usize;
    // Go's printer state (`encoding/xml` `printer.writeIndent`).
    let mut indented_in = false;
    let mut put_newline = false;
    let mut indent = |out: &mut String, delta: i32, depth: &mut usize| {
        if delta < 0 {
            *depth = depth.saturating_sub(1);
            if indented_in {
                indented_in = false;
                return;
            }
            indented_in = false;
        }
        if put_newline {
            out.push('\n');
        } else {
            put_newline = true;
        }
        for _ in 0..*depth {
            out.push('\t');
        }
        if delta > 0 {
            *depth += 1;
            indented_in = true;
        }
    };
    loop {
        let ev = reader.read_event();
        if skipping > 0 {
            match ev {
                Ok(Event::Start(_)) => skipping += 1,
                Ok(Event::End(_)) => skipping -= 1,
                Ok(Event::Eof) | Err(_) => break,
                Ok(_) => {}
            }
            continue;
        }
        match ev {
            Ok(Event::Start(e)) => {
                let name = e.name().as_ref().to_owned();
                if go_lacks(names.last().map(String::as_str), &name, None) {
                    skipping = 1;
                    continue;
                }
                indent(&mut out, 1, &mut depth);
                start_tag(&mut out, &e, names.last().map(String::as_str));
                names.push(name);
            }
            Ok(Event::Empty(e)) => {
                let name = e.name().as_ref().to_owned();
                if go_lacks(names.last().map(String::as_str), &name, None) {
                    continue;
                }
                indent(&mut out, 1, &mut depth);
                start_tag(&mut out, &e, names.last().map(String::as_str));
                indent(&mut out, -1, &mut depth);
                out.push_str("</");
                out.push_str(&name);
                out.push('>');
            }
            Ok(Event::End(e)) => {
                names.pop();
                indent(&mut out, -1, &mut depth);
                out.push_str("</");
                out.push_str(e.name().as_ref());
                out.push('>');
            }
            Ok(Event::Text(t)) => go_escape(&mut out, &t.xml10_content()),
            Ok(Event::GeneralRef(r)) => {
                if let Some(c) = entity(&r) {
                    go_escape(&mut out, &c.to_string());
                }
            }
            Ok(Event::Eof) | Err(_) => break,
            Ok(_) => {}
        }
    }
    out
}

fn start_tag(out: &mut String, e: &BytesStart<'_>, parent: Option<&str>) {
    let name = e.name();
    out.push('<');
    out.push_str(name.as_ref());
    for a in e.attributes().flatten() {
        if go_lacks(parent, name.as_ref(), Some(a.key.as_ref())) {
            continue;
        }
        out.push(' ');
        out.push_str(a.key.as_ref());
        out.push_str("=\"");
        let v = a
            .normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map(|v| v.into_owned())
            .unwrap_or_default();
        go_escape(out, &v);
        out.push('"');
    }
    out.push('>');
}

/// Go's `xml.EscapeText` table (also used for attribute values by its printer).
fn go_escape(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\t' => out.push_str("&#x9;"),
            '\n' => out.push_str("&#xA;"),
            '\r' => out.push_str("&#xD;"),
            c if is_xml_char(c) => out.push(c),
            _ => out.push('\u{FFFD}'),
        }
    }
}

fn is_xml_char(c: char) -> bool {
    matches!(c, '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}')
}

/// The character of a predefined entity or character reference; `None` for any other entity
/// (no DTD is read, so none is defined).
fn entity(r: &quick_xml::events::BytesRef<'_>) -> Option<char> {
    if r.is_char_ref() {
        return r.resolve_char_ref().ok().flatten();
    }
    match r.xml10_content().as_ref() {
        "amp" => Some('&'),
        "lt" => Some('<'),
        "gt" => Some('>'),
        "quot" => Some('"'),
        "apos" => Some('\''),
        _ => None,
    }
}

/// Why a hook answer cannot be read or run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason} (sent {sent:?}, answered {answered:?})")]
pub struct Refusal {
    /// The element path, in `golden::diff`'s form (`domain/devices/disk[ua-x]/driver@cache`).
    pub path: String,
    /// What qlauncher sent there (`-` when absent).
    pub sent: String,
    /// What the hook answered (`-` when absent).
    pub answered: String,
    /// Why it is refused.
    pub reason: String,
}

impl Refusal {
    fn whole(reason: impl Into<String>) -> Self {
        Refusal {
            path: "domain".into(),
            sent: "-".into(),
            answered: "-".into(),
            reason: reason.into(),
        }
    }
}

/// Parses domain XML namespace-aware into a [`Node`] tree: elements of libvirt's QEMU namespace
/// are named `qemu:<local>` whatever their prefix (and an unbound `qemu:` prefix is read as that
/// namespace), KubeVirt's metadata namespace and no namespace give the local name, any other
/// namespace `{uri}local`. Namespace declarations are not attributes. Text is trimmed.
///
/// # Errors
/// A [`Refusal`] for malformed XML, an answer over [`MAX_ANSWER_BYTES`], nesting deeper than
/// [`MAX_DEPTH`], more than [`MAX_ELEMENTS`] elements, an undefined entity, or no root element.
pub fn parse(xml: &str) -> Result<Node, Refusal> {
    if xml.len() > MAX_ANSWER_BYTES {
        return Err(Refusal::whole(format!(
            "the answer has {} bytes, more than {MAX_ANSWER_BYTES}",
            xml.len()
        )));
    }
    let mut reader = NsReader::from_str(xml);
    let mut stack: Vec<Node> = vec![Node::default()];
    let mut elements = 0usize;
    loop {
        let (ns, ev) = reader
            .read_resolved_event()
            .map_err(|e| Refusal::whole(format!("malformed XML: {e}")))?;
        let empty = matches!(ev, Event::Empty(_));
        match ev {
            Event::Start(e) | Event::Empty(e) => {
                elements += 1;
                if elements > MAX_ELEMENTS {
                    return Err(Refusal::whole(format!("more than {MAX_ELEMENTS} elements")));
                }
                if stack.len() > MAX_DEPTH {
                    return Err(Refusal::whole(format!(
                        "elements nested deeper than {MAX_DEPTH}"
                    )));
                }
                let local = e.local_name().as_ref().to_owned();
                let name = match &ns {
                    ResolveResult::Bound(n) if n.as_ref() == QEMU_NS => {
                        format!("qemu:{local}")
                    }
                    ResolveResult::Bound(n) if n.as_ref() == KUBEVIRT_NS => local,
                    ResolveResult::Bound(n) => {
                        format!("{{{}}}{local}", n.as_ref())
                    }
                    ResolveResult::Unknown(p) if p == "qemu" => format!("qemu:{local}"),
                    ResolveResult::Unknown(p) => {
                        return Err(Refusal::whole(format!(
                            "element {p}:{local} uses an undeclared prefix"
                        )))
                    }
                    ResolveResult::Unbound => local,
                };
                let mut n = Node {
                    name,
                    ..Default::default()
                };
                for a in e.attributes() {
                    let a = a.map_err(|e| Refusal::whole(format!("malformed attribute: {e}")))?;
                    let key = a.key.as_ref().to_owned();
                    if key == "xmlns" || key.starts_with("xmlns:") {
                        continue;
                    }
                    let v = a
                        .normalized_value(quick_xml::XmlVersion::Implicit1_0)
                        .map_err(|e| Refusal::whole(format!("attribute {key}: {e}")))?
                        .into_owned();
                    n.attrs.insert(key, v);
                }
                if empty {
                    if let Some(top) = stack.last_mut() {
                        top.children.push(n);
                    }
                } else {
                    stack.push(n);
                }
            }
            Event::Text(t) => {
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(&t.xml10_content());
                }
            }
            Event::CData(t) => {
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(&t);
                }
            }
            Event::GeneralRef(r) => {
                let c = entity(&r)
                    .ok_or_else(|| Refusal::whole(format!("undefined entity &{};", &*r)))?;
                if let Some(top) = stack.last_mut() {
                    top.text.push(c);
                }
            }
            Event::DocType(_) => return Err(Refusal::whole("a DOCTYPE is not accepted")),
            Event::End(_) => {
                if stack.len() < 2 {
                    return Err(Refusal::whole("malformed XML: unbalanced end tag"));
                }
                if let Some(mut n) = stack.pop() {
                    n.text = n.text.trim().to_owned();
                    if let Some(top) = stack.last_mut() {
                        top.children.push(n);
                    }
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if stack.len() != 1 {
        return Err(Refusal::whole("malformed XML: unclosed element"));
    }
    let mut root = stack.pop().unwrap_or_default();
    if root.children.len() != 1 || root.children[0].name != "domain" {
        return Err(Refusal::whole("the answer is not one <domain> element"));
    }
    Ok(root.children.remove(0))
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
}

impl std::fmt::Display for HookEdit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HookEdit::Args(a) => write!(f, "qemu:commandline args {a:?}"),
            HookEdit::Env(e) => write!(f, "qemu:commandline env {e:?}"),
            HookEdit::Smbios { table, fields } => write!(f, "smbios type {table} {fields:?}"),
            HookEdit::SmbiosMode(m) => write!(f, "os/smbios@mode {m:?}"),
        }
    }
}

/// The libvirt `<sysinfo>` section of an SMBIOS table, and the entry names QEMU's `-smbios`
/// accepts for it (libvirt's `qemuBuildSmbiosBiosStr` and siblings; same key names).
const TABLES: [(u8, &str, &[&str]); 4] = [
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
const LAUNCHER_OPTIONS: [&str; 9] = [
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
struct Tier1 {
    args: Vec<String>,
    env: Vec<(String, String)>,
    mode: Option<String>,
    /// `(section, entries)`: name (empty for `oemStrings`) and value, in order, empty values
    /// dropped.
    sections: BTreeMap<String, Vec<(String, String)>>,
}

/// Takes the tier-1 elements out of `d` (so the rest can be compared as a whole).
fn take_tier1(d: &mut Node) -> Tier1 {
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
        for (i, a) in t1.args.iter().enumerate() {
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

fn check_text(path: &str, sent: &str, value: &str) -> Result<(), Refusal> {
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

#[cfg(test)]
mod tests {
    use super::*;

    const SENT: &str = "<domain type=\"kvm\" xmlns:qemu=\"http://libvirt.org/schemas/domain/qemu/1.0\">\n\t<name>ns_vm</name>\n\t<os>\n\t\t<type arch=\"x86_64\" machine=\"q35\">hvm</type>\n\t\t<smbios mode=\"sysinfo\"></smbios>\n\t</os>\n\t<sysinfo type=\"smbios\">\n\t\t<system>\n\t\t\t<entry name=\"uuid\">u-1</entry>\n\t\t\t<entry name=\"manufacturer\"></entry>\n\t\t</system>\n\t\t<bios></bios>\n\t\t<baseBoard></baseBoard>\n\t\t<chassis></chassis>\n\t</sysinfo>\n\t<devices>\n\t\t<disk device=\"disk\" type=\"file\">\n\t\t\t<driver cache=\"none\" name=\"qemu\"></driver>\n\t\t\t<alias name=\"ua-root\"></alias>\n\t\t</disk>\n\t</devices>\n</domain>";

    #[test]
    fn a_sed_on_base_board_is_an_smbios_edit() {
        let answer = SENT.replace(
            "<baseBoard></baseBoard>",
            "<baseBoard><entry name=\"manufacturer\">Radical Edward</entry></baseBoard>",
        );
        let edits = diff_answer(SENT, &answer).unwrap();
        assert_eq!(
            edits,
            vec![HookEdit::Smbios {
                table: 2,
                fields: vec![("manufacturer", "Radical Edward".into())]
            }]
        );
    }

    #[test]
    fn no_op_rewrites_are_no_change() {
        // ElementTree's form: own prefix, self-closing, no indent.
        let et = "<domain xmlns:ns0=\"http://libvirt.org/schemas/domain/qemu/1.0\" type=\"kvm\"><name>ns_vm</name><os><type arch=\"x86_64\" machine=\"q35\">hvm</type><smbios mode=\"sysinfo\"/></os><sysinfo type=\"smbios\"><system><entry name=\"uuid\">u-1</entry><entry name=\"manufacturer\"/></system><bios/><baseBoard/><chassis/></sysinfo><devices><disk type=\"file\" device=\"disk\"><driver name=\"qemu\" cache=\"none\"/><alias name=\"ua-root\"/></disk></devices></domain>";
        assert_eq!(diff_answer(SENT, et).unwrap(), vec![]);
        assert_eq!(diff_answer(SENT, SENT).unwrap(), vec![]);
    }

    /// Only the listed meaningless forms are one: an empty interface `<source>` may go, a
    /// `<readonly/>` may not; `slots="0"` may go, `slots="1"` may not.
    #[test]
    fn only_meaningless_differences_are_normalized() {
        let sent = "<domain type=\"kvm\"><maxMemory slots=\"0\">1</maxMemory><devices><interface type=\"ethernet\"><source></source><alias name=\"ua-a\"></alias></interface><disk device=\"cdrom\" type=\"file\"><readonly></readonly><alias name=\"ua-c\"></alias></disk></devices></domain>";
        let same = "<domain type=\"kvm\"><maxMemory>1</maxMemory><devices><interface type=\"ethernet\"><alias name=\"ua-a\"/></interface><disk device=\"cdrom\" type=\"file\"><readonly/><alias name=\"ua-c\"/></disk></devices></domain>";
        assert_eq!(diff_answer(sent, same).unwrap(), vec![]);
        let writable = same.replace("<readonly/>", "");
        assert!(diff_answer(sent, &writable).is_err());
        let slots = same.replace("<maxMemory>", "<maxMemory slots=\"1\">");
        assert_eq!(
            diff_answer(sent, &slots).unwrap_err().path,
            "domain/maxMemory@slots"
        );
    }

    #[test]
    fn commandline_args_are_words_and_prefixes_resolve() {
        let answer = SENT.replace(
            "</devices>",
            "</devices><ns0:commandline xmlns:ns0=\"http://libvirt.org/schemas/domain/qemu/1.0\"><ns0:arg value=\"-device\"/><ns0:arg value=\"pvpanic,ioport=1285\"/><ns0:env name=\"FOO\" value=\"a b\"/></ns0:commandline>",
        );
        let edits = diff_answer(SENT, &answer).unwrap();
        assert_eq!(
            edits,
            vec![
                HookEdit::Args(vec!["-device".into(), "pvpanic,ioport=1285".into()]),
                HookEdit::Env(vec![("FOO".into(), "a b".into())]),
            ]
        );
        // Go api.DomainSpec hooks drop xmlns:qemu: the bare prefix still means QEMU's.
        let bare = "<domain type=\"kvm\"><name>ns_vm</name><os><type arch=\"x86_64\" machine=\"q35\">hvm</type><smbios mode=\"sysinfo\"/></os><sysinfo type=\"smbios\"><system><entry name=\"uuid\">u-1</entry></system></sysinfo><devices><disk type=\"file\" device=\"disk\"><driver name=\"qemu\" cache=\"none\"/><alias name=\"ua-root\"/></disk></devices><qemu:commandline><qemu:arg value=\"-S\"/></qemu:commandline></domain>";
        assert_eq!(
            diff_answer(SENT, bare).unwrap(),
            vec![HookEdit::Args(vec!["-S".into()])]
        );
    }

    #[test]
    fn refusals_name_the_path_and_both_values() {
        let answer = SENT.replace("cache=\"none\"", "cache=\"writeback\"");
        let r = diff_answer(SENT, &answer).unwrap_err();
        assert_eq!(r.path, "domain/devices/disk[ua-root]/driver@cache");
        assert_eq!(
            (r.sent.as_str(), r.answered.as_str()),
            ("none", "writeback")
        );
        let answer = SENT.replace(
            "</devices>",
            "</devices><qemu:commandline><qemu:arg value=\"-incoming\"/></qemu:commandline>",
        );
        let r = diff_answer(SENT, &answer).unwrap_err();
        assert!(r.path.contains("qemu:arg[0]"), "{r}");
        let answer = SENT.replace("u-1", "u-2");
        let r = diff_answer(SENT, &answer).unwrap_err();
        assert_eq!(r.path, "domain/sysinfo/system/entry[uuid]#text");
        let answer = SENT.replace("<bios></bios>", "<bios><entry name=\"x\">1</entry></bios>");
        assert!(diff_answer(SENT, &answer).is_err());
        let answer = SENT.replace("mode=\"sysinfo\"", "mode=\"host\"");
        assert_eq!(
            diff_answer(SENT, &answer).unwrap_err().path,
            "domain/os/smbios@mode"
        );
    }

    #[test]
    fn hostile_answers_are_refused_not_crashed() {
        let deep = format!("{}{}", "<a>".repeat(10_000), "</a>".repeat(10_000));
        assert!(diff_answer(SENT, &deep).is_err());
        let huge = format!("<domain>{}</domain>", "x".repeat(MAX_ANSWER_BYTES + 1));
        assert!(diff_answer(SENT, &huge).is_err());
        for bad in [
            "",
            "<domain>",
            "<domain></other>",
            "<!DOCTYPE d [<!ENTITY x \"y\">]><domain>&x;</domain>",
            "<domain>&x;</domain>",
            "<domain/><domain/>",
            "<x:domain/>",
            "\u{0}",
        ] {
            assert!(diff_answer(SENT, bad).is_err(), "{bad:?}");
        }
        let ctl = SENT.replace(
            "<baseBoard></baseBoard>",
            "<baseBoard><entry name=\"serial\">a&#xA;b</entry></baseBoard>",
        );
        assert!(diff_answer(SENT, &ctl).is_err());
    }

    #[test]
    fn go_escaping_and_empty_pairs() {
        let mut s = String::new();
        go_escape(&mut s, "a\"b'c&<>\t\n\r\u{1}");
        assert_eq!(s, "a&#34;b&#39;c&amp;&lt;&gt;&#x9;&#xA;&#xD;\u{FFFD}");
        let p = go_print("<a x=\"1\"><b/><c>t</c><d><e/></d></a>");
        assert_eq!(
            p,
            "<a x=\"1\">\n\t<b></b>\n\t<c>t</c>\n\t<d>\n\t\t<e></e>\n\t</d>\n</a>"
        );
    }
}
