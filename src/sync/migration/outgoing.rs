//! The source side of a migration: `MigrateVirtualMachine` (the outgoing migration's task over
//! [`super::source`]), `CancelVirtualMachineMigration`, and the job statistics GetDomainStats
//! reports while it runs (KubeVirt v1.9.0 `live-migration-source.go`, `manager.go`).

use std::time::{Duration, SystemTime};

use tokio::net::UnixStream;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::libvirt_rpc::client::{Client, PeerKind};
use crate::qmp::commands::{QueryBlock, Quit};
use crate::qmp::lifecycle::{DomainState, StateReason};
use crate::qmp::QmpClient;
use crate::sync::error::SyncError;
use crate::sync::migration::launcher::{
    annotation, decode, migration_proxy_sockets, normalized, refused, require_unix_transport,
    MigrationCtx, VmiMigrationState, FORCE_FAILURE_ANNOTATION,
};
use crate::sync::migration::metadata::{self, abort, StartDecision};
use crate::sync::migration::protocol::{CopiedDisk, DomainIdentity, RunningDomain};
use crate::sync::migration::source::libvirt::{run_source_libvirt, StockTarget};
use crate::sync::migration::source::{
    resolved_machine, run_source_with, SourceEvent, SourcePlan, PEER_TIMEOUT,
};
use crate::sync::migration::{hotplug, sriov};
use crate::sync::migration::{MigrationError, MigrationOptions};
use crate::sync::state::Job;
use crate::vmi::Vmi;

/// What a decentralized migration's `targetState` says of the target VMI when it is not the
/// source's (KubeVirt's `generateMigrationParams`): its UID, and its identity next to the
/// source's when it has another name or namespace.
struct TargetVmi {
    /// `targetState.virtualMachineInstanceUID`.
    uid: Option<String>,
    /// (the source VMI's identity, `targetState.domainNamespace`/`domainName`).
    rename: Option<(DomainIdentity, DomainIdentity)>,
}

/// How long KubeVirt lets an abort take before it reports `AbortStatus: Failed`.
const ABORT_TIMEOUT: Duration = Duration::from_secs(30);

impl MigrationCtx {
    /// `MigrateVirtualMachine`.
    pub(crate) async fn migrate(
        &self,
        vmi_json: Vec<u8>,
        options: Vec<u8>,
    ) -> Result<(), SyncError> {
        let (vmi, state) = decode(&vmi_json)?;
        require_unix_transport(&vmi)?;
        if let Some(name) = state.as_ref().and_then(|s| s.running_backup.as_deref()) {
            return Err(refused(format!(
                "cannot migrate VMI until backup {name} is completed"
            )));
        }
        let uid = state
            .as_ref()
            .and_then(VmiMigrationState::uid)
            .ok_or_else(|| refused("cannot migrate VMI until migrationState is ready".into()))?;
        let options = MigrationOptions::from_json(&options)
            .map_err(|e| refused(format!("invalid migration options: {e}")))?;
        let client = self.ctx.client()?;
        let decision = {
            let mut m = self.ctl.metadata.lock().unwrap_or_else(|e| e.into_inner());
            metadata::start(&mut m, &uid, SystemTime::now())
        };
        match decision {
            StartDecision::AlreadyRunning => return Ok(()),
            StartDecision::AlreadyExecuted => {
                let m = self.ctl.metadata().unwrap_or_default();
                return Err(refused(format!(
                    "migration job {uid} already executed, finished at {}, failed: {}, \
                     abortStatus: {}",
                    m.end_timestamp.unwrap_or_default(),
                    m.failed,
                    m.abort_status
                )));
            }
            StartDecision::Start => {}
        }
        self.ctl.set_metadata(&self.ctx.shared, |_| {});
        info!(migration = %uid, "migration accepted");
        if annotation(&vmi, FORCE_FAILURE_ANNOTATION).is_some() {
            self.ctl.set_metadata(&self.ctx.shared, |m| {
                if let Some(m) = m {
                    metadata::finish(
                        m,
                        Some("Failed migration to satisfy functional test condition"),
                        SystemTime::now(),
                    );
                }
            });
            return Ok(());
        }
        if let Some(reason) = self.host_devices_refusal(&vmi).await {
            warn!(reason = %reason, "migration refused");
            self.ctl.set_metadata(&self.ctx.shared, |m| {
                if let Some(m) = m {
                    metadata::finish(m, Some(&reason), SystemTime::now());
                }
            });
            return Ok(());
        }
        let target_vmi_uid = state
            .as_ref()
            .and_then(VmiMigrationState::target_vmi_uid)
            .map(str::to_owned);
        let own_identity = DomainIdentity {
            namespace: vmi
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: vmi.metadata.name.clone().unwrap_or_default(),
        };
        let target_identity = state.as_ref().and_then(VmiMigrationState::target_domain);
        let target_vmi = TargetVmi {
            uid: target_vmi_uid,
            rename: target_identity.map(|t| (own_identity, t)),
        };
        let (abort_tx, abort_rx) = watch::channel(false);
        *self.ctl.abort.lock().unwrap_or_else(|e| e.into_inner()) = Some(abort_tx);
        let vmi_uid = vmi.metadata.uid.clone().unwrap_or_default();
        let me = self.clone();
        tokio::spawn(async move {
            let result = me
                .run_outgoing(&client, vmi, &vmi_uid, &target_vmi, &uid, options, abort_rx)
                .await;
            me.outgoing_ended(&client, result).await;
        });
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_outgoing(
        &self,
        client: &QmpClient,
        vmi: Vmi,
        vmi_uid: &str,
        target_vmi: &TargetVmi,
        migration_uid: &str,
        options: MigrationOptions,
        abort_rx: watch::Receiver<bool>,
    ) -> Result<(), MigrationError> {
        let (control, stream, nbd) = migration_proxy_sockets(&self.ctx.config, vmi_uid);
        // KubeVirt's prepareDomainForMigration: the VFs go before the definition is taken.
        self.unplug_sriov_for_migration(client).await?;
        let machine = resolved_machine(client).await?;
        let copied_disks = self.copied_disks(client).await?;
        let status = self.ctx.shared.status();
        let argv = self
            .ctl
            .boot_argv
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let memory = client
            .execute("query-memory-size-summary", None)
            .await
            .ok()
            .and_then(|v| v["base-memory"].as_u64())
            .unwrap_or(0);
        let data_bytes = memory + copied_disks.iter().map(|d| d.size).sum::<u64>();
        let (hotplugged, running_cpu, hooked) = match self.running.lock().await.as_ref() {
            Some(r) => {
                let mut hot = hotplug::hotplugged_disks(&r.disks, &argv);
                hot.extend(hotplug::hotplugged_nics(r.nics.hotplugged(), &argv));
                (hot, Some(r.cpu.clone()), r.hooked.clone())
            }
            None => (Vec::new(), None, None),
        };
        let cpu = match &running_cpu {
            Some(plan) => running_cpu_definition(client, plan).await?,
            None => None,
        };
        let domain = RunningDomain {
            vmi_uid: vmi_uid.to_owned(),
            migration_uid: migration_uid.to_owned(),
            machine,
            argv: normalized(&sriov::without_sriov_devices(&argv), &self.ctx.config),
            hotplugged,
            copied_disks,
            capabilities: Vec::new(),
            multifd_channels: None,
            paused: status.state == DomainState::Paused && status.reason == StateReason::User,
            cpu,
            hooked,
        };
        let domain = match target_vmi.uid.as_deref() {
            Some(target) => {
                info!(source = %vmi_uid, target = %target, "replacing the VMI UID with the target VMI UID in the definition");
                domain.for_target_vmi(vmi_uid, target)?
            }
            None => domain,
        };
        // KubeVirt's DestName and disk path rewrites, after the UID's (a name holding the UID
        // reads as that rewrite left it).
        let domain = match &target_vmi.rename {
            Some((own, target)) => {
                let own = match target_vmi.uid.as_deref() {
                    Some(t) if !vmi_uid.is_empty() => DomainIdentity {
                        namespace: own.namespace.replace(vmi_uid, t),
                        name: own.name.replace(vmi_uid, t),
                    },
                    _ => own.clone(),
                };
                info!(source = %own.domain_name(), target = %target.domain_name(), "naming the domain after the target VMI in the definition");
                domain.for_target_domain(&own, target)?
            }
            None => domain,
        };
        let plan = SourcePlan {
            stream,
            nbd,
            options,
            data_bytes,
        };
        let conn = UnixStream::connect(&control).await.map_err(|e| {
            MigrationError::Peer(format!(
                "cannot reach the migration target at {}: {e}",
                control.display()
            ))
        })?;
        // What answers on the control socket: a qlauncher target (its protocol version) or a
        // stock launcher's virtqemud ("Cannot find program", the connection still open).
        let mut rpc = Client::new(conn);
        let peer = match tokio::time::timeout(PEER_TIMEOUT, rpc.probe_peer()).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                // A qlauncher target from before the probe answers it with a Refused frame of
                // its own protocol, which is no libvirt frame.
                return Err(MigrationError::Peer(format!(
                    "the migration target's answer to qlauncher's probe (neither libvirt nor a \
                     qlauncher target of this version): {e}"
                )));
            }
            Err(_) => {
                return Err(MigrationError::Timeout(format!(
                    "no answer from the migration target to qlauncher's probe within \
                     {PEER_TIMEOUT:?}"
                )))
            }
        };
        let stock = match peer {
            PeerKind::Qlauncher(version) => {
                info!(version, "the migration target is a qlauncher launcher");
                None
            }
            PeerKind::StockLibvirt => {
                info!("the migration target is a stock launcher's libvirt");
                Some(self.stock_target(vmi, &domain).await?)
            }
        };
        self.ctx.shared.begin(Job::MigratingOut);
        // Post-copy started or the guest paused to converge: the record's mode changes at once,
        // as virt-handler reads it (KubeVirt's live-migration-source.go updates it the same way).
        let mut on_event = |e: SourceEvent| {
            self.ctl.set_metadata(&self.ctx.shared, |m| {
                if let Some(m) = m {
                    m.mode = e.mode().into();
                }
            })
        };
        let end = match stock {
            None => {
                let conn = rpc.into_inner();
                run_source_with(conn, client, domain, &plan, abort_rx, &mut on_event).await
            }
            Some(stock) => {
                run_source_libvirt(
                    &mut rpc,
                    client,
                    domain,
                    &stock,
                    &plan,
                    abort_rx,
                    &mut on_event,
                )
                .await
            }
        };
        self.ctx.shared.end(Job::MigratingOut);
        let end = end?;
        info!(
            total_ms = end.total_ms,
            downtime_ms = end.downtime_ms,
            "migration completed"
        );
        Ok(())
    }

    /// The result of an outgoing migration: on success QEMU is stopped (Shutoff/Migrated) and
    /// `EndTimestamp` set; on failure the abort status and `Failed` + reason.
    async fn outgoing_ended(&self, client: &QmpClient, result: Result<(), MigrationError>) {
        match result {
            Ok(()) => {
                // A cancel that came as the migration switched to post-copy was not carried
                // out: the abort failed (KubeVirt: libvirt refused it).
                self.ctl.set_metadata(&self.ctx.shared, |m| {
                    if let Some(m) = m {
                        if m.abort_status == abort::ABORTING {
                            m.abort_status = abort::FAILED.into();
                        }
                    }
                });
                self.ctx.shared.begin(Job::MigratedAway);
                let _ = client.run(&Quit).await;
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                while tokio::time::Instant::now() < deadline {
                    let s = self.ctx.shared.status();
                    if s.state == DomainState::Shutoff {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                self.ctl.set_metadata(&self.ctx.shared, |m| {
                    if let Some(m) = m {
                        metadata::finish(m, None, SystemTime::now());
                    }
                });
            }
            Err(e) => {
                let reason = e.failure_reason();
                warn!(reason = %reason, "migration failed");
                let aborted = e.is_abort();
                self.ctl.set_metadata(&self.ctx.shared, |m| {
                    if let Some(m) = m {
                        if m.abort_status == abort::ABORTING {
                            m.abort_status = if aborted {
                                abort::SUCCEEDED
                            } else {
                                abort::FAILED
                            }
                            .into();
                        }
                    }
                });
                self.ctl.set_metadata(&self.ctx.shared, |m| {
                    if let Some(m) = m {
                        metadata::finish(m, Some(&reason), SystemTime::now());
                    }
                });
            }
        }
        *self.ctl.abort.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// What a stock target's libvirt is sent for the running `domain`: the domain XML
    /// qlauncher exports for the plan of `vmi` (the VMI of MigrateVirtualMachine, converted
    /// against the running domain's facts, the hooks' edits applied) with the resolved machine
    /// type, its name and UUID, the copied disks' target names, and the URI KubeVirt's source
    /// opens (`qemu:///session` in a non-root pod).
    ///
    /// A host-model CPU ([`RunningDomain::cpu`]) is sent as libvirt's own source sends a running
    /// host-model domain's: `<cpu mode='custom' match='exact' check='full'>` with the CPU map
    /// model, vendor and features that give the running CPU's feature set
    /// ([`Self::stock_cpu`], [`super::stock_cpu`]), its `pmu` and `phys-bits`.
    ///
    /// # Errors
    /// [`MigrationError::Peer`]: what a stock target cannot be sent: a host-model CPU libvirt
    /// cannot name (a feature that is on, or that the target's model would change, has no name
    /// in libvirt's CPU map; `invtsc`; no CPU map in the image), a domain the exporter cannot
    /// write, a copied disk the XML does not list. The source runs on.
    async fn stock_target(
        &self,
        vmi: Vmi,
        domain: &RunningDomain,
    ) -> Result<StockTarget, MigrationError> {
        let refuse = |why: String| MigrationError::Peer(format!("a stock target: {why}"));
        let libvirt_cpu = match &domain.cpu {
            Some(def) => Some(self.stock_cpu(def).await?),
            None => None,
        };
        let running = self.running.lock().await;
        let r = running
            .as_ref()
            .ok_or_else(|| refuse("no domain runs here".into()))?;
        let vmi = crate::sync::admit::admit(vmi, Some(&r.firmware_uuid))
            .map_err(|e| refuse(e.to_string()))?
            .vmi;
        let purpose = crate::sync::facts::gather::Purpose::Resources { running: &r.ctx };
        let g = crate::sync::facts::gather::gather(&self.ctx.config, &vmi, purpose)
            .await
            .map_err(|e| refuse(e.to_string()))?;
        let mut plan = g.plan;
        qlauncher_libvirt_xml::hooks::apply(&r.hook_edits, &mut plan);
        plan.machine.machine_type = domain.machine.clone();
        plan.cpu.libvirt = libvirt_cpu;
        let exported = qlauncher_libvirt_xml::export(&g.view, &g.ctx, &plan)
            .and_then(|d| qlauncher_libvirt_xml::to_xml(&d))
            .map_err(|e| refuse(format!("cannot export the domain XML: {e}")))?;
        drop(running);
        let tree = qlauncher_libvirt_xml::hooks::parse(&exported)
            .map_err(|e| refuse(format!("the exported domain XML: {e}")))?;
        let child = |n: &qlauncher_libvirt_xml::golden::Node, name: &str| {
            n.children.iter().find(|c| c.name == name).cloned()
        };
        let disks: Vec<_> = child(&tree, "devices")
            .map(|d| {
                d.children
                    .into_iter()
                    .filter(|c| c.name == "disk")
                    .collect()
            })
            .unwrap_or_default();
        let mut copied = Vec::new();
        for d in &domain.copied_disks {
            let alias = d.export.strip_prefix("drive-").unwrap_or(&d.export);
            let dev = disks
                .iter()
                .find(|n| {
                    child(n, "alias")
                        .and_then(|a| a.attrs.get("name").cloned())
                        .as_deref()
                        == Some(alias)
                })
                .and_then(|n| child(n, "target"))
                .and_then(|t| t.attrs.get("dev").cloned())
                .ok_or_else(|| {
                    refuse(format!("the copied disk {alias} is not in the domain XML"))
                })?;
            copied.push((dev, d.size));
        }
        let uri = if self.ctx.config.runtime_uid == 0 {
            "qemu:///system"
        } else {
            "qemu:///session"
        };
        Ok(StockTarget {
            uri: uri.into(),
            xml: exported,
            name: plan.name.clone(),
            uuid: plan.uuid.clone(),
            copied,
        })
    }

    /// The running host-model CPU `def` in libvirt's terms ([`super::stock_cpu`]): decoded over
    /// libvirt's CPU map (the image's, [`crate::labeller::CPU_MAP_DIRS`]) among the models this
    /// QEMU has (`query-cpu-definitions`), then checked against what QEMU makes of the named
    /// model with those features (`query-cpu-model-expansion` static, on this QEMU: a target
    /// QEMU of another release may define the model otherwise, which its libvirt's
    /// `check='full'` then refuses for every feature it names) until every CPUID feature is the
    /// running one's.
    ///
    /// # Errors
    /// [`MigrationError::Peer`] with the features libvirt cannot name; QEMU's errors.
    async fn stock_cpu(
        &self,
        def: &crate::cmdline::plan::CpuModel,
    ) -> Result<crate::cmdline::plan::LibvirtCpu, MigrationError> {
        use super::stock_cpu::{expansion_request, from_definition, reconcile};
        use crate::cmdline::plan::{CpuModel, CpuProp};
        use crate::qmp::commands::{
            CpuModelExpansionType, QueryCpuDefinitions, QueryCpuModelExpansion,
        };
        let refuse = |why: String| {
            MigrationError::Peer(format!(
                "a stock target: the VMI's host-model CPU cannot be sent to libvirt: {why}"
            ))
        };
        let mut warnings = Vec::new();
        let map = crate::labeller::load_cpu_map(None, &mut warnings)
            .ok_or_else(|| refuse(warnings.join("; ")))?;
        let client = self
            .ctx
            .client()
            .map_err(|e| MigrationError::Qemu(e.to_string()))?;
        let expand = |model: CpuModel| {
            let client = client.clone();
            async move {
                client
                    .run(&QueryCpuModelExpansion {
                        kind: CpuModelExpansionType::Static,
                        model,
                    })
                    .await
                    .map(|e| e.model)
            }
        };
        let models = crate::labeller::probe::qemu_models(client.run(&QueryCpuDefinitions).await?);
        let mut cpu = from_definition(&map, def, Some(&models)).map_err(refuse)?;
        // The feature set the guest runs: the expansion itself, or QEMU's expansion of a named
        // model adopted from a stock source (its definition lists the changed features only).
        let running = if def.name == "base" {
            def.clone()
        } else {
            let features = def
                .props
                .iter()
                .filter(|(_, v)| matches!(v, CpuProp::Bool(_)))
                .filter(|(n, _)| !n.starts_with("hv-") && *n != "pmu" && *n != "kvm")
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect();
            expand(CpuModel {
                name: def.name.clone(),
                props: features,
            })
            .await?
        };
        for _ in 0..3 {
            let target = expand(expansion_request(&cpu)).await?;
            if !reconcile(&map, &mut cpu, &running, &target).map_err(refuse)? {
                info!(
                    model = %cpu.model,
                    vendor = ?cpu.vendor,
                    features = cpu.features.len(),
                    "host-model CPU named for the stock target"
                );
                return Ok(cpu);
            }
        }
        Err(refuse(format!(
            "QEMU's {} does not take the running CPU's features",
            cpu.model
        )))
    }

    /// The local disks to mirror (KubeVirt `getDiskTargetsForMigration`): every writable disk
    /// whose image lives in the pod's own storage (containerDisk and ephemeral overlays, empty
    /// disks, cloud-init and config ISOs), by format node, with export `drive-<alias>`.
    async fn copied_disks(&self, client: &QmpClient) -> Result<Vec<CopiedDisk>, MigrationError> {
        let p = &self.ctx.config.paths;
        let local = [&p.ephemeral_disks, &p.empty_disks, &p.cloud_init];
        let blocks = client.run(&QueryBlock).await?;
        let mut out = Vec::new();
        for b in &blocks {
            let Some(ins) = &b.inserted else {
                continue;
            };
            if ins.ro.unwrap_or(true) {
                continue;
            }
            let file = ins.file.as_deref().unwrap_or_default();
            if !local
                .iter()
                .any(|root| !root.is_empty() && file.contains(root.as_str()))
            {
                continue;
            }
            let qdev = b.qdev.as_deref().unwrap_or_default();
            let alias = qdev
                .strip_prefix("/machine/peripheral/")
                .map(|rest| rest.split('/').next().unwrap_or(rest))
                .unwrap_or(qdev);
            let (Some(node), Some(size)) = (
                ins.node_name.as_deref(),
                ins.image.as_ref().and_then(|i| i.virtual_size),
            ) else {
                continue;
            };
            if alias.is_empty() {
                continue;
            }
            out.push(CopiedDisk {
                node: node.to_owned(),
                export: format!("drive-{alias}"),
                size,
            });
        }
        Ok(out)
    }

    /// `CancelVirtualMachineMigration`.
    pub(crate) async fn cancel(&self, vmi_json: Vec<u8>) -> Result<(), SyncError> {
        decode(&vmi_json)?;
        let Some(m) = self.ctl.metadata() else {
            return Ok(());
        };
        if !metadata::cancel_applies(&m) {
            return Ok(());
        }
        self.ctl.set_metadata(&self.ctx.shared, |m| {
            if let Some(m) = m {
                m.abort_status = abort::ABORTING.into();
            }
        });
        if m.mode == SourceEvent::PostCopy.mode() {
            // KubeVirt asks libvirt to abort the job, and libvirt refuses once the migration is
            // in post-copy (the guest runs on the target; QEMU's `migrate_cancel` would accept
            // and lose it): the abort fails at once and the migration goes on to complete
            // (`asyncMigrationAbort`, live-migration-source.go).
            info!("cancel refused: the migration is in post-copy");
            self.ctl.set_metadata(&self.ctx.shared, |m| {
                if let Some(m) = m {
                    m.abort_status = abort::FAILED.into();
                }
            });
            return Ok(());
        }
        let sender = self
            .ctl
            .abort
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(sender) = sender else {
            // No migration job runs: the abort fails (KubeVirt: no active job).
            self.ctl.set_metadata(&self.ctx.shared, |m| {
                if let Some(m) = m {
                    m.abort_status = abort::FAILED.into();
                }
            });
            return Ok(());
        };
        // The migration task cancels QEMU's migration itself (`roll_back`), unless it has
        // switched to post-copy meanwhile: a `migrate_cancel` sent from here could race with
        // `migrate-start-postcopy` and break a guest already running on the target.
        sender.send_replace(true);
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ABORT_TIMEOUT).await;
            me.ctl.set_metadata(&me.ctx.shared, |m| {
                if let Some(m) = m {
                    if m.abort_status == abort::ABORTING {
                        m.abort_status = abort::FAILED.into();
                    }
                }
            });
        });
        Ok(())
    }
}

/// The CPU definition a migration sends for the CPU `plan` the source's QEMU (`client`) runs
/// ([`RunningDomain::cpu`]): for a host-model CPU the static expansion QEMU answers for it
/// (`query-cpu-model-expansion`, with the plan's on/off flags applied), with the running vCPU's
/// `pmu` and `phys-bits` (`qom-get`, [`crate::cmdline::devices::cpu::RUNNING_CPU_PROPS`]) and the
/// plan's flags the expansion does not list
/// ([`crate::cmdline::devices::cpu::source_definition`]); a CPU adopted from an earlier migration
/// is sent on as adopted. `None` for host-passthrough (libvirt migrates it as `host`, between
/// identical hosts) and named models (the target renders the same model from the VMI).
///
/// Errors: the expansion or the vCPU's properties cannot be read (a QEMU or accelerator without
/// them): the migration fails with that reason rather than let the target run another CPU.
pub async fn running_cpu_definition(
    client: &QmpClient,
    plan: &crate::cmdline::plan::CpuPlan,
) -> Result<Option<crate::cmdline::plan::CpuModel>, MigrationError> {
    use crate::cmdline::devices::cpu::{
        expansion_request, source_definition, with_running_props, RUNNING_CPU_PROPS,
    };
    use crate::qmp::commands::{
        CpuModelExpansionType, QomGet, QueryCpuModelExpansion, QueryCpusFast,
    };
    if !plan.host_model {
        return Ok(None);
    }
    if plan.adopted.is_some() {
        return Ok(Some(source_definition(plan, Default::default())));
    }
    let expanded = client
        .run(&QueryCpuModelExpansion {
            kind: CpuModelExpansionType::Static,
            model: expansion_request(plan),
        })
        .await?;
    let cpus = client.run(&QueryCpusFast).await?;
    let mut running = Vec::new();
    if let Some(vcpu) = cpus.first().filter(|c| !c.qom_path.is_empty()) {
        for property in RUNNING_CPU_PROPS {
            let q = QomGet {
                path: vcpu.qom_path.clone(),
                property: property.to_owned(),
            };
            let value = client.run(&q).await?;
            let value = serde_json::from_value(value).map_err(|e| {
                MigrationError::Qemu(format!("the vCPU's {property} is not a CPU property: {e}"))
            })?;
            running.push((property.to_owned(), value));
        }
    }
    let expanded = with_running_props(expanded.model, running);
    info!(
        model = %plan.model,
        base = %expanded.name,
        props = expanded.props.len(),
        "host-model CPU expanded for the target"
    );
    Ok(Some(source_definition(plan, expanded)))
}

impl MigrationCtx {
    /// Hot-unplugs the running domain's SR-IOV devices before the definition is taken, under the
    /// domain-modify (sync) lock, and drops the released ones from the domain's host devices
    /// (virt-handler then sees them gone and re-plugs them with `HotplugHostDevices` wherever
    /// the domain ends up) ([`sriov::unplug_sriov`], KubeVirt's `hotUnplugHostDevices`).
    ///
    /// # Errors
    /// [`MigrationError::Prepare`]: not all of them were released; the migration fails and the
    /// domain runs on.
    async fn unplug_sriov_for_migration(&self, client: &QmpClient) -> Result<(), MigrationError> {
        let _modify = self.running.lock().await;
        let result = sriov::unplug_sriov(client, sriov::DETACH_TIMEOUT).await;
        let released: Vec<String> = match &result {
            Ok(all) => all.clone(),
            Err(sriov::SriovDetachError::Timeout { detached, .. }) => detached.clone(),
            Err(_) => Vec::new(),
        };
        if !released.is_empty() {
            info!(devices = ?released, "SR-IOV host devices unplugged for the migration");
            self.ctx.shared.update_domain(|d| {
                let before = d.spec.devices.host_devices.len();
                d.spec
                    .devices
                    .host_devices
                    .retain(|h| !h.alias.as_ref().is_some_and(|a| released.contains(&a.name)));
                d.spec.devices.host_devices.len() != before
            });
        }
        result.map(drop).map_err(MigrationError::Prepare)
    }

    /// KubeVirt's refusal of a VMI whose host devices cannot migrate ([`sriov::not_migratable`];
    /// a GPU counts as a vGPU when this domain started it as a mediated device).
    async fn host_devices_refusal(&self, vmi: &crate::vmi::Vmi) -> Option<String> {
        use crate::cmdline::context::{host_device_id, HostDeviceKind, HostDeviceSource};
        let running = self.running.lock().await;
        let ctx = running.as_ref().map(|r| &r.ctx);
        sriov::not_migratable(vmi, |name| {
            ctx.and_then(|c| {
                c.host_devices
                    .get(&host_device_id(HostDeviceKind::Gpu, name))
            })
            .is_some_and(|s| matches!(s, HostDeviceSource::Mdev(_)))
        })
    }
}

/// KubeVirt's `stats.DomainJobInfo` (Go field names) of a running migration, as libvirt's job
/// statistics map QEMU's: data = RAM plus the disk mirrors (`query-block-jobs` offset/len),
/// `MemoryBps` = `ram.mbps` × 125 000 (QEMU's unit is 10^6 bit/s), `MemDirtyRate` in bytes/s
/// (dirty pages/s × page size).
pub fn job_info(
    info: &crate::qmp::migration::MigrationInfo,
    jobs: &[crate::qmp::migration::BlockJobInfo],
) -> serde_json::Value {
    let ram = info.ram.clone().unwrap_or_default();
    let (len, offset) = jobs
        .iter()
        .filter(|j| j.device.starts_with("drive-"))
        .fold((0u64, 0u64), |(l, o), j| (l + j.len, o + j.offset));
    let page = if ram.page_size == 0 {
        4096
    } else {
        ram.page_size
    };
    serde_json::json!({
        "DataTotalSet": true, "DataTotal": ram.total + len,
        "DataProcessedSet": true, "DataProcessed": ram.transferred + offset,
        "MemoryBpsSet": true, "MemoryBps": (ram.mbps * 125_000.0) as u64,
        "DataRemainingSet": true, "DataRemaining": ram.remaining + len.saturating_sub(offset),
        "MemDirtyRateSet": true, "MemDirtyRate": ram.dirty_pages_rate.saturating_mul(page),
    })
}

impl MigrationCtx {
    /// `MigrateDomainJobInfo` for GetDomainStats while an outgoing migration runs (`None`
    /// otherwise).
    pub(crate) async fn migration_job_info(&self) -> Option<serde_json::Value> {
        let active = self
            .ctl
            .abort
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if !active {
            return None;
        }
        let client = self.ctx.client().ok()?;
        let info = client
            .run(&crate::qmp::migration::QueryMigrate)
            .await
            .ok()?;
        let jobs = client
            .run(&crate::qmp::migration::QueryBlockJobs)
            .await
            .unwrap_or_default();
        Some(job_info(&info, &jobs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_info_adds_the_mirrors_and_converts_units() {
        use crate::qmp::migration::{BlockJobInfo, MigrationInfo, RamStats};
        let info = MigrationInfo {
            status: Some("active".into()),
            ram: Some(RamStats {
                total: 1000,
                transferred: 400,
                remaining: 600,
                mbps: 8.0,
                dirty_pages_rate: 10,
                page_size: 4096,
                ..Default::default()
            }),
            ..Default::default()
        };
        let jobs = vec![BlockJobInfo {
            device: "drive-ua-rootdisk".into(),
            len: 100,
            offset: 30,
            ready: false,
            status: "running".into(),
        }];
        let v = job_info(&info, &jobs);
        assert_eq!(v["DataTotal"], 1100);
        assert_eq!(v["DataProcessed"], 430);
        assert_eq!(v["DataRemaining"], 670);
        assert_eq!(v["MemoryBps"], 1_000_000);
        assert_eq!(v["MemDirtyRate"], 40960);
    }
}
