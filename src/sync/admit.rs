//! Admission: what every VMI the launcher is sent goes through before anything acts on it, the
//! first sync, a later sync's diff, the vCPU and memory RPCs and a migration target alike.
//!
//! KubeVirt's launcher receives VMIs that virt-api's webhooks already defaulted and validated;
//! qlauncher applies the same defaults and checks again ([`Vmi::admit`]), so a VMI handed over
//! by anything else is refused with the field path and the reason
//! ([`SyncError::Invalid`]) before a file, a tap or QEMU is touched. A running domain lends its
//! firmware UUID to a VMI that carries none ([`Running::keep_firmware_uuid`]), so a resync
//! converts the same identity.
//!
//! The admitted VMI's [`SpecKey`] is what a later sync compares to decide whether anything
//! changed (KubeVirt compares the domain spec it would define).

use crate::sync::error::SyncError;
use crate::sync::facts::secondary;
use crate::sync::state::Running;
use crate::vmi::Vmi;

/// What a sync compares: the VMI's `spec`, its `status.volumeStatus` (hotplug volumes become
/// ready there) and the secondary interfaces' readiness ([`secondary::status_key`]), as JSON.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SpecKey(serde_json::Value);

impl SpecKey {
    /// The key of an admitted `vmi`.
    ///
    /// # Errors
    /// [`SyncError::EncodeDomain`] when the spec does not encode as JSON.
    fn of(vmi: &Vmi) -> Result<SpecKey, SyncError> {
        let volume_status = vmi.status.as_ref().map(|s| &s.volume_status);
        serde_json::to_value((&vmi.spec, volume_status, secondary::status_key(vmi)))
            .map(SpecKey)
            .map_err(SyncError::EncodeDomain)
    }
}

/// A VMI with KubeVirt's defaults applied and validated, and its [`SpecKey`].
pub(crate) struct Admitted {
    /// The defaulted, valid VMI.
    pub(crate) vmi: Vmi,
    /// What a later sync compares with.
    pub(crate) key: SpecKey,
}

/// Admits `vmi` (see the module doc); `running` is the domain already running, whose firmware
/// UUID a VMI without one keeps.
///
/// # Errors
/// [`SyncError::Invalid`] with every field the validation rejects; [`SyncError::EncodeDomain`].
pub(crate) fn admit(mut vmi: Vmi, running: Option<&Running>) -> Result<Admitted, SyncError> {
    if let Some(r) = running {
        r.keep_firmware_uuid(&mut vmi);
    }
    vmi.admit().map_err(SyncError::Invalid)?;
    let key = SpecKey::of(&vmi)?;
    Ok(Admitted { vmi, key })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(json: serde_json::Value) -> Vmi {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_vmi_is_defaulted_and_keyed() {
        let a = admit(
            vmi(serde_json::json!({
                "metadata": {"name": "v", "namespace": "ns", "uid": "u"},
                "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}}}
            })),
            None,
        )
        .unwrap();
        // A default of KubeVirt's webhook: the machine type.
        assert!(a.vmi.spec.domain.machine.is_some());
        let again = admit(a.vmi.clone(), None).unwrap();
        assert_eq!(again.key, a.key);
    }

    #[test]
    fn an_invalid_vmi_names_each_field() {
        let err = admit(
            vmi(serde_json::json!({
                "metadata": {"name": "v", "uid": "u"},
                "spec": {"domain": {"devices": {"disks": [{"name": "d", "disk": {"bus": "ide"}}]},
                         "resources": {"requests": {"memory": "64Mi"}}}}
            })),
            None,
        )
        .err()
        .unwrap();
        let SyncError::Invalid(errors) = &err else {
            panic!("{err}");
        };
        assert!(
            errors
                .iter()
                .any(|e| e.path.starts_with("spec.domain.devices.disks[0]")),
            "{errors:?}"
        );
        assert!(err.to_string().starts_with("invalid VMI: "), "{err}");
    }
}
