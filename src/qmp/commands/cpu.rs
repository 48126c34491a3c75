//! `query-cpu-model-expansion` (QEMU `qapi/machine-target.json`, QEMU 7.2 to 10.1): what a CPU
//! model expands to. Type `static` answers a model that never changes between QEMU versions or
//! hosts (`base` on x86) with every property set explicitly; libvirt expands host-model this way
//! and migrates the result.

use serde::{Deserialize, Serialize};

pub use crate::cmdline::plan::{CpuModel, CpuProp};

/// How far `query-cpu-model-expansion` expands (`CpuModelExpansionType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuModelExpansionType {
    /// A static base model plus the properties that differ from it: stable across QEMU versions
    /// and hosts, what a migration carries.
    Static,
    /// The model's own properties, possibly relative to a model that is not static.
    Full,
}

/// `query-cpu-model-expansion`: expands `model` (applied to the accelerator this QEMU runs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueryCpuModelExpansion {
    /// Static or full.
    #[serde(rename = "type")]
    pub kind: CpuModelExpansionType,
    /// The model to expand, with the properties set on it.
    pub model: CpuModel,
}
crate::qmp::commands::command!(
    QueryCpuModelExpansion,
    "query-cpu-model-expansion",
    CpuModelExpansionInfo
);

/// The reply of `query-cpu-model-expansion`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CpuModelExpansionInfo {
    /// The expanded model.
    pub model: CpuModel,
    /// Properties of the model QEMU deprecated (QEMU 9.1 and later; absent on 7.2).
    #[serde(default, rename = "deprecated-props")]
    pub deprecated_props: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qmp::commands::Command;
    use serde_json::json;

    #[test]
    fn the_command_and_its_reply_are_qemus() {
        let c = QueryCpuModelExpansion {
            kind: CpuModelExpansionType::Static,
            model: CpuModel {
                name: "max".into(),
                props: [("vmx".to_owned(), CpuProp::Bool(false))].into(),
            },
        };
        assert_eq!(c.name(), "query-cpu-model-expansion");
        assert_eq!(
            c.arguments().unwrap(),
            Some(json!({"type": "static", "model": {"name": "max", "props": {"vmx": false}}}))
        );
        // QEMU 7.2's answer (abridged) and 10.1's, which adds deprecated-props.
        let r: CpuModelExpansionInfo = serde_json::from_value(json!({"model": {"name": "base",
            "props": {"family": 15, "vendor": "AuthenticAMD", "sse4.2": true}}}))
        .unwrap();
        assert_eq!(r.model.props["family"], CpuProp::Int(15));
        assert!(r.deprecated_props.is_empty());
        let r: CpuModelExpansionInfo = serde_json::from_value(json!({"model": {"name": "base",
            "props": {}}, "deprecated-props": ["pcommit"]}))
        .unwrap();
        assert_eq!(r.deprecated_props, vec!["pcommit"]);
    }
}
