//! qlauncher: a libvirt-free virt-launcher for KubeVirt.
//!
//! In KubeVirt each VM runs in a pod whose compute container holds virt-launcher-monitor,
//! virt-launcher, libvirt's virtqemud and virtlogd, and QEMU. qlauncher replaces everything but
//! QEMU with this one crate. The modules follow one dependency direction:
//!
//! ```text
//! vmi (API types) <- cmdline (pure converter) <- storage, net, qmp, hooks (effects) <- sync (orchestrator)
//! monitor: PID 1 process plumbing
//! labeller: the node labeller (qmp, the host's /dev, /sys, /proc)
//! ```
//!
//! `cmdline` does no I/O: every fact about the pod is gathered by the effect modules first and handed
//! to the converter in its context. The behaviour mirrors KubeVirt v1.9.0 (libvirt 11.10, QEMU 10.1)
//! and also runs on QEMU 7.2.
#![warn(missing_docs)]
// The docs are read with `cargo doc --document-private-items`, where links to private items resolve.
#![allow(rustdoc::private_intra_doc_links)]

/// The pure converter (VMI -> DomainPlan -> QEMU argv), compiled in the `qlauncher-core` crate.
pub use qlauncher_core::cmdline;
/// The VMI model (kubevirt.io/v1 types, defaults, validation), compiled in the `qlauncher-core` crate.
pub use qlauncher_core::vmi;

pub mod hooks;
pub mod labeller;
pub mod libvirt_rpc;
pub mod log;
pub mod monitor;
pub mod net;
pub mod qmp;
pub mod storage;
pub mod sync;
pub mod sys;
