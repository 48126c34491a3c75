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
