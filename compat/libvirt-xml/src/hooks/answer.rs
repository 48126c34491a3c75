//! Reading a hook's answer: the namespace-aware, bounded parser ([`parse`]) and the
//! [`Refusal`] that names what cannot be taken.

use super::*;

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
    parse_root(xml, "domain")
}

/// [`parse`] for a document whose one root element is `root` (libvirt's `<qemu-migration>`
/// cookie, say), with the same bounds.
///
/// # Errors
/// As [`parse`]'s, and a document that is not one `<root>` element.
pub fn parse_root(xml: &str, root: &str) -> Result<Node, Refusal> {
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
    let mut doc = stack.pop().unwrap_or_default();
    if doc.children.len() != 1 || doc.children[0].name != root {
        return Err(Refusal::whole(format!(
            "the answer is not one <{root}> element"
        )));
    }
    Ok(doc.children.remove(0))
}
