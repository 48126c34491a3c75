//! The five migration RPCs of the launcher over the engine ([`super::source`],
//! [`super::target`], [`super::protocol`]), as KubeVirt v1.9.0's launcher answers them
//! (`pkg/virt-launcher/virtwrap/manager.go`, `live-migration-source.go`,
//! `live-migration-target.go`, `cmd-server/server.go`):
//!
//! - `MigrateVirtualMachine` (source, [`super::outgoing`]): records `{UID, StartTimestamp, Mode:
//!   PreCopy}` and returns; a task connects to the target through the proxy's role-0 socket and
//!   runs the migration; on success QEMU is stopped (Shutoff/Migrated) and `EndTimestamp` set, on
//!   failure the source runs on and the record says `Failed` with the reason. One shot per
//!   migration UID; a repeat while it runs is a no-op.
//! - `SyncMigrationTarget` (target, [`super::incoming`]): storage, network and conversion as a
//!   first sync does, the record, the proxy directory, and a listener on the role-0 socket; QEMU
//!   starts only when the source's definition arrives. Re-runnable.
//! - `CancelVirtualMachineMigration` ([`super::outgoing`]): `AbortStatus` Aborting, then
//!   Succeeded once QEMU's job is cancelled (Failed when there was none to cancel).
//! - `SignalTargetPodCleanup` ([`super::incoming`]): when `POD_NAME` is the migration's target
//!   pod and no domain ever started here, the launcher exits (KubeVirt's early-exit signal).
//! - `FinalizeVirtualMachineMigration` ([`super::incoming`]): link refresh of the interfaces
//!   whose binding asks for it, and the guest-time sync (once per process).
//!
//! Every RPC returns within a few seconds; the long work runs in tasks. This file holds what both
//! sides share: the state beside the running domain ([`MigrationCtl`]), the request's decoding
//! and the migration record.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::sync::Mutex as StdMutex;

use serde::Deserialize;
use tokio::sync::watch;

use crate::sync::ctx::DomainCtx;
use crate::sync::domain::MigrationMetadata;
use crate::sync::error::SyncError;
use crate::sync::migration::{proxy_socket, BLOCK_MIGRATION_PORT, DIRECT_MIGRATION_PORT};
use crate::sync::start::Prepared;
use crate::sync::state::{Running, Shared};
use crate::vmi::Vmi;

/// The annotation that makes KubeVirt's source launcher fail a migration at once.
pub const FORCE_FAILURE_ANNOTATION: &str = "kubevirt.io/func-test-force-launcher-migration-failure";
/// The annotation that makes KubeVirt's target launcher refuse preparation.
pub const BLOCK_TARGET_ANNOTATION: &str =
    "kubevirt.io/func-test-block-migration-target-preparation";

/// What the five migration RPCs ([`super::outgoing`], [`super::incoming`]) take: the domain
/// context, the running domain behind its sync lock, this launcher's migration state and the
/// deletion signal. The dispatcher (`SyncVmi`) lends its own parts, each a shared handle and
/// cheap to clone, so that the tasks a migration spawns (the outgoing migration, the target's
/// listener, the abort deadline) own what they use; no migration code extends the dispatcher
/// (Cloud Hypervisor's managers beside its `Vmm` are shaped alike).
#[derive(Clone)]
pub(crate) struct MigrationCtx {
    /// Settings, shared state and domain information, as every feature takes them.
    pub(crate) ctx: Arc<DomainCtx>,
    /// The running domain (`None` before it starts here); its lock is the sync lock.
    pub(crate) running: Arc<tokio::sync::Mutex<Option<Running>>>,
    /// Where this launcher's migrations stand.
    pub(crate) ctl: Arc<MigrationCtl>,
    /// Set when the launcher may send its final notification and exit (DeleteVirtualMachine,
    /// or SignalTargetPodCleanup after a failed incoming migration).
    pub(crate) deleted: watch::Sender<bool>,
}

/// Migration state of one launcher, beside the running domain.
#[derive(Default)]
pub(crate) struct MigrationCtl {
    /// QEMU's argv as this launcher started it (`-S` included), for the definition sent.
    pub(super) boot_argv: StdMutex<Vec<String>>,
    /// The migration record; also in the domain once one exists.
    pub(super) metadata: StdMutex<Option<MigrationMetadata>>,
    /// Turns true to cancel the outgoing migration.
    pub(super) abort: StdMutex<Option<watch::Sender<bool>>>,
    /// The prepared target waiting for the source (taken when QEMU starts).
    pub(super) target: tokio::sync::Mutex<Option<PreparedTarget>>,
    /// The VMI UID a target was prepared for (SyncMigrationTarget repeats are no-ops).
    pub(super) target_for: StdMutex<Option<String>>,
    /// The guest-time sync ran.
    pub(super) time_synced: AtomicBool,
    /// Where this launcher's incoming migration stands ([`Incoming`] as a number).
    pub(super) incoming: AtomicU8,
}

/// The incoming migration of a target launcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Incoming {
    /// Not a migration target (or not prepared yet).
    None = 0,
    /// Prepared, the incoming migration not ended yet.
    Pending = 1,
    /// It completed: the domain is this pod's.
    Completed = 2,
    /// It failed once QEMU ran (an abort, a failed stream): the domain never became this pod's.
    Failed = 3,
}

impl MigrationCtl {
    /// Where this launcher's incoming migration stands.
    pub(crate) fn incoming(&self) -> Incoming {
        match self.incoming.load(Ordering::SeqCst) {
            1 => Incoming::Pending,
            2 => Incoming::Completed,
            3 => Incoming::Failed,
            _ => Incoming::None,
        }
    }

    pub(super) fn set_incoming(&self, state: Incoming) {
        self.incoming.store(state as u8, Ordering::SeqCst);
    }

    /// True when this launcher was a migration target and its incoming migration failed after
    /// QEMU started. libvirt removes such a transient domain at once (`qemuMigrationDstFinish`),
    /// so the launcher's final notification need not wait for DeleteVirtualMachine
    /// ([`crate::sync::launcher`]). Waits up to `settle` while the outcome is still pending
    /// (QEMU's exit can be seen before the incoming migration's task records its failure).
    pub(crate) async fn incoming_failed(&self, settle: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + settle;
        while self.incoming() == Incoming::Pending && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        self.incoming() == Incoming::Failed
    }
}

pub(super) struct PreparedTarget {
    pub(super) prepared: Prepared,
    pub(super) vmi_uid: String,
    /// The UID the proxy's stream and NBD sockets are named after
    /// ([`VmiMigrationState::proxy_key`]).
    pub(super) proxy_key: String,
    /// The VMI as the converter saw it (hot-plugged disks are converted again without it).
    pub(super) view: Vmi,
    /// The guest memory in bytes when it grew since boot (virtio-mem on the source): the target
    /// boots with the memory at boot and plugs the rest before `migrate-incoming`
    /// ([`boot_memory_view`]).
    pub(super) memory_total: Option<u64>,
}

/// Turns `vmi` into the VMI its source booted with as far as memory goes: with memory hotplug
/// (`maxGuest`) and `status.memory.guestAtBoot` below `spec.domain.memory.guest`, the source
/// runs its boot memory plus a virtio-mem device of the difference (KubeVirt's
/// `BuildMemoryDevice`, `pkg/liveupdate/memory`; libvirt migrates that device in the domain
/// XML), so the target's QEMU must start with the boot memory (`-m guestAtBoot`) and plug the
/// same virtio-mem device, not boot with the new total. Sets `memory.guest` to `guestAtBoot`
/// and returns the total guest memory in bytes (KiB-rounded as the converter does); `None`
/// (and `vmi` unchanged) when memory did not grow.
pub(super) fn boot_memory_view(vmi: &mut Vmi) -> Option<u64> {
    let memory = vmi.spec.domain.memory.as_ref()?;
    memory.max_guest.as_ref()?;
    let guest = memory.guest.as_ref()?.to_bytes().ok()?.div_ceil(1024) * 1024;
    let at_boot = vmi
        .status
        .as_ref()?
        .memory
        .as_ref()?
        .guest_at_boot
        .clone()?;
    let boot = at_boot.to_bytes().ok()?.div_ceil(1024) * 1024;
    if boot >= guest {
        return None;
    }
    vmi.spec.domain.memory.as_mut()?.guest = Some(at_boot);
    Some(guest)
}

impl MigrationCtl {
    /// Remembers the argv QEMU was started with.
    pub(crate) fn set_boot_argv(&self, argv: Vec<String>) {
        *self.boot_argv.lock().unwrap_or_else(|e| e.into_inner()) = argv;
    }

    pub(super) fn metadata(&self) -> Option<MigrationMetadata> {
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
    /// `targetState` (decentralized migrations).
    pub target_state: Option<MigrationUidState>,
    /// `targetPod`.
    pub target_pod: Option<String>,
    /// `status.changedBlockTracking.backupStatus.backupName` of the VMI when a backup runs (not
    /// part of `migrationState`; filled by [`decode`]).
    #[serde(skip)]
    pub running_backup: Option<String>,
}

/// `sourceState` / `targetState`: the migration UID and, in a decentralized (cross-cluster)
/// migration, the UID of that side's VMI.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct MigrationUidState {
    /// `migrationUID`.
    #[serde(rename = "migrationUID", default)]
    pub migration_uid: Option<String>,
    /// `virtualMachineInstanceUID`: the VMI of that side, set in decentralized migrations.
    #[serde(rename = "virtualMachineInstanceUID", default)]
    pub virtual_machine_instance_uid: Option<String>,
    /// `domainName`: the name of that side's VMI (decentralized migrations).
    #[serde(rename = "domainName", default)]
    pub domain_name: Option<String>,
    /// `domainNamespace`: the namespace of that side's VMI (decentralized migrations).
    #[serde(rename = "domainNamespace", default)]
    pub domain_namespace: Option<String>,
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

    /// `targetState.virtualMachineInstanceUID` (decentralized migrations): the UID the source
    /// puts in place of its own in the definition it sends (`generateMigrationParams`).
    pub fn target_vmi_uid(&self) -> Option<&str> {
        self.target_state
            .as_ref()
            .and_then(|s| s.virtual_machine_instance_uid.as_deref())
            .filter(|u| !u.is_empty())
    }

    /// The target VMI's identity, `targetState.domainNamespace` and `targetState.domainName`,
    /// when both are set and non-empty (KubeVirt's `generateDomainName` names the target domain
    /// after them only then): the source sends its definition under that name
    /// ([`crate::sync::migration::protocol::RunningDomain::for_target_domain`]).
    pub fn target_domain(&self) -> Option<crate::sync::migration::protocol::DomainIdentity> {
        let t = self.target_state.as_ref()?;
        let name = t.domain_name.as_deref().filter(|n| !n.is_empty())?;
        let namespace = t.domain_namespace.as_deref().filter(|n| !n.is_empty())?;
        Some(crate::sync::migration::protocol::DomainIdentity {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }

    /// The UID naming the migration proxy's stream and NBD sockets in the target pod
    /// (virt-handler's `migrationProxyKey`, `migration-target.go`): the source VMI's UID
    /// (`sourceState.virtualMachineInstanceUID`) when set, since the source names the sockets
    /// after its own VMI; else the VMI's own `uid` (a migration within one cluster).
    pub fn proxy_key(&self, own_uid: &str) -> String {
        self.source_state
            .as_ref()
            .and_then(|s| s.virtual_machine_instance_uid.as_deref())
            .filter(|u| !u.is_empty())
            .unwrap_or(own_uid)
            .to_owned()
    }
}

/// The VMI and its `status.migrationState` (None when absent) from a request's JSON (the
/// migration RPCs' `vmiJson`, untrusted: fuzzed by `fuzz/fuzz_targets/cmd_request.rs`).
///
/// # Errors
/// [`SyncError::UndecodableVmi`] when the JSON or its migration state does not decode.
pub fn decode(vmi_json: &[u8]) -> Result<(Vmi, Option<VmiMigrationState>), SyncError> {
    let invalid = || SyncError::UndecodableVmi;
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
///
/// # Errors
/// [`SyncError::Unsupported`] naming the transport.
pub fn require_unix_transport(vmi: &Vmi) -> Result<(), SyncError> {
    let transport = vmi
        .status
        .as_ref()
        .and_then(|s| s.migration_transport.as_deref())
        .unwrap_or("");
    if transport == "Unix" {
        Ok(())
    } else {
        Err(refused(format!(
            "migration transport {transport:?} is not supported by qlauncher (only \"Unix\")"
        )))
    }
}

pub(super) fn annotation<'a>(vmi: &'a Vmi, key: &str) -> Option<&'a str> {
    vmi.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// A migration request refused with `message` ([`SyncError::MigrationRefused`]).
pub(super) fn refused(message: String) -> SyncError {
    SyncError::MigrationRefused(message)
}

/// Replaces this launcher's path roots in `argv` by placeholders, so that two pods whose roots
/// differ (never in a cluster, where both are `/`; in tests on one machine) compare their device
/// models word for word.
pub(super) fn normalized(argv: &[String], config: &crate::sync::config::SyncConfig) -> Vec<String> {
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

impl MigrationCtl {
    /// Changes the migration record with `f` and, when a domain exists, puts it in the domain
    /// (`shared`) and notifies MODIFIED (before that KubeVirt drops the change too).
    pub(super) fn set_metadata(
        &self,
        shared: &Shared,
        f: impl FnOnce(&mut Option<MigrationMetadata>),
    ) {
        let m = {
            let mut m = self.metadata.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut m);
            m.clone()
        };
        shared.update_domain(|d| {
            if d.spec.metadata.kubevirt.migration == m {
                return false;
            }
            d.spec.metadata.kubevirt.migration = m;
            true
        });
    }
}

/// The migration proxy's sockets of the migration `uid` under `config`'s proxy directory: the
/// control (role 0), the direct migration stream and the block migration (NBD) sockets.
pub(super) fn migration_proxy_sockets(
    config: &crate::sync::config::SyncConfig,
    uid: &str,
) -> (PathBuf, PathBuf, PathBuf) {
    let dir = &config.migration_proxy_dir;
    (
        proxy_socket(dir, uid, 0),
        proxy_socket(dir, uid, DIRECT_MIGRATION_PORT),
        proxy_socket(dir, uid, BLOCK_MIGRATION_PORT),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_boots_with_the_memory_at_boot_after_a_memory_plug() {
        let vmi = |guest: &str, at_boot: &str| {
            Vmi::from_json_or_yaml(&format!(
                r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance",
                "metadata":{{"name":"m","namespace":"ns"}},
                "spec":{{"domain":{{"memory":{{"guest":"{guest}","maxGuest":"4Gi"}},"devices":{{}}}}}},
                "status":{{"memory":{{"guestAtBoot":"{at_boot}"}}}}}}"#
            ))
            .unwrap()
        };
        let mut grown = vmi("2Gi", "1Gi");
        assert_eq!(boot_memory_view(&mut grown), Some(2 << 30));
        let m = grown.spec.domain.memory.as_ref().unwrap();
        assert_eq!(m.guest.as_ref().map(|q| q.as_str()), Some("1Gi"));
        let mut same = vmi("1Gi", "1Gi");
        assert_eq!(boot_memory_view(&mut same), None);
        assert_eq!(same, vmi("1Gi", "1Gi"));
    }
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
    fn decentralized_migrations_name_both_vmis() {
        let (_, s) = decode(
            br#"{"metadata":{"name":"v","uid":"target-vmi"},"spec":{"domain":{"devices":{}}},
                "status":{"migrationState":{"migrationUid":"m",
                "sourceState":{"migrationUID":"ms","virtualMachineInstanceUID":"source-vmi"},
                "targetState":{"migrationUID":"mt","virtualMachineInstanceUID":"target-vmi"}}}}"#,
        )
        .unwrap();
        let s = s.unwrap();
        assert_eq!(s.target_vmi_uid(), Some("target-vmi"));
        assert_eq!(s.proxy_key("target-vmi"), "source-vmi");
        // No domain name and namespace in the target state: the source keeps its own.
        assert_eq!(s.target_domain(), None);
        let (_, s) = decode(
            br#"{"metadata":{"name":"v","uid":"u"},"spec":{"domain":{"devices":{}}},
                "status":{"migrationState":{"migrationUid":"m",
                "targetState":{"domainName":"w","domainNamespace":"other"}}}}"#,
        )
        .unwrap();
        let t = s.unwrap().target_domain().unwrap();
        assert_eq!((t.namespace.as_str(), t.name.as_str()), ("other", "w"));
        // Only the name (KubeVirt needs both): none.
        let (_, s) = decode(
            br#"{"metadata":{"name":"v","uid":"u"},"spec":{"domain":{"devices":{}}},
                "status":{"migrationState":{"migrationUid":"m",
                "targetState":{"domainName":"w","domainNamespace":""}}}}"#,
        )
        .unwrap();
        assert_eq!(s.unwrap().target_domain(), None);
        // Within one cluster: no VMI UIDs in the states, the VMI's own UID names the sockets.
        let plain = VmiMigrationState::default();
        assert_eq!(plain.target_vmi_uid(), None);
        assert_eq!(plain.proxy_key("own"), "own");
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
        let mut c = crate::sync::config::SyncConfig::under_root(Path::new("/tmp/podA"));
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
