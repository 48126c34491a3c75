//! `SyncError`: every way the orchestrator's steps fail. Each variant names the step; the cause
//! is its `#[source]`, never repeated in the message (the RPC's message joins the chain).

use std::path::PathBuf;
use std::time::Duration;

/// Errors of the sync module. Each variant names the step that failed; the cause is its source.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Creating the directory that holds the command socket failed.
    #[error("cannot create socket directory {path}")]
    CreateSocketDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Removing a stale socket file before listening failed.
    #[error("cannot remove stale socket {path}")]
    RemoveStaleSocket {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Listening on the command socket failed.
    #[error("cannot listen on {path}")]
    BindSocket {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The command server did not answer its own Ping in time.
    #[error("command server on {path} did not answer Ping within {waited:?}")]
    SelfPingTimeout {
        /// The socket path.
        path: PathBuf,
        /// How long it was tried.
        waited: Duration,
    },
    /// Renaming `launcher-init-sock` to `launcher-sock` (the readiness signal) failed.
    #[error("cannot mark the command server ready: rename {from} to {to}")]
    MarkReady {
        /// The init socket.
        from: PathBuf,
        /// The ready socket.
        to: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server stopped with an error.
    #[error("command server failed")]
    Serve(#[source] tonic::transport::Error),
    /// Encoding a domain as JSON for a notification failed.
    #[error("cannot encode the domain as JSON")]
    EncodeDomain(#[source] serde_json::Error),
    /// Connecting to virt-handler's notify socket failed.
    #[error("cannot connect to the notify socket {path}")]
    NotifyConnect {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: tonic::transport::Error,
    },
    /// A gRPC call to virt-handler's notify server failed.
    #[error("notify call {call} failed")]
    NotifyCall {
        /// `Info`, `HandleDomainEvent` or `HandleK8sEvent`.
        call: &'static str,
        /// The gRPC status.
        #[source]
        source: tonic::Status,
    },
    /// A gRPC call to virt-handler's notify server took longer than its timeout.
    #[error("notify call {call} timed out after {waited:?}")]
    NotifyCallTimeout {
        /// `Info`, `HandleDomainEvent` or `HandleK8sEvent`.
        call: &'static str,
        /// The per-call timeout.
        waited: Duration,
    },
    /// virt-handler offers no notify API version qlauncher speaks.
    #[error("virt-handler offers notify versions {offered:?}, qlauncher speaks only 1")]
    NotifyVersion {
        /// The versions virt-handler listed.
        offered: Vec<u32>,
    },
    /// Sending a notification kept failing until the total timeout ran out.
    #[error("{event_type} notification not delivered within {waited:?}")]
    NotifyGaveUp {
        /// `ADDED`, `MODIFIED`, `DELETED`, or `K8S` for a Kubernetes event.
        event_type: &'static str,
        /// The total timeout.
        waited: Duration,
        /// The last failure.
        #[source]
        last: Box<SyncError>,
    },
    /// virt-handler received the notification but answered `success=false`.
    #[error("failed to notify domain event: {message}")]
    NotifyRejected {
        /// virt-handler's message.
        message: String,
    },
    /// The notifier's worker task is gone (runtime shutting down).
    #[error("the notifier has stopped")]
    NotifierStopped,
    /// The VMI is not valid (defaults applied); the message names the fields.
    #[error("invalid VMI: {0}")]
    InvalidVmi(String),
    /// Preparing a disk image or ISO failed.
    #[error("preparing storage")]
    Storage(#[source] crate::storage::StorageError),
    /// Setting up the pod network or the DHCP server failed.
    #[error("setting up the network")]
    Net(#[source] crate::net::NetError),
    /// Converting the VMI to a QEMU command line failed.
    #[error("converting the VMI")]
    Convert(#[source] crate::cmdline::ConvertError),
    /// Preparing QEMU's directories or log failed.
    #[error("preparing QEMU: {what}")]
    PrepareQemu {
        /// What was done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Starting or watching QEMU failed.
    #[error("starting QEMU")]
    StartQemu(#[source] crate::monitor::MonitorError),
    /// QEMU exited before its QMP monitor answered.
    #[error("QEMU exited at start: {log_tail}")]
    QemuExitedEarly {
        /// The last lines of QEMU's log.
        log_tail: String,
    },
    /// A QMP command failed.
    #[error("QMP")]
    Qmp(#[source] crate::qmp::QmpError),
    /// Preparing, plugging or unplugging one VMI interface failed.
    #[error("interface {interface}")]
    Interface {
        /// The interface name (`spec.domain.devices.interfaces[].name`).
        interface: String,
        /// The cause.
        #[source]
        source: Box<SyncError>,
    },
    /// The operation needs a running domain and there is none.
    #[error("no domain is running")]
    NoDomain,
    /// A worker task failed.
    #[error("worker task failed: {0}")]
    Task(String),
    /// The operation is not supported by qlauncher.
    #[error("not supported by qlauncher: {0}")]
    Unsupported(String),
    /// A request refused with KubeVirt's own message (the text is the RPC's message as
    /// virt-launcher words it, e.g. a repeated migration's `migration job <uid> already
    /// executed, ...`).
    #[error("{0}")]
    Refused(String),
    /// A guest-agent, freeze, screenshot, dump, dirty-rate, host-device or SEV RPC failed
    /// ([`crate::cmdapi`]); its text is the RPC's message.
    #[error(transparent)]
    CmdApi(#[from] crate::sync::cmdapi::CmdApiError),
    /// Connecting to the guest agent's channel socket failed.
    #[error("cannot connect to the guest agent channel {path}")]
    AgentConnect {
        /// The `org.qemu.guest_agent.0` socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Talking to the guest agent failed (channel closed, write or read error).
    #[error("guest agent command {command}: channel error")]
    AgentIo {
        /// The agent command.
        command: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The guest agent did not answer in time (often: no agent runs in the guest).
    #[error("guest agent did not answer {command} within {waited:?}")]
    AgentTimeout {
        /// The agent command.
        command: String,
        /// The timeout.
        waited: Duration,
    },
    /// The guest agent answered something that is not a valid reply.
    #[error("guest agent command {command}: bad reply: {reason}")]
    AgentReply {
        /// The agent command.
        command: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The guest agent answered with an error.
    #[error("guest agent command {command} failed: {class}: {desc}")]
    AgentCommand {
        /// The agent command.
        command: String,
        /// QEMU error class, e.g. `CommandNotFound`.
        class: String,
        /// The agent's description.
        desc: String,
    },
    /// A `guest-exec` command was still running at the deadline (KubeVirt's message).
    #[error("Timed out waiting for guest pid [{pid}] for command [{command}] to exit")]
    GuestExecTimeout {
        /// The guest pid.
        pid: i64,
        /// The command path.
        command: String,
    },
}
