//! The monitor's main loop: KubeVirt's `virt-launcher-monitor` (`cmd/virt-launcher-monitor/`
//! of v1.9.0).
//!
//! [`run`] becomes child subreaper, blocks SIGCHLD, SIGINT, SIGTERM and SIGQUIT and takes them
//! with `sigtimedwait` in this single thread (no async runtime: the process stays small), starts
//! the launcher (with ambient `CAP_NET_BIND_SERVICE` when we hold it), reaps every zombie, forwards
//! SIGINT/SIGTERM/SIGQUIT to the launcher as SIGTERM, and once the launcher is gone stops a QEMU
//! still running among its children (SIGTERM, then after [`MonitorConfig::qemu_stop_timeout`]
//! SIGKILL and exit code 1), asks an Istio sidecar to quit ([`crate::istio`]), deletes the `*.sock`
//! files of the container-disk directory so that the container-disk sidecars end, and returns the
//! launcher's exit code.
//!
//! Process tree: QEMU must be a direct child of PID 1 (virt-handler looks for it only among the
//! children of the launcher's parent). In KubeVirt, virtqemud daemonizes QEMU (double fork), so the
//! kernel re-parents it to PID 1. qlauncher's launcher starts QEMU the same way
//! (`qlauncher::monitor::qemu::spawn_detached`), and the monitor is child subreaper so that the same tree
//! forms outside a PID namespace too (`qlauncher run`).
//!
//! Must be called before any thread is started: the signal mask is per thread.
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;

use crate::caps::{raise_ambient, CapSets, CAP_NET_BIND_SERVICE};
use crate::istio::{quit_istio_proxy, IstioProxy};
use crate::procfs;
use crate::reaper::{exit_code, Reaper};
use crate::{debug, error, info, warn};

/// Errors of the monitor's loop. Each variant names the step that failed.
#[derive(Debug)]
pub enum Pid1Error {
    /// `prctl(PR_SET_CHILD_SUBREAPER)` failed.
    Subreaper(nix::Error),
    /// Blocking or waiting for signals failed.
    Signals(std::io::Error),
    /// The launcher process could not be started.
    SpawnLauncher {
        /// The program executed.
        program: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

impl std::fmt::Display for Pid1Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pid1Error::Subreaper(e) => write!(f, "becoming child subreaper: {e}"),
            Pid1Error::Signals(e) => write!(f, "handling signals: {e}"),
            Pid1Error::SpawnLauncher { program, source } => {
                write!(f, "starting the launcher {}: {source}", program.display())
            }
        }
    }
}

impl std::error::Error for Pid1Error {}

/// How the monitor runs. Built by the `monitor` subcommand from the command line.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// The launcher's program (normally this binary, `/proc/self/exe` resolved).
    pub launcher_program: PathBuf,
    /// The launcher's arguments.
    pub launcher_args: Vec<OsString>,
    /// `--container-disk-dir`: where the `*.sock` files of the container-disk sidecars are deleted.
    pub container_disk_dir: PathBuf,
    /// `--keep-after-failure`: after a non-zero launcher exit, stay alive (still reaping) until the
    /// next termination signal instead of exiting.
    pub keep_after_failure: bool,
    /// How long a leftover QEMU has after SIGTERM (KubeVirt: 10 s).
    pub qemu_stop_timeout: Duration,
    /// The Istio proxy to end after the VM (`None`: do not look for one).
    pub istio: Option<IstioProxy>,
}

/// Set for the launcher: the monitor's pid, whose children are QEMU's possible parents (a detached
/// QEMU is re-parented to this subreaper), so that recovery looks at them only.
pub const MONITOR_PID_ENV: &str = "QLAUNCHER_MONITOR_PID";

/// Signals the monitor takes synchronously.
fn monitored_signals() -> SigSet {
    let mut set = SigSet::empty();
    for sig in [
        Signal::SIGCHLD,
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGQUIT,
    ] {
        set.add(sig);
    }
    set
}

/// Gives the launcher `CAP_NET_BIND_SERVICE` as an ambient capability, as KubeVirt's monitor does
/// (so that the DHCP server can bind port 67 as uid 107): when the capability is in our permitted
/// set, add it to the inheritable set and raise it as ambient. Best effort, no error: without the
/// capability there is nothing to pass on. Runs between fork and exec: raw syscalls only.
fn raise_ambient_net_bind_service() {
    let Some(mut sets) = CapSets::get() else {
        return;
    };
    if !sets.permitted(CAP_NET_BIND_SERVICE) {
        return;
    }
    sets.add_inheritable(CAP_NET_BIND_SERVICE);
    if sets.set() {
        raise_ambient(CAP_NET_BIND_SERVICE);
    }
}

extern "C" fn noop_handler(_: libc::c_int) {}

/// Installs a do-nothing handler for the monitored signals. They stay blocked and are taken by
/// `sigtimedwait`; the handler only matters for PID 1 of a PID namespace, to which the kernel does
/// not deliver a signal whose disposition is the default one. Handlers reset to the default on exec,
/// so the launcher is unaffected.
fn install_noop_handlers(set: &SigSet) -> Result<(), Pid1Error> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler};
    let action = SigAction::new(
        SigHandler::Handler(noop_handler),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in set.iter() {
        // SAFETY: the handler is async-signal-safe (does nothing).
        unsafe { sigaction(sig, &action) }.map_err(|e| Pid1Error::Signals(e.into()))?;
    }
    Ok(())
}

/// Waits up to `timeout` for one of the signals in `set`; `None` on timeout.
fn wait_signal(set: &SigSet, timeout: Duration) -> Result<Option<Signal>, Pid1Error> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `set` is a valid sigset and `ts` a valid timespec; siginfo may be null.
    let r = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &ts) };
    if r < 0 {
        let err = std::io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(Pid1Error::Signals(err)),
        };
    }
    Ok(Signal::try_from(r).ok())
}

/// How often the waiting monitor gives its resident pages back ([`crate::trim`]).
const TRIM_INTERVAL: Duration = Duration::from_secs(60);

/// Runs the monitor until the launcher has exited and the aftermath is done; returns the process
/// exit code (the launcher's; 1 when a leftover QEMU survived its SIGTERM).
///
/// Errors: becoming subreaper, blocking signals or starting the launcher failed.
pub fn run(config: &MonitorConfig) -> Result<i32, Pid1Error> {
    nix::sys::prctl::set_child_subreaper(true).map_err(Pid1Error::Subreaper)?;
    let signals = monitored_signals();
    signals
        .thread_block()
        .map_err(|e| Pid1Error::Signals(e.into()))?;
    install_noop_handlers(&signals)?;
    let reaper = Reaper::new();

    let mut command = Command::new(&config.launcher_program);
    command
        .args(&config.launcher_args)
        .env(MONITOR_PID_ENV, std::process::id().to_string())
        .env_remove(crate::LAUNCHER_ENV);
    // std does not reset the signal mask: unblock everything in the child before exec. Caught
    // signals return to their default disposition on exec by themselves.
    // SAFETY: sigprocmask with a local empty set is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            raise_ambient_net_bind_service();
            Ok(())
        });
    }
    let launcher = command.spawn().map_err(|source| Pid1Error::SpawnLauncher {
        program: config.launcher_program.clone(),
        source,
    })?;
    let launcher_pid = launcher.id() as i32;
    // The reaper owns every child, the launcher included.
    drop(launcher);
    info!("virt-launcher started", pid = launcher_pid);

    let mut launcher_status: Option<WaitStatus> = None;
    // Start-up is over once the launcher runs: give its pages back after the loop's first round
    // (so the loop's own code is what stays), then every minute ([`crate::trim`]).
    let mut next_trim = Instant::now() + Duration::from_secs(1);
    while launcher_status.is_none() {
        let sig = wait_signal(&signals, Duration::from_secs(1))?;
        if Instant::now() >= next_trim {
            crate::trim::trim_resident();
            next_trim = Instant::now() + TRIM_INTERVAL;
        }
        if let Some(sig @ (Signal::SIGINT | Signal::SIGTERM | Signal::SIGQUIT)) = sig {
            info!(
                "forwarding SIGTERM to virt-launcher",
                signal = sig.to_string()
            );
            let _ = kill(Pid::from_raw(launcher_pid), Signal::SIGTERM);
        }
        for reaped in reaper.reap() {
            log_reaped(&reaped, launcher_pid);
            if reaped.pid == launcher_pid {
                launcher_status = Some(reaped.status);
            }
        }
    }
    let mut code = launcher_status.as_ref().map(exit_code).unwrap_or(0);
    if code != 0 {
        warn!("dirty virt-launcher shutdown", code = code);
    }

    if !stop_leftover_qemu(&reaper, &signals, config.qemu_stop_timeout)? {
        code = 1;
    }
    if let Some(proxy) = &config.istio {
        if quit_istio_proxy(proxy, Duration::from_secs(1)) {
            info!("asked the Istio proxy to quit");
        }
    }
    remove_container_disk_sockets(&config.container_disk_dir);

    if config.keep_after_failure && code != 0 {
        info!(
            "keeping the monitor alive after the failure (--keep-after-failure)",
            code = code
        );
        loop {
            let sig = wait_signal(&signals, Duration::from_secs(1))?;
            for reaped in reaper.reap() {
                log_reaped(&reaped, launcher_pid);
            }
            if matches!(
                sig,
                Some(Signal::SIGINT | Signal::SIGTERM | Signal::SIGQUIT)
            ) {
                break;
            }
        }
    }
    info!("virt-launcher-monitor exiting", code = code);
    Ok(code)
}

fn log_reaped(reaped: &crate::reaper::Reaped, launcher_pid: i32) {
    let code = exit_code(&reaped.status);
    if reaped.pid == launcher_pid {
        info!("virt-launcher exited", pid = reaped.pid, code = code);
    } else if procfs::is_qemu_name(&reaped.comm) {
        let how = format!("{:?}", reaped.status);
        info!("QEMU exited", pid = reaped.pid, code = code, status = how);
    } else {
        debug!(
            "reaped",
            pid = reaped.pid,
            comm = reaped.comm.as_str(),
            code = code
        );
    }
}

/// SIGTERMs every QEMU still alive among our children and waits up to `timeout` for them, reaping
/// meanwhile. Returns false when one survived (it is then SIGKILLed, so that nothing outlives the
/// monitor when it is not PID 1 of its own namespace).
fn stop_leftover_qemu(
    reaper: &Reaper,
    signals: &SigSet,
    timeout: Duration,
) -> Result<bool, Pid1Error> {
    let me = std::process::id() as i32;
    let leftovers = procfs::qemu_children(me);
    if leftovers.is_empty() {
        return Ok(true);
    }
    for q in &leftovers {
        info!(
            "QEMU still running after virt-launcher exited, sending SIGTERM",
            pid = q.pid
        );
        let _ = kill(Pid::from_raw(q.pid), Signal::SIGTERM);
    }
    let deadline = Instant::now() + timeout;
    loop {
        for reaped in reaper.reap() {
            log_reaped(&reaped, -1);
        }
        let alive: Vec<_> = leftovers
            .iter()
            .filter(|q| procfs::stat(q.pid).is_some_and(|s| !s.is_zombie() && s.ppid == me))
            .collect();
        if alive.is_empty() {
            return Ok(true);
        }
        let now = Instant::now();
        if now >= deadline {
            for q in alive {
                error!(
                    "QEMU did not stop within the timeout, killing it",
                    pid = q.pid
                );
                let _ = kill(Pid::from_raw(q.pid), Signal::SIGKILL);
            }
            // Reap what the SIGKILL leaves.
            let _ = wait_signal(signals, Duration::from_millis(200))?;
            for reaped in reaper.reap() {
                log_reaped(&reaped, -1);
            }
            return Ok(false);
        }
        let _ = wait_signal(signals, (deadline - now).min(Duration::from_secs(1)))?;
    }
}

/// Deletes the `*.sock` files directly in `dir`, so the container-disk sidecars see their socket
/// go and exit. Failures are logged, never fatal.
pub fn remove_container_disk_sockets(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        debug!(
            "no container-disk directory",
            dir = dir.display().to_string()
        );
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "sock") {
            match std::fs::remove_file(&path) {
                Ok(()) => info!(
                    "removed container-disk socket",
                    path = path.display().to_string()
                ),
                Err(e) => {
                    warn!(
                        "removing container-disk socket",
                        path = path.display().to_string(),
                        error = e.to_string()
                    )
                }
            }
        }
    }
}
