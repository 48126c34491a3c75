//! NIC hotplug and unplug by diff, and link state, for a running domain: KubeVirt's
//! `network.Sync` (`pkg/virt-launcher/virtwrap/network/manager.go`, `nichotplug.go`, v1.9.0) over
//! QMP instead of libvirt.
//!
//! KubeVirt hot-plugs bridge-binding interfaces on Multus networks. A secondary interface is
//! plugged once the VMI status reports it attached to the pod (`status.interfaces[].infoSource`
//! contains `multus-status`); until then it is left out of the conversion. Its pod interface is
//! `status.interfaces[].podInterfaceName`, else KubeVirt's hashed name `pod<sha256(network)[..11]>`
//! (`pkg/network/namescheme`). Plugging one sets up the bridge binding for that pod interface
//! (bridge `k6t-<hash>`, tap `tap<hash>`, the pod link renamed `<hash>-nic`; [`crate::net`]), starts
//! its DHCP server when the pod interface has an IPv4 address, opens the tap
//! (`IFF_TAP|IFF_NO_PI|IFF_VNET_HDR`, as libvirt) and hands it to QEMU: `getfd`, `netdev_add`
//! `hostua-<name>`, `device_add` `ua-<name>` with the spec MAC (else the pod interface's) into a
//! free PCIe root port. An interface that turns `state: absent` (or leaves the spec) is unplugged:
//! `device_del`, `DEVICE_DELETED`, `netdev_del`, and its binding torn down (the pod link gets its
//! name, MAC and addresses back). A changed `state: down`/`up` becomes `set_link`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::cmdline::context::{IfaceFacts, TapSource};
use crate::cmdline::plan::{DeviceClass, DomainPlan};
use crate::cmdline::render::NicHotplug;
use crate::cmdline::ConverterContext;
use crate::net::{self, NetPlan};
use crate::qmp::client::QmpClient;
use crate::qmp::hotplug::{self, NicAttach, NicDetach};
use crate::sync::facts::network::{plan_binding, serve_dhcp};
use crate::sync::facts::secondary::SecondaryIface;
use crate::sync::SyncError;
use crate::sys::mac::MacAddr;

/// A NIC plugged by diff, and its pod-side binding.
struct PluggedNic {
    device_id: String,
    netdev_id: String,
    net: NetPlan,
    applied: net::Applied,
    /// Stops its DHCP server (dropped: stopped too).
    dhcp_stop: watch::Sender<bool>,
}

/// What one diff changed in the domain's interfaces.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NicChanges {
    /// Interfaces plugged: (name, guest MAC `aa:bb:..`).
    pub added: Vec<(String, String)>,
    /// Interfaces unplugged, by name.
    pub removed: Vec<String>,
    /// Links set up (`true`) or down, by device id.
    pub links: Vec<(String, bool)>,
}

impl NicChanges {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.links.is_empty()
    }
}

/// The NICs of a running domain as far as hotplug is concerned.
#[derive(Default)]
pub struct NicState {
    plugged: BTreeMap<String, PluggedNic>,
    /// Binding plans made for interfaces about to be plugged (pure plans, nothing applied yet).
    prepared: BTreeMap<String, NetPlan>,
    /// Link state by NIC device id (absent: up).
    link_up: BTreeMap<String, bool>,
}

impl std::fmt::Debug for NicState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NicState")
            .field("plugged", &self.plugged.keys().collect::<Vec<_>>())
            .field("link_up", &self.link_up)
            .finish_non_exhaustive()
    }
}

impl NicState {
    /// The state of a freshly started domain: links listed in `plan.links_down` are down.
    pub fn at_boot(plan: &DomainPlan) -> NicState {
        NicState {
            link_up: plan
                .links_down
                .iter()
                .map(|id| (id.clone(), false))
                .collect(),
            ..NicState::default()
        }
    }

    /// Sets up, before QEMU starts, the binding of every secondary interface Multus already
    /// attached: the domain boots with them (QEMU opens their taps by name) and they are
    /// unplugged by diff like hot-plugged ones. Returns `(name, guest MAC, facts)` per interface.
    pub async fn setup_at_boot(
        &mut self,
        secondary: &[SecondaryIface],
        resolv_conf: &Path,
    ) -> Result<Vec<(String, String, IfaceFacts)>, SyncError> {
        let mut out = Vec::new();
        for s in secondary.iter().filter(|s| s.ready) {
            let boot = async {
                let plan = plan_binding(&s.cfg, resolv_conf).await?;
                let applied = net::apply(&plan).await.map_err(SyncError::Net)?;
                let (dhcp_stop, dhcp_rx) = watch::channel(false);
                serve_dhcp(&plan, dhcp_rx)?;
                Ok::<_, SyncError>((plan, applied, dhcp_stop))
            };
            let (plan, applied, dhcp_stop) = boot.await.map_err(|e| in_iface(&s.name, e))?;
            let mac = MacAddr(plan.guest_mac).to_string();
            let facts = IfaceFacts {
                mac: Some(mac.clone()),
                mtu: Some(plan.mtu),
                tap: TapSource::Ifname(plan.tap.clone()),
            };
            let id = crate::cmdline::names::alias(&s.name);
            info!(interface = %s.name, tap = %plan.tap, "secondary network ready");
            self.plugged.insert(
                s.name.clone(),
                PluggedNic {
                    netdev_id: format!("host{id}"),
                    device_id: id,
                    net: plan,
                    applied,
                    dhcp_stop,
                },
            );
            out.push((s.name.clone(), mac, facts));
        }
        Ok(out)
    }

    /// Takes over the link states of the domain started from `plan`.
    pub fn started(&mut self, plan: &DomainPlan) {
        self.link_up = NicState::at_boot(plan).link_up;
    }

    /// For each ready secondary interface not yet plugged: reads its pod interface and plans its
    /// binding (nothing is changed yet) and gives the converter its facts (MAC, MTU, a tap passed
    /// by fd). Errors: the pod interface is missing or unusable.
    pub async fn prepare(
        &mut self,
        secondary: &[SecondaryIface],
        ctx: &mut ConverterContext,
        resolv_conf: &Path,
    ) -> Result<(), SyncError> {
        for s in secondary.iter().filter(|s| s.ready) {
            if self.plugged.contains_key(&s.name) {
                continue;
            }
            let plan = match self.prepared.get(&s.name) {
                Some(p) if p.pod_iface == s.cfg.pod_iface => p.clone(),
                _ => plan_binding(&s.cfg, resolv_conf)
                    .await
                    .map_err(|e| in_iface(&s.name, e))?,
            };
            ctx.interfaces.insert(
                s.name.clone(),
                IfaceFacts {
                    mac: Some(MacAddr(plan.guest_mac).to_string()),
                    mtu: Some(plan.mtu),
                    // Passed with `getfd`; the number only matters on a command line.
                    tap: TapSource::Fds {
                        fds: vec![-1],
                        vhostfds: vec![],
                    },
                },
            );
            self.prepared.insert(s.name.clone(), plan);
        }
        Ok(())
    }

    /// Applies the NIC part of the diff against the converted `plan`: unplugs the plugged NICs
    /// whose interface is no longer a ready secondary interface, plugs the ready ones not plugged
    /// yet (`nics`: the QMP plan's NICs), then sets every NIC's link as the spec says.
    pub async fn apply(
        &mut self,
        client: &QmpClient,
        plan: &DomainPlan,
        nics: &[NicHotplug],
        secondary: &[SecondaryIface],
        unplug_timeout: Duration,
    ) -> Result<NicChanges, SyncError> {
        let mut changes = NicChanges::default();
        let ready: BTreeSet<&str> = secondary
            .iter()
            .filter(|s| s.ready)
            .map(|s| s.name.as_str())
            .collect();
        let gone: Vec<String> = self
            .plugged
            .keys()
            .filter(|n| !ready.contains(n.as_str()))
            .cloned()
            .collect();
        for name in gone {
            let Some(p) = self.plugged.get(&name) else {
                continue;
            };
            let detach = NicDetach {
                device_id: p.device_id.clone(),
                netdev_id: p.netdev_id.clone(),
            };
            hotplug::detach_nic(client, &detach, unplug_timeout)
                .await
                .map_err(|e| in_iface(&name, SyncError::Qmp(e)))?;
            let Some(p) = self.plugged.remove(&name) else {
                continue;
            };
            self.link_up.remove(&p.device_id);
            let _ = p.dhcp_stop.send(true);
            let undone = net::teardown(&p.net, &p.applied)
                .await
                .map_err(|e| in_iface(&name, SyncError::Net(e)))?;
            info!(interface = %name, device = %p.device_id, ?undone, "NIC unplugged");
            changes.removed.push(name);
        }
        for s in secondary.iter().filter(|s| s.ready) {
            if self.plugged.contains_key(&s.name) {
                continue;
            }
            let id = crate::cmdline::names::alias(&s.name);
            let nic = nics.iter().find(|n| n.id == id).ok_or_else(|| {
                SyncError::Unsupported(format!(
                    "interface {}: the converter made no hot-pluggable NIC for it",
                    s.name
                ))
            })?;
            let Some(net_plan) = self.prepared.remove(&s.name) else {
                continue;
            };
            let plugged = plug(client, nic, net_plan)
                .await
                .map_err(|e| in_iface(&s.name, e))?;
            changes
                .added
                .push((s.name.clone(), MacAddr(plugged.net.guest_mac).to_string()));
            self.plugged.insert(s.name.clone(), plugged);
        }
        for d in plan.devices.iter().filter(|d| d.class == DeviceClass::Nic) {
            let id = d.device.id().to_string();
            let want_up = !plan.links_down.contains(&id);
            let is_up = self.link_up.get(&id).copied().unwrap_or(true);
            if want_up != is_up {
                hotplug::set_link(client, &id, want_up)
                    .await
                    .map_err(SyncError::Qmp)?;
                info!(device = %id, up = want_up, "NIC link state set");
                changes.links.push((id.clone(), want_up));
            }
            self.link_up.insert(id, want_up);
        }
        Ok(changes)
    }
}

/// `e` as the failure of interface `name`.
fn in_iface(name: &str, e: SyncError) -> SyncError {
    SyncError::Interface {
        interface: name.to_string(),
        source: Box::new(e),
    }
}

/// Sets up the binding, then hands the tap to QEMU. When QEMU refuses the NIC, the binding is
/// torn down again.
async fn plug(
    client: &QmpClient,
    nic: &NicHotplug,
    net_plan: NetPlan,
) -> Result<PluggedNic, SyncError> {
    let applied = net::apply(&net_plan).await.map_err(SyncError::Net)?;
    let (dhcp_stop, dhcp_rx) = watch::channel(false);
    let attached = async {
        serve_dhcp(&net_plan, dhcp_rx)?;
        attach(client, nic, &net_plan.tap).await
    }
    .await;
    if let Err(e) = attached {
        let _ = dhcp_stop.send(true);
        if let Err(t) = net::teardown(&net_plan, &applied).await {
            warn!(
                error = &t as &dyn std::error::Error,
                tap = %net_plan.tap,
                "cannot tear down the binding of a NIC that failed to plug"
            );
        }
        return Err(e);
    }
    info!(device = %nic.id, tap = %net_plan.tap, pod_iface = %net_plan.pod_iface, "NIC plugged");
    Ok(PluggedNic {
        device_id: nic.id.clone(),
        netdev_id: nic.netdev["id"].as_str().unwrap_or_default().to_string(),
        net: net_plan,
        applied,
        dhcp_stop,
    })
}

/// `getfd` + `netdev_add` + `device_add` of `nic` on the tap `tap`, in the first free root port.
async fn attach(client: &QmpClient, nic: &NicHotplug, tap: &str) -> Result<(), SyncError> {
    let fd_name = nic
        .getfd
        .first()
        .and_then(|g| g["fdname"].as_str())
        .ok_or_else(|| {
            SyncError::Unsupported(format!("NIC {}: hotplug needs exactly one tap fd", nic.id))
        })?
        .to_string();
    if nic.getfd.len() != 1 {
        return Err(SyncError::Unsupported(format!(
            "NIC {}: hotplug of a multi-queue or vhost NIC",
            nic.id
        )));
    }
    let mut device = nic.device.clone();
    let ports = hotplug::free_root_ports(client)
        .await
        .map_err(SyncError::Qmp)?;
    let port = ports.first().ok_or_else(|| {
        SyncError::Unsupported(format!("hotplug of {}: no free PCIe root port", nic.id))
    })?;
    device["bus"] = port.clone().into();
    device["addr"] = "0x0".into();
    let tap_fd = crate::qmp::tap::open_tap(tap, true).map_err(SyncError::Qmp)?;
    let attach = NicAttach {
        tap_fd,
        fd_name,
        extra_fds: vec![],
        netdev: nic.netdev.clone(),
        device,
    };
    hotplug::attach_nic(client, &attach)
        .await
        .map_err(SyncError::Qmp)
}
