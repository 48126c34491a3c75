//! Machine type and accelerator (`converter/compute/os.go`, `kvm/configurator.go`,
//! `hypervisor_features.go`, `reboot_policy.go`): q35 with `usb=off`, `vmport=off` (amd64),
//! `dump-guest-core=off`; `-accel kvm`, or `tcg` under `--allow-emulation` without KVM; ACPI off
//! when `features.acpi.enabled: false`; `smm` from `features.smm`; `-no-reboot` for
//! `rebootPolicy: Terminate`; the boot menu for `startStrategy: Paused`.
//!
//! Reads: `ctx.arch`, `ctx.kvm`, `ctx.allow_emulation`.

use super::super::context::ConverterContext;
use super::super::error::{ConvertError, FieldPath};
use super::super::names::check_token;
use super::super::plan::{DomainPlan, MachinePlan};
use super::{accel, require_amd64};
use crate::vmi::Vmi;

/// Sets `machine`, `accel`, `no_reboot`, `boot_menu`.
pub struct MachineConfigurator;

impl super::super::convert::Configurator for MachineConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        require_amd64(ctx)?;
        match vmi.spec.architecture.as_deref() {
            None | Some("") | Some("amd64") => {}
            Some(other) => {
                return Err(ConvertError::unsupported(
                    FieldPath::new("spec.architecture"),
                    format!("architecture {other:?} (only amd64)"),
                ))
            }
        }
        let path = FieldPath::new("spec.domain.machine.type");
        let machine_type = match vmi.spec.domain.machine.as_ref() {
            Some(m) if !m.r#type.is_empty() => {
                check_token(&path, &m.r#type)?;
                if !(m.r#type == "q35" || m.r#type.starts_with("pc-q35-")) {
                    return Err(ConvertError::unsupported(
                        path,
                        format!("machine type {:?} (only q35)", m.r#type),
                    ));
                }
                m.r#type.clone()
            }
            _ => "q35".into(),
        };
        let features = vmi.spec.domain.features.clone().unwrap_or_default();
        let acpi = features
            .acpi
            .as_ref()
            .and_then(|a| a.enabled)
            .unwrap_or(true);
        let smm = features.smm.as_ref().map(|s| s.enabled.unwrap_or(true));
        plan.machine = MachinePlan {
            machine_type,
            vmport_off: true,
            smm,
            acpi,
            ..Default::default()
        };
        plan.accel = accel(ctx)?;
        let rp = FieldPath::new("spec.domain.rebootPolicy");
        plan.no_reboot = match vmi.spec.domain.reboot_policy.as_deref() {
            None | Some("") | Some("Reboot") => false,
            Some("Terminate") => true,
            Some(other) => {
                return Err(ConvertError::unsupported(
                    rp,
                    format!("reboot policy {other:?}"),
                ))
            }
        };
        plan.boot_menu = vmi.spec.start_strategy.as_deref() == Some("Paused");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::plan::Accel;
    use crate::cmdline::testutil::{configure, error_path};
    use serde_json::json;

    #[test]
    fn machine_table() {
        let kvm = ConverterContext::default();
        let tcg = ConverterContext {
            kvm: false,
            allow_emulation: true,
            ..Default::default()
        };
        // (domain fragment, context) -> (machine type, acpi, smm, accel, no_reboot)
        let cases = [
            (json!({}), &kvm, ("q35", true, None, Accel::Kvm, false)),
            (
                json!({"machine": {"type": "pc-q35-7.2"}}),
                &kvm,
                ("pc-q35-7.2", true, None, Accel::Kvm, false),
            ),
            (
                json!({"features": {"acpi": {"enabled": false}, "smm": {}}}),
                &kvm,
                ("q35", false, Some(true), Accel::Kvm, false),
            ),
            (
                json!({"features": {"smm": {"enabled": false}}, "rebootPolicy": "Terminate"}),
                &tcg,
                ("q35", true, Some(false), Accel::Tcg, true),
            ),
        ];
        for (domain, ctx, (ty, acpi, smm, accel, no_reboot)) in cases {
            let plan = configure(&MachineConfigurator, domain.clone(), ctx).unwrap();
            assert_eq!(plan.machine.machine_type, ty, "{domain}");
            assert!(plan.machine.vmport_off, "{domain}");
            assert_eq!(plan.machine.acpi, acpi, "{domain}");
            assert_eq!(plan.machine.smm, smm, "{domain}");
            assert_eq!(plan.accel, accel, "{domain}");
            assert_eq!(plan.no_reboot, no_reboot, "{domain}");
            assert!(!plan.boot_menu, "{domain}");
        }
    }

    #[test]
    fn rejected_machines_name_the_field() {
        let no_kvm = ConverterContext {
            kvm: false,
            ..Default::default()
        };
        let cases = [
            (
                json!({"machine": {"type": "pc-i440fx-7.2"}}),
                ConverterContext::default(),
                "spec.domain.machine.type",
            ),
            (
                json!({"rebootPolicy": "Sometimes"}),
                ConverterContext::default(),
                "spec.domain.rebootPolicy",
            ),
            (json!({}), no_kvm, "spec.domain"),
        ];
        for (domain, ctx, path) in cases {
            assert_eq!(
                error_path(configure(&MachineConfigurator, domain, &ctx)),
                path
            );
        }
    }
}
