//! Object metadata (`metav1.ObjectMeta`), the subset the launcher reads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `metadata` of a Kubernetes object (k8s.io/apimachinery `ObjectMeta`), the fields qlauncher reads.
///
/// Unknown fields (managedFields, finalizers, ...) are accepted and dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectMeta {
    /// Object name (a DNS label for VMIs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Prefix the API server uses to generate a name when `name` is unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generate_name: Option<String>,
    /// Namespace of the object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Unique id assigned by the API server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Labels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Owners; a VMI started from a VirtualMachine names that VM here (kind `VirtualMachine`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_references: Option<Vec<OwnerReference>>,
}

/// One entry of `metadata.ownerReferences` (k8s.io/apimachinery `OwnerReference`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OwnerReference {
    /// API version of the owner, e.g. `kubevirt.io/v1`.
    pub api_version: String,
    /// Kind of the owner, e.g. `VirtualMachine`.
    pub kind: String,
    /// Name of the owner.
    pub name: String,
    /// UID of the owner.
    pub uid: String,
    /// Whether the owner is the managing controller.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller: Option<bool>,
    /// Whether the owner cannot be deleted before this object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_owner_deletion: Option<bool>,
}

/// A reference to an object in the same namespace by name (k8s `LocalObjectReference`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LocalObjectReference {
    /// Name of the referenced object.
    pub name: String,
}
