//! Low-level helpers shared by the effect modules (`net`, `qmp`, `storage`, `monitor`) and the
//! orchestrator: the tun ioctls ([`tun`]), `/proc` parsing ([`procfs`]), MAC addresses ([`mac`])
//! and error chains ([`error`]). `sys` imports none of the modules above it.

pub mod error;
pub mod mac;
pub use qlauncher_monitor::procfs;
pub mod tun;
