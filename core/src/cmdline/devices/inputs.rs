//! Inputs (`converter/compute/input_device.go`): tablets only; bus `usb` (default) ->
//! `usb-tablet` on `usb.0`, `virtio` -> `virtio-tablet-pci` on its own root port; id `ua-<name>`.
//!
//! Reads: nothing from the context.

use super::super::context::ConverterContext;
use super::super::error::ConvertError;
use super::super::names::{alias, check_name};
use super::super::plan::{Backend, DeviceClass, DomainPlan, Placement};
use super::super::qemu::{Device, DeviceSimple};
use super::{devices_path, planned};
use crate::vmi::Vmi;

/// Adds tablets.
pub struct InputsConfigurator;

impl super::super::convert::Configurator for InputsConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        _ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        for (i, input) in vmi
            .spec
            .domain
            .devices
            .inputs
            .as_deref()
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let p = devices_path().key("inputs").index(i);
            check_name(&p.key("name"), &input.name)?;
            if input.r#type != "tablet" {
                return Err(ConvertError::unsupported(
                    p.key("type"),
                    format!("input type {:?}", input.r#type),
                ));
            }
            let (driver, bus, placement) = match input.bus.as_deref().unwrap_or("usb") {
                "" | "usb" => ("usb-tablet", Some("usb.0".to_string()), Placement::NonPci),
                "virtio" => ("virtio-tablet-pci", None, Placement::RootPort),
                o => {
                    return Err(ConvertError::unsupported(
                        p.key("bus"),
                        format!("input bus {o:?}"),
                    ))
                }
            };
            plan.devices.push(planned(
                DeviceClass::Input,
                Some(&input.name),
                Backend::None,
                Device::Simple(DeviceSimple {
                    driver,
                    id: alias(&input.name),
                    bus,
                    port: None,
                }),
                placement,
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::testutil::{configure, drivers, error_path};
    use serde_json::json;

    #[test]
    fn inputs_table() {
        let s = |v: &str| v.to_string();
        // (inputs) -> (driver, id), and the placement of each
        let cases = [
            (json!([]), vec![], vec![]),
            (
                json!([{"name": "t", "type": "tablet"}]),
                vec![("usb-tablet", s("ua-t"))],
                vec![Placement::NonPci],
            ),
            (
                json!([{"name": "a", "type": "tablet", "bus": "usb"}, {"name": "b", "type": "tablet", "bus": "virtio"}]),
                vec![("usb-tablet", s("ua-a")), ("virtio-tablet-pci", s("ua-b"))],
                vec![Placement::NonPci, Placement::RootPort],
            ),
        ];
        for (inputs, want, placements) in cases {
            let plan = configure(
                &InputsConfigurator,
                json!({"devices": {"inputs": inputs}}),
                &ConverterContext::default(),
            )
            .unwrap();
            assert_eq!(drivers(&plan), want, "{inputs}");
            let got: Vec<Placement> = plan.devices.iter().map(|d| d.placement).collect();
            assert_eq!(got, placements, "{inputs}");
        }
        for (input, path) in [
            (
                json!({"name": "k", "type": "keyboard"}),
                "spec.domain.devices.inputs[0].type",
            ),
            (
                json!({"name": "t", "type": "tablet", "bus": "ps2"}),
                "spec.domain.devices.inputs[0].bus",
            ),
        ] {
            let r = configure(
                &InputsConfigurator,
                json!({"devices": {"inputs": [input]}}),
                &ConverterContext::default(),
            );
            assert_eq!(error_path(r), path);
        }
    }
}
