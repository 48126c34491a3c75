//! The converter: a KubeVirt VMI becomes one typed `DomainPlan`.
//!
//! One configurator per device family (as KubeVirt's `pkg/virt-launcher/virtwrap/converter/`), each a
//! pure function of the VMI and a `ConverterContext` that carries every fact gathered from the pod
//! beforehand (image formats and sizes, file or block, MACs, MTU, QEMU version). Renderers turn the
//! plan into a QEMU command line (QEMU 7.2 and 10.x) and a QMP device plan for hotplug. Nothing here
//! touches the file system, spawns a process or uses tokio.
//!
//! Layout: `context.rs` (facts in), `facts_file.rs` (`NAME.facts.json`, facts written down for
//! fixtures and `convert`), `plan.rs` (the typed plan), `qemu/` (one struct per QEMU
//! device/blockdev/netdev/object, QEMU's property names, and the one key=value writer),
//! `devices/` (configurators, one file per family), `convert.rs` (the ordered configurator list),
//! `passes/` (cross-cutting work after the configurators), `render/` (argv, shell, QMP plan),
//! `error.rs` (`ConvertError` with a `FieldPath`).

pub mod context;
pub mod error;
pub mod facts_file;
pub mod passes;
pub mod plan;
pub mod qemu;
pub mod render;

pub use context::ConverterContext;
pub use error::{ConvertError, FieldPath};
pub use facts_file::FactsFile;
pub use plan::DomainPlan;
pub mod convert;
pub mod devices;
pub mod names;
#[cfg(test)]
mod testutil;

pub use convert::{convert, Configurator};
