//! The `api.Domain` status and events: run state and reason, the guest agent's interfaces, OS and
//! freeze state, and the notification event types (`pkg/virt-launcher/virtwrap/api/schema.go`,
//! v1.9.0).

use serde::{Deserialize, Serialize};

/// `api.DomainStatus`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DomainStatus {
    /// Run state.
    #[serde(rename = "Status", default)]
    pub status: LifeCycle,
    /// Why the domain is in that state.
    #[serde(rename = "Reason", default)]
    pub reason: StateChangeReason,
    /// Guest interfaces as the guest agent reports them.
    #[serde(rename = "Interfaces", default)]
    pub interfaces: Vec<InterfaceStatus>,
    /// Guest OS as the guest agent reports it.
    #[serde(rename = "OSInfo", default)]
    pub os_info: GuestOsInfo,
    /// Filesystem freeze state.
    #[serde(rename = "FSFreezeStatus", default)]
    pub fs_freeze_status: FsFreeze,
    /// Details of the last guest panic, if any.
    #[serde(rename = "GuestPanicInfo", default)]
    pub guest_panic_info: Option<GuestPanicInfo>,
    /// Number of guest panics seen.
    #[serde(rename = "PanicCount", default)]
    pub panic_count: i64,
}

/// `api.LifeCycle`: the domain's run state (libvirt's `virDomainState` names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum LifeCycle {
    /// No state (also: the domain does not exist).
    #[default]
    NoState,
    /// vCPUs running.
    Running,
    /// Blocked on a resource.
    Blocked,
    /// vCPUs stopped.
    Paused,
    /// Guest shutting down.
    ShuttingDown,
    /// QEMU gone.
    Shutoff,
    /// Guest crashed.
    Crashed,
    /// Guest suspended by power management.
    #[serde(rename = "PMSuspended")]
    PmSuspended,
    /// The launcher is unreachable (set by virt-handler, never by a launcher).
    Unknown,
}

/// `api.StateChangeReason`: why the domain reached its state. One variant per distinct wire
/// string; Go reuses some strings for several states (`User`, `Unknown`, `Crashed`, ...).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StateChangeReason {
    /// No reason given (Go's zero value, the empty string).
    #[default]
    #[serde(rename = "")]
    Unset,
    /// Unknown reason (any state).
    Unknown,
    /// On user request (shutting down, paused).
    User,
    /// Shut off: guest shut down.
    Shutdown,
    /// Shut off: killed.
    Destroyed,
    /// Shut off: migrated away.
    Migrated,
    /// Shut off or paused: guest crashed.
    Crashed,
    /// Shut off: guest panicked.
    Panicked,
    /// Shut off: saved.
    Saved,
    /// Shut off: failed to start.
    Failed,
    /// Shut off or paused: restored from a snapshot.
    FromSnapshot,
    /// No state: the domain does not exist.
    NonExistent,
    /// Paused for migration.
    Migration,
    /// Paused for save.
    Save,
    /// Paused for a memory dump.
    Dump,
    /// Paused on a disk I/O error.
    #[serde(rename = "IOError")]
    IoError,
    /// Paused by the watchdog.
    Watchdog,
    /// Paused while shutting down.
    ShuttingDown,
    /// Paused for a snapshot.
    Snapshot,
    /// Paused while starting (QEMU started with `-S`).
    StartingUp,
    /// Paused in post-copy migration.
    Postcopy,
    /// Paused after post-copy migration failed.
    PostcopyFailed,
}

/// `api.InterfaceStatus`: one guest interface as the guest agent reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InterfaceStatus {
    /// MAC address.
    #[serde(rename = "Mac", default)]
    pub mac: String,
    /// First IP address (without prefix length).
    #[serde(rename = "Ip", default)]
    pub ip: String,
    /// All IP addresses.
    #[serde(rename = "IPs", default)]
    pub ips: Vec<String>,
    /// Guest interface name, e.g. `eth0`.
    #[serde(rename = "InterfaceName", default)]
    pub interface_name: String,
}

/// `api.GuestOSInfo` (from the guest agent's `guest-get-osinfo`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct GuestOsInfo {
    #[serde(rename = "Name", default)]
    pub name: String,
    #[serde(rename = "KernelRelease", default)]
    pub kernel_release: String,
    #[serde(rename = "Version", default)]
    pub version: String,
    #[serde(rename = "PrettyName", default)]
    pub pretty_name: String,
    #[serde(rename = "VersionId", default)]
    pub version_id: String,
    #[serde(rename = "KernelVersion", default)]
    pub kernel_version: String,
    #[serde(rename = "Machine", default)]
    pub machine: String,
    #[serde(rename = "Id", default)]
    pub id: String,
}

/// `api.FSFreeze`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FsFreeze {
    /// `thawed`, `frozen`, or empty when unknown.
    #[serde(rename = "Status", default)]
    pub status: String,
}

/// `api.GuestPanicInfo`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GuestPanicInfo {
    /// Panic kind reported by QEMU, e.g. `hyper-v`, `s390`, `unknown`.
    #[serde(rename = "Type", default)]
    pub panic_type: String,
    /// Hyper-V bugcheck code.
    #[serde(rename = "Arg1", default)]
    pub arg1: u64,
    /// Hyper-V bugcheck parameter.
    #[serde(rename = "Arg2", default)]
    pub arg2: u64,
    /// Hyper-V bugcheck parameter.
    #[serde(rename = "Arg3", default)]
    pub arg3: u64,
    /// Hyper-V bugcheck parameter.
    #[serde(rename = "Arg4", default)]
    pub arg4: u64,
    /// Hyper-V bugcheck parameter.
    #[serde(rename = "Arg5", default)]
    pub arg5: u64,
}

/// The type of a domain notification: a Kubernetes watch event type (`watch.EventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DomainEventType {
    /// The domain was defined or started (`ADDED`).
    Added,
    /// Any other change (`MODIFIED`), including KubeVirt's final delete notification.
    Modified,
    /// The domain object is gone (`DELETED`).
    Deleted,
}

impl DomainEventType {
    /// The wire string of `DomainEventRequest.eventType`.
    pub fn as_str(self) -> &'static str {
        match self {
            DomainEventType::Added => "ADDED",
            DomainEventType::Modified => "MODIFIED",
            DomainEventType::Deleted => "DELETED",
        }
    }
}
