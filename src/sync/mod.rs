//! SyncVMI and the command server: the one orchestrator.
//!
//! Laid out as KubeVirt's `SyncVMI` reads (`pkg/virt-launcher/virtwrap/manager.go`, v1.9.0):
//!
//! - [`vmi_sync`]: [`SyncVmi`], one serialised, idempotent sync at a time; `manager_impl.rs`:
//!   its [`server::DomainManager`] impl (each RPC a few lines);
//! - [`facts`]: gathering what the converter needs (storage, pod network, secondary interfaces,
//!   hotplug volumes, host hardware), KubeVirt's `generateConverterContext`;
//! - [`start`]: the first sync: facts, convert, spawn QEMU, connect, start-up, `cont`;
//!   [`recover`]: adopting a QEMU an earlier launcher of the pod left; `define`: the seam where
//!   a converted plan becomes QEMU's argv, its QMP plan and the `api.Domain` spec;
//! - [`state`]: the running domain, the state shared with the QMP event task, `api.Domain`
//!   events; [`supervision`]: the launcher's and the grace period's view of the domain;
//! - [`reconcile`]: later syncs applied by diff (disks, media, resize, NICs) and the vCPU and
//!   memory RPCs;
//! - [`rpc`]: the wire layer: [`proto`] (generated from `proto/`), [`server`] (the command
//!   server), [`notify`] (the notify client), [`uds`];
//! - [`guest`]: the guest agent ([`agent`]), domain statistics ([`stats`]) and [`info`];
//! - [`cmdapi`]: the guest-agent info, freeze, screenshot, memory-dump, dirty-rate, VM-stats,
//!   host-device and SEV RPCs;
//! - [`domain`]: the `api.Domain` JSON both carry;
//! - [`launcher`]: the launcher program (`virt-launcher`, `qlauncher launcher`) over all of it.

pub(crate) mod admit;
pub mod cmdapi;
pub mod config;
pub(crate) mod ctx;
pub(crate) mod define;
pub mod domain;
pub(crate) mod domain_live;
pub(crate) mod domain_spec;
pub mod error;
pub mod facts;
pub mod guest;
pub mod launcher;
mod manager_impl;
pub mod migration;
pub mod privileges;
pub mod qemu_version;
pub mod reconcile;
pub mod recover;
pub mod rpc;
pub mod start;
pub mod state;
pub mod supervision;
pub mod vmi_sync;

pub use config::SyncConfig;
pub use error::SyncError;
pub use vmi_sync::SyncVmi;
