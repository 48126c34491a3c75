//! Executes a [`NetPlan`] in the current network namespace, idempotently, and tears it down.
//!
//! Every step first reads the kernel state and changes only what differs, so running
//! [`apply()`] again on a configured namespace changes nothing ([`Applied::changed`] is
//! empty). [`teardown()`] removes what setup made: the NAT tables it marked, the tap, the
//! bridge, the stand-in link, and it gives the pod link back its name, MAC, addresses and routes
//! (bridge binding), and restores the sysctls [`Applied`] recorded.

use crate::net::discover::link_by_name;
use crate::net::nft::Family;
use crate::net::plan::{LinkStep, NetPlan};
use crate::net::{adopt, nft_netlink, sysctl, tap, NetError};
use futures_util::TryStreamExt;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use netlink_packet_core::Nla;
use netlink_packet_route::address::{AddressAttribute, AddressHeaderFlags};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoTun, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::RouteProtocol;
use rtnetlink::{Handle, LinkBridge, LinkBridgePort, LinkIfb, LinkUnspec, RouteMessageBuilder};
use std::net::IpAddr;

/// What [`apply()`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Applied {
    /// Each change made, in order, as a short phrase (`add bridge k6t-eth0`); empty when the
    /// namespace was already configured.
    pub changed: Vec<String>,
    /// The sysctls changed, with their previous values, for [`teardown()`].
    pub sysctl_previous: Vec<(String, String)>,
    /// virt-handler had set the plan up already: it was adopted unchanged
    /// ([`crate::net::adopt`]) and [`teardown()`] leaves it alone.
    pub adopted: bool,
}

fn nl(step: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetError {
    let step = step.into();
    move |source| NetError::Netlink { step, source }
}

/// The facts of an existing link that setup compares against.
pub(crate) struct LinkFacts {
    pub(crate) index: u32,
    pub(crate) mac: Option<Vec<u8>>,
    pub(crate) mtu: Option<u32>,
    pub(crate) master: Option<u32>,
    pub(crate) up: bool,
    pub(crate) kind: Option<InfoKind>,
    /// A tun/tap's owner uid (`IFLA_TUN_OWNER` in its link info), read over netlink so that it is
    /// the current network namespace's link (sysfs shows the mounting namespace's).
    pub(crate) tun_owner: Option<u32>,
}

fn facts(l: &LinkMessage) -> LinkFacts {
    let mut f = LinkFacts {
        index: l.header.index,
        mac: None,
        mtu: None,
        master: None,
        up: l.header.flags.contains(LinkFlags::Up),
        kind: None,
        tun_owner: None,
    };
    for a in &l.attributes {
        match a {
            LinkAttribute::Address(m) => f.mac = Some(m.clone()),
            LinkAttribute::Mtu(m) => f.mtu = Some(*m),
            LinkAttribute::Controller(c) => f.master = Some(*c),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        LinkInfo::Kind(k) => f.kind = Some(k.clone()),
                        LinkInfo::Data(InfoData::Tun(nlas)) => f.tun_owner = tun_owner(nlas),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    f
}

/// `IFLA_TUN_OWNER` (`include/uapi/linux/if_link.h`): a native-endian u32 uid; absent or
/// `u32::MAX` (`INVALID_UID`) when the tap has no owner.
fn tun_owner(nlas: &[InfoTun]) -> Option<u32> {
    const IFLA_TUN_OWNER: u16 = 1;
    nlas.iter().find_map(|n| {
        let InfoTun::Other(nla) = n else {
            return None;
        };
        if nla.kind() != IFLA_TUN_OWNER || nla.value_len() != 4 {
            return None;
        }
        let mut b = [0u8; 4];
        nla.emit_value(&mut b);
        Some(u32::from_ne_bytes(b)).filter(|&uid| uid != u32::MAX)
    })
}

pub(crate) async fn link(handle: &Handle, name: &str) -> Result<Option<LinkFacts>, NetError> {
    Ok(link_by_name(handle, name).await?.map(|l| facts(&l)))
}

pub(crate) async fn addresses_of(handle: &Handle, index: u32) -> Result<Vec<IpNet>, NetError> {
    let mut out = Vec::new();
    let mut s = handle
        .address()
        .get()
        .set_link_index_filter(index)
        .execute();
    while let Some(a) = s
        .try_next()
        .await
        .map_err(nl(format!("get addresses of link {index}")))?
    {
        let p = a.header.prefix_len;
        for attr in &a.attributes {
            match attr {
                AddressAttribute::Local(IpAddr::V4(v)) => {
                    if let Ok(n) = Ipv4Net::new(*v, p) {
                        out.push(IpNet::V4(n));
                    }
                }
                AddressAttribute::Address(IpAddr::V6(v)) => {
                    if let Ok(n) = Ipv6Net::new(*v, p) {
                        out.push(IpNet::V6(n));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(out)
}

async fn ensure_addresses(
    handle: &Handle,
    name: &str,
    index: u32,
    wanted: &[IpNet],
    changed: &mut Vec<String>,
) -> Result<(), NetError> {
    let have = addresses_of(handle, index).await?;
    for a in wanted {
        if have.contains(a) {
            continue;
        }
        let mut req = handle.address().add(index, a.addr(), a.prefix_len());
        if a.addr().is_ipv6() {
            req.message_mut().header.flags = AddressHeaderFlags::Nodad;
        }
        req.execute()
            .await
            .map_err(nl(format!("add address {a} to {name}")))?;
        changed.push(format!("add address {a} to {name}"));
    }
    Ok(())
}

async fn set_link(
    handle: &Handle,
    msg: LinkMessage,
    step: String,
    changed: &mut Vec<String>,
) -> Result<(), NetError> {
    handle
        .link()
        .set(msg)
        .execute()
        .await
        .map_err(nl(step.clone()))?;
    changed.push(step);
    Ok(())
}

async fn ensure_bridge(
    handle: &Handle,
    name: &str,
    mac: Option<[u8; 6]>,
    mtu: u32,
    addresses: &[IpNet],
    changed: &mut Vec<String>,
) -> Result<(), NetError> {
    let l = match link(handle, name).await? {
        Some(l) => l,
        None => {
            let mut b = LinkBridge::new(name).mtu(mtu);
            if let Some(m) = mac {
                b = b.address(m.to_vec());
            }
            handle
                .link()
                .add(b.build())
                .execute()
                .await
                .map_err(nl(format!("add bridge {name}")))?;
            changed.push(format!("add bridge {name}"));
            link(handle, name)
                .await?
                .ok_or_else(|| NetError::PodInterfaceMissing(name.into()))?
        }
    };
    if let Some(m) = mac {
        if l.mac.as_deref() != Some(&m[..]) {
            let msg = LinkUnspec::new_with_index(l.index)
                .address(m.to_vec())
                .build();
            set_link(handle, msg, format!("set MAC of {name}"), changed).await?;
        }
    }
    if l.mtu != Some(mtu) {
        let msg = LinkUnspec::new_with_index(l.index).mtu(mtu).build();
        set_link(handle, msg, format!("set MTU {mtu} on {name}"), changed).await?;
    }
    ensure_addresses(handle, name, l.index, addresses, changed).await?;
    if !l.up {
        let msg = LinkUnspec::new_with_index(l.index).up().build();
        set_link(handle, msg, format!("set {name} up"), changed).await?;
    }
    Ok(())
}

async fn ensure_port(
    handle: &Handle,
    name: &str,
    mtu: Option<u32>,
    master: &str,
    changed: &mut Vec<String>,
) -> Result<(), NetError> {
    let m = link(handle, master)
        .await?
        .ok_or_else(|| NetError::PodInterfaceMissing(master.into()))?;
    let l = link(handle, name)
        .await?
        .ok_or_else(|| NetError::PodInterfaceMissing(name.into()))?;
    if let Some(mtu) = mtu {
        if l.mtu != Some(mtu) {
            let msg = LinkUnspec::new_with_index(l.index).mtu(mtu).build();
            set_link(handle, msg, format!("set MTU {mtu} on {name}"), changed).await?;
        }
    }
    if l.master != Some(m.index) {
        let msg = LinkUnspec::new_with_index(l.index)
            .controller(m.index)
            .build();
        set_link(handle, msg, format!("enslave {name} to {master}"), changed).await?;
    }
    if !l.up {
        let msg = LinkUnspec::new_with_index(l.index).up().build();
        set_link(handle, msg, format!("set {name} up"), changed).await?;
    }
    Ok(())
}

async fn step(handle: &Handle, s: &LinkStep, changed: &mut Vec<String>) -> Result<(), NetError> {
    match s {
        LinkStep::Bridge {
            name,
            mac,
            mtu,
            addresses,
        } => ensure_bridge(handle, name, *mac, *mtu, addresses, changed).await,
        LinkStep::Tap {
            name,
            owner,
            group,
            multiqueue,
            mtu,
            master,
        } => {
            if link(handle, name).await?.is_none() {
                tap::create(name, *owner, *group, *multiqueue)?;
                changed.push(format!("create tap {name}"));
            }
            ensure_port(handle, name, Some(*mtu), master, changed).await
        }
        LinkStep::MovePodLink {
            from,
            to,
            mac,
            addresses,
            master,
        } => {
            if link(handle, to).await?.is_none() {
                let l = link(handle, from)
                    .await?
                    .ok_or_else(|| NetError::PodInterfaceMissing(from.clone()))?;
                let down = LinkUnspec::new_with_index(l.index).down().build();
                set_link(handle, down, format!("set {from} down"), changed).await?;
                let have = addresses_of(handle, l.index).await?;
                for a in addresses.iter().filter(|a| have.contains(a)) {
                    let mut del = handle
                        .address()
                        .get()
                        .set_link_index_filter(l.index)
                        .execute();
                    while let Some(msg) = del
                        .try_next()
                        .await
                        .map_err(nl(format!("get addresses of {from}")))?
                    {
                        let matches = msg.header.prefix_len == a.prefix_len()
                            && msg.attributes.iter().any(
                                |x| matches!(x, AddressAttribute::Address(ip) if *ip == a.addr()),
                            );
                        if matches {
                            handle
                                .address()
                                .del(msg)
                                .execute()
                                .await
                                .map_err(nl(format!("remove address {a} from {from}")))?;
                            changed.push(format!("remove address {a} from {from}"));
                        }
                    }
                }
                let rename = LinkUnspec::new_with_index(l.index)
                    .name(to.clone())
                    .address(mac.to_vec())
                    .build();
                set_link(handle, rename, format!("rename {from} to {to}"), changed).await?;
            }
            ensure_port(handle, to, None, master, changed).await?;
            let l = link(handle, to)
                .await?
                .ok_or_else(|| NetError::PodInterfaceMissing(to.clone()))?;
            let port = LinkBridgePort::new(l.index).learning(false).build();
            handle
                .link()
                .set_port(port)
                .execute()
                .await
                .map_err(nl(format!("turn learning off on {to}")))?;
            Ok(())
        }
        LinkStep::StandIn {
            name,
            mac,
            mtu,
            addresses,
        } => {
            let l = match link(handle, name).await? {
                Some(l) if l.kind == Some(InfoKind::Ifb) => l,
                Some(_) => {
                    return Err(NetError::PodInterfaceUnusable {
                        iface: name.clone(),
                        reason: "a non-ifb link holds the stand-in name".into(),
                    })
                }
                None => {
                    let msg = LinkIfb::new(name).address(mac.to_vec()).mtu(*mtu).build();
                    handle
                        .link()
                        .add(msg)
                        .execute()
                        .await
                        .map_err(nl(format!("add ifb stand-in {name}")))?;
                    changed.push(format!("add ifb stand-in {name}"));
                    link(handle, name)
                        .await?
                        .ok_or_else(|| NetError::PodInterfaceMissing(name.clone()))?
                }
            };
            ensure_addresses(handle, name, l.index, addresses, changed).await?;
            if !l.up {
                let msg = LinkUnspec::new_with_index(l.index).up().build();
                set_link(handle, msg, format!("set {name} up"), changed).await?;
            }
            Ok(())
        }
    }
}

/// Opens an rtnetlink connection in the current network namespace and drives it on the
/// current tokio runtime.
pub async fn connect() -> Result<(Handle, tokio::task::JoinHandle<()>), NetError> {
    let (conn, handle, _) = rtnetlink::new_connection().map_err(NetError::NetlinkSocket)?;
    Ok((handle, tokio::spawn(conn)))
}

/// Applies `plan` in the current network namespace (links, sysctls, then NAT tables).
///
/// Errors: the first failing step, named; earlier steps stay applied (a re-run continues).
pub async fn apply(plan: &NetPlan) -> Result<Applied, NetError> {
    let (handle, conn) = connect().await?;
    let result = apply_with(&handle, plan).await;
    conn.abort();
    result
}

async fn apply_with(handle: &Handle, plan: &NetPlan) -> Result<Applied, NetError> {
    if adopt::adoption(handle, plan).await? == adopt::Adoption::Adopt {
        return Ok(Applied {
            adopted: true,
            ..Applied::default()
        });
    }
    let mut out = Applied::default();
    for s in &plan.links {
        step(handle, s, &mut out.changed).await?;
    }
    for s in &plan.sysctls {
        let before = sysctl::read(&s.key)?;
        if before != s.value {
            sysctl::write(&s.key, &s.value)?;
            out.changed.push(format!("sysctl {}={}", s.key, s.value));
            out.sysctl_previous.push((s.key.clone(), before));
        }
    }
    for f in nft_netlink::commit(&plan.nat_tables)? {
        out.changed
            .push(format!("commit table {} nat", f.keyword()));
    }
    Ok(out)
}

async fn delete_link(
    handle: &Handle,
    name: &str,
    changed: &mut Vec<String>,
) -> Result<(), NetError> {
    if let Some(l) = link(handle, name).await? {
        handle
            .link()
            .del(l.index)
            .execute()
            .await
            .map_err(nl(format!("delete {name}")))?;
        changed.push(format!("delete {name}"));
    }
    Ok(())
}

/// Removes what [`apply()`] made for `plan` and restores the sysctls in `applied`.
/// Returns the changes made, in order. Running it twice is harmless.
pub async fn teardown(plan: &NetPlan, applied: &Applied) -> Result<Vec<String>, NetError> {
    let (handle, conn) = connect().await?;
    let result = teardown_with(&handle, plan, applied).await;
    conn.abort();
    result
}

async fn teardown_with(
    handle: &Handle,
    plan: &NetPlan,
    applied: &Applied,
) -> Result<Vec<String>, NetError> {
    let mut changed = Vec::new();
    if applied.adopted {
        // virt-handler's setup: not ours to remove.
        return Ok(changed);
    }
    let fams: Vec<Family> = plan.nat_tables.iter().map(|t| t.family).collect();
    for f in nft_netlink::delete_ours(&fams)? {
        changed.push(format!("delete table {} nat", f.keyword()));
    }
    for s in plan.links.iter().rev() {
        match s {
            LinkStep::Tap { name, .. } => delete_link(handle, name, &mut changed).await?,
            LinkStep::Bridge { name, .. } => delete_link(handle, name, &mut changed).await?,
            LinkStep::StandIn { name, .. } => {
                if let Some(l) = link(handle, name).await? {
                    if l.kind == Some(InfoKind::Ifb) {
                        delete_link(handle, name, &mut changed).await?;
                    }
                }
            }
            LinkStep::MovePodLink {
                from,
                to,
                addresses,
                ..
            } => {
                let Some(l) = link(handle, to).await? else {
                    continue;
                };
                let down = LinkUnspec::new_with_index(l.index)
                    .down()
                    .nocontroller()
                    .build();
                set_link(handle, down, format!("release {to}"), &mut changed).await?;
                let back = LinkUnspec::new_with_index(l.index)
                    .name(from.clone())
                    .address(plan.facts.iface.mac.to_vec())
                    .build();
                set_link(handle, back, format!("rename {to} to {from}"), &mut changed).await?;
                let up = LinkUnspec::new_with_index(l.index).up().build();
                set_link(handle, up, format!("set {from} up"), &mut changed).await?;
                ensure_addresses(handle, from, l.index, addresses, &mut changed).await?;
                for r in &plan.facts.iface.routes_v4 {
                    let Some(gw) = r.gateway else { continue };
                    let msg = RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                        .destination_prefix(r.destination.addr(), r.destination.prefix_len())
                        .gateway(gw)
                        .output_interface(l.index)
                        .protocol(RouteProtocol::from(r.protocol))
                        .build();
                    handle
                        .route()
                        .add(msg)
                        .replace()
                        .execute()
                        .await
                        .map_err(nl(format!("restore route {} via {gw}", r.destination)))?;
                    changed.push(format!("restore route {} via {gw}", r.destination));
                }
            }
        }
    }
    for (key, value) in &applied.sysctl_previous {
        if sysctl::read(key).ok().as_deref() != Some(value.as_str()) && !key.contains(&plan.bridge)
        {
            sysctl::write(key, value)?;
            changed.push(format!("sysctl {key}={value}"));
        }
    }
    Ok(changed)
}
