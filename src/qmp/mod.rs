//! QEMU: speaking QMP to it and hotplugging devices.
//!
//! An async, tolerant QMP client (id-tagged commands, an event stream with many listeners,
//! per-command timeouts, fd passing over SCM_RIGHTS),
//! lifecycle control mapped to KubeVirt's domain states, and transactional hotplug of disks and NICs.
//!
//! Layout:
//! - [`client`]: the QMP wire protocol (QEMU's `docs/interop/qmp-spec.rst`) over a Unix socket.
//! - [`commands`]: typed QMP commands and replies, run with [`QmpClient::run`].
//! - [`lifecycle`]: lifecycle commands and the pure event -> KubeVirt domain state mapping.
//! - [`hotplug`]: disk, cdrom and NIC hotplug in the order libvirt issues the commands.
//! - [`tap`]: opening an existing tap device by name (`TUNSETIFF`) for NIC hotplug.

pub mod client;
pub mod commands;
pub mod hotplug;
pub mod lifecycle;
pub mod tap;

pub use client::{Event, EventStream, QmpClient};
pub use hotplug::{CdromChange, DiskAttach, DiskDetach, NicAttach, NicDetach};
pub use lifecycle::{DomainState, DomainStatus, LifecycleInput, StateReason};

use std::time::Duration;

/// Everything that can fail in this module. Variants are named after the failing step.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// Connecting to the QMP Unix socket failed.
    #[error("cannot connect to the QMP socket {path}")]
    Connect {
        /// Socket path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The peer did not send a QMP greeting (`{"QMP": ...}`) in time or sent something else.
    #[error("no QMP greeting: {reason}")]
    Greeting {
        /// What went wrong.
        reason: String,
    },
    /// QEMU answered a command with an error; QEMU's error class and description are kept.
    #[error("QMP command {command} failed: {class}: {desc}")]
    Command {
        /// The command name (`execute`).
        command: String,
        /// QEMU's error class (`GenericError`, `DeviceNotFound`, `CommandNotFound`, ...).
        class: String,
        /// QEMU's human-readable description.
        desc: String,
    },
    /// No reply arrived within the per-command timeout. The connection stays usable.
    #[error("QMP command {command} got no reply within {after:?}")]
    Timeout {
        /// The command name.
        command: String,
        /// The timeout that elapsed.
        after: Duration,
    },
    /// The connection is gone (EOF, reset, or a read error); pending and later commands fail.
    #[error("QMP connection closed: {reason}")]
    Disconnected {
        /// Why the reader stopped (`EOF`, `EOF inside a partial message of N bytes`, an I/O error).
        reason: String,
    },
    /// Writing a command (and its fds) to the socket failed.
    #[error("cannot send QMP command {command}")]
    Send {
        /// The command name.
        command: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The reply of a command did not have the expected shape.
    #[error("unexpected reply to {command}: {reason}")]
    Reply {
        /// The command name.
        command: String,
        /// What was wrong.
        reason: String,
    },
    /// An expected QMP event did not arrive in time.
    #[error("no {event} event for {subject} within {after:?}")]
    EventTimeout {
        /// Event name (`DEVICE_DELETED`).
        event: String,
        /// What the event is about (a device id).
        subject: String,
        /// The timeout that elapsed.
        after: Duration,
    },
    /// A hotplug argument object lacks a field the transaction needs (`node-name`, `id`).
    #[error("hotplug argument {object}: {reason}")]
    HotplugArgs {
        /// Which object (`blockdevs[1]`, `device`, `netdev`).
        object: String,
        /// What is missing or wrong.
        reason: String,
    },
    /// A hotplug step failed; what had been added before was rolled back (see `rollback`).
    #[error("hotplug of {what} failed at {step}{}", rollback_note(.rollback_errors))]
    Hotplug {
        /// The device or node being hotplugged.
        what: String,
        /// The failed step (`blockdev-add libvirt-1-format`, `device_add ua-disk1`).
        step: String,
        /// Errors of the rollback commands, if any rollback step failed too.
        rollback_errors: Vec<String>,
        /// Cause.
        #[source]
        source: Box<QmpError>,
    },
    /// Opening a tap device failed.
    #[error("cannot open tap {name}")]
    OpenTap {
        /// Tap name.
        name: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

fn rollback_note(errors: &[String]) -> String {
    if errors.is_empty() {
        String::new()
    } else {
        format!(" (rollback also failed: {})", errors.join("; "))
    }
}
