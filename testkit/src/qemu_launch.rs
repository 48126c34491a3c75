//! Starting a QEMU under test: fork/exec with a clean environment and only the intended fds, then
//! QMP. (The launcher starts its QEMU in `qlauncher::sync`; this is the qmp tests' and the qmp
//! bench's way of getting one, with the same fd and credential handling.)
//!
//! Mirrors what libvirt's `qemuProcessLaunch` does for KubeVirt: QEMU starts paused (`-S`), the QMP
//! monitor is a listening socket created by the launcher and inherited as an fd
//! (`-chardev socket,id=charmonitor,fd=N,server=on,wait=off`), stdout/stderr go to the domain log,
//! the environment is reset, the process drops to the runtime user (qemu, uid 107) when asked, and
//! it dies with its parent (`PR_SET_PDEATHSIG`). After the pre-start QMP settings, `cont` starts it.
//!
//! The parent-death signal fires when the *thread* that spawned QEMU exits: spawn from a
//! long-lived thread (a tokio worker or the main thread, not a `spawn_blocking` thread). Exec
//! failures of the binary are reported by std through an internal pipe; a target fd number that
//! happens to equal that pipe's number only loses that report (QEMU then fails to greet).

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use qlauncher::qmp::{QmpClient, QmpError};

/// A launch that failed. Variants are named after the failing step.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Preparing the launch (QMP listener, log file, argv) failed.
    #[error("cannot prepare QEMU launch: {what}")]
    PrepareLaunch {
        /// Which preparation step.
        what: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// fork/exec of QEMU failed.
    #[error("cannot spawn {qemu}")]
    SpawnQemu {
        /// QEMU binary path.
        qemu: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// QEMU exited before it was running (bad argv, missing file, ...).
    #[error("QEMU exited early ({status}); last stderr lines:\n{stderr_tail}")]
    QemuExited {
        /// Exit status as text (`exit status: 1`, `signal: 9`).
        status: String,
        /// The last lines QEMU wrote to its log.
        stderr_tail: String,
    },
    /// Signalling or waiting for the QEMU process failed.
    #[error("cannot {action} QEMU pid {pid}")]
    Process {
        /// What was attempted (`send SIGTERM to`, `wait for`).
        action: String,
        /// QEMU's pid.
        pid: i32,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A QMP exchange during the launch failed.
    #[error(transparent)]
    Qmp(#[from] QmpError),
}

/// A file descriptor QEMU inherits at a fixed number (the `fd=N` of its argv).
#[derive(Debug)]
pub struct InheritFd {
    /// The open descriptor in this process (closed here once QEMU is spawned).
    pub fd: OwnedFd,
    /// The number it gets in QEMU; must be >= 3.
    pub target: RawFd,
}

/// Everything needed to start one QEMU.
#[derive(Debug)]
pub struct LaunchSpec {
    /// QEMU binary (`/usr/bin/qemu-system-x86_64`).
    pub qemu: PathBuf,
    /// Full argv after the program name; must contain `-S` and the QMP monitor.
    pub argv: Vec<String>,
    /// Fds QEMU inherits (QMP listener, taps, images); every other fd is closed at exec.
    pub fds: Vec<InheritFd>,
    /// Path of the QMP socket to connect to (the listener's path, or the `path=` QEMU binds).
    pub qmp_socket: PathBuf,
    /// Drop to this `(uid, gid)` before exec (KubeVirt runs QEMU as 107:107 when non-root).
    pub user: Option<(u32, u32)>,
    /// Log file receiving QEMU's stdout and stderr (appended).
    pub log: PathBuf,
    /// The complete environment (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// QMP commands run before `cont`, in order: `(command, arguments)`.
    pub pre_start: Vec<(String, Option<Value>)>,
    /// Whether to send `cont` after the pre-start commands (false leaves the VM in `prelaunch`).
    pub start: bool,
    /// How long QEMU may take to greet on QMP; also the default QMP command timeout.
    pub timeout: Duration,
    /// File to record QEMU's pid in (decimal and a newline, written to a temporary name, fsynced
    /// and renamed, as libvirt's `<domain>.pid`); `None` records nothing.
    pub pid_file: Option<PathBuf>,
}

/// A running QEMU with its QMP client.
#[derive(Debug)]
pub struct QemuProcess {
    child: tokio::process::Child,
    pid: i32,
    client: QmpClient,
    log: PathBuf,
}

/// Creates the QMP listening socket at `path` (an existing socket file there is replaced), to be
/// inherited by QEMU as `fd=N` with `server=on,wait=off`.
pub fn bind_qmp_listener(path: &Path) -> Result<UnixListener, LaunchError> {
    if path.exists() {
        std::fs::remove_file(path).map_err(|source| LaunchError::PrepareLaunch {
            what: format!("remove stale socket {}", path.display()),
            source,
        })?;
    }
    UnixListener::bind(path).map_err(|source| LaunchError::PrepareLaunch {
        what: format!("bind QMP socket {}", path.display()),
        source,
    })
}

/// Spawns QEMU as described, connects to QMP, runs the pre-start commands and (if `spec.start`)
/// `cont`. Errors: [`LaunchError::SpawnQemu`], [`LaunchError::QemuExited`] with QEMU's last stderr lines
/// if it exits before QMP is up or during the pre-start commands, and QMP errors.
pub async fn launch(spec: LaunchSpec) -> Result<QemuProcess, LaunchError> {
    let LaunchSpec {
        qemu,
        argv,
        fds,
        qmp_socket,
        user,
        log,
        env,
        pre_start,
        start,
        timeout,
        pid_file,
    } = spec;
    for f in &fds {
        if f.target < 3 {
            return Err(LaunchError::PrepareLaunch {
                what: format!("fd target {} (must be >= 3)", f.target),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            });
        }
    }
    let log_file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|source| LaunchError::PrepareLaunch {
            what: format!("open log {}", log.display()),
            source,
        })?;
    let log_offset = log_file.metadata().map(|m| m.len()).unwrap_or(0);
    let log_err = log_file
        .try_clone()
        .map_err(|source| LaunchError::PrepareLaunch {
            what: "duplicate log fd".into(),
            source,
        })?;

    let mut cmd = std::process::Command::new(&qemu);
    cmd.args(&argv)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log_file))
        .stderr(Stdio::from(log_err));
    // Everything the child does after fork is prepared here: no allocation after fork.
    let pairs: Vec<(RawFd, RawFd)> = fds.iter().map(|f| (f.fd.as_raw_fd(), f.target)).collect();
    let base = pairs.iter().map(|p| p.1).max().unwrap_or(2) + 1;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure only calls async-signal-safe libc functions on pre-allocated data.
    unsafe {
        cmd.pre_exec(move || child_setup(&pairs, base, user, parent));
    }
    let mut tcmd = tokio::process::Command::from(cmd);
    tcmd.kill_on_drop(false);
    let mut child = tcmd.spawn().map_err(|source| LaunchError::SpawnQemu {
        qemu: qemu.display().to_string(),
        source,
    })?;
    drop(fds);
    let pid = child.id().map(|p| p as i32).unwrap_or(0);
    tracing::info!(pid, qemu = %qemu.display(), "QEMU spawned");
    if let Some(path) = &pid_file {
        if let Err(source) = write_pid_file(path, pid) {
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(LaunchError::PrepareLaunch {
                what: format!("write pid file {}", path.display()),
                source,
            });
        }
    }

    let connected = {
        let connect = connect_retry(&qmp_socket, timeout);
        tokio::pin!(connect);
        tokio::select! {
            r = &mut connect => r.map_err(LaunchError::from),
            st = child.wait() => Err(exited(st, &log, log_offset).await),
        }
    };
    let client = match connected {
        Ok(c) => c,
        Err(e) => return Err(fail_launch(&mut child, e, &log, log_offset).await),
    };
    let mut proc = QemuProcess {
        child,
        pid,
        client,
        log: log.clone(),
    };
    let mut steps = pre_start;
    if start {
        steps.push(("cont".into(), None));
    }
    for (command, args) in steps {
        let r = {
            let run = proc.client.execute(&command, args);
            tokio::pin!(run);
            tokio::select! {
                r = &mut run => r.map(drop).map_err(LaunchError::from),
                st = proc.child.wait() => Err(exited(st, &log, log_offset).await),
            }
        };
        if let Err(e) = r {
            return Err(fail_launch(&mut proc.child, e, &log, log_offset).await);
        }
    }
    Ok(proc)
}

fn write_pid_file(path: &Path, pid: i32) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(format!("{pid}\n").as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// After a failed launch step: if QEMU exits within a moment (a closed QMP connection usually
/// means it is exiting), its exit and stderr are the better error; otherwise it is killed.
async fn fail_launch(
    child: &mut tokio::process::Child,
    err: LaunchError,
    log: &Path,
    offset: u64,
) -> LaunchError {
    if matches!(err, LaunchError::QemuExited { .. }) {
        return err;
    }
    match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
        Ok(st) => exited(st, log, offset).await,
        Err(_) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            err
        }
    }
}

async fn connect_retry(path: &Path, timeout: Duration) -> Result<QmpClient, QmpError> {
    let deadline = Instant::now() + timeout;
    loop {
        match QmpClient::connect(path, timeout).await {
            Ok(c) => return Ok(c),
            Err(QmpError::Connect { source, .. })
                if Instant::now() < deadline
                    && matches!(
                        source.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                    ) =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn exited(
    status: std::io::Result<std::process::ExitStatus>,
    log: &Path,
    offset: u64,
) -> LaunchError {
    let status = match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("unknown status: {e}"),
    };
    LaunchError::QemuExited {
        status,
        stderr_tail: log_tail(log, offset, 20),
    }
}

/// The last `lines` lines written to `log` after byte `offset`.
fn log_tail(log: &Path, offset: u64, lines: usize) -> String {
    let data = std::fs::read(log).unwrap_or_default();
    let from = (offset as usize).min(data.len());
    let text = String::from_utf8_lossy(&data[from..]);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs in the child between fork and exec. Only async-signal-safe calls.
fn child_setup(
    pairs: &[(RawFd, RawFd)],
    base: RawFd,
    user: Option<(u32, u32)>,
    parent: libc::pid_t,
) -> std::io::Result<()> {
    let check = |r: libc::c_int| {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r)
        }
    };
    // SAFETY: plain syscalls on integers; no memory is shared with the parent.
    unsafe {
        if let Some((uid, gid)) = user {
            let groups = [gid as libc::gid_t];
            check(libc::setgroups(1, groups.as_ptr()))?;
            check(libc::setgid(gid))?;
            check(libc::setuid(uid))?;
        }
        // After any credential change: it would clear the parent-death signal.
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0))?;
        if libc::getppid() != parent {
            libc::_exit(1);
        }
        // Move every source above the highest target first, so no dup2 clobbers a later source.
        let mut moved = [0 as RawFd; 64];
        if pairs.len() > moved.len() {
            return Err(std::io::Error::from_raw_os_error(libc::EMFILE));
        }
        for (i, (src, _)) in pairs.iter().enumerate() {
            moved[i] = check(libc::fcntl(*src, libc::F_DUPFD_CLOEXEC, base))?;
        }
        // Every fd from 3 up closes at exec unless dup2 below gives it a fresh, inheritable number.
        check(libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        ) as libc::c_int)?;
        for (i, (_, target)) in pairs.iter().enumerate() {
            check(libc::dup2(moved[i], *target))?;
            check(libc::fcntl(*target, libc::F_SETFD, 0))?;
        }
    }
    Ok(())
}

impl QemuProcess {
    /// QEMU's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The connected QMP client.
    pub fn client(&self) -> &QmpClient {
        &self.client
    }

    /// The log file receiving QEMU's stderr.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Waits for QEMU to exit; returns its exit status.
    pub async fn wait(&mut self) -> Result<std::process::ExitStatus, LaunchError> {
        self.child
            .wait()
            .await
            .map_err(|source| LaunchError::Process {
                action: "wait for".into(),
                pid: self.pid,
                source,
            })
    }

    /// Waits up to `timeout` for QEMU to exit; `None` if it is still running.
    pub async fn wait_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<std::process::ExitStatus>, LaunchError> {
        match tokio::time::timeout(timeout, self.wait()).await {
            Ok(r) => r.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Kills QEMU like libvirt's destroy: SIGTERM, then SIGKILL if it has not exited after
    /// `grace`. Returns the exit status.
    pub async fn kill(&mut self, grace: Duration) -> Result<std::process::ExitStatus, LaunchError> {
        if let Ok(Some(st)) = self.child.try_wait() {
            return Ok(st);
        }
        self.signal(libc::SIGTERM)?;
        if let Some(st) = self.wait_timeout(grace).await? {
            return Ok(st);
        }
        self.signal(libc::SIGKILL)?;
        self.wait().await
    }

    /// Sends `sig` to QEMU; a no-op once QEMU has been reaped (its pid may be reused).
    pub fn signal(&self, sig: libc::c_int) -> Result<(), LaunchError> {
        let Some(pid) = self.child.id() else {
            return Ok(());
        };
        // SAFETY: kill(2) on our own child's pid, which is not reaped while `child.id()` is Some.
        let r = unsafe { libc::kill(pid as libc::pid_t, sig) };
        if r < 0 {
            return Err(LaunchError::Process {
                action: format!("send signal {sig} to"),
                pid: self.pid,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}
