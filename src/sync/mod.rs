//! SyncVMI and the command server: the one orchestrator.
//!
//! Serialised, idempotent syncs that prepare storage and network, convert, launch QEMU or hotplug by
//! diff; the gRPC server on `launcher-sock` wire-compatible with KubeVirt's `kubevirt.cmd.v1` API; and
//! the notify client that reports domain events to virt-handler.
