//! The per-VMI launcher program: `qlauncher launcher` and the `qlauncher` binary run as
//! `virt-launcher` (the image's `/usr/bin/virt-launcher` is a link to it) run [`main`].
//!
//! Parses virt-launcher's flags, sets up logging, creates the directories, reads `STANDALONE_VMI`,
//! and runs the lifecycle of [`crate::monitor::launcher::run`]. The domain is a
//! [`SyncVmi`] behind the command server on `<share-dir>/sockets/launcher-sock`; the standalone
//! VMI, when given, is synced at once. A launcher that gets no VMI fails after `--qemu-timeout`, as
//! KubeVirt's does when no domain is defined.
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use crate::sync::config::SyncConfig;
use crate::sync::rpc::manager::DomainManager;
use crate::sync::rpc::notify::{notify_socket_in_share_dir, Notifier, NotifyTiming};
use crate::sync::rpc::server::{CmdServer, CmdSocketPaths};
use crate::sync::vmi_sync::SyncVmi;
use crate::vmi::Vmi;
use std::sync::Arc;

use crate::monitor::kvm_probe;
use crate::monitor::launcher::{self, LauncherConfig};
use crate::monitor::MonitorError;
use tokio::sync::watch;
use tracing::{error, info, warn};

/// Root under which the paths without a launcher flag live (set by `qlauncher run`).
pub const ROOT_ENV: &str = "QLAUNCHER_ROOT";
/// `on` forces TCG, `off` requires a KVM that passes the probe, `auto` (or unset) lets
/// `--allow-emulation` fall back to TCG (set by `qlauncher run --emulation`).
pub const EMULATION_ENV: &str = "QLAUNCHER_EMULATION";
/// Path of a second QMP monitor socket for operators' tools (set by `qlauncher run`).
pub const OPERATOR_QMP_ENV: &str = "QLAUNCHER_OPERATOR_QMP";

/// How long the hook sidecars' Shutdown calls may take together once QEMU is gone (KubeVirt
/// gives each a minute; the pod's grace period is mostly spent by then, so qlauncher bounds
/// them all by the final notification's wait).
const HOOK_SHUTDOWN_WITHIN: Duration = Duration::from_secs(10);

/// Runs the launcher with virt-launcher's flags (`args`, without the program name); exit code 0
/// on a clean end, 1 on failure, 2 on a bad command line.
pub fn main(args: Vec<String>) -> ExitCode {
    launcher::main(&args, run)
}

async fn run(config: LauncherConfig, stop: watch::Receiver<bool>) -> Result<(), MonitorError> {
    let standalone = launcher::standalone_vmi(std::env::var("STANDALONE_VMI").ok().as_deref())?;
    // KubeVirt collects the hook sidecars before the command server starts, within
    // `--qemu-timeout`; one that fails stops the launcher, naming its socket.
    let hook_dir = pod_root().join(crate::hooks::HOOK_DIR.trim_start_matches('/'));
    let expected = config.hook_sidecars as usize;
    let hooks = crate::hooks::collect(&hook_dir, expected, config.qemu_timeout)
        .await
        .map_err(|e| failed("collecting the hook sidecars", &e))?;
    run_sync(&config, standalone, hooks, stop).await
}

/// The launcher proper: the command server on `launcher-sock` over a [`SyncVmi`], the standalone
/// VMI synced at start, the lifecycle of [`launcher::run`], and the final notification.
async fn run_sync(
    config: &LauncherConfig,
    standalone: Option<serde_json::Value>,
    hooks: crate::hooks::Sidecars,
    stop: watch::Receiver<bool>,
) -> Result<(), MonitorError> {
    let mut sync_config = sync_config(config);
    sync_config.hooks = hooks.clone();
    // virt-handler creates the notify pipe only after its first call on `launcher-sock`, so the
    // notifier is always started: it dials when it sends and keeps the latest domain state until
    // the pipe appears (KubeVirt's notify-client).
    let notify_socket = notify_socket_in_share_dir(&config.kubevirt_share_dir);
    let notifier = Notifier::start(notify_socket, NotifyTiming::KUBEVIRT);
    let manager = Arc::new(SyncVmi::new(sync_config, Some(notifier.clone())));
    // The standalone VMI (`qlauncher run`) is synced first and the command server started while
    // the sync waits on QEMU: the server's start (code read in from a cold binary) then overlaps
    // QEMU's own start-up instead of preceding it. In the pod no VMI is given here and the server
    // starts at once, as before.
    let (sync_err_tx, mut sync_err_rx) = tokio::sync::mpsc::channel::<String>(1);
    if let Some(value) = standalone {
        let vmi: Vmi = serde_json::from_value(value).map_err(|e| MonitorError::LauncherFailed {
            reason: format!("STANDALONE_VMI is not a VMI: {e}"),
        })?;
        let m = manager.clone();
        tokio::spawn(async move {
            if let Err(e) = m.sync_vmi(vmi, None).await {
                let _ = sync_err_tx.send(error_chain(&e)).await;
            }
        });
        // The runtime has one thread: let the sync run up to its first wait.
        tokio::task::yield_now().await;
    }
    let (server_stop_tx, server_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = CmdServer::start(
        manager.clone(),
        CmdSocketPaths::in_share_dir(&config.kubevirt_share_dir),
        async move {
            let _ = server_stop_rx.await;
        },
    )
    .await
    .map_err(|e| failed("starting the command server", &e))?;
    server
        .mark_ready()
        .map_err(|e| failed("marking the command server ready", &e))?;
    let result = tokio::select! {
        r = launcher::run(config, &*manager, stop) => r.map(drop),
        Some(reason) = sync_err_rx.recv() => Err(MonitorError::LauncherFailed {
            reason: format!("standalone VMI sync failed: {reason}"),
        }),
    };
    // QEMU is gone: the v1alpha3 sidecars' Shutdown (KubeVirt's main after RunForever), only
    // when a domain ran here; errors are logged, never fatal.
    if manager.qemu_pid().is_some() {
        for e in hooks.shutdown(HOOK_SHUTDOWN_WITHIN).await {
            warn!(error = %error_chain(&e), "hook sidecar Shutdown failed");
        }
    }
    // KubeVirt's order: Shutoff is notified (the event task), the command server keeps serving
    // until virt-handler's DeleteVirtualMachine or 15 s, then the final delete notification.
    // Without virt-handler's pipe (`qlauncher run`) nobody calls or awaits either.
    // A migration target whose incoming migration failed: libvirt removes the transient domain
    // at once, so the final notification goes out now, and the command server serves on until
    // virt-handler's SignalTargetPodCleanup or DeleteVirtualMachine (15 s at most), which its
    // migration-target controller sends once it sees the domain gone.
    if !notifier.socket_present() {
        manager.final_notify(Duration::ZERO).await;
    } else if manager
        .migration
        .incoming_failed(Duration::from_secs(5))
        .await
    {
        manager.final_notify(Duration::from_secs(10)).await;
        if !manager.wait_deleted(Duration::from_secs(15)).await {
            info!("no SignalTargetPodCleanup or DeleteVirtualMachine within 15 s after the failed incoming migration");
        }
    } else {
        if !manager.wait_deleted(Duration::from_secs(15)).await {
            info!("no DeleteVirtualMachine within 15 s, sending the final notification");
        }
        manager.final_notify(Duration::from_secs(10)).await;
    }
    let _ = server_stop_tx.send(());
    let _ = server.wait().await;
    result
}

use crate::sys::error::error_chain;

fn failed(step: &str, e: &dyn std::error::Error) -> MonitorError {
    MonitorError::LauncherFailed {
        reason: format!("{step}: {}", error_chain(e)),
    }
}

/// The root KubeVirt's paths without a launcher flag are under: `QLAUNCHER_ROOT`, else `/`.
fn pod_root() -> PathBuf {
    std::env::var_os(ROOT_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// The SyncVMI configuration from the launcher's flags. `QLAUNCHER_ROOT` (set by `qlauncher run`)
/// moves the paths that have no flag (empty disks, `/dev`, NVRAM); `QLAUNCHER_EMULATION` and
/// `--allow-emulation` pick the accelerator ([`choose_accel`]); `QLAUNCHER_OPERATOR_QMP` adds
/// QEMU's operator QMP monitor. QEMU's version record
/// ([`crate::sync::qemu_version::QEMU_VERSION_RECORD`]) is looked up under the root, then under `/`.
fn sync_config(config: &LauncherConfig) -> SyncConfig {
    let root = pod_root();
    let mut c = SyncConfig::under_root(&root);
    let s = |p: &std::path::Path| p.display().to_string();
    c.paths.private_dir = s(&config.private_dir);
    c.paths.ephemeral_disks = s(&config.ephemeral_disk_dir);
    c.paths.cloud_init = s(&config.ephemeral_disk_dir.join("cloud-init-data"));
    c.paths.container_disks = s(&config.container_disk_dir);
    c.paths.hotplug_disks = s(&config.hotplug_disk_dir);
    let qlauncher_dir = config.private_dir.join("qlauncher");
    c.qmp_socket = qlauncher_dir.join("monitor.sock");
    c.qemu_log = qlauncher_dir.join("qemu.log");
    c.operator_qmp_socket = std::env::var_os(OPERATOR_QMP_ENV).map(PathBuf::from);
    c.ovmf_dir = config.ovmf_path.clone();
    c.migration_proxy_dir = config.kubevirt_share_dir.join("migrationproxy");
    c.backup_nbd_socket = config
        .kubevirt_share_dir
        .join("sockets")
        .join("backup-nbd-sock");
    let emulation = std::env::var(EMULATION_ENV).unwrap_or_default();
    let (kvm, allow_emulation) = choose_accel(config, &emulation, &c.qemu);
    c.kvm = kvm;
    c.allow_emulation = allow_emulation;
    // `--run-as-nonroot`: QEMU runs as the qemu user (107) even when the launcher is root.
    if config.run_as_nonroot {
        c.runtime_uid = launcher::QEMU_UID;
    }
    c.vm_stats_collector = config.vm_stats_collector;
    if config.image_volume {
        c.image_volume = Some(crate::storage::image_volume::ImageVolumeDirs::under_root(
            &root,
        ));
    }
    c.agent_poll = crate::sync::config::PollIntervals {
        version: config.agent_version_interval,
        filesystems: config.agent_file_interval,
        fsfreeze: config.fsfreeze_status_interval,
        sys: config.agent_sys_interval,
        users: config.agent_user_interval,
    };
    // QEMU's version: from the image's version record `usr/share/qlauncher/qemu-version.json`
    // when it matches the binary (no process); else `qemu --version` runs once,
    // in the background: the converter and GetQemuVersion (before a domain exists) wait for its
    // answer, the command server does not.
    // Under `QLAUNCHER_ROOT` first (a test's pod), then the system's (the image's, also for
    // `qlauncher run` chrooted in the image's tree); a probe writes it under the root.
    let record = [
        root.join(crate::sync::qemu_version::QEMU_VERSION_RECORD),
        Path::new("/").join(crate::sync::qemu_version::QEMU_VERSION_RECORD),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| root.join(crate::sync::qemu_version::QEMU_VERSION_RECORD));
    let probe = crate::sync::qemu_version::QemuProbe::with_record(c.qemu.clone(), record);
    let early = probe.clone();
    tokio::spawn(async move {
        early.answer().await;
    });
    c.qemu_probe = Some(probe);
    c
}

/// `(kvm, allow_emulation)` for the converter.
///
/// `QLAUNCHER_EMULATION=on` (`qlauncher run --emulation on`) forces TCG. Without `/dev/kvm` it is
/// TCG when emulation is allowed, else the converter's "no KVM" error. With `/dev/kvm`, when
/// `--allow-emulation` is given (`qlauncher run --emulation auto`) the KVM probe
/// ([`kvm_probe::probe_cached`]) decides: KVM only when it runs the probe guest in time, else TCG,
/// with the reason at info level. `QLAUNCHER_EMULATION=off` (`--emulation off`) probes too and, when
/// KVM fails, logs the reason as an error and leaves neither accelerator, so the domain fails to
/// convert ("KVM is not available"). Without `--allow-emulation` and without
/// `QLAUNCHER_EMULATION` (KubeVirt's case), `/dev/kvm` is used unprobed, as virt-launcher does.
fn choose_accel(config: &LauncherConfig, emulation: &str, qemu: &Path) -> (bool, bool) {
    if emulation == "on" {
        info!("emulation forced on: using TCG");
        return (false, true);
    }
    if !Path::new("/dev/kvm").exists() {
        return (false, config.allow_emulation);
    }
    let must_kvm = emulation == "off";
    if !config.allow_emulation && !must_kvm {
        return (true, false);
    }
    let scratch = config.private_dir.clone();
    match kvm_probe::probe_cached(|| kvm_probe::ProbeOptions::kvm(qemu, scratch)) {
        Ok(report) => {
            info!(
                probe_ms = report.elapsed.as_millis() as u64,
                guest_ms = report.guest_time().as_millis() as u64,
                "KVM runs the probe guest: using KVM"
            );
            (true, config.allow_emulation)
        }
        Err(reason) if must_kvm => {
            error!(
                reason = %reason,
                "KVM does not run guests here and emulation is off: the domain cannot start"
            );
            (false, false)
        }
        Err(reason) => {
            info!(reason = %reason, "KVM does not run guests here: using TCG");
            (false, true)
        }
    }
}
