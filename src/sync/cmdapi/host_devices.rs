//! `HotplugHostDevices`: SR-IOV VFs as VFIO host devices, from the pod's network-info
//! (`manager.go` `HotplugHostDevices`, `device/hostdevice/sriov/hostdev.go`,
//! `device/hostdevice/hotplug.go`, v1.9.0; libvirt's `<hostdev type='pci' managed='no'>` attach).
//!
//! Desired devices: the VMI's interfaces with the `sriov` binding that virt-handler already sees
//! in Multus's status. Their host PCI addresses come from the downward-API file
//! `/etc/podinfo/network-info` (`{"interfaces": [{"network": <name>, "deviceInfo": {"type":
//! "pci", "pci": {"pci-address": "0000:65:00.2"}}}]}`), keyed by network name. Devices whose
//! alias `sriov-<iface>` the domain already has, or that QEMU already runs ([`plugged_sriov`]),
//! are skipped. This is also how SR-IOV NICs come back after a live migration: the source
//! unplugs them, and virt-handler's `hotplugSriovInterfaces` sends this RPC to the target, which
//! plugs the VFs of its own pod. Each remaining one must exist on
//! the node (`/sys/bus/pci/devices/<addr>`): an absent device is refused with a message naming it
//! (libvirt would fail the same `device_add`; KubeVirt only logs it, virt-handler retries). Each
//! is plugged with `device_add {driver: vfio-pci, host, id: ua-sriov-<iface>, bus: <free root
//! port>, addr: 0x0[, bootindex]}`; the domain then lists it in `Devices.HostDevices` with alias
//! `sriov-<iface>` (the name virt-handler's network status looks for).
//!
//! As in KubeVirt (`LibvirtDomainManager.HotplugHostDevices`), the RPC answers at once and the
//! plug runs in the background, one at a time ([`HotplugRunner`]): a call while one runs is
//! refused with [`HOTPLUG_IN_PROGRESS`]; every other failure (no domain, no PCI address, an
//! absent VF, QEMU refusing) is only logged, prefixed [`HOTPLUG_FAILED`]. virt-handler learns
//! the outcome from the domain (the `sriov-<iface>` host devices) and calls again with backoff
//! until they appear.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::CmdApiError;
use crate::qmp::client::QmpClient;
use crate::qmp::commands::VfioPciAdd;

/// The downward-API network-info file in the pod (KubeVirt `downwardapi.NetworkInfoVolumePath`).
pub const NETWORK_INFO_PATH: &str = "/etc/podinfo/network-info";

/// Prefix of SR-IOV host-device aliases (KubeVirt `sriov.AliasPrefix`).
pub const SRIOV_ALIAS_PREFIX: &str = "sriov-";

/// The message when no interface has a PCI address (KubeVirt's).
pub const NO_PCI_MAPPING: &str = "found no SR-IOV networks to PCI-Address mapping";

/// The answer to a `HotplugHostDevices` while an earlier one still runs (KubeVirt's).
pub const HOTPLUG_IN_PROGRESS: &str = "hot-plug host-devices is in progress";

/// The prefix of a background hotplug's logged failure (KubeVirt's).
pub const HOTPLUG_FAILED: &str = "failed to hot-plug host-devices";

/// Runs host-device hotplugs in the background, at most one at a time (KubeVirt's
/// `hotplugHostDevicesInProgress`, capacity 1).
#[derive(Debug, Default)]
pub struct HotplugRunner {
    busy: Arc<AtomicBool>,
}

/// Clears the busy flag when the background task ends, however it ends.
struct Idle(Arc<AtomicBool>);

impl Drop for Idle {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl HotplugRunner {
    /// Starts `work` in the background and returns at once; its error is logged with the
    /// [`HOTPLUG_FAILED`] prefix. Needs a Tokio runtime.
    ///
    /// # Errors
    /// [`CmdApiError::Refused`] with [`HOTPLUG_IN_PROGRESS`] while an earlier `work` runs.
    pub fn start<F>(&self, work: F) -> Result<(), CmdApiError>
    where
        F: Future<Output = Result<Vec<HostDevicePlug>, CmdApiError>> + Send + 'static,
    {
        if self.busy.swap(true, Ordering::SeqCst) {
            return Err(CmdApiError::Refused(HOTPLUG_IN_PROGRESS.into()));
        }
        let idle = Idle(self.busy.clone());
        tokio::spawn(async move {
            let _idle = idle;
            match work.await {
                Ok(plugged) if plugged.is_empty() => {}
                Ok(plugged) => {
                    let aliases: Vec<String> = plugged.iter().map(HostDevicePlug::alias).collect();
                    tracing::info!(devices = ?aliases, "host devices hot-plugged");
                }
                Err(e) => tracing::error!("{HOTPLUG_FAILED}: {e}"),
            }
        });
        Ok(())
    }

    /// Whether a hotplug runs.
    pub fn in_progress(&self) -> bool {
        self.busy.load(Ordering::SeqCst)
    }
}

/// Timeout of each `device_add`.
const QMP_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, Deserialize)]
struct NetworkInfo {
    #[serde(default)]
    interfaces: Vec<NetworkInfoInterface>,
}

#[derive(Debug, Deserialize)]
struct NetworkInfoInterface {
    #[serde(default)]
    network: String,
    #[serde(rename = "deviceInfo", default)]
    device_info: Option<DeviceInfo>,
}

#[derive(Debug, Deserialize)]
struct DeviceInfo {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    pci: Option<PciInfo>,
}

#[derive(Debug, Deserialize)]
struct PciInfo {
    #[serde(rename = "pci-address", default)]
    pci_address: String,
}

/// Network name → host PCI address, from the network-info JSON (untrusted: bad JSON or entries
/// without a PCI address give an empty or smaller map, never an error).
pub fn parse_network_info(json: &str) -> BTreeMap<String, String> {
    let Ok(info) = serde_json::from_str::<NetworkInfo>(json) else {
        return BTreeMap::new();
    };
    info.interfaces
        .into_iter()
        .filter_map(|i| {
            let d = i.device_info?;
            let addr = d.pci?.pci_address;
            (d.kind == "pci" && !addr.is_empty() && !i.network.is_empty())
                .then_some((i.network, addr))
        })
        .collect()
}

/// An SR-IOV interface of the VMI that should be plugged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SriovInterface {
    /// Interface (and network) name.
    pub name: String,
    /// `bootOrder`, if any.
    pub boot_order: Option<u32>,
}

/// One host device to plug.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDevicePlug {
    /// Interface name.
    pub interface: String,
    /// Host PCI address (`0000:65:00.2`).
    pub host: String,
    /// QEMU device id, `ua-sriov-<iface>`.
    pub id: String,
    /// Boot order.
    pub boot_order: Option<u32>,
}

impl HostDevicePlug {
    /// The domain's alias name of the device (`sriov-<iface>`).
    pub fn alias(&self) -> String {
        format!("{SRIOV_ALIAS_PREFIX}{}", self.interface)
    }
}

/// The devices to plug: `desired` minus those whose alias is in `present` (`sriov-<iface>`),
/// each with its address from `pool`.
///
/// # Errors
/// [`CmdApiError::Refused`] with [`NO_PCI_MAPPING`] for an empty pool, or naming an interface
/// the pool has no address for.
pub fn plan(
    desired: &[SriovInterface],
    pool: &BTreeMap<String, String>,
    present: &BTreeSet<String>,
) -> Result<Vec<HostDevicePlug>, CmdApiError> {
    let wanted: Vec<&SriovInterface> = desired
        .iter()
        .filter(|i| !present.contains(&format!("{SRIOV_ALIAS_PREFIX}{}", i.name)))
        .collect();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    if pool.is_empty() {
        return Err(CmdApiError::Refused(NO_PCI_MAPPING.into()));
    }
    wanted
        .into_iter()
        .map(|i| {
            let host = pool.get(&i.name).ok_or_else(|| {
                CmdApiError::Refused(format!(
                    "failed to create SR-IOV hostdevice for interface {}: no PCI address in the pod's network-info",
                    i.name
                ))
            })?;
            Ok(HostDevicePlug {
                interface: i.name.clone(),
                host: host.clone(),
                id: format!("ua-{SRIOV_ALIAS_PREFIX}{}", i.name),
                boot_order: i.boot_order,
            })
        })
        .collect()
}

/// Refuses a device the node does not have: `<sysfs>/bus/pci/devices/<addr>` must exist, and
/// its VFIO group node `/dev/vfio/<group>` (under `dev`) when the device has an IOMMU group.
///
/// # Errors
/// [`CmdApiError::Refused`] naming the interface, the address and the missing path.
pub fn check_present(plug: &HostDevicePlug, sysfs: &Path, dev: &Path) -> Result<(), CmdApiError> {
    let device: PathBuf = sysfs.join("bus/pci/devices").join(&plug.host);
    if !device.exists() {
        return Err(CmdApiError::Refused(format!(
            "host device {} of SR-IOV interface {} is absent: no {}",
            plug.host,
            plug.interface,
            device.display()
        )));
    }
    if let Ok(group) = std::fs::read_link(device.join("iommu_group")) {
        if let Some(n) = group.file_name() {
            let node = dev.join("vfio").join(n);
            if !node.exists() {
                return Err(CmdApiError::Refused(format!(
                    "host device {} of SR-IOV interface {} has no VFIO device node {}",
                    plug.host,
                    plug.interface,
                    node.display()
                )));
            }
        }
    }
    Ok(())
}

/// Plugs `plugs` in order, each on the next of `free_ports`.
///
/// # Errors
/// [`CmdApiError::Refused`] when the ports run out; [`CmdApiError::Qmp`] for a refused
/// `device_add` (the devices plugged before stay).
pub async fn attach(
    client: &QmpClient,
    plugs: &[HostDevicePlug],
    free_ports: &[String],
) -> Result<(), CmdApiError> {
    let mut ports = free_ports.iter();
    for p in plugs {
        let Some(port) = ports.next() else {
            return Err(CmdApiError::Refused(format!(
                "no free PCIe root port for host device {} of interface {}",
                p.host, p.interface
            )));
        };
        let add = VfioPciAdd {
            driver: "vfio-pci",
            host: p.host.clone(),
            id: p.id.clone(),
            bus: port.clone(),
            addr: "0x0".into(),
            bootindex: p.boot_order,
        };
        client.run_timeout(&add, QMP_TIMEOUT).await?;
    }
    Ok(())
}

/// The SR-IOV VFs QEMU runs: the `ua-sriov-<iface>` children of `/machine/peripheral`, each with
/// the host address it was plugged from (`qom-get <id> host`, `DDDD:BB:SS.F`). Those on QEMU's
/// command line are among them, and so is none that a migration's source unplugged
/// ([`crate::sync::migration::sriov`]): what the domain must list as `sriov-<iface>` host
/// devices, and what a hotplug must not plug again.
///
/// # Errors
/// [`CmdApiError::Qmp`] when QOM does not answer.
pub async fn plugged_sriov(client: &QmpClient) -> Result<Vec<HostDevicePlug>, CmdApiError> {
    use crate::qmp::commands::{QomGet, QomList};
    let children = client
        .run(&QomList {
            path: "/machine/peripheral".into(),
        })
        .await?;
    let mut out = Vec::new();
    for c in children {
        let prefix = format!("ua-{SRIOV_ALIAS_PREFIX}");
        let Some(interface) = c.name.strip_prefix(&prefix) else {
            continue;
        };
        if !c.kind.starts_with("child<") {
            continue;
        }
        let host = client
            .run(&QomGet {
                path: format!("/machine/peripheral/{}", c.name),
                property: "host".into(),
            })
            .await?;
        out.push(HostDevicePlug {
            interface: interface.to_owned(),
            host: host.as_str().unwrap_or_default().to_owned(),
            id: c.name.clone(),
            boot_order: None,
        });
    }
    Ok(out)
}

/// Plans, checks and plugs the SR-IOV devices: `desired` minus `present` (aliases), addresses
/// from `pool`, each checked on the node under `sysfs` and `dev`, on the free root ports QOM
/// reports. Returns what was plugged (nothing when all are present).
///
/// # Errors
/// As [`plan`], [`check_present`] (before anything is plugged), [`attach`], and the QOM queries.
pub async fn hotplug_sriov(
    client: &QmpClient,
    desired: &[SriovInterface],
    pool: &BTreeMap<String, String>,
    present: &BTreeSet<String>,
    sysfs: &Path,
    dev: &Path,
) -> Result<Vec<HostDevicePlug>, CmdApiError> {
    let plugs = plan(desired, pool, present)?;
    if plugs.is_empty() {
        return Ok(plugs);
    }
    for p in &plugs {
        check_present(p, sysfs, dev)?;
    }
    let ports = crate::qmp::hotplug::free_root_ports(client).await?;
    attach(client, &plugs, &ports).await?;
    Ok(plugs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_info_maps_networks_to_pci_addresses() {
        let pool = parse_network_info(
            r#"{"interfaces":[{"network":"sriov1","deviceInfo":{"type":"pci","version":"1.1.0",
            "pci":{"pci-address":"0000:65:00.2"}},"mac":"02:00:00:00:00:01"},
            {"network":"default","deviceInfo":null}]}"#,
        );
        assert_eq!(
            pool,
            BTreeMap::from([("sriov1".to_string(), "0000:65:00.2".to_string())])
        );
        assert!(parse_network_info("not json").is_empty());
    }

    #[test]
    fn plan_skips_present_and_refuses_unknown() {
        let pool = BTreeMap::from([("a".to_string(), "0000:65:00.2".to_string())]);
        let desired = vec![
            SriovInterface {
                name: "a".into(),
                boot_order: Some(2),
            },
            SriovInterface {
                name: "b".into(),
                boot_order: None,
            },
        ];
        let present = BTreeSet::from(["sriov-b".to_string()]);
        let p = plan(&desired, &pool, &present).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].id, "ua-sriov-a");
        assert_eq!(p[0].alias(), "sriov-a");
        let e = plan(&desired, &pool, &BTreeSet::new()).unwrap_err();
        assert!(e.to_string().contains("interface b"), "{e}");
        let e = plan(&desired, &BTreeMap::new(), &BTreeSet::new()).unwrap_err();
        assert_eq!(e.to_string(), NO_PCI_MAPPING);
    }
}
