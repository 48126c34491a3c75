//! libvirt domain XML for qlauncher's plans.
//!
//! The exporter ([`export::export`]) turns a `DomainPlan` (and the VMI it came from) into the
//! libvirt domain XML that KubeVirt v1.9's converter would hand to libvirt. The harness
//! ([`harness`]) asks libvirt (`virsh domxml-to-native qemu-argv`) for the argv it would run for
//! that XML and compares it, device by device, with qlauncher's own argv; [`golden`] compares an
//! exported XML with KubeVirt's expected XML element by element. Nothing here launches QEMU or
//! touches the pod; the libvirt tools are run only by the harness and the validation helper.
//!
//! This crate depends on `qlauncher-core` only (the VMI model and the converter's plan), and the
//! `qlauncher` crate depends on it: the launcher's `GetDomain` spec is [`export::export`] plus
//! [`api_json::to_api_spec`], and `qlauncher convert --format libvirt-xml` and `qlauncher
//! compare` call [`cli`]. The `qlauncher-compat` binary (`src/bin/qlauncher-compat.rs`) offers
//! the same `convert FILE --format libvirt-xml` and `compare FILE` without the launcher.
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
pub mod hooks;
pub mod libvirt;
pub mod schema;

pub use api_json::{to_api_spec, ApiSpec};
pub use error::CompatError;
pub use export::{export, to_xml};
