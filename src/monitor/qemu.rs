//! Starting QEMU so that it becomes a child of PID 1, and watching a QEMU pid.
//!
//! virt-handler looks for QEMU only among the direct children of the launcher's parent, PID 1 of
//! the compute container (KubeVirt v1.9.0 `pkg/hypervisor/kvm/runtime.go`). libvirt gets there by
//! daemonizing QEMU: a double fork plus `setsid`, after which the kernel re-parents QEMU to the
//! nearest child subreaper, the monitor. [`spawn_detached`] does the same from a
//! `std::process::Command`, keeping whatever standard streams the caller set up (so the launcher can
//! read QEMU's stderr through a pipe), and reports the grandchild's pid.
//!
//! [`Qemu`] watches any QEMU pid through a pidfd, which works for a process that is not our child
//! and cannot be fooled by pid reuse; it is what the grace-period logic ([`super::grace`]) runs on.
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{ChildStderr, ChildStdout, Command};

use nix::sys::signal::Signal;
use qlauncher_monitor::caps::CapSets;
use tokio::io::unix::AsyncFd;

use super::MonitorError;

/// A QEMU started by [`spawn_detached`].
#[derive(Debug)]
pub struct Detached {
    /// The QEMU pid (a child of the nearest subreaper, not of the caller).
    pub pid: i32,
    /// QEMU's stdout when the command asked for `Stdio::piped()`.
    pub stdout: Option<ChildStdout>,
    /// QEMU's stderr when the command asked for `Stdio::piped()`.
    pub stderr: Option<ChildStderr>,
}

/// Starts `command` detached: fork, fork again, `setsid` (so a terminal's Ctrl-C reaches the
/// monitor, not QEMU), clear the ambient capabilities, exec. The intermediate process exits at once and is waited for here; the
/// grandchild is re-parented to the nearest child subreaper (the monitor) or to init.
///
/// `pre_exec` closures the caller registered run before the second fork (in the intermediate
/// process), so descriptors they `dup2` into place (tap fds, a pre-opened QMP socket) are inherited
/// by QEMU. Returns after the exec succeeded (the exec error is reported otherwise).
/// Errors: [`MonitorError::SpawnQemu`].
pub fn spawn_detached(mut command: Command) -> Result<Detached, MonitorError> {
    let program = std::path::PathBuf::from(command.get_program());
    let spawn_err = |source| MonitorError::SpawnQemu {
        program: program.clone(),
        source,
    };
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(spawn_err(std::io::Error::last_os_error()));
    }
    // SAFETY: pipe2 returned two fresh descriptors we now own.
    let (read_end, low_write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // The grandchild writes its pid to this end after the caller's `pre_exec` closures ran, which
    // `dup2` QEMU's inherited descriptors onto small numbers (the QMP listener at 3, vhost-vsock
    // at 20): an end with one of those numbers would be overwritten and the pid never arrive. It
    // moves to 64 or above, where no such placement goes.
    // SAFETY: F_DUPFD_CLOEXEC on an open fd returns a new fd that nothing else owns.
    let high = unsafe { libc::fcntl(low_write_end.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 64) };
    if high < 0 {
        return Err(spawn_err(std::io::Error::last_os_error()));
    }
    drop(low_write_end);
    // SAFETY: `high` was just returned by fcntl and is owned here alone.
    let write_end = unsafe { OwnedFd::from_raw_fd(high) };
    let write_fd = write_end.as_raw_fd();
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe functions
    // (fork, _exit, setsid, getpid, write).
    unsafe {
        command.pre_exec(move || {
            let pid = libc::fork();
            if pid < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if pid > 0 {
                libc::_exit(0);
            }
            libc::setsid();
            // QEMU gets no ambient or inheritable capabilities (the monitor gives the launcher
            // CAP_NET_BIND_SERVICE, inheritable and ambient: a non-root launcher's QEMU would
            // keep it in both sets across exec; libvirt clears the emulator's capabilities,
            // `clear_emulator_capabilities`).
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            );
            clear_inheritable_caps();
            let me = libc::getpid().to_ne_bytes();
            libc::write(write_fd, me.as_ptr().cast(), me.len());
            Ok(())
        });
    }
    // std reports an exec failure of the grandchild too: it holds the error pipe until exec.
    let mut intermediate = command.spawn().map_err(spawn_err)?;
    drop(write_end);
    let stdout = intermediate.stdout.take();
    let stderr = intermediate.stderr.take();
    let _ = intermediate.wait();
    let mut buf = [0u8; 4];
    std::fs::File::from(read_end)
        .read_exact(&mut buf)
        .map_err(spawn_err)?;
    Ok(Detached {
        pid: i32::from_ne_bytes(buf),
        stdout,
        stderr,
    })
}

/// Empties the calling thread's inheritable capability set, the effective and permitted sets
/// unchanged (so QEMU does not inherit the launcher's `CAP_NET_BIND_SERVICE`). Async-signal-safe
/// (two raw syscalls); a failure leaves the set as it was.
fn clear_inheritable_caps() {
    if let Some(mut sets) = CapSets::get() {
        if !sets.inheritable_empty() {
            sets.clear_inheritable();
            sets.set();
        }
    }
}

/// A QEMU process watched through a pidfd. Needs a tokio runtime with I/O enabled.
#[derive(Debug)]
pub struct Qemu {
    pid: i32,
    pidfd: AsyncFd<OwnedFd>,
}

impl Qemu {
    /// Opens a pidfd for `pid` (any process, child or not).
    /// Errors: [`MonitorError::WatchQemu`] when the process is gone or no runtime is running.
    pub fn from_pid(pid: i32) -> Result<Self, MonitorError> {
        let watch_err = |source| MonitorError::WatchQemu { pid, source };
        // SAFETY: plain syscall with integer arguments.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(watch_err(std::io::Error::last_os_error()));
        }
        // SAFETY: pidfd_open returned a fresh descriptor we now own.
        let owned = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // SAFETY: the OwnedFd is valid and owned by the AsyncFd until it is dropped.
        let pidfd =
            unsafe { AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) }
                .map_err(|e| watch_err(e.into_parts().1))?;
        Ok(Self { pid, pidfd })
    }

    /// The pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Resolves when the process has exited (the pidfd turns readable).
    pub async fn exited(&self) {
        loop {
            match self.pidfd.readable().await {
                // Readable stays set once the process is gone; never clear it.
                Ok(_guard) => return,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            }
        }
    }

    /// True when the process has exited.
    pub fn has_exited(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.pidfd.get_ref().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let r = unsafe { libc::poll(&mut pfd, 1, 0) };
        r > 0 && pfd.revents & libc::POLLIN != 0
    }

    /// Sends `signal` through the pidfd (`pidfd_send_signal`), so a recycled pid is never hit.
    /// A process that is already gone is not an error.
    pub fn signal(&self, signal: Signal) -> Result<(), MonitorError> {
        // SAFETY: valid pidfd, null siginfo, zero flags.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.get_ref().as_raw_fd(),
                signal as libc::c_int,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ESRCH) {
                return Err(MonitorError::WatchQemu {
                    pid: self.pid,
                    source: err,
                });
            }
        }
        Ok(())
    }
}
