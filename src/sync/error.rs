//! `SyncError`: every way the orchestrator's steps fail. Each variant names the step; the cause
//! is its `#[source]`, never repeated in the message (the RPC's message joins the chain).

use std::path::PathBuf;
use std::time::Duration;

/// The message of a request whose VMI JSON does not decode (KubeVirt's
/// `cmd-server/server.go` `getVMIFromRequest`).
pub const INVALID_VMI_MESSAGE: &str = "No valid vmi object present in command server request";

/// The validation errors as one line, `path: reason` joined by `; `.
fn joined(errors: &[crate::vmi::FieldError]) -> String {
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    text.join("; ")
}

impl SyncError {
    /// [`SyncError::InvalidField`] at `path` for `reason`.
    pub fn invalid_field(path: crate::cmdline::FieldPath, reason: impl Into<String>) -> SyncError {
        SyncError::InvalidField {
            path,
            reason: reason.into(),
        }
    }
}

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
    /// The VMI is not valid (KubeVirt's defaults applied, [`crate::sync::admit`]): every field
    /// the validation rejects, with its JSON path and the reason.
    #[error("invalid VMI: {}", joined(.0))]
    Invalid(Vec<crate::vmi::FieldError>),
    /// A field of an admitted VMI cannot be used with the pod's facts (a claim without its
    /// capacity, a binding a network does not take, a quantity out of the domain's range).
    #[error("invalid VMI: {path}: {reason}")]
    InvalidField {
        /// The field's JSON path, e.g. `spec.volumes[2].emptyDisk.capacity`.
        path: crate::cmdline::FieldPath,
        /// Why it cannot be used.
        reason: String,
    },
    /// The request's VMI JSON does not decode (KubeVirt's message, [`INVALID_VMI_MESSAGE`]).
    #[error("{}", INVALID_VMI_MESSAGE)]
    UndecodableVmi,
    /// A migration request KubeVirt's launcher refuses too, in its words (a backup running, no
    /// migration state yet, a job already executed, the functional-test annotation, ...), or
    /// one this launcher cannot serve (a transport other than `Unix`).
    #[error("{0}")]
    MigrationRefused(String),
    /// `qemu --version` gave no version (no domain runs to ask over QMP).
    #[error("{} --version gave no version", qemu.display())]
    NoQemuVersion {
        /// The QEMU binary asked.
        qemu: PathBuf,
    },
    /// Preparing a disk image or ISO failed.
    #[error("preparing storage")]
    Storage(#[source] crate::storage::StorageError),
    /// Setting up the pod network or the DHCP server failed.
    #[error("setting up the network")]
    Net(#[source] crate::net::NetError),
    /// Converting the VMI to a QEMU command line failed.
    #[error("converting the VMI")]
    Convert(#[source] crate::cmdline::ConvertError),
    /// The defined plan has a device or setting the `api.Domain` cannot show (the exporter's
    /// refusal), or its spec does not decode as `api.DomainSpec`: virt-handler would be shown
    /// a domain without it, so the definition fails.
    #[error("the domain spec cannot show the defined plan")]
    DomainSpec(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A hook sidecar could not be called, or its call failed ([`crate::hooks`]).
    #[error("hook sidecar")]
    Hook(#[source] crate::hooks::HookError),
    /// A hook sidecar's `OnDefineDomain` answer asks for a change qlauncher cannot make (or
    /// cannot read): the start is refused, naming the sidecar, the element path and both values.
    #[error("hook sidecar {}: refused: {refusal}", socket.display())]
    HookRefused {
        /// The sidecar's socket.
        socket: std::path::PathBuf,
        /// The element, the values sent and answered, and why.
        refusal: qlauncher_libvirt_xml::hooks::Refusal,
    },
    /// A VEP-190 plugin's domain hooks stopped the definition (a condition that cannot be
    /// evaluated, or a `Fail` hook that failed or was refused), naming the plugin and the hook
    /// ([`crate::hooks::plugins::pipeline`]).
    #[error("applying plugin domain hooks failed: {0}")]
    Plugin(#[source] Box<crate::hooks::plugins::pipeline::PluginError>),
    /// `pluginsJson` of the SyncVirtualMachine options is not a JSON array of `Plugin` objects
    /// (KubeVirt's `setPluginsFromOptions`).
    #[error("failed to deserialize plugins from options: {0}")]
    PluginsJson(#[source] serde_json::Error),
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
    /// ([`crate::sync::cmdapi`]); its text is the RPC's message.
    #[error(transparent)]
    CmdApi(#[from] crate::sync::cmdapi::CmdApiError),
    /// A guest agent command failed ([`crate::sync::guest::agent`]).
    #[error(transparent)]
    Agent(crate::sync::guest::agent::AgentError),
}

/// The agent's [`AgentError::NoDomain`](crate::sync::guest::agent::AgentError::NoDomain) is the
/// orchestrator's [`SyncError::NoDomain`]; every other failure is [`SyncError::Agent`].
impl From<crate::sync::guest::agent::AgentError> for SyncError {
    fn from(e: crate::sync::guest::agent::AgentError) -> SyncError {
        match e {
            crate::sync::guest::agent::AgentError::NoDomain => SyncError::NoDomain,
            other => SyncError::Agent(other),
        }
    }
}
