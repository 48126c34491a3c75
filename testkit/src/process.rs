//! Processes of a test: commands that must succeed, children killed and reaped on drop, polling
//! until a condition holds, the process tree under a pid, and signals that reach only the process
//! they were meant for ([`kill_if`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use qlauncher::monitor::procfs;

/// Sends `sig` to `pid` only when `still_ours(pid)` holds once the process is pinned by a pidfd;
/// returns whether it was sent. A pid read from `/proc` or remembered from earlier may belong to
/// another test's process by the time it is signalled (pids are recycled, quickly on a busy
/// 2-core machine whose `pid_max` is 32768); with the pidfd, the check and the signal are about
/// the same process: if the pid was reused after the pidfd was opened, the signal goes to the
/// exited process the pidfd names and is dropped by the kernel (`ESRCH`).
pub fn kill_if(pid: i32, sig: nix::sys::signal::Signal, still_ours: impl Fn(i32) -> bool) -> bool {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    if pid <= 0 {
        return false;
    }
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let Ok(fd) = i32::try_from(fd) else {
        return false;
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if !still_ours(pid) {
        return false;
    }
    // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig as i32,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    r == 0
}

/// Runs `args[0]` with `args[1..]`; returns its stdout. Panics (with its stderr) when it cannot be
/// run or exits unsuccessfully.
pub fn run(args: &[&str]) -> String {
    let o = output(args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs `args[0]` with `args[1..]`; returns whether it succeeded and its stdout followed by its
/// stderr. Panics only when it cannot be run.
pub fn try_run(args: &[&str]) -> (bool, String) {
    let o = output(args);
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// Runs `args[0]` with `args[1..]` to completion; panics only when it cannot be run.
pub fn output(args: &[&str]) -> Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"))
}

/// A child process killed and reaped on drop.
pub struct ChildGuard(pub Option<Child>);

impl ChildGuard {
    /// Spawns `command` (its stdout and stderr as the command has them set).
    pub fn spawn(command: &mut Command) -> ChildGuard {
        ChildGuard(Some(command.spawn().expect("spawn")))
    }

    /// Waits for the child to exit and returns its output.
    pub fn wait(mut self) -> Output {
        self.0
            .take()
            .expect("child")
            .wait_with_output()
            .expect("wait")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Polls `cond` every 20 ms until it holds (true) or `timeout` passes (false).
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits up to `timeout` for `child` to exit (polling every 50 ms); `None` while it still runs.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every descendant of `pid`, parents before children (from `/proc`).
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        for c in procfs::children(p) {
            out.push(c.pid);
            queue.push(c.pid);
        }
    }
    out
}

/// Whether `pid`'s command line has an argument containing `needle` (false once it is gone).
pub fn cmdline_mentions(pid: i32, needle: &Path) -> bool {
    let needle = needle.to_string_lossy();
    procfs::cmdline(pid).is_some_and(|args| args.iter().any(|a| a.contains(needle.as_ref())))
}

/// SIGKILLs every process whose command line mentions `needle` (a test's own temporary root,
/// unique to it), each pinned by a pidfd and checked again before the signal ([`kill_if`]);
/// returns how many were signalled. For processes that left the test's process tree (QEMU runs in
/// its own session).
pub fn kill_mentioning(needle: &Path) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let me = std::process::id() as i32;
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me && cmdline_mentions(pid, needle))
        .filter(|&pid| {
            kill_if(pid, nix::sys::signal::Signal::SIGKILL, |p| {
                cmdline_mentions(p, needle)
            })
        })
        .count()
}

/// A running process (a monitor, a launcher) whose whole tree is killed on drop; its stderr (the
/// JSON log of monitor and launcher) goes to a file.
pub struct Running {
    /// The process.
    pub child: Child,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl Running {
    /// Starts `command` with stdin and stdout null and stderr to `log`.
    pub fn start(mut command: Command, log: &Path) -> Self {
        let file = std::fs::File::create(log).expect("log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn");
        Self {
            child,
            log: log.to_path_buf(),
        }
    }

    /// The pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends a signal.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).expect("kill");
    }

    /// Waits up to `timeout` for the exit; `None` on timeout.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The log lines that are JSON objects.
    pub fn log_records(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The first record whose `msg` is `msg`.
    pub fn record(&self, msg: &str) -> Option<serde_json::Value> {
        self.log_records().into_iter().find(|r| r["msg"] == msg)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Only the current tree (pids are recycled quickly: never kill a remembered pid). The
        // process is still alive while its descendants are killed, so none escapes to init.
        if self.child.try_wait().ok().flatten().is_none() {
            for pid in descendants(self.pid()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_if_signals_only_when_the_pinned_process_is_still_ours() {
        let mut child = Command::new("sleep").arg("100").spawn().unwrap();
        let pid = child.id() as i32;
        assert!(!kill_if(pid, nix::sys::signal::Signal::SIGKILL, |_| false));
        assert!(
            child.try_wait().unwrap().is_none(),
            "killed though not ours"
        );
        assert!(kill_if(pid, nix::sys::signal::Signal::SIGKILL, |p| p == pid));
        assert!(wait_timeout(&mut child, Duration::from_secs(10)).is_some());
        // Reaped: the pid names no process (or another one) now; nothing is sent for it.
        assert!(!kill_if(pid, nix::sys::signal::Signal::SIGKILL, |_| false));
    }

    #[test]
    fn kill_mentioning_ends_only_the_processes_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join("followed");
        let other = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(&ours, b"").unwrap();
        let mut inside = Command::new("tail").arg("-f").arg(&ours).spawn().unwrap();
        let mut outside = Command::new("tail")
            .arg("-f")
            .arg(other.path())
            .spawn()
            .unwrap();
        assert!(wait_until(Duration::from_secs(10), || cmdline_mentions(
            inside.id() as i32,
            dir.path()
        )));
        assert_eq!(kill_mentioning(dir.path()), 1);
        assert!(wait_timeout(&mut inside, Duration::from_secs(10)).is_some());
        assert!(
            outside.try_wait().unwrap().is_none(),
            "a process not naming the path was killed"
        );
        let _ = outside.kill();
        let _ = outside.wait();
    }

    #[test]
    fn kill_all_ends_what_runs_in_the_namespace_and_nothing_else() {
        let ns = crate::netns::Netns::new("kill");
        let mut inside = ns.command("sleep").arg("100").spawn().unwrap();
        let mut outside = Command::new("sleep").arg("100").spawn().unwrap();
        assert!(wait_until(Duration::from_secs(10), || !ns
            .pids()
            .is_empty()));
        ns.kill_all();
        assert!(wait_timeout(&mut inside, Duration::from_secs(10)).is_some());
        assert!(
            outside.try_wait().unwrap().is_none(),
            "a process outside was killed"
        );
        let _ = outside.kill();
        let _ = outside.wait();
    }
}
