//! qlauncher-core: the VMI model and the pure converter, compiled as their own crate.
//!
//! ```text
//! vmi (API types) <- cmdline (pure converter)
//! ```
//!
//! This crate is the part of qlauncher that does no I/O: its dependency list has no async runtime,
//! no system-call crate and no process handling, so `cmdline` stays a pure function of
//! (VMI, [`cmdline::ConverterContext`]) by construction. The `qlauncher` crate re-exports both
//! modules as `qlauncher::vmi` and `qlauncher::cmdline`, and `compat/libvirt-xml` reads the plan
//! from here.
#![warn(missing_docs)]
// The docs are read with `cargo doc --document-private-items`, where links to private items resolve.
#![allow(rustdoc::private_intra_doc_links)]

pub mod cmdline;
pub mod vmi;
