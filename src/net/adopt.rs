//! Adopting the pod network virt-handler already set up.
//!
//! Under KubeVirt, virt-handler sets up the binding in the pod's network namespace before the
//! first sync (`pkg/network/setup`, `NetConf.Setup`, v1.9.0: the masquerade and bridge
//! configurators make the bridge `k6t-<iface>` with its addresses, the tap owned by the qemu user
//! as a port of it, and for masquerade the `nat` tables). The launcher then runs with only the
//! compute container's capabilities (no `NET_ADMIN`) and must not change any of it: it serves
//! DHCP on the bridge and QEMU opens the tap by name.
//!
//! [`adoption`] compares the namespace with the plan. Nothing of the plan present: the launcher
//! builds it ([`Adoption::Build`], `qlauncher run` or a pod allowed `NET_ADMIN`). All of it
//! present as planned: [`Adoption::Adopt`], and [`crate::net::apply::apply()`] changes nothing
//! and [`crate::net::apply::teardown()`] removes nothing. Anything else is refused with
//! [`NetError::IncompatibleSetup`] naming each difference.
//!
//! The `nat` tables of an adopted setup are compared with KubeVirt v1.9's when they can be read
//! (reading nftables needs `NET_ADMIN`; without it they are taken as virt-handler's): every chain
//! with its hook and priority, and every rule, expression by expression, against the rules
//! qlauncher would commit for the same plan (`nft_dump`: KubeVirt's `setupNATByFamily`). A missing
//! or extra chain, a different hook, a rule that differs or an extra rule is a difference, named
//! with the rule KubeVirt has there in `nft` syntax.

use crate::net::apply::{addresses_of, link, LinkFacts};
use crate::net::config::Binding;
use crate::net::nft_dump;
use crate::net::nft_netlink::{self, TableState};
use crate::net::plan::{LinkStep, NetPlan};
use crate::net::NetError;
use netlink_packet_route::link::InfoKind;
use rtnetlink::Handle;

/// What to do with the pod network of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adoption {
    /// Nothing of it exists yet: set it up.
    Build,
    /// virt-handler set it up as planned: use it unchanged.
    Adopt,
}

fn mac_text(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Compares the current network namespace with `plan` (see the module doc).
///
/// # Errors
/// [`NetError::IncompatibleSetup`] when part of the plan exists differently, or partly;
/// netlink and nftables read errors.
pub async fn adoption(handle: &Handle, plan: &NetPlan) -> Result<Adoption, NetError> {
    let mut foreign_tables = Vec::new();
    let mut absent_tables = Vec::new();
    // Reading nftables needs NET_ADMIN, which the compute container does not have: then the
    // tables cannot be checked, and are virt-handler's if its links are there.
    let mut unreadable = None;
    for t in &plan.nat_tables {
        match nft_netlink::table_state(t.family) {
            Ok(TableState::Foreign) => foreign_tables.push(t),
            Ok(TableState::Absent) => absent_tables.push(t.family.keyword()),
            // Made by an earlier qlauncher in this pod: ours to re-apply.
            Ok(TableState::Ours(_)) => return Ok(Adoption::Build),
            Err(NetError::Nftables { step, source })
                if source.raw_os_error() == Some(libc::EPERM) =>
            {
                unreadable = Some(NetError::Nftables { step, source });
            }
            Err(e) => return Err(e),
        }
    }
    let bridge = link(handle, &plan.bridge).await?;
    if bridge.is_none() && foreign_tables.is_empty() {
        // Nothing set up: build it (which needs NET_ADMIN; without it the first step says so).
        return match unreadable {
            Some(e) => Err(e),
            None => Ok(Adoption::Build),
        };
    }
    if unreadable.is_some() {
        absent_tables.clear();
        tracing::info!(
            "nftables not readable without NET_ADMIN: adopting the nat tables unchecked"
        );
    }
    let mut differences = Vec::new();
    for table in &absent_tables {
        differences.push(format!("table {table} nat is missing"));
    }
    if unreadable.is_none() {
        for table in &foreign_tables {
            let have = nft_dump::kernel(table.family)?;
            differences.extend(nft_dump::differences(
                table,
                &nft_dump::planned(table),
                &have,
            ));
        }
    }
    let bridge_index = bridge.as_ref().map(|b| b.index);
    for step in &plan.links {
        check_step(handle, plan, step, bridge_index, &mut differences).await?;
    }
    if differences.is_empty() {
        tracing::info!(
            bridge = %plan.bridge,
            tap = %plan.tap,
            binding = ?plan.binding,
            "adopting the pod network virt-handler set up"
        );
        Ok(Adoption::Adopt)
    } else {
        Err(NetError::IncompatibleSetup {
            differences: differences.join("; "),
        })
    }
}

async fn check_step(
    handle: &Handle,
    plan: &NetPlan,
    step: &LinkStep,
    bridge_index: Option<u32>,
    differences: &mut Vec<String>,
) -> Result<(), NetError> {
    match step {
        LinkStep::Bridge {
            name,
            mac,
            mtu,
            addresses,
        } => {
            let Some(l) = link(handle, name).await? else {
                differences.push(format!("link {name} is missing"));
                return Ok(());
            };
            if l.kind != Some(InfoKind::Bridge) {
                differences.push(format!("{name} is a {:?} link, not a bridge", l.kind));
            }
            check_mtu(name, &l, *mtu, differences);
            if let (Some(want), Some(have)) = (mac, &l.mac) {
                if want.as_slice() != have.as_slice() {
                    differences.push(format!(
                        "{name} has MAC {}, the plan {}",
                        mac_text(have),
                        mac_text(want)
                    ));
                }
            }
            let have = addresses_of(handle, l.index).await?;
            for a in addresses {
                if !have.contains(a) {
                    differences.push(format!("{name} lacks address {a}"));
                }
            }
        }
        LinkStep::Tap {
            name,
            owner,
            mtu,
            master,
            ..
        } => {
            let Some(l) = link(handle, name).await? else {
                differences.push(format!("link {name} is missing"));
                return Ok(());
            };
            check_mtu(name, &l, *mtu, differences);
            if l.master.is_none() || l.master != bridge_index {
                differences.push(format!("{name} is not a port of {master}"));
            }
            match (&l.kind, l.tun_owner) {
                (Some(InfoKind::Tun), Some(uid)) if uid == *owner => {}
                (Some(InfoKind::Tun), Some(uid)) => differences.push(format!(
                    "{name} is owned by uid {uid}, QEMU runs as {owner}"
                )),
                (Some(InfoKind::Tun), None) => {
                    differences.push(format!("{name} has no owner, QEMU runs as {owner}"))
                }
                _ => differences.push(format!("{name} is not a tap")),
            }
        }
        LinkStep::MovePodLink { to, master, .. } => match link(handle, to).await? {
            None => differences.push(format!("link {to} is missing")),
            Some(l) if l.master.is_none() || l.master != bridge_index => {
                differences.push(format!("{to} is not a port of {master}"))
            }
            Some(_) => {}
        },
        LinkStep::StandIn { name, .. } => {
            // virt-handler's stand-in is a dummy link; qlauncher's own an ifb one.
            if plan.binding == Binding::Bridge && link(handle, name).await?.is_none() {
                differences.push(format!("link {name} is missing"));
            }
        }
    }
    Ok(())
}

fn check_mtu(name: &str, l: &LinkFacts, mtu: u32, differences: &mut Vec<String>) {
    if let Some(have) = l.mtu {
        if have != mtu {
            differences.push(format!("{name} has MTU {have}, the pod link {mtu}"));
        }
    }
}
