//! Admission: what every VMI the launcher is sent goes through before anything acts on it, the
//! first sync, a later sync's diff, the vCPU and memory RPCs and a migration target alike.
//!
//! KubeVirt's launcher receives VMIs that virt-api's webhooks already defaulted and validated;
//! qlauncher applies the same defaults and checks again ([`Vmi::admit`]), so a VMI handed over
//! by anything else is refused with the field path and the reason
//! ([`SyncError::Invalid`]) before a file, a tap or QEMU is touched. A running domain lends its
//! firmware UUID to a VMI that carries none ([`keep_firmware_uuid`]), so a resync converts
//! the same identity.
//!
//! The admitted VMI's [`SpecKey`] is what a later sync compares to decide whether anything
//! changed (KubeVirt compares the domain spec it would define).

use crate::sync::error::SyncError;
use crate::sync::facts::secondary;
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

/// Admits `vmi` (see the module doc); `firmware_uuid` is the UUID the running domain booted
/// with (`None` before a domain runs), which a VMI without one keeps.
///
/// # Errors
/// [`SyncError::Invalid`] with every field the validation rejects; [`SyncError::EncodeDomain`].
pub(crate) fn admit(mut vmi: Vmi, firmware_uuid: Option<&str>) -> Result<Admitted, SyncError> {
    if let Some(uuid) = firmware_uuid {
        keep_firmware_uuid(&mut vmi, uuid);
    }
    vmi.admit().map_err(SyncError::Invalid)?;
    let key = SpecKey::of(&vmi)?;
    Ok(Admitted { vmi, key })
}

/// Gives `vmi` the firmware UUID `uuid` the domain booted with when it carries none
/// (virt-controller sets one on every VMI; without it KubeVirt's defaults draw a random one per
/// sync), so that a resync converts the same identity (SMBIOS, cloud-init instance) instead of a
/// new one.
fn keep_firmware_uuid(vmi: &mut Vmi, uuid: &str) {
    let fw = vmi
        .spec
        .domain
        .firmware
        .get_or_insert_with(Default::default);
    if fw.uuid.as_deref().unwrap_or("").is_empty() {
        fw.uuid = Some(uuid.to_owned());
    }
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
        // A running domain lends its firmware UUID to a VMI without one, never over its own.
        let mut bare = a.vmi.clone();
        bare.spec.domain.firmware = None;
        let kept = admit(bare, Some("5d307ca9-b3ef-428c-8861-06e72d69f223")).unwrap();
        let uuid = |v: &Vmi| v.spec.domain.firmware.as_ref().and_then(|f| f.uuid.clone());
        assert_eq!(
            uuid(&kept.vmi).as_deref(),
            Some("5d307ca9-b3ef-428c-8861-06e72d69f223")
        );
        let own = admit(a.vmi.clone(), Some("5d307ca9-b3ef-428c-8861-06e72d69f223")).unwrap();
        assert_eq!(uuid(&own.vmi), uuid(&a.vmi));
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
