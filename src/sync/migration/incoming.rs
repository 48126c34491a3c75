//! The target side of a migration: `SyncMigrationTarget` (prepare, listen, then the incoming
//! migration over [`super::target`] once the source's definition arrives),
//! `SignalTargetPodCleanup` and `FinalizeVirtualMachineMigration` (KubeVirt v1.9.0
//! `live-migration-target.go`, `manager.go`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::net::{UnixListener, UnixStream};
use tracing::{info, warn};

use crate::cmdline::context::TapSource;
use crate::cmdline::plan::{CpuPlan, DomainPlan};
use crate::cmdline::render::{qmp_plan, DiskHotplug, NicHotplug};
use crate::qmp::client::QmpClient;
use crate::qmp::commands::Quit;
use crate::qmp::hotplug::{attach_disk, DiskAttach};
use crate::qmp::lifecycle::{DomainState, StateReason};
use crate::sync::admit::{admit, Admitted};
use crate::sync::error::SyncError;
use crate::sync::guest::agent::AgentError;
use crate::sync::migration::launcher::{
    annotation, boot_memory_view, decode, migration_proxy_sockets, normalized, refused,
    require_unix_transport, Incoming, PreparedTarget, VmiMigrationState, BLOCK_TARGET_ANNOTATION,
};
use crate::sync::migration::metadata;
use crate::sync::migration::protocol::{HotplugKind, HotpluggedDevice, RunningDomain};
use crate::sync::migration::target::{incoming_argv, TargetEnd, TargetSession, TargetSockets};
use crate::sync::migration::MigrationError;
use crate::sync::migration::{hotplug, sriov};
use crate::sync::rpc::proto::cmd::v1::VirtualMachineOptions;
use crate::sync::start::Prepared;
use crate::sync::state::Running;
use crate::sync::vmi_sync::SyncVmi;
use crate::sync::{privileges, start};
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
    /// The plan `argv` renders, when it differs from the prepared one (hot-plugged devices).
    plan: Option<DomainPlan>,
    /// The source's hot-plugged NICs, on this pod's taps, placed as the source runs them,
    /// plugged before `migrate-incoming`.
    nics: Vec<NicHotplug>,
    /// The CPU adopted from the source's definition ([`RunningDomain::cpu`]), which `argv`
    /// renders instead of the prepared plan's.
    cpu: Option<CpuPlan>,
}

/// `argv` with the value of its `-cpu` replaced by that of `ours` (when both have one): the
/// source's argv as the target compares it once the CPU comes from the source's definition, which
/// carries (and `enforce`s) the CPU identity itself. The source may run `-cpu max` or `host`
/// (host-model at its start) or an adopted `base,...` (an earlier migration).
fn with_cpu_of(argv: &[String], ours: &[String]) -> Vec<String> {
    let cpu = |a: &[String]| a.iter().position(|w| w == "-cpu").map(|i| i + 1);
    let mut out = argv.to_vec();
    if let (Some(i), Some(j)) = (cpu(argv), cpu(ours)) {
        if let (Some(w), Some(v)) = (out.get_mut(i), ours.get(j)) {
            w.clone_from(v);
        }
    }
    out
}

/// Checks this target's normalized argv `local` word for word against the source's
/// ([`incoming_argv`]); when the source sent a CPU definition, its `-cpu` is compared as the
/// adopted one ([`with_cpu_of`], see `adopt_source_cpu`), which the definition itself enforces.
fn matches_source(local: &[String], domain: &RunningDomain) -> Result<Vec<String>, MigrationError> {
    if domain.cpu.is_none() {
        return incoming_argv(local, domain);
    }
    let mut compared = domain.clone();
    compared.argv = with_cpu_of(&compared.argv, local);
    incoming_argv(local, &compared)
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

/// What runs once the target boots a plan of its own (the source had hot-plugged devices):
/// the boot plan's disks and media, then the source's hot-plugged disks (`placed`), and the
/// next free node index after them all.
fn run_boot_plan(running: &mut Running, plan: &DomainPlan, placed: &[DiskHotplug]) {
    let mut disks: std::collections::BTreeMap<String, DiskHotplug> = qmp_plan(plan)
        .disks
        .into_iter()
        .map(|d| (d.id.clone(), d))
        .collect();
    for d in placed {
        disks.insert(d.id.clone(), d.clone());
    }
    running.next_node =
        hotplug::next_node_after(&disks, crate::sync::reconcile::disks::next_node_index(plan));
    running.disks = disks;
    running.cdroms = crate::sync::reconcile::media::cdroms(plan);
}

impl SyncVmi {
    /// `SyncMigrationTarget`.
    pub(crate) async fn sync_target(
        self: Arc<Self>,
        vmi_json: Vec<u8>,
        _options: Option<VirtualMachineOptions>,
    ) -> Result<(), SyncError> {
        let (vmi, state) = decode(&vmi_json)?;
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
            .migration
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
        let prepared = start::prepare(&self.ctx, &vmi, key).await?;
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

        self.migration.set_metadata(&self.ctx.shared, |m| {
            if let Some(uid) = &migration_uid {
                metadata::start(m, uid, SystemTime::now());
            }
        });
        *self.migration.target.lock().await = Some(PreparedTarget {
            prepared,
            vmi_uid: vmi_uid.clone(),
            proxy_key,
            view,
            memory_total,
        });
        *self
            .migration
            .target_for
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(vmi_uid.clone());
        self.migration.set_incoming(Incoming::Pending);
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
                Ok(()) => {
                    self.migration.set_incoming(Incoming::Completed);
                    return;
                }
                Err((Some(target), e)) => {
                    warn!(reason = %e.failure_reason(), "migration source refused before QEMU started");
                    *self.migration.target.lock().await = Some(target);
                }
                Err((None, e)) => {
                    warn!(reason = %e.failure_reason(), "incoming migration failed");
                    self.migration.set_incoming(Incoming::Failed);
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
        let mut session = match accept(conn, &target.vmi_uid).await {
            Ok(s) => s,
            Err(e) => return Err((Some(target), e)),
        };
        let boot = match self.incoming_definition(&target, &session.domain) {
            Ok(b) => b,
            Err(e) => {
                session.fail(&e.failure_reason()).await;
                return Err((Some(target), e));
            }
        };
        let PreparedTarget {
            mut prepared,
            proxy_key,
            memory_total,
            ..
        } = target;
        if let Some(cpu) = boot.cpu {
            prepared.running.cpu = cpu;
        }
        if let Some(plan) = &boot.plan {
            run_boot_plan(&mut prepared.running, plan, &boot.placed);
        }
        let mut domain = prepared.domain.clone();
        // No SR-IOV VFs here (see `incoming_definition`): the domain lists none until
        // `HotplugHostDevices`.
        domain.spec.devices.drop_sriov_host_devices();
        domain.spec.metadata.kubevirt.migration = self.migration.metadata();
        let vsock = prepared.vsock.take();
        let launched = start::launch_incoming(&self.ctx, domain, &prepared.plan, &boot.argv, vsock);
        let client = match launched.await {
            Ok(c) => c,
            Err(e) => {
                let reason = crate::sys::error::error_chain(&e);
                session.fail(&reason).await;
                return Err((None, MigrationError::Peer(reason)));
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
            session.fail(&e.failure_reason()).await;
            let _ = client.run(&Quit).await;
            return Err((None, e));
        }
        // What a later migration away from here sends: this QEMU's argv without `-incoming`.
        let argv = &boot.argv;
        let boot_argv: Vec<String> = argv
            .strip_suffix(&["-incoming".to_owned(), "defer".to_owned()])
            .unwrap_or(argv)
            .to_vec();
        self.migration.set_boot_argv(boot_argv);
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

    /// The argv the target's QEMU starts with for the source's `domain` (with `-incoming
    /// defer`), and what it plugs before the device state arrives ([`BootConversion`]): the
    /// boot conversion with the source's CPU adopted, without SR-IOV devices, refused unless it
    /// matches the source's argv.
    ///
    /// KubeVirt's target creates no SR-IOV devices: the source unplugged its VFs and sends
    /// none; virt-handler plugs the target pod's VFs after the migration.
    fn incoming_definition(
        &self,
        target: &PreparedTarget,
        domain: &RunningDomain,
    ) -> Result<BootConversion, MigrationError> {
        let mut b = self
            .boot_conversion(target, domain)
            .and_then(|b| self.adopt_source_cpu(target, b, domain))?;
        b.argv = sriov::without_sriov_devices(&b.argv);
        matches_source(&normalized(&b.argv, &self.ctx.config), domain)?;
        let mut d = domain.clone();
        d.argv.clear();
        b.argv = incoming_argv(&b.argv, &d)?;
        Ok(b)
    }

    /// What the source runs beyond its boot definition, plugged into the target's QEMU before
    /// `migrate-incoming`: the vCPUs beyond the first socket (as `vcpu<index>` like the
    /// source's), the source's hot-plugged disks (`placed`) and NICs (on this pod's taps), and
    /// the virtio-mem device of a memory that grew since boot, sized as the VMI asks
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
            crate::sync::domain_spec::virtio_mem_device(client, &prepared.running.memory).await
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
    fn target_sockets(&self, proxy_key: &str) -> TargetSockets {
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
    async fn incoming_completed(&self, paused: bool, running: Running) {
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
        self.migration.set_metadata(&self.ctx.shared, |m| {
            if let Some(m) = m {
                metadata::finish(m, None, SystemTime::now());
            }
        });
    }

    /// The target's QEMU definition for the source's `domain` ([`BootConversion`]): without
    /// hot-plugged devices the prepared argv; with them the VMI converted again without those
    /// devices ([`hotplug::boot_views`]: with hot-plugged NICs, the first view whose argv is the
    /// source's), the disks from the prepared (full) plan with the target's own paths and the
    /// NICs from the full VMI converted with their taps passed by fd, each placed as the source
    /// runs it ([`hotplug::place_like_source`], [`hotplug::place_nic_like_source`]).
    fn boot_conversion(
        &self,
        target: &PreparedTarget,
        domain: &RunningDomain,
    ) -> Result<BootConversion, MigrationError> {
        if domain.hotplugged.is_empty() {
            return Ok(BootConversion {
                argv: target.prepared.argv.clone(),
                placed: Vec::new(),
                plan: None,
                cpu: None,
                nics: Vec::new(),
            });
        }
        let ctx = &target.prepared.running.ctx;
        let mut boots = Vec::new();
        for view in hotplug::boot_views(&target.view, &domain.hotplugged) {
            let plan = crate::cmdline::convert(&view, ctx).map_err(|e| {
                MigrationError::Peer(format!(
                    "cannot convert the VMI without its hot-plugged devices: {e}"
                ))
            })?;
            let argv = start::argv(&self.ctx, &plan);
            boots.push((plan, argv));
        }
        // The view whose argv is the source's; none: the first, whose difference the caller
        // reports.
        let matching = boots
            .iter()
            .position(|(_, argv)| {
                let local = normalized(&sriov::without_sriov_devices(argv), &self.ctx.config);
                matches_source(&local, domain).is_ok()
            })
            .unwrap_or(0);
        let Some((plan, argv)) = boots.into_iter().nth(matching) else {
            return Err(MigrationError::Peer("no boot conversion of the VMI".into()));
        };
        let (disks, nic_devices): (Vec<_>, Vec<_>) = domain
            .hotplugged
            .iter()
            .partition(|h| h.kind == HotplugKind::Disk);
        let placed = disks
            .into_iter()
            .map(|h| hotplug::place_like_source(&target.prepared.qmp_plan.disks, h))
            .collect::<Result<Vec<_>, _>>()?;
        let nics = if nic_devices.is_empty() {
            Vec::new()
        } else {
            let local = self.nic_plans_by_fd(target, &nic_devices)?;
            nic_devices
                .into_iter()
                .map(|h| hotplug::place_nic_like_source(&local, h))
                .collect::<Result<Vec<_>, _>>()?
        };
        Ok(BootConversion {
            argv,
            placed,
            plan: Some(plan),
            nics,
            cpu: None,
        })
    }

    /// `boot` with the CPU of the source's definition ([`RunningDomain::cpu`], a host-model CPU's
    /// static expansion): its plan's `-cpu` becomes the adopted `base,<properties>,enforce=on`
    /// ([`crate::cmdline::devices::cpu::adopted_cpu_plan`]) and its argv is rendered again, so
    /// the guest keeps the source's CPUID identity; QEMU then refuses to start if this host
    /// cannot provide a property. Without a definition (host-passthrough, a named model, a
    /// version-2 source) `boot` is unchanged.
    ///
    /// Errors: a definition for a VMI that is not host-model here, or one that is not a plain
    /// model and properties (one that would inject a `-cpu` option, refused with the property's
    /// path).
    fn adopt_source_cpu(
        &self,
        target: &PreparedTarget,
        mut boot: BootConversion,
        domain: &RunningDomain,
    ) -> Result<BootConversion, MigrationError> {
        let Some(def) = &domain.cpu else {
            return Ok(boot);
        };
        if !target.prepared.plan.cpu.host_model {
            return Err(MigrationError::Peer(
                "the source sent a CPU definition for a VMI whose CPU is not host-model".into(),
            ));
        }
        let cpu = crate::cmdline::devices::cpu::adopted_cpu_plan(def).map_err(|e| {
            MigrationError::Peer(format!("cannot adopt the source's CPU definition: {e}"))
        })?;
        let mut plan = boot
            .plan
            .take()
            .unwrap_or_else(|| target.prepared.plan.clone());
        plan.cpu = cpu.clone();
        boot.argv = start::argv(&self.ctx, &plan);
        // Only a plan of other disks than the prepared one replaces it (the CPU is in `cpu`).
        if domain.hotplugged.is_empty() {
            boot.plan = None;
        } else {
            boot.plan = Some(plan);
        }
        info!(model = %cpu.model, props = cpu.flags.len() - 1, "source's CPU adopted");
        boot.cpu = Some(cpu);
        Ok(boot)
    }

    /// This target's QMP plan of the NICs `hot` (the full VMI converted with the tap of each
    /// passed by fd, as a hot-plug by diff does; the binding of each was set up when the target
    /// was prepared).
    fn nic_plans_by_fd(
        &self,
        target: &PreparedTarget,
        hot: &[&HotpluggedDevice],
    ) -> Result<Vec<NicHotplug>, MigrationError> {
        let mut ctx = target.prepared.running.ctx.clone();
        for h in hot {
            if let Some(facts) = ctx.interfaces.get_mut(&h.name) {
                facts.tap = TapSource::Fds {
                    fds: vec![-1],
                    vhostfds: vec![],
                };
            }
        }
        let plan = crate::cmdline::convert(&target.view, &ctx).map_err(|e| {
            MigrationError::Peer(format!(
                "cannot convert the VMI with its hot-plugged interfaces: {e}"
            ))
        })?;
        Ok(qmp_plan(&plan).nics)
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
        if self.migration.incoming() == Incoming::Failed {
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
        if !self.migration.time_synced.swap(true, Ordering::SeqCst) {
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

    #[test]
    fn the_sources_cpu_word_is_compared_as_the_adopted_one() {
        let w = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        let ours = w("-machine q35 -cpu base,family=15,enforce=on -m 128");
        assert_eq!(with_cpu_of(&w("-machine q35 -cpu max -m 128"), &ours), ours);
        // Nothing to replace: unchanged.
        assert_eq!(with_cpu_of(&w("-machine q35"), &ours), w("-machine q35"));
        assert_eq!(with_cpu_of(&w("-cpu"), &ours), w("-cpu"));
    }
}
