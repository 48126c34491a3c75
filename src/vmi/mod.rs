//! The KubeVirt `kubevirt.io/v1` VirtualMachineInstance API types.
//!
//! Serde types for the VMI as KubeVirt v1.9.0 defines it, read tolerantly (unknown fields are
//! ignored, as the API server would), with Kubernetes quantities, the defaults virt-api's mutating
//! webhook applies, and validation that names the field path of every error. Imports nothing else
//! from this crate.
