//! The command server on a real Unix socket, driven by a tonic client the way virt-handler drives
//! virt-launcher: readiness by rename, version negotiation, Ping, VMI commands answered in-band,
//! unsupported RPCs answered at once, concurrency, shutdown.

use qlauncher::sync::domain::{Domain, LifeCycle, StateChangeReason};
use qlauncher::sync::proto::cmd::info::{cmd_info_client::CmdInfoClient, CmdInfoRequest};
use qlauncher::sync::proto::cmd::v1 as cmd;
use qlauncher::sync::proto::cmd::v1::cmd_client::CmdClient;
use qlauncher::sync::server::{
    CmdServer, CmdSocketPaths, DomainManager, ExecOutput, INVALID_VMI_MESSAGE,
};
use qlauncher::sync::uds;
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
    domain: Mutex<Option<Domain>>,
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
            let mut new = Domain::for_vmi(&meta.namespace, &meta.name, &meta.uid);
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
    async fn get_domain(&self) -> Result<Option<Domain>, TestError> {
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

async fn current_domain(client: &mut CmdClient<Channel>) -> Option<Domain> {
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
    let mut expected = Domain::for_vmi("default", "testvmi", "0f1e2d3c-uid");
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
    let plain: Vec<(&str, cmd::Response)> = vec![
        (
            "FreezeVirtualMachine",
            answer!(c.freeze_virtual_machine(cmd::FreezeRequest::default())),
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
            answer!(c.virtual_machine_memory_dump(cmd::MemoryDumpRequest::default())),
        ),
        (
            "InjectLaunchSecret",
            answer!(c.inject_launch_secret(cmd::InjectLaunchSecretRequest::default())),
        ),
        (
            "BackupVirtualMachine",
            answer!(c.backup_virtual_machine(cmd::BackupRequest::default())),
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
        answer!(c.redefine_checkpoint(cmd::RedefineCheckpointRequest::default())).response,
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
