//! `-chardev` (key=value only, even on QEMU 10) for sockets and files.

use super::KeyVal;

/// Where a socket chardev listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketAddr {
    /// A unix socket path QEMU binds (`path=...,server=on,wait=off`).
    Path(String),
    /// An inherited listening socket fd (`fd=N,server=on,wait=off`).
    Fd(i32),
}

/// A unix socket chardev (`-chardev socket,id=..,path=..,server=on,wait=off[,logfile=..,logappend=on]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChardevSocket {
    /// Chardev id (`charserial0`, `charchannel0`, `charmonitor`).
    pub id: String,
    /// Listening address.
    pub addr: SocketAddr,
    /// `true`: QEMU listens (libvirt's `mode="bind"`); `false`: QEMU connects (swtpm).
    pub server: bool,
    /// Log file receiving everything the guest writes (serial console log).
    pub logfile: Option<String>,
}

impl ChardevSocket {
    /// The `-chardev` argument.
    pub fn to_arg(&self) -> String {
        let kv = KeyVal::with_head("socket").kv("id", &self.id);
        let kv = match &self.addr {
            SocketAddr::Path(p) => kv.kv("path", p),
            SocketAddr::Fd(fd) => kv.kv("fd", fd.to_string()),
        };
        let kv = if self.server {
            kv.on_off("server", true).on_off("wait", false)
        } else {
            kv
        };
        match &self.logfile {
            Some(l) => kv.kv("logfile", l).on_off("logappend", true),
            None => kv,
        }
        .finish()
    }
}
