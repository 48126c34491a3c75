//! The queries of a capability probe (QEMU `qapi/machine.json`, `qapi/machine-target.json`,
//! `qapi/qom.json`, `qapi/kvm.json`; QEMU 7.2 to 10.1): what libvirt's `virQEMUCapsInitQMPMonitor`
//! asks a `-machine none` QEMU to learn its accelerators, machine types, CPU models and host CPU.
//! Replies are read tolerantly: a member QEMU leaves out gets its default, and a CPU property of a
//! type libvirt ignores (object, array, null) is kept as [`ProbedProp::Other`].

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use super::{CpuModel, CpuModelExpansionType};

/// `query-kvm`: whether KVM is compiled in and in use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QueryKvm;
command!(QueryKvm, "query-kvm", KvmInfo);

/// `query-kvm`'s reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct KvmInfo {
    /// KVM is the accelerator of this QEMU.
    #[serde(default)]
    pub enabled: bool,
    /// KVM support is compiled in.
    #[serde(default)]
    pub present: bool,
}

/// `query-machines`: the machine types this binary offers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QueryMachines;
command!(QueryMachines, "query-machines", Vec<MachineInfo>);

/// One machine type of `query-machines`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct MachineInfo {
    /// The versioned name (`pc-q35-7.2`, `none`).
    pub name: String,
    /// The unversioned alias pointing at it (`q35`), on the newest version only.
    #[serde(default)]
    pub alias: Option<String>,
    /// QEMU's default machine type.
    #[serde(default, rename = "is-default")]
    pub is_default: bool,
    /// The most vCPUs it takes.
    #[serde(default, rename = "cpu-max")]
    pub cpu_max: u32,
    /// Deprecated by QEMU (QEMU 4.1 and later).
    #[serde(default)]
    pub deprecated: bool,
}

/// `query-cpu-definitions`: the named CPU models, and for each whether the current accelerator
/// can run it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QueryCpuDefinitions;
command!(
    QueryCpuDefinitions,
    "query-cpu-definitions",
    Vec<CpuDefinitionInfo>
);

/// One model of `query-cpu-definitions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct CpuDefinitionInfo {
    /// Model name (`EPYC`, `max`, `host`).
    pub name: String,
    /// The features the accelerator lacks for this model: empty means usable, absent means QEMU
    /// does not know.
    #[serde(default, rename = "unavailable-features")]
    pub unavailable_features: Option<Vec<String>>,
    /// Deprecated by QEMU.
    #[serde(default)]
    pub deprecated: bool,
}

/// `qom-list-types`: the QOM types compiled in (libvirt checks `sev-guest`, `sev-snp-guest`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QomListTypes {
    /// Only types implementing this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub implements: Option<String>,
    /// Include abstract types.
    #[serde(rename = "abstract", skip_serializing_if = "Option::is_none")]
    pub abstract_types: Option<bool>,
}
command!(QomListTypes, "qom-list-types", Vec<ObjectTypeInfo>);

/// One type of `qom-list-types`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ObjectTypeInfo {
    /// Type name (`sev-guest`).
    pub name: String,
}

/// `query-cpu-model-expansion` read tolerantly, for the capability probe (the launcher's own
/// [`super::QueryCpuModelExpansion`] requires every property to be a number, string or boolean).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProbeCpuModelExpansion {
    /// Static or full.
    #[serde(rename = "type")]
    pub kind: CpuModelExpansionType,
    /// The model (`host`, `max`) with the properties set on it (`migratable: false`).
    pub model: CpuModel,
}
command!(
    ProbeCpuModelExpansion,
    "query-cpu-model-expansion",
    ProbedExpansion
);

/// The reply of [`ProbeCpuModelExpansion`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ProbedExpansion {
    /// The expanded model.
    pub model: ProbedModel,
}

/// The expanded model: `base` (static) or the model itself (full), with its properties.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ProbedModel {
    /// Model name.
    pub name: String,
    /// Properties by QEMU name.
    #[serde(default)]
    pub props: BTreeMap<String, ProbedProp>,
}

/// A CPU property value as the probe sees it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum ProbedProp {
    /// A feature or boolean property.
    Bool(bool),
    /// An integer (`family`, `model`, `stepping`, `min-level`).
    Int(i64),
    /// A string (`vendor`, `model-id`).
    Text(String),
    /// Anything else (a float, an object, an array, null): ignored, as libvirt does.
    Other(IgnoredAny),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qmp::commands::Command;
    use serde_json::json;

    #[test]
    fn replies_of_qemu_7_2_are_read() {
        let m: Vec<MachineInfo> = serde_json::from_value(json!([
            {"hotpluggable-cpus": true, "name": "pc-q35-7.2", "numa-mem-supported": false,
             "default-cpu-type": "qemu64-x86_64-cpu", "cpu-max": 288, "deprecated": false,
             "alias": "q35", "default-ram-id": "pc.ram"},
            {"name": "none", "cpu-max": 1}
        ]))
        .unwrap();
        assert_eq!(m[0].alias.as_deref(), Some("q35"));
        assert_eq!((m[1].cpu_max, m[1].deprecated), (1, false));
        let d: Vec<CpuDefinitionInfo> = serde_json::from_value(json!([
            {"name": "qemu64", "typename": "qemu64-x86_64-cpu", "unavailable-features": ["pni"],
             "static": false, "migration-safe": true, "deprecated": false},
            {"name": "EPYC", "unavailable-features": []},
            {"name": "max"}
        ]))
        .unwrap();
        assert_eq!(
            d[0].unavailable_features.as_deref(),
            Some(&["pni".to_owned()][..])
        );
        assert_eq!(d[1].unavailable_features.as_deref(), Some(&[][..]));
        assert_eq!(d[2].unavailable_features, None);
        let e: ProbedExpansion = serde_json::from_value(json!({"model": {"name": "base", "props":
            {"vendor": "AuthenticAMD", "family": 25, "sse4.2": true, "x": null, "y": 1.5}}}))
        .unwrap();
        assert_eq!(e.model.props["family"], ProbedProp::Int(25));
        assert!(matches!(e.model.props["x"], ProbedProp::Other(_)));
        assert_eq!(
            QomListTypes::default().arguments().unwrap(),
            Some(json!({}))
        );
    }
}
