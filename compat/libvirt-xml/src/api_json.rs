//! The second renderer of the exported domain: KubeVirt's `api.DomainSpec` JSON.
//!
//! virt-launcher reads libvirt's domain XML into Go structs (`pkg/virt-launcher/virtwrap/api/
//! schema.go`) and sends them to virt-handler as JSON; the Go structs carry no `json` tags, so the
//! JSON keys are the Go field names (`Devices.Disks[].Target.Device`), and each value has its Go
//! field's kind (a number for `Memory.Value`, a string for `Controller.Index`). [`to_api_spec`] does
//! the same from the [`schema::Domain`] that [`to_xml`](crate::to_xml)
//! writes as XML: one model, two renderers. The mapping is the table in `go_fields.rs` (KubeVirt's
//! field names and kinds per Go struct); an element or attribute the table does not know is left
//! out and listed in [`ApiSpec::dropped`], so virt-handler's decoder never meets an unknown field
//! or a value of the wrong kind.
//!
//! `Alias` is KubeVirt's custom JSON: `<alias name="ua-disk0"/>` becomes
//! `{"Name": "disk0", "UserDefined": true}`.

use crate::go_fields::GO_FIELDS;
use crate::schema;
use crate::CompatError;
use serde_json::{Map, Number, Value};

/// The JSON kind of one Go field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `string` (and string-based Go types).
    Str,
    /// Any Go integer type: a JSON number.
    Int,
    /// `bool`.
    Bool,
    /// KubeVirt's `Alias` (custom JSON).
    Alias,
    /// A Go struct, by name (a key of the table).
    Struct(&'static str),
}

/// One row of the table: field `field` of Go struct `go_type` is XML `xml` (`@attr`, `$text`,
/// `elem`, or `parent>elem` for a nested list).
#[derive(Debug)]
pub(crate) struct GoField {
    pub(crate) go_type: &'static str,
    pub(crate) xml: &'static str,
    pub(crate) field: &'static str,
    pub(crate) list: bool,
    pub(crate) kind: Kind,
}

/// KubeVirt's `api.Alias` prefix for user-defined aliases (`UserAliasPrefix`).
pub const USER_ALIAS_PREFIX: &str = "ua-";

/// An `api.DomainSpec` in JSON and what of the XML model it could not carry.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiSpec {
    /// `{"Type": "kvm", "Name": ..., "Devices": {...}, ...}`.
    pub spec: Map<String, Value>,
    /// XML paths (`domain/devices/disk/@foo`) the Go structs have no field for. Namespace
    /// declarations (`@xmlns`, `@xmlns:qemu` on elements without the field) are not listed.
    pub dropped: Vec<String>,
}

/// Renders `domain` as KubeVirt's `api.DomainSpec` JSON.
///
/// # Errors
/// [`CompatError::SerializeJson`] when the model does not serialise (it always does for models the
/// exporter builds).
pub fn to_api_spec(domain: &schema::Domain) -> Result<ApiSpec, CompatError> {
    let tree = serde_json::to_value(domain).map_err(CompatError::SerializeJson)?;
    let mut dropped = Vec::new();
    let spec = match render_struct("DomainSpec", &tree, "domain", &mut dropped) {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    Ok(ApiSpec { spec, dropped })
}

/// Renders a libvirt domain XML document (KubeVirt's expected converter output, or a domain libvirt
/// reports) as `api.DomainSpec` JSON, through the same table: what virt-launcher would send for it.
///
/// # Errors
/// [`CompatError::ParseXml`] for malformed XML.
pub fn xml_to_api_spec(xml: &str) -> Result<ApiSpec, CompatError> {
    let root = crate::golden::parse(xml, "domain XML")?;
    let mut dropped = Vec::new();
    let spec = match render_struct("DomainSpec", &node_tree(&root), "domain", &mut dropped) {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    Ok(ApiSpec { spec, dropped })
}

/// The serialised shape of a parsed element: `@attr` strings, `$text`, children as arrays.
fn node_tree(node: &crate::golden::Node) -> Value {
    let mut map = Map::new();
    for (key, value) in &node.attrs {
        map.insert(format!("@{key}"), Value::String(value.clone()));
    }
    if !node.text.is_empty() {
        map.insert("$text".to_owned(), Value::String(node.text.clone()));
    }
    for child in &node.children {
        let entry = map
            .entry(child.name.clone())
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(items) = entry {
            items.push(node_tree(child));
        }
    }
    Value::Object(map)
}

/// The key paths of a JSON spec, list elements written `[]`: `Devices.Disks[].Target.Device`.
/// For comparing which elements two domains carry.
pub fn key_paths(spec: &Map<String, Value>) -> std::collections::BTreeSet<String> {
    fn walk(prefix: &str, value: &Value, out: &mut std::collections::BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    let path = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    out.insert(path.clone());
                    walk(&path, child, out);
                }
            }
            Value::Array(items) => {
                let path = format!("{prefix}[]");
                for item in items {
                    walk(&path, item, out);
                }
            }
            _ => {}
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk("", &Value::Object(spec.clone()), &mut out);
    out
}

/// The children of one serialised element, by XML key, in document order. `$value` lists
/// (differently named children) and arrays (repeated children) are flattened.
fn children(element: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    match element {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("$value", Value::Array(items)) => {
                        for item in items {
                            if let Value::Object(variant) = item {
                                for (name, inner) in variant {
                                    out.push((name.clone(), inner));
                                }
                            }
                        }
                    }
                    (_, Value::Array(items)) if !key.starts_with('@') => {
                        out.extend(items.iter().map(|item| (key.clone(), item)));
                    }
                    _ => out.push((key.clone(), value)),
                }
            }
        }
        // An element with only text content serialises as its value.
        Value::Null => {}
        scalar => out.push(("$text".to_owned(), scalar)),
    }
    out
}

fn fields_of(go_type: &str) -> &'static [GoField] {
    let start = GO_FIELDS.partition_point(|f| f.go_type < go_type);
    let end = GO_FIELDS.partition_point(|f| f.go_type <= go_type);
    &GO_FIELDS[start..end]
}

fn render_struct(go_type: &str, element: &Value, path: &str, dropped: &mut Vec<String>) -> Value {
    let fields = fields_of(go_type);
    let kids = children(element);
    let mut out = Map::new();
    for (key, _) in &kids {
        let known = fields
            .iter()
            .any(|f| f.xml == key || f.xml.split('>').next() == Some(key.as_str()));
        if !known && !key.starts_with("@xmlns") {
            let entry = format!("{path}/{key}");
            if !dropped.contains(&entry) {
                dropped.push(entry);
            }
        }
    }
    for field in fields {
        let (outer, inner) = match field.xml.split_once('>') {
            Some((outer, inner)) => (outer, Some(inner)),
            None => (field.xml, None),
        };
        let mut values: Vec<&Value> = kids
            .iter()
            .filter(|(key, _)| key == outer)
            .map(|(_, value)| *value)
            .collect();
        if let Some(inner) = inner {
            values = values
                .into_iter()
                .flat_map(|v| {
                    children(v)
                        .into_iter()
                        .filter(|(key, _)| key == inner)
                        .map(|(_, value)| value)
                        .collect::<Vec<_>>()
                })
                .collect();
        }
        let child_path = format!("{path}/{}", field.xml);
        let mut rendered = values
            .into_iter()
            .filter_map(|v| render_value(field.kind, v, &child_path, dropped));
        if field.list {
            // An empty list is Go's nil slice: left out, as absent.
            let list: Vec<Value> = rendered.collect();
            if !list.is_empty() {
                out.insert(field.field.to_owned(), Value::Array(list));
            }
        } else if let Some(value) = rendered.next() {
            out.insert(field.field.to_owned(), value);
        }
    }
    Value::Object(out)
}

fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Object(map) => map.get("$text").and_then(scalar_text),
        _ => None,
    }
}

fn render_value(kind: Kind, value: &Value, path: &str, dropped: &mut Vec<String>) -> Option<Value> {
    match kind {
        Kind::Str => Some(Value::String(scalar_text(value).unwrap_or_default())),
        Kind::Int => {
            let text = scalar_text(value)?;
            let number = text
                .parse::<u64>()
                .map(Number::from)
                .or_else(|_| text.parse::<i64>().map(Number::from))
                .ok();
            if number.is_none() {
                dropped.push(format!("{path}={text}"));
            }
            number.map(Value::Number)
        }
        Kind::Bool => {
            let text = scalar_text(value)?;
            Some(Value::Bool(matches!(text.as_str(), "true" | "yes" | "on")))
        }
        Kind::Alias => {
            let name = value.get("@name").and_then(scalar_text)?;
            let (name, user_defined) = match name.strip_prefix(USER_ALIAS_PREFIX) {
                Some(stripped) => (stripped.to_owned(), true),
                None => (name, false),
            };
            Some(serde_json::json!({"Name": name, "UserDefined": user_defined}))
        }
        Kind::Struct(go_type) => Some(render_struct(go_type, value, path, dropped)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_for_lookup() {
        assert!(GO_FIELDS
            .windows(2)
            .all(|w| (w[0].go_type, w[0].xml) <= (w[1].go_type, w[1].xml)));
        assert!(fields_of("Disk").iter().any(|f| f.field == "Target"));
        assert!(fields_of("NoSuchType").is_empty());
    }

    #[test]
    fn values_take_their_go_kind() {
        let mut dropped = Vec::new();
        let memory = serde_json::json!({"@unit": "b", "$text": 8388608});
        assert_eq!(
            render_struct("Memory", &memory, "domain/memory", &mut dropped),
            serde_json::json!({"Unit": "b", "Value": 8388608})
        );
        let controller = serde_json::json!({"@type": "usb", "@index": 0, "@model": "none"});
        assert_eq!(
            render_struct("Controller", &controller, "c", &mut dropped),
            serde_json::json!({"Type": "usb", "Index": "0", "Model": "none"})
        );
        assert!(dropped.is_empty(), "{dropped:?}");
    }

    #[test]
    fn user_alias_loses_its_prefix() {
        let mut dropped = Vec::new();
        let alias = serde_json::json!({"@name": "ua-rootdisk"});
        assert_eq!(
            render_value(Kind::Alias, &alias, "a", &mut dropped),
            Some(serde_json::json!({"Name": "rootdisk", "UserDefined": true}))
        );
    }
}
