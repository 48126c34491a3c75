//! The gRPC wire layer of KubeVirt's handler <-> launcher API (`pkg/handler-launcher-com`):
//! [`proto`] (generated), [`server`] (the command server on `launcher-sock`), [`notify`] (the
//! client of virt-handler's notify server), [`uds`] (Unix socket transport) and [`authority`] (any
//! `:authority` on the command socket).

pub mod authority;
pub mod manager;
pub mod notify;
pub mod proto;
pub mod server;
pub(crate) mod service;
pub mod uds;
