//! Confidential computing (`compute/launch_security.go`, `launchsecurity/sev.go`), as libvirt
//! renders KubeVirt's `<launchSecurity>`: an object `lsec0` referenced by `-machine
//! confidential-guest-support=lsec0`:
//!
//! * `sev` -> `sev-guest` with policy NoDebug (0x1), plus EncryptedState (0x4) for SEV-ES
//!   (`policy.encryptedState`); `cbitpos` and `reduced-phys-bits` are the host's (libvirt takes
//!   them from `query-sev-capabilities`, here `ctx.sev`).
//! * `snp` -> `sev-snp-guest` with KubeVirt's default policy 0x30000 (QEMU >= 9.1).
//! * `tdx` -> `tdx-guest`, `kernel-irqchip=split` and `pmu=off` (KubeVirt's `<pmu state="off"/>`
//!   for TDX; QEMU >= 10.1).
//!
//! SEV and SNP also put every virtio device behind the IOMMU (`iommu_platform=on`, KubeVirt's
//! `iommu="on"`) and turn NIC option ROMs off; `passes/launch_security.rs` does that once all
//! devices exist. Whether the host offers SEV/SNP/TDX is a context fact: when it does not, the
//! object is still planned (without the host's parameters) and `plan.hardware` reports it, so the
//! launcher refuses with the field path. SEV attestation (session, DH certificate, launch secret
//! injection) is rejected.
//!
//! Reads: `ctx.sev`, `ctx.tdx`, `ctx.qemu`.

use super::super::context::ConverterContext;
use super::super::error::{ConvertError, FieldPath};
use super::super::plan::{CpuFlag, DomainPlan, HardwareNeed};
use super::super::qemu::ObjectLaunchSecurity;
use crate::vmi::Vmi;

/// Sets `launch_security`, the machine's confidential-guest support and the hardware need.
pub struct LaunchSecurityConfigurator;

/// SEV guest policy bits (AMD SEV API): debugging off, always (KubeVirt's `SEVPolicyNoDebug`).
const SEV_NO_DEBUG: u64 = 1 << 0;
/// SEV-ES: encrypted register state.
const SEV_ENCRYPTED_STATE: u64 = 1 << 2;
/// KubeVirt's default SEV-SNP policy: SMT allowed (bit 16), reserved must-be-one (bit 17).
const SNP_DEFAULT_POLICY: u64 = 0x30000;

/// The object id libvirt gives the launch-security object.
pub const LSEC_ID: &str = "lsec0";

impl super::super::convert::Configurator for LaunchSecurityConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let Some(ls) = vmi.spec.domain.launch_security.as_ref() else {
            return Ok(());
        };
        let p = FieldPath::new("spec.domain.launchSecurity");
        let set = [ls.sev.is_some(), ls.snp.is_some(), ls.tdx.is_some()]
            .iter()
            .filter(|x| **x)
            .count();
        if set != 1 {
            return Err(ConvertError::invalid(
                p,
                "exactly one of sev, snp and tdx must be set",
            ));
        }
        let sev_caps = ctx.sev;
        let (object, need) = if let Some(sev) = &ls.sev {
            let sp = p.key("sev");
            if sev.attestation.is_some() {
                return Err(ConvertError::unsupported(
                    sp.key("attestation"),
                    "SEV attestation (launch secret injection)",
                ));
            }
            if sev.session.is_some() || sev.dh_cert.is_some() {
                let field = if sev.session.is_some() {
                    "session"
                } else {
                    "dhCert"
                };
                return Err(ConvertError::unsupported(
                    sp.key(field),
                    "a SEV launch session or guest owner certificate",
                ));
            }
            let es = sev
                .policy
                .as_ref()
                .and_then(|p| p.encrypted_state)
                .unwrap_or(false);
            let policy = SEV_NO_DEBUG | if es { SEV_ENCRYPTED_STATE } else { 0 };
            (
                ObjectLaunchSecurity {
                    qom_type: "sev-guest",
                    id: LSEC_ID.into(),
                    cbitpos: sev_caps.map(|c| c.cbitpos),
                    reduced_phys_bits: sev_caps.map(|c| c.reduced_phys_bits),
                    policy: Some(policy),
                },
                HardwareNeed {
                    path: sp,
                    id: LSEC_ID.into(),
                    what: if es { "AMD SEV-ES" } else { "AMD SEV" }.into(),
                    missing: sev_caps.is_none().then(|| {
                        "the host does not offer SEV (no /dev/sev or KVM without sev)".into()
                    }),
                },
            )
        } else if ls.snp.is_some() {
            let sp = p.key("snp");
            if !ctx.qemu.at_least(9, 1) {
                return Err(ConvertError::unsupported(
                    sp,
                    format!(
                        "SEV-SNP with QEMU {}.{} (needs 9.1 or newer)",
                        ctx.qemu.major, ctx.qemu.minor
                    ),
                ));
            }
            let caps = sev_caps.filter(|c| c.snp);
            (
                ObjectLaunchSecurity {
                    qom_type: "sev-snp-guest",
                    id: LSEC_ID.into(),
                    cbitpos: caps.map(|c| c.cbitpos),
                    reduced_phys_bits: caps.map(|c| c.reduced_phys_bits),
                    policy: Some(SNP_DEFAULT_POLICY),
                },
                HardwareNeed {
                    path: sp,
                    id: LSEC_ID.into(),
                    what: "AMD SEV-SNP".into(),
                    missing: caps
                        .is_none()
                        .then(|| "the host does not offer SEV-SNP".into()),
                },
            )
        } else {
            let tp = p.key("tdx");
            if !ctx.qemu.at_least(10, 1) {
                return Err(ConvertError::unsupported(
                    tp,
                    format!(
                        "TDX with QEMU {}.{} (needs 10.1 or newer)",
                        ctx.qemu.major, ctx.qemu.minor
                    ),
                ));
            }
            plan.machine.kernel_irqchip_split = true;
            plan.cpu.flags.push(CpuFlag {
                name: "pmu".into(),
                value: "off".into(),
            });
            (
                ObjectLaunchSecurity {
                    qom_type: "tdx-guest",
                    id: LSEC_ID.into(),
                    cbitpos: None,
                    reduced_phys_bits: None,
                    policy: None,
                },
                HardwareNeed {
                    path: tp,
                    id: LSEC_ID.into(),
                    what: "Intel TDX".into(),
                    missing: (!ctx.tdx).then(|| "the host does not offer TDX".into()),
                },
            )
        };
        plan.machine.confidential_guest_support = Some(LSEC_ID.into());
        plan.launch_security = Some(object);
        plan.hardware.push(need);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::context::{QemuVersion, SevCapabilities};
    use crate::cmdline::convert;
    use crate::cmdline::plan::MissingHardware;
    use crate::cmdline::testutil::vmi_with;
    use serde_json::json;

    #[test]
    fn sev_without_host_support_is_planned_and_reported_missing() {
        let v = vmi_with(
            json!({"firmware": {"bootloader": {"efi": {"secureBoot": false}}}, "launchSecurity": {"sev": {"policy": {"encryptedState": true}}}}),
        );
        let plan = convert(&v, &ConverterContext::default()).unwrap();
        assert_eq!(
            plan.missing_hardware(),
            vec![MissingHardware {
                path: FieldPath::new("spec.domain.launchSecurity.sev"),
                id: "lsec0".into(),
                reason: "AMD SEV-ES: the host does not offer SEV (no /dev/sev or KVM without sev)"
                    .into(),
            }]
        );
        let ctx = ConverterContext {
            sev: Some(SevCapabilities {
                cbitpos: 51,
                reduced_phys_bits: 1,
                snp: false,
            }),
            ..Default::default()
        };
        let plan = convert(&v, &ctx).unwrap();
        assert_eq!(plan.missing_hardware(), vec![]);
        assert_eq!(
            serde_json::to_value(plan.launch_security.as_ref().unwrap()).unwrap(),
            json!({"qom-type": "sev-guest", "id": "lsec0", "cbitpos": 51,
                "reduced-phys-bits": 1, "policy": 5})
        );
    }

    #[test]
    fn snp_needs_snp_on_the_host_and_tdx_needs_tdx() {
        let sev_only = ConverterContext {
            sev: Some(SevCapabilities {
                cbitpos: 51,
                reduced_phys_bits: 1,
                snp: false,
            }),
            ..Default::default()
        };
        let v = vmi_with(
            json!({"firmware": {"bootloader": {"efi": {"secureBoot": false}}}, "launchSecurity": {"snp": {}}}),
        );
        let m = convert(&v, &sev_only).unwrap().missing_hardware();
        assert_eq!(m[0].reason, "AMD SEV-SNP: the host does not offer SEV-SNP");
        let v = vmi_with(
            json!({"firmware": {"bootloader": {"efi": {"secureBoot": false}}}, "launchSecurity": {"tdx": {}}}),
        );
        let m = convert(&v, &ConverterContext::default())
            .unwrap()
            .missing_hardware();
        assert_eq!(m[0].path.as_str(), "spec.domain.launchSecurity.tdx");
        let tdx = ConverterContext {
            tdx: true,
            ..Default::default()
        };
        assert_eq!(convert(&v, &tdx).unwrap().missing_hardware(), vec![]);
    }

    #[test]
    fn old_qemu_and_attestation_are_rejected_at_conversion() {
        let qemu72 = ConverterContext {
            qemu: QemuVersion { major: 7, minor: 2 },
            ..Default::default()
        };
        let v = vmi_with(
            json!({"firmware": {"bootloader": {"efi": {"secureBoot": false}}}, "launchSecurity": {"snp": {}}}),
        );
        assert_eq!(
            convert(&v, &qemu72).unwrap_err().path().as_str(),
            "spec.domain.launchSecurity.snp"
        );
        let v = vmi_with(
            json!({"firmware": {"bootloader": {"efi": {"secureBoot": false}}}, "launchSecurity": {"sev": {"attestation": {}}}}),
        );
        assert_eq!(
            convert(&v, &ConverterContext::default())
                .unwrap_err()
                .path()
                .as_str(),
            "spec.domain.launchSecurity.sev.attestation"
        );
        let v = vmi_with(
            json!({"firmware": {"bootloader": {"efi": {"secureBoot": false}}}, "launchSecurity": {"sev": {}, "tdx": {}}}),
        );
        assert_eq!(
            convert(&v, &ConverterContext::default())
                .unwrap_err()
                .path()
                .as_str(),
            "spec.domain.launchSecurity"
        );
    }
}
