//! A small element tree for the XML the labeller reads (libvirt's `cpu_map`) and writes (the
//! node-labeller files): [`parse`] builds it with quick-xml's reader, [`Element::render`] writes
//! it with every attribute value and text escaped, so no probed value (a QEMU model name, a sysfs
//! string) can break out of its attribute or element.

use std::collections::BTreeMap;

use quick_xml::events::Event;
use quick_xml::Reader;

/// One element: its name, attributes in document order, child elements and trimmed text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Element {
    /// Tag name (`feature`, `cpuid`).
    pub name: String,
    /// Attributes as written (`name='fpu'`), in order.
    pub attrs: Vec<(String, String)>,
    /// Child elements, in order.
    pub children: Vec<Element>,
    /// Text content, trimmed; entity references resolved.
    pub text: String,
}

impl Element {
    /// An element with no attributes, children or text.
    pub fn new(name: &str) -> Self {
        Element {
            name: name.to_owned(),
            ..Default::default()
        }
    }

    /// Adds an attribute (builder style).
    pub fn attr(mut self, key: &str, value: impl Into<String>) -> Self {
        self.attrs.push((key.to_owned(), value.into()));
        self
    }

    /// Adds a child (builder style).
    pub fn child(mut self, child: Element) -> Self {
        self.children.push(child);
        self
    }

    /// Adds children (builder style).
    pub fn children(mut self, children: impl IntoIterator<Item = Element>) -> Self {
        self.children.extend(children);
        self
    }

    /// Sets the text (builder style).
    pub fn text(mut self, text: impl Into<String>) -> Self {
        self.text = text.into();
        self
    }

    /// The value of attribute `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The children named `name`.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The document: this element indented by two spaces a level, attribute values in single
    /// quotes as libvirt writes them, ending with a newline.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_into(&mut out, 0);
        out
    }

    fn render_into(&self, out: &mut String, depth: usize) {
        for _ in 0..depth {
            out.push_str("  ");
        }
        out.push('<');
        out.push_str(&self.name);
        for (k, v) in &self.attrs {
            out.push(' ');
            out.push_str(k);
            out.push_str("='");
            out.push_str(&escape(v));
            out.push('\'');
        }
        if self.children.is_empty() && self.text.is_empty() {
            out.push_str("/>\n");
            return;
        }
        out.push('>');
        if self.children.is_empty() {
            out.push_str(&escape(&self.text));
        } else {
            out.push('\n');
            for c in &self.children {
                c.render_into(out, depth + 1);
            }
            for _ in 0..depth {
                out.push_str("  ");
            }
        }
        out.push_str("</");
        out.push_str(&self.name);
        out.push_str(">\n");
    }
}

/// `s` with `& < > ' "` replaced by their entities (valid in attribute values and text).
fn escape(s: &str) -> String {
    quick_xml::escape::escape(s)
        .replace('\'', "&apos;")
        .replace('"', "&quot;")
}

/// Why a document could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(String);

/// Parses `text` into its root element. Comments, processing instructions and the declaration
/// are skipped. Errors: malformed XML, or no root element.
pub fn parse(text: &str) -> Result<Element, ParseError> {
    let mut reader = Reader::from_str(text);
    let mut stack: Vec<Element> = vec![Element::default()];
    loop {
        let ev = reader
            .read_event()
            .map_err(|e| ParseError(format!("at byte {}: {e}", reader.buffer_position())))?;
        let empty = matches!(ev, Event::Empty(_));
        match ev {
            Event::Start(e) | Event::Empty(e) => {
                let mut el = Element::new(e.name().as_ref());
                let mut seen = BTreeMap::new();
                for a in e.attributes() {
                    let a = a.map_err(|e| ParseError(format!("attribute: {e}")))?;
                    let key = a.key.as_ref().to_string();
                    let value = a
                        .normalized_value(quick_xml::XmlVersion::Implicit1_0)
                        .map_err(|e| ParseError(format!("attribute {key}: {e}")))?
                        .into_owned();
                    if seen.insert(key.clone(), ()).is_none() {
                        el.attrs.push((key, value));
                    }
                }
                if empty {
                    if let Some(top) = stack.last_mut() {
                        top.children.push(el);
                    }
                } else {
                    stack.push(el);
                }
            }
            Event::Text(t) => {
                let s = t.xml10_content();
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(s.trim());
                }
            }
            Event::GeneralRef(r) => {
                let name = r.xml10_content();
                let c = match name.as_ref() {
                    "amp" => "&",
                    "lt" => "<",
                    "gt" => ">",
                    "quot" => "\"",
                    "apos" => "'",
                    other => return Err(ParseError(format!("unknown entity &{other};"))),
                };
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(c);
                }
            }
            Event::End(_) => {
                if stack.len() < 2 {
                    return Err(ParseError("unbalanced end tag".into()));
                }
                let el = stack.pop().unwrap_or_default();
                if let Some(top) = stack.last_mut() {
                    top.children.push(el);
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if stack.len() != 1 {
        return Err(ParseError("unclosed element".into()));
    }
    stack
        .pop()
        .and_then(|mut doc| (!doc.children.is_empty()).then(|| doc.children.remove(0)))
        .ok_or_else(|| ParseError("no root element".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_escapes() {
        let doc = Element::new("cpu")
            .attr("mode", "custom")
            .child(
                Element::new("model")
                    .attr("fallback", "forbid")
                    .text("a<b&'c\""),
            )
            .child(Element::new("feature").attr("name", "x' y='z"));
        let text = doc.render();
        assert_eq!(
            text,
            "<cpu mode='custom'>\n  <model fallback='forbid'>a&lt;b&amp;&apos;c&quot;</model>\n  \
             <feature name='x&apos; y=&apos;z'/>\n</cpu>\n"
        );
        assert_eq!(parse(&text).unwrap(), doc);
    }

    #[test]
    fn rejects_what_is_not_one_document() {
        assert!(parse("").is_err());
        assert!(parse("<a><b></a>").is_err());
        assert!(parse("<a>").is_err());
        assert!(parse("<a>&bogus;</a>").is_err());
        let a = parse("<?xml version='1.0'?><!-- c --><a x='1'><b/>t</a>").unwrap();
        assert_eq!(
            (a.get("x"), a.children.len(), a.text.as_str()),
            (Some("1"), 1, "t")
        );
    }
}
