//! Host devices across a live migration, as KubeVirt v1.9.0 handles them
//! (`live-migration-source.go` `prepareDomainForMigration` / `hotUnplugHostDevices`,
//! `device/hostdevice/sriov/hostdev.go` `SafelyDetachHostDevices`,
//! `device/hostdevice/hotplug.go`, `pkg/virt-handler/vm.go`
//! `vmiContainsNonMigratablePCIHostDevices`):
//!
//! - **SR-IOV VFs do not migrate; they are re-plugged.** Before the source builds the definition
//!   of its running domain it hot-unplugs every SR-IOV host device (QEMU id `ua-sriov-<iface>`,
//!   KubeVirt's alias prefix `sriov-`): `device_del` of each, then it waits for their
//!   `DEVICE_DELETED` ([`unplug_sriov`], KubeVirt's 30 s [`DETACH_TIMEOUT`]). A refused
//!   `device_del` or a guest that does not release them in time fails the migration with
//!   KubeVirt's reason ([`SriovDetachError`] under [`PREPARE_FAILED`]) and the VMI runs on
//!   (virt-handler re-plugs what was released with `HotplugHostDevices`). The definition sent
//!   excludes them ([`without_sriov_devices`]); the target drops them from its own conversion
//!   as well (KubeVirt's target creates no SR-IOV devices, `isMigrationTarget`), and after the
//!   migration virt-handler's `hotplugSriovInterfaces` sends `HotplugHostDevices` to the target,
//!   which plugs the VFs of the target pod from its network-info
//!   ([`crate::sync::cmdapi::host_devices`]).
//! - **Other host devices refuse the migration** ([`not_migratable`]): a VMI with generic
//!   `hostDevices`, more than one GPU, or a GPU that is not a mediated device is not
//!   live-migratable in KubeVirt (condition `LiveMigratable` false, reason
//!   [`HOST_DEVICE_NOT_MIGRATABLE`]; virt-api then refuses the migration with "Cannot migrate
//!   VMI, Reason: …, Message: …"). A `MigrateVirtualMachine` that still reaches the launcher
//!   fails the migration with that text before anything is touched.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::qmp::commands::{DeviceDel, ObjectPropertyInfo, QomList};
use crate::qmp::{QmpClient, QmpError};
use crate::vmi::Vmi;

/// QEMU id prefix of SR-IOV host devices: `ua-` (libvirt's user alias) + KubeVirt's
/// `sriov-` alias prefix (`deviceinfo.SRIOVAliasPrefix`).
pub const SRIOV_DEVICE_PREFIX: &str = "ua-sriov-";

/// How long the source waits for the guest to release the SR-IOV devices (KubeVirt's
/// `waitForDetachTimeout`); restarted by each device released, as KubeVirt's wait loop is.
pub const DETACH_TIMEOUT: Duration = Duration::from_secs(30);

/// The text KubeVirt puts before an unplug failure in the migration's failure reason
/// (`migrateHelper`).
pub const PREPARE_FAILED: &str = "error encountered during preparing domain for migration";

/// KubeVirt's reason of the `LiveMigratable` condition for host devices.
pub const HOST_DEVICE_NOT_MIGRATABLE: &str = "HostDeviceNotLiveMigratable";

/// Why the SR-IOV devices could not be unplugged (the texts of KubeVirt's
/// `SafelyDetachHostDevices`, with QEMU's device id in place of libvirt's device XML).
#[derive(Debug, thiserror::Error)]
pub enum SriovDetachError {
    /// The devices could not be listed.
    #[error("failed to detach host-devices: {0}")]
    List(QmpError),
    /// QEMU refused `device_del`.
    #[error("failed to detach hostdev {alias}, err: {error}")]
    Detach {
        /// The device's alias (`sriov-<iface>`).
        alias: String,
        /// QEMU's error.
        error: QmpError,
    },
    /// Not every device was released in time (or QMP closed while waiting).
    #[error(
        "failed to wait for host-devices detach, timeout reached: {}/{}",
        go_list(.detached),
        go_list(.all)
    )]
    Timeout {
        /// The aliases released.
        detached: Vec<String>,
        /// Every alias unplugged.
        all: Vec<String>,
    },
}

/// A string list as Go's `%v` prints a `[]string`: `[a b]`.
fn go_list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

/// The alias KubeVirt's domain shows for the QEMU id `id` (`ua-sriov-x` → `sriov-x`).
pub fn alias_of(id: &str) -> &str {
    id.strip_prefix("ua-").unwrap_or(id)
}

/// The ids of the SR-IOV devices among `qom-list /machine/peripheral`'s children, in QEMU's
/// order.
pub fn sriov_ids(children: &[ObjectPropertyInfo]) -> Vec<String> {
    children
        .iter()
        .filter(|c| c.kind.starts_with("child<") && c.name.starts_with(SRIOV_DEVICE_PREFIX))
        .map(|c| c.name.clone())
        .collect()
}

/// `argv` without the `-device` words of SR-IOV devices (`id` starting with
/// [`SRIOV_DEVICE_PREFIX`]): the definition of a domain whose VFs are unplugged. The root ports
/// they sat on stay (their state is in the stream; the target re-plugs there).
pub fn without_sriov_devices(argv: &[String]) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Word {
        id: Option<String>,
    }
    let is_sriov = |w: &str| {
        serde_json::from_str::<Word>(w)
            .ok()
            .and_then(|w| w.id)
            .is_some_and(|id| id.starts_with(SRIOV_DEVICE_PREFIX))
    };
    let mut out = Vec::with_capacity(argv.len());
    let mut i = 0;
    while i < argv.len() {
        if argv[i] == "-device" && argv.get(i + 1).is_some_and(|w| is_sriov(w)) {
            i += 2;
            continue;
        }
        out.push(argv[i].clone());
        i += 1;
    }
    out
}

/// Hot-unplugs every SR-IOV device of the running domain: `qom-list /machine/peripheral`,
/// `device_del` of each `ua-sriov-*` in that order (subscribed to events first), then waits for
/// a `DEVICE_DELETED` of each, up to `timeout` after the last one released (KubeVirt's
/// `SafelyDetachHostDevices`). Returns the aliases unplugged (`sriov-<iface>`; empty when there
/// are none, without any `device_del`).
///
/// # Errors
/// [`SriovDetachError`]: the list failed, a `device_del` was refused (devices before it stay
/// unplugged), or not all were released in time.
pub async fn unplug_sriov(
    client: &QmpClient,
    timeout: Duration,
) -> Result<Vec<String>, SriovDetachError> {
    let children = client
        .run(&QomList {
            path: "/machine/peripheral".into(),
        })
        .await
        .map_err(SriovDetachError::List)?;
    let ids = sriov_ids(&children);
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let all: Vec<String> = ids.iter().map(|i| alias_of(i).to_owned()).collect();
    let mut events = client.events();
    for id in &ids {
        client
            .run(&DeviceDel { id: id.clone() })
            .await
            .map_err(|error| SriovDetachError::Detach {
                alias: alias_of(id).to_owned(),
                error,
            })?;
        tracing::info!(device = %id, "SR-IOV host device unplug requested for the migration");
    }
    let mut pending: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let mut detached = Vec::new();
    while !pending.is_empty() {
        let released = events
            .wait_for("DEVICE_DELETED", "the SR-IOV host devices", timeout, |ev| {
                ev.name == "DEVICE_DELETED"
                    && ev.data["device"]
                        .as_str()
                        .is_some_and(|d| pending.contains(d))
            })
            .await;
        let Ok(ev) = released else {
            return Err(SriovDetachError::Timeout { detached, all });
        };
        let id = ev.data["device"].as_str().unwrap_or_default().to_owned();
        pending.remove(id.as_str());
        detached.push(alias_of(&id).to_owned());
    }
    Ok(all)
}

/// KubeVirt's refusal of a VMI whose host devices cannot migrate, as virt-api words it ("Cannot
/// migrate VMI, Reason: HostDeviceNotLiveMigratable, Message: …"), or `None` when it may
/// migrate. SR-IOV interfaces do not count (they are re-plugged). `gpu_is_mdev(name)` says
/// whether the GPU `name` runs as a mediated device (KubeVirt asks the cluster's permitted
/// mediated devices; the launcher knows what it started). KubeVirt also requires the
/// `VGPULiveMigration` feature gate for a vGPU, which the launcher cannot see: a vGPU is let
/// through, and QEMU refuses `migrate` if its vendor driver has no migration support.
pub fn not_migratable(vmi: &Vmi, gpu_is_mdev: impl Fn(&str) -> bool) -> Option<String> {
    let devices = &vmi.spec.domain.devices;
    let gpus = devices.gpus.as_deref().unwrap_or_default();
    let message = if !devices
        .host_devices
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        "VMI specifies non-migratable generic PCI host device"
    } else if gpus.len() > 1 {
        "VMI specifies too many GPUs"
    } else if gpus.first().is_some_and(|g| !gpu_is_mdev(&g.name)) {
        "VMI specifies non-migratable GPU device"
    } else {
        return None;
    };
    Some(format!(
        "Cannot migrate VMI, Reason: {HOST_DEVICE_NOT_MIGRATABLE}, Message: {message}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(name: &str, kind: &str) -> ObjectPropertyInfo {
        ObjectPropertyInfo {
            name: name.into(),
            kind: kind.into(),
        }
    }

    #[test]
    fn only_sriov_children_are_unplugged() {
        let ids = sriov_ids(&[
            child("type", "string"),
            child("pci.3", "child<pcie-root-port>"),
            child("ua-sriov-vf2", "child<vfio-pci>"),
            child("ua-hostdevice-x", "child<vfio-pci>"),
            child("ua-sriov-vf1", "child<vfio-pci>"),
            child("ua-sriov-link", "link<vfio-pci>"),
        ]);
        assert_eq!(ids, ["ua-sriov-vf2", "ua-sriov-vf1"]);
        assert_eq!(alias_of("ua-sriov-vf1"), "sriov-vf1");
    }

    #[test]
    fn the_definition_drops_sriov_devices_and_keeps_their_root_ports() {
        let w = |s: &str| s.to_owned();
        let argv = vec![
            w("-device"),
            w(r#"{"driver":"pcie-root-port","id":"pci.3","bus":"pcie.0"}"#),
            w("-device"),
            w(
                r#"{"driver":"vfio-pci","host":"0000:3b:02.3","id":"ua-sriov-vf","bus":"pci.3","addr":"0x0"}"#,
            ),
            w("-device"),
            w(
                r#"{"driver":"vfio-pci","host":"0000:65:00.0","id":"ua-hostdevice-x","bus":"pci.4"}"#,
            ),
            w("-name"),
            w("guest=default_hv"),
            w("-device"),
        ];
        let kept = without_sriov_devices(&argv);
        assert_eq!(
            kept,
            vec![
                argv[0].clone(),
                argv[1].clone(),
                argv[4].clone(),
                argv[5].clone(),
                argv[6].clone(),
                argv[7].clone(),
                argv[8].clone(),
            ]
        );
        assert_eq!(without_sriov_devices(&kept), kept);
    }

    /// The source and the target pod convert the same VMI with different VFs: once the SR-IOV
    /// words are dropped the two definitions are the same word for word (the root port the VF
    /// sat on included), which is what the target compares.
    #[test]
    fn both_pods_definitions_agree_without_their_vfs() {
        use crate::cmdline::context::{host_device_id, HostDeviceKind, HostDeviceSource};
        use crate::cmdline::{convert, render, ConverterContext};
        let vmi: Vmi = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "v", "namespace": "ns", "uid": "uid1"},
            "spec": {
                "domain": {"devices": {
                    "disks": [{"name": "d", "disk": {"bus": "virtio"}}],
                    "interfaces": [{"name": "vf", "sriov": {}, "bootOrder": 2}]},
                    "memory": {"guest": "128Mi"}},
                "networks": [{"name": "vf", "multus": {"networkName": "sriov-net"}}],
                "volumes": [{"name": "d", "emptyDisk": {"capacity": "1Gi"}}]
            }
        }))
        .unwrap();
        let on = |addr: &str| {
            let mut ctx = ConverterContext::default();
            ctx.host_devices.insert(
                host_device_id(HostDeviceKind::Sriov, "vf"),
                HostDeviceSource::Pci(addr.into()),
            );
            render::argv(&convert(&vmi, &ctx).unwrap())
        };
        let (source, target) = (on("0000:3b:02.3"), on("0000:5e:00.4"));
        assert_ne!(source, target);
        let (s, t) = (
            without_sriov_devices(&source),
            without_sriov_devices(&target),
        );
        assert_eq!(s, t);
        assert_eq!(s.len(), source.len() - 2);
        let vf_bus = source
            .iter()
            .find(|w| w.contains(r#""id":"ua-sriov-vf""#))
            .and_then(|w| serde_json::from_str::<serde_json::Value>(w).ok())
            .and_then(|v| v["bus"].as_str().map(str::to_owned))
            .unwrap();
        assert!(
            s.iter().any(|w| w.contains(&format!(r#""id":"{vf_bus}""#))),
            "the VF's root port {vf_bus} stays: {s:?}"
        );
    }

    #[test]
    fn detach_failures_read_as_kubevirts() {
        let e = SriovDetachError::Timeout {
            detached: vec![],
            all: vec!["sriov-a".into(), "sriov-b".into()],
        };
        assert_eq!(
            e.to_string(),
            "failed to wait for host-devices detach, timeout reached: []/[sriov-a sriov-b]"
        );
        let e = SriovDetachError::Timeout {
            detached: vec!["sriov-b".into()],
            all: vec!["sriov-a".into(), "sriov-b".into()],
        };
        assert_eq!(
            e.to_string(),
            "failed to wait for host-devices detach, timeout reached: [sriov-b]/[sriov-a sriov-b]"
        );
    }

    fn vmi(devices: serde_json::Value) -> Vmi {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "v", "uid": "u"},
            "spec": {"domain": {"devices": devices}}
        }))
        .unwrap()
    }

    #[test]
    fn non_sriov_host_devices_are_refused_with_kubevirts_reason() {
        let none = |_: &str| false;
        let mdev = |n: &str| n == "vgpu";
        let cases = [
            (
                serde_json::json!({"interfaces": [{"name": "vf", "sriov": {}}]}),
                None,
            ),
            (
                serde_json::json!({"hostDevices": [{"name": "x", "deviceName": "vendor/dev"}]}),
                Some("VMI specifies non-migratable generic PCI host device"),
            ),
            (
                serde_json::json!({"gpus": [{"name": "a", "deviceName": "g"},
                                             {"name": "b", "deviceName": "g"}]}),
                Some("VMI specifies too many GPUs"),
            ),
            (
                serde_json::json!({"gpus": [{"name": "a", "deviceName": "g"}]}),
                Some("VMI specifies non-migratable GPU device"),
            ),
        ];
        for (devices, want) in cases {
            let got = not_migratable(&vmi(devices.clone()), none);
            assert_eq!(
                got,
                want.map(|m| format!(
                    "Cannot migrate VMI, Reason: HostDeviceNotLiveMigratable, Message: {m}"
                )),
                "{devices}"
            );
        }
        let vgpu = vmi(serde_json::json!({"gpus": [{"name": "vgpu", "deviceName": "g"}]}));
        assert_eq!(not_migratable(&vgpu, mdev), None);
    }
}
