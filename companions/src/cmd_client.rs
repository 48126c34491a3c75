//! The launcher's cmd socket as KubeVirt's `pkg/virt-handler/cmd-client` (v1.9.0) talks to it,
//! for virt-probe and virt-freezer: gRPC over the Unix socket (tonic's generated client of
//! qlauncher's copies of `kubevirt.cmd.v1` and `kubevirt.cmd.info`, on hyper's HTTP/2 client
//! connection, `:authority` `localhost` as grpc-go's `WithAuthority`).
//!
//! Timing as KubeVirt's client: connecting (socket and HTTP/2 handshake) has 2 s
//! (`pkg/util/net/grpc DialSocket`), `CmdInfo.Info` 5 s and the client requires cmd version 1
//! (`NewClient`); `GetGuestInfo` and `GetDomain` 5 s, `Unfreeze` 20 s, `Freeze` 60 s; `Exec` and
//! `GuestPing` the probe's timeout plus 5 s. Each deadline is sent as `grpc-timeout` and enforced
//! here. In-band failures (`Response.success == false`) become errors worded as `handleError`
//! words them (`errors.go`).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;

/// The generated client code.
pub mod proto {
    /// `kubevirt.cmd.v1`.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod cmd {
        tonic::include_proto!("kubevirt.cmd.v1");
    }
    /// `kubevirt.cmd.info`.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod info {
        tonic::include_proto!("kubevirt.cmd.info");
    }
}

use proto::cmd;
use proto::info;

/// The connect deadline (`CONNECT_TIMEOUT_SECONDS`).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// `shortTimeout`: Info, GetGuestInfo, GetDomain; also added to the probe timeouts.
pub const SHORT_TIMEOUT: Duration = Duration::from_secs(5);
/// `longTimeout`: Unfreeze (and every other VMI command).
pub const LONG_TIMEOUT: Duration = Duration::from_secs(20);
/// `extendedTimeout`: Freeze (Windows VSS may take a minute).
pub const EXTENDED_TIMEOUT: Duration = Duration::from_secs(60);
/// The cmd API versions this client speaks (`supportedCmdVersions`).
pub const SUPPORTED_CMD_VERSIONS: [u32; 1] = [1];

/// One HTTP/2 connection as the tower service tonic's generated clients call.
#[derive(Clone)]
pub struct UdsChannel {
    send: SendRequest<tonic::body::Body>,
}

type ResponseFuture = Pin<
    Box<dyn Future<Output = Result<http::Response<hyper::body::Incoming>, hyper::Error>> + Send>,
>;

impl tower_service::Service<http::Request<tonic::body::Body>> for UdsChannel {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.send.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> ResponseFuture {
        Box::pin(self.send.send_request(request))
    }
}

/// A connected, version-checked client of the launcher (`VirtLauncherClient`).
pub struct LauncherClient {
    cmd: cmd::cmd_client::CmdClient<UdsChannel>,
}

/// Go's text of a gRPC error (`rpc error: code = Unknown desc = ...`).
pub fn status_text(status: &tonic::Status) -> String {
    format!(
        "rpc error: code = {:?} desc = {}",
        status.code(),
        status.message()
    )
}

/// `handleError`: a disconnect or an unimplemented RPC as it is; any other gRPC error wrapped
/// with the command's name; an in-band failure as a server error quoting its message.
pub fn handle_error(
    result: Result<Option<&cmd::Response>, &tonic::Status>,
    cmd_name: &str,
) -> Result<(), String> {
    match result {
        Err(status) => match status.code() {
            tonic::Code::Unimplemented
            | tonic::Code::Unavailable
            | tonic::Code::Cancelled
            | tonic::Code::Aborted => Err(status_text(status)),
            _ => Err(format!(
                "unknown error encountered sending command {cmd_name}: {}",
                status_text(status)
            )),
        },
        Ok(Some(response)) if !response.success => Err(format!(
            "server error. command {cmd_name} failed: {:?}",
            response.message
        )),
        Ok(_) => Ok(()),
    }
}

/// A request carrying `deadline` as `grpc-timeout`.
fn request<T>(message: T, deadline: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(deadline);
    request
}

/// Awaits `call` for at most `deadline` (DeadlineExceeded after it, as grpc-go's context).
async fn within<T>(
    deadline: Duration,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, tonic::Status> {
    match tokio::time::timeout(deadline, call).await {
        Ok(result) => result.map(tonic::Response::into_inner),
        Err(_) => Err(tonic::Status::deadline_exceeded(
            "context deadline exceeded",
        )),
    }
}

/// The deadline of a probe call: `timeoutSeconds` s plus [`SHORT_TIMEOUT`] (zero when negative).
pub fn probe_deadline(timeout_seconds: i32) -> Duration {
    let secs = i64::from(timeout_seconds) + SHORT_TIMEOUT.as_secs() as i64;
    Duration::from_secs(secs.max(0) as u64)
}

/// Go's `%v` of a `[]uint32`: `[1 2]`.
fn go_list(values: &[u32]) -> String {
    let items: Vec<String> = values.iter().map(u32::to_string).collect();
    format!("[{}]", items.join(" "))
}

impl LauncherClient {
    /// Connects to `socket` and checks the server's cmd versions (`NewClient`).
    ///
    /// Errors: the connect or handshake failing or taking over [`CONNECT_TIMEOUT`]; `Info`
    /// failing (`could not check cmd server version: ...`); no version in common.
    pub async fn connect(socket: &Path) -> Result<LauncherClient, String> {
        let dial = async {
            let stream = tokio::net::UnixStream::connect(socket)
                .await
                .map_err(|e| format!("dial unix {}: {e}", socket.display()))?;
            let (mut send, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await
                    .map_err(|e| format!("HTTP/2 handshake on {}: {e}", socket.display()))?;
            tokio::spawn(connection);
            std::future::poll_fn(|cx| send.poll_ready(cx))
                .await
                .map_err(|e| format!("connection to {}: {e}", socket.display()))?;
            Ok::<_, String>(UdsChannel { send })
        };
        let channel = tokio::time::timeout(CONNECT_TIMEOUT, dial)
            .await
            .map_err(|_| format!("dial unix {}: context deadline exceeded", socket.display()))??;
        let origin = http::Uri::from_static("http://localhost");
        let mut info_client =
            info::cmd_info_client::CmdInfoClient::with_origin(channel.clone(), origin.clone());
        let answer = within(
            SHORT_TIMEOUT,
            info_client.info(request(info::CmdInfoRequest {}, SHORT_TIMEOUT)),
        )
        .await
        .map_err(|s| format!("could not check cmd server version: {}", status_text(&s)))?;
        let mut server = answer.supported_cmd_versions.clone();
        server.sort_unstable_by(|a, b| b.cmp(a));
        if !server.iter().any(|v| SUPPORTED_CMD_VERSIONS.contains(v)) {
            return Err(format!(
                "no compatible version found, server: {}, client: {}",
                go_list(&server),
                go_list(&SUPPORTED_CMD_VERSIONS)
            ));
        }
        Ok(LauncherClient {
            cmd: cmd::cmd_client::CmdClient::with_origin(channel, origin),
        })
    }

    /// `GuestPing` (`client.go GuestPing`): only a gRPC error is a failure; the answer's
    /// `success` is not looked at.
    pub async fn guest_ping(
        &mut self,
        domain_name: &str,
        timeout_seconds: i32,
    ) -> Result<(), String> {
        let deadline = probe_deadline(timeout_seconds);
        let message = cmd::GuestPingRequest {
            domain_name: domain_name.to_string(),
            timeout_seconds,
        };
        within(deadline, self.cmd.guest_ping(request(message, deadline)))
            .await
            .map(|_| ())
            .map_err(|s| status_text(&s))
    }

    /// `Exec` (`client.go Exec`): the guest command's exit code and stdout; on a gRPC error the
    /// exit code is -1, the stdout empty, and the error given.
    pub async fn exec(
        &mut self,
        domain_name: &str,
        command: &str,
        args: &[String],
        timeout_seconds: i32,
    ) -> (i32, String, Option<String>) {
        let deadline = probe_deadline(timeout_seconds);
        let message = cmd::ExecRequest {
            domain_name: domain_name.to_string(),
            command: command.to_string(),
            args: args.to_vec(),
            timeout_seconds,
        };
        match within(deadline, self.cmd.exec(request(message, deadline))).await {
            Ok(answer) => (answer.exit_code, answer.std_out, None),
            Err(status) => (-1, String::new(), Some(status_text(&status))),
        }
    }

    /// `GetGuestInfo`: the `VirtualMachineInstanceGuestAgentInfo` JSON (an empty object when the
    /// launcher sends none).
    ///
    /// Errors: as [`handle_error`]; a JSON document that does not parse.
    pub async fn guest_info(&mut self) -> Result<Value, String> {
        let answer = within(
            SHORT_TIMEOUT,
            self.cmd
                .get_guest_info(request(cmd::EmptyRequest {}, SHORT_TIMEOUT)),
        )
        .await;
        let answer = match answer {
            Ok(a) => a,
            Err(status) => return handle_error(Err(&status), "GetGuestInfo").map(|_| Value::Null),
        };
        handle_error(Ok(answer.response.as_ref()), "GetGuestInfo")?;
        if answer.guest_info_response.is_empty() {
            return Ok(Value::Object(Default::default()));
        }
        serde_json::from_str(&answer.guest_info_response)
            .map_err(|e| format!("error unmarshalling guest agent response: {e}"))
    }

    /// `GetDomain`: the domain's JSON, None when the launcher has none.
    ///
    /// Errors: as [`handle_error`]; a JSON document that does not parse.
    pub async fn domain(&mut self) -> Result<Option<Value>, String> {
        let answer = within(
            SHORT_TIMEOUT,
            self.cmd
                .get_domain(request(cmd::EmptyRequest {}, SHORT_TIMEOUT)),
        )
        .await;
        let answer = match answer {
            Ok(a) => a,
            Err(status) => return handle_error(Err(&status), "GetDomain").map(|_| None),
        };
        handle_error(Ok(answer.response.as_ref()), "GetDomain")?;
        if answer.domain.is_empty() {
            return Ok(None);
        }
        serde_json::from_str(&answer.domain)
            .map(Some)
            .map_err(|e| format!("error unmarshalling domain: {e}"))
    }

    /// `FreezeVirtualMachine` with `vmi_json` and the automatic thaw after
    /// `unfreeze_timeout_seconds`.
    ///
    /// Errors: as [`handle_error`] (command name `Freeze`).
    pub async fn freeze(
        &mut self,
        vmi_json: &[u8],
        unfreeze_timeout_seconds: i32,
    ) -> Result<(), String> {
        let message = cmd::FreezeRequest {
            vmi: Some(cmd::Vmi {
                vmi_json: vmi_json.to_vec(),
            }),
            unfreeze_timeout_seconds,
        };
        let result = within(
            EXTENDED_TIMEOUT,
            self.cmd
                .freeze_virtual_machine(request(message, EXTENDED_TIMEOUT)),
        )
        .await;
        match result {
            Ok(response) => handle_error(Ok(Some(&response)), "Freeze"),
            Err(status) => handle_error(Err(&status), "Freeze"),
        }
    }

    /// `UnfreezeVirtualMachine` with `vmi_json`.
    ///
    /// Errors: as [`handle_error`] (command name `Unfreeze`).
    pub async fn unfreeze(&mut self, vmi_json: &[u8]) -> Result<(), String> {
        let message = cmd::VmiRequest {
            vmi: Some(cmd::Vmi {
                vmi_json: vmi_json.to_vec(),
            }),
            options: Some(cmd::VirtualMachineOptions::default()),
        };
        let result = within(
            LONG_TIMEOUT,
            self.cmd
                .unfreeze_virtual_machine(request(message, LONG_TIMEOUT)),
        )
        .await;
        match result {
            Ok(response) => handle_error(Ok(Some(&response)), "Unfreeze"),
            Err(status) => handle_error(Err(&status), "Unfreeze"),
        }
    }
}

/// A current-thread tokio runtime for one program run.
///
/// Errors: the runtime cannot be made (no epoll or timer descriptors).
pub fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_worded_as_kubevirt_words_them() {
        let failed = cmd::Response {
            success: false,
            message: "Guest agent not available for now".into(),
        };
        assert_eq!(
            handle_error(Ok(Some(&failed)), "Freeze"),
            Err(
                "server error. command Freeze failed: \"Guest agent not available for now\"".into()
            )
        );
        assert_eq!(
            handle_error(Err(&tonic::Status::unknown("boom")), "GetDomain"),
            Err("unknown error encountered sending command GetDomain: rpc error: code = Unknown desc = boom".into())
        );
        assert_eq!(
            handle_error(Err(&tonic::Status::unimplemented("x")), "GetDomain"),
            Err("rpc error: code = Unimplemented desc = x".into())
        );
        assert_eq!(handle_error(Ok(None), "Ping"), Ok(()));
    }

    #[test]
    fn probe_deadlines() {
        assert_eq!(probe_deadline(1), Duration::from_secs(6));
        assert_eq!(probe_deadline(-10), Duration::ZERO);
        assert_eq!(go_list(&[2, 1]), "[2 1]");
    }
}
