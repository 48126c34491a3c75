//! The backup tests' shared pieces: the CBT VMI they run and the BackupVirtualMachine call.

use qlauncher::sync::rpc::proto::cmd::v1 as cmd;
use serde_json::{json, Value};

use crate::guest::{self, Console};
use crate::handler::{self, Client};

/// A VMI named `name` with the test guest's root disk and a 16 MiB filesystem PVC `data`
/// (`vdb`), with `status.changedBlockTracking.state` = `state` (`Initializing`, `Enabled`, ...):
/// what virt-handler sends for a VM with changed block tracking.
pub fn cbt_vmi(name: &str, uid: &str, state: &str) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {
            "domain": {
                "resources": {"requests": {"memory": "128Mi"}},
                "devices": {
                    "autoattachPodInterface": false,
                    "disks": [
                        {"name": "rootdisk", "disk": {"bus": "virtio"}},
                        {"name": "data", "disk": {"bus": "virtio"}}
                    ]
                }
            },
            "volumes": [
                {"name": "rootdisk", "containerDisk": {"image": "qlauncher/test-guest:latest"}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-claim"}}
            ]
        },
        "status": {
            "changedBlockTracking": {"state": state},
            "volumeStatus": [{
                "name": "data",
                "target": "vdb",
                "persistentVolumeClaimInfo": {
                    "claimName": "data-claim",
                    "accessModes": ["ReadWriteOnce"],
                    "volumeMode": "Filesystem",
                    "capacity": {"storage": "16Mi"},
                    "requests": {"storage": "16Mi"},
                    "filesystemOverhead": "0"
                }
            }]
        }
    })
}

/// `BackupVirtualMachine` of `vmi` with `options` (KubeVirt's BackupOptions JSON), as
/// virt-handler sends it; panics on a transport error.
pub async fn backup(client: &mut Client, vmi: &Value, options: Value) -> cmd::Response {
    client
        .backup_virtual_machine(cmd::BackupRequest {
            vmi: Some(handler::vmi_message(vmi)),
            options: options.to_string().into_bytes(),
        })
        .await
        .expect("BackupVirtualMachine")
        .into_inner()
}

/// Runs `command` in the guest's shell; panics (with the console's transcript) unless it
/// exits 0; returns its output.
pub fn sh(console: &mut Console, command: &str) -> String {
    let (status, out) = console
        .run(command, guest::BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}; console:\n{}", console.transcript()));
    assert_eq!(status, 0, "{command}: {out}");
    out
}
