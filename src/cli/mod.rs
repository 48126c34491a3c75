//! The subcommands of the `qlauncher` binary, one file per area. Only the binary uses these.
pub mod convert;
pub mod hook_diff;
pub mod monitor;
pub mod net;
pub mod node_labeller;
pub mod qemu_version;
pub mod qmp;
pub mod run;
pub mod sync;
pub mod validate;
