//! KubeVirt v1.9.0's answers of the cmd API before any domain exists, on this machine (no SEV, a
//! launcher started without `--vm-stats-collector`), played over the real gRPC socket:
//! - `GetSEVInfo` is a node query (virt-api's `fetchcertchain` runs while the VMI is Scheduled):
//!   without `/dev/sev` it is libvirt's refusal as KubeVirt formats it; with a `/dev/sev` but a
//!   KVM without SEV, the probe QEMU (real QEMU, `-machine none`) refuses and the answer is the
//!   same, and the probe leaves nothing behind.
//! - `HotplugHostDevices` answers success at once (the plug runs in the background and a
//!   failure, here "no domain", is only logged).
//! - `GetVMStats` without the flag is a gRPC error (code Unknown) with KubeVirt's text.
//!
//! No guest, no network: the launcher's command server runs in-process. Needs QEMU.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use qlauncher::sync::rpc::proto::cmd::v1 as cmd;
use qlauncher::sync::rpc::proto::cmd::v1::cmd_client::CmdClient;
use qlauncher::sync::rpc::server::{CmdServer, CmdSocketPaths};
use qlauncher::sync::rpc::uds;
use qlauncher::sync::{SyncConfig, SyncVmi};
use serde_json::json;

/// What KubeVirt's launcher answers on a node whose QEMU cannot run SEV guests (libvirt's
/// `VIR_ERR_OPERATION_UNSUPPORTED` from `VIR_FROM_QEMU`, through `getErrorMessage`).
const NO_SEV: &str = "LibvirtError(Code=84, Domain=10, Message='Operation not supported: QEMU does not support SEV guest')";

fn vmi() -> Option<cmd::Vmi> {
    let v = json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "sriov", "namespace": "default", "uid": "5f0c1a2e-0000-4000-8002-000000000001"},
        "spec": {
            "domain": {"devices": {"interfaces": [{"name": "sriov1", "sriov": {}}]}},
            "networks": [{"name": "sriov1", "multus": {"networkName": "sriov-net"}}]
        },
        "status": {"interfaces": [{"name": "sriov1", "infoSource": "multus-status"}]}
    });
    Some(cmd::Vmi {
        vmi_json: serde_json::to_vec(&v).unwrap(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_a_domain_the_answers_are_kubevirts() {
    let root = tempfile::tempdir().unwrap();
    let config = SyncConfig::under_root(root.path());
    assert!(
        !config.vm_stats_collector,
        "the default launcher has no --vm-stats-collector"
    );
    let dev = PathBuf::from(&config.paths.dev);
    std::fs::create_dir_all(&dev).unwrap();
    let private = PathBuf::from(&config.paths.private_dir).join("qlauncher");
    let share = root.path().join("var/run/kubevirt");
    let manager = Arc::new(SyncVmi::new(config, None));
    let paths = CmdSocketPaths::in_share_dir(&share);
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = CmdServer::start(manager.clone(), paths.clone(), async move {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    server.mark_ready().unwrap();
    let channel = uds::connect(&paths.ready, Duration::from_secs(5))
        .await
        .unwrap();
    let mut client = CmdClient::new(channel);

    // GetSEVInfo on a node without /dev/sev.
    let sev = client
        .get_sev_info(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    let r = sev.response.unwrap();
    assert!(!r.success);
    assert_eq!(r.message, NO_SEV);
    assert!(sev.sev_info.is_empty());

    // A /dev/sev, but KVM without SEV: the probe QEMU says so, the answer stays libvirt's.
    std::fs::write(dev.join("sev"), b"").unwrap();
    let sev = client
        .get_sev_info(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    let r = sev.response.unwrap();
    assert_eq!((r.success, r.message.as_str()), (false, NO_SEV));
    assert!(
        !private.join("sev.sock").exists(),
        "the probe's QMP socket is left"
    );

    // HotplugHostDevices: success at once, whatever the background finds (no domain here).
    let r = client
        .hotplug_host_devices(cmd::VmiRequest {
            vmi: vmi(),
            options: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.success, "{}", r.message);
    assert_eq!(r.message, "");
    assert!(manager.domain().is_none());

    // GetVMStats without --vm-stats-collector: a gRPC error, not an in-band answer.
    let status = client
        .get_vm_stats(cmd::VmStatsRequest {
            domain_stats: Some(cmd::DomainStatsRequest {}),
            ..cmd::VmStatsRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unknown);
    assert_eq!(
        status.message(),
        "VMStatsCollector feature gate is not enabled"
    );
}
