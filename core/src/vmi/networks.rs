//! `spec.networks`: the pod network and Multus networks behind interfaces.
//!
//! Field names and JSON spelling follow KubeVirt v1.9.0 `staging/src/kubevirt.io/api/core/v1/schema.go`.

use serde::{Deserialize, Serialize};

/// One `spec.networks[]` entry (KubeVirt `Network` with the inlined `NetworkSource`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Network {
    /// Network name; the interface of the same name uses it.
    pub name: String,
    /// The pod network.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodNetwork>,
    /// A Multus network attachment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multus: Option<MultusNetwork>,
    /// A DRA resource claim.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_claim: Option<ClaimRequest>,
}

/// `network.pod`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PodNetwork {
    /// IPv4 CIDR for masquerade (default `10.0.2.0/24`).
    #[serde(rename = "vmNetworkCIDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm_network_cidr: Option<String>,
    /// IPv6 CIDR for masquerade (default `fd10:0:2::/120`).
    #[serde(rename = "vmIPv6NetworkCIDR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm_ipv6_network_cidr: Option<String>,
}

/// `network.multus`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MultusNetwork {
    /// `[namespace/]name` of the NetworkAttachmentDefinition.
    pub network_name: String,
    /// Replaces the pod network as the default route.
    #[serde(rename = "default")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_default: Option<bool>,
}

/// `network.resourceClaim`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ClaimRequest {
    /// Claim name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// Request name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_name: Option<String>,
}
