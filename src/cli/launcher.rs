//! `qlauncher launcher` / `virt-launcher`: the per-VMI launcher process.
//!
//! Parses virt-launcher's flags, sets up logging, creates the directories, reads `STANDALONE_VMI`,
//! and runs the lifecycle of [`qlauncher::monitor::launcher::run`]. The domain is a
//! [`SyncVmi`] behind the command server on `<share-dir>/sockets/launcher-sock`; the standalone
//! VMI, when given, is synced at once. A launcher that gets no VMI fails after `--qemu-timeout`, as
//! KubeVirt's does when no domain is defined. For the process-level tests a [`StaticQemu`] domain
//! starts a fixed QEMU command line taken from `QLAUNCHER_TEST_QEMU`.
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use qlauncher::sync::notify::{notify_socket_in_share_dir, Notifier, NotifyTiming};
use qlauncher::sync::server::{CmdServer, CmdSocketPaths, DomainManager};
use qlauncher::sync::{SyncConfig, SyncVmi};
use qlauncher::vmi::Vmi;
use std::sync::{Arc, Mutex};

use qlauncher::log::{self, VmiRef};
use qlauncher::monitor::grace::{DomainControl, Ending};
use qlauncher::monitor::kvm_probe;
use qlauncher::monitor::launcher::{self, Domain, LauncherConfig};
use qlauncher::monitor::qemu::spawn_detached;
use qlauncher::monitor::MonitorError;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

/// Test-only: JSON `{"argv": [...], "qmp": "/path/to/qmp.sock"}`, a QEMU to start as the domain.
pub const TEST_QEMU_ENV: &str = "QLAUNCHER_TEST_QEMU";
/// Root under which the paths without a launcher flag live (set by `qlauncher run`).
pub const ROOT_ENV: &str = "QLAUNCHER_ROOT";
/// `on` forces TCG, `off` requires a KVM that passes the probe, `auto` (or unset) lets
/// `--allow-emulation` fall back to TCG (set by `qlauncher run --emulation`).
pub const EMULATION_ENV: &str = "QLAUNCHER_EMULATION";
/// Path of a second QMP monitor socket for operators' tools (set by `qlauncher run`).
pub const OPERATOR_QMP_ENV: &str = "QLAUNCHER_OPERATOR_QMP";

/// Runs the launcher; exit code 0 on a clean end, 1 on failure, 2 on a bad command line.
pub fn main(args: Vec<String>) -> ExitCode {
    let env_verbosity = std::env::var("VIRT_LAUNCHER_LOG_VERBOSITY").ok();
    let parsed = LauncherConfig::from_args(&args, env_verbosity.as_deref());
    let (config, ignored) = match parsed {
        Ok(p) => p,
        Err(e) => {
            log::init("virt-launcher", VmiRef::default(), 2);
            error!(error = &e as &dyn std::error::Error, "bad command line");
            return ExitCode::from(2);
        }
    };
    let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_string());
    log::init(
        "virt-launcher",
        VmiRef {
            name: nonempty(&config.name),
            namespace: nonempty(&config.namespace),
            uid: nonempty(&config.uid),
        },
        config.verbosity,
    );
    let _ = nix::sys::prctl::set_name(c"virt-launcher");
    for arg in &ignored {
        debug!(arg = %arg, "ignoring flag");
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            error!(error = %e, "starting the runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config)) {
        Ok(()) => {
            info!("virt-launcher exiting");
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!(
                reason = &e as &dyn std::error::Error,
                "virt-launcher failed"
            );
            ExitCode::FAILURE
        }
    }
}

async fn run(config: LauncherConfig) -> Result<(), MonitorError> {
    launcher::create_directories(&config)?;
    if config.hook_sidecars > 0 {
        warn!(
            hook_sidecars = config.hook_sidecars,
            "hook sidecars are not supported, not waiting for them"
        );
    }
    let standalone = launcher::standalone_vmi(std::env::var("STANDALONE_VMI").ok().as_deref())?;
    let stop = stop_on_signals()?;
    match std::env::var(TEST_QEMU_ENV) {
        Ok(spec) => {
            let domain = StaticQemu::from_spec(&spec)?;
            launcher::run(&config, &domain, stop).await?;
        }
        Err(_) => run_sync(&config, standalone, stop).await?,
    }
    Ok(())
}

/// The launcher proper: the command server on `launcher-sock` over a [`SyncVmi`], the standalone
/// VMI synced at start, the lifecycle of [`launcher::run`], and the final notification.
async fn run_sync(
    config: &LauncherConfig,
    standalone: Option<serde_json::Value>,
    stop: watch::Receiver<bool>,
) -> Result<(), MonitorError> {
    let sync_config = sync_config(config);
    // virt-handler creates the notify pipe only after its first call on `launcher-sock`, so the
    // notifier is always started: it dials when it sends and keeps the latest domain state until
    // the pipe appears (KubeVirt's notify-client).
    let notify_socket = notify_socket_in_share_dir(&config.kubevirt_share_dir);
    let notifier = Notifier::start(notify_socket, NotifyTiming::KUBEVIRT);
    let manager = Arc::new(SyncVmi::new(sync_config, Some(notifier.clone())));
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
    let (sync_err_tx, mut sync_err_rx) = tokio::sync::mpsc::channel::<String>(1);
    if let Some(value) = standalone {
        let vmi: Vmi = serde_json::from_value(value).map_err(|e| MonitorError::QemuExited {
            reason: format!("STANDALONE_VMI is not a VMI: {e}"),
        })?;
        let m = manager.clone();
        tokio::spawn(async move {
            if let Err(e) = m.sync_vmi(vmi, None).await {
                let _ = sync_err_tx.send(error_chain(&e)).await;
            }
        });
    }
    let result = tokio::select! {
        r = launcher::run(config, &*manager, stop) => r.map(drop),
        Some(reason) = sync_err_rx.recv() => Err(MonitorError::QemuExited {
            reason: format!("standalone VMI sync failed: {reason}"),
        }),
    };
    // KubeVirt's order: Shutoff is notified (the event task), the command server keeps serving
    // until virt-handler's DeleteVirtualMachine or 15 s, then the final delete notification.
    // Without virt-handler's pipe (`qlauncher run`) nobody calls or awaits either.
    let final_wait = if notifier.socket_present() {
        if !manager.wait_deleted(Duration::from_secs(15)).await {
            info!("no DeleteVirtualMachine within 15 s, sending the final notification");
        }
        Duration::from_secs(10)
    } else {
        Duration::ZERO
    };
    manager.final_notify(final_wait).await;
    let _ = server_stop_tx.send(());
    let _ = server.wait().await;
    result
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn failed(step: &str, e: &dyn std::error::Error) -> MonitorError {
    MonitorError::QemuExited {
        reason: format!("{step}: {}", error_chain(e)),
    }
}

/// The SyncVMI configuration from the launcher's flags. `QLAUNCHER_ROOT` (set by `qlauncher run`)
/// moves the paths that have no flag (empty disks, `/dev`, NVRAM); `QLAUNCHER_EMULATION` and
/// `--allow-emulation` pick the accelerator ([`choose_accel`]); `QLAUNCHER_OPERATOR_QMP` adds
/// QEMU's operator QMP monitor.
fn sync_config(config: &LauncherConfig) -> SyncConfig {
    let root = std::env::var_os(ROOT_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
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
    let emulation = std::env::var(EMULATION_ENV).unwrap_or_default();
    let (kvm, allow_emulation) = choose_accel(config, &emulation, &c.qemu);
    c.kvm = kvm;
    c.allow_emulation = allow_emulation;
    // `--run-as-nonroot`: QEMU runs as the qemu user (107) even when the launcher is root.
    if config.run_as_nonroot {
        c.runtime_uid = launcher::QEMU_UID;
    }
    // `qemu --version` runs once, in the background: the converter and GetQemuVersion (before a
    // domain exists) wait for its answer, the command server does not.
    let probe = qlauncher::sync::config::QemuProbe::new(c.qemu.clone());
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

/// SIGINT, SIGHUP, SIGTERM and SIGQUIT set the stop flag (KubeVirt's `signalStopChan`).
fn stop_on_signals() -> Result<watch::Receiver<bool>, MonitorError> {
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, rx) = watch::channel(false);
    let mut streams = Vec::new();
    for kind in [
        SignalKind::interrupt(),
        SignalKind::hangup(),
        SignalKind::terminate(),
        SignalKind::quit(),
    ] {
        streams.push(signal(kind).map_err(MonitorError::Signals)?);
    }
    for mut s in streams {
        let tx = tx.clone();
        tokio::spawn(async move {
            while s.recv().await.is_some() {
                info!("stop signal received");
                let _ = tx.send(true);
            }
        });
    }
    Ok(rx)
}

/// A domain that is one fixed QEMU command line with a QMP socket (test stand-in for sync).
struct StaticQemu {
    argv: Vec<String>,
    qmp: String,
    powerdown_sent: std::sync::atomic::AtomicBool,
    last_stderr: Arc<Mutex<Option<String>>>,
}

impl StaticQemu {
    fn from_spec(spec: &str) -> Result<Self, MonitorError> {
        #[derive(serde::Deserialize)]
        struct Spec {
            argv: Vec<String>,
            qmp: String,
        }
        let spec: Spec = serde_json::from_str(spec).map_err(|e| MonitorError::ParseFlag {
            flag: TEST_QEMU_ENV.into(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            argv: spec.argv,
            qmp: spec.qmp,
            powerdown_sent: false.into(),
            last_stderr: Arc::default(),
        })
    }
}

impl DomainControl for StaticQemu {
    fn mark_graceful_shutdown(&self) {
        self.powerdown_sent
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    async fn power_button(&self) -> Result<(), MonitorError> {
        qmp_powerdown(&self.qmp)
            .await
            .map_err(MonitorError::PowerButton)
    }
}

impl Domain for StaticQemu {
    async fn started(&self) -> Result<i32, MonitorError> {
        let (program, args) = self.argv.split_first().ok_or(MonitorError::ParseFlag {
            flag: TEST_QEMU_ENV.into(),
            reason: "empty argv".into(),
        })?;
        let mut command = std::process::Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let qemu = spawn_detached(command)?;
        if let Some(stderr) = qemu.stderr {
            let last = self.last_stderr.clone();
            if let Ok(stderr) = tokio::process::ChildStderr::from_std(stderr) {
                tokio::spawn(async move {
                    let mut lines = BufReader::new(stderr).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        warn!(component_output = "qemu", line = %line, "QEMU stderr");
                        *last.lock().unwrap_or_else(|e| e.into_inner()) = Some(line);
                    }
                });
            }
        }
        // Wait for the QMP socket to accept, as libvirt waits for QEMU's monitor.
        for _ in 0..100 {
            if tokio::net::UnixStream::connect(&self.qmp).await.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Ok(qemu.pid)
    }

    fn check_exit(&self, ending: Ending) -> Result<(), MonitorError> {
        if ending != Ending::ExitedOnItsOwn
            || self
                .powerdown_sent
                .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(());
        }
        // Let the stderr reader catch the last line.
        std::thread::sleep(std::time::Duration::from_millis(100));
        let last = self
            .last_stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Err(MonitorError::QemuExited {
            reason: last.unwrap_or_else(|| "QEMU exited without a shutdown request".into()),
        })
    }
}

/// Sends `system_powerdown` over a fresh QMP connection.
async fn qmp_powerdown(path: &str) -> std::io::Result<()> {
    let stream = tokio::net::UnixStream::connect(path).await?;
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    lines.next_line().await?; // greeting
    for cmd in [
        "{\"execute\":\"qmp_capabilities\"}\n",
        "{\"execute\":\"system_powerdown\"}\n",
    ] {
        write.write_all(cmd.as_bytes()).await?;
        loop {
            let Some(line) = lines.next_line().await? else {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            };
            if line.contains("\"return\"") || line.contains("\"error\"") {
                break;
            }
        }
    }
    Ok(())
}
