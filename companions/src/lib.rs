//! The programs KubeVirt v1.9.0 runs from the launcher image besides the launcher itself, each
//! behaving as KubeVirt's own (flags, exit codes, socket paths, timing):
//!
//! - [`container_disk`]: `container-disk` (static; containerDisk and hotplug holders);
//! - [`tail`]: `virt-tail` (the `guest-console-log` sidecar);
//! - [`probe`]: `virt-probe` (exec and guest-agent-ping probes);
//! - [`freezer`]: `virt-freezer` (Velero's backup hooks).
//!
//! Where KubeVirt runs each, and why: `kubevirt-launcher-image.md` of the project's references
//! (§1.2-1.5, §3.1-3.4). The two last ones talk to the launcher's cmd socket through
//! [`cmd_client`] (feature `cmd-client`, on by default).

#![warn(missing_docs)]

pub mod container_disk;
pub mod flags;
pub mod log;
pub mod tail;

#[cfg(feature = "cmd-client")]
pub mod cmd_client;
#[cfg(feature = "cmd-client")]
pub mod freezer;
#[cfg(feature = "cmd-client")]
pub mod probe;
