//! A tolerant async QMP client on tokio.
//!
//! Wire format (QEMU `docs/interop/qmp-spec.rst`): one JSON object per line. The server greets with
//! `{"QMP": {"version": .., "capabilities": [..]}}`; the client answers `qmp_capabilities`; then
//! commands `{"execute": NAME, "arguments": {..}, "id": ID}` get `{"return": .., "id": ID}` or
//! `{"error": {"class": .., "desc": ..}, "id": ID}`, interleaved with asynchronous
//! `{"event": NAME, "data": {..}, "timestamp": {"seconds": S, "microseconds": U}}`.
//!
//! Unlike the `qapi` crate's stream, nothing here is checked against a schema: unknown events,
//! unknown fields, replies without a known id and lines that are not JSON are logged and skipped,
//! so a newer QEMU never breaks the connection. Every command carries its own id, so commands may
//! be issued concurrently from many tasks. File descriptors ride on the same `sendmsg` as the
//! command that consumes them (`getfd`, `add-fd`), as QEMU requires.

use std::collections::HashMap;
use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use serde_json::{json, Map, Value};
use tokio::io::Interest;
use tokio::net::UnixStream;
use tokio::sync::{broadcast, oneshot, watch};

use super::QmpError;

/// Default per-command timeout used by [`QmpClient::execute`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest QMP message accepted, in bytes. `query-qmp-schema` on QEMU 10.0 is about 200 KiB;
/// a line longer than this closes the connection rather than growing memory without bound.
pub const MAX_LINE: usize = 64 << 20;

/// How many events a slow subscriber may fall behind before it misses some (it is then told how
/// many it lost).
const EVENT_BUFFER: usize = 1024;

/// One QMP event, with its data kept as untyped JSON so unknown events and fields survive.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The event name (`SHUTDOWN`, `DEVICE_DELETED`, or one this client has never heard of).
    pub name: String,
    /// The `data` member (`Value::Null` when absent).
    pub data: Value,
    /// QEMU's timestamp in microseconds since the Unix epoch (0 when absent or malformed).
    pub timestamp_us: u64,
}

/// The greeting QEMU sent (`{"QMP": {"version": ..., "capabilities": [...]}}`).
#[derive(Debug, Clone, PartialEq)]
pub struct Greeting {
    /// `(major, minor, micro)` of QEMU, `(0, 0, 0)` if the peer did not say.
    pub version: (u64, u64, u64),
    /// Distribution package string (`Debian 1:7.2+dfsg-7`), may be empty.
    pub package: String,
    /// Offered capabilities (`oob`); not enabled by this client.
    pub capabilities: Vec<String>,
}

type Reply = Result<Value, (String, String)>;

struct Pending {
    closed: Option<String>,
    waiters: HashMap<String, oneshot::Sender<Reply>>,
}

struct Inner {
    stream: Arc<UnixStream>,
    write_lock: tokio::sync::Mutex<()>,
    pending: Mutex<Pending>,
    next_id: AtomicU64,
    events: broadcast::Sender<Event>,
    closed: watch::Receiver<bool>,
    timeout: Duration,
    reader: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// A connected QMP client. Cheap to clone; all clones share one connection. The reader task ends
/// when the peer closes the connection or the last clone is dropped.
#[derive(Clone)]
pub struct QmpClient {
    inner: Arc<Inner>,
    greeting: Arc<Greeting>,
}

impl std::fmt::Debug for QmpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QmpClient")
            .field("greeting", &self.greeting)
            .finish_non_exhaustive()
    }
}

/// A subscription to the client's events. Every subscriber sees every event received after it
/// subscribed.
pub struct EventStream {
    rx: broadcast::Receiver<Event>,
    closed: watch::Receiver<bool>,
}

impl EventStream {
    /// The next event, or `None` once the connection is closed and every buffered event was read.
    /// Events missed because this subscriber lagged more than 1024 events behind are skipped (logged).
    pub async fn recv(&mut self) -> Option<Event> {
        loop {
            if *self.closed.borrow() {
                return match self.rx.try_recv() {
                    Ok(ev) => Some(ev),
                    Err(broadcast::error::TryRecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "QMP event subscriber lagged");
                        continue;
                    }
                    Err(_) => None,
                };
            }
            tokio::select! {
                r = self.rx.recv() => match r {
                    Ok(ev) => return Some(ev),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "QMP event subscriber lagged");
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
                r = self.closed.changed() => {
                    if r.is_err() {
                        // Sender gone: the reader ended; drain what is buffered.
                        let _ = self.closed.borrow_and_update();
                        return self.rx.try_recv().ok();
                    }
                }
            }
        }
    }

    /// Waits up to `timeout` for the first event for which `pred` holds; other events are skipped.
    /// Errors: [`QmpError::EventTimeout`] (naming `what`), [`QmpError::Disconnected`].
    pub async fn wait_for(
        &mut self,
        what: &str,
        subject: &str,
        timeout: Duration,
        mut pred: impl FnMut(&Event) -> bool,
    ) -> Result<Event, QmpError> {
        let fut = async {
            while let Some(ev) = self.recv().await {
                if pred(&ev) {
                    return Ok(ev);
                }
            }
            Err(QmpError::Disconnected {
                reason: format!("while waiting for {what} of {subject}"),
            })
        };
        tokio::time::timeout(timeout, fut)
            .await
            .unwrap_or_else(|_| {
                Err(QmpError::EventTimeout {
                    event: what.to_string(),
                    subject: subject.to_string(),
                    after: timeout,
                })
            })
    }
}

impl QmpClient {
    /// Connects to a QMP Unix socket, reads the greeting and negotiates capabilities, all within
    /// `timeout`. Later commands use `timeout` as their default per-command timeout too.
    /// Errors: [`QmpError::Connect`], [`QmpError::Greeting`], or the `qmp_capabilities` failure.
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Self, QmpError> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| QmpError::Connect {
                path: path.display().to_string(),
                source,
            })?;
        Self::from_stream(stream, timeout).await
    }

    /// Like [`QmpClient::connect`] on an already connected stream.
    pub async fn from_stream(stream: UnixStream, timeout: Duration) -> Result<Self, QmpError> {
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let (closed_tx, closed_rx) = watch::channel(false);
        let (greet_tx, greet_rx) = oneshot::channel();
        let stream = Arc::new(stream);
        let inner = Arc::new(Inner {
            stream: stream.clone(),
            write_lock: tokio::sync::Mutex::new(()),
            pending: Mutex::new(Pending {
                closed: None,
                waiters: HashMap::new(),
            }),
            next_id: AtomicU64::new(1),
            events,
            closed: closed_rx,
            timeout,
            reader: Mutex::new(None),
        });
        let weak = Arc::downgrade(&inner);
        let handle = tokio::spawn(reader_task(stream, weak, closed_tx, greet_tx));
        if let Ok(mut r) = inner.reader.lock() {
            *r = Some(handle);
        }
        let greeting = match tokio::time::timeout(timeout, greet_rx).await {
            Ok(Ok(g)) => g,
            Ok(Err(_)) => {
                let reason = inner
                    .pending
                    .lock()
                    .ok()
                    .and_then(|p| p.closed.clone())
                    .unwrap_or_else(|| "connection closed".into());
                return Err(QmpError::Greeting {
                    reason: format!("connection closed before the greeting: {reason}"),
                });
            }
            Err(_) => {
                return Err(QmpError::Greeting {
                    reason: format!("nothing within {timeout:?}"),
                })
            }
        };
        let client = QmpClient {
            inner,
            greeting: Arc::new(greeting),
        };
        client.execute("qmp_capabilities", None).await?;
        Ok(client)
    }

    /// QEMU's greeting.
    pub fn greeting(&self) -> &Greeting {
        &self.greeting
    }

    /// Subscribes to events received from now on.
    pub fn events(&self) -> EventStream {
        EventStream {
            rx: self.inner.events.subscribe(),
            closed: self.inner.closed.clone(),
        }
    }

    /// Whether the connection has been closed by the peer.
    pub fn is_closed(&self) -> bool {
        *self.inner.closed.borrow()
    }

    /// Runs `command` with optional `arguments` (a JSON object) and the default timeout; returns
    /// QEMU's `return` value. Errors: [`QmpError::Command`] with QEMU's class and description,
    /// [`QmpError::Timeout`], [`QmpError::Disconnected`], [`QmpError::Send`].
    pub async fn execute(
        &self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<Value, QmpError> {
        self.execute_with(command, arguments, &[], self.inner.timeout)
            .await
    }

    /// Like [`QmpClient::execute`] with its own timeout.
    pub async fn execute_timeout(
        &self,
        command: &str,
        arguments: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, QmpError> {
        self.execute_with(command, arguments, &[], timeout).await
    }

    /// Runs `command`, sending `fds` with SCM_RIGHTS on the same `sendmsg` as the command's first
    /// byte. QEMU keeps the fds for the command that consumes them (`getfd`, `add-fd`).
    /// `timeout` bounds the write and the wait for the reply separately; a write that times out
    /// half-way (QEMU not reading for that long) leaves a partial line on the socket, after which
    /// the connection should be treated as broken.
    pub async fn execute_with(
        &self,
        command: &str,
        arguments: Option<Value>,
        fds: &[BorrowedFd<'_>],
        timeout: Duration,
    ) -> Result<Value, QmpError> {
        let id = format!("ql-{}", self.inner.next_id.fetch_add(1, Ordering::Relaxed));
        let mut msg = Map::new();
        msg.insert("execute".into(), Value::String(command.into()));
        if let Some(args) = arguments {
            msg.insert("arguments".into(), args);
        }
        msg.insert("id".into(), Value::String(id.clone()));
        let mut line = Value::Object(msg).to_string().into_bytes();
        line.push(b'\n');

        let (tx, rx) = oneshot::channel();
        {
            let mut p = self
                .inner
                .pending
                .lock()
                .map_err(|_| QmpError::Disconnected {
                    reason: "client state poisoned".into(),
                })?;
            if let Some(reason) = &p.closed {
                return Err(QmpError::Disconnected {
                    reason: reason.clone(),
                });
            }
            p.waiters.insert(id.clone(), tx);
        }
        let guard = PendingGuard {
            inner: &self.inner,
            id: &id,
        };
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let send = async {
            let _w = self.inner.write_lock.lock().await;
            write_all(&self.inner.stream, &line, &raw).await
        };
        match tokio::time::timeout(timeout, send).await {
            Ok(Ok(())) => {}
            Ok(Err(source)) => {
                return Err(QmpError::Send {
                    command: command.into(),
                    source,
                })
            }
            Err(_) => {
                return Err(QmpError::Timeout {
                    command: command.into(),
                    after: timeout,
                })
            }
        }
        let reply = tokio::time::timeout(timeout, rx).await;
        drop(guard);
        match reply {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err((class, desc)))) => Err(QmpError::Command {
                command: command.into(),
                class,
                desc,
            }),
            Ok(Err(_)) => Err(QmpError::Disconnected {
                reason: self
                    .inner
                    .pending
                    .lock()
                    .ok()
                    .and_then(|p| p.closed.clone())
                    .unwrap_or_else(|| "reader stopped".into()),
            }),
            Err(_) => Err(QmpError::Timeout {
                command: command.into(),
                after: timeout,
            }),
        }
    }

    /// `getfd`: hands `fd` to QEMU under `fdname` (used by `netdev_add tap fd=NAME`).
    pub async fn getfd(&self, fdname: &str, fd: BorrowedFd<'_>) -> Result<(), QmpError> {
        self.execute_with(
            "getfd",
            Some(json!({ "fdname": fdname })),
            &[fd],
            self.inner.timeout,
        )
        .await
        .map(|_| ())
    }

    /// `add-fd`: adds `fd` to fd set `fdset_id` (a new set when `None`); returns
    /// `(fdset-id, fd)` as QEMU reports them. QEMU opens `/dev/fdset/ID` from the set.
    pub async fn add_fd(
        &self,
        fd: BorrowedFd<'_>,
        fdset_id: Option<i64>,
        opaque: Option<&str>,
    ) -> Result<(i64, i64), QmpError> {
        let mut args = Map::new();
        if let Some(id) = fdset_id {
            args.insert("fdset-id".into(), json!(id));
        }
        if let Some(o) = opaque {
            args.insert("opaque".into(), json!(o));
        }
        let r = self
            .execute_with(
                "add-fd",
                Some(Value::Object(args)),
                &[fd],
                self.inner.timeout,
            )
            .await?;
        match (r["fdset-id"].as_i64(), r["fd"].as_i64()) {
            (Some(set), Some(fd)) => Ok((set, fd)),
            _ => Err(QmpError::Reply {
                command: "add-fd".into(),
                reason: format!("expected fdset-id and fd, got {r}"),
            }),
        }
    }
}

/// Removes the pending entry when the caller stops waiting (timeout, cancellation).
struct PendingGuard<'a> {
    inner: &'a Inner,
    id: &'a str,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut p) = self.inner.pending.lock() {
            p.waiters.remove(self.id);
        }
    }
}

async fn write_all(stream: &UnixStream, mut buf: &[u8], fds: &[i32]) -> std::io::Result<()> {
    let mut fds = fds;
    while !buf.is_empty() {
        stream.writable().await?;
        let res = stream.try_io(Interest::WRITABLE, || {
            let iov = [IoSlice::new(buf)];
            let cmsg = [ControlMessage::ScmRights(fds)];
            let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
            sendmsg::<()>(
                stream.as_raw_fd(),
                &iov,
                cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(std::io::Error::from)
        });
        match res {
            Ok(n) => {
                buf = &buf[n..];
                fds = &[];
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn reader_task(
    stream: Arc<UnixStream>,
    weak: std::sync::Weak<Inner>,
    closed_tx: watch::Sender<bool>,
    greet_tx: oneshot::Sender<Greeting>,
) {
    let mut greet_tx = Some(greet_tx);
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let reason = loop {
        if let Err(e) = stream.readable().await {
            break format!("read error: {e}");
        }
        let n = match stream.try_read(&mut chunk) {
            Ok(0) => {
                let rest = buf.iter().filter(|b| !b.is_ascii_whitespace()).count();
                break if rest == 0 {
                    "EOF".to_string()
                } else {
                    format!("EOF inside a partial message of {} bytes", buf.len())
                };
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => break format!("read error: {e}"),
        };
        buf.extend_from_slice(&chunk[..n]);
        // Hold the client state only while dispatching, so dropping the last client ends us.
        let Some(inner) = weak.upgrade() else {
            break "client dropped".to_string();
        };
        let mut start = 0;
        while let Some(pos) = buf[start..].iter().position(|&b| b == b'\n') {
            let line = &buf[start..start + pos];
            start += pos + 1;
            dispatch(&inner, line, &mut greet_tx);
        }
        buf.drain(..start);
        if buf.len() > MAX_LINE {
            break format!("message longer than {MAX_LINE} bytes");
        }
        drop(inner);
    };
    tracing::debug!(%reason, "QMP reader stopped");
    if let Some(inner) = weak.upgrade() {
        if let Ok(mut p) = inner.pending.lock() {
            p.closed = Some(reason);
            // Dropping the senders wakes every waiter with Disconnected.
            p.waiters.clear();
        }
    }
    let _ = closed_tx.send(true);
}

fn dispatch(inner: &Inner, line: &[u8], greet_tx: &mut Option<oneshot::Sender<Greeting>>) {
    let text = String::from_utf8_lossy(line);
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return;
    }
    let msg: Map<String, Value> = match serde_json::from_str(trimmed) {
        Ok(Value::Object(m)) => m,
        _ => {
            tracing::warn!(line = %truncate(trimmed), "QMP: skipping a line that is not a JSON object");
            return;
        }
    };
    if let Some(q) = msg.get("QMP") {
        if let Some(tx) = greet_tx.take() {
            let _ = tx.send(parse_greeting(q));
        }
        return;
    }
    if let Some(name) = msg.get("event").and_then(Value::as_str) {
        let ts = &msg.get("timestamp").cloned().unwrap_or(Value::Null);
        let timestamp_us = ts["seconds"].as_u64().unwrap_or(0) * 1_000_000
            + ts["microseconds"].as_u64().unwrap_or(0);
        let ev = Event {
            name: name.to_string(),
            data: msg.get("data").cloned().unwrap_or(Value::Null),
            timestamp_us,
        };
        let _ = inner.events.send(ev);
        return;
    }
    let reply: Reply = if let Some(v) = msg.get("return") {
        Ok(v.clone())
    } else if let Some(e) = msg.get("error") {
        Err((
            e["class"].as_str().unwrap_or("Unknown").to_string(),
            e["desc"].as_str().unwrap_or("").to_string(),
        ))
    } else {
        tracing::warn!(line = %truncate(trimmed), "QMP: skipping a message that is neither reply nor event");
        return;
    };
    let id = match msg.get("id") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => {
            tracing::warn!(line = %truncate(trimmed), "QMP: reply without id (QEMU could not parse a request)");
            return;
        }
    };
    let waiter = inner
        .pending
        .lock()
        .ok()
        .and_then(|mut p| p.waiters.remove(&id));
    match waiter {
        Some(tx) => {
            let _ = tx.send(reply);
        }
        None => tracing::debug!(%id, "QMP: reply for a command nobody waits for"),
    }
}

fn parse_greeting(q: &Value) -> Greeting {
    let v = &q["version"]["qemu"];
    Greeting {
        version: (
            v["major"].as_u64().unwrap_or(0),
            v["minor"].as_u64().unwrap_or(0),
            v["micro"].as_u64().unwrap_or(0),
        ),
        package: q["version"]["package"].as_str().unwrap_or("").to_string(),
        capabilities: q["capabilities"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(200) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut r) = self.reader.lock() {
            if let Some(h) = r.take() {
                h.abort();
            }
        }
    }
}
