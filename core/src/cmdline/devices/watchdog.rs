//! Watchdog (`converter/compute/watchdog.go`): amd64 `i6300esb` (conventional PCI, on `pcie.0`)
//! with id `ua-<name>` and its action (`reset` default, `poweroff`, `shutdown`, `pause`, `none`,
//! `inject-nmi`) as `-watchdog-action`; `diag288` is s390x only and rejected.
//!
//! Reads: nothing from the context.

use super::super::context::ConverterContext;
use super::super::error::{ConvertError, FieldPath};
use super::super::names::{alias, check_name};
use super::super::plan::{Backend, DeviceClass, DomainPlan, Placement, WatchdogAction};
use super::super::qemu::{Device, DeviceSimple};
use super::planned;
use crate::vmi::Vmi;

/// Adds the watchdog.
pub struct WatchdogConfigurator;

impl super::super::convert::Configurator for WatchdogConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        _ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let Some(w) = vmi.spec.domain.devices.watchdog.as_ref() else {
            return Ok(());
        };
        let p = FieldPath::new("spec.domain.devices.watchdog");
        check_name(&p.key("name"), &w.name)?;
        if w.diag288.is_some() {
            return Err(ConvertError::unsupported(
                p.key("diag288"),
                "diag288 on amd64",
            ));
        }
        let Some(esb) = &w.i6300esb else {
            return Err(ConvertError::missing(p, "a watchdog model (i6300esb)"));
        };
        let action = match esb.action.as_deref().unwrap_or("reset") {
            "reset" => WatchdogAction::Reset,
            "poweroff" => WatchdogAction::Poweroff,
            "shutdown" => WatchdogAction::Shutdown,
            "pause" => WatchdogAction::Pause,
            "none" => WatchdogAction::None,
            "inject-nmi" => WatchdogAction::InjectNmi,
            o => {
                return Err(ConvertError::unsupported(
                    p.key("i6300esb").key("action"),
                    format!("watchdog action {o:?}"),
                ))
            }
        };
        plan.watchdog_action = Some(action);
        plan.devices.push(planned(
            DeviceClass::Watchdog,
            Some(&w.name),
            Backend::None,
            Device::Simple(DeviceSimple {
                driver: "i6300esb",
                id: alias(&w.name),
                bus: None,
                port: None,
            }),
            Placement::RootComplexAny,
        ));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::convert::Configurator;
    use crate::cmdline::testutil::vmi_with;
    use serde_json::json;

    fn run(devices: serde_json::Value) -> Result<DomainPlan, ConvertError> {
        let mut plan = DomainPlan::default();
        WatchdogConfigurator.configure(
            &vmi_with(json!({ "devices": devices })),
            &ConverterContext::default(),
            &mut plan,
        )?;
        Ok(plan)
    }

    #[test]
    fn absent_watchdog_adds_nothing() {
        assert_eq!(run(json!({})).unwrap(), DomainPlan::default());
    }

    #[test]
    fn i6300esb_gets_alias_and_action() {
        let cases = [
            (json!({}), WatchdogAction::Reset),
            (json!({"action": "poweroff"}), WatchdogAction::Poweroff),
            (json!({"action": "shutdown"}), WatchdogAction::Shutdown),
        ];
        for (esb, action) in cases {
            let plan = run(json!({"watchdog": {"name": "wd", "i6300esb": esb}})).unwrap();
            assert_eq!(plan.watchdog_action, Some(action));
            assert_eq!(
                plan.devices,
                vec![planned(
                    DeviceClass::Watchdog,
                    Some("wd"),
                    Backend::None,
                    Device::Simple(DeviceSimple {
                        driver: "i6300esb",
                        id: "ua-wd".into(),
                        bus: None,
                        port: None,
                    }),
                    Placement::RootComplexAny,
                )]
            );
        }
    }

    #[test]
    fn diag288_and_unknown_actions_are_rejected_with_path() {
        assert_eq!(
            run(json!({"watchdog": {"name": "wd", "diag288": {}}})).unwrap_err(),
            ConvertError::unsupported(
                FieldPath::new("spec.domain.devices.watchdog.diag288"),
                "diag288 on amd64"
            )
        );
        let e = run(json!({"watchdog": {"name": "wd", "i6300esb": {"action": "explode"}}}))
            .unwrap_err();
        assert_eq!(
            e.path().as_str(),
            "spec.domain.devices.watchdog.i6300esb.action"
        );
    }
}
