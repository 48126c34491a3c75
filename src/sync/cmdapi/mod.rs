//! KubeVirt's cmd API beyond the domain lifecycle: guest-agent information, file-system
//! freeze/thaw, screenshot, memory dump, dirty rate, `GetVMStats`, SR-IOV host-device hotplug and
//! SEV attestation (`pkg/virt-launcher/virtwrap/manager.go`, `agent-poller/`, `storage/`,
//! `cmd-server/`, v1.9.0).
//!
//! Each part is a small piece the command server's manager calls with the domain's QMP client and
//! guest agent; none holds the domain itself:
//! - [`guest_info`] -- the agent poller and the store behind `GetGuestInfo`, `GetUsers`,
//!   `GetFilesystems` and the domain's OS info and freeze state.
//! - [`freeze`] -- `FreezeVirtualMachine` / `UnfreezeVirtualMachine` with the auto-thaw timer.
//! - [`screenshot`] -- `GetScreenshot` (QMP `screendump`, PNG).
//! - [`memory_dump`] -- `VirtualMachineMemoryDump` and its domain metadata.
//! - [`dirty_rate`] -- `GetDomainDirtyRateStats`.
//! - [`vm_stats`] -- `GetVMStats` (behind `--vm-stats-collector`).
//! - [`host_devices`] -- `HotplugHostDevices` (VFIO from the pod's network-info).
//! - [`sev`] -- `GetSEVInfo`, `GetLaunchMeasurement`, `InjectLaunchSecret`.

pub mod dirty_rate;
pub mod freeze;
pub mod guest_info;
pub mod host_devices;
pub(crate) mod manager;
pub mod memory_dump;
pub mod screenshot;
pub mod sev;
pub mod vm_stats;

use crate::qmp::QmpError;
use crate::sync::guest::agent::AgentError;

/// Everything these RPCs can fail with. The `Display` text is the RPC's `message`.
#[derive(Debug, thiserror::Error)]
pub enum CmdApiError {
    /// The guest agent refused or was unreachable; `message` is the agent's own description
    /// when it answered with an error (callers match on it, e.g. `fsfreeze is limited`).
    #[error("{message}")]
    Agent {
        /// The agent's `desc`, or the client error's text.
        message: String,
    },
    /// A QMP command failed.
    #[error(transparent)]
    Qmp(#[from] QmpError),
    /// A request KubeVirt refuses, with KubeVirt's message.
    #[error("{0}")]
    Refused(String),
    /// A file could not be read or written.
    #[error("{what}: {source}")]
    Io {
        /// What was attempted, with the path.
        what: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

impl CmdApiError {
    /// From a guest agent client error: the agent's description verbatim when it answered.
    pub fn agent(e: AgentError) -> CmdApiError {
        let message = match e {
            AgentError::Command { desc, .. } => desc,
            other => other.to_string(),
        };
        CmdApiError::Agent { message }
    }
}

use std::sync::{Arc, Mutex as StdMutex};

use crate::sync::guest::agent::GuestAgent;

/// What one domain keeps for these RPCs: the agent store and its poller, the freeze timer, the
/// memory-dump state, the dirty-rate cache and the `GetVMStats` agent caches.
#[derive(Debug, Default)]
pub struct CmdApiState {
    /// What the agent poller learned.
    pub store: Arc<guest_info::GuestStore>,
    poller: StdMutex<Option<guest_info::AgentPoller>>,
    /// Freeze / thaw and the auto-thaw timer.
    pub freezer: Arc<freeze::Freezer>,
    /// The memory dump.
    pub dumper: Arc<memory_dump::MemoryDumper>,
    /// `GetDomainDirtyRateStats`'s cache.
    pub dirty_rate: dirty_rate::DirtyRate,
    /// `GetVMStats`'s agent caches.
    pub agent_replies: vm_stats::AgentReplyCache,
    /// The background SR-IOV hotplug, one at a time.
    pub hotplug: host_devices::HotplugRunner,
    /// `GetSEVInfo`'s answer once QEMU gave one (the node's SEV certificates do not change;
    /// libvirt serves them from its cached capabilities too); held while QEMU is asked, so two
    /// calls never run two probes on one socket.
    pub sev_platform: tokio::sync::Mutex<Option<Vec<u8>>>,
}

impl CmdApiState {
    /// (Re)starts the agent poller with `intervals` (domain started or adopted, agent
    /// channel connected); `on_update` gets the OS-info and freeze-state changes; `events`, the
    /// domain's QMP events, let it notice the agent's channel opening at once.
    pub fn start_poller(
        &self,
        agent: Arc<GuestAgent>,
        intervals: crate::sync::config::PollIntervals,
        on_update: guest_info::OnAgentUpdate,
        events: Option<crate::qmp::client::EventStream>,
    ) {
        let poller =
            guest_info::AgentPoller::start(agent, self.store.clone(), intervals, on_update, events);
        *self.poller.lock().unwrap_or_else(|e| e.into_inner()) = Some(poller);
    }

    /// Stops the agent poller (agent disconnected, domain paused or gone); the store keeps the
    /// last data, as KubeVirt's does.
    pub fn stop_poller(&self) {
        self.poller.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}
