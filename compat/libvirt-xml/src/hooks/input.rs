//! The hook input: the exporter's model printed as Go's `encoding/xml` prints KubeVirt's
//! `api.DomainSpec` ([`go_xml`], [`kubevirt_input`]).

use super::*;

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
                data_store: None,
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
pub(super) const GO_LACKS: &[(&str, &str, Option<&str>)] = &[
    ("*", "address", Some("multifunction")),
    ("controller", "target", Some("chassis")),
    ("controller", "target", Some("port")),
    ("video", "address", None),
    ("sound", "address", None),
    ("vsock", "address", None),
    ("filesystem", "address", None),
];

pub(super) fn go_lacks(parent: Option<&str>, element: &str, attribute: Option<&str>) -> bool {
    GO_LACKS
        .iter()
        .any(|(p, e, a)| (*p == "*" || Some(*p) == parent) && *e == element && *a == attribute)
}

/// Re-prints the serializer's flat output in Go's form (the serializer's own attribute order is
/// kept: it is the schema's, i.e. Go's struct order), without what [`GO_LACKS`] lists.
pub(super) fn go_print(flat: &str) -> String {
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

pub(super) fn start_tag(out: &mut String, e: &BytesStart<'_>, parent: Option<&str>) {
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
pub(super) fn go_escape(out: &mut String, s: &str) {
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

pub(super) fn is_xml_char(c: char) -> bool {
    matches!(c, '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}')
}

/// The character of a predefined entity or character reference; `None` for any other entity
/// (no DTD is read, so none is defined).
pub(super) fn entity(r: &quick_xml::events::BytesRef<'_>) -> Option<char> {
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
