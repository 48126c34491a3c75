//! libvirt domain XML for qlauncher's plans.
//!
//! The exporter ([`export::export`]) turns a `DomainPlan` (and the VMI it came from) into the
//! libvirt domain XML that KubeVirt v1.9's converter would hand to libvirt. The harness
//! ([`harness`]) asks libvirt (`virsh domxml-to-native qemu-argv`) for the argv it would run for
//! that XML and compares it, device by device, with qlauncher's own argv; [`golden`] compares an
//! exported XML with KubeVirt's expected XML element by element. Nothing here launches QEMU or
//! touches the pod; the libvirt tools are run only by the harness and the validation helper.
//!
//! The `qlauncher-compat` binary (`src/bin/qlauncher-compat.rs`) offers
//! `convert FILE --format libvirt-xml` and `compare FILE`. It is a second binary rather than a
//! subcommand of `qlauncher` because this crate depends on `qlauncher`: the main binary
//! depending back on it would be a cycle.
#![warn(missing_docs)]

pub mod api_json;
pub mod argv;
pub mod cli;
pub mod context;
pub mod error;
pub mod export;
mod go_fields;
pub mod golden;
pub mod harness;
pub mod libvirt;
pub mod schema;

pub use api_json::{to_api_spec, ApiSpec};
pub use error::CompatError;
pub use export::{export, to_xml};
