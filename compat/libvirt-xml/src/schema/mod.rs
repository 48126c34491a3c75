//! The libvirt domain XML elements KubeVirt v1.9's converter writes, as serde structs for
//! quick-xml (`@name` = attribute, `$text` = text content, `$value` = a list of differently named
//! child elements).
//!
//! Element order follows KubeVirt's Go structs (`pkg/virt-launcher/virtwrap/api/schema.go`:
//! domain at lines 220-247, devices at 640-663), so a KubeVirt-shaped domain reads the same way;
//! libvirt's own schema (`domaincommon.rng`) accepts any order inside `<domain>` and `<devices>`.
//! The device list is one `$value` sequence of [`Device`] variants in KubeVirt's class order, so
//! writing it needs no quick-xml `overlapped-lists` (that feature is for deserialising libvirt
//! XML into per-kind lists, where device kinds interleave; nothing here deserialises: the golden
//! comparison reads XML as a generic tree).
//!
//! Layout: this file holds the small shared elements (`Empty`, `State`, `TypeAttr`, ...);
//! `domain.rs` the `<domain>` element and its top-level children (memory, `<os>`, `<sysinfo>`,
//! `<clock>`, `<metadata>`), `cpu.rs` `<features>`, `<cpu>` and `<vcpu>`, `devices.rs`
//! `<devices>` and every device element but disks, `disks.rs` `<disk>`. Everything is
//! re-exported here: `use crate::schema::*`.

mod cpu;
mod devices;
mod disks;
mod domain;

use serde::Serialize;

pub use cpu::*;
pub use devices::*;
pub use disks::*;
pub use domain::*;

/// An element with no attributes and no content (`<acpi/>`, `<readonly/>`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Empty {}

/// An element with only a `state` attribute (`<vmport state="off"/>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct State {
    /// `on` / `off`.
    #[serde(rename = "@state")]
    pub state: String,
}

/// An element with only a `type` attribute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TypeAttr {
    /// The type.
    #[serde(rename = "@type")]
    pub type_: String,
}

/// An element with only a `mode` attribute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModeAttr {
    /// The mode.
    #[serde(rename = "@mode")]
    pub mode: String,
}

/// An element with only a `name` attribute (`<alias name="ua-disk0"/>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NameAttr {
    /// The name.
    #[serde(rename = "@name")]
    pub name: String,
}
