//! The command server on a real Unix socket, driven by a tonic client the way virt-handler drives
//! virt-launcher: readiness by rename, version negotiation, Ping, VMI commands answered in-band,
//! unsupported RPCs answered at once, concurrency, shutdown.

use qlauncher::sync::domain::{ApiDomain, LifeCycle, StateChangeReason};
use qlauncher::sync::rpc::manager::{DomainManager, ExecOutput, INVALID_VMI_MESSAGE};
use qlauncher::sync::rpc::proto::cmd::info::{cmd_info_client::CmdInfoClient, CmdInfoRequest};
use qlauncher::sync::rpc::proto::cmd::v1 as cmd;
use qlauncher::sync::rpc::proto::cmd::v1::cmd_client::CmdClient;
use qlauncher::sync::rpc::server::{CmdServer, CmdSocketPaths};
use qlauncher::sync::rpc::uds;
use serde::Deserialize;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// The part of a VMI the in-memory manager reads.
#[derive(Debug, Deserialize)]
struct TestVmi {
    metadata: TestMeta,
}

#[derive(Debug, Deserialize)]
struct TestMeta {
    name: String,
    namespace: String,
    uid: String,
}

#[derive(Debug, thiserror::Error)]
enum TestError {
    #[error("no domain")]
    NoDomain,
    #[error("memory hotplug refused")]
    MemoryRefused(#[source] std::io::Error),
    #[error("guest agent not connected")]
    NoAgent,
}

/// A domain manager that keeps the domain in memory: sync defines and runs it, pause/unpause/kill
/// change its state, delete forgets it.
#[derive(Default)]
struct InMemoryManager {
    domain: Mutex<Option<ApiDomain>>,
    syncs: AtomicUsize,
}

impl InMemoryManager {
    fn set_state(&self, state: LifeCycle, reason: StateChangeReason) -> Result<(), TestError> {
        let mut domain = self.domain.lock().unwrap();
        let domain = domain.as_mut().ok_or(TestError::NoDomain)?;
        domain.set_state(state, reason);
        Ok(())
    }
}

impl DomainManager for InMemoryManager {
    type Vmi = TestVmi;
    type Error = TestError;

    async fn sync_vmi(
        &self,
        vmi: TestVmi,
        _options: Option<cmd::VirtualMachineOptions>,
    ) -> Result<(), TestError> {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        let mut domain = self.domain.lock().unwrap();
        if domain.is_none() {
            let meta = vmi.metadata;
            let mut new = ApiDomain::for_vmi(&meta.namespace, &meta.name, &meta.uid);
            new.set_state(LifeCycle::Running, StateChangeReason::Unknown);
            *domain = Some(new);
        }
        Ok(())
    }
    async fn pause_vmi(&self, _vmi: TestVmi) -> Result<(), TestError> {
        self.set_state(LifeCycle::Paused, StateChangeReason::User)
    }
    async fn unpause_vmi(&self, _vmi: TestVmi) -> Result<(), TestError> {
        self.set_state(LifeCycle::Running, StateChangeReason::Unknown)
    }
    async fn reset_vmi(&self, _vmi: TestVmi) -> Result<(), TestError> {
        self.set_state(LifeCycle::Running, StateChangeReason::Unknown)
    }
    async fn soft_reboot_vmi(&self, _vmi: TestVmi) -> Result<(), TestError> {
        self.set_state(LifeCycle::Running, StateChangeReason::Unknown)
    }
    async fn shutdown_vmi(&self, _vmi: TestVmi) -> Result<(), TestError> {
        self.set_state(LifeCycle::ShuttingDown, StateChangeReason::User)
    }
    async fn kill_vmi(&self, _vmi: TestVmi) -> Result<(), TestError> {
        self.set_state(LifeCycle::Shutoff, StateChangeReason::Destroyed)
    }
    async fn delete_vmi(&self, _vmi: TestVmi) -> Result<(), TestError> {
        self.domain
            .lock()
            .unwrap()
            .take()
            .map(|_| ())
            .ok_or(TestError::NoDomain)
    }
    async fn sync_vcpus(
        &self,
        _vmi: TestVmi,
        _options: Option<cmd::VirtualMachineOptions>,
    ) -> Result<(), TestError> {
        Ok(())
    }
    async fn sync_memory(
        &self,
        _vmi: TestVmi,
        _options: Option<cmd::VirtualMachineOptions>,
    ) -> Result<(), TestError> {
        Err(TestError::MemoryRefused(std::io::Error::other(
            "no virtio-mem device",
        )))
    }
    async fn get_domain(&self) -> Result<Option<ApiDomain>, TestError> {
        Ok(self.domain.lock().unwrap().clone())
    }
    async fn get_domain_stats(&self) -> Result<serde_json::Value, TestError> {
        Ok(serde_json::json!({"Name": "default_testvmi", "Cpu": {"Time": 42}}))
    }
    async fn qemu_version(&self) -> Result<String, TestError> {
        Ok("7.2.0".to_owned())
    }
    async fn guest_ping(&self, _domain_name: String, _timeout: Duration) -> Result<(), TestError> {
        Err(TestError::NoAgent)
    }
    async fn exec(
        &self,
        _domain_name: String,
        command: String,
        args: Vec<String>,
        _timeout: Duration,
    ) -> Result<ExecOutput, TestError> {
        Ok(ExecOutput {
            exit_code: 3,
            stdout: format!("{command} {}", args.join(" ")),
        })
    }
}

/// A started server in its own temporary share directory; stops it when dropped.
struct Launcher {
    server: Option<CmdServer>,
    stop: Option<oneshot::Sender<()>>,
    manager: Arc<InMemoryManager>,
    paths: CmdSocketPaths,
    _share_dir: tempfile::TempDir,
}

impl Launcher {
    async fn start() -> Launcher {
        let share_dir = tempfile::tempdir().unwrap();
        let paths = CmdSocketPaths::in_share_dir(share_dir.path());
        Self::start_at(share_dir, paths).await
    }

    async fn start_at(share_dir: tempfile::TempDir, paths: CmdSocketPaths) -> Launcher {
        let manager = Arc::new(InMemoryManager::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let server = CmdServer::start(Arc::clone(&manager), paths.clone(), async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
        Launcher {
            server: Some(server),
            stop: Some(stop),
            manager,
            paths,
            _share_dir: share_dir,
        }
    }

    async fn ready_client(&self) -> CmdClient<Channel> {
        CmdClient::new(connect(&self.paths.ready).await)
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn connect(path: &Path) -> Channel {
    uds::connect(path, Duration::from_secs(2)).await.unwrap()
}

fn vmi_request() -> cmd::VmiRequest {
    let vmi = serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "testvmi", "namespace": "default", "uid": "0f1e2d3c-uid"},
        "spec": {"domain": {"devices": {}}}
    });
    testkit::handler::vmi_request(&vmi)
}

fn ok() -> cmd::Response {
    cmd::Response {
        success: true,
        message: String::new(),
    }
}

async fn current_domain(client: &mut CmdClient<Channel>) -> Option<ApiDomain> {
    let answer = client
        .get_domain(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.response, Some(ok()));
    if answer.domain.is_empty() {
        None
    } else {
        Some(serde_json::from_str(&answer.domain).unwrap())
    }
}

#[tokio::test]
async fn init_socket_is_renamed_to_launcher_sock_and_answers_info_and_ping() {
    let launcher = Launcher::start().await;
    let paths = launcher.paths.clone();

    // Before readiness: only the init socket exists, and it already answers.
    let init = std::fs::metadata(&paths.init).unwrap();
    assert!(init.file_type().is_socket());
    assert!(!paths.ready.exists());
    let answer = CmdClient::new(connect(&paths.init).await)
        .ping(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer, ok());

    // Same mode as any socket bound under this umask (Go's net.Listen does no chmod either).
    let reference_dir = tempfile::tempdir().unwrap();
    let reference_path = reference_dir.path().join("reference.sock");
    let _reference = std::os::unix::net::UnixListener::bind(&reference_path).unwrap();
    let reference_mode = std::fs::metadata(&reference_path)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(init.permissions().mode(), reference_mode);

    launcher.server.as_ref().unwrap().mark_ready().unwrap();
    assert!(!paths.init.exists());
    assert!(std::fs::metadata(&paths.ready)
        .unwrap()
        .file_type()
        .is_socket());

    let channel = connect(&paths.ready).await;
    let info = CmdInfoClient::new(channel.clone())
        .info(CmdInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.supported_cmd_versions, vec![1]);
    let answer = CmdClient::new(channel)
        .ping(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer, ok());
}

#[tokio::test]
async fn stale_socket_file_is_removed_before_listening() {
    let share_dir = tempfile::tempdir().unwrap();
    let paths = CmdSocketPaths::in_share_dir(share_dir.path());
    std::fs::create_dir_all(paths.init.parent().unwrap()).unwrap();
    std::fs::write(&paths.init, b"left over from a previous run").unwrap();
    let launcher = Launcher::start_at(share_dir, paths.clone()).await;
    assert!(std::fs::metadata(&paths.init)
        .unwrap()
        .file_type()
        .is_socket());
    launcher.server.as_ref().unwrap().mark_ready().unwrap();
    let answer = launcher
        .ready_client()
        .await
        .ping(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer, ok());
}

#[tokio::test]
async fn vmi_commands_reach_the_manager_and_errors_come_back_in_band() {
    let launcher = Launcher::start().await;
    launcher.server.as_ref().unwrap().mark_ready().unwrap();
    let mut client = launcher.ready_client().await;

    assert_eq!(current_domain(&mut client).await, None);

    let answer = client
        .sync_virtual_machine(vmi_request())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer, ok());
    let mut expected = ApiDomain::for_vmi("default", "testvmi", "0f1e2d3c-uid");
    expected.set_state(LifeCycle::Running, StateChangeReason::Unknown);
    assert_eq!(current_domain(&mut client).await, Some(expected.clone()));

    let answer = client
        .pause_virtual_machine(vmi_request())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer, ok());
    expected.set_state(LifeCycle::Paused, StateChangeReason::User);
    assert_eq!(current_domain(&mut client).await, Some(expected.clone()));

    let answer = client
        .unpause_virtual_machine(vmi_request())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer, ok());
    let answer = client
        .shutdown_virtual_machine(vmi_request())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer, ok());
    let answer = client
        .kill_virtual_machine(vmi_request())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer, ok());
    expected.set_state(LifeCycle::Shutoff, StateChangeReason::Destroyed);
    assert_eq!(current_domain(&mut client).await, Some(expected));

    // A manager error: in-band, with its source chain, gRPC status OK.
    let answer = client
        .sync_virtual_machine_memory(vmi_request())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer,
        cmd::Response {
            success: false,
            message: "memory hotplug refused: no virtio-mem device".to_owned()
        }
    );
    let answer = client
        .sync_virtual_machine_cp_us(vmi_request())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer, ok());

    // A VMI that does not decode never reaches the manager.
    let syncs = launcher.manager.syncs.load(Ordering::SeqCst);
    let mut bad = vmi_request();
    bad.vmi = Some(cmd::Vmi {
        vmi_json: b"{\"metadata\": 7}".to_vec(),
    });
    let answer = client.sync_virtual_machine(bad).await.unwrap().into_inner();
    assert_eq!(
        answer,
        cmd::Response {
            success: false,
            message: INVALID_VMI_MESSAGE.to_owned()
        }
    );
    let answer = client
        .sync_virtual_machine(cmd::VmiRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.message, INVALID_VMI_MESSAGE);
    assert_eq!(launcher.manager.syncs.load(Ordering::SeqCst), syncs);

    let answer = client
        .delete_virtual_machine(vmi_request())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer, ok());
    assert_eq!(current_domain(&mut client).await, None);
    let answer = client
        .delete_virtual_machine(vmi_request())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer,
        cmd::Response {
            success: false,
            message: "no domain".to_owned()
        }
    );
}

#[tokio::test]
async fn query_rpcs_answer_with_kubevirt_shapes() {
    let launcher = Launcher::start().await;
    launcher.server.as_ref().unwrap().mark_ready().unwrap();
    let mut client = launcher.ready_client().await;

    let version = client
        .get_qemu_version(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        version,
        cmd::QemuVersionResponse {
            response: Some(ok()),
            version: "7.2.0".to_owned()
        }
    );

    let stats = client
        .get_domain_stats(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.response, Some(ok()));
    let stats: serde_json::Value = serde_json::from_str(&stats.domain_stats).unwrap();
    assert_eq!(
        stats,
        serde_json::json!({"Name": "default_testvmi", "Cpu": {"Time": 42}})
    );

    // A non-zero exit code is a successful Exec.
    let exec = client
        .exec(cmd::ExecRequest {
            domain_name: "default_testvmi".to_owned(),
            command: "cat".to_owned(),
            args: vec!["/etc/hostname".to_owned()],
            timeout_seconds: 5,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        exec,
        cmd::ExecResponse {
            response: Some(ok()),
            exit_code: 3,
            std_out: "cat /etc/hostname".to_owned()
        }
    );

    // GuestPing failures are gRPC errors, which is what virt-handler's probe checks.
    let status = client
        .guest_ping(cmd::GuestPingRequest {
            domain_name: "default_testvmi".to_owned(),
            timeout_seconds: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unknown);
    assert_eq!(status.message(), "guest agent not connected");
}

fn unsupported(rpc: &str) -> Option<cmd::Response> {
    Some(cmd::Response {
        success: false,
        message: format!("{rpc} is not supported by qlauncher"),
    })
}

#[tokio::test]
async fn unsupported_rpcs_answer_success_false_at_once() {
    let launcher = Launcher::start().await;
    launcher.server.as_ref().unwrap().mark_ready().unwrap();
    let mut c = launcher.ready_client().await;
    let e = || cmd::EmptyRequest {};
    let v = vmi_request;
    // Each call must answer well before a client-side deadline; none may hang.
    let deadline = Duration::from_secs(5);
    macro_rules! answer {
        ($call:expr) => {
            tokio::time::timeout(deadline, $call)
                .await
                .expect("unsupported RPC hung")
                .unwrap()
                .into_inner()
        };
    }
    // The in-memory manager implements none of the optional RPCs (the DomainManager defaults).
    let plain: Vec<(&str, cmd::Response)> = vec![
        (
            "FreezeVirtualMachine",
            answer!(c.freeze_virtual_machine(cmd::FreezeRequest {
                vmi: v().vmi,
                unfreeze_timeout_seconds: 0,
            })),
        ),
        (
            "UnfreezeVirtualMachine",
            answer!(c.unfreeze_virtual_machine(v())),
        ),
        (
            "MigrateVirtualMachine",
            answer!(c.migrate_virtual_machine(cmd::MigrationRequest::default())),
        ),
        ("SyncMigrationTarget", answer!(c.sync_migration_target(v()))),
        (
            "CancelVirtualMachineMigration",
            answer!(c.cancel_virtual_machine_migration(v())),
        ),
        (
            "SignalTargetPodCleanup",
            answer!(c.signal_target_pod_cleanup(v())),
        ),
        (
            "FinalizeVirtualMachineMigration",
            answer!(c.finalize_virtual_machine_migration(v())),
        ),
        ("HotplugHostDevices", answer!(c.hotplug_host_devices(v()))),
        (
            "VirtualMachineMemoryDump",
            answer!(c.virtual_machine_memory_dump(cmd::MemoryDumpRequest {
                vmi: v().vmi,
                dump_path: String::new(),
            })),
        ),
        (
            "InjectLaunchSecret",
            answer!(c.inject_launch_secret(cmd::InjectLaunchSecretRequest {
                vmi: v().vmi,
                options: Vec::new(),
            })),
        ),
        (
            "BackupVirtualMachine",
            answer!(c.backup_virtual_machine(cmd::BackupRequest {
                vmi: v().vmi,
                options: Vec::new(),
            })),
        ),
    ];
    for (rpc, response) in plain {
        assert_eq!(Some(response), unsupported(rpc));
    }
    assert_eq!(
        answer!(c.get_guest_info(e())).response,
        unsupported("GetGuestInfo")
    );
    assert_eq!(answer!(c.get_users(e())).response, unsupported("GetUsers"));
    assert_eq!(
        answer!(c.get_filesystems(e())).response,
        unsupported("GetFilesystems")
    );
    assert_eq!(
        answer!(c.get_sev_info(e())).response,
        unsupported("GetSEVInfo")
    );
    assert_eq!(
        answer!(c.get_launch_measurement(v())).response,
        unsupported("GetLaunchMeasurement")
    );
    assert_eq!(
        answer!(c.get_domain_dirty_rate_stats(e())).response,
        unsupported("GetDomainDirtyRateStats")
    );
    assert_eq!(
        answer!(c.get_screenshot(v())).response,
        unsupported("GetScreenshot")
    );
    assert_eq!(
        answer!(c.redefine_checkpoint(cmd::RedefineCheckpointRequest {
            vmi: v().vmi,
            checkpoint: Vec::new(),
        }))
        .response,
        unsupported("RedefineCheckpoint")
    );
    assert_eq!(
        answer!(c.get_vm_stats(cmd::VmStatsRequest::default())).response,
        unsupported("GetVMStats")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_calls_all_answer() {
    let launcher = Launcher::start().await;
    launcher.server.as_ref().unwrap().mark_ready().unwrap();
    let shared = launcher.ready_client().await;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..100 {
        let ready = launcher.paths.ready.clone();
        let mut client = if i % 2 == 0 {
            shared.clone()
        } else {
            // Half the calls on their own connection, like many handler goroutines.
            CmdClient::new(connect(&ready).await)
        };
        calls.spawn(async move {
            match i % 3 {
                0 => client
                    .ping(cmd::EmptyRequest {})
                    .await
                    .unwrap()
                    .into_inner(),
                1 => client
                    .sync_virtual_machine(vmi_request())
                    .await
                    .unwrap()
                    .into_inner(),
                _ => client
                    .get_domain(cmd::EmptyRequest {})
                    .await
                    .unwrap()
                    .into_inner()
                    .response
                    .unwrap(),
            }
        });
    }
    let mut answered = 0;
    while let Some(answer) = calls.join_next().await {
        assert_eq!(answer.unwrap(), ok());
        answered += 1;
    }
    assert_eq!(answered, 100);
    assert_eq!(launcher.manager.syncs.load(Ordering::SeqCst), 33);
}

#[tokio::test]
async fn shutdown_future_stops_the_server() {
    let mut launcher = Launcher::start().await;
    let paths = launcher.paths.clone();
    launcher.stop.take().unwrap().send(()).unwrap();
    launcher.server.take().unwrap().wait().await.unwrap();
    // Before the rename, KubeVirt removes the socket it listened on.
    assert!(!paths.init.exists());
    assert!(uds::connect(&paths.init, Duration::from_secs(1))
        .await
        .is_err());
}

#[tokio::test]
async fn launcher_sock_subcommand_queries_a_running_server() {
    let launcher = Launcher::start().await;
    launcher.server.as_ref().unwrap().mark_ready().unwrap();
    let run = |query: &'static str| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_qlauncher"))
            .arg("launcher-sock")
            .arg(&launcher.paths.ready)
            .arg(query)
            .output()
    };
    let ping = run("ping").await.unwrap();
    assert!(ping.status.success(), "{ping:?}");
    assert_eq!(String::from_utf8_lossy(&ping.stdout), "ok\n");
    let info = run("info").await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&info.stdout),
        "supportedCmdVersions: [1]\n"
    );
    // No domain yet: GetDomain's empty string, printed as an empty line.
    let domain = run("get-domain").await.unwrap();
    assert_eq!(String::from_utf8_lossy(&domain.stdout), "\n");
    let version = run("qemu-version").await.unwrap();
    assert_eq!(String::from_utf8_lossy(&version.stdout), "7.2.0\n");
}

/// A raw HTTP/2 client: what gRPC C-core (grpcio) sends, byte for byte where it matters.
mod raw_h2 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixStream;

    pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    pub struct Frame {
        pub kind: u8,
        pub flags: u8,
        pub stream: u32,
        pub payload: Vec<u8>,
    }

    pub async fn read_frame(stream: &mut UnixStream) -> Frame {
        let mut header = [0u8; 9];
        stream.read_exact(&mut header).await.unwrap();
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0; len];
        stream.read_exact(&mut payload).await.unwrap();
        Frame {
            kind: header[3],
            flags: header[4],
            stream: u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff,
            payload,
        }
    }

    /// Sends a unary gRPC call with `authority` on `stream_id` (empty request message).
    pub async fn call(
        stream: &mut UnixStream,
        encoder: &mut loona_hpack::Encoder<'_>,
        stream_id: u32,
        path: &str,
        authority: &str,
    ) {
        let headers: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.as_bytes()),
            (b":authority", authority.as_bytes()),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            (
                b"user-agent",
                b"grpc-python/1.76.0 grpc-c/51.0.0 (linux; chttp2)",
            ),
        ];
        let block = encoder.encode(headers);
        let mut out = frame(0x1, 0x4, stream_id, &block);
        out.extend(frame(0x0, 0x1, stream_id, &[0, 0, 0, 0, 0]));
        stream.write_all(&out).await.unwrap();
    }
}

/// gRPC C-core (grpcio) sends its default authority for `unix:` targets: the socket path without
/// its leading `/`, percent-encoded since C-core 1.57 and raw before. h2 alone answers such a
/// request with RST_STREAM PROTOCOL_ERROR; the server answers it as if it were `localhost`.
#[tokio::test]
async fn any_authority_is_accepted_as_grpc_core_sends_it() {
    use qlauncher::sync::rpc::proto::cmd::info::CmdInfoResponse;
    use tokio::io::AsyncWriteExt;
    let launcher = Launcher::start().await;
    launcher.server.as_ref().unwrap().mark_ready().unwrap();
    let path = launcher.paths.ready.to_str().unwrap().to_owned();
    let percent = path.trim_start_matches('/').replace('/', "%2F");
    let raw = path.trim_start_matches('/').to_owned();
    let calls = [
        (1, "/kubevirt.cmd.info.CmdInfo/Info", percent.clone()),
        (3, "/kubevirt.cmd.v1.Cmd/Ping", raw),
        (5, "/kubevirt.cmd.info.CmdInfo/Info", path.clone()),
        (7, "/kubevirt.cmd.v1.Cmd/Ping", "localhost".to_owned()),
    ];

    let mut stream = tokio::net::UnixStream::connect(&launcher.paths.ready)
        .await
        .unwrap();
    let mut hello = raw_h2::PREFACE.to_vec();
    hello.extend(raw_h2::frame(0x4, 0, 0, &[]));
    stream.write_all(&hello).await.unwrap();
    let mut encoder = loona_hpack::Encoder::new();
    for (id, rpc, authority) in &calls {
        raw_h2::call(&mut stream, &mut encoder, *id, rpc, authority).await;
    }

    let mut decoder = loona_hpack::Decoder::new();
    let mut statuses = std::collections::BTreeMap::new();
    let mut messages = std::collections::BTreeMap::<u32, Vec<u8>>::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while statuses.len() < calls.len() {
        let frame = tokio::time::timeout_at(deadline, raw_h2::read_frame(&mut stream))
            .await
            .expect("every call is answered within 10 s");
        match frame.kind {
            0x4 if frame.flags & 0x1 == 0 => {
                stream
                    .write_all(&raw_h2::frame(0x4, 0x1, 0, &[]))
                    .await
                    .unwrap();
            }
            0x3 => panic!(
                "stream {} reset (error code {:?}): the authority was refused",
                frame.stream, frame.payload
            ),
            0x7 => panic!("GOAWAY: {:?}", frame.payload),
            0x1 => {
                let headers = decoder.decode(&frame.payload).unwrap();
                if let Some((_, status)) = headers.iter().find(|(n, _)| n == b"grpc-status") {
                    statuses.insert(frame.stream, String::from_utf8(status.clone()).unwrap());
                }
            }
            0x0 => messages
                .entry(frame.stream)
                .or_default()
                .extend_from_slice(&frame.payload),
            _ => {}
        }
    }
    for (id, _, authority) in &calls {
        assert_eq!(
            statuses[id], "0",
            "call on stream {id} with :authority {authority}"
        );
    }
    let info = <CmdInfoResponse as prost::Message>::decode(&messages[&1][5..]).unwrap();
    assert_eq!(info.supported_cmd_versions, vec![1]);
    let ping = <cmd::Response as prost::Message>::decode(&messages[&3][5..]).unwrap();
    assert_eq!(ping, ok());

    // The Go client (authority `localhost`) still works on the same server.
    let answer = launcher
        .ready_client()
        .await
        .ping(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer, ok());
}
