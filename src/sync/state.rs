//! The running domain and its events: what a started domain holds ([`Running`]), the state shared
//! with the QMP event task ([`Shared`]: the `api.Domain`, the lifecycle status, the notifier), and
//! the task that follows QEMU's events ([`follow_events`]).
//!
//! The domain state follows QMP events through [`crate::qmp::lifecycle::next_status`] and is
//! published as KubeVirt's `api.Domain` with `ADDED` (first sync) and `MODIFIED` (every change)
//! notifications. QEMU runs with `-no-shutdown`, so a guest shutdown leaves it stopped; as libvirt
//! does, the launcher then ends QEMU (`quit`).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::watch;
use tracing::{info, warn};

use crate::cmdline::{render, ConverterContext};
use crate::qmp::client::QmpClient;
use crate::qmp::commands::Quit;
use crate::qmp::lifecycle::{self, DomainStatus, LifecycleInput};
use crate::sync::domain::{
    Alias, ApiDomain, DomainEventType, Interface as DomainIface, LifeCycle, Mac, StateChangeReason,
};
use crate::sync::reconcile::nics::{NicChanges, NicState};
use crate::sync::reconcile::resources;
use crate::sync::rpc::notify::Notifier;

/// The running domain and what was set up for it.
pub(crate) struct Running {
    /// The VMI as last synced (`spec` compared on the next sync).
    pub(crate) spec: crate::sync::admit::SpecKey,
    /// The converter context of the running domain (hotplug conversions reuse it).
    pub(crate) ctx: ConverterContext,
    /// The hot-pluggable disks present, by device id.
    pub(crate) disks: BTreeMap<String, render::DiskHotplug>,
    /// NICs plugged by diff and link states.
    pub(crate) nics: NicState,
    /// The media of the cdrom drives (not hot-pluggable), by device id, bottom node first.
    pub(crate) cdroms: BTreeMap<String, Vec<crate::cmdline::qemu::Blockdev>>,
    /// Boot memory, maxGuest and the virtio-mem request.
    pub(crate) memory: resources::MemoryState,
    /// The next free `libvirt-<N>-` block node index (libvirt numbers nodes per domain, never
    /// reusing one; the converter numbers them per plan, so hotplugged disks are renumbered).
    pub(crate) next_node: u32,
    /// Stops the DHCP servers.
    pub(crate) _dhcp_stop: watch::Sender<bool>,
    /// The domain's UUID, the VMI's firmware UUID it booted with (`spec.domain.firmware.uuid`).
    pub(crate) firmware_uuid: String,
    /// The CPU QEMU runs (`-cpu`): what a migration expands and sends to its target.
    pub(crate) cpu: crate::cmdline::plan::CpuPlan,
    /// The hook sidecars' edits of the plan at the first definition, applied again to every
    /// later one ([`crate::sync::define`]), so a sync never undoes a hook.
    pub(crate) hook_edits: Vec<qlauncher_libvirt_xml::hooks::HookEdit>,
    /// What the hooks made of the first definition, as a migration carries it to its target
    /// (the source's, on a migration target): `hook_edits` are its edits.
    pub(crate) hooked: Option<qlauncher_libvirt_xml::hooks::HookedDomain>,
}

/// State shared with the event task.
pub(crate) struct Shared {
    pub(crate) domain: StdMutex<Option<ApiDomain>>,
    pub(crate) status: StdMutex<DomainStatus>,
    pub(crate) notifier: Option<Notifier>,
    pub(crate) graceful: AtomicBool,
    pub(crate) pid: watch::Sender<Option<i32>>,
    pub(crate) client: StdMutex<Option<QmpClient>>,
    /// What the domain is busy with ([`Job`]); read through [`Shared::job`].
    pub(crate) job: StdMutex<Job>,
    /// A soft reboot pressed the ACPI power button: the guest's next shutdown resets and
    /// resumes the machine instead of ending QEMU (libvirt's fake reboot, `priv->fakeReboot`,
    /// `qemuProcessFakeReboot`).
    pub(crate) fake_reboot: AtomicBool,
}

/// The job a domain runs beside the guest: what names the reason of a pause or an exit that
/// QEMU's events alone do not tell (libvirt's domain job, `virDomainJobType` and the pause
/// reasons `VIR_DOMAIN_PAUSED_DUMP` / `_MIGRATION`, `VIR_DOMAIN_SHUTOFF_MIGRATED`).
///
/// Later jobs outrank earlier ones (`Idle < Dumping < MigratingOut < MigratedAway`):
/// [`Shared::begin`] never replaces a higher job, [`Shared::end`] ends only the job named, and
/// a domain that migrated away stays so.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Job {
    /// No job: a STOP is the user's pause, an exit a shutdown or a crash.
    #[default]
    Idle,
    /// A memory dump runs ([`crate::sync::cmdapi::memory_dump`]): its STOP is Paused/Dump.
    Dumping,
    /// An outgoing migration runs ([`crate::sync::migration`]): its STOP (the switchover) is
    /// Paused/Migration.
    MigratingOut,
    /// The domain migrated away: the `quit` that follows is no shutdown, and QEMU's exit is
    /// Shutoff/Migrated.
    MigratedAway,
}

impl Shared {
    /// The state of a launcher with no domain yet: no status, no QMP client, no job;
    /// `notifier` receives the domain events.
    pub(crate) fn new(notifier: Option<Notifier>) -> Shared {
        Shared {
            domain: StdMutex::new(None),
            status: StdMutex::new(DomainStatus::default()),
            notifier,
            graceful: AtomicBool::new(false),
            pid: watch::channel(None).0,
            client: StdMutex::new(None),
            job: StdMutex::new(Job::Idle),
            fake_reboot: AtomicBool::new(false),
        }
    }

    /// The domain's lifecycle status now.
    pub(crate) fn status(&self) -> DomainStatus {
        *self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the lifecycle status (no event: the caller publishes).
    pub(crate) fn set_status(&self, status: DomainStatus) {
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = status;
    }

    /// Takes the domain over as QEMU runs it, started or adopted: its `status`, the `api.Domain`
    /// and the QMP `client`, then notifies ADDED.
    pub(crate) fn take_over(&self, status: DomainStatus, domain: ApiDomain, client: QmpClient) {
        self.set_status(status);
        *self.domain.lock().unwrap_or_else(|e| e.into_inner()) = Some(domain);
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(client);
        self.publish(status, DomainEventType::Added);
    }

    /// Sends KubeVirt's final notification (domain deleted) and waits up to `wait` for its
    /// delivery. Without a notifier, does nothing.
    pub(crate) async fn final_notify(&self, wait: std::time::Duration) {
        let Some(n) = &self.notifier else {
            return;
        };
        // The event task records QEMU's exit as Shutoff first (it watches the same exit).
        for _ in 0..40 {
            if self.status().state == lifecycle::DomainState::Shutoff {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let Some(d) = self
            .domain
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        else {
            return;
        };
        match n.send_final_delete(&d, std::time::SystemTime::now()) {
            Ok(delivery) => {
                if tokio::time::timeout(wait, delivery).await.is_err() {
                    warn!("final notification not delivered in time");
                }
            }
            Err(e) => warn!(
                error = &e as &dyn std::error::Error,
                "cannot queue the final notification"
            ),
        }
    }

    /// The job the domain runs now.
    pub(crate) fn job(&self) -> Job {
        *self.job.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts `job` unless a higher one runs ([`Job`]).
    pub(crate) fn begin(&self, job: Job) {
        let mut current = self.job.lock().unwrap_or_else(|e| e.into_inner());
        *current = (*current).max(job);
    }

    /// Ends `job` when it is the one running (back to [`Job::Idle`]).
    pub(crate) fn end(&self, job: Job) {
        let mut current = self.job.lock().unwrap_or_else(|e| e.into_inner());
        if *current == job {
            *current = Job::Idle;
        }
    }

    /// Applies a lifecycle input, updates the `api.Domain` and notifies MODIFIED on change.
    pub(crate) fn apply(&self, input: &LifecycleInput) -> DomainStatus {
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        let job = self.job();
        // The `quit` that ends QEMU after a guest shutdown emits a second SHUTDOWN (host origin);
        // the first origin names the final reason. The `quit` that stops a migrated-away source
        // is no shutdown of the domain.
        if let LifecycleInput::Event(ev) = input {
            if ev.name == "SHUTDOWN" && (status.shutdown.is_some() || job == Job::MigratedAway) {
                return *status;
            }
        }
        let mut next = lifecycle::next_status(*status, input);
        if let LifecycleInput::Event(ev) = input {
            if ev.name == "STOP"
                && next.state == lifecycle::DomainState::Paused
                && next.reason == lifecycle::StateReason::User
            {
                match job {
                    Job::Dumping => next.reason = lifecycle::StateReason::Dump,
                    Job::MigratingOut => next.reason = lifecycle::StateReason::Migration,
                    Job::Idle | Job::MigratedAway => {}
                }
            }
        }
        if matches!(input, LifecycleInput::QemuExited) && job == Job::MigratedAway {
            next.reason = lifecycle::StateReason::Migrated;
        }
        let changed = (next.state, next.reason) != (status.state, status.reason);
        *status = next;
        if changed {
            self.publish(next, DomainEventType::Modified);
        }
        next
    }

    /// Puts the guest agent's interfaces in the domain status and notifies MODIFIED (KubeVirt's
    /// agent-updated event).
    pub(crate) fn set_guest_interfaces(&self, list: Vec<crate::sync::domain::InterfaceStatus>) {
        {
            let mut domain = self.domain.lock().unwrap_or_else(|e| e.into_inner());
            let Some(d) = domain.as_mut() else { return };
            d.status.interfaces = list;
        }
        let status = self.status();
        self.publish(status, DomainEventType::Modified);
    }

    /// Puts an agent poller update (OS info, freeze state) in the domain status and notifies
    /// MODIFIED (KubeVirt's agent-updated event).
    pub(crate) fn apply_agent_update(&self, update: crate::sync::cmdapi::guest_info::AgentUpdate) {
        use crate::sync::cmdapi::guest_info::AgentUpdate;
        self.modify(|d| match update {
            AgentUpdate::OsInfo(os) => d.status.os_info = os,
            AgentUpdate::FsFreeze(status) => d.status.fs_freeze_status.status = status,
        });
    }

    /// Changes the domain with `f` and notifies MODIFIED (no domain: nothing happens).
    pub(crate) fn modify(&self, f: impl FnOnce(&mut ApiDomain)) {
        {
            let mut domain = self.domain.lock().unwrap_or_else(|e| e.into_inner());
            let Some(d) = domain.as_mut() else { return };
            f(d);
        }
        let status = self.status();
        self.publish(status, DomainEventType::Modified);
    }

    pub(crate) fn publish(&self, status: DomainStatus, event: DomainEventType) {
        let mut domain = self.domain.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = domain.as_mut() else { return };
        let (state, reason) = kubevirt_state(status);
        d.set_state(state, reason);
        if let Some(n) = &self.notifier {
            if let Err(e) = n.send(event, d) {
                warn!(
                    error = &e as &dyn std::error::Error,
                    "cannot queue a domain event"
                );
            }
        }
    }

    /// Changes the `api.Domain` with `change` and notifies MODIFIED when it reports a change
    /// (KubeVirt notifies metadata-only and device changes as MODIFIED too).
    pub(crate) fn update_domain(&self, change: impl FnOnce(&mut ApiDomain) -> bool) {
        let changed = {
            let mut domain = self.domain.lock().unwrap_or_else(|e| e.into_inner());
            match domain.as_mut() {
                Some(d) => change(d),
                None => false,
            }
        };
        if changed {
            let status = self.status();
            self.publish(status, DomainEventType::Modified);
        }
    }

    /// Records plugged and unplugged NICs in the domain's interfaces and notifies MODIFIED, as
    /// libvirt's device-added/removed events make KubeVirt do.
    pub(crate) fn publish_nic_changes(&self, changes: &NicChanges) {
        if changes.added.is_empty() && changes.removed.is_empty() {
            return;
        }
        {
            let mut domain = self.domain.lock().unwrap_or_else(|e| e.into_inner());
            let Some(d) = domain.as_mut() else { return };
            let ifaces = &mut d.spec.devices.interfaces;
            ifaces.retain(|i| {
                !changes
                    .removed
                    .iter()
                    .any(|n| i.alias.as_ref() == Some(&Alias::user_defined(n)))
            });
            for (name, mac) in &changes.added {
                if ifaces
                    .iter()
                    .any(|i| i.alias.as_ref() == Some(&Alias::user_defined(name)))
                {
                    continue;
                }
                ifaces.push(DomainIface {
                    interface_type: "ethernet".into(),
                    mac: Some(Mac { mac: mac.clone() }),
                    alias: Some(Alias::user_defined(name)),
                    ..Default::default()
                });
            }
        }
        let status = self.status();
        self.publish(status, DomainEventType::Modified);
    }
}

/// Maps the QMP lifecycle status to `api.LifeCycle` and `api.StateChangeReason` (same names).
pub(crate) fn kubevirt_state(s: DomainStatus) -> (LifeCycle, StateChangeReason) {
    let state = serde_json::from_value(serde_json::Value::String(s.state.as_str().into()))
        .unwrap_or(LifeCycle::NoState);
    let reason = serde_json::from_value(serde_json::Value::String(s.reason.as_str().into()))
        .unwrap_or(StateChangeReason::Unknown);
    (state, reason)
}

/// Follows QMP events until QEMU is gone: state changes, `quit` after a shutdown (QEMU runs with
/// `-no-shutdown`), and the final Shutoff.
pub(crate) async fn follow_events(
    shared: Arc<Shared>,
    mut events: crate::qmp::client::EventStream,
    client: QmpClient,
    qemu: crate::monitor::qemu::Qemu,
) {
    let mut exited = false;
    loop {
        let ev = if exited {
            // QEMU is gone, but what it sent just before (its SHUTDOWN) may still be buffered
            // when its exit is seen first: read on until the connection's end.
            match tokio::time::timeout(EXIT_DRAIN, events.recv()).await {
                Ok(Some(ev)) => ev,
                _ => break,
            }
        } else {
            tokio::select! {
                // Events first: an exit seen together with the events before it comes after them.
                biased;
                ev = events.recv() => match ev {
                    Some(ev) => ev,
                    None => break,
                },
                _ = qemu.exited() => {
                    exited = true;
                    continue;
                }
            }
        };
        if ev.name == "VSERPORT_CHANGE" {
            // The guest opened or closed a virtio-serial port (`channelN`): libvirt's
            // channel state, which virt-handler's AgentConnected condition follows.
            let index = ev.data["id"]
                .as_str()
                .and_then(|id| id.strip_prefix("channel"))
                .and_then(|n| n.parse::<usize>().ok());
            if let (Some(index), Some(open)) = (index, ev.data["open"].as_bool()) {
                info!(channel = index, open, "guest channel state changed");
                shared.update_domain(|d| d.spec.set_channel_open(index, open));
            }
            continue;
        }
        let is_shutdown = ev.name == "SHUTDOWN";
        let guest = ev.data["guest"].as_bool() == Some(true);
        shared.apply(&LifecycleInput::Event(ev));
        if exited {
            continue;
        }
        if is_shutdown
            && guest
            && shared
                .fake_reboot
                .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            // libvirt's fake reboot: the guest powered off after a soft reboot's power
            // button; reset the machine and let it run (its RESUME makes it Running).
            let c = client.clone();
            tokio::spawn(async move {
                if let Err(e) = crate::qmp::lifecycle::reset(&c).await {
                    warn!(error = %e, "soft reboot: system_reset failed");
                } else if let Err(e) = crate::qmp::lifecycle::resume(&c).await {
                    warn!(error = %e, "soft reboot: cont failed");
                } else {
                    info!("soft reboot: the guest powered off, the machine was reset");
                }
            });
            continue;
        }
        if is_shutdown {
            // libvirt ends a QEMU whose guest shut down (qemuProcessShutdownOrReboot).
            let c = client.clone();
            tokio::spawn(async move {
                let _ = c.run(&Quit).await;
            });
        }
    }
    qemu.exited().await;
    info!(pid = qemu.pid(), "QEMU exited");
    shared.apply(&LifecycleInput::QemuExited);
}

/// How long the event task reads on after QEMU's exit for the events it sent before (the QMP
/// connection normally ends at once with the process).
const EXIT_DRAIN: std::time::Duration = std::time::Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_higher_job_outranks_and_only_the_running_job_ends() {
        let shared = Shared::new(None);
        shared.begin(Job::Dumping);
        assert_eq!(shared.job(), Job::Dumping);
        shared.begin(Job::MigratingOut);
        shared.begin(Job::Dumping);
        assert_eq!(shared.job(), Job::MigratingOut);
        shared.end(Job::Dumping);
        assert_eq!(shared.job(), Job::MigratingOut);
        shared.end(Job::MigratingOut);
        assert_eq!(shared.job(), Job::Idle);
        shared.begin(Job::MigratedAway);
        shared.end(Job::MigratingOut);
        assert_eq!(shared.job(), Job::MigratedAway);
    }

    /// A QMP peer on `stream` that greets, accepts `qmp_capabilities` and returns its writer.
    async fn peer(stream: tokio::net::UnixStream) -> tokio::net::unix::OwnedWriteHalf {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let (r, mut w) = stream.into_split();
        w.write_all(b"{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 0, \"minor\": 2, \"major\": 7}, \"package\": \"\"}, \"capabilities\": []}}\n")
            .await
            .unwrap();
        let mut lines = tokio::io::BufReader::new(r).lines();
        let caps: serde_json::Value =
            serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        let ok = serde_json::json!({"return": {}, "id": caps["id"]}).to_string() + "\n";
        w.write_all(ok.as_bytes()).await.unwrap();
        w
    }

    /// QEMU sends SHUTDOWN and exits; the launcher may see the exit (pidfd) before it read the
    /// event. The event still counts: the domain ends Shutoff/Shutdown, not Crashed (a lost
    /// SHUTDOWN also made the launcher exit 1, "QEMU exited without a shutdown request").
    #[tokio::test]
    async fn a_shutdown_sent_just_before_the_exit_counts_when_the_exit_is_seen_first() {
        use tokio::io::AsyncWriteExt;
        for _ in 0..20 {
            let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
            let greeted = tokio::spawn(peer(theirs));
            let client = QmpClient::from_stream(ours, std::time::Duration::from_secs(5))
                .await
                .unwrap();
            let mut w = greeted.await.unwrap();
            let events = client.events();
            // QEMU's stand-in, gone (and reaped) before the event task runs.
            let mut child = std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap();
            let qemu = crate::monitor::qemu::Qemu::from_pid(child.id() as i32).unwrap();
            w.write_all(
                b"{\"event\": \"SHUTDOWN\", \"data\": {\"guest\": true, \"reason\": \"guest-shutdown\"}, \"timestamp\": {\"seconds\": 1, \"microseconds\": 0}}\n",
            )
            .await
            .unwrap();
            child.kill().unwrap();
            child.wait().unwrap();
            // The client's reader takes the event in; the connection ends after it.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            drop(w);
            let shared = Arc::new(Shared::new(None));
            follow_events(shared.clone(), events, client, qemu).await;
            let status = shared.status();
            assert_eq!(
                (status.state, status.reason),
                (
                    lifecycle::DomainState::Shutoff,
                    lifecycle::StateReason::Shutdown
                ),
                "{status:?}"
            );
        }
    }

    #[test]
    fn qmp_states_map_to_kubevirt_names() {
        use crate::qmp::lifecycle::{DomainState, StateReason};
        let s = DomainStatus::new(DomainState::Paused, StateReason::StartingUp);
        assert_eq!(
            kubevirt_state(s),
            (LifeCycle::Paused, StateChangeReason::StartingUp)
        );
        let s = DomainStatus::new(DomainState::Shutoff, StateReason::Shutdown);
        assert_eq!(
            kubevirt_state(s),
            (LifeCycle::Shutoff, StateChangeReason::Shutdown)
        );
    }
}
