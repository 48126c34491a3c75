//! The KubeVirt `kubevirt.io/v1` VirtualMachineInstance API types.
//!
//! Serde types for the VMI as KubeVirt v1.9.0 defines it, read tolerantly (unknown fields are
//! ignored, as the API server would), with Kubernetes quantities, the defaults virt-api's mutating
//! webhook applies, and validation that names the field path of every error. Imports nothing else
//! from this crate.

pub mod defaults;
pub mod devices;
pub mod domain;
pub mod meta;
pub mod networks;
pub mod quantity;
pub mod status;
pub mod validate;
pub mod volumes;

use serde::{Deserialize, Serialize};

pub use defaults::{DefaultBinding, DefaultsConfig};
pub use devices::*;
pub use domain::*;
pub use meta::*;
pub use networks::*;
pub use quantity::Quantity;
pub use status::*;
pub use validate::FieldError;
pub use volumes::*;

/// The API group and version of KubeVirt's core types.
pub const API_VERSION: &str = "kubevirt.io/v1";

/// Errors of the `vmi` module: reading a manifest and evaluating quantities.
#[derive(Debug, thiserror::Error)]
pub enum VmiError {
    /// The text is neither valid JSON nor valid YAML.
    #[error("cannot parse manifest: {0}")]
    ParseManifest(#[source] serde_yaml_ng::Error),
    /// The text is not valid JSON.
    #[error("cannot parse manifest as JSON: {0}")]
    ParseJson(#[source] serde_json::Error),
    /// The object does not match the VMI schema; `path` is the JSON path of the offending field.
    #[error("{path}: {source}")]
    Decode {
        /// JSON path, e.g. `spec.domain.cpu.cores`.
        path: String,
        /// What serde found wrong.
        #[source]
        source: serde_json::Error,
    },
    /// No document in the text holds a VMI.
    #[error("no VirtualMachineInstance in manifest (kinds found: {kinds})")]
    WrongKind {
        /// The kinds seen, comma separated.
        kinds: String,
    },
    /// More than one document holds a VMI.
    #[error("manifest holds {count} VMIs; give one")]
    Ambiguous {
        /// How many VMI-holding documents were found.
        count: usize,
    },
    /// A VirtualMachine, pool or replica set lacks its VMI template.
    #[error("{kind} has no {path}")]
    MissingTemplate {
        /// Kind of the object.
        kind: String,
        /// Missing JSON path.
        path: &'static str,
    },
    /// A Kubernetes quantity could not be evaluated.
    #[error("invalid quantity {quantity:?}: {reason}")]
    InvalidQuantity {
        /// The text as written.
        quantity: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// A `kubevirt.io/v1` VirtualMachineInstance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Vmi {
    /// `kubevirt.io/v1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `VirtualMachineInstance`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Object metadata.
    pub metadata: ObjectMeta,
    /// The desired VM.
    pub spec: VmiSpec,
    /// The observed state the launcher reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<VmiStatus>,
}

/// `spec` of a VMI (KubeVirt `VirtualMachineInstanceSpec`, the fields the launcher reads).
///
/// Scheduling fields (affinity, tolerations, probes, ...) are accepted and dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VmiSpec {
    /// The virtual hardware.
    pub domain: DomainSpec,
    /// Volumes backing disks and filesystems.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<Volume>>,
    /// Networks backing interfaces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub networks: Option<Vec<Network>>,
    /// Guest hostname (defaults to the VMI name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Subdomain for the guest FQDN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subdomain: Option<String>,
    /// Seconds given to the guest to shut down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    /// `Paused` starts the VMI paused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_strategy: Option<String>,
    /// `amd64`, `arm64` or `s390x`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// Eviction strategy: `None`, `LiveMigrate`, `LiveMigrateIfPossible`, `External`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_strategy: Option<String>,
}

/// The effective guest CPU topology (see [`Vmi::vcpu_topology`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VcpuTopology {
    /// Sockets.
    pub sockets: u32,
    /// Cores per socket.
    pub cores: u32,
    /// Threads per core.
    pub threads: u32,
}

impl VcpuTopology {
    /// sockets × cores × threads (saturating at `u64::MAX`).
    pub fn vcpus(&self) -> u64 {
        u64::from(self.sockets)
            .saturating_mul(u64::from(self.cores))
            .saturating_mul(u64::from(self.threads))
    }
}

/// Object kinds whose manifests hold a VMI, and the JSON path of the VMI template in each.
const VMI_HOLDERS: &[(&str, &[&str])] = &[
    ("VirtualMachineInstance", &[]),
    ("VirtualMachine", &["spec", "template"]),
    ("VirtualMachineInstanceReplicaSet", &["spec", "template"]),
    (
        "VirtualMachinePool",
        &["spec", "virtualMachineTemplate", "spec", "template"],
    ),
];

impl Vmi {
    /// True when `vol` is a hotplug volume: a PVC or DataVolume declared `hotpluggable`, or one
    /// whose `status.volumeStatus` entry has `hotplugVolume` (virt-handler mounts it under the
    /// hotplug-disks directory; KubeVirt's launcher goes by that status,
    /// `virtwrap/manager.go generateConverterContext`, and `storage/types IsHotplugVolume` by the
    /// declaration). The converter and the storage preparation both ask this.
    pub fn is_hotplug_volume(&self, vol: &Volume) -> bool {
        let declared = vol
            .persistent_volume_claim
            .as_ref()
            .and_then(|p| p.hotpluggable)
            .or(vol.data_volume.as_ref().and_then(|d| d.hotpluggable))
            .unwrap_or(false);
        declared
            || self
                .status
                .as_ref()
                .and_then(|s| s.volume_status.as_ref())
                .is_some_and(|v| {
                    v.iter()
                        .any(|s| s.name == vol.name && s.hotplug_volume.is_some())
                })
    }

    /// Gives a VMI read from a file the UID the API server would have assigned, when it has none:
    /// a name-based UUID (v5, OID namespace) of `<namespace>/<name>`, so the same manifest always
    /// gets the same UID (socket paths and the firmware serial use it). Returns the UID it set, or
    /// `None` when `metadata.uid` was already present.
    pub fn assign_stand_in_uid(&mut self) -> Option<String> {
        if self.metadata.uid.is_some() {
            return None;
        }
        let key = format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or("default"),
            self.metadata.name.as_deref().unwrap_or_default()
        );
        let uid = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, key.as_bytes()).to_string();
        self.metadata.uid = Some(uid.clone());
        Some(uid)
    }

    /// Reads a VMI from a JSON or YAML manifest (possibly several `---` documents).
    ///
    /// Accepts a bare VirtualMachineInstance, or a VirtualMachine, VirtualMachineInstanceReplicaSet
    /// or VirtualMachinePool whose VMI template is taken. A VMI taken from a VirtualMachine gets the
    /// VM's name and namespace and an owner reference to it (kind `VirtualMachine`, as virt-controller
    /// sets it), so [`DefaultsConfig::for_vmi`] can derive the firmware UUID from the
    /// VM name. A document without `kind` is read as a VMI; documents of other kinds are skipped.
    ///
    /// Errors: [`VmiError::ParseJson`]/[`VmiError::ParseManifest`] for malformed text,
    /// [`VmiError::Decode`] with the field path for a field of the wrong type,
    /// [`VmiError::WrongKind`] when no document holds a VMI, [`VmiError::Ambiguous`] when several do,
    /// [`VmiError::MissingTemplate`] when a holder lacks its template.
    pub fn from_json_or_yaml(text: &str) -> Result<Vmi, VmiError> {
        let docs: Vec<serde_json::Value> = if text.trim_start().starts_with('{') {
            vec![serde_json::from_str(text).map_err(VmiError::ParseJson)?]
        } else {
            let mut docs = Vec::new();
            for de in serde_yaml_ng::Deserializer::from_str(text) {
                let v = serde_json::Value::deserialize(de).map_err(VmiError::ParseManifest)?;
                if !v.is_null() {
                    docs.push(v);
                }
            }
            docs
        };
        let mut kinds = Vec::new();
        let mut found = Vec::new();
        for doc in docs {
            // A document without `kind` is read as a bare VMI (the spec alone, as some tools
            // emit it).
            let kind = doc
                .get("kind")
                .and_then(|k| k.as_str())
                .unwrap_or("VirtualMachineInstance")
                .to_string();
            if VMI_HOLDERS.iter().any(|(k, _)| *k == kind) {
                found.push((kind, doc));
            } else {
                kinds.push(kind);
            }
        }
        if found.len() > 1 {
            return Err(VmiError::Ambiguous { count: found.len() });
        }
        let Some((kind, doc)) = found.pop() else {
            return Err(VmiError::WrongKind {
                kinds: if kinds.is_empty() {
                    "none".to_string()
                } else {
                    kinds.join(", ")
                },
            });
        };
        Self::from_holder(&kind, doc)
    }

    fn from_holder(kind: &str, mut doc: serde_json::Value) -> Result<Vmi, VmiError> {
        let path = VMI_HOLDERS
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, p)| *p)
            .unwrap_or(&[]);
        let owner_meta: ObjectMeta = match doc.get("metadata") {
            Some(m) => decode(m.clone(), "metadata.")?,
            None => ObjectMeta::default(),
        };
        let mut template = &mut doc;
        for key in path {
            template = match template.get_mut(*key) {
                Some(t) if !t.is_null() => t,
                _ => {
                    return Err(VmiError::MissingTemplate {
                        kind: kind.to_string(),
                        path: template_path(kind),
                    })
                }
            };
        }
        let prefix = if path.is_empty() {
            String::new()
        } else {
            format!("{}.", path.join("."))
        };
        let mut vmi: Vmi = decode(template.take(), &prefix)?;
        if !path.is_empty() {
            vmi.api_version = Some(API_VERSION.to_string());
            vmi.kind = Some("VirtualMachineInstance".to_string());
            vmi.status = None;
        }
        let owner_name = match (kind, &owner_meta.name) {
            // virt-controller names pool VMs `<pool>-<index>`; the first one stands for all.
            ("VirtualMachinePool", Some(pool)) => Some(format!("{pool}-0")),
            ("VirtualMachine", name) => name.clone(),
            _ => None,
        };
        if kind == "VirtualMachineInstanceReplicaSet" && vmi.metadata.name.is_none() {
            // The replica set controller names its VMIs after itself with a random suffix.
            vmi.metadata.generate_name = owner_meta.name.clone();
        }
        if let Some(owner) = owner_name {
            if vmi.metadata.name.is_none() {
                vmi.metadata.name = Some(owner.clone());
            }
            vmi.metadata.owner_references = Some(vec![OwnerReference {
                api_version: API_VERSION.to_string(),
                kind: "VirtualMachine".to_string(),
                name: owner,
                uid: if kind == "VirtualMachine" {
                    owner_meta.uid.unwrap_or_default()
                } else {
                    String::new()
                },
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]);
        }
        if vmi.metadata.namespace.is_none() {
            vmi.metadata.namespace = owner_meta.namespace;
        }
        Ok(vmi)
    }

    /// The volume named `name`, if any.
    pub fn volume(&self, name: &str) -> Option<&Volume> {
        self.spec.volumes.iter().flatten().find(|v| v.name == name)
    }

    /// The network named `name`, if any.
    pub fn network(&self, name: &str) -> Option<&Network> {
        self.spec.networks.iter().flatten().find(|n| n.name == name)
    }

    /// The guest CPU topology the converter uses (KubeVirt `vcpu.GetCPUTopology`): each of
    /// sockets, cores, threads that is 0 or unset counts as 1, except that when all three are,
    /// sockets come from `resources.limits.cpu`, else `requests.cpu`, rounded up.
    pub fn vcpu_topology(&self) -> VcpuTopology {
        let d = &self.spec.domain;
        let get = |v: Option<u32>| v.unwrap_or(0);
        let (s, c, t) = d
            .cpu
            .as_ref()
            .map(|c| (get(c.sockets), get(c.cores), get(c.threads)))
            .unwrap_or((0, 0, 0));
        let mut topo = VcpuTopology {
            sockets: if s == 0 { 1 } else { s },
            cores: if c == 0 { 1 } else { c },
            threads: if t == 0 { 1 } else { t },
        };
        if s == 0 && c == 0 && t == 0 {
            let res = &d.resources;
            if let Some(q) = res.limit("cpu").or_else(|| res.request("cpu")) {
                topo.sockets = q
                    .to_bytes()
                    .map(|v| u32::try_from(v).unwrap_or(u32::MAX))
                    .unwrap_or(1);
            }
        }
        topo
    }

    /// The name of the VirtualMachine owning this VMI (from `metadata.ownerReferences`), if any.
    pub fn owner_vm_name(&self) -> Option<&str> {
        self.metadata
            .owner_references
            .as_ref()?
            .iter()
            .find(|o| o.kind == "VirtualMachine")
            .map(|o| o.name.as_str())
    }
}

fn template_path(kind: &str) -> &'static str {
    match kind {
        "VirtualMachinePool" => "spec.virtualMachineTemplate.spec.template",
        _ => "spec.template",
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    v: serde_json::Value,
    prefix: &str,
) -> Result<T, VmiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let inner = e.path().to_string();
        VmiError::Decode {
            path: format!("{prefix}{inner}"),
            source: e.into_inner(),
        }
    })
}
