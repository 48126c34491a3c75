//! CEL conditions and mutations of VEP-190 domain hooks (KubeVirt v1.9.0
//! `pkg/virt-launcher/virtwrap/plugins/cel`), evaluated with the `cel` crate.
//!
//! What an expression sees, as in KubeVirt: two variables, `vmi` (the VirtualMachineInstance)
//! and `domainSpec` (the domain about to be defined, libvirtxml's `Domain`), both with **Go
//! field names** (KubeVirt registers the Go structs as CEL native types): `vmi.Namespace`,
//! `vmi.Labels["app"]`, `domainSpec.Type`, `domainSpec.SysInfo[0].SMBIOS.System.Entry`. A
//! condition is a `bool` expression. A mutation builds a partial `Domain` with CEL struct
//! literals in the `libvirtxml` container (`Domain{SysInfo: [DomainSysInfo{SMBIOS: ...}]}`): the
//! fields it sets replace the domain's (structs merged field by field, lists replaced whole),
//! the rest stay, as KubeVirt's `deepMerge` does.
//!
//! Where qlauncher differs, on purpose:
//! - `domainSpec` and the mutation types cover the part of libvirtxml's `Domain` qlauncher can
//!   take from a hook: `Type`, `Name`, `Memory` (read only) and `SysInfo` (SMBIOS types 0,
//!   1, 2, 3 and 11). A mutation naming any other field fails (the hook's failure strategy then
//!   decides), where KubeVirt would pass it to libvirt.
//! - `vmi` is the VMI's JSON with Go names: `ObjectMeta`'s fields at the top (`Name`,
//!   `Namespace`, `UID`, `Labels`, `Annotations`), object keys under `Spec` and `Status` with
//!   their first letter upper-cased (and `cpu`, `uid`, `uuid`, `id` as `CPU`, `UID`, `UUID`,
//!   `ID`); map-valued fields with user keys (`nodeSelector`) keep their keys. Go names that
//!   differ from that rule are not reachable.
//! - Evaluation is bounded by the expression's size ([`MAX_EXPRESSION_BYTES`]), the parser's
//!   nesting limit and a deadline ([`EVAL_TIMEOUT`]) instead of cel-go's cost limit.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cel::common::types::{self, Type};
use cel::objects::{Key, Map};
use cel::{Context, Env, StructDef, Value};
use qlauncher_libvirt_xml::schema::{Domain, Entries, Entry, OemStrings, SysInfo};

/// Longest expression evaluated (bytes).
pub const MAX_EXPRESSION_BYTES: usize = 16 << 10;
/// How long one evaluation may take.
pub const EVAL_TIMEOUT: Duration = Duration::from_secs(5);

const DOMAIN: &str = "libvirtxml.Domain";
const SYSINFO: &str = "libvirtxml.DomainSysInfo";
const SMBIOS: &str = "libvirtxml.DomainSysInfoSMBIOS";
const ENTRY: &str = "libvirtxml.DomainSysInfoEntry";
const OEM_STRINGS: &str = "libvirtxml.DomainSysInfoOEMStrings";
/// The SMBIOS sections that are a struct with an `Entry` list (libvirtxml's
/// `DomainSysInfoBIOS`, `..System`, `..BaseBoard`, `..Chassis`).
const ENTRY_SECTIONS: [&str; 4] = [
    "libvirtxml.DomainSysInfoBIOS",
    "libvirtxml.DomainSysInfoSystem",
    "libvirtxml.DomainSysInfoBaseBoard",
    "libvirtxml.DomainSysInfoChassis",
];

/// The environment: the standard library, the `libvirtxml` container and its struct types.
fn env() -> &'static Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        let structs = [
            StructDef::new(DOMAIN.into()).add_field("SysInfo".into(), types::LIST_TYPE),
            StructDef::new(SYSINFO.into())
                .add_field("SMBIOS".into(), Type::new_struct(SMBIOS.into())),
            StructDef::new(SMBIOS.into())
                .add_field("BIOS".into(), Type::new_struct(ENTRY_SECTIONS[0].into()))
                .add_field("System".into(), Type::new_struct(ENTRY_SECTIONS[1].into()))
                .add_field("BaseBoard".into(), types::LIST_TYPE)
                .add_field("Chassis".into(), Type::new_struct(ENTRY_SECTIONS[3].into()))
                .add_field("OEMStrings".into(), Type::new_struct(OEM_STRINGS.into())),
            StructDef::new(ENTRY.into())
                .add_field("Name".into(), types::STRING_TYPE)
                .add_field("File".into(), types::STRING_TYPE)
                .add_field("Value".into(), types::STRING_TYPE),
            StructDef::new(OEM_STRINGS.into()).add_field("Entry".into(), types::LIST_TYPE),
        ];
        let sections = ENTRY_SECTIONS
            .map(|name| StructDef::new(name.into()).add_field("Entry".into(), types::LIST_TYPE));
        for s in structs.into_iter().chain(sections) {
            // The names are distinct identifiers: registering cannot conflict.
            let _ = env.add_type(s);
        }
        let _ = env.set_container("libvirtxml");
        Arc::new(env)
    })
}

/// Why an expression has no usable value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    /// Longer than [`MAX_EXPRESSION_BYTES`].
    #[error("expression of {0} bytes is longer than {MAX_EXPRESSION_BYTES}")]
    TooLong(usize),
    /// Not CEL.
    #[error("compiling expression: {0}")]
    Compile(String),
    /// The evaluation failed.
    #[error("evaluating expression: {0}")]
    Eval(String),
    /// A condition that is not a `bool`.
    #[error("condition must return bool, got {0}")]
    NotBool(String),
    /// A mutation that is not a `Domain`, or that sets what qlauncher cannot take.
    #[error("mutation: {0}")]
    Mutation(String),
}

/// What an expression sees: `vmi` and `domainSpec` (see the module doc).
#[derive(Debug, Clone)]
pub struct Inputs {
    vmi: Value,
    domain: Value,
}

impl Inputs {
    /// The inputs for the VMI `vmi_json` (KubeVirt's JSON) and the domain `domain`.
    pub fn new(vmi_json: &serde_json::Value, domain: &Domain) -> Inputs {
        Inputs {
            vmi: vmi_view(vmi_json),
            domain: domain_view(domain),
        }
    }
}

fn evaluate(expr: &str, inputs: &Inputs) -> Result<Value, CelError> {
    if expr.len() > MAX_EXPRESSION_BYTES {
        return Err(CelError::TooLong(expr.len()));
    }
    let env = env();
    let program = env
        .compile(expr)
        .map_err(|e| CelError::Compile(e.to_string()))?;
    let mut ctx = Context::with_env(env.clone());
    ctx.add_variable_from_value("vmi", inputs.vmi.clone());
    ctx.add_variable_from_value("domainSpec", inputs.domain.clone());
    program
        .execute(&ctx)
        .map_err(|e| CelError::Eval(e.to_string()))
}

/// A condition (KubeVirt's `EvaluateCondition`): whether the plugin or hook applies.
///
/// # Errors
/// [`CelError`]: too long, not CEL, failing, or not a `bool`.
pub fn condition(expr: &str, inputs: &Inputs) -> Result<bool, CelError> {
    match evaluate(expr, inputs)? {
        Value::Bool(b) => Ok(b),
        other => Err(CelError::NotBool(other.type_of().to_string())),
    }
}

/// A mutation (KubeVirt's `EvaluateMutation`): `domain` with the partial `Domain` the
/// expression builds merged in.
///
/// # Errors
/// [`CelError`]: too long, not CEL, failing, not a `Domain`, or a field qlauncher cannot take.
pub fn mutation(expr: &str, inputs: &Inputs, domain: &Domain) -> Result<Domain, CelError> {
    let out = evaluate(expr, inputs)?;
    let Value::Struct(partial) = &out else {
        return Err(CelError::Mutation(format!(
            "must return a Domain object, got {}",
            out.type_of()
        )));
    };
    if partial.name() != DOMAIN {
        return Err(CelError::Mutation(format!(
            "must return a Domain object, got {}",
            partial.name()
        )));
    }
    let mut merged = domain.clone();
    for (field, value) in partial.field_values() {
        let value = Value::try_from(value.as_ref()).map_err(|e| CelError::Eval(e.to_string()))?;
        match field.as_str() {
            "SysInfo" => merged.sysinfo = sysinfo(&value).map_err(CelError::Mutation)?,
            other => {
                return Err(CelError::Mutation(format!(
                    "Domain.{other} is not supported"
                )))
            }
        }
    }
    Ok(merged)
}

/// A field of a struct literal or of an input map; `None` when not set.
fn field(v: &Value, name: &str) -> Option<Value> {
    match v {
        Value::Struct(s) => s.field_value(name).and_then(|f| Value::try_from(f).ok()),
        Value::Map(m) => m.map.get(&Key::String(Arc::new(name.to_owned()))).cloned(),
        _ => None,
    }
    .filter(|v| !matches!(v, Value::Null))
}

fn list(v: &Value, what: &str) -> Result<Vec<Value>, String> {
    match v {
        Value::List(l) => Ok(l.to_vec()),
        Value::Null => Ok(Vec::new()),
        other => Err(format!("{what} must be a list, got {}", other.type_of())),
    }
}

fn string(v: Option<Value>, what: &str) -> Result<String, String> {
    match v {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.to_string()),
        Some(other) => Err(format!("{what} must be a string, got {}", other.type_of())),
    }
}

/// `Domain.SysInfo` (a list, replaced whole): at most one SMBIOS element.
fn sysinfo(v: &Value) -> Result<Option<SysInfo>, String> {
    let mut out = None;
    for info in list(v, "SysInfo")? {
        if field(&info, "FWCfg").is_some() {
            return Err("SysInfo.FWCfg is not supported".into());
        }
        let Some(smbios) = field(&info, "SMBIOS") else {
            continue;
        };
        if out.is_some() {
            return Err("more than one SysInfo with SMBIOS".into());
        }
        for unsupported in ["Processor", "Memory"] {
            if field(&smbios, unsupported).is_some() {
                return Err(format!("SysInfo.SMBIOS.{unsupported} is not supported"));
            }
        }
        let section = |name: &str| -> Result<Option<Entries>, String> {
            field(&smbios, name).map(|s| entries(&s, name)).transpose()
        };
        let base_board = match field(&smbios, "BaseBoard") {
            None => None,
            Some(b) => {
                let boards = list(&b, "BaseBoard")?;
                if boards.len() > 1 {
                    return Err("more than one SysInfo.SMBIOS.BaseBoard".into());
                }
                boards
                    .first()
                    .map(|b| entries(b, "BaseBoard"))
                    .transpose()?
            }
        };
        let oem_strings = field(&smbios, "OEMStrings")
            .map(|o| -> Result<OemStrings, String> {
                let entry = field(&o, "Entry")
                    .map(|e| list(&e, "OEMStrings.Entry"))
                    .transpose()?
                    .unwrap_or_default()
                    .into_iter()
                    .map(|s| string(Some(s), "OEMStrings.Entry"))
                    .collect::<Result<_, _>>()?;
                Ok(OemStrings { entry })
            })
            .transpose()?;
        out = Some(SysInfo {
            type_: "smbios".into(),
            system: section("System")?.unwrap_or(Entries { entry: Vec::new() }),
            bios: section("BIOS")?,
            base_board,
            chassis: section("Chassis")?,
            oem_strings,
        });
    }
    Ok(out)
}

/// A section's `Entry` list.
fn entries(section: &Value, what: &str) -> Result<Entries, String> {
    let mut entry = Vec::new();
    for e in field(section, "Entry")
        .map(|l| list(&l, what))
        .transpose()?
        .unwrap_or_default()
    {
        if !string(field(&e, "File"), "Entry.File")?.is_empty() {
            return Err(format!("{what}.Entry.File is not supported"));
        }
        entry.push(Entry {
            name: string(field(&e, "Name"), "Entry.Name")?,
            value: string(field(&e, "Value"), "Entry.Value")?,
        });
    }
    Ok(Entries { entry })
}

fn record(fields: Vec<(&str, Value)>) -> Value {
    let map: HashMap<Key, Value> = fields
        .into_iter()
        .map(|(k, v)| (Key::String(Arc::new(k.to_owned())), v))
        .collect();
    Value::Map(Map { map: Arc::new(map) })
}

fn entries_view(e: &Entries) -> Value {
    let list: Vec<Value> = e
        .entry
        .iter()
        .map(|e| {
            record(vec![
                ("Name", e.name.as_str().into()),
                ("Value", e.value.as_str().into()),
            ])
        })
        .collect();
    record(vec![("Entry", list.into())])
}

/// `domainSpec`: libvirtxml's `Domain` field names over the model (see the module doc).
fn domain_view(d: &Domain) -> Value {
    let mut fields = vec![
        ("Type", d.type_.as_str().into()),
        ("Name", d.name.as_str().into()),
        (
            "Memory",
            record(vec![
                ("Value", Value::UInt(d.memory.value)),
                ("Unit", d.memory.unit.as_str().into()),
            ]),
        ),
    ];
    if let Some(s) = &d.sysinfo {
        let mut smbios = vec![("System", entries_view(&s.system))];
        if let Some(b) = &s.bios {
            smbios.push(("BIOS", entries_view(b)));
        }
        if let Some(b) = &s.base_board {
            smbios.push(("BaseBoard", vec![entries_view(b)].into()));
        }
        if let Some(c) = &s.chassis {
            smbios.push(("Chassis", entries_view(c)));
        }
        if let Some(o) = &s.oem_strings {
            let list: Vec<Value> = o.entry.iter().map(|s| s.as_str().into()).collect();
            smbios.push(("OEMStrings", record(vec![("Entry", list.into())])));
        }
        fields.push((
            "SysInfo",
            vec![record(vec![("SMBIOS", record(smbios))])].into(),
        ));
    }
    record(fields)
}

/// A JSON key as Go names the field (see the module doc).
fn go_name(key: &str) -> String {
    match key {
        "cpu" => "CPU".into(),
        "uid" => "UID".into(),
        "uuid" => "UUID".into(),
        "id" => "ID".into(),
        _ => {
            let mut c = key.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect())
                .unwrap_or_default()
        }
    }
}

/// JSON keys that hold user data, not Go fields: their maps keep their keys.
const USER_KEYED: [&str; 3] = ["labels", "annotations", "nodeSelector"];

fn json_view(v: &serde_json::Value, go_keys: bool) -> Value {
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => n
            .as_i64()
            .map(Value::Int)
            .or_else(|| n.as_u64().map(Value::UInt))
            .unwrap_or_else(|| Value::Float(n.as_f64().unwrap_or_default())),
        serde_json::Value::String(s) => s.as_str().into(),
        serde_json::Value::Array(a) => a
            .iter()
            .map(|v| json_view(v, go_keys))
            .collect::<Vec<_>>()
            .into(),
        serde_json::Value::Object(o) => {
            let map: HashMap<Key, Value> = o
                .iter()
                .map(|(k, v)| {
                    let name = if go_keys { go_name(k) } else { k.clone() };
                    let inner = go_keys && !USER_KEYED.contains(&k.as_str());
                    (Key::String(Arc::new(name)), json_view(v, inner))
                })
                .collect();
            Value::Map(Map { map: Arc::new(map) })
        }
    }
}

/// `vmi`: the VMI's JSON with Go names, `ObjectMeta` inlined (see the module doc).
fn vmi_view(vmi: &serde_json::Value) -> Value {
    let mut map: HashMap<Key, Value> = HashMap::new();
    if let Some(serde_json::Value::Object(o)) = vmi.get("metadata") {
        for (k, v) in o {
            let go_keys = !USER_KEYED.contains(&k.as_str());
            map.insert(Key::String(Arc::new(go_name(k))), json_view(v, go_keys));
        }
    }
    for (k, go) in [("spec", "Spec"), ("status", "Status"), ("kind", "Kind")] {
        if let Some(v) = vmi.get(k) {
            map.insert(Key::String(Arc::new(go.into())), json_view(v, true));
        }
    }
    if let Some(v) = vmi.get("apiVersion") {
        map.insert(
            Key::String(Arc::new("APIVersion".into())),
            json_view(v, true),
        );
    }
    Value::Map(Map { map: Arc::new(map) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exporter's domain of a small VMI, with one SMBIOS system entry.
    fn domain() -> Domain {
        let vmi = crate::vmi::Vmi::from_json_or_yaml(
            r#"{"metadata": {"name": "testvmi", "namespace": "default", "uid": "u-1"},
                "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}}}}"#,
        )
        .unwrap();
        let ctx = crate::cmdline::ConverterContext::default();
        let plan = crate::cmdline::convert(&vmi, &ctx).unwrap();
        let mut d = qlauncher_libvirt_xml::export(&vmi, &ctx, &plan).unwrap();
        d.sysinfo = Some(SysInfo {
            type_: "smbios".into(),
            system: Entries {
                entry: vec![Entry {
                    name: "uuid".into(),
                    value: "u-1".into(),
                }],
            },
            bios: None,
            base_board: None,
            chassis: None,
            oem_strings: None,
        });
        d
    }

    fn inputs() -> Inputs {
        let vmi = serde_json::json!({
            "metadata": {"name": "testvmi", "namespace": "default", "labels": {"app": "test"}},
            "spec": {"domain": {"cpu": {"cores": 2}}, "nodeSelector": {"kubernetes.io/arch": "amd64"}}
        });
        Inputs::new(&vmi, &domain())
    }

    /// KubeVirt's own condition cases (`plugins/cel/evaluator_test.go`), on qlauncher's view.
    #[test]
    fn conditions_see_go_names() {
        let i = inputs();
        let cases = [
            (r#"vmi.Labels["app"] == "test""#, true),
            (r#"vmi.Labels["app"] == "other""#, false),
            (r#"vmi.Namespace == "default""#, true),
            ("vmi.Spec.Domain.CPU.Cores == 2", true),
            (
                r#"vmi.Spec.NodeSelector["kubernetes.io/arch"] == "amd64""#,
                true,
            ),
            (
                r#"domainSpec.Type == "kvm" || domainSpec.Type == "qemu""#,
                true,
            ),
            ("has(domainSpec.Memory)", true),
            ("has(domainSpec.CPU)", false),
            (
                r#"domainSpec.SysInfo[0].SMBIOS.System.Entry.exists(e, e.Name == "uuid")"#,
                true,
            ),
        ];
        for (expr, want) in cases {
            assert_eq!(condition(expr, &i), Ok(want), "{expr}");
        }
        assert!(matches!(
            condition("vmi.Name", &i),
            Err(CelError::NotBool(_))
        ));
        assert!(matches!(
            condition("invalid @@@ syntax", &i),
            Err(CelError::Compile(_))
        ));
        let long = "true && ".repeat(MAX_EXPRESSION_BYTES / 8) + "true";
        assert!(matches!(condition(&long, &i), Err(CelError::TooLong(_))));
    }

    #[test]
    fn mutations_merge_sysinfo() {
        let i = inputs();
        let base = domain();
        // KubeVirt's "empty mutation is a no-op".
        assert_eq!(mutation("Domain{}", &i, &base).unwrap(), base);
        let expr = r#"Domain{SysInfo: [DomainSysInfo{SMBIOS: DomainSysInfoSMBIOS{
            System: DomainSysInfoSystem{Entry: domainSpec.SysInfo[0].SMBIOS.System.Entry +
                [DomainSysInfoEntry{Name: "serial", Value: "plugin-" + vmi.Name}]},
            BaseBoard: [DomainSysInfoBaseBoard{Entry: [DomainSysInfoEntry{Name: "product", Value: "p"}]}],
            OEMStrings: DomainSysInfoOEMStrings{Entry: ["a", "b"]}}}]}"#;
        let got = mutation(expr, &i, &base).unwrap();
        let s = got.sysinfo.as_ref().unwrap();
        let names: Vec<_> = s
            .system
            .entry
            .iter()
            .map(|e| (&*e.name, &*e.value))
            .collect();
        assert_eq!(names, [("uuid", "u-1"), ("serial", "plugin-testvmi")]);
        assert_eq!(s.base_board.as_ref().unwrap().entry[0].value, "p");
        assert_eq!(s.oem_strings.as_ref().unwrap().entry, ["a", "b"]);
        assert_eq!(got.name, base.name);
    }

    #[test]
    fn mutation_errors() {
        let i = inputs();
        let base = domain();
        let err = |expr: &str| mutation(expr, &i, &base).unwrap_err();
        assert!(matches!(err("domainSpec.Name"), CelError::Mutation(_)));
        assert!(matches!(err(r#"Domain{Title: "t"}"#), CelError::Eval(_)));
        assert!(matches!(
            err(r#"Domainn{SysInfo: []}"#),
            CelError::Eval(_) | CelError::Compile(_)
        ));
        assert!(matches!(
            err(
                r#"Domain{SysInfo: [DomainSysInfo{SMBIOS: DomainSysInfoSMBIOS{System:
                DomainSysInfoSystem{Entry: [DomainSysInfoEntry{Name: "serial", File: "/etc/x"}]}}}]}"#
            ),
            CelError::Mutation(_)
        ));
    }
}
