//! virt-handler's side of the cmd API (KubeVirt's `pkg/virt-handler/cmd-client`): connect to the
//! launcher's `launcher-sock` once it answers Ping, SyncVirtualMachine with a VMI, GetDomain.

use std::path::Path;
use std::time::{Duration, Instant};

use qlauncher::sync::domain::ApiDomain;
use qlauncher::sync::rpc::proto::cmd::v1 as cmd;
use qlauncher::sync::rpc::proto::cmd::v1::cmd_client::CmdClient;
use qlauncher::sync::rpc::uds;
use tonic::transport::Channel;

/// A cmd client of the launcher.
pub type Client = CmdClient<Channel>;

/// Connects to the cmd socket `sock` once it exists and answers Ping, polling every 100 ms up to
/// `timeout`; panics then, with `log()` (the launcher's log) in the message.
pub async fn connect(sock: &Path, timeout: Duration, log: impl Fn() -> String) -> Client {
    let deadline = Instant::now() + timeout;
    loop {
        if sock.exists() {
            if let Ok(c) = uds::connect(sock, Duration::from_secs(5)).await {
                let mut client = CmdClient::new(c);
                if client.ping(cmd::EmptyRequest {}).await.is_ok() {
                    return client;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "the launcher does not serve {}; log:\n{}",
            sock.display(),
            log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `Vmi` message of `vmi` (JSON) that every per-VMI request carries (`FreezeRequest`,
/// `MemoryDumpRequest`, ... and [`vmi_request`]).
pub fn vmi_message(vmi: &serde_json::Value) -> cmd::Vmi {
    cmd::Vmi {
        vmi_json: serde_json::to_vec(vmi).expect("VMI JSON"),
    }
}

/// The SyncVirtualMachine request for `vmi` (JSON), with default options, as virt-handler sends.
pub fn vmi_request(vmi: &serde_json::Value) -> cmd::VmiRequest {
    cmd::VmiRequest {
        vmi: Some(vmi_message(vmi)),
        options: Some(cmd::VirtualMachineOptions::default()),
    }
}

/// A request carrying only `vmi` (JSON), no options, as virt-handler sends the calls other than
/// SyncVirtualMachine (pause, CPU and memory hotplug, ...).
pub fn vmi_only(vmi: &serde_json::Value) -> cmd::VmiRequest {
    cmd::VmiRequest {
        vmi: Some(vmi_message(vmi)),
        options: None,
    }
}

/// [`vmi_request`] with the VEP-190 plugins `plugins_json` in its options (what virt-handler
/// sends with the `Plugins` feature gate, to SyncVirtualMachine and SyncMigrationTarget alike).
pub fn vmi_request_with_plugins(
    vmi: &serde_json::Value,
    plugins_json: &serde_json::Value,
) -> cmd::VmiRequest {
    let mut request = vmi_request(vmi);
    if let Some(o) = request.options.as_mut() {
        o.plugins_json = serde_json::to_vec(plugins_json).unwrap();
    }
    request
}

/// One SyncVirtualMachine call with the VEP-190 plugins `plugins_json` in its options (what
/// virt-handler sends with the `Plugins` feature gate): (success, message). Panics on a transport
/// error.
pub async fn sync_with_plugins(
    client: &mut Client,
    vmi: &serde_json::Value,
    plugins_json: &serde_json::Value,
) -> (bool, String) {
    let answer = client
        .sync_virtual_machine(vmi_request_with_plugins(vmi, plugins_json))
        .await
        .expect("SyncVirtualMachine")
        .into_inner();
    (answer.success, answer.message)
}

/// One SyncVirtualMachine call: (success, message). Panics on a transport error.
pub async fn sync(client: &mut Client, vmi: &serde_json::Value) -> (bool, String) {
    try_sync(client, vmi).await.expect("SyncVirtualMachine")
}

/// One SyncVirtualMachine call that may fail at the transport (the launcher is killed under it).
pub async fn try_sync(
    client: &mut Client,
    vmi: &serde_json::Value,
) -> Result<(bool, String), tonic::Status> {
    let answer = client
        .sync_virtual_machine(vmi_request(vmi))
        .await?
        .into_inner();
    Ok((answer.success, answer.message))
}

/// GetDomain, parsed (`None` when the launcher has no domain).
pub async fn get_domain(client: &mut Client) -> Option<ApiDomain> {
    let answer = client
        .get_domain(cmd::EmptyRequest {})
        .await
        .expect("GetDomain")
        .into_inner();
    (!answer.domain.is_empty())
        .then(|| serde_json::from_str(&answer.domain).expect("GetDomain's domain JSON"))
}
