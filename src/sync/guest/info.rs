//! What the orchestrator keeps about the running domain beyond its lifecycle: the guest agent
//! client, the device names the stats carry, the interfaces the agent last reported, and the first
//! sync's timing split.
//!
//! Guest interfaces follow KubeVirt's agent poller (`agent-poller/agent_poller.go`, v1.9.0): the
//! agent is asked for `guest-network-get-interfaces` 10 s after the start, then at doubling
//! intervals up to the sys interval (120 s); when the answer changes, the domain's
//! `status.interfaces` is replaced and a MODIFIED domain event sent. qlauncher also asks again,
//! in the background, on every `GetDomain`, so the guest IPs show up as soon as the agent runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use crate::cmdline::plan::{Backend, DeviceClass, DomainPlan};
use crate::cmdline::qemu::SocketAddr;
use crate::cmdline::ConverterContext;
use crate::qmp::client::QmpClient;
use crate::sync::domain::InterfaceStatus;
use crate::sync::error::SyncError;
use crate::sync::guest::agent::GuestAgent;
use crate::sync::guest::stats::{self, DeviceNames};

/// The guest agent's virtio-serial port name (KubeVirt `channels.go`).
pub const AGENT_CHANNEL: &str = "org.qemu.guest_agent.0";

/// How long one interface refresh may wait for the agent.
const INTERFACES_TIMEOUT: Duration = Duration::from_secs(2);

/// First interval of the agent poller (KubeVirt `pollInitialInterval`).
pub const AGENT_POLL_INITIAL: Duration = Duration::from_secs(10);

/// Longest interval of the interface poll (KubeVirt `--qemu-agent-sys-interval` default).
pub const AGENT_POLL_MAX: Duration = Duration::from_secs(120);

/// Called with the guest's interfaces when the agent's answer changed.
pub type InterfacesChanged = Arc<dyn Fn(Vec<InterfaceStatus>) + Send + Sync>;

/// Time from `SyncVirtualMachine` received to QEMU running (`cont` acknowledged), by step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StartTimings {
    /// Overlays, empty disks, host disks, cloud-init and config ISOs.
    pub storage: Duration,
    /// Pod network binding (bridge, tap, nftables) and DHCP servers.
    pub network: Duration,
    /// VMI to QEMU plan and argv.
    pub convert: Duration,
    /// QEMU spawned, QMP connected, start sequence, `cont` acknowledged.
    pub qemu: Duration,
    /// The sum.
    pub total: Duration,
}

/// The running domain's guest agent, stats names, agent interfaces and timings.
#[derive(Default)]
pub struct DomainInfo {
    /// The guest agent client (socket set once the domain is converted).
    pub agent: Arc<GuestAgent>,
    names: StdMutex<DeviceNames>,
    timings: StdMutex<Option<StartTimings>>,
    interfaces: Arc<InterfaceCache>,
}

impl std::fmt::Debug for DomainInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DomainInfo")
            .field("agent", &self.agent)
            .field("names", &self.names)
            .field("timings", &self.timings)
            .finish_non_exhaustive()
    }
}

/// The interfaces the agent last reported, and who to tell when they change.
#[derive(Default)]
struct InterfaceCache {
    last: StdMutex<Option<Vec<InterfaceStatus>>>,
    on_change: StdMutex<Option<InterfacesChanged>>,
    refreshing: AtomicBool,
}

impl InterfaceCache {
    /// Asks the agent once; records and reports a changed answer. Agent errors (none running,
    /// not answering yet) leave the last answer.
    async fn refresh(&self, agent: &GuestAgent) {
        let Ok(list) = agent.interfaces(INTERFACES_TIMEOUT).await else {
            return;
        };
        {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            if last.as_ref() == Some(&list) {
                return;
            }
            *last = Some(list.clone());
        }
        let callback = self
            .on_change
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(callback) = callback {
            callback(list);
        }
    }
}

impl DomainInfo {
    /// Records the names and the agent socket of the domain converted into `plan`.
    pub fn remember_plan(&self, plan: &DomainPlan, ctx: &ConverterContext) {
        *self.names.lock().unwrap_or_else(|e| e.into_inner()) =
            DeviceNames::from_plan(plan, &ctx.interfaces);
        let socket = plan
            .devices_of(DeviceClass::Channel)
            .find_map(|d| match &d.backend {
                Backend::Chardev(c) => match &c.addr {
                    SocketAddr::Path(p) if p.ends_with(&format!("/{AGENT_CHANNEL}")) => {
                        Some(p.clone())
                    }
                    _ => None,
                },
                _ => None,
            });
        if let Some(socket) = socket {
            self.agent.set_socket(socket.into());
        }
    }

    /// Records the cumulative instants (since the sync began) at which storage, network,
    /// conversion and the QEMU start ended.
    pub fn set_timings(
        &self,
        storage: Duration,
        network: Duration,
        convert: Duration,
        running: Duration,
    ) {
        *self.timings.lock().unwrap_or_else(|e| e.into_inner()) = Some(StartTimings {
            storage,
            network: network.saturating_sub(storage),
            convert: convert.saturating_sub(network),
            qemu: running.saturating_sub(convert),
            total: running,
        });
    }

    /// The first sync's timing split, once QEMU runs.
    pub fn timings(&self) -> Option<StartTimings> {
        *self.timings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `GetDomainStats` of the domain whose QEMU is `pid`, as KubeVirt's JSON.
    ///
    /// # Errors
    /// As [`stats::collect`]; [`SyncError::EncodeDomain`] if the stats do not encode.
    pub async fn stats(
        &self,
        client: &QmpClient,
        pid: i32,
    ) -> Result<serde_json::Value, SyncError> {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let s = stats::collect(client, pid, &names).await?;
        serde_json::to_value(s).map_err(SyncError::EncodeDomain)
    }

    /// Starts KubeVirt's interface poll for the domain behind `client` (module doc): `on_change`
    /// gets every changed answer. The poll ends when the QMP connection closes (QEMU gone).
    pub fn start_interface_poller(&self, client: QmpClient, on_change: InterfacesChanged) {
        *self
            .interfaces
            .on_change
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(on_change);
        let agent = Arc::clone(&self.agent);
        let cache = Arc::clone(&self.interfaces);
        tokio::spawn(async move {
            let mut interval = AGENT_POLL_INITIAL;
            loop {
                tokio::time::sleep(interval).await;
                if client.is_closed() {
                    break;
                }
                cache.refresh(&agent).await;
                interval = (interval * 2).min(AGENT_POLL_MAX);
            }
        });
    }

    /// Asks the agent for the interfaces again in the background (one query at a time), so a
    /// guest without an agent never delays the caller (`GetDomain`).
    pub fn refresh_interfaces(&self) {
        if !self.agent.has_socket() || self.interfaces.refreshing.swap(true, Ordering::SeqCst) {
            return;
        }
        let agent = Arc::clone(&self.agent);
        let cache = Arc::clone(&self.interfaces);
        tokio::spawn(async move {
            cache.refresh(&agent).await;
            cache.refreshing.store(false, Ordering::SeqCst);
        });
    }
}
