//! The QEMU guest agent client: `GuestPing`, `Exec` and the guest interfaces of `GetDomain`,
//! spoken directly on the `org.qemu.guest_agent.0` virtio-serial chardev socket
//! (`<private>/<vmi uid>/org.qemu.guest_agent.0`, QEMU listening) instead of through libvirt's
//! `virDomainQemuAgentCommand`.
//!
//! Protocol (QEMU `qga/qapi-schema.json`, libvirt `qemu_agent.c`): one JSON object per line each
//! way. As libvirt does before every command, the client first synchronises: it sends
//! `guest-sync-delimited` with a fresh id, drops everything up to the `0xFF` byte the agent puts
//! before its answer (stale output of an earlier, timed-out exchange), and reads answers until
//! the one echoing the id. The connection is kept between commands and dropped after any error
//! or timeout; commands are serialised (the agent answers in order, one client at a time).
//!
//! `Exec` follows KubeVirt's `agent.GuestExec` (`pkg/virt-launcher/virtwrap/agent/exec.go`,
//! v1.9.0): `guest-exec` with `capture-output`, a pid of 0 or less is an error, then
//! `guest-exec-status` every `timeoutSeconds` x 100 ms until the command exited or
//! `timeoutSeconds` passed; `out-data` is base64; a non-zero exit code is returned with the
//! output (the RPC still succeeds), a command still running at the deadline is an error.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::Mutex;

use crate::sync::domain::InterfaceStatus;
pub use crate::sync::guest::error::AgentError;
use crate::sync::rpc::manager::ExecOutput;

/// The timeout of one agent command when the caller gives none (libvirt's agent default, 5 s).
pub const DEFAULT_AGENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest answer line accepted from the guest (a guest is not trusted to end its lines).
const MAX_LINE: u64 = 16 << 20;

/// A guest agent client for the running domain.
#[derive(Debug, Default)]
pub struct GuestAgent {
    socket: StdMutex<Option<PathBuf>>,
    conn: Mutex<Option<BufReader<UnixStream>>>,
    next_id: AtomicU64,
}

impl GuestAgent {
    /// A client with no socket yet (no domain).
    pub fn new() -> GuestAgent {
        GuestAgent {
            next_id: AtomicU64::new(std::process::id() as u64 * 1000),
            ..GuestAgent::default()
        }
    }

    /// Sets the agent socket of the running domain (from the converted plan).
    pub fn set_socket(&self, path: PathBuf) {
        *self.socket.lock().unwrap_or_else(|e| e.into_inner()) = Some(path);
    }

    /// Whether a domain with an agent channel is known.
    pub fn has_socket(&self) -> bool {
        self.socket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// The agent socket of the running domain; [`AgentError::NoDomain`] before one is known.
    fn socket_path(&self) -> Result<PathBuf, AgentError> {
        self.socket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(AgentError::NoDomain)
    }

    /// The channel in `conn`, connected to `socket` first when there is none, after a
    /// `guest-sync-delimited` with a fresh id.
    async fn synced<'a>(
        &self,
        conn: &'a mut Option<BufReader<UnixStream>>,
        socket: &Path,
    ) -> Result<&'a mut BufReader<UnixStream>, AgentError> {
        if conn.is_none() {
            let stream =
                UnixStream::connect(socket)
                    .await
                    .map_err(|source| AgentError::Connect {
                        path: socket.to_path_buf(),
                        source,
                    })?;
            *conn = Some(BufReader::new(stream));
        }
        let Some(stream) = conn.as_mut() else {
            return Err(AgentError::NoDomain);
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        sync(stream, id).await?;
        Ok(stream)
    }

    /// Runs one agent command within `timeout` (sync included); returns its `return` value.
    ///
    /// # Errors
    /// [`AgentError::NoDomain`] before a domain is known; [`AgentError::Connect`],
    /// [`AgentError::Io`], [`AgentError::Timeout`] (no agent answering, e.g. none
    /// installed in the guest), [`AgentError::Reply`] for an answer that is not an agent
    /// reply, [`AgentError::Command`] for the agent's own error.
    pub async fn command(
        &self,
        execute: &str,
        arguments: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, AgentError> {
        let socket = self.socket_path()?;
        let mut conn = self.conn.lock().await;
        let outcome = tokio::time::timeout(timeout, async {
            let stream = self.synced(&mut conn, &socket).await?;
            let mut request = json!({ "execute": execute });
            if let Some(a) = arguments {
                request["arguments"] = a;
            }
            send(stream, execute, &request).await?;
            let answer = read_answer(stream, execute).await?;
            reply_value(execute, answer)
        })
        .await;
        let result = match outcome {
            Ok(r) => r,
            Err(_) => Err(AgentError::Timeout {
                command: execute.to_string(),
                waited: timeout,
            }),
        };
        if matches!(
            result,
            Err(AgentError::Io { .. }
                | AgentError::Timeout { .. }
                | AgentError::Reply { .. }
                | AgentError::Connect { .. })
        ) {
            *conn = None;
        }
        result
    }

    /// `guest-ping` within `timeout` (KubeVirt's `GuestPing`; 0 means the default 5 s).
    ///
    /// # Errors
    /// As [`GuestAgent::command`].
    pub async fn ping(&self, timeout: Duration) -> Result<(), AgentError> {
        let timeout = if timeout.is_zero() {
            DEFAULT_AGENT_TIMEOUT
        } else {
            timeout
        };
        self.command("guest-ping", None, timeout).await.map(|_| ())
    }

    /// Runs `command args...` in the guest with KubeVirt's `GuestExec` semantics (module doc).
    ///
    /// # Errors
    /// As [`GuestAgent::command`]; [`AgentError::Reply`] for a pid of 0 or less or
    /// undecodable output; [`AgentError::ExecTimeout`] when the command still runs after
    /// `timeout`.
    pub async fn exec(
        &self,
        command: &str,
        args: &[String],
        timeout: Duration,
    ) -> Result<ExecOutput, AgentError> {
        let started = self
            .command(
                "guest-exec",
                Some(json!({ "path": command, "arg": args, "capture-output": true })),
                DEFAULT_AGENT_TIMEOUT,
            )
            .await?;
        let pid = started["pid"].as_i64().unwrap_or(0);
        if pid <= 0 {
            return Err(AgentError::Reply {
                command: "guest-exec".into(),
                reason: format!("invalid pid [{pid}] returned: {started}"),
            });
        }
        let interval = (timeout / 10).max(Duration::from_millis(10));
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let status = self
                .command(
                    "guest-exec-status",
                    Some(json!({ "pid": pid })),
                    DEFAULT_AGENT_TIMEOUT,
                )
                .await?;
            if status["exited"].as_bool() == Some(true) {
                return exec_output(&status);
            }
            tokio::time::sleep(interval).await;
            if tokio::time::Instant::now() > deadline {
                return Err(AgentError::ExecTimeout {
                    pid,
                    command: command.to_string(),
                });
            }
        }
    }

    /// `guest-shutdown` with `mode: powerdown`, libvirt's agent shutdown (the first step of its
    /// default shutdown mode, `virDomainShutdown` with no flags, which KubeVirt's graceful
    /// shutdown calls). The agent answers this command only when it fails (QGA's
    /// `success-response: false`), so after the sync it waits `answer_wait` for an answer: an
    /// error answer is the agent's refusal, silence (or the channel closing as the guest goes
    /// down) means the guest is shutting down.
    ///
    /// # Errors
    /// As [`GuestAgent::command`] for the connection and the sync within `timeout` (no agent:
    /// the caller falls back to the ACPI button); [`AgentError::Command`] when the agent
    /// refuses (e.g. `CommandNotFound` from an agent without it).
    pub async fn shutdown(
        &self,
        timeout: Duration,
        answer_wait: Duration,
    ) -> Result<(), AgentError> {
        self.shutdown_mode("powerdown", timeout, answer_wait).await
    }

    /// `guest-shutdown` with `mode: reboot`, libvirt's agent reboot (`virDomainReboot` with
    /// `VIR_DOMAIN_REBOOT_GUEST_AGENT`, KubeVirt's `SoftRebootVMI` while the agent is
    /// connected); answers as [`GuestAgent::shutdown`].
    ///
    /// # Errors
    /// As [`GuestAgent::shutdown`].
    pub async fn reboot(&self, timeout: Duration, answer_wait: Duration) -> Result<(), AgentError> {
        self.shutdown_mode("reboot", timeout, answer_wait).await
    }

    async fn shutdown_mode(
        &self,
        mode: &'static str,
        timeout: Duration,
        answer_wait: Duration,
    ) -> Result<(), AgentError> {
        const SHUTDOWN: &str = "guest-shutdown";
        let socket = self.socket_path()?;
        let mut conn = self.conn.lock().await;
        let sent = tokio::time::timeout(timeout, async {
            let stream = self.synced(&mut conn, &socket).await?;
            send(
                stream,
                SHUTDOWN,
                &json!({"execute": SHUTDOWN, "arguments": {"mode": mode}}),
            )
            .await
        })
        .await
        .unwrap_or_else(|_| {
            Err(AgentError::Timeout {
                command: SHUTDOWN.to_string(),
                waited: timeout,
            })
        });
        if let Err(e) = sent {
            *conn = None;
            return Err(e);
        }
        let Some(stream) = conn.as_mut() else {
            return Err(AgentError::NoDomain);
        };
        let answer = tokio::time::timeout(answer_wait, read_answer(stream, SHUTDOWN)).await;
        // The channel is not reused: the guest is going down or the agent said no.
        *conn = None;
        match answer {
            Ok(Ok(answer)) => reply_value(SHUTDOWN, answer).map(drop),
            // Silence or the port closing: the agent took it.
            Ok(Err(_)) | Err(_) => Ok(()),
        }
    }

    /// The guest's interfaces as KubeVirt's agent poller reports them (`lo` left out; the first
    /// IPv4 address is the interface's `Ip`, else its first address).
    ///
    /// # Errors
    /// As [`GuestAgent::command`] for `guest-network-get-interfaces`.
    pub async fn interfaces(&self, timeout: Duration) -> Result<Vec<InterfaceStatus>, AgentError> {
        let v = self
            .command("guest-network-get-interfaces", None, timeout)
            .await?;
        Ok(interfaces_from(&v))
    }
}

async fn send(
    stream: &mut BufReader<UnixStream>,
    command: &str,
    request: &Value,
) -> Result<(), AgentError> {
    let mut line = request.to_string().into_bytes();
    line.push(b'\n');
    stream
        .get_mut()
        .write_all(&line)
        .await
        .map_err(|source| AgentError::Io {
            command: command.to_string(),
            source,
        })
}

/// `guest-sync-delimited`: skips to the agent's `0xFF`, then reads answers until ours.
async fn sync(stream: &mut BufReader<UnixStream>, id: u64) -> Result<(), AgentError> {
    const SYNC: &str = "guest-sync-delimited";
    send(
        stream,
        SYNC,
        &json!({"execute": SYNC, "arguments": {"id": id}}),
    )
    .await?;
    let io = |source| AgentError::Io {
        command: SYNC.into(),
        source,
    };
    let mut skipped = Vec::new();
    let n = (&mut *stream)
        .take(MAX_LINE)
        .read_until(0xFF, &mut skipped)
        .await
        .map_err(io)?;
    if n == 0 || skipped.last() != Some(&0xFF) {
        return Err(closed(SYNC));
    }
    loop {
        let answer = read_answer(stream, SYNC).await?;
        if answer["return"].as_u64() == Some(id) {
            return Ok(());
        }
    }
}

fn closed(command: &str) -> AgentError {
    AgentError::Io {
        command: command.to_string(),
        source: std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the agent channel closed",
        ),
    }
}

/// Reads the next JSON line (blank lines and `0xFF` delimiters skipped).
async fn read_answer(
    stream: &mut BufReader<UnixStream>,
    command: &str,
) -> Result<Value, AgentError> {
    loop {
        let mut line = Vec::new();
        let n = (&mut *stream)
            .take(MAX_LINE)
            .read_until(b'\n', &mut line)
            .await
            .map_err(|source| AgentError::Io {
                command: command.to_string(),
                source,
            })?;
        if n == 0 {
            return Err(closed(command));
        }
        let text: Vec<u8> = line.into_iter().filter(|&b| b != 0xFF).collect();
        let text = String::from_utf8_lossy(&text);
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        return serde_json::from_str(text).map_err(|e| AgentError::Reply {
            command: command.to_string(),
            reason: format!("not JSON ({e}): {text}"),
        });
    }
}

/// The `return` of an agent answer, or its error.
fn reply_value(command: &str, answer: Value) -> Result<Value, AgentError> {
    if let Some(e) = answer.get("error") {
        return Err(AgentError::Command {
            command: command.to_string(),
            class: e["class"].as_str().unwrap_or_default().to_string(),
            desc: e["desc"].as_str().unwrap_or_default().to_string(),
        });
    }
    match answer.get("return") {
        Some(v) => Ok(v.clone()),
        None => Err(AgentError::Reply {
            command: command.to_string(),
            reason: format!("neither return nor error: {answer}"),
        }),
    }
}

/// The output of an exited `guest-exec-status`.
fn exec_output(status: &Value) -> Result<ExecOutput, AgentError> {
    let data = status["out-data"].as_str().unwrap_or_default();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| AgentError::Reply {
            command: "guest-exec-status".into(),
            reason: format!("out-data is not base64: {e}"),
        })?;
    let exit_code = status["exitcode"]
        .as_i64()
        .and_then(|c| i32::try_from(c).ok())
        .unwrap_or(0);
    Ok(ExecOutput {
        exit_code,
        stdout: String::from_utf8_lossy(&bytes).into_owned(),
    })
}

/// KubeVirt's `convertToInterfaces` over a `guest-network-get-interfaces` answer.
fn interfaces_from(v: &Value) -> Vec<InterfaceStatus> {
    let mut out = Vec::new();
    for iface in v.as_array().into_iter().flatten() {
        let name = iface["name"].as_str().unwrap_or_default();
        if name == "lo" {
            continue;
        }
        let mut ip = String::new();
        let mut ips = Vec::new();
        for a in iface["ip-addresses"].as_array().into_iter().flatten() {
            let Some(addr) = a["ip-address"].as_str() else {
                continue;
            };
            if ip.is_empty() && a["ip-address-type"].as_str() == Some("ipv4") {
                ip = addr.to_string();
            }
            ips.push(addr.to_string());
        }
        if ip.is_empty() {
            ip = ips.first().cloned().unwrap_or_default();
        }
        out.push(InterfaceStatus {
            mac: iface["hardware-address"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            ip,
            ips,
            interface_name: name.to_string(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interfaces_skip_lo_and_prefer_ipv4() {
        let v = json!([
            {"name": "lo", "hardware-address": "00:00:00:00:00:00",
             "ip-addresses": [{"ip-address-type": "ipv4", "ip-address": "127.0.0.1", "prefix": 8}]},
            {"name": "eth0", "hardware-address": "02:00:00:aa:bb:cc",
             "ip-addresses": [
                {"ip-address-type": "ipv6", "ip-address": "fd10:0:2::2", "prefix": 120},
                {"ip-address-type": "ipv4", "ip-address": "10.0.2.2", "prefix": 24}]},
            {"name": "eth1", "hardware-address": "02:00:00:aa:bb:cd",
             "ip-addresses": [{"ip-address-type": "ipv6", "ip-address": "fe80::1", "prefix": 64}]},
            {"name": "eth2", "hardware-address": "02:00:00:aa:bb:ce"}
        ]);
        assert_eq!(
            interfaces_from(&v),
            vec![
                InterfaceStatus {
                    mac: "02:00:00:aa:bb:cc".into(),
                    ip: "10.0.2.2".into(),
                    ips: vec!["fd10:0:2::2".into(), "10.0.2.2".into()],
                    interface_name: "eth0".into(),
                },
                InterfaceStatus {
                    mac: "02:00:00:aa:bb:cd".into(),
                    ip: "fe80::1".into(),
                    ips: vec!["fe80::1".into()],
                    interface_name: "eth1".into(),
                },
                InterfaceStatus {
                    mac: "02:00:00:aa:bb:ce".into(),
                    ip: String::new(),
                    ips: vec![],
                    interface_name: "eth2".into(),
                },
            ]
        );
    }

    #[test]
    fn exec_status_decodes_output_and_exit_code() {
        let s = json!({"exited": true, "exitcode": 3, "out-data": "aGVsbG8K"});
        assert_eq!(
            exec_output(&s).unwrap(),
            ExecOutput {
                exit_code: 3,
                stdout: "hello\n".into()
            }
        );
        let empty = json!({"exited": true, "exitcode": 0});
        assert_eq!(exec_output(&empty).unwrap(), ExecOutput::default());
        let bad = json!({"exited": true, "exitcode": 0, "out-data": "!!"});
        assert!(matches!(exec_output(&bad), Err(AgentError::Reply { .. })));
    }

    #[test]
    fn agent_errors_and_malformed_answers() {
        let e = reply_value(
            "guest-foo",
            json!({"error": {"class": "CommandNotFound", "desc": "nope"}}),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "guest agent command guest-foo failed: CommandNotFound: nope"
        );
        assert!(matches!(
            reply_value("guest-ping", json!({"foo": 1})),
            Err(AgentError::Reply { .. })
        ));
        assert_eq!(
            reply_value("guest-ping", json!({"return": {}})).unwrap(),
            json!({})
        );
    }

    /// A peer playing the agent on a socketpair: stale output, the delimiter, then answers.
    #[tokio::test]
    async fn sync_skips_stale_output_then_runs_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("org.qemu.guest_agent.0");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let peer = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let mut s = BufReader::new(s);
            for _ in 0..2 {
                let mut line = String::new();
                s.read_line(&mut line).await.unwrap();
                let req: Value = serde_json::from_str(&line).unwrap();
                let bytes = match req["execute"].as_str().unwrap() {
                    // Stale output of an earlier exchange, the delimiter, then the sync answer.
                    "guest-sync-delimited" => {
                        let mut b = b"{\"return\": 7}\n".to_vec();
                        b.push(0xFF);
                        b.extend_from_slice(
                            format!("{{\"return\": {}}}\n", req["arguments"]["id"]).as_bytes(),
                        );
                        b
                    }
                    "guest-ping" => b"{\"return\": {}}\n".to_vec(),
                    other => panic!("unexpected {other}"),
                };
                s.get_mut().write_all(&bytes).await.unwrap();
            }
        });
        let agent = GuestAgent::new();
        agent.set_socket(path);
        agent.ping(Duration::from_secs(5)).await.unwrap();
        peer.await.unwrap();
    }

    /// A peer playing QGA for `guest-shutdown`: answers the sync, then obeys silently
    /// (`obey`) or refuses with `CommandNotFound` (the test guest's busybox responder).
    async fn shutdown_against(obey: bool) -> (Result<(), AgentError>, Value) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("org.qemu.guest_agent.0");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let peer = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let mut s = BufReader::new(s);
            let mut line = String::new();
            s.read_line(&mut line).await.unwrap();
            let req: Value = serde_json::from_str(&line).unwrap();
            let mut b = vec![0xFF];
            b.extend_from_slice(format!("{{\"return\": {}}}\n", req["arguments"]["id"]).as_bytes());
            s.get_mut().write_all(&b).await.unwrap();
            let mut line = String::new();
            s.read_line(&mut line).await.unwrap();
            if !obey {
                s.get_mut()
                    .write_all(b"{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"no\"}}\n")
                    .await
                    .unwrap();
            }
            // Keep the channel open a while, as a guest going down does.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            serde_json::from_str::<Value>(&line).unwrap()
        });
        let agent = GuestAgent::new();
        agent.set_socket(path);
        let r = agent
            .shutdown(Duration::from_secs(5), Duration::from_millis(300))
            .await;
        (r, peer.await.unwrap())
    }

    #[tokio::test]
    async fn guest_shutdown_is_sent_with_powerdown_and_silence_means_obeyed() {
        let (r, request) = shutdown_against(true).await;
        r.unwrap();
        assert_eq!(
            request,
            json!({"execute": "guest-shutdown", "arguments": {"mode": "powerdown"}})
        );
        let (r, _) = shutdown_against(false).await;
        assert!(
            matches!(r, Err(AgentError::Command { ref class, .. }) if class == "CommandNotFound"),
            "{r:?}"
        );
        // No agent listening at all: a connect error, so the caller presses the ACPI button.
        let agent = GuestAgent::new();
        agent.set_socket("/nonexistent/org.qemu.guest_agent.0".into());
        assert!(matches!(
            agent
                .shutdown(Duration::from_secs(1), Duration::from_millis(100))
                .await,
            Err(AgentError::Connect { .. })
        ));
    }

    #[tokio::test]
    async fn a_silent_agent_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("org.qemu.guest_agent.0");
        let _listener = tokio::net::UnixListener::bind(&path).unwrap();
        let agent = GuestAgent::new();
        agent.set_socket(path);
        let e = agent.ping(Duration::from_millis(200)).await.unwrap_err();
        assert!(
            matches!(e, AgentError::Timeout { ref command, .. } if command == "guest-ping"),
            "{e}"
        );
    }
}
