//! The zombie reaper of a subreaper process.
//!
//! KubeVirt's monitor (`cmd/virt-launcher-monitor`) reaps with `wait4(-1, WNOHANG)` on SIGCHLD. That
//! is right only when nobody else in the process waits for a child: a `tokio::process::Child` (which
//! waits through a pidfd) or a `std::process::Child` fails with `ECHILD` when the reaper took its
//! status first. [`Reaper`] therefore keeps a set of *managed* pids, registered under the same lock
//! as the spawn, and never reaps those:
//!
//! 1. `waitid(P_ALL, WEXITED | WNOHANG | WNOWAIT)` peeks at one zombie without reaping it;
//! 2. an unmanaged zombie is reaped with `waitpid(pid)` and reported;
//! 3. when the peeked zombie is managed (its owner has not waited yet), `waitid` would return it again
//!    and hide the others, so the reaper falls back to the list of its children from `/proc` and
//!    reaps each unmanaged one with `waitpid(pid, WNOHANG)`.
//!
//! The monitor's own loop manages nothing: it reaps the launcher like any other child and reads the
//! launcher's exit status from the report.
use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};

use nix::errno::Errno;
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::procfs;

/// One reaped child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaped {
    /// Its pid.
    pub pid: i32,
    /// Its `comm` as read while it was a zombie (empty if unreadable).
    pub comm: String,
    /// How it ended.
    pub status: WaitStatus,
}

/// Shell-style exit code of a wait status: the exit code, or 128 + the signal number.
pub fn exit_code(status: &WaitStatus) -> i32 {
    match status {
        WaitStatus::Exited(_, code) => *code,
        WaitStatus::Signaled(_, sig, _) => 128 + *sig as i32,
        _ => 0,
    }
}

/// A reaper that leaves the managed pids to their owners. See the module documentation.
#[derive(Debug, Default)]
pub struct Reaper {
    managed: Mutex<HashSet<i32>>,
}

impl Reaper {
    /// A reaper managing nothing.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashSet<i32>> {
        self.managed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `spawn` while holding the lock and registers the pid it returns as managed, so a child
    /// that exits at once is not reaped before its owner waits for it. `spawn` returns the value to
    /// hand back and the pid.
    pub fn spawn_managed<T, E>(&self, spawn: impl FnOnce() -> Result<(T, i32), E>) -> Result<T, E> {
        let mut managed = self.lock();
        let (value, pid) = spawn()?;
        managed.insert(pid);
        Ok(value)
    }

    /// Forgets a managed pid once its owner has waited for it.
    pub fn release(&self, pid: i32) {
        self.lock().remove(&pid);
    }

    /// Reaps every unmanaged zombie child present now and reports them. Never blocks.
    pub fn reap(&self) -> Vec<Reaped> {
        let managed = self.lock();
        let mut out = Vec::new();
        loop {
            let peek = waitid(
                Id::All,
                WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
            );
            let pid = match peek {
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
                Err(Errno::EINTR) => continue,
                Err(_) => break,
                Ok(status) => match status.pid() {
                    Some(pid) => pid.as_raw(),
                    None => break,
                },
            };
            if managed.contains(&pid) {
                self.reap_unmanaged_children(&managed, &mut out);
                break;
            }
            let comm = procfs::stat(pid).map(|s| s.comm).unwrap_or_default();
            match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(status) => out.push(Reaped { pid, comm, status }),
                Err(Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
        out
    }

    fn reap_unmanaged_children(&self, managed: &HashSet<i32>, out: &mut Vec<Reaped>) {
        let me = std::process::id() as i32;
        for child in procfs::children(me) {
            if !child.is_zombie() || managed.contains(&child.pid) {
                continue;
            }
            if let Ok(status) = waitpid(Pid::from_raw(child.pid), Some(WaitPidFlag::WNOHANG)) {
                if status != WaitStatus::StillAlive {
                    out.push(Reaped {
                        pid: child.pid,
                        comm: child.comm,
                        status,
                    });
                }
            }
        }
    }
}
