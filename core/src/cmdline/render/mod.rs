//! Renderers: the plan printed as a QEMU argv (QEMU 7.2 and 10.x), as a shell line, and as the
//! QMP device plan. They make no decisions beyond the QEMU version's spelling.

mod argv;
mod qmp;

pub use argv::{argv, shell_line};
pub use qmp::{qmp_plan, DiskHotplug, NicHotplug, PlacedDevice, QmpCommand, QmpPlan};

use super::plan::PlannedDevice;
use super::qemu::to_json;
use serde_json::Value;

/// The `-device` / `device_add` JSON of a planned device: the device struct with the PCI
/// address (`bus`, `addr`) the PCI pass assigned merged in ([`PlacedDevice`]).
pub fn device_json(d: &PlannedDevice) -> Value {
    to_json(&PlacedDevice::of(d))
}

/// The `-device` argument of a planned device (the JSON of [`device_json`] as text).
pub fn device_arg(d: &PlannedDevice) -> String {
    serde_json::to_string(&PlacedDevice::of(d)).unwrap_or_default()
}
