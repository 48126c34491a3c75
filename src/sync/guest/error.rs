//! [`AgentError`]: every way a guest agent command fails ([`super::agent::GuestAgent`]), the
//! guest agent's own error type; the orchestrator wraps it as
//! [`SyncError::Agent`](crate::sync::error::SyncError::Agent).

use std::path::PathBuf;
use std::time::Duration;

/// Every way a guest agent command fails. The `Display` text names the command; the cause is
/// the `#[source]`.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// No domain is known yet, so there is no agent channel.
    #[error("no domain is running")]
    NoDomain,
    /// Connecting to the guest agent's channel socket failed.
    #[error("cannot connect to the guest agent channel {path}")]
    Connect {
        /// The `org.qemu.guest_agent.0` socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Talking to the guest agent failed (channel closed, write or read error).
    #[error("guest agent command {command}: channel error")]
    Io {
        /// The agent command.
        command: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The guest agent did not answer in time (often: no agent runs in the guest).
    #[error("guest agent did not answer {command} within {waited:?}")]
    Timeout {
        /// The agent command.
        command: String,
        /// The timeout.
        waited: Duration,
    },
    /// The guest agent answered something that is not a valid reply.
    #[error("guest agent command {command}: bad reply: {reason}")]
    Reply {
        /// The agent command.
        command: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The guest agent answered with an error.
    #[error("guest agent command {command} failed: {class}: {desc}")]
    Command {
        /// The agent command.
        command: String,
        /// QEMU error class, e.g. `CommandNotFound`.
        class: String,
        /// The agent's description.
        desc: String,
    },
    /// A `guest-exec` command was still running at the deadline (KubeVirt's message).
    #[error("Timed out waiting for guest pid [{pid}] for command [{command}] to exit")]
    ExecTimeout {
        /// The guest pid.
        pid: i64,
        /// The command path.
        command: String,
    },
}
