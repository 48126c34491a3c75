//! Renderers: the plan printed as a QEMU argv (QEMU 7.2 and 10.x), as a shell line, and as the
//! QMP device plan. They make no decisions beyond the QEMU version's spelling.

mod argv;
mod qmp;

pub use argv::{argv, shell_line};
pub use qmp::{qmp_plan, DiskHotplug, NicHotplug, PlacedDevice, QmpCommand, QmpPlan};

use super::plan::PlannedDevice;
use super::qemu::to_json;
use serde_json::Value;

/// A device with `iommu_platform` (SEV guests) and the PCI address the PCI pass assigned
/// (`bus`, `addr`) appended.
#[derive(serde::Serialize)]
struct Addressed<'a> {
    #[serde(flatten)]
    device: &'a super::qemu::Device,
    #[serde(skip_serializing_if = "Option::is_none")]
    iommu_platform: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bus: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    addr: Option<&'a str>,
}

fn addressed(d: &PlannedDevice) -> Addressed<'_> {
    Addressed {
        device: &d.device,
        iommu_platform: d.iommu_platform.then_some(true),
        bus: d.address.as_ref().map(|a| a.bus.as_str()),
        addr: d.address.as_ref().map(|a| a.addr.as_str()),
    }
}

/// The `-device` / `device_add` JSON of a planned device: the device struct with the PCI
/// address (`bus`, `addr`) the PCI pass assigned merged in.
pub fn device_json(d: &PlannedDevice) -> Value {
    to_json(&addressed(d))
}

/// The `-device` argument of a planned device (the JSON of [`device_json`] as text).
pub fn device_arg(d: &PlannedDevice) -> String {
    serde_json::to_string(&addressed(d)).unwrap_or_default()
}
