//! The backup tests' shared pieces: the CBT VMI they run, the BackupVirtualMachine call, the
//! guest's writes, the backup metadata of the domain events and the restore of a backup chain.

use std::path::Path;
use std::time::{Duration, Instant};

use qlauncher::sync::domain::BackupMetadata;
use qlauncher::sync::rpc::proto::cmd::v1 as cmd;
use serde_json::{json, Value};

use crate::guest::{self, Console};
use crate::handler::{self, Client};
use crate::notify::Received;
use crate::storage::run;

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

/// KubeVirt's checkpoint name for backup `name` started at `start` (RFC 3339 UTC, as
/// `2026-12-03T11:00:01Z`): `<name>-<YYYY-MM-DD_HH-MM-SS>`.
pub fn checkpoint(name: &str, start: &str) -> String {
    let stamp = start
        .trim_end_matches('Z')
        .replace('T', "_")
        .replace(':', "-");
    format!("{name}-{stamp}")
}

/// The guest shell command that writes `len` bytes of `byte` at byte `offset` of
/// `/dev/<device>` (both multiples of 4 KiB) and syncs them to the disk.
pub fn write_script(device: &str, byte: char, offset: usize, len: usize) -> String {
    assert!(offset.is_multiple_of(4096) && len.is_multiple_of(4096));
    format!(
        "dd if=/dev/zero bs=4096 count={} 2>/dev/null | tr '\\000' '{byte}' | \
         dd of=/dev/{device} bs=4096 seek={} conv=fsync 2>/dev/null && sync",
        len / 4096,
        offset / 4096
    )
}

/// [`write_script`] to `/dev/vdb` ([`cbt_vmi`]'s CBT disk) run on the guest's serial console.
pub fn write(console: &mut Console, byte: char, offset: usize, len: usize) {
    sh(console, &write_script("vdb", byte, offset, len));
}

/// `vmi` (virtio disks only) with the CBT disk of [`cbt_vmi`] added after its disks: the
/// 16 MiB filesystem PVC `data`, its `status.volumeStatus` and
/// `status.changedBlockTracking.state` = `state` (other status fields kept). Returns the VMI
/// and the disk's guest device (`vdc` after two disks).
pub fn with_cbt_data_disk(mut vmi: Value, state: &str) -> (Value, String) {
    let cbt = cbt_vmi("", "", state);
    let disks = vmi["spec"]["domain"]["devices"]["disks"]
        .as_array_mut()
        .expect("spec.domain.devices.disks");
    let target = format!(
        "vd{}",
        char::from(b'a' + u8::try_from(disks.len()).unwrap())
    );
    disks.push(cbt["spec"]["domain"]["devices"]["disks"][1].clone());
    vmi["spec"]["volumes"]
        .as_array_mut()
        .expect("spec.volumes")
        .push(cbt["spec"]["volumes"][1].clone());
    if !vmi["status"].is_object() {
        vmi["status"] = json!({});
    }
    vmi["status"]["changedBlockTracking"] = cbt["status"]["changedBlockTracking"].clone();
    let mut volume = cbt["status"]["volumeStatus"].clone();
    volume[0]["target"] = target.clone().into();
    vmi["status"]["volumeStatus"] = volume;
    (vmi, target)
}

/// `RedefineCheckpoint` of checkpoint `name` on the guest disk `target` (volume `data`) of
/// `vmi`, as virt-handler sends it for a tracker's latest checkpoint; panics on a transport
/// error.
pub async fn redefine(
    client: &mut Client,
    vmi: &Value,
    name: &str,
    target: &str,
) -> cmd::RedefineCheckpointResponse {
    client
        .redefine_checkpoint(cmd::RedefineCheckpointRequest {
            vmi: Some(handler::vmi_message(vmi)),
            checkpoint: json!({"name": name, "creationTime": "2026-12-03T10:00:00Z",
                "volumes": [{"volumeName": "data", "diskTarget": target}]})
            .to_string()
            .into_bytes(),
        })
        .await
        .expect("RedefineCheckpoint")
        .into_inner()
}

/// The backup metadata of every domain event received so far for backup `name`, in order.
pub fn backup_events(received: &Received, name: &str) -> Vec<BackupMetadata> {
    received
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(_, d)| d.spec.metadata.kubevirt.backup.clone())
        .filter(|b| b.name == name)
        .collect()
}

/// Waits (up to 120 s) for the domain event that completes backup `name`; returns its metadata.
pub async fn completed(received: &Received, name: &str) -> BackupMetadata {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(b) = backup_events(received, name)
            .into_iter()
            .find(|b| b.completed)
        {
            return b;
        }
        assert!(Instant::now() < deadline, "backup {name} did not complete");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The raw content of a backup chain: `qemu-img convert -O raw` of a copy of `top` (its
/// backing file as recorded, or rebased with `qemu-img rebase -u` on `base` first), made in
/// `scratch` and removed after.
pub fn restore(top: &Path, base: Option<&Path>, scratch: &Path) -> Vec<u8> {
    let copy = scratch.join("restore.qcow2");
    std::fs::copy(top, &copy).unwrap();
    if let Some(base) = base {
        run(
            "qemu-img",
            &[
                "rebase",
                "-u",
                "-F",
                "qcow2",
                "-b",
                base.to_str().unwrap(),
                copy.to_str().unwrap(),
            ],
        );
    }
    let raw = scratch.join("restore.raw");
    run(
        "qemu-img",
        &[
            "convert",
            "-O",
            "raw",
            copy.to_str().unwrap(),
            raw.to_str().unwrap(),
        ],
    );
    let bytes = std::fs::read(&raw).unwrap();
    std::fs::remove_file(&copy).unwrap();
    std::fs::remove_file(&raw).unwrap();
    bytes
}
