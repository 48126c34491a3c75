//! `ConvertError` and `FieldPath`: what went wrong, and where in the VMI.
//!
//! Errors name the VMI field by its JSON path (`spec.domain.devices.disks[1].disk.bus`), the way a
//! user reads the manifest, and state the reason without repeating a source error.

use std::fmt;

/// A JSON path into the VMI, such as `spec.domain.devices.disks[1].disk.bus`.
///
/// Built with [`FieldPath::new`] and the chaining helpers [`FieldPath::key`] and
/// [`FieldPath::index`]; displayed as the dotted path.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldPath(String);

impl FieldPath {
    /// A path starting at `root` (e.g. `spec.domain.devices`).
    pub fn new(root: &str) -> Self {
        FieldPath(root.to_string())
    }

    /// This path with `.key` appended.
    pub fn key(&self, key: &str) -> Self {
        if self.0.is_empty() {
            FieldPath(key.to_string())
        } else {
            FieldPath(format!("{}.{}", self.0, key))
        }
    }

    /// This path with `[i]` appended.
    pub fn index(&self, i: usize) -> Self {
        FieldPath(format!("{}[{}]", self.0, i))
    }

    /// The dotted path as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a VMI could not be converted into a `DomainPlan`.
///
/// Every variant carries the field path of the offending VMI value. Variants derive `PartialEq` so
/// tests compare whole errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// A value is not one qlauncher accepts (bad characters, too long, out of range).
    #[error("{path}: invalid value: {reason}")]
    InvalidValue {
        /// Where the value sits in the VMI.
        path: FieldPath,
        /// Why it was rejected.
        reason: String,
    },
    /// A value KubeVirt accepts but qlauncher does not support (yet or on this platform).
    #[error("{path}: {reason} is not supported")]
    Unsupported {
        /// Where the value sits in the VMI.
        path: FieldPath,
        /// What is not supported.
        reason: String,
    },
    /// A required fact or field is missing (e.g. a volume a disk refers to).
    #[error("{path}: missing: {reason}")]
    Missing {
        /// Where the value was expected.
        path: FieldPath,
        /// What is missing.
        reason: String,
    },
    /// KVM is not usable and emulation is not allowed (KubeVirt: "kvm not present and emulation is
    /// not allowed", `converter/kvm/configurator.go`).
    #[error("{path}: kvm not present and emulation is not allowed")]
    NoKvm {
        /// Always `spec.domain` (the accelerator is a domain-wide choice).
        path: FieldPath,
    },
    /// Too many devices for the PCIe topology (more than 31 root-port buses).
    #[error("{path}: no free PCIe slot: {reason}")]
    PciExhausted {
        /// The device that found no slot.
        path: FieldPath,
        /// Which limit was hit.
        reason: String,
    },
}

impl ConvertError {
    /// The field path this error points at.
    pub fn path(&self) -> &FieldPath {
        match self {
            ConvertError::InvalidValue { path, .. }
            | ConvertError::Unsupported { path, .. }
            | ConvertError::Missing { path, .. }
            | ConvertError::NoKvm { path }
            | ConvertError::PciExhausted { path, .. } => path,
        }
    }

    /// Shorthand for [`ConvertError::InvalidValue`].
    pub fn invalid(path: FieldPath, reason: impl Into<String>) -> Self {
        ConvertError::InvalidValue {
            path,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`ConvertError::Unsupported`].
    pub fn unsupported(path: FieldPath, reason: impl Into<String>) -> Self {
        ConvertError::Unsupported {
            path,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`ConvertError::Missing`].
    pub fn missing(path: FieldPath, reason: impl Into<String>) -> Self {
        ConvertError::Missing {
            path,
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_path_renders_dotted_with_indices() {
        let p = FieldPath::new("spec.domain.devices")
            .key("disks")
            .index(1)
            .key("disk")
            .key("bus");
        assert_eq!(p.as_str(), "spec.domain.devices.disks[1].disk.bus");
        let e = ConvertError::unsupported(p, "bus \"ide\"");
        assert_eq!(
            e.to_string(),
            "spec.domain.devices.disks[1].disk.bus: bus \"ide\" is not supported"
        );
    }
}
