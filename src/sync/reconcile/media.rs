//! cdrom media changes by diff: KubeVirt's `syncDisks` "update" step (`manager.go`, v1.9.0), which
//! sends libvirt `UpdateDeviceFlags` for a cdrom whose source changed; libvirt runs
//! `blockdev-open-tray`, `blockdev-remove-medium`, `blockdev-add` of the new nodes,
//! `blockdev-insert-medium`, `blockdev-close-tray`, then `blockdev-del` of the old nodes
//! ([`crate::qmp::hotplug::change_cdrom`]). A cdrom whose volume appears gets the medium inserted;
//! one whose volume goes away (or whose hotplug volume is no longer ready) is ejected.
//!
//! Only cdroms the converter did not mark hot-pluggable are handled here (a `scsi-cd` on a hotplug
//! volume is attached and detached as a whole by the disk diff).

use std::collections::{BTreeMap, BTreeSet};

use tracing::info;

use crate::cmdline::plan::{Backend, DeviceClass, DomainPlan};
use crate::cmdline::qemu::{renumber_nodes, Blockdev};
use crate::qmp::client::QmpClient;
use crate::sync::error::SyncError;
use crate::sync::state::Running;

/// The cdrom drives of `plan` that are not hot-pluggable, by device id (`ua-<name>`), each with
/// the `blockdev-add` arguments of its medium, bottom node first (empty: no medium).
pub fn cdroms(plan: &DomainPlan) -> BTreeMap<String, Vec<Blockdev>> {
    plan.devices
        .iter()
        .filter(|d| d.class == DeviceClass::Disk && !d.hotpluggable)
        .filter(|d| matches!(d.device.driver(), "ide-cd" | "scsi-cd"))
        .map(|d| {
            let medium = match &d.backend {
                Backend::Blockdevs(bs) => bs.clone(),
                _ => Vec::new(),
            };
            (d.device.id().to_string(), medium)
        })
        .collect()
}

/// A medium with its own node names blanked (they differ between conversions): what the guest
/// would see.
fn without_node_names(medium: &[Blockdev]) -> Vec<Blockdev> {
    let names: BTreeSet<&str> = medium.iter().map(Blockdev::node_name).collect();
    medium
        .iter()
        .map(|b| {
            let mut b = b.clone();
            b.rename_nodes(&mut |n| names.contains(n).then(String::new));
            b
        })
        .collect()
}

/// True when the two media are the same image (same blockdev arguments but for node names).
pub fn same_medium(a: &[Blockdev], b: &[Blockdev]) -> bool {
    without_node_names(a) == without_node_names(b)
}

/// The node names of `medium`, top node first (the `blockdev-del` order).
pub fn node_names_top_first(medium: &[Blockdev]) -> Vec<String> {
    medium
        .iter()
        .rev()
        .map(|b| b.node_name().to_string())
        .collect()
}

/// One step of the media diff: the cdrom `id` gets `new` (bottom node first; empty: eject).
#[derive(Debug, Clone, PartialEq)]
pub struct MediumChange {
    /// Device id (`ua-<name>`).
    pub id: String,
    /// The new medium's `blockdev-add` arguments, bottom node first (node indices as planned).
    pub new: Vec<Blockdev>,
}

/// The media diff: for each cdrom of `running` whose medium differs from `wanted`'s (a drive
/// `wanted` lacks is ejected), in device id order. Pure.
pub fn diff(
    running: &BTreeMap<String, Vec<Blockdev>>,
    mut wanted: BTreeMap<String, Vec<Blockdev>>,
) -> Vec<MediumChange> {
    running
        .iter()
        .filter_map(|(id, current)| {
            let new = wanted.remove(id).unwrap_or_default();
            (!same_medium(current, &new)).then(|| MediumChange {
                id: id.clone(),
                new,
            })
        })
        .collect()
}

/// Runs the [`diff`] of the domain's cdrom media against `plan`'s: each changed medium's nodes
/// get fresh indices, then `blockdev-open-tray` ... `blockdev-close-tray`.
pub(crate) async fn apply(
    client: &QmpClient,
    running: &mut Running,
    plan: &DomainPlan,
) -> Result<(), SyncError> {
    for MediumChange { id, mut new } in diff(&running.cdroms, cdroms(plan)) {
        renumber_nodes(&mut new, &mut running.next_node);
        let old_node_names = running
            .cdroms
            .get(&id)
            .map(|current| node_names_top_first(current))
            .unwrap_or_default();
        let change = crate::qmp::hotplug::CdromChange {
            device_id: id.clone(),
            old_node_names,
            new_blockdevs: new,
        };
        crate::qmp::hotplug::change_cdrom(client, &change)
            .await
            .map_err(SyncError::Qmp)?;
        info!(device = %id, inserted = !change.new_blockdevs.is_empty(), "cdrom medium changed");
        running.cdroms.insert(id, change.new_blockdevs);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::qemu::{
        BackingNode, BlockdevFormat, BlockdevProtocol, FormatDriver, ProtocolDriver,
    };

    fn medium(n: u32, path: &str) -> Vec<Blockdev> {
        vec![
            Blockdev::Protocol(BlockdevProtocol {
                driver: ProtocolDriver::File,
                filename: path.into(),
                node_name: format!("libvirt-{n}-storage"),
                aio: None,
                cache: None,
                auto_read_only: true,
                discard: None,
            }),
            Blockdev::Format(BlockdevFormat {
                detect_zeroes: None,
                node_name: format!("libvirt-{n}-format"),
                read_only: true,
                discard: None,
                cache: None,
                driver: FormatDriver::Raw,
                file: format!("libvirt-{n}-storage"),
                data_file: None,
                backing: BackingNode::Absent,
            }),
        ]
    }
    #[test]
    fn media_compare_without_node_names() {
        assert!(same_medium(&medium(1, "/a.img"), &medium(7, "/a.img")));
        assert!(!same_medium(&medium(1, "/a.img"), &medium(1, "/b.img")));
        assert!(!same_medium(&medium(1, "/a.img"), &[]));
        assert!(same_medium(&[], &[]));
        assert_eq!(
            node_names_top_first(&medium(3, "/a.img")),
            vec!["libvirt-3-format", "libvirt-3-storage"]
        );
    }

    #[test]
    fn media_diff_changes_only_what_differs() {
        let map = |items: &[(&str, Vec<Blockdev>)]| -> BTreeMap<String, Vec<Blockdev>> {
            items
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect()
        };
        let change = |id: &str, new: Vec<Blockdev>| MediumChange { id: id.into(), new };
        let cases = [
            // Same image under other node numbers: nothing.
            (
                map(&[("ua-cd", medium(1, "/a.iso"))]),
                map(&[("ua-cd", medium(5, "/a.iso"))]),
                vec![],
            ),
            // Another image.
            (
                map(&[("ua-cd", medium(1, "/a.iso"))]),
                map(&[("ua-cd", medium(5, "/b.iso"))]),
                vec![change("ua-cd", medium(5, "/b.iso"))],
            ),
            // Inserted into an empty drive.
            (
                map(&[("ua-cd", vec![])]),
                map(&[("ua-cd", medium(2, "/a.iso"))]),
                vec![change("ua-cd", medium(2, "/a.iso"))],
            ),
            // The drive left the plan: ejected.
            (
                map(&[("ua-cd", medium(1, "/a.iso"))]),
                map(&[]),
                vec![change("ua-cd", vec![])],
            ),
            // A drive that does not run is not this diff's.
            (map(&[]), map(&[("ua-cd", medium(1, "/a.iso"))]), vec![]),
        ];
        for (running, wanted, steps) in cases {
            assert_eq!(diff(&running, wanted), steps);
        }
    }
}
