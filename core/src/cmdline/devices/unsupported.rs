//! Fields qlauncher knows but does not convert yet: each is rejected with its field path instead
//! of being ignored (USB redirection, panic devices, dedicated CPUs, NUMA passthrough, realtime,
//! ACPI SLIC/MSDM tables). Hardware features that are pure text (GPUs, host devices, SR-IOV,
//! SEV/SNP/TDX, virtiofs) are planned by their own configurators and checked at launch.
//!
//! Reads: nothing from the context.

use super::super::context::ConverterContext;
use super::super::error::{ConvertError, FieldPath};
use super::super::plan::DomainPlan;
use crate::vmi::Vmi;

fn nonempty<T>(v: &Option<Vec<T>>) -> bool {
    v.as_ref().is_some_and(|v| !v.is_empty())
}

/// Rejects unsupported fields.
pub struct UnsupportedConfigurator;

impl super::super::convert::Configurator for UnsupportedConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        _ctx: &ConverterContext,
        _plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let d = &vmi.spec.domain;
        let dev = &d.devices;
        let p = FieldPath::new("spec.domain");
        let checks: [(bool, FieldPath, &str); 6] = [
            (
                nonempty(&dev.panic_devices),
                p.key("devices").key("panicDevices"),
                "panic devices",
            ),
            (
                dev.client_passthrough.is_some(),
                p.key("devices").key("clientPassthrough"),
                "USB redirection",
            ),
            (
                d.cpu.as_ref().and_then(|c| c.dedicated_cpu_placement) == Some(true),
                p.key("cpu").key("dedicatedCpuPlacement"),
                "dedicated CPU placement",
            ),
            (
                d.cpu.as_ref().is_some_and(|c| c.numa.is_some()),
                p.key("cpu").key("numa"),
                "NUMA passthrough",
            ),
            (
                d.cpu.as_ref().is_some_and(|c| c.realtime.is_some()),
                p.key("cpu").key("realtime"),
                "realtime vCPUs",
            ),
            (
                d.firmware.as_ref().is_some_and(|f| f.acpi.is_some()),
                p.key("firmware").key("acpi"),
                "ACPI SLIC/MSDM tables",
            ),
        ];
        for (set, path, what) in checks {
            if set {
                return Err(ConvertError::unsupported(path, what));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::testutil::{configure, error_path};
    use serde_json::json;

    #[test]
    fn unsupported_fields_are_rejected_with_their_path() {
        let ctx = ConverterContext::default();
        assert!(configure(
            &UnsupportedConfigurator,
            json!({"devices": {"panicDevices": []}}),
            &ctx
        )
        .is_ok());
        let cases = [
            (
                json!({"devices": {"panicDevices": [{"model": "pvpanic"}]}}),
                "spec.domain.devices.panicDevices",
            ),
            (
                json!({"devices": {"clientPassthrough": {}}}),
                "spec.domain.devices.clientPassthrough",
            ),
            (
                json!({"cpu": {"dedicatedCpuPlacement": true}}),
                "spec.domain.cpu.dedicatedCpuPlacement",
            ),
            (json!({"cpu": {"numa": {}}}), "spec.domain.cpu.numa"),
            (json!({"cpu": {"realtime": {}}}), "spec.domain.cpu.realtime"),
            (
                json!({"firmware": {"acpi": {}}}),
                "spec.domain.firmware.acpi",
            ),
        ];
        for (domain, path) in cases {
            assert_eq!(
                error_path(configure(&UnsupportedConfigurator, domain, &ctx)),
                path
            );
        }
    }
}
