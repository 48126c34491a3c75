//! `virt-tail`: the `guest-console-log` native sidecar, as KubeVirt's `cmd/virt-tail/main.go`
//! (v1.9.0, github.com/nxadm/tail with `Follow`, `ReOpen`, `CompleteLines`, `MustExist: false`)
//! behaves: it writes the serial console log QEMU appends to, line by line, on stdout (what
//! `kubectl logs -c guest-console-log` shows).
//!
//! - `--logfile PATH` (required: missing or empty exits 1); unknown flags are ignored; `-v N`
//!   and then the environment's `VIRT_LAUNCHER_LOG_VERBOSITY` set the log verbosity.
//! - Reads PATH from its start; it may not exist yet (waits for it). Only complete lines are
//!   written, each as it was (through its `\n`, a `\r` before it kept). A file that shrinks is
//!   read again from its start; a file that is removed or replaced is reopened, from its start,
//!   once the path exists again.
//! - Waits on inotify (the file and its directory), and checks anyway once a second.
//! - SIGTERM or SIGINT (the kubelet stops a native sidecar after the main containers end): the
//!   complete lines read so far are written, then exit 0. Otherwise it never exits: a file it
//!   cannot open or read is tried again a second later, as KubeVirt's restart of its tailer does.
//! - One difference, for the sidecar's 60M memory limit: a line longer than [`MAX_LINE`] bytes is
//!   written in pieces of that size (nxadm/tail would buffer it whole).
//!
//! Links std and libc only: it stays resident in every VMI pod.

use std::ffi::{CString, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

use crate::flags::{self, Flag, Kind};
use crate::log;

/// The log component name.
pub const COMPONENT: &str = "virt-tail";
/// The longest line kept whole, bytes.
pub const MAX_LINE: usize = 1 << 20;
/// The read buffer, bytes.
const CHUNK: usize = 64 << 10;
/// The safety-net wake-up when no event comes, milliseconds.
const RECHECK_MS: libc::c_int = 1000;

/// virt-tail's flags.
pub const FLAGS: [Flag; 2] = [
    Flag {
        name: "logfile",
        kind: Kind::String,
        default: "",
        usage: "path of the logfile to be streamed",
    },
    Flag {
        name: "v",
        kind: Kind::Int32,
        default: "2",
        usage: "log level for V logs",
    },
];

/// Splits the complete lines off `pending`: returns the bytes to write (whole lines, and pieces
/// of [`MAX_LINE`] bytes of an over-long line) and leaves the incomplete rest in `pending`.
pub fn take_lines(pending: &mut Vec<u8>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut start = 0;
    loop {
        let rest = &pending[start..];
        match rest.iter().position(|b| *b == b'\n') {
            Some(nl) if nl < MAX_LINE => {
                out.extend_from_slice(&rest[..=nl]);
                start += nl + 1;
            }
            _ if rest.len() >= MAX_LINE => {
                out.extend_from_slice(&rest[..MAX_LINE]);
                out.push(b'\n');
                start += MAX_LINE;
            }
            _ => break,
        }
    }
    pending.drain(..start);
    out
}

/// The follower: the open file (with its identity and read position) and the incomplete line.
struct Follower {
    path: OsString,
    path_c: CString,
    dir_c: CString,
    inotify: libc::c_int,
    file: Option<(std::fs::File, u64, u64)>,
    offset: u64,
    pending: Vec<u8>,
    buf: Vec<u8>,
}

impl Follower {
    fn new(path: OsString) -> Result<Follower, String> {
        let bytes = path.as_bytes();
        let dir = crate::container_disk::dirname(bytes).to_vec();
        let path_c = CString::new(bytes).map_err(|_| "logfile contains a NUL byte".to_string())?;
        let dir_c = CString::new(dir).map_err(|_| "logfile contains a NUL byte".to_string())?;
        // SAFETY: creates a descriptor we own.
        let inotify = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if inotify < 0 {
            return Err(format!("inotify: {}", std::io::Error::last_os_error()));
        }
        Ok(Follower {
            path,
            path_c,
            dir_c,
            inotify,
            file: None,
            offset: 0,
            pending: Vec::new(),
            buf: vec![0; CHUNK],
        })
    }

    /// (Re)adds the watches: the directory for the file appearing, the file for writes, renames
    /// and removal. Failures only cost the wake-up (the once-a-second check remains).
    fn watch(&self) {
        // SAFETY: inotify_add_watch on our descriptor with NUL-terminated paths.
        unsafe {
            libc::inotify_add_watch(
                self.inotify,
                self.dir_c.as_ptr(),
                libc::IN_CREATE | libc::IN_MOVED_TO,
            );
            if self.file.is_some() {
                libc::inotify_add_watch(
                    self.inotify,
                    self.path_c.as_ptr(),
                    libc::IN_MODIFY | libc::IN_ATTRIB | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF,
                );
            }
        }
    }

    fn open(&mut self) -> bool {
        match std::fs::File::open(&self.path) {
            Ok(f) => {
                let (dev, ino) = match f.metadata() {
                    Ok(m) => (m.dev(), m.ino()),
                    Err(_) => (0, 0),
                };
                self.file = Some((f, dev, ino));
                self.offset = 0;
                self.watch();
                true
            }
            Err(e) => {
                if e.kind() != std::io::ErrorKind::NotFound {
                    log::v(3, COMPONENT, &format!("tail error: {e}"));
                }
                self.watch();
                false
            }
        }
    }

    /// Writes the complete lines there are to `out`: first drops a file that was removed or
    /// replaced (as nxadm/tail stops reading a moved file at once) and rewinds a truncated one.
    fn pump(&mut self, out: &mut impl Write) {
        if let Some((_, dev, ino)) = self.file.as_ref() {
            let replaced = match std::fs::metadata(&self.path) {
                Ok(m) => m.dev() != *dev || m.ino() != *ino,
                Err(_) => true,
            };
            if replaced {
                self.file = None;
            }
        }
        if self.file.is_none() && !self.open() {
            return;
        }
        let Some((file, _, _)) = self.file.as_ref() else {
            return;
        };
        if file
            .metadata()
            .map(|m| m.size() < self.offset)
            .unwrap_or(false)
        {
            self.offset = 0;
        }
        loop {
            let Some((file, _, _)) = self.file.as_mut() else {
                return;
            };
            use std::os::unix::fs::FileExt;
            match file.read_at(&mut self.buf, self.offset) {
                Ok(0) => break,
                Ok(n) => {
                    self.offset += n as u64;
                    self.pending.extend_from_slice(&self.buf[..n]);
                    let lines = take_lines(&mut self.pending);
                    if !lines.is_empty() {
                        let _ = out.write_all(&lines);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::v(3, COMPONENT, &format!("tail error: {e}"));
                    self.file = None;
                    break;
                }
            }
        }
        let _ = out.flush();
    }

    /// Drains pending inotify events (their content does not matter: every wake-up re-checks).
    fn drain_events(&self) {
        let mut events = [0u8; 4096];
        // SAFETY: reads into our buffer from our non-blocking descriptor.
        while unsafe { libc::read(self.inotify, events.as_mut_ptr().cast(), events.len()) } > 0 {}
    }
}

/// Blocks SIGTERM and SIGINT and returns a signalfd that reads them.
fn termination_signals() -> Result<libc::c_int, String> {
    // SAFETY: builds a signal set and blocks it for this (single-threaded) process before any
    // thread exists; signalfd returns a descriptor we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(format!("sigprocmask: {}", std::io::Error::last_os_error()));
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(format!("signalfd: {}", std::io::Error::last_os_error()));
        }
        Ok(fd)
    }
}

/// Sets the log verbosity as virt-tail does: `-v`, then `VIRT_LAUNCHER_LOG_VERBOSITY` when it is
/// an integer (a warning otherwise).
fn set_verbosity(parsed: &flags::Parsed) {
    log::set_verbosity(parsed.int32("v", log::DEFAULT_VERBOSITY));
    if let Some(value) = std::env::var_os("VIRT_LAUNCHER_LOG_VERBOSITY") {
        let text = value.to_string_lossy();
        match text.trim().parse::<i32>() {
            Ok(level) => {
                log::set_verbosity(level);
                log::v(3, COMPONENT, &format!("set log verbosity to {level}"));
            }
            Err(_) => log::warning(
                COMPONENT,
                &format!(
                    "failed to set log verbosity. The value of logVerbosity label should be an integer, got {text} instead."
                ),
            ),
        }
    }
}

/// The program; returns the exit code.
pub fn main() -> i32 {
    let parsed = flags::parse_or_exit("virt-tail", &FLAGS, true);
    set_verbosity(&parsed);
    let logfile = parsed.string("logfile");
    if logfile.is_empty() {
        log::v(3, COMPONENT, "logfile flags must be provided");
        return 1;
    }
    let path = OsString::from(&logfile);
    let signals = match termination_signals() {
        Ok(fd) => fd,
        Err(e) => {
            log::error(COMPONENT, "received error", Some(&e));
            return 1;
        }
    };
    let mut follower = match Follower::new(path) {
        Ok(f) => f,
        Err(e) => {
            log::v(3, COMPONENT, &format!("received error: {e}"));
            return 1;
        }
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    loop {
        follower.pump(&mut out);
        let mut fds = [
            libc::pollfd {
                fd: follower.inotify,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: signals,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: polls two descriptors we own.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, RECHECK_MS) };
        if fds[1].revents != 0 {
            follower.pump(&mut out);
            let _ = out.flush();
            return 0;
        }
        follower.drain_events();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_complete_lines_leave() {
        let mut p = b"one\r\ntwo\nthr".to_vec();
        assert_eq!(take_lines(&mut p), b"one\r\ntwo\n");
        assert_eq!(p, b"thr");
        p.extend_from_slice(b"ee\n");
        assert_eq!(take_lines(&mut p), b"three\n");
        assert!(p.is_empty());
    }

    #[test]
    fn over_long_lines_leave_in_pieces() {
        let mut p = vec![b'x'; MAX_LINE + 10];
        let out = take_lines(&mut p);
        assert_eq!(out.len(), MAX_LINE + 1);
        assert_eq!(p.len(), 10);
    }
}
