//! What the orchestrator keeps about the running domain beyond its lifecycle: the guest agent
//! client, the device names the stats carry, the interfaces the agent last reported (merged into
//! `GetDomain`'s status as KubeVirt's agent poller does), and the first sync's timing split.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use crate::cmdline::plan::{Backend, DeviceClass, DomainPlan};
use crate::cmdline::qemu::SocketAddr;
use crate::cmdline::ConverterContext;
use crate::qmp::client::QmpClient;
use crate::sync::agent::GuestAgent;
use crate::sync::domain::{Domain, InterfaceStatus};
use crate::sync::stats::{self, DeviceNames};
use crate::sync::SyncError;

/// The guest agent's virtio-serial port name (KubeVirt `channels.go`).
pub const AGENT_CHANNEL: &str = "org.qemu.guest_agent.0";

/// How long one interface refresh may wait for the agent.
const INTERFACES_TIMEOUT: Duration = Duration::from_secs(2);

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
#[derive(Debug, Default)]
pub struct DomainInfo {
    /// The guest agent client (socket set once the domain is converted).
    pub agent: Arc<GuestAgent>,
    names: StdMutex<DeviceNames>,
    timings: StdMutex<Option<StartTimings>>,
    interfaces: Arc<StdMutex<Option<Vec<InterfaceStatus>>>>,
    refreshing: Arc<AtomicBool>,
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

    /// `domain` with the interfaces the guest agent last reported in its status (KubeVirt's
    /// `GetDomain` sets them when the agent reported any). The agent is asked again in the
    /// background (one query at a time), so a guest without an agent never delays `GetDomain`.
    pub async fn with_guest_interfaces(&self, domain: Option<Domain>) -> Option<Domain> {
        let mut domain = domain?;
        if self.agent.has_socket() && !self.refreshing.swap(true, Ordering::SeqCst) {
            let agent = Arc::clone(&self.agent);
            let cache = Arc::clone(&self.interfaces);
            let flag = Arc::clone(&self.refreshing);
            tokio::spawn(async move {
                if let Ok(list) = agent.interfaces(INTERFACES_TIMEOUT).await {
                    *cache.lock().unwrap_or_else(|e| e.into_inner()) = Some(list);
                }
                flag.store(false, Ordering::SeqCst);
            });
        }
        if let Some(list) = self
            .interfaces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            domain.status.interfaces = list;
        }
        Some(domain)
    }
}
