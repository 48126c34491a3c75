//! The target side of a migration: `SyncMigrationTarget` (prepare, listen, then the incoming
//! migration over [`super::target`] once the source's definition arrives),
//! `SignalTargetPodCleanup` and `FinalizeVirtualMachineMigration` (KubeVirt v1.9.0
//! `live-migration-target.go`, `manager.go`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::net::{UnixListener, UnixStream};
use tracing::{info, warn};

use crate::cmdline::plan::DomainPlan;
use crate::cmdline::render::{qmp_plan, DiskHotplug};
use crate::qmp::commands::Quit;
use crate::qmp::hotplug::{attach_disk, DiskAttach};
use crate::qmp::lifecycle::{DomainState, StateReason};
use crate::sync::migration::launcher::{
    annotation, decode, failed, normalized, require_unix_transport, PreparedTarget,
    VmiMigrationState, BLOCK_TARGET_ANNOTATION,
};
use crate::sync::migration::metadata::MigrationMetadata;
use crate::sync::migration::protocol::RunningDomain;
use crate::sync::migration::target::{incoming_argv, TargetEnd, TargetSession, TargetSockets};
use crate::sync::migration::MigrationError;
use crate::sync::migration::{hotplug, sriov};
use crate::sync::proto::cmd::v1::VirtualMachineOptions;
use crate::sync::vmi_sync::SyncVmi;
use crate::sync::{privileges, SyncError};
use crate::vmi::Vmi;

/// How long the target waits for the source's hello and definition once connected.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the guest time is synchronised after a migration (KubeVirt `setGuestTime`).
const TIME_SYNC_WINDOW: Duration = Duration::from_secs(60);

/// The target's QEMU definition for one incoming migration ([`SyncVmi::boot_conversion`]).
struct BootConversion {
    /// QEMU's argv (with `-S`, without `-incoming`): what the source's QEMU started with.
    argv: Vec<String>,
    /// The source's hot-plugged disks, placed as the source runs them, attached before
    /// `migrate-incoming`.
    placed: Vec<DiskHotplug>,
    /// The plan `argv` renders, when it differs from the prepared one (hot-plugged disks).
    plan: Option<DomainPlan>,
}

/// Gives every interface without `macAddress` the guest MAC virt-handler reports for it in
/// `status.interfaces` (read from the source's domain): the MAC the source's guest runs with.
/// Without it the target would default to its own pod's MAC, and the device model (and the DHCP
/// lease) would differ from the source's; libvirt carries the MAC in the migrated XML.
fn keep_guest_macs(vmi: &mut Vmi) {
    let reported: Vec<(String, String)> = vmi
        .status
        .as_ref()
        .and_then(|s| s.interfaces.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| Some((i.name.clone()?, i.mac.clone().filter(|m| !m.is_empty())?)))
        .collect();
    let Some(ifaces) = vmi.spec.domain.devices.interfaces.as_mut() else {
        return;
    };
    for iface in ifaces {
        if iface.mac_address.as_deref().is_some_and(|m| !m.is_empty()) {
            continue;
        }
        if let Some((_, mac)) = reported.iter().find(|(n, _)| *n == iface.name) {
            iface.mac_address = Some(mac.clone());
        }
    }
}

impl SyncVmi {
    /// `SyncMigrationTarget`.
    pub(crate) async fn sync_target(
        self: Arc<Self>,
        vmi_json: Vec<u8>,
        _options: Option<VirtualMachineOptions>,
    ) -> Result<(), SyncError> {
        let (mut vmi, state) = decode(&vmi_json)?;
        if annotation(&vmi, BLOCK_TARGET_ANNOTATION).is_some() {
            return Err(failed(
                "Blocking preparation of migration target in order to satisfy a functional test \
                 condition"
                    .into(),
            ));
        }
        require_unix_transport(&vmi)?;
        let vmi_uid = vmi.metadata.uid.clone().unwrap_or_default();
        let migration_uid = state.as_ref().and_then(VmiMigrationState::uid);
        let proxy_key = state
            .as_ref()
            .map_or_else(|| vmi_uid.clone(), |s| s.proxy_key(&vmi_uid));
        let running = self.running.lock().await;
        if running.is_some() {
            // The domain already runs here (the migration completed): nothing to prepare.
            return Ok(());
        }
        let already = self
            .migration
            .target_for
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if already.as_deref() == Some(vmi_uid.as_str()) {
            return Ok(());
        }
        let cfg = crate::vmi::DefaultsConfig::for_vmi(&vmi);
        vmi.apply_defaults(&cfg);
        if let Err(errors) = vmi.validate() {
            let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            return Err(SyncError::InvalidVmi(text.join("; ")));
        }
        let volume_status = vmi.status.as_ref().map(|s| &s.volume_status);
        let spec = serde_json::to_value((
            &vmi.spec,
            volume_status,
            crate::sync::facts::secondary::status_key(&vmi),
        ))
        .map_err(SyncError::EncodeDomain)?;
        // The spec key above is what later syncs of this VMI compare with; the domain itself
        // runs with the source's guest MACs.
        keep_guest_macs(&mut vmi);
        let prepared = self.prepare(&vmi, spec).await?;
        let secondary =
            crate::sync::facts::secondary::secondary_ifaces(&vmi, self.config.runtime_uid)?;
        let view = crate::sync::facts::secondary::convert_view(&vmi, &secondary);

        // The proxy's socket directory, writable by QEMU, and the control socket.
        let dir = &self.config.migration_proxy_dir;
        let prep_err = |what: String| {
            move |source| SyncError::PrepareQemu {
                what: what.clone(),
                source,
            }
        };
        std::fs::create_dir_all(dir).map_err(prep_err(format!("create {}", dir.display())))?;
        privileges::prepare_socket_dir(dir, self.config.runtime_uid).map_err(prep_err(format!(
            "give {} to the runtime user",
            dir.display()
        )))?;
        let control = &self.config.migration_control_socket;
        if let Some(parent) = control.parent() {
            std::fs::create_dir_all(parent)
                .map_err(prep_err(format!("create {}", parent.display())))?;
        }
        let _ = std::fs::remove_file(control);
        let listener = UnixListener::bind(control)
            .map_err(prep_err(format!("listen on {}", control.display())))?;

        self.set_metadata(|m| {
            if let Some(uid) = &migration_uid {
                MigrationMetadata::start(m, uid, SystemTime::now());
            }
        });
        *self.migration.target.lock().await = Some(PreparedTarget {
            prepared,
            vmi_uid: vmi_uid.clone(),
            proxy_key,
            view,
        });
        *self
            .migration
            .target_for
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(vmi_uid.clone());
        drop(running);
        info!(control = %control.display(), "migration target prepared, waiting for the source");
        let me = self.clone();
        tokio::spawn(async move { me.serve_target(listener).await });
        Ok(())
    }

    /// Accepts source connections until one migration ran (successfully or not).
    async fn serve_target(self: Arc<Self>, listener: UnixListener) {
        loop {
            let conn = match listener.accept().await {
                Ok((c, _)) => c,
                Err(e) => {
                    warn!(error = %e, "migration control socket failed");
                    return;
                }
            };
            let Some(target) = self.migration.target.lock().await.take() else {
                return;
            };
            match self.incoming(conn, target).await {
                Ok(()) => return,
                Err((Some(target), e)) => {
                    warn!(reason = %e.failure_reason(), "migration source refused before QEMU started");
                    *self.migration.target.lock().await = Some(target);
                }
                Err((None, e)) => {
                    warn!(reason = %e.failure_reason(), "incoming migration failed");
                    return;
                }
            }
        }
    }

    /// One incoming migration: the source's definition, QEMU `-incoming defer`, ready, finish.
    /// An error before QEMU started hands the prepared target back.
    async fn incoming(
        &self,
        conn: UnixStream,
        target: PreparedTarget,
    ) -> Result<(), (Option<PreparedTarget>, MigrationError)> {
        let session =
            tokio::time::timeout(ACCEPT_TIMEOUT, TargetSession::accept(conn, &target.vmi_uid))
                .await;
        let mut session = match session {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err((Some(target), e)),
            Err(_) => {
                return Err((
                    Some(target),
                    MigrationError::Timeout("no definition from the source".into()),
                ))
            }
        };
        // KubeVirt's target creates no SR-IOV devices: the source unplugged its VFs and sends
        // none; virt-handler plugs the target pod's VFs after the migration.
        let boot = self.boot_conversion(&target, &session.domain).map(|mut b| {
            b.argv = sriov::without_sriov_devices(&b.argv);
            b
        });
        let argv = boot.and_then(|b| {
            incoming_argv(&normalized(&b.argv, &self.config), &session.domain)?;
            let mut d = session.domain.clone();
            d.argv.clear();
            Ok((incoming_argv(&b.argv, &d)?, b.placed, b.plan))
        });
        let (argv, placed, boot_plan) = match argv {
            Ok(a) => a,
            Err(e) => {
                session.fail(&e.failure_reason()).await;
                return Err((Some(target), e));
            }
        };
        let PreparedTarget {
            mut prepared,
            proxy_key,
            ..
        } = target;
        if let Some(plan) = &boot_plan {
            // What runs: the boot plan's disks and media, then the source's hot-plugged disks.
            let mut disks: std::collections::BTreeMap<String, DiskHotplug> = qmp_plan(plan)
                .disks
                .into_iter()
                .map(|d| (d.id.clone(), d))
                .collect();
            for d in &placed {
                disks.insert(d.id.clone(), d.clone());
            }
            prepared.running.next_node = hotplug::next_node_after(
                &disks,
                crate::sync::reconcile::disks::next_node_index(plan),
            );
            prepared.running.disks = disks;
            prepared.running.cdroms = crate::sync::reconcile::media::cdroms(plan);
        }
        let mut domain = prepared.domain.clone();
        domain.spec.metadata.kubevirt.migration = self.migration.metadata();
        let vsock = prepared.vsock;
        let client = match self
            .launch_incoming(domain, &prepared.plan, &argv, vsock)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                let reason = crate::sys::error::error_chain(&e);
                session.fail(&reason).await;
                return Err((None, MigrationError::Peer(reason)));
            }
        };
        // The source's hot-plugged disks, before the device state arrives.
        for d in &placed {
            let attach = DiskAttach {
                blockdevs: d.blockdevs.clone(),
                device: d.device.clone(),
            };
            if let Err(e) = attach_disk(&client, &attach).await {
                let e = MigrationError::Qmp(e);
                session.fail(&e.failure_reason()).await;
                let _ = client.run(&Quit).await;
                return Err((None, e));
            }
            info!(device = %d.id, "hot-plugged disk of the source attached");
        }
        // What a later migration away from here sends: this QEMU's argv without `-incoming`.
        let boot: Vec<String> = argv
            .strip_suffix(&["-incoming".to_owned(), "defer".to_owned()])
            .unwrap_or(&argv)
            .to_vec();
        self.migration.set_boot_argv(boot);
        // Named after the source VMI's UID (virt-handler's migrationProxyKey).
        let (_, stream, nbd) = self.migration_proxy_sockets(&proxy_key);
        let sockets = TargetSockets { stream, nbd };
        if let Err(e) = session.incoming(&client, &sockets).await {
            let _ = client.run(&Quit).await;
            return Err((None, e));
        }
        match session.finish(&client).await {
            Ok(TargetEnd::Completed { paused }) => {
                info!(paused, "incoming migration completed");
                if paused {
                    // A user-paused VMI stays paused: Paused/User (libvirt's SUSPENDED/PAUSED
                    // after a paused migration), which virt-handler counts as active.
                    let status = crate::qmp::lifecycle::DomainStatus::new(
                        DomainState::Paused,
                        StateReason::User,
                    );
                    *self.shared.status.lock().unwrap_or_else(|e| e.into_inner()) = status;
                    self.shared
                        .publish(status, crate::sync::domain::DomainEventType::Modified);
                }
                *self.running.lock().await = Some(prepared.running);
                // KubeVirt's TargetMigrationMonitor: the end once no incoming job is left.
                self.set_metadata(|m| {
                    if let Some(m) = m {
                        m.finish(None, SystemTime::now());
                    }
                });
                Ok(())
            }
            Ok(TargetEnd::Failed { reason }) => {
                let _ = client.run(&Quit).await;
                Err((None, MigrationError::Peer(reason)))
            }
            Err(e) => {
                let _ = client.run(&Quit).await;
                Err((None, e))
            }
        }
    }

    /// The target's QEMU definition for the source's `domain` ([`BootConversion`]): without
    /// hot-plugged disks the prepared argv; with them the VMI converted again without those disks
    /// ([`hotplug::boot_view`]), and the disks from the prepared (full) plan with the target's own
    /// paths, placed as the source runs them ([`hotplug::place_like_source`]).
    fn boot_conversion(
        &self,
        target: &PreparedTarget,
        domain: &RunningDomain,
    ) -> Result<BootConversion, MigrationError> {
        hotplug::refuse_hotplugged_nics(&domain.hotplugged)?;
        if domain.hotplugged.is_empty() {
            return Ok(BootConversion {
                argv: target.prepared.argv.clone(),
                placed: Vec::new(),
                plan: None,
            });
        }
        let view = hotplug::boot_view(&target.view, &domain.hotplugged);
        let plan = crate::cmdline::convert(&view, &target.prepared.running.ctx).map_err(|e| {
            MigrationError::Peer(format!(
                "cannot convert the VMI without its hot-plugged disks: {e}"
            ))
        })?;
        let placed = domain
            .hotplugged
            .iter()
            .map(|h| hotplug::place_like_source(&target.prepared.qmp_plan.disks, h))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BootConversion {
            argv: self.argv(&plan),
            placed,
            plan: Some(plan),
        })
    }

    /// `SignalTargetPodCleanup`.
    pub(crate) async fn signal_cleanup(
        self: Arc<Self>,
        vmi_json: Vec<u8>,
    ) -> Result<(), SyncError> {
        let (_, state) = decode(&vmi_json)?;
        let target_pod = state.and_then(|s| s.target_pod).unwrap_or_default();
        let pod = std::env::var("POD_NAME").unwrap_or_default();
        if pod.is_empty() || pod != target_pod {
            return Ok(());
        }
        if self.qemu_pid().is_some() {
            return Ok(());
        }
        warn!(pod = %pod, "target pod cleanup signalled: exiting");
        tokio::spawn(async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            std::process::exit(1);
        });
        Ok(())
    }

    /// `FinalizeVirtualMachineMigration`.
    pub(crate) async fn finalize(
        self: Arc<Self>,
        vmi_json: Vec<u8>,
        options: Option<VirtualMachineOptions>,
    ) -> Result<(), SyncError> {
        decode(&vmi_json)?;
        let refresh: Vec<String> = options
            .map(|o| o.interface_migration)
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, m)| m.method == "link-refresh")
            .map(|(name, _)| name)
            .collect();
        if !refresh.is_empty() {
            let client = self.client()?;
            for name in refresh {
                let id = format!("ua-{name}");
                crate::qmp::hotplug::set_link(&client, &id, false)
                    .await
                    .map_err(SyncError::Qmp)?;
                tokio::time::sleep(Duration::from_millis(100)).await;
                crate::qmp::hotplug::set_link(&client, &id, true)
                    .await
                    .map_err(SyncError::Qmp)?;
            }
        }
        if !self.migration.time_synced.swap(true, Ordering::SeqCst) {
            let agent = self.info.agent.clone();
            tokio::spawn(sync_guest_time(agent));
        }
        Ok(())
    }
}

/// Sets the guest's clock to the host's every second for up to a minute, until the agent
/// answers (KubeVirt `setGuestTime`); stops when the agent says the command is unsupported.
async fn sync_guest_time(agent: Arc<crate::sync::agent::GuestAgent>) {
    let t0 = tokio::time::Instant::now();
    while t0.elapsed() < TIME_SYNC_WINDOW {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        match agent
            .command(
                "guest-set-time",
                Some(serde_json::json!({ "time": now })),
                Duration::from_secs(1),
            )
            .await
        {
            Ok(_) => {
                info!("guest time set after migration");
                return;
            }
            Err(SyncError::AgentCommand { class, .. }) if class == "CommandNotFound" => return,
            Err(e) if e.to_string().contains("unsupported") => return,
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_keeps_the_sources_guest_macs() {
        let (mut vmi, _) = decode(
            br#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{"interfaces":[
                {"name":"default","masquerade":{}},
                {"name":"fixed","bridge":{},"macAddress":"02:00:00:00:00:01"},
                {"name":"unknown","bridge":{}}]}}},
                "status":{"interfaces":[{"name":"default","mac":"0a:58:0a:f4:00:05"},
                {"name":"fixed","mac":"02:00:00:00:00:99"}]}}"#,
        )
        .unwrap();
        keep_guest_macs(&mut vmi);
        let macs: Vec<Option<String>> = vmi
            .spec
            .domain
            .devices
            .interfaces
            .unwrap()
            .into_iter()
            .map(|i| i.mac_address)
            .collect();
        assert_eq!(
            macs,
            vec![
                Some("0a:58:0a:f4:00:05".into()),
                Some("02:00:00:00:00:01".into()),
                None
            ]
        );
    }
}
