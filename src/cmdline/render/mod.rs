//! Renderers: the plan printed as a QEMU argv (QEMU 7.2 and 10.x), as a shell line, and as the
//! QMP device plan. They make no decisions beyond the QEMU version's spelling.

mod argv;
mod qmp;

pub use argv::{argv, shell_line};
pub use qmp::{qmp_plan, DiskHotplug, NicHotplug, QmpCommand, QmpPlan};

use super::plan::PlannedDevice;
use super::qemu::to_json;
use serde_json::Value;

/// The `-device` / `device_add` JSON of a planned device: the device struct with the PCI
/// address (`bus`, `addr`) the PCI pass assigned merged in.
pub fn device_json(d: &PlannedDevice) -> Value {
    let mut v = to_json(&d.device);
    if let (Some(addr), Value::Object(map)) = (&d.address, &mut v) {
        map.insert("bus".into(), Value::String(addr.bus.clone()));
        map.insert("addr".into(), Value::String(addr.addr.clone()));
    }
    v
}
