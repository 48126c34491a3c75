//! virt-launcher's process plumbing: its flags, its directories, `STANDALONE_VMI`, the
//! `--qemu-timeout` wait and the grace period, generic over a [`SupervisedDomain`].
//!
//! Mirrors `cmd/virt-launcher/virt-launcher.go` of KubeVirt v1.9.0. The launcher's core (command
//! server, SyncVMI, QMP) belongs to the sync module, which implements [`SupervisedDomain`]; [`run`] then
//! drives the lifecycle: wait for a domain (failing after `--qemu-timeout`), watch its QEMU, and
//! on a stop request shut it down gracefully within `--grace-period-seconds`.
use std::future::Future;
use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, info};

use super::flags::{scan, FlagKind, ScannedFlags};
use super::grace::{self, stop_requested, DomainControl, Ending};
use super::qemu::Qemu;
use super::MonitorError;

/// The uid and gid KubeVirt's non-root launcher runs as (`qemu`, 107); its directories belong to it.
pub const QEMU_UID: u32 = 107;

/// Every flag virt-launcher v1.9.0 knows, with whether it takes a value. The ones
/// [`LauncherConfig`] does not use are accepted and logged at debug level.
pub const LAUNCHER_FLAGS: &[(&str, FlagKind)] = &[
    ("qemu-timeout", FlagKind::Value),
    ("name", FlagKind::Value),
    ("uid", FlagKind::Value),
    ("namespace", FlagKind::Value),
    ("kubevirt-share-dir", FlagKind::Value),
    ("ephemeral-disk-dir", FlagKind::Value),
    ("container-disk-dir", FlagKind::Value),
    ("hotplug-disk-dir", FlagKind::Value),
    ("grace-period-seconds", FlagKind::Value),
    ("allow-emulation", FlagKind::Bool),
    ("run-as-nonroot", FlagKind::Bool),
    ("hook-sidecars", FlagKind::Value),
    ("ovmf-path", FlagKind::Value),
    ("disk-memory-limit", FlagKind::Value),
    ("hypervisor", FlagKind::Value),
    ("v", FlagKind::Value),
    // qlauncher's own: moves `/var/run/kubevirt-private` (for `qlauncher run --root` and tests).
    ("private-dir", FlagKind::Value),
    // `GetVMStats` (KubeVirt's VMStatsCollector feature gate).
    ("vm-stats-collector", FlagKind::Bool),
    // The guest agent poller's intervals (Go durations).
    ("qemu-agent-sys-interval", FlagKind::Value),
    ("qemu-agent-file-interval", FlagKind::Value),
    ("qemu-agent-user-interval", FlagKind::Value),
    ("qemu-agent-version-interval", FlagKind::Value),
    ("qemu-fsfreeze-status-interval", FlagKind::Value),
    // The ImageVolume feature gate: containerDisks are image volumes, linked before SyncVMI.
    ("image-volume", FlagKind::Bool),
    // Accepted, not used by qlauncher.
    ("allow-cross-arch-emulation", FlagKind::Bool),
    ("libvirt-hook-server-and-client", FlagKind::Bool),
    ("upgrade-ordinal-ifaces", FlagKind::Bool),
    ("vgpu-dedicated-hook", FlagKind::Bool),
    ("firmware-auto-selection", FlagKind::Bool),
    ("simulate-crash", FlagKind::Bool),
    ("keep-after-failure", FlagKind::Bool),
    ("libvirt-log-filters", FlagKind::Value),
];

/// The flags [`LauncherConfig`] reads; the rest of [`LAUNCHER_FLAGS`] is accepted and ignored.
const USED_FLAGS: &[&str] = &[
    "qemu-timeout",
    "name",
    "uid",
    "namespace",
    "kubevirt-share-dir",
    "ephemeral-disk-dir",
    "container-disk-dir",
    "hotplug-disk-dir",
    "grace-period-seconds",
    "allow-emulation",
    "run-as-nonroot",
    "hook-sidecars",
    "ovmf-path",
    "disk-memory-limit",
    "hypervisor",
    "v",
    "private-dir",
    "image-volume",
];

/// virt-launcher's configuration, with KubeVirt's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LauncherConfig {
    /// `--qemu-timeout` (default 3 m; virt-controller passes 240 s plus up to 120 s of jitter).
    pub qemu_timeout: Duration,
    /// `--name`: the VMI's name.
    pub name: String,
    /// `--uid`: the VMI's uid.
    pub uid: String,
    /// `--namespace`: the VMI's namespace.
    pub namespace: String,
    /// `--kubevirt-share-dir` (default `/var/run/kubevirt`).
    pub kubevirt_share_dir: PathBuf,
    /// `--ephemeral-disk-dir` (default `/var/run/kubevirt-ephemeral-disks`).
    pub ephemeral_disk_dir: PathBuf,
    /// `--container-disk-dir` (default `/var/run/kubevirt/container-disks`).
    pub container_disk_dir: PathBuf,
    /// `--hotplug-disk-dir` (default `/var/run/kubevirt/hotplug-disks`).
    pub hotplug_disk_dir: PathBuf,
    /// The private directory, `/var/run/kubevirt-private`; qlauncher's own `--private-dir` moves
    /// it (KubeVirt has no such flag).
    pub private_dir: PathBuf,
    /// `--grace-period-seconds` (default 30).
    pub grace_period: Duration,
    /// `--allow-emulation`: run with TCG when `/dev/kvm` is missing.
    pub allow_emulation: bool,
    /// `--run-as-nonroot`.
    pub run_as_nonroot: bool,
    /// `--image-volume` (the ImageVolume feature gate, on by default in KubeVirt v1.9): the
    /// containerDisks are image volumes under `/var/run/kubevirt-image-volume/disk_<i>` (and
    /// `/var/run/kubevirt-kernel-boot`), linked as `disk_<i>.img` before each SyncVMI
    /// ([`crate::storage::image_volume`]).
    pub image_volume: bool,
    /// `--vm-stats-collector`: answer `GetVMStats`.
    pub vm_stats_collector: bool,
    /// `--qemu-agent-version-interval` (default 300 s).
    pub agent_version_interval: Duration,
    /// `--qemu-agent-file-interval` (default 300 s).
    pub agent_file_interval: Duration,
    /// `--qemu-fsfreeze-status-interval` (default 5 s).
    pub fsfreeze_status_interval: Duration,
    /// `--qemu-agent-sys-interval` (default 120 s).
    pub agent_sys_interval: Duration,
    /// `--qemu-agent-user-interval` (default 10 s).
    pub agent_user_interval: Duration,
    /// `--hook-sidecars`: number of hook sidecars to wait for (default 0).
    pub hook_sidecars: u32,
    /// `--ovmf-path` (default `/usr/share/edk2/ovmf`).
    pub ovmf_path: PathBuf,
    /// `--disk-memory-limit` in bytes for disk image inspection (default 2000 MiB).
    pub disk_memory_limit: u64,
    /// `--hypervisor` (default `kvm`).
    pub hypervisor: String,
    /// `-v` verbosity (default `VIRT_LAUNCHER_LOG_VERBOSITY`, else 2).
    pub verbosity: u32,
}

impl Default for LauncherConfig {
    fn default() -> Self {
        Self {
            qemu_timeout: Duration::from_secs(180),
            name: String::new(),
            uid: String::new(),
            namespace: String::new(),
            kubevirt_share_dir: "/var/run/kubevirt".into(),
            ephemeral_disk_dir: "/var/run/kubevirt-ephemeral-disks".into(),
            container_disk_dir: "/var/run/kubevirt/container-disks".into(),
            hotplug_disk_dir: "/var/run/kubevirt/hotplug-disks".into(),
            private_dir: "/var/run/kubevirt-private".into(),
            grace_period: Duration::from_secs(30),
            allow_emulation: false,
            run_as_nonroot: false,
            image_volume: false,
            vm_stats_collector: false,
            agent_version_interval: Duration::from_secs(300),
            agent_file_interval: Duration::from_secs(300),
            fsfreeze_status_interval: Duration::from_secs(5),
            agent_sys_interval: Duration::from_secs(120),
            agent_user_interval: Duration::from_secs(10),
            hook_sidecars: 0,
            ovmf_path: "/usr/share/edk2/ovmf".into(),
            disk_memory_limit: 2000 * 1024 * 1024,
            hypervisor: "kvm".into(),
            verbosity: 2,
        }
    }
}

impl LauncherConfig {
    /// Parses virt-launcher's command line (without the program name). `env_verbosity` is
    /// `VIRT_LAUNCHER_LOG_VERBOSITY`, used when `-v` is absent. Returns the configuration and the
    /// accepted-but-ignored arguments (unused known flags, unknown flags, stray words), for a
    /// debug log. Errors name the flag.
    pub fn from_args(
        args: &[String],
        env_verbosity: Option<&str>,
    ) -> Result<(Self, Vec<String>), MonitorError> {
        let f: ScannedFlags = scan(args, LAUNCHER_FLAGS);
        let d = Self::default();
        let verbosity = match (f.get("v"), env_verbosity.and_then(|v| v.parse().ok())) {
            (None, Some(v)) => v,
            _ => f.int("v", d.verbosity)?,
        };
        let config = Self {
            qemu_timeout: f.duration("qemu-timeout", d.qemu_timeout)?,
            name: f.string("name", ""),
            uid: f.string("uid", ""),
            namespace: f.string("namespace", ""),
            kubevirt_share_dir: path_flag(&f, "kubevirt-share-dir", d.kubevirt_share_dir),
            ephemeral_disk_dir: path_flag(&f, "ephemeral-disk-dir", d.ephemeral_disk_dir),
            container_disk_dir: path_flag(&f, "container-disk-dir", d.container_disk_dir),
            hotplug_disk_dir: path_flag(&f, "hotplug-disk-dir", d.hotplug_disk_dir),
            private_dir: path_flag(&f, "private-dir", d.private_dir),
            grace_period: Duration::from_secs(f.int("grace-period-seconds", 30u64)?),
            allow_emulation: f.bool("allow-emulation")?,
            run_as_nonroot: f.bool("run-as-nonroot")?,
            image_volume: f.bool("image-volume")?,
            vm_stats_collector: f.bool("vm-stats-collector")?,
            agent_version_interval: f
                .duration("qemu-agent-version-interval", d.agent_version_interval)?,
            agent_file_interval: f.duration("qemu-agent-file-interval", d.agent_file_interval)?,
            fsfreeze_status_interval: f
                .duration("qemu-fsfreeze-status-interval", d.fsfreeze_status_interval)?,
            agent_sys_interval: f.duration("qemu-agent-sys-interval", d.agent_sys_interval)?,
            agent_user_interval: f.duration("qemu-agent-user-interval", d.agent_user_interval)?,
            hook_sidecars: f.int("hook-sidecars", 0u32)?,
            ovmf_path: path_flag(&f, "ovmf-path", d.ovmf_path),
            disk_memory_limit: f.int("disk-memory-limit", d.disk_memory_limit)?,
            hypervisor: f.string("hypervisor", &d.hypervisor),
            verbosity,
        };
        let mut ignored: Vec<String> = f
            .values
            .iter()
            .filter(|(k, _)| !USED_FLAGS.contains(&k.as_str()))
            .map(|(k, v)| format!("--{k}={v}"))
            .collect();
        ignored.extend(f.ignored);
        Ok((config, ignored))
    }

    /// The VMI's private directory, `<private>/<uid>` (serial console, VNC sockets).
    pub fn vmi_private_dir(&self) -> PathBuf {
        self.private_dir.join(&self.uid)
    }

    /// Every directory the launcher makes at start, in KubeVirt's order (`virt-launcher.go`
    /// `initializeDirs`, then the ephemeral disk creator's `disk-data`), each with the mode and
    /// owner the KubeVirt helper that makes it gives it: [`LauncherDir`].
    pub fn directories(&self) -> Vec<LauncherDir> {
        let made = |path: PathBuf, mode: u32| LauncherDir {
            path,
            mode,
            remode: false,
            qemu_owned: false,
        };
        let mut dirs = vec![
            // `InitializePrivateDirectories`: `MkdirAllWithNosec` (0755) and the qemu user's.
            LauncherDir {
                qemu_owned: true,
                ..made(self.vmi_private_dir(), 0o755)
            },
            // cloud-init's and ignition's `SetLocalDirectory`: `MkdirAllWithNosec` (0755).
            made(self.ephemeral_disk_dir.join("cloud-init-data"), 0o755),
            made(self.ephemeral_disk_dir.join("ignition-data"), 0o755),
            // containerdisk's `SetLocalDirectory`: `MkdirAll(dir, 0750)`.
            made(self.container_disk_dir.clone(), 0o750),
            // hotplugdisk's `SetLocalDirectory`: `MkdirAll(dir, 0755)`.
            made(self.hotplug_disk_dir.clone(), 0o755),
        ];
        for sub in [
            "vm-disks",
            "config-map-disks",
            "sysprep-disks",
            "secret-disks",
            "downwardapi-disks",
            "service-account-disk",
            "downwardmetrics-channel",
        ] {
            // `InitializeDisksDirectories`: `MkdirAll(dir, 0750)`, `Chmod(dir, 0750)`, the qemu
            // user's.
            dirs.push(LauncherDir {
                path: self.private_dir.join(sub),
                mode: 0o750,
                remode: true,
                qemu_owned: true,
            });
        }
        // `ephemeraldisk.NewEphemeralDiskCreator(...).Init`: `MkdirAll(dir, 0755)`.
        dirs.push(made(self.ephemeral_disk_dir.join("disk-data"), 0o755));
        dirs
    }
}

/// One directory of [`LauncherConfig::directories`] and how KubeVirt's launcher makes it.
///
/// KubeVirt's helpers call `os.MkdirAll` (under umask 0 in `initializeDirs`): a missing directory
/// and its missing parents are made with `mode`; the kernel keeps the setgid bit a directory
/// inherits from a setgid parent (a kubelet emptyDir with an fsGroup is mode 2777 setgid). An
/// existing directory keeps its mode: most of the launcher's directories are emptyDir mount points
/// (`/var/run/kubevirt/container-disks`, `/var/run/kubevirt/hotplug-disks`), owned by root, which a
/// non-root launcher without `CAP_FOWNER` could not re-mode anyway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LauncherDir {
    /// The directory.
    pub path: PathBuf,
    /// The permission bits it is made with (e.g. `0o750`).
    pub mode: u32,
    /// Set exactly `mode` (clearing the setgid bit, as Go's `os.Chmod`) after making it, and on
    /// an existing directory the launcher owns or when it is root (`InitializeDisksDirectories`).
    pub remode: bool,
    /// Given to the qemu user ([`QEMU_UID`]:[`QEMU_UID`]) when the launcher is root
    /// (`UnsafeSetFileOwnership`); a non-root launcher is that user already.
    pub qemu_owned: bool,
}

fn path_flag(f: &ScannedFlags, name: &str, default: PathBuf) -> PathBuf {
    f.get(name).map(PathBuf::from).unwrap_or(default)
}

/// Makes the launcher's directories ([`LauncherConfig::directories`]) as KubeVirt's launcher
/// does: only what is missing, with its mode whatever the umask; an existing directory is re-moded
/// only when [`LauncherDir::remode`] says so and the launcher owns it (or is root), so a non-root
/// launcher (uid 107) starts over kubelet's root-owned emptyDirs; as root, the qemu user's
/// directories are given to 107:107 unless they are already.
/// Errors: [`MonitorError::CreateDirectory`] naming the directory.
pub fn create_directories(config: &LauncherConfig) -> Result<(), MonitorError> {
    let euid = nix::unistd::geteuid();
    for dir in config.directories() {
        let err = |source| MonitorError::CreateDirectory {
            path: dir.path.clone(),
            source,
        };
        let existed = make_missing(&dir.path, dir.mode).map_err(err)?;
        let meta = std::fs::metadata(&dir.path).map_err(err)?;
        if dir.remode && (!existed || euid.is_root() || meta.uid() == euid.as_raw()) {
            std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(dir.mode))
                .map_err(err)?;
        }
        if dir.qemu_owned && euid.is_root() && (meta.uid(), meta.gid()) != (QEMU_UID, QEMU_UID) {
            chown(&dir.path, Some(QEMU_UID), Some(QEMU_UID)).map_err(err)?;
        }
    }
    Ok(())
}

/// `os.MkdirAll(path, mode)` under umask 0: makes `path` and its missing parents, each given
/// `mode` plus the setgid bit it inherited (the launcher made it: it owns it). Returns whether
/// `path` existed already. Errors: `mkdir`'s, `chmod`'s, or `path` being something else than a
/// directory.
fn make_missing(path: &Path, mode: u32) -> std::io::Result<bool> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => return Ok(true),
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists and is not a directory",
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        make_missing(parent, mode)?;
    }
    match std::fs::create_dir(path) {
        Ok(()) => {}
        // Made meanwhile by another process: it is not ours to re-mode.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(true),
        Err(e) => return Err(e),
    }
    let inherited = std::fs::metadata(path)?.mode() & 0o2000;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | inherited))?;
    Ok(false)
}

/// Reads the VMI of a standalone run from `STANDALONE_VMI` (YAML or JSON; KubeVirt's
/// `pkg/virt-launcher/standalone`). `None` when unset or empty.
/// Errors: [`MonitorError::ReadStandaloneVmi`].
pub fn standalone_vmi(env_value: Option<&str>) -> Result<Option<serde_json::Value>, MonitorError> {
    match env_value {
        None => Ok(None),
        Some(s) if s.trim().is_empty() => Ok(None),
        Some(s) => serde_yaml_ng::from_str(s)
            .map(Some)
            .map_err(MonitorError::ReadStandaloneVmi),
    }
}

/// What the launcher's lifecycle needs from the domain: the sync module implements it.
pub trait SupervisedDomain: DomainControl {
    /// Resolves with the QEMU pid once a domain has been started (by a SyncVMI call or the
    /// standalone VMI). Stays pending while none is.
    fn started(&self) -> impl Future<Output = Result<i32, MonitorError>> + Send;

    /// Called once QEMU is gone; returns an error when the exit was abnormal (crash), which makes
    /// the launcher exit non-zero. The default accepts every ending. Async: the launcher's
    /// runtime is current-thread, so whatever the check waits for (the event task recording the
    /// exit) only runs while the check awaits, never while it blocks the thread.
    fn check_exit(&self, ending: Ending) -> impl Future<Output = Result<(), MonitorError>> + Send {
        let _ = ending;
        async { Ok(()) }
    }
}

/// Runs the launcher's lifecycle after its servers are up: waits for a domain (at most
/// `--qemu-timeout`), then supervises its QEMU ([`grace::supervise`]) until it is gone.
/// Returns `None` when a stop request came before any domain started.
/// Errors: [`MonitorError::QemuTimeout`], the domain's own errors, and [`SupervisedDomain::check_exit`]'s.
pub async fn run<D: SupervisedDomain>(
    config: &LauncherConfig,
    domain: &D,
    stop: watch::Receiver<bool>,
) -> Result<Option<Ending>, MonitorError> {
    let mut early_stop = stop.clone();
    let pid = tokio::select! {
        pid = domain.started() => pid?,
        _ = stop_requested(&mut early_stop) => {
            info!("stop requested before a domain started");
            return Ok(None);
        }
        _ = tokio::time::sleep(config.qemu_timeout) => {
            return Err(MonitorError::QemuTimeout { timeout: config.qemu_timeout });
        }
    };
    let qemu = match Qemu::from_pid(pid) {
        Ok(q) => q,
        // Gone before it could be watched: it ended on its own.
        Err(MonitorError::WatchQemu { source, .. })
            if source.raw_os_error() == Some(libc::ESRCH) =>
        {
            info!(pid, "QEMU exited before it could be watched");
            domain.check_exit(Ending::ExitedOnItsOwn).await?;
            return Ok(Some(Ending::ExitedOnItsOwn));
        }
        Err(e) => return Err(e),
    };
    info!(pid, "domain started, watching QEMU");
    let trimmed = super::trim::trim_after_start();
    debug!(advised_bytes = trimmed, "start-up memory trimmed");
    let ending = tokio::select! {
        e = grace::supervise(&qemu, domain, stop, config.grace_period) => e?,
        () = super::trim::periodic() => unreachable!("the periodic trim never ends"),
    };
    debug!(?ending, "QEMU is gone");
    domain.check_exit(ending).await?;
    Ok(Some(ending))
}

/// virt-launcher's process around `body` (`cmd/virt-launcher/virt-launcher.go`'s `main`): parses
/// its flags (exit code 2 on a bad command line), sets up the JSON log carrying the VMI's name,
/// namespace and uid, names the process `virt-launcher`, creates the launcher's directories and
/// runs `body(config, stop)` on a current-thread runtime, `stop` turning true on SIGINT, SIGHUP,
/// SIGTERM or SIGQUIT (KubeVirt's `signalStopChan`). Exit code 0 when `body` succeeds, 1 when it
/// or the set-up fails (logged as `virt-launcher failed`).
pub fn main<F, Fut>(args: &[String], body: F) -> std::process::ExitCode
where
    F: FnOnce(LauncherConfig, watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = Result<(), MonitorError>>,
{
    use crate::log::{self, VmiRef};
    use std::process::ExitCode;
    super::trim::limit_arenas();
    grow_fd_table();
    let env_verbosity = std::env::var("VIRT_LAUNCHER_LOG_VERBOSITY").ok();
    let (config, ignored) = match LauncherConfig::from_args(args, env_verbosity.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            log::init("virt-launcher", VmiRef::default(), 2);
            tracing::error!(error = &e as &dyn std::error::Error, "bad command line");
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
            tracing::error!(error = %e, "starting the runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        create_directories(&config)?;
        let stop = stop_on_signals()?;
        body(config, stop).await
    });
    match result {
        Ok(()) => {
            info!("virt-launcher exiting");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(
                reason = &e as &dyn std::error::Error,
                "virt-launcher failed"
            );
            ExitCode::FAILURE
        }
    }
}

/// Grows this process's file descriptor table past fd 64 while it is still single-threaded: the
/// QMP listener QEMU inherits is placed at 64 or above (`F_DUPFD_CLOEXEC`), and growing the table
/// of a process with threads waits for an RCU grace period (`expand_fdtable`, 10-25 ms measured
/// on the start path under load). The table never shrinks, so one dup and close now suffice.
fn grow_fd_table() {
    for open in 0..3 {
        // SAFETY: duplicating a standard fd (or failing) and closing the copy touches nothing else.
        let fd = unsafe { libc::fcntl(open, libc::F_DUPFD_CLOEXEC, 127) };
        if fd >= 0 {
            // SAFETY: `fd` was just returned and is owned here alone.
            unsafe { libc::close(fd) };
            return;
        }
    }
}

/// A flag that turns true on SIGINT, SIGHUP, SIGTERM or SIGQUIT (KubeVirt's `signalStopChan`).
/// Call inside a tokio runtime.
pub fn stop_on_signals() -> Result<watch::Receiver<bool>, MonitorError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn defaults_match_kubevirt() {
        let (config, ignored) = LauncherConfig::from_args(&[], None).unwrap();
        assert_eq!(config, LauncherConfig::default());
        assert!(ignored.is_empty());
    }

    #[test]
    fn controller_command_line() {
        let (config, ignored) = LauncherConfig::from_args(
            &args(&[
                "--qemu-timeout",
                "271s",
                "--name",
                "testvmi",
                "--uid",
                "1234-5678",
                "--namespace",
                "default",
                "--kubevirt-share-dir",
                "/var/run/kubevirt",
                "--ephemeral-disk-dir",
                "/var/run/kubevirt-ephemeral-disks",
                "--container-disk-dir",
                "/var/run/kubevirt/container-disks",
                "--grace-period-seconds",
                "45",
                "--hook-sidecars",
                "1",
                "--ovmf-path",
                "/usr/share/OVMF",
                "--disk-memory-limit",
                "2097152000",
                "--hypervisor",
                "kvm",
                "--run-as-nonroot",
                "--allow-emulation",
                "--upgrade-ordinal-ifaces",
                "--brand-new-flag",
                "x",
            ]),
            None,
        )
        .unwrap();
        let expected = LauncherConfig {
            qemu_timeout: Duration::from_secs(271),
            name: "testvmi".into(),
            uid: "1234-5678".into(),
            namespace: "default".into(),
            grace_period: Duration::from_secs(45),
            hook_sidecars: 1,
            ovmf_path: "/usr/share/OVMF".into(),
            run_as_nonroot: true,
            allow_emulation: true,
            ..LauncherConfig::default()
        };
        assert_eq!(config, expected);
        assert_eq!(
            ignored,
            args(&["--upgrade-ordinal-ifaces=true", "--brand-new-flag=x"])
        );
    }

    #[test]
    fn agent_poll_intervals_are_go_durations() {
        let (c, _) = LauncherConfig::from_args(
            &args(&[
                "--qemu-agent-sys-interval",
                "30s",
                "--qemu-fsfreeze-status-interval=1m",
            ]),
            None,
        )
        .unwrap();
        assert_eq!(c.agent_sys_interval, Duration::from_secs(30));
        assert_eq!(c.fsfreeze_status_interval, Duration::from_secs(60));
        assert_eq!(c.agent_user_interval, Duration::from_secs(10));
    }

    #[test]
    fn verbosity_from_env_unless_flag() {
        let (c, _) = LauncherConfig::from_args(&[], Some("5")).unwrap();
        assert_eq!(c.verbosity, 5);
        let (c, _) = LauncherConfig::from_args(&args(&["-v", "3"]), Some("5")).unwrap();
        assert_eq!(c.verbosity, 3);
    }

    #[test]
    fn bad_grace_period_names_the_flag() {
        let err = LauncherConfig::from_args(&args(&["--grace-period-seconds", "soon"]), None)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "flag --grace-period-seconds: \"soon\" is not an integer"
        );
    }

    #[test]
    fn standalone_vmi_yaml_or_json() {
        let yaml =
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: a\n";
        let json = r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","metadata":{"name":"a"}}"#;
        let a = standalone_vmi(Some(yaml)).unwrap();
        let b = standalone_vmi(Some(json)).unwrap();
        assert_eq!(a, b);
        assert_eq!(standalone_vmi(None).unwrap(), None);
        assert_eq!(standalone_vmi(Some("  ")).unwrap(), None);
        assert!(standalone_vmi(Some("{unclosed")).is_err());
    }

    #[test]
    fn directories_are_created_with_modes_and_owners() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        let config = LauncherConfig {
            uid: "u1".into(),
            private_dir: r.join("private"),
            ephemeral_disk_dir: r.join("ephemeral"),
            container_disk_dir: r.join("share/container-disks"),
            hotplug_disk_dir: r.join("share/hotplug-disks"),
            kubevirt_share_dir: r.join("share"),
            ..LauncherConfig::default()
        };
        create_directories(&config).unwrap();
        let root = nix::unistd::geteuid().is_root();
        for dir in config.directories() {
            let meta = std::fs::metadata(&dir.path).unwrap();
            assert_eq!(meta.mode() & 0o7777, dir.mode, "{}", dir.path.display());
            if root {
                let owner = if dir.qemu_owned { QEMU_UID } else { 0 };
                assert_eq!(
                    (meta.uid(), meta.gid()),
                    (owner, owner),
                    "{}",
                    dir.path.display()
                );
            }
        }
    }

    /// An existing directory keeps its mode (an emptyDir mount point: 2777 setgid) unless KubeVirt
    /// re-modes it; one made inside a setgid directory keeps the inherited setgid bit unless it
    /// is re-moded.
    #[test]
    fn existing_directories_keep_their_mode() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let r = tmp.path();
        let config = LauncherConfig {
            uid: "u1".into(),
            private_dir: r.join("private"),
            ephemeral_disk_dir: r.join("ephemeral"),
            container_disk_dir: r.join("share/container-disks"),
            hotplug_disk_dir: r.join("share/hotplug-disks"),
            kubevirt_share_dir: r.join("share"),
            ..LauncherConfig::default()
        };
        let empty_dirs = [
            r.join("private"),
            r.join("ephemeral"),
            r.join("share/container-disks"),
            r.join("share/hotplug-disks"),
        ];
        for d in &empty_dirs {
            std::fs::create_dir_all(d).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o2777)).unwrap();
        }
        let vm_disks = r.join("private/vm-disks");
        std::fs::create_dir(&vm_disks).unwrap();
        std::fs::set_permissions(&vm_disks, std::fs::Permissions::from_mode(0o777)).unwrap();
        create_directories(&config).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
        for d in &empty_dirs {
            assert_eq!(mode(d), 0o2777, "{}", d.display());
        }
        assert_eq!(mode(&vm_disks), 0o750);
        assert_eq!(mode(&r.join("private/u1")), 0o2755);
        assert_eq!(mode(&r.join("private/secret-disks")), 0o750);
        assert_eq!(mode(&r.join("ephemeral/disk-data")), 0o2755);
    }
}
