//! QEMU argument types, one struct per QEMU device, blockdev, netdev or object, named after QEMU
//! and carrying QEMU's property names (Kata runtime-rs's convention). Each serializes to the JSON
//! object that both the argv (`-device '{...}'`, QEMU >= 6.2 for -device, 7.1 for -netdev) and QMP
//! (`device_add`, `blockdev-add`, `netdev_add`) take: one description, two transports. The few
//! key=value switches go through the single escaping writer [`KeyVal`].

mod blockdev;
mod chardev;
mod device;
mod keyval;
mod netdev;
mod object;
mod qmp_args;

pub use blockdev::*;
pub use chardev::*;
pub use device::*;
pub use keyval::{escape_value, KeyVal};
pub use netdev::*;
pub use object::*;
pub use qmp_args::*;

/// Serializes a QEMU argument struct to a JSON value. Every struct here serializes infallibly
/// (strings, numbers, booleans and nested structs only), so a failure is mapped to `null` rather
/// than a panic.
pub fn to_json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}
