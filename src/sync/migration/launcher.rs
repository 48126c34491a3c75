//! The five migration RPCs of the launcher over the engine ([`super::source`],
//! [`super::target`], [`super::protocol`]), as KubeVirt v1.9.0's launcher answers them
//! (`pkg/virt-launcher/virtwrap/manager.go`, `live-migration-source.go`,
//! `live-migration-target.go`, `cmd-server/server.go`):
//!
//! - `MigrateVirtualMachine` (source): records `{UID, StartTimestamp, Mode: PreCopy}` and returns;
//!   a task connects to the target through the proxy's role-0 socket and runs the migration; on
//!   success QEMU is stopped (Shutoff/Migrated) and `EndTimestamp` set, on failure the source runs
//!   on and the record says `Failed` with the reason. One shot per migration UID; a repeat while
//!   it runs is a no-op.
//! - `SyncMigrationTarget` (target): storage, network and conversion as a first sync does, the
//!   record, the proxy directory, and a listener on the role-0 socket; QEMU starts only when the
//!   source's definition arrives. Re-runnable.
//! - `CancelVirtualMachineMigration`: `AbortStatus` Aborting, then Succeeded once QEMU's job is
//!   cancelled (Failed when there was none to cancel).
//! - `SignalTargetPodCleanup`: when `POD_NAME` is the migration's target pod and no domain ever
//!   started here, the launcher exits (KubeVirt's early-exit signal).
//! - `FinalizeVirtualMachineMigration`: link refresh of the interfaces whose binding asks for it,
//!   and the guest-time sync (once per process).
//!
//! Every RPC returns within a few seconds; the long work runs in tasks.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::cmdline::plan::DomainPlan;
use crate::cmdline::render::{qmp_plan, DiskHotplug};
use crate::qmp::commands::{QueryBlock, Quit};
use crate::qmp::hotplug::{attach_disk, DiskAttach};
use crate::qmp::lifecycle::{DomainState, StateReason};
use crate::qmp::migration::MigrateCancel;
use crate::qmp::QmpClient;
use crate::sync::migration::hotplug;
use crate::sync::migration::metadata::{abort, MigrationMetadata, StartDecision};
use crate::sync::migration::protocol::{CopiedDisk, RunningDomain};
use crate::sync::migration::source::{resolved_machine, run_source_with, SourcePlan};
use crate::sync::migration::target::{incoming_argv, TargetEnd, TargetSession, TargetSockets};
use crate::sync::migration::{
    proxy_socket, MigrationError, MigrationOptions, BLOCK_MIGRATION_PORT, DIRECT_MIGRATION_PORT,
};
use crate::sync::proto::cmd::v1::VirtualMachineOptions;
use crate::sync::start::Prepared;
use crate::sync::vmi_sync::SyncVmi;
use crate::sync::{privileges, SyncError};
use crate::vmi::Vmi;

/// The annotation that makes KubeVirt's source launcher fail a migration at once.
pub const FORCE_FAILURE_ANNOTATION: &str = "kubevirt.io/func-test-force-launcher-migration-failure";
/// The annotation that makes KubeVirt's target launcher refuse preparation.
pub const BLOCK_TARGET_ANNOTATION: &str =
    "kubevirt.io/func-test-block-migration-target-preparation";
/// How long the target waits for the source's hello and definition once connected.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long KubeVirt lets an abort take before it reports `AbortStatus: Failed`.
const ABORT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the guest time is synchronised after a migration (KubeVirt `setGuestTime`).
const TIME_SYNC_WINDOW: Duration = Duration::from_secs(60);

/// Migration state of one launcher, beside the running domain.
#[derive(Default)]
pub(crate) struct MigrationCtl {
    /// QEMU's argv as this launcher started it (`-S` included), for the definition sent.
    boot_argv: StdMutex<Vec<String>>,
    /// The migration record; also in the domain once one exists.
    metadata: StdMutex<Option<MigrationMetadata>>,
    /// Turns true to cancel the outgoing migration.
    abort: StdMutex<Option<watch::Sender<bool>>>,
    /// The prepared target waiting for the source (taken when QEMU starts).
    target: tokio::sync::Mutex<Option<PreparedTarget>>,
    /// The VMI UID a target was prepared for (SyncMigrationTarget repeats are no-ops).
    target_for: StdMutex<Option<String>>,
    /// The guest-time sync ran.
    time_synced: AtomicBool,
}

struct PreparedTarget {
    prepared: Prepared,
    vmi_uid: String,
    /// The VMI as the converter saw it (hot-plugged disks are converted again without it).
    view: Vmi,
}

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

impl MigrationCtl {
    /// Remembers the argv QEMU was started with.
    pub(crate) fn set_boot_argv(&self, argv: Vec<String>) {
        *self.boot_argv.lock().unwrap_or_else(|e| e.into_inner()) = argv;
    }

    fn metadata(&self) -> Option<MigrationMetadata> {
        self.metadata
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The parts of `status.migrationState` the launcher reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VmiMigrationState {
    /// `migrationUid`.
    pub migration_uid: Option<String>,
    /// `sourceState` (decentralized migrations).
    pub source_state: Option<MigrationUidState>,
    /// `targetPod`.
    pub target_pod: Option<String>,
    /// `status.changedBlockTracking.backupStatus.backupName` of the VMI when a backup runs (not
    /// part of `migrationState`; filled by [`decode`]).
    #[serde(skip)]
    pub running_backup: Option<String>,
}

/// `sourceState` / `targetState`: only the migration UID.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct MigrationUidState {
    /// `migrationUID`.
    #[serde(rename = "migrationUID", default)]
    pub migration_uid: Option<String>,
}

impl VmiMigrationState {
    /// The migration UID: `sourceState.migrationUID` when set, else `migrationUid`
    /// (`MigrationUID`, `live-migration-source.go`).
    pub fn uid(&self) -> Option<String> {
        self.source_state
            .as_ref()
            .and_then(|s| s.migration_uid.clone())
            .filter(|u| !u.is_empty())
            .or_else(|| self.migration_uid.clone().filter(|u| !u.is_empty()))
    }
}

/// The VMI and its `status.migrationState` (None when absent) from a request's JSON.
fn decode(vmi_json: &[u8]) -> Result<(Vmi, Option<VmiMigrationState>), SyncError> {
    let invalid = || SyncError::InvalidVmi(crate::sync::rpc::manager::INVALID_VMI_MESSAGE.into());
    let raw: serde_json::Value = serde_json::from_slice(vmi_json).map_err(|_| invalid())?;
    let state = raw
        .pointer("/status/migrationState")
        .filter(|v| !v.is_null())
        .map(|v| serde_json::from_value(v.clone()))
        .transpose()
        .map_err(|_| invalid())?;
    let backup = raw
        .pointer("/status/changedBlockTracking/backupStatus")
        .filter(|v| !v.is_null())
        .map(|b| b["backupName"].as_str().unwrap_or_default().to_owned());
    let state = state.map(|s: VmiMigrationState| VmiMigrationState {
        running_backup: backup,
        ..s
    });
    let vmi: Vmi = serde_json::from_value(raw).map_err(|_| invalid())?;
    Ok((vmi, state))
}

/// Refuses a VMI whose `status.migrationTransport` is not `Unix`. For such (legacy) VMIs
/// KubeVirt's target launcher runs in-pod TCP proxies on 127.0.0.1:49152/49153 and the
/// masquerade rules skip those ports (`legacy_migration_ports`); qlauncher's launchers only
/// speak the Unix transport every VMI created by KubeVirt since the transport exists has.
fn require_unix_transport(vmi: &Vmi) -> Result<(), SyncError> {
    let transport = vmi
        .status
        .as_ref()
        .and_then(|s| s.migration_transport.as_deref())
        .unwrap_or("");
    if transport == "Unix" {
        Ok(())
    } else {
        Err(failed(format!(
            "migration transport {transport:?} is not supported by qlauncher (only \"Unix\")"
        )))
    }
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

fn annotation<'a>(vmi: &'a Vmi, key: &str) -> Option<&'a str> {
    vmi.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn failed(message: String) -> SyncError {
    SyncError::Unsupported(message)
}

/// Replaces this launcher's path roots in `argv` by placeholders, so that two pods whose roots
/// differ (never in a cluster, where both are `/`; in tests on one machine) compare their device
/// models word for word.
fn normalized(argv: &[String], config: &crate::sync::SyncConfig) -> Vec<String> {
    let p = &config.paths;
    let mut roots: Vec<(&str, String)> = [
        ("private", p.private_dir.clone()),
        ("ephemeral", p.ephemeral_disks.clone()),
        ("container-disks", p.container_disks.clone()),
        ("hotplug", p.hotplug_disks.clone()),
        ("empty", p.empty_disks.clone()),
        ("cloud-init", p.cloud_init.clone()),
        ("nvram", p.nvram.clone()),
        ("virtiofs", p.virtiofs.clone()),
    ]
    .into_iter()
    .filter(|(_, r)| !r.is_empty() && r != "/")
    .collect();
    roots.sort_by_key(|(_, r)| std::cmp::Reverse(r.len()));
    argv.iter()
        .map(|w| {
            let mut w = w.clone();
            for (name, root) in &roots {
                w = w.replace(root.as_str(), &format!("${{{name}}}"));
            }
            w
        })
        .collect()
}

impl SyncVmi {
    /// Changes the migration record with `f` and, when a domain exists, puts it in the domain and
    /// notifies MODIFIED (before that KubeVirt drops the change too).
    fn set_metadata(&self, f: impl FnOnce(&mut Option<MigrationMetadata>)) {
        let m = {
            let mut m = self
                .migration
                .metadata
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            f(&mut m);
            m.clone()
        };
        self.shared.update_domain(|d| {
            if d.spec.metadata.kubevirt.migration == m {
                return false;
            }
            d.spec.metadata.kubevirt.migration = m;
            true
        });
    }

    fn migration_proxy_sockets(&self, uid: &str) -> (PathBuf, PathBuf, PathBuf) {
        let dir = &self.config.migration_proxy_dir;
        (
            proxy_socket(dir, uid, 0),
            proxy_socket(dir, uid, DIRECT_MIGRATION_PORT),
            proxy_socket(dir, uid, BLOCK_MIGRATION_PORT),
        )
    }

    /// `MigrateVirtualMachine`.
    pub(crate) async fn migrate(
        self: Arc<Self>,
        vmi_json: Vec<u8>,
        options: Vec<u8>,
    ) -> Result<(), SyncError> {
        let (vmi, state) = decode(&vmi_json)?;
        require_unix_transport(&vmi)?;
        if let Some(name) = state.as_ref().and_then(|s| s.running_backup.as_deref()) {
            return Err(failed(format!(
                "cannot migrate VMI until backup {name} is completed"
            )));
        }
        let uid = state
            .as_ref()
            .and_then(VmiMigrationState::uid)
            .ok_or_else(|| failed("cannot migrate VMI until migrationState is ready".into()))?;
        let options = MigrationOptions::from_json(&options)
            .map_err(|e| failed(format!("invalid migration options: {e}")))?;
        let client = self.client()?;
        let decision = {
            let mut m = self
                .migration
                .metadata
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            MigrationMetadata::start(&mut m, &uid, SystemTime::now())
        };
        match decision {
            StartDecision::AlreadyRunning => return Ok(()),
            StartDecision::AlreadyExecuted => {
                let m = self.migration.metadata().unwrap_or_default();
                return Err(failed(format!(
                    "migration job {uid} already executed, finished at {}, failed: {}, \
                     abortStatus: {}",
                    m.end_timestamp.unwrap_or_default(),
                    m.failed,
                    m.abort_status
                )));
            }
            StartDecision::Start => {}
        }
        self.set_metadata(|_| {});
        info!(migration = %uid, "migration accepted");
        if annotation(&vmi, FORCE_FAILURE_ANNOTATION).is_some() {
            self.set_metadata(|m| {
                if let Some(m) = m {
                    m.finish(
                        Some("Failed migration to satisfy functional test condition"),
                        SystemTime::now(),
                    );
                }
            });
            return Ok(());
        }
        let (abort_tx, abort_rx) = watch::channel(false);
        *self
            .migration
            .abort
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(abort_tx);
        let vmi_uid = vmi.metadata.uid.clone().unwrap_or_default();
        tokio::spawn(async move {
            let result = self
                .run_outgoing(&client, &vmi_uid, &uid, options, abort_rx)
                .await;
            self.outgoing_ended(&client, result).await;
        });
        Ok(())
    }

    async fn run_outgoing(
        &self,
        client: &QmpClient,
        vmi_uid: &str,
        migration_uid: &str,
        options: MigrationOptions,
        abort_rx: watch::Receiver<bool>,
    ) -> Result<(), MigrationError> {
        let (control, stream, nbd) = self.migration_proxy_sockets(vmi_uid);
        let machine = resolved_machine(client).await?;
        let copied_disks = self.copied_disks(client).await?;
        let status = *self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
        let argv = self
            .migration
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
        let hotplugged = match self.running.lock().await.as_ref() {
            Some(r) => hotplug::hotplugged_disks(&r.disks, &argv),
            None => Vec::new(),
        };
        let domain = RunningDomain {
            vmi_uid: vmi_uid.to_owned(),
            migration_uid: migration_uid.to_owned(),
            machine,
            argv: normalized(&argv, &self.config),
            hotplugged,
            copied_disks,
            capabilities: Vec::new(),
            multifd_channels: None,
            paused: status.state == DomainState::Paused && status.reason == StateReason::User,
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
        self.shared.migrating.store(true, Ordering::SeqCst);
        // Post-copy started or the guest paused to converge: the record's mode changes at once,
        // as virt-handler reads it (KubeVirt's live-migration-source.go updates it the same way).
        let mut on_event = |e: crate::sync::migration::source::SourceEvent| {
            self.set_metadata(|m| {
                if let Some(m) = m {
                    m.mode = e.mode().into();
                }
            })
        };
        let end = run_source_with(conn, client, domain, &plan, abort_rx, &mut on_event).await;
        self.shared.migrating.store(false, Ordering::SeqCst);
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
                self.shared.migrated.store(true, Ordering::SeqCst);
                let _ = client.run(&Quit).await;
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                while tokio::time::Instant::now() < deadline {
                    let s = *self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
                    if s.state == DomainState::Shutoff {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                self.set_metadata(|m| {
                    if let Some(m) = m {
                        m.finish(None, SystemTime::now());
                    }
                });
            }
            Err(e) => {
                let reason = e.failure_reason();
                warn!(reason = %reason, "migration failed");
                let aborted = matches!(e, MigrationError::Aborted);
                self.set_metadata(|m| {
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
                self.set_metadata(|m| {
                    if let Some(m) = m {
                        m.finish(Some(&reason), SystemTime::now());
                    }
                });
            }
        }
        *self
            .migration
            .abort
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The local disks to mirror (KubeVirt `getDiskTargetsForMigration`): every writable disk
    /// whose image lives in the pod's own storage (containerDisk and ephemeral overlays, empty
    /// disks, cloud-init and config ISOs), by format node, with export `drive-<alias>`.
    async fn copied_disks(&self, client: &QmpClient) -> Result<Vec<CopiedDisk>, MigrationError> {
        let p = &self.config.paths;
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
    pub(crate) async fn cancel(self: Arc<Self>, vmi_json: Vec<u8>) -> Result<(), SyncError> {
        decode(&vmi_json)?;
        let Some(m) = self.migration.metadata() else {
            return Ok(());
        };
        if !m.cancel_applies() {
            return Ok(());
        }
        self.set_metadata(|m| {
            if let Some(m) = m {
                m.abort_status = abort::ABORTING.into();
            }
        });
        let sender = self
            .migration
            .abort
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(sender) = sender else {
            // No migration job runs: the abort fails (KubeVirt: no active job).
            self.set_metadata(|m| {
                if let Some(m) = m {
                    m.abort_status = abort::FAILED.into();
                }
            });
            return Ok(());
        };
        sender.send_replace(true);
        if let Ok(client) = self.client() {
            let _ = client.run(&MigrateCancel).await;
        }
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ABORT_TIMEOUT).await;
            me.set_metadata(|m| {
                if let Some(m) = m {
                    if m.abort_status == abort::ABORTING {
                        m.abort_status = abort::FAILED.into();
                    }
                }
            });
        });
        Ok(())
    }

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
        let boot = self.boot_conversion(&target, &session.domain);
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
        let PreparedTarget { mut prepared, .. } = target;
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
        let (_, stream, nbd) = self.migration_proxy_sockets(&session.domain.vmi_uid);
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

impl SyncVmi {
    /// `MigrateDomainJobInfo` for GetDomainStats while an outgoing migration runs (`None`
    /// otherwise).
    pub(crate) async fn migration_job_info(&self) -> Option<serde_json::Value> {
        let active = self
            .migration
            .abort
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if !active {
            return None;
        }
        let client = self.client().ok()?;
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
    use std::path::Path;

    #[test]
    fn the_migration_uid_prefers_the_source_state() {
        let (_, s) = decode(
            br#"{"metadata":{"name":"v","uid":"u"},"spec":{"domain":{"devices":{}}},
                "status":{"migrationState":{"migrationUid":"m1","targetPod":"p",
                "sourceState":{"migrationUID":"m2"}}}}"#,
        )
        .unwrap();
        let s = s.unwrap();
        assert_eq!(s.uid().as_deref(), Some("m2"));
        assert_eq!(s.target_pod.as_deref(), Some("p"));
        let (_, none) =
            decode(br#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{}}}}"#).unwrap();
        assert!(none.is_none());
        assert!(decode(b"nope").is_err());
        let (_, b) = decode(
            br#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{}}},
                "status":{"migrationState":{"migrationUid":"m"},
                "changedBlockTracking":{"backupStatus":{"backupName":"nightly"}}}}"#,
        )
        .unwrap();
        assert_eq!(b.unwrap().running_backup.as_deref(), Some("nightly"));
    }

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
    fn only_the_unix_transport_migrates() {
        let with = |t: serde_json::Value| {
            let (vmi, _) = decode(
                &serde_json::to_vec(&serde_json::json!({
                    "metadata": {"name": "v"}, "spec": {"domain": {"devices": {}}},
                    "status": {"migrationTransport": t}
                }))
                .unwrap(),
            )
            .unwrap();
            require_unix_transport(&vmi)
        };
        assert!(with("Unix".into()).is_ok());
        let e = with(serde_json::Value::Null).unwrap_err().to_string();
        assert!(e.contains("not supported"), "{e}");
        assert!(with("Proxy".into()).is_err());
    }

    #[test]
    fn roots_are_normalized_longest_first() {
        let mut c = crate::sync::SyncConfig::under_root(Path::new("/tmp/podA"));
        c.paths.container_disks = "/tmp/podA/var/run/kubevirt/container-disks".into();
        let argv = vec![
            "{\"filename\":\"/tmp/podA/var/run/kubevirt/container-disks/disk_0.img\"}".to_owned(),
            "unix:/tmp/podA/var/run/kubevirt-private/qlauncher/monitor.sock".to_owned(),
        ];
        assert_eq!(
            normalized(&argv, &c),
            vec![
                "{\"filename\":\"${container-disks}/disk_0.img\"}".to_owned(),
                "unix:${private}/qlauncher/monitor.sock".to_owned(),
            ]
        );
    }
}
