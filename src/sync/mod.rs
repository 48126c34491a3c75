//! SyncVMI and the command server: the one orchestrator.
//!
//! Laid out as KubeVirt's `SyncVMI` reads (`pkg/virt-launcher/virtwrap/manager.go`, v1.9.0), in
//! rooms from the program down (ARCHITECTURE.md draws them, with the imports that run back up):
//!
//! - [`launcher`]: the launcher program (`virt-launcher`, `qlauncher launcher`) over all of it;
//! - [`vmi_sync`]: the dispatcher, [`SyncVmi`], one serialised, idempotent sync at a time;
//!   `manager_impl.rs`: its [`DomainManager`](rpc::manager::DomainManager) impl (each RPC a few
//!   lines); [`supervision`]: the launcher's and the grace period's view of the domain;
//! - the features, each over the domain context (`ctx.rs`, `DomainCtx`): `admit.rs` (defaults,
//!   validation, the spec key), [`start`] (the first sync: facts, define, spawn QEMU, connect,
//!   start-up, `cont`), [`recover`] (adopting a QEMU an earlier launcher of the pod left),
//!   [`reconcile`] (later syncs applied by diff: disks, media, resize, NICs; the vCPU and memory
//!   RPCs), [`cmdapi`] (the guest-agent info, freeze, screenshot, memory-dump, dirty-rate,
//!   VM-stats, host-device and SEV RPCs), [`backup`] (push backups with changed block tracking
//!   and checkpoints), [`migration`] (live migration, both sides);
//! - `define.rs`: the seam where a converted plan becomes QEMU's argv, its QMP plan and the
//!   `api.Domain` spec (made by `domain_spec.rs`);
//! - `domain_live.rs`: what QEMU reports into the `api.Domain` (hot-plugged devices' addresses,
//!   the resolved machine, channel states); [`state`]: the running domain, the state shared with
//!   the QMP event task, `api.Domain` events;
//! - [`facts`]: gathering what the converter needs (storage, pod network, secondary interfaces,
//!   hotplug volumes, host hardware), KubeVirt's `generateConverterContext`;
//! - [`guest`]: the guest agent ([`guest::agent`]), domain statistics ([`guest::stats`]) and
//!   [`guest::info`];
//! - [`rpc`]: the wire: [`rpc::proto`] (generated from `proto/`), [`rpc::manager`] (the
//!   `DomainManager` trait the service calls), [`rpc::server`] (the command server),
//!   [`rpc::notify`] (the notify client), [`rpc::uds`];
//! - [`domain`]: the `api.Domain` JSON; [`config`]: the launcher's settings; [`qemu_version`]:
//!   QEMU's version before a domain exists; [`privileges`]: QEMU's user, umask and descriptors;
//!   [`error`]: [`SyncError`].

pub(crate) mod admit;
pub mod backup;
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
