//! RNG (`converter/compute/rng.go`): with `devices.rng`, an `rng-random` object `objrng0` on
//! `/dev/urandom` and `virtio-rng-pci-non-transitional` `rng0`.
//!
//! Reads: nothing from the context.

use super::super::context::ConverterContext;
use super::super::error::ConvertError;
use super::super::plan::{Backend, DeviceClass, DomainPlan, Placement};
use super::super::qemu::{Device, DeviceVirtioRng, Object, ObjectRngRandom};
use super::{planned, virtio_driver};
use crate::vmi::Vmi;

/// Adds the RNG.
pub struct RngConfigurator;

impl super::super::convert::Configurator for RngConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        _ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        if vmi.spec.domain.devices.rng.is_none() {
            return Ok(());
        }
        plan.devices.push(planned(
            DeviceClass::Rng,
            None,
            Backend::Object(Object::RngRandom(ObjectRngRandom {
                qom_type: "rng-random",
                id: "objrng0".into(),
                filename: "/dev/urandom".into(),
            })),
            Device::VirtioRng(DeviceVirtioRng {
                driver: virtio_driver(
                    vmi,
                    "virtio-rng-pci-non-transitional",
                    "virtio-rng-pci-transitional",
                ),
                rng: "objrng0".into(),
                id: "rng0".into(),
            }),
            Placement::RootPort,
        ));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::testutil::{configure, drivers};
    use serde_json::json;

    #[test]
    fn rng_table() {
        let s = |v: &str| v.to_string();
        let cases = [
            (json!({}), vec![]),
            (
                json!({"rng": {}}),
                vec![("virtio-rng-pci-non-transitional", s("rng0"))],
            ),
            (
                json!({"rng": {}, "useVirtioTransitional": true}),
                vec![("virtio-rng-pci-transitional", s("rng0"))],
            ),
        ];
        for (devices, want) in cases {
            let plan = configure(
                &RngConfigurator,
                json!({ "devices": devices }),
                &ConverterContext::default(),
            )
            .unwrap();
            assert_eq!(drivers(&plan), want, "{devices}");
            if let Some(d) = plan.devices.first() {
                let Backend::Object(Object::RngRandom(o)) = &d.backend else {
                    panic!("rng backend")
                };
                assert_eq!(
                    (o.id.as_str(), o.filename.as_str()),
                    ("objrng0", "/dev/urandom")
                );
            }
        }
    }
}
