//! `container-disk`: the program KubeVirt runs inside containerDisk and hotplug-attachment
//! containers, as `cmd/container-disk-v2alpha/main.c` (v1.9.0) behaves.
//!
//! - `--no-op` exits 0 at once (the `volume*-init` containers: they only make the kubelet pull
//!   the image).
//! - `--copy-path PATH` (also `--copy-path=PATH`, `-c PATH`, `-cPATH`, or any unique prefix of
//!   the long name, as getopt_long takes it) makes `dirname(PATH)` if it is missing (one level,
//!   mode 0777 less the umask), listens on the Unix stream socket `PATH.sock` (backlog 50), and
//!   holds it: every second it checks that `PATH.sock` still exists (gone: exit 0, which is how a
//!   holder ends when virt-launcher-monitor deletes the sockets on its way out) and accepts and
//!   closes every pending connection (virt-handler only connects to read the holder's pid with
//!   `SO_PEERCRED`).
//! - SIGTERM unlinks the socket and exits 0; SIGINT keeps its default action.
//! - Options are read left to right and non-options are skipped (GNU getopt permutes); an
//!   unknown option, a missing value, a value given to `--no-op`, a PATH longer than 102 bytes
//!   (108-byte `sun_path` less `.sock` and the NUL), no `--copy-path` at all, a directory that
//!   cannot be made, or a socket that cannot be bound (a stale `PATH.sock` too) exits 1; so does
//!   an `accept` error other than "nothing pending".
//! - Errors go to stderr after an `asctime`-style time line; nothing else is printed.
//!
//! Links std and libc only, and the image's build links it statically (containerDisk images are
//! usually `FROM scratch`): it needs no file of its own at run time.

use std::ffi::{CString, OsString};
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::Duration;

/// The longest `--copy-path` (bytes) that leaves room for `.sock` and the NUL in `sun_path`.
pub const MAX_COPY_PATH: usize = 102;
/// The socket's listen backlog (main.c `LISTEN_BACKLOG`).
pub const LISTEN_BACKLOG: libc::c_int = 50;
/// The pause between two checks when nothing connected.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `--no-op`: exit 0.
    NoOp,
    /// `--copy-path PATH`: hold `PATH.sock`.
    Hold(OsString),
}

/// Why the command line was refused (exit 1): getopt's own message (printed as
/// `container-disk: <message>`), or main.c's (printed through [`error_log`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Usage {
    /// getopt's message: unknown or ambiguous option, missing or unexpected value.
    Getopt(String),
    /// main.c's message: the path is too long, or none was given.
    Invalid(String),
}

const LONG: [(&str, bool); 2] = [("copy-path", true), ("no-op", false)];

/// Reads the arguments (without the program name) as main.c's getopt_long loop does.
///
/// Errors: getopt's message for an unknown or ambiguous option, a missing value or a value given
/// to `--no-op`; the length message for a PATH over [`MAX_COPY_PATH`] bytes; "no --copy-path"
/// when neither option is given.
pub fn parse(args: &[OsString]) -> Result<Action, Usage> {
    let mut copy_path: Option<OsString> = None;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_bytes();
        i += 1;
        if arg == b"--" {
            break;
        }
        if arg.len() < 2 || arg[0] != b'-' {
            continue; // a non-option: getopt moves it to the end; main.c ignores them
        }
        let value = if let Some(long) = arg.strip_prefix(b"--") {
            let (name, inline) = match long.iter().position(|b| *b == b'=') {
                Some(eq) => (&long[..eq], Some(&long[eq + 1..])),
                None => (long, None),
            };
            let name_text = String::from_utf8_lossy(name).into_owned();
            let matches: Vec<&(&str, bool)> = LONG
                .iter()
                .filter(|(n, _)| n.as_bytes() == name)
                .chain(
                    LONG.iter()
                        .filter(|(n, _)| n.as_bytes() != name && n.as_bytes().starts_with(name)),
                )
                .collect();
            let (full, takes_value) = match matches.as_slice() {
                [one] => **one,
                [exact, ..] if exact.0.as_bytes() == name => **exact,
                [] => {
                    return Err(Usage::Getopt(format!(
                        "unrecognized option '--{name_text}'"
                    )))
                }
                _ => {
                    return Err(Usage::Getopt(format!(
                        "option '--{name_text}' is ambiguous"
                    )))
                }
            };
            if !takes_value {
                if inline.is_some() {
                    return Err(Usage::Getopt(format!(
                        "option '--{full}' doesn't allow an argument"
                    )));
                }
                return Ok(Action::NoOp);
            }
            match inline {
                Some(v) => v.to_vec(),
                None if i < args.len() => {
                    i += 1;
                    args[i - 1].as_bytes().to_vec()
                }
                None => {
                    return Err(Usage::Getopt(format!(
                        "option '--{full}' requires an argument"
                    )))
                }
            }
        } else {
            // Short options: only `c`, which takes the rest of the word or the next word.
            let c = arg[1];
            if c != b'c' {
                return Err(Usage::Getopt(format!("invalid option -- '{}'", c as char)));
            }
            if arg.len() > 2 {
                arg[2..].to_vec()
            } else if i < args.len() {
                i += 1;
                args[i - 1].as_bytes().to_vec()
            } else {
                return Err(Usage::Getopt("option requires an argument -- 'c'".into()));
            }
        };
        if value.len() > MAX_COPY_PATH {
            return Err(Usage::Invalid(format!(
                "copy path can not be longer than {MAX_COPY_PATH} characters"
            )));
        }
        copy_path = Some(OsString::from_vec(value));
    }
    match copy_path {
        Some(p) => Ok(Action::Hold(p)),
        None => Err(Usage::Invalid("no --copy-path given".into())),
    }
}

/// POSIX `dirname` of a path (bytes): `.` for a name without a slash, `/` for the root.
pub fn dirname(path: &[u8]) -> &[u8] {
    let trimmed = {
        let mut end = path.len();
        while end > 1 && path[end - 1] == b'/' {
            end -= 1;
        }
        &path[..end]
    };
    match trimmed.iter().rposition(|b| *b == b'/') {
        None => b".",
        Some(slash) => {
            let mut end = slash;
            while end > 0 && trimmed[end - 1] == b'/' {
                end -= 1;
            }
            if end == 0 {
                b"/"
            } else {
                &trimmed[..end]
            }
        }
    }
}

/// The socket path to unlink on SIGTERM (a leaked `CString`), null until bound.
static SOCKET: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_sigterm(_: libc::c_int) {
    let path = SOCKET.load(Ordering::SeqCst);
    // SAFETY: unlink and _exit are async-signal-safe; `path` is null or a NUL-terminated string
    // leaked for the life of the process.
    unsafe {
        if !path.is_null() {
            libc::unlink(path);
        }
        libc::_exit(0);
    }
}

/// Writes main.c's error form: an `asctime` line (UTC: the containerDisk image has no zone
/// files), then `error: <message>`.
pub fn error_log(message: &str) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    let _ = write!(
        std::io::stderr().lock(),
        "{}\nerror: {message}\n",
        asctime(now)
    );
}

/// C's `asctime` text of a Unix time in UTC, without the newline: `Wed Dec  2 04:55:14 2026`.
pub fn asctime(secs: i64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = secs.div_euclid(86_400);
    let (y, m, d) = crate::log::civil_from_days(days);
    let t = secs.rem_euclid(86_400);
    format!(
        "{} {}{:3} {:02}:{:02}:{:02} {y}",
        DAYS[days.rem_euclid(7) as usize],
        MONTHS[(m - 1) as usize],
        d,
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

fn fail(message: &str) -> ! {
    error_log(message);
    std::process::exit(1)
}

/// The program: parses the process's arguments and runs; returns only through `exit`.
pub fn main() -> ! {
    let sigterm = on_sigterm as extern "C" fn(libc::c_int);
    // SAFETY: installs a handler that only calls async-signal-safe functions.
    if unsafe { libc::signal(libc::SIGTERM, sigterm as libc::sighandler_t) } == libc::SIG_ERR {
        fail("failed to register SIGTERM callback");
    }
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let path = match parse(&args) {
        Ok(Action::NoOp) => std::process::exit(0),
        Ok(Action::Hold(path)) => path,
        Err(Usage::Getopt(message)) => {
            let _ = writeln!(std::io::stderr().lock(), "container-disk: {message}");
            std::process::exit(1)
        }
        Err(Usage::Invalid(message)) => fail(&message),
    };
    hold(path.as_bytes())
}

/// Makes the directory, binds and listens on `copy_path.sock`, and holds it until it is removed
/// (exit 0) or an error (exit 1).
pub fn hold(copy_path: &[u8]) -> ! {
    let dir = dirname(copy_path);
    let dir_c = CString::new(dir).unwrap_or_else(|_| fail("copy path contains a NUL byte"));
    // SAFETY: plain syscalls on a NUL-terminated path and a zeroed stat buffer.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::stat(dir_c.as_ptr(), &mut st) == -1 && libc::mkdir(dir_c.as_ptr(), 0o777) != 0 {
            fail(&format!(
                "failed to create disk directory {}",
                String::from_utf8_lossy(dir)
            ));
        }
    }
    let mut socket_path = copy_path.to_vec();
    socket_path.extend_from_slice(b".sock");
    let shown = String::from_utf8_lossy(&socket_path).into_owned();
    let socket_c =
        CString::new(socket_path.clone()).unwrap_or_else(|_| fail("copy path contains a NUL byte"));
    // SAFETY: socket/fcntl/bind/listen on our own descriptor with a zeroed, filled sockaddr_un
    // whose path (at most 107 bytes with its NUL) fits `sun_path`.
    let fd = unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd == -1 {
            fail(&format!("failed to create socket on {shown}"));
        }
        libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK);
        let mut address: libc::sockaddr_un = std::mem::zeroed();
        address.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (slot, byte) in address.sun_path.iter_mut().zip(&socket_path) {
            *slot = *byte as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        if libc::bind(fd, &address as *const _ as *const libc::sockaddr, len) == -1 {
            fail(&format!("failed to bind socket {shown}"));
        }
        if libc::listen(fd, LISTEN_BACKLOG) == -1 {
            fail(&format!("failed to listen socket {shown}"));
        }
        fd
    };
    SOCKET.store(socket_c.into_raw(), Ordering::SeqCst);
    let mut accepted = false;
    loop {
        if !accepted {
            std::thread::sleep(CHECK_INTERVAL);
        }
        let path = SOCKET.load(Ordering::SeqCst);
        // SAFETY: `path` is the leaked NUL-terminated socket path; `st` a zeroed buffer.
        let exists = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            libc::stat(path, &mut st) == 0
        };
        if !exists {
            error_log(&format!("socket {shown} does not exist anymore"));
            std::process::exit(0);
        }
        // SAFETY: accept on our listening descriptor without an address buffer; close its result.
        let conn = unsafe { libc::accept(fd, std::ptr::null_mut(), std::ptr::null_mut()) };
        if conn == -1 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if errno == libc::EAGAIN || errno == libc::EWOULDBLOCK {
                accepted = false;
                continue;
            }
            fail(&format!(
                "failed to accept connections on the socket: {errno}"
            ));
        }
        accepted = true;
        // SAFETY: closes the descriptor accept just returned.
        unsafe { libc::close(conn) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    #[test]
    fn getopt_forms() {
        let hold = |p: &str| Ok(Action::Hold(p.into()));
        assert_eq!(parse(&args(&["--copy-path", "/a/b"])), hold("/a/b"));
        assert_eq!(parse(&args(&["--copy-path=/a/b"])), hold("/a/b"));
        assert_eq!(parse(&args(&["--copy", "/a/b"])), hold("/a/b"));
        assert_eq!(parse(&args(&["-c", "/a/b"])), hold("/a/b"));
        assert_eq!(parse(&args(&["-c/a/b"])), hold("/a/b"));
        assert_eq!(
            parse(&args(&["x", "-c", "/a", "y", "-c", "/b"])),
            hold("/b")
        );
        assert_eq!(parse(&args(&["--no-op"])), Ok(Action::NoOp));
        assert_eq!(parse(&args(&["--no"])), Ok(Action::NoOp));
        assert_eq!(parse(&args(&["--no-op", "--bogus"])), Ok(Action::NoOp));
        assert_eq!(parse(&args(&["-c", "/a", "--no-op"])), Ok(Action::NoOp));
        assert!(parse(&args(&["--bogus", "--no-op"])).is_err());
        assert!(parse(&args(&["--no-op=1"])).is_err());
        assert!(parse(&args(&["--copy-path"])).is_err());
        assert!(parse(&args(&["-x"])).is_err());
        assert!(parse(&args(&[])).is_err());
        assert!(parse(&args(&["--", "--no-op"])).is_err());
        assert_eq!(parse(&args(&[&"a".repeat(102)])).ok(), None);
        assert_eq!(
            parse(&args(&["-c", &"a".repeat(102)])),
            hold(&"a".repeat(102))
        );
        assert!(parse(&args(&["-c", &"a".repeat(103)])).is_err());
    }

    #[test]
    fn posix_dirname() {
        assert_eq!(dirname(b"/path/hp"), b"/path");
        assert_eq!(dirname(b"hp"), b".");
        assert_eq!(dirname(b"/hp"), b"/");
        assert_eq!(dirname(b"/a/b//"), b"/a");
        assert_eq!(dirname(b"a//b"), b"a");
        assert_eq!(dirname(b"/"), b"/");
        assert_eq!(dirname(b""), b".");
    }

    #[test]
    fn asctime_text() {
        assert_eq!(asctime(0), "Thu Jan  1 00:00:00 1970");
        assert_eq!(asctime(1_796_187_314), "Wed Dec  2 04:55:14 2026");
    }
}
