//! The target side of a migration: `SyncMigrationTarget` (prepare, listen, then the incoming
//! migration over [`super::target`] once the source's definition arrives),
//! `SignalTargetPodCleanup` and `FinalizeVirtualMachineMigration` (KubeVirt v1.9.0
//! `live-migration-target.go`, `manager.go`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::net::{UnixListener, UnixStream};
use tracing::{info, warn};

use crate::cmdline::render::{DiskHotplug, NicHotplug};
use crate::qmp::client::QmpClient;
use crate::qmp::commands::Quit;
use crate::qmp::hotplug::{attach_disk, DiskAttach};
use crate::qmp::lifecycle::{DomainState, StateReason};
use crate::sync::admit::{admit, Admitted};
use crate::sync::error::SyncError;
use crate::sync::guest::agent::AgentError;
use crate::sync::migration::boot_conversion::{incoming_definition, run_boot_plan};
use crate::sync::migration::launcher::{
    annotation, boot_memory_view, decode, migration_proxy_sockets, refused, require_unix_transport,
    Incoming, MigrationCtx, PreparedTarget, VmiMigrationState, BLOCK_TARGET_ANNOTATION,
};
use crate::sync::migration::metadata;
use crate::sync::migration::protocol::RunningDomain;
use crate::sync::migration::target::{TargetEnd, TargetSession, TargetSockets};
use crate::sync::migration::MigrationError;
use crate::sync::rpc::proto::cmd::v1::VirtualMachineOptions;
use crate::sync::start::Prepared;
use crate::sync::state::Running;
use crate::sync::{privileges, start};
use crate::vmi::Vmi;

/// How long the target waits for the source's hello and definition once connected.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the guest time is synchronised after a migration (KubeVirt `setGuestTime`).
const TIME_SYNC_WINDOW: Duration = Duration::from_secs(60);

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

/// The target's QEMU once started for an incoming migration ([`MigrationCtx::start_incoming`]).
pub(super) struct StartedTarget {
    /// Its QMP client.
    pub(super) client: crate::qmp::client::QmpClient,
    /// The prepared domain it runs.
    pub(super) prepared: Prepared,
    /// The UID the proxy's stream and NBD sockets are named after.
    pub(super) proxy_key: String,
}

/// The source's hello and definition on `conn`, within [`ACCEPT_TIMEOUT`].
async fn accept(
    conn: UnixStream,
    vmi_uid: &str,
) -> Result<TargetSession<UnixStream>, MigrationError> {
    match tokio::time::timeout(ACCEPT_TIMEOUT, TargetSession::accept(conn, vmi_uid)).await {
        Ok(session) => session,
        Err(_) => Err(MigrationError::Timeout(
            "no definition from the source".into(),
        )),
    }
}

impl MigrationCtx {
    /// `SyncMigrationTarget`.
    pub(crate) async fn sync_target(
        &self,
        vmi_json: Vec<u8>,
        options: Option<VirtualMachineOptions>,
    ) -> Result<(), SyncError> {
        let (vmi, state) = decode(&vmi_json)?;
        let plugins = crate::sync::manager_impl::plugins_of(options.as_ref())?;
        if annotation(&vmi, BLOCK_TARGET_ANNOTATION).is_some() {
            return Err(refused(
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
            .ctl
            .target_for
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if already.as_deref() == Some(vmi_uid.as_str()) {
            return Ok(());
        }
        let Admitted { mut vmi, key } = admit(vmi, None)?;
        // The spec key is what later syncs of this VMI compare with; the domain itself runs with
        // the source's guest MACs.
        keep_guest_macs(&mut vmi);
        // A source whose memory grew runs its boot memory plus virtio-mem: boot the same.
        let memory_total = boot_memory_view(&mut vmi);
        let prepared = start::prepare(
            &self.ctx,
            &vmi,
            key,
            &plugins,
            crate::hooks::plugins::pipeline::InvocationContext::MigrationTarget,
        )
        .await?;
        let view = prepared.view.clone();

        // The proxy's socket directory, writable by QEMU, and the control socket.
        let dir = &self.ctx.config.migration_proxy_dir;
        let prep_err = |what: String| {
            move |source| SyncError::PrepareQemu {
                what: what.clone(),
                source,
            }
        };
        std::fs::create_dir_all(dir).map_err(prep_err(format!("create {}", dir.display())))?;
        privileges::prepare_socket_dir(dir, self.ctx.config.runtime_uid).map_err(prep_err(
            format!("give {} to the runtime user", dir.display()),
        ))?;
        let control = &self.ctx.config.migration_control_socket;
        if let Some(parent) = control.parent() {
            std::fs::create_dir_all(parent)
                .map_err(prep_err(format!("create {}", parent.display())))?;
        }
        let _ = std::fs::remove_file(control);
        let listener = UnixListener::bind(control)
            .map_err(prep_err(format!("listen on {}", control.display())))?;

        self.ctl.set_metadata(&self.ctx.shared, |m| {
            if let Some(uid) = &migration_uid {
                metadata::start(m, uid, SystemTime::now());
            }
        });
        *self.ctl.target.lock().await = Some(PreparedTarget {
            prepared,
            vmi_uid: vmi_uid.clone(),
            proxy_key,
            view,
            memory_total,
        });
        *self
            .ctl
            .target_for
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(vmi_uid.clone());
        self.ctl.set_incoming(Incoming::Pending);
        drop(running);
        info!(control = %control.display(), "migration target prepared, waiting for the source");
        tokio::spawn(self.clone().serve_target(listener));
        Ok(())
    }

    /// Accepts source connections until one migration ran (successfully or not).
    async fn serve_target(self, listener: UnixListener) {
        loop {
            let conn = match listener.accept().await {
                Ok((c, _)) => c,
                Err(e) => {
                    warn!(error = %e, "migration control socket failed");
                    return;
                }
            };
            let Some(target) = self.ctl.target.lock().await.take() else {
                return;
            };
            match self.incoming_any(conn, target).await {
                Ok(()) => {
                    self.ctl.set_incoming(Incoming::Completed);
                    return;
                }
                Err((Some(target), e)) => {
                    warn!(reason = %e.failure_reason(), "migration source refused before QEMU started");
                    *self.ctl.target.lock().await = Some(target);
                }
                Err((None, e)) => {
                    warn!(reason = %e.failure_reason(), "incoming migration failed");
                    self.ctl.set_incoming(Incoming::Failed);
                    return;
                }
            }
        }
    }

    /// Accepts one connection of the role-0 socket: libvirt's remote protocol (a stock
    /// virt-launcher's libvirt migrating peer-to-peer, [`super::libvirt_peer`]) when its first
    /// frame is a call of libvirt's remote program; qlauncher's probe (a qlauncher source asking
    /// what this target is, `Client::probe_peer`) answered with the control protocol's version,
    /// then qlauncher's own control protocol on the same connection; else that protocol at
    /// once.
    async fn incoming_any(
        &self,
        mut conn: UnixStream,
        target: PreparedTarget,
    ) -> Result<(), (Option<PreparedTarget>, MigrationError)> {
        use super::libvirt_peer::FirstFrame;
        let peeked =
            tokio::time::timeout(ACCEPT_TIMEOUT, super::libvirt_peer::first_frame_of(&conn));
        match peeked.await {
            Ok(Ok(FirstFrame::Libvirt)) => {
                super::libvirt_peer::serve(self, conn, target, ACCEPT_TIMEOUT).await
            }
            Ok(Ok(FirstFrame::QlauncherProbe)) => {
                let answered = tokio::time::timeout(
                    ACCEPT_TIMEOUT,
                    crate::libvirt_rpc::server::answer_qlauncher_probe(
                        &mut conn,
                        super::protocol::PROTOCOL_VERSION,
                    ),
                );
                match answered.await {
                    Ok(Ok(())) => self.incoming(conn, target).await,
                    Ok(Err(e)) => Err((
                        Some(target),
                        MigrationError::Peer(format!("the source's probe: {e}")),
                    )),
                    Err(_) => Err((
                        Some(target),
                        MigrationError::Timeout("the source's probe did not arrive".into()),
                    )),
                }
            }
            Ok(Ok(FirstFrame::Qlauncher)) => self.incoming(conn, target).await,
            Ok(Err(e)) => Err((
                Some(target),
                MigrationError::Peer(format!("the migration control connection failed: {e}")),
            )),
            Err(_) => Err((
                Some(target),
                MigrationError::Timeout("the source sent no first frame".into()),
            )),
        }
    }

    /// One incoming migration: the source's definition, QEMU `-incoming defer`, ready, finish.
    /// An error before QEMU started hands the prepared target back.
    async fn incoming(
        &self,
        conn: UnixStream,
        target: PreparedTarget,
    ) -> Result<(), (Option<PreparedTarget>, MigrationError)> {
        let mut session = match accept(conn, &target.vmi_uid).await {
            Ok(s) => s,
            Err(e) => return Err((Some(target), e)),
        };
        let started = match self.start_incoming(target, &session.domain).await {
            Ok(s) => s,
            Err((target, reason, e)) => {
                session.fail(&reason).await;
                return Err((target, e));
            }
        };
        let StartedTarget {
            client,
            prepared,
            proxy_key,
        } = started;
        if let Err(e) = session
            .incoming(&client, &self.target_sockets(&proxy_key))
            .await
        {
            let _ = client.run(&Quit).await;
            return Err((None, e));
        }
        match session.finish(&client).await {
            Ok(TargetEnd::Completed { paused }) => {
                self.incoming_completed(paused, prepared.running).await;
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

    /// The target's QEMU for the source's `domain`, started `-S -incoming defer` from this
    /// pod's own conversion ([`incoming_definition`]: refused unless it reproduces the source)
    /// with what the source runs beyond its boot definition plugged
    /// ([`Self::plug_source_devices`]); the argv a later migration away from here sends is
    /// recorded. Errors carry the prepared target when QEMU never started (the source may try
    /// again), the reason to tell the source, and the error; a QEMU that started is stopped.
    pub(super) async fn start_incoming(
        &self,
        target: PreparedTarget,
        domain: &RunningDomain,
    ) -> Result<StartedTarget, (Option<PreparedTarget>, String, MigrationError)> {
        let mut boot = match incoming_definition(&self.ctx, &target, domain) {
            Ok(b) => b,
            Err(e) => return Err((Some(target), e.failure_reason(), e)),
        };
        let PreparedTarget {
            mut prepared,
            proxy_key,
            memory_total,
            ..
        } = target;
        // The source's hook edits, from now on applied at every definition here; a later
        // migration away from here carries the source's hooked domain on.
        prepared.running.hook_edits = std::mem::take(&mut boot.edits);
        prepared.running.hooked = domain.hooked.clone();
        if let Some((defined, spec)) = boot.redefined.take() {
            run_boot_plan(&mut prepared.running, &defined.plan, &[]);
            prepared.domain = spec;
            prepared.plan = defined.plan;
            prepared.qmp_plan = defined.qmp_plan;
            prepared.argv = defined.argv;
        }
        if let Some(cpu) = boot.cpu.take() {
            prepared.running.cpu = cpu;
        }
        if let Some(plan) = &boot.plan {
            run_boot_plan(&mut prepared.running, plan, &boot.placed);
        }
        let mut api = prepared.domain.clone();
        // No SR-IOV VFs here (see `incoming_definition`): the domain lists none until
        // `HotplugHostDevices`.
        api.spec.devices.drop_sriov_host_devices();
        api.spec.metadata.kubevirt.migration = self.ctl.metadata();
        let vsock = prepared.vsock.take();
        let launched = start::launch_incoming(&self.ctx, api, &prepared.plan, &boot.argv, vsock);
        let client = match launched.await {
            Ok(c) => c,
            Err(e) => {
                let reason = crate::sys::error::error_chain(&e);
                return Err((None, reason.clone(), MigrationError::Peer(reason)));
            }
        };
        let plugged = self.plug_source_devices(
            &client,
            &mut prepared,
            &boot.placed,
            &boot.nics,
            memory_total,
        );
        if let Err(e) = plugged.await {
            let _ = client.run(&Quit).await;
            return Err((None, e.failure_reason(), e));
        }
        // What a later migration away from here sends: this QEMU's argv without `-incoming`.
        let argv = &boot.argv;
        let boot_argv: Vec<String> = argv
            .strip_suffix(&["-incoming".to_owned(), "defer".to_owned()])
            .unwrap_or(argv)
            .to_vec();
        self.ctl.set_boot_argv(boot_argv);
        Ok(StartedTarget {
            client,
            prepared,
            proxy_key,
        })
    }

    /// What the source runs beyond its boot definition, plugged into the target's QEMU before
    /// `migrate-incoming`: the vCPUs beyond the first socket (as `vcpu<index>` like the
    /// source's), the source's hot-plugged disks (`placed`) and NICs (on this pod's taps), a
    /// hook's disk I/O limits (`block_set_io_throttle`), and the virtio-mem device of a memory that grew since boot, sized as the VMI asks
    /// (`memory_total`).
    async fn plug_source_devices(
        &self,
        client: &QmpClient,
        prepared: &mut Prepared,
        placed: &[DiskHotplug],
        nics: &[NicHotplug],
        memory_total: Option<u64>,
    ) -> Result<(), MigrationError> {
        let peer =
            |e: &dyn std::error::Error| MigrationError::Peer(crate::sys::error::error_chain(e));
        if let Err(e) = crate::sync::start::plug_boot_vcpus(client, prepared.plan.smp).await {
            return Err(peer(&e));
        }
        for d in placed {
            let attach = DiskAttach {
                blockdevs: d.blockdevs.clone(),
                device: d.device.clone(),
            };
            attach_disk(client, &attach)
                .await
                .map_err(MigrationError::Qmp)?;
            info!(device = %d.id, "hot-plugged disk of the source attached");
        }
        for n in nics {
            if let Err(e) = prepared.running.nics.attach_placed(client, n).await {
                return Err(peer(&e));
            }
        }
        // The plan's start-up commands are no device state QEMU migrates: a disk's I/O limits,
        // the balloon's stats polling interval and the links set down. libvirt issues them on
        // the target's QEMU as at a start (`qemuProcessLaunch`: `qemuProcessSetupBalloon`,
        // `qemuProcessSetLinkStates`, `qemuProcessSetupDiskThrottling`), before the stream.
        for step in &prepared.qmp_plan.startup {
            client.run(step).await.map_err(MigrationError::Qmp)?;
        }
        let Some(total) = memory_total else {
            return Ok(());
        };
        let memory = crate::sync::reconcile::resources::set_memory(
            client,
            &prepared.running.memory,
            &prepared.plan,
            total,
        );
        prepared.running.memory = memory.await.map_err(|e| peer(&e))?;
        info!(total, "virtio-mem device of the source plugged");
        if let Some(device) =
            crate::sync::reconcile::resources::virtio_mem_device(client, &prepared.running.memory)
                .await
        {
            self.ctx
                .shared
                .update_domain(|d| d.spec.devices.set_memory_device(device));
        }
        Ok(())
    }

    /// The sockets the migration streams arrive on: the proxy's stream and NBD sockets, named
    /// after the source VMI's UID (`proxy_key`, virt-handler's migrationProxyKey), and QEMU's
    /// own stream socket when the launcher orders the multifd channels (beside its QMP socket,
    /// in the directory made for QEMU's user).
    pub(super) fn target_sockets(&self, proxy_key: &str) -> TargetSockets {
        let (_, stream, nbd) = migration_proxy_sockets(&self.ctx.config, proxy_key);
        let ordered_stream = self
            .ctx
            .config
            .qmp_socket
            .with_file_name("migration-stream.sock");
        TargetSockets {
            stream,
            nbd,
            ordered_stream,
        }
    }

    /// A completed incoming migration: a user-paused VMI stays paused (Paused/User, libvirt's
    /// SUSPENDED/PAUSED after a paused migration, which virt-handler counts as active), the
    /// domain runs, and the migration metadata ends (KubeVirt's TargetMigrationMonitor: the end
    /// once no incoming job is left).
    pub(super) async fn incoming_completed(&self, paused: bool, running: Running) {
        info!(paused, "incoming migration completed");
        if paused {
            let status =
                crate::qmp::lifecycle::DomainStatus::new(DomainState::Paused, StateReason::User);
            self.ctx.shared.set_status(status);
            self.ctx
                .shared
                .publish(status, crate::sync::domain::DomainEventType::Modified);
        }
        *self.running.lock().await = Some(running);
        self.ctl.set_metadata(&self.ctx.shared, |m| {
            if let Some(m) = m {
                metadata::finish(m, None, SystemTime::now());
            }
        });
    }

    /// `SignalTargetPodCleanup`.
    pub(crate) async fn signal_cleanup(&self, vmi_json: Vec<u8>) -> Result<(), SyncError> {
        let (_, state) = decode(&vmi_json)?;
        let target_pod = state.and_then(|s| s.target_pod).unwrap_or_default();
        let pod = std::env::var("POD_NAME").unwrap_or_default();
        if pod.is_empty() || pod != target_pod {
            return Ok(());
        }
        if self.ctl.incoming() == Incoming::Failed {
            // Past its failed incoming migration the launcher has sent its final notification
            // and serves until this (or DeleteVirtualMachine): it may exit now
            // ([`crate::sync::launcher`]).
            info!(pod = %pod, "target pod cleanup signalled after the failed incoming migration");
            self.deleted.send_replace(true);
            return Ok(());
        }
        if self.ctx.qemu_pid().is_some() {
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
        &self,
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
            let client = self.ctx.client()?;
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
        if !self.ctl.time_synced.swap(true, Ordering::SeqCst) {
            let agent = self.ctx.info.agent.clone();
            tokio::spawn(sync_guest_time(agent));
        }
        Ok(())
    }
}

/// Sets the guest's clock to the host's every second for up to a minute, until the agent
/// answers (KubeVirt `setGuestTime`); stops when the agent says the command is unsupported.
async fn sync_guest_time(agent: Arc<crate::sync::guest::agent::GuestAgent>) {
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
            Err(AgentError::Command { class, .. }) if class == "CommandNotFound" => return,
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
