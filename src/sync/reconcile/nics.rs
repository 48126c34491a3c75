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
use crate::sync::error::SyncError;
use crate::sync::facts::network::{plan_binding, serve_dhcp};
use crate::sync::facts::secondary::SecondaryIface;
use crate::sys::mac::MacAddr;

/// A NIC plugged by diff, and its pod-side binding.
struct PluggedNic {
    device_id: String,
    netdev_id: String,
    net: NetPlan,
    applied: net::Applied,
    /// Stops its DHCP server (dropped: stopped too).
    dhcp_stop: watch::Sender<bool>,
    /// The QMP plan it was hot-plugged with, its device on the bus and address where it runs;
    /// `None` for a NIC QEMU started with (its binding set up before the start).
    hotplug: Option<NicHotplug>,
}

/// Where a running PCI device sits, as a hot-plug plan names it: its bus's id (`pci.7`, a
/// root port's bus has the port's id) and its address on it (`0x0`, `0x1f.0x2` with a
/// function).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The bus id (`bus=`).
    pub bus: String,
    /// The PCI address (`addr=`), slot and function as libvirt and the hot-plug path write it.
    pub addr: String,
}

impl Placement {
    /// From QOM: the device's `parent_bus` (the bus's canonical path, e.g.
    /// `/machine/peripheral/pci.7/pci.7`; its last component is the bus id) and its `addr`
    /// (QEMU's devfn, `slot << 3 | function`, 0..=255). `None` for anything else.
    pub fn from_qom(parent_bus: &str, devfn: i64) -> Option<Placement> {
        let bus = parent_bus.rsplit('/').next().filter(|b| {
            !b.is_empty()
                && b.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
        })?;
        let devfn = u8::try_from(devfn).ok()?;
        let (slot, function) = (devfn >> 3, devfn & 7);
        let addr = if function == 0 {
            format!("{slot:#x}")
        } else {
            format!("{slot:#x}.{function:#x}")
        };
        Some(Placement {
            bus: bus.to_owned(),
            addr,
        })
    }
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
                    hotplug: None,
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

    /// The NICs hot-plugged into the running domain (by diff, or before `migrate-incoming` on a
    /// migration target), as plugged: netdev and device with the device's bus and address, in
    /// interface name order. NICs QEMU started with are not listed.
    pub fn hotplugged(&self) -> impl Iterator<Item = &NicHotplug> {
        self.plugged.values().filter_map(|p| p.hotplug.as_ref())
    }

    /// The device ids of the plugged NICs not known as hot-plugged: the ones a freshly started
    /// launcher set up for the boot ([`Self::setup_at_boot`]), some of which an adopted QEMU
    /// may run hot-plugged ([`Self::recover_hotplugged`]).
    pub fn unplaced(&self) -> Vec<String> {
        self.plugged
            .values()
            .filter(|p| p.hotplug.is_none())
            .map(|p| p.device_id.clone())
            .collect()
    }

    /// After a restarted launcher adopted a running QEMU ([`crate::sync::recover`]): which of the
    /// secondary NICs it set up for the boot that QEMU runs hot-plugged, with their placement.
    /// A NIC counts as hot-plugged when QEMU runs its device (`placements`, by device id, read
    /// from QOM: [`Placement::from_qom`]) but its command line (`boot_ids`: the `-device` ids
    /// of QEMU's own argv) has no such device; it then gets the QMP plan of its interface
    /// (`plans`: the converter's NICs, matched by device id and netdev id) at the bus and
    /// address it runs at, so that [`Self::hotplugged`] lists it again (a migration sends it)
    /// and it unplugs by diff as before. NICs on the command line stay boot NICs; a NIC with
    /// no plan or no placement is left as it is. Returns the recovered interface names. Pure.
    pub fn recover_hotplugged(
        &mut self,
        plans: &[NicHotplug],
        boot_ids: &BTreeSet<String>,
        placements: &BTreeMap<String, Placement>,
    ) -> Vec<String> {
        let unplaced: Vec<(String, String, String)> = self
            .plugged
            .iter()
            .filter(|(_, p)| p.hotplug.is_none())
            .map(|(name, p)| (name.clone(), p.device_id.clone(), p.netdev_id.clone()))
            .collect();
        let mut recovered = Vec::new();
        for (name, placed) in recovered_plans(&unplaced, plans, boot_ids, placements) {
            if let Some(p) = self.plugged.get_mut(&name) {
                p.hotplug = Some(placed);
                recovered.push(name);
            }
        }
        recovered
    }

    /// Plugs `nic` (already placed: its device has the bus and address it must take) on the tap
    /// of its interface's binding, which [`Self::setup_at_boot`] set up in this pod: what a
    /// migration target does for each NIC the source had hot-plugged, into its `-S -incoming
    /// defer` QEMU before `migrate-incoming` (libvirt's target has the NIC on its command line).
    /// The NIC then counts as hot-plugged ([`Self::hotplugged`]) and unplugs by diff.
    ///
    /// Errors: no binding was set up for the interface (the target pod lacks its Multus link or
    /// the VMI status does not report it attached), the tap cannot be opened, or QEMU refuses
    /// `getfd`, `netdev_add` or `device_add` (undone).
    pub async fn attach_placed(
        &mut self,
        client: &QmpClient,
        nic: &NicHotplug,
    ) -> Result<(), SyncError> {
        let Some(p) = self.plugged.get_mut(&nic.name) else {
            return Err(in_iface(
                &nic.name,
                SyncError::Unsupported(
                    "no binding of this interface in the pod (not attached by Multus?)".into(),
                ),
            ));
        };
        attach_on(client, nic, &p.net.tap)
            .await
            .map_err(|e| in_iface(&nic.name, e))?;
        info!(device = %nic.id, tap = %p.net.tap, bus = ?nic.device.bus, addr = ?nic.device.addr, "NIC plugged at its placement");
        p.hotplug = Some(nic.clone());
        Ok(())
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

    /// What runs, as the diff sees it: the plugged interfaces and the link states.
    pub fn view(&self) -> NicView {
        NicView {
            plugged: self.plugged.keys().cloned().collect(),
            links: self
                .link_up
                .iter()
                .map(|(id, up)| (id.clone(), *up))
                .collect(),
        }
    }

    /// Applies the NIC part of the diff against the converted `plan` ([`diff`] of [`Self::view`]
    /// against [`wanted`]): unplugs the plugged NICs whose interface is no longer a ready
    /// secondary interface, plugs the ready ones not plugged yet (`nics`: the QMP plan's NICs),
    /// then sets every NIC's link as the spec says.
    pub async fn apply(
        &mut self,
        client: &QmpClient,
        plan: &DomainPlan,
        nics: &[NicHotplug],
        secondary: &[SecondaryIface],
        unplug_timeout: Duration,
    ) -> Result<NicChanges, SyncError> {
        let wanted = wanted(plan, secondary);
        let mut changes = NicChanges::default();
        for step in diff(&self.view(), &wanted) {
            match step {
                NicStep::Unplug { name } => {
                    self.unplug(client, &name, unplug_timeout).await?;
                    changes.removed.push(name);
                }
                NicStep::Plug { name, id } => {
                    let nic = nics.iter().find(|n| n.id == id).ok_or_else(|| {
                        SyncError::Unsupported(format!(
                            "interface {name}: the converter made no hot-pluggable NIC for it"
                        ))
                    })?;
                    let Some(net_plan) = self.prepared.remove(&name) else {
                        continue;
                    };
                    let plugged = plug(client, nic, net_plan)
                        .await
                        .map_err(|e| in_iface(&name, e))?;
                    changes
                        .added
                        .push((name.clone(), MacAddr(plugged.net.guest_mac).to_string()));
                    self.plugged.insert(name, plugged);
                }
                NicStep::SetLink { id, up } => {
                    hotplug::set_link(client, &id, up)
                        .await
                        .map_err(SyncError::Qmp)?;
                    info!(device = %id, up, "NIC link state set");
                    self.link_up.insert(id.clone(), up);
                    changes.links.push((id, up));
                }
            }
        }
        for (id, up) in wanted.links {
            self.link_up.insert(id, up);
        }
        Ok(changes)
    }

    /// Unplugs the NIC of interface `name` and tears its binding down.
    async fn unplug(
        &mut self,
        client: &QmpClient,
        name: &str,
        unplug_timeout: Duration,
    ) -> Result<(), SyncError> {
        let Some(p) = self.plugged.get(name) else {
            return Ok(());
        };
        let detach = NicDetach {
            device_id: p.device_id.clone(),
            netdev_id: p.netdev_id.clone(),
        };
        hotplug::detach_nic(client, &detach, unplug_timeout)
            .await
            .map_err(|e| in_iface(name, SyncError::Qmp(e)))?;
        let Some(p) = self.plugged.remove(name) else {
            return Ok(());
        };
        self.link_up.remove(&p.device_id);
        let _ = p.dhcp_stop.send(true);
        let undone = net::teardown(&p.net, &p.applied)
            .await
            .map_err(|e| in_iface(name, SyncError::Net(e)))?;
        info!(interface = %name, device = %p.device_id, ?undone, "NIC unplugged");
        Ok(())
    }
}

/// The domain's NICs as the diff compares them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NicView {
    /// Secondary interfaces plugged by diff, by VMI interface name (running: as plugged;
    /// wanted: the ready ones, in spec order).
    pub plugged: Vec<String>,
    /// Link state by NIC device id (running: absent means up; wanted: every NIC of the plan,
    /// in plan order).
    pub links: Vec<(String, bool)>,
}

/// The NICs `plan` wants: the ready secondary interfaces plugged, and each NIC's link up unless
/// the plan lists it in `links_down` (`state: down`).
pub fn wanted(plan: &DomainPlan, secondary: &[SecondaryIface]) -> NicView {
    NicView {
        plugged: secondary
            .iter()
            .filter(|s| s.ready)
            .map(|s| s.name.clone())
            .collect(),
        links: plan
            .devices
            .iter()
            .filter(|d| d.class == DeviceClass::Nic)
            .map(|d| {
                let id = d.device.id().to_string();
                let up = !plan.links_down.contains(&id);
                (id, up)
            })
            .collect(),
    }
}

/// One step of the NIC diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NicStep {
    /// Unplug the NIC of this interface (`device_del`, `DEVICE_DELETED`, `netdev_del`) and tear
    /// its binding down.
    Unplug {
        /// VMI interface name.
        name: String,
    },
    /// Set the binding of this interface up and plug its NIC (`getfd`, `netdev_add`,
    /// `device_add` into a free root port).
    Plug {
        /// VMI interface name.
        name: String,
        /// Its device id in the QMP plan (`ua-<name>`).
        id: String,
    },
    /// `set_link` of a NIC.
    SetLink {
        /// Device id.
        id: String,
        /// Link up.
        up: bool,
    },
}

/// The NIC diff of what runs against what is wanted: unplugs (running order), then plugs
/// (wanted order), then the link changes (a NIC without a running state is up). Pure.
pub fn diff(running: &NicView, wanted: &NicView) -> Vec<NicStep> {
    let wanted_names: BTreeSet<&str> = wanted.plugged.iter().map(String::as_str).collect();
    let running_names: BTreeSet<&str> = running.plugged.iter().map(String::as_str).collect();
    let running_links: BTreeMap<&str, bool> = running
        .links
        .iter()
        .map(|(id, up)| (id.as_str(), *up))
        .collect();
    let unplug = running
        .plugged
        .iter()
        .filter(|n| !wanted_names.contains(n.as_str()))
        .map(|name| NicStep::Unplug { name: name.clone() });
    let plug = wanted
        .plugged
        .iter()
        .filter(|n| !running_names.contains(n.as_str()))
        .map(|name| NicStep::Plug {
            name: name.clone(),
            id: crate::cmdline::names::alias(name),
        });
    let links = wanted
        .links
        .iter()
        .filter(|(id, up)| running_links.get(id.as_str()).copied().unwrap_or(true) != *up)
        .map(|(id, up)| NicStep::SetLink {
            id: id.clone(),
            up: *up,
        });
    unplug.chain(plug).chain(links).collect()
}

/// The pure mapping of [`NicState::recover_hotplugged`]: for each `(interface, device id,
/// netdev id)` of `unplaced`, the plan of `plans` with that device and netdev id placed where
/// `placements` says it runs, unless the device is on QEMU's command line (`boot_ids`) or has
/// no plan or no placement.
fn recovered_plans(
    unplaced: &[(String, String, String)],
    plans: &[NicHotplug],
    boot_ids: &BTreeSet<String>,
    placements: &BTreeMap<String, Placement>,
) -> Vec<(String, NicHotplug)> {
    unplaced
        .iter()
        .filter(|(_, device, _)| !boot_ids.contains(device))
        .filter_map(|(name, device, netdev)| {
            let at = placements.get(device)?;
            let plan = plans
                .iter()
                .find(|n| &n.id == device && &n.netdev.id == netdev)?;
            let mut placed = plan.clone();
            placed.device.bus = Some(at.bus.clone());
            placed.device.addr = Some(at.addr.clone());
            Some((name.clone(), placed))
        })
        .collect()
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
    let placed = match attached {
        Ok(placed) => placed,
        Err(e) => {
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
    };
    info!(device = %nic.id, tap = %net_plan.tap, pod_iface = %net_plan.pod_iface, "NIC plugged");
    Ok(PluggedNic {
        device_id: nic.id.clone(),
        netdev_id: nic.netdev.id.clone(),
        net: net_plan,
        applied,
        dhcp_stop,
        hotplug: Some(placed),
    })
}

/// `getfd` + `netdev_add` + `device_add` of `nic` on the tap `tap`, in the first free root port;
/// returns `nic` as placed.
async fn attach(client: &QmpClient, nic: &NicHotplug, tap: &str) -> Result<NicHotplug, SyncError> {
    let mut placed = nic.clone();
    let ports = hotplug::free_root_ports(client)
        .await
        .map_err(SyncError::Qmp)?;
    let port = ports.first().ok_or_else(|| {
        SyncError::Unsupported(format!("hotplug of {}: no free PCIe root port", nic.id))
    })?;
    placed.device.place_on_root_port(port);
    attach_on(client, &placed, tap).await?;
    Ok(placed)
}

/// `getfd` + `netdev_add` + `device_add` of `nic` (its device where it says) on the tap `tap`,
/// opened here (`IFF_TAP|IFF_NO_PI|IFF_VNET_HDR`).
async fn attach_on(client: &QmpClient, nic: &NicHotplug, tap: &str) -> Result<(), SyncError> {
    let fd_name = nic
        .getfd
        .first()
        .map(|g| g.fdname.as_str())
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
    let tap_fd = crate::qmp::tap::open_tap(tap, true).map_err(SyncError::Qmp)?;
    let attach = NicAttach {
        tap_fd,
        fd_name,
        extra_fds: vec![],
        netdev: nic.netdev.clone(),
        device: nic.device.clone(),
    };
    hotplug::attach_nic(client, &attach)
        .await
        .map_err(SyncError::Qmp)
}

/// Test fixtures for hot-plugged NICs, shared by the unit tests of the reconciler and the
/// migration's hotplug placement.
#[cfg(test)]
pub(crate) mod fixtures {
    use crate::cmdline::qemu::{Device, DeviceDel, DeviceNic, GetFd, NetdevDel, NetdevTap};
    use crate::cmdline::render::{NicHotplug, PlacedDevice};

    /// The hot-plug plan of a bridge NIC `name` (virtio, tap by fd, guest MAC `mac`) on `bus`
    /// slot 0 (no place when `bus` is `None`).
    pub(crate) fn nic(name: &str, mac: &str, bus: Option<&str>) -> NicHotplug {
        let id = format!("ua-{name}");
        NicHotplug {
            name: name.into(),
            getfd: vec![GetFd {
                fdname: format!("tapfd-{id}-0"),
            }],
            netdev: NetdevTap {
                type_: "tap",
                id: format!("host{id}"),
                fd: Some(format!("tapfd-{id}-0")),
                fds: None,
                ifname: None,
                script: None,
                downscript: None,
                vhost: None,
                vhostfd: None,
                vhostfds: None,
                queues: None,
            },
            device: PlacedDevice {
                device: Device::Nic(DeviceNic {
                    driver: "virtio-net-pci-non-transitional",
                    netdev: format!("host{id}"),
                    id: id.clone(),
                    mac: Some(mac.into()),
                    host_mtu: Some(1400),
                    romfile: Some(String::new()),
                    rombar: None,
                    rx_queue_size: None,
                    tx_queue_size: None,
                    bootindex: None,
                    mq: None,
                    vectors: None,
                    acpi_index: None,
                }),
                iommu_platform: None,
                bus: bus.map(str::to_owned),
                addr: bus.map(|_| "0x0".to_owned()),
            },
            device_del: DeviceDel { id: id.clone() },
            netdev_del: NetdevDel {
                id: format!("host{id}"),
            },
            id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(plugged: &[&str], links: &[(&str, bool)]) -> NicView {
        NicView {
            plugged: plugged.iter().map(|s| s.to_string()).collect(),
            links: links.iter().map(|(id, up)| (id.to_string(), *up)).collect(),
        }
    }

    fn unplug(name: &str) -> NicStep {
        NicStep::Unplug { name: name.into() }
    }

    fn plug(name: &str) -> NicStep {
        NicStep::Plug {
            name: name.into(),
            id: format!("ua-{name}"),
        }
    }

    fn link(id: &str, up: bool) -> NicStep {
        NicStep::SetLink { id: id.into(), up }
    }

    /// The converter's hot-plug plan of a bridge NIC `name` (virtio, tap by fd) at its boot
    /// place, `pci.3` slot 0.
    fn nic_plan(name: &str) -> NicHotplug {
        fixtures::nic(name, "0a:58:0a:f4:01:07", Some("pci.3"))
    }

    #[test]
    fn qom_placements_read_as_hotplug_plans_write_them() {
        let at = |bus: &str, addr: &str| {
            Some(Placement {
                bus: bus.into(),
                addr: addr.into(),
            })
        };
        // QEMU 7.2: a device on root port pci.7 (the port's bus has its id), slot 0.
        assert_eq!(
            Placement::from_qom("/machine/peripheral/pci.7/pci.7", 0),
            at("pci.7", "0x0")
        );
        assert_eq!(
            Placement::from_qom("/machine/q35/pcie.0", 24),
            at("pcie.0", "0x3")
        );
        assert_eq!(
            Placement::from_qom("/machine/q35/pcie.0", 0xfa),
            at("pcie.0", "0x1f.0x2")
        );
        for (bus, devfn) in [
            ("/machine/peripheral/pci.7/pci.7", 256),
            ("/machine/peripheral/pci.7/pci.7", -1),
            ("", 0),
            ("/machine/peripheral/", 0),
            ("/machine/peripheral/pci,7", 0),
        ] {
            assert_eq!(Placement::from_qom(bus, devfn), None, "{bus} {devfn}");
        }
    }

    #[test]
    fn an_adopted_qemu_s_nics_missing_from_its_command_line_are_hot_plugged_where_they_run() {
        let triple = |name: &str| {
            (
                name.to_owned(),
                format!("ua-{name}"),
                format!("hostua-{name}"),
            )
        };
        // blue was hot-plugged (on pci.9), red is on QEMU's command line, green runs but the
        // converter has no plan of it, grey has a plan but QEMU does not run it, and black's
        // plan has another netdev.
        let unplaced = ["blue", "red", "green", "grey", "black"].map(triple);
        let mut black = nic_plan("black");
        black.netdev.id = "other".into();
        let plans = [nic_plan("blue"), nic_plan("red"), nic_plan("grey"), black];
        let boot_ids: BTreeSet<String> = ["ua-default", "ua-red"].map(String::from).into();
        let placements: BTreeMap<String, Placement> = ["blue", "red", "green", "black"]
            .map(|n| {
                (
                    format!("ua-{n}"),
                    Placement {
                        bus: "pci.9".into(),
                        addr: "0x0".into(),
                    },
                )
            })
            .into();
        let got = recovered_plans(&unplaced, &plans, &boot_ids, &placements);
        assert_eq!(got.len(), 1, "{got:?}");
        let (name, placed) = &got[0];
        assert_eq!(name, "blue");
        assert_eq!(placed.device.bus.as_deref(), Some("pci.9"));
        assert_eq!(placed.device.addr.as_deref(), Some("0x0"));
        // Everything else is the converter's plan: the migration describes it from that.
        let mut want = nic_plan("blue");
        want.device.bus = Some("pci.9".into());
        assert_eq!(placed, &want);
        let sent = crate::sync::migration::hotplug::describe_nic(placed);
        assert_eq!(
            (sent.bus.as_deref(), sent.netdev.as_deref()),
            (Some("pci.9"), Some("hostua-blue"))
        );
    }

    #[test]
    fn nic_diff_unplugs_plugs_then_sets_links() {
        let cases = [
            // Nothing plugged, nothing wanted.
            (view(&[], &[]), view(&[], &[("ua-default", true)]), vec![]),
            // A new ready interface is plugged; its NIC starts up.
            (
                view(&[], &[]),
                view(&["blue"], &[("ua-default", true), ("ua-blue", true)]),
                vec![plug("blue")],
            ),
            // Plugged in spec order, not name order.
            (
                view(&[], &[]),
                view(&["red", "blue"], &[]),
                vec![plug("red"), plug("blue")],
            ),
            // An interface that left (or turned absent) is unplugged first.
            (
                view(&["blue", "red"], &[("ua-blue", true)]),
                view(&["green", "red"], &[("ua-red", true), ("ua-green", true)]),
                vec![unplug("blue"), plug("green")],
            ),
            // state: down on a running NIC, and up again.
            (
                view(&[], &[("ua-default", true)]),
                view(&[], &[("ua-default", false)]),
                vec![link("ua-default", false)],
            ),
            (
                view(&[], &[("ua-default", false)]),
                view(&[], &[("ua-default", true)]),
                vec![link("ua-default", true)],
            ),
            // A NIC plugged down: plugged, then its link set down.
            (
                view(&[], &[]),
                view(&["blue"], &[("ua-blue", false)]),
                vec![plug("blue"), link("ua-blue", false)],
            ),
            // Nothing changed.
            (
                view(&["blue"], &[("ua-blue", false)]),
                view(&["blue"], &[("ua-blue", false)]),
                vec![],
            ),
        ];
        for (running, wanted, steps) in cases {
            assert_eq!(diff(&running, &wanted), steps, "{running:?} -> {wanted:?}");
        }
    }
}
