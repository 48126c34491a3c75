//! Hot-pluggable disks by diff: KubeVirt's `hotPlugHostDevices` / `syncDisks` attach and detach
//! steps (`manager.go`, v1.9.0) over QMP: a disk that appeared in the plan is attached
//! (`blockdev-add` of its nodes, `device_add`), one that disappeared is detached (`device_del`,
//! `DEVICE_DELETED`, `blockdev-del`).
//!
//! libvirt numbers block nodes (`libvirt-<N>-storage`, `libvirt-<N>-format`) per domain and never
//! reuses an index; the converter numbers them per plan, so hot-plugged nodes are renumbered from
//! the running domain's next free index.

use std::collections::BTreeMap;

use tracing::info;

use crate::cmdline::plan::{Backend, DomainPlan, FirmwarePlan};
use crate::cmdline::render;
use crate::qmp::client::QmpClient;
use crate::sync::state::Running;
use crate::sync::vmi_sync::HOTPLUG_TIMEOUT;
use crate::sync::SyncError;

/// One step of the disk diff.
#[derive(Debug, Clone, PartialEq)]
pub enum DiskStep {
    /// Detach the running disk with this device id (`device_del`, `DEVICE_DELETED`,
    /// `blockdev-del` of these node names, top first).
    Detach {
        /// Device id (`ua-<name>`).
        id: String,
        /// Its block nodes, top node first.
        node_names: Vec<String>,
    },
    /// Attach this disk of the new plan (nodes renumbered by the executor).
    Attach(render::DiskHotplug),
}

/// The disk diff: detach every running disk `wanted` (the new QMP plan's disks) lacks, in device
/// id order, then attach every disk of `wanted` that does not run, in device id order. Pure.
pub fn diff(
    running: &BTreeMap<String, render::DiskHotplug>,
    wanted: &[render::DiskHotplug],
) -> Vec<DiskStep> {
    let wanted: BTreeMap<&str, &render::DiskHotplug> =
        wanted.iter().map(|d| (d.id.as_str(), d)).collect();
    let mut steps: Vec<DiskStep> = running
        .iter()
        .filter(|(id, _)| !wanted.contains_key(id.as_str()))
        .map(|(id, d)| DiskStep::Detach {
            id: id.clone(),
            node_names: d
                .blockdev_del
                .iter()
                .filter_map(|v| v["node-name"].as_str().map(String::from))
                .collect(),
        })
        .collect();
    steps.extend(
        wanted
            .into_iter()
            .filter(|(id, _)| !running.contains_key(*id))
            .map(|(_, d)| DiskStep::Attach(d.clone())),
    );
    steps
}

/// Runs the [`diff`] of `running` against `wanted`: each detached disk leaves `running.disks`,
/// each attached one joins it with fresh node indices, on a free PCIe root port when its plan
/// put it on one.
pub(crate) async fn apply(
    client: &QmpClient,
    running: &mut Running,
    wanted: &[render::DiskHotplug],
) -> Result<(), SyncError> {
    for step in diff(&running.disks, wanted) {
        match step {
            DiskStep::Detach { id, node_names } => {
                let detach = crate::qmp::hotplug::DiskDetach {
                    device_id: id.clone(),
                    node_names,
                };
                crate::qmp::hotplug::detach_disk(client, &detach, HOTPLUG_TIMEOUT)
                    .await
                    .map_err(SyncError::Qmp)?;
                info!(device = %id, "disk detached");
                running.disks.remove(&id);
            }
            DiskStep::Attach(d) => {
                let id = d.id.clone();
                let mut d = renumber_nodes(&d, &mut running.next_node)?;
                // The re-plan may place the disk on a port in use; take a free root port instead.
                if d.device["bus"]
                    .as_str()
                    .is_some_and(|b| b.starts_with("pci."))
                {
                    let ports = crate::qmp::hotplug::free_root_ports(client)
                        .await
                        .map_err(SyncError::Qmp)?;
                    let port = ports.first().ok_or_else(|| {
                        SyncError::Unsupported(format!("hotplug of {id}: no free PCIe root port"))
                    })?;
                    d.device["bus"] = port.clone().into();
                    d.device["addr"] = "0x0".into();
                }
                let attach = crate::qmp::hotplug::DiskAttach {
                    blockdevs: d.blockdevs.clone(),
                    device: d.device.clone(),
                };
                crate::qmp::hotplug::attach_disk(client, &attach)
                    .await
                    .map_err(SyncError::Qmp)?;
                info!(device = %id, "disk attached");
                running.disks.insert(id, d);
            }
        }
    }
    Ok(())
}

/// The first block node index no node of `plan` uses: one more than the highest `N` of its
/// `libvirt-N-*` node names (disk and cdrom chains; the firmware's `libvirt-pflash*` nodes carry
/// none), 1 for a plan without disks.
pub(crate) fn next_node_index(plan: &DomainPlan) -> u32 {
    let devices = plan.devices.iter().filter_map(|d| match &d.backend {
        Backend::Blockdevs(b) => Some(b.as_slice()),
        _ => None,
    });
    let firmware = match &plan.firmware {
        FirmwarePlan::Efi { blockdevs, .. } => Some(blockdevs.as_slice()),
        _ => None,
    };
    devices
        .chain(firmware)
        .flatten()
        .flat_map(|b| node_indices(b.node_name()))
        .max()
        .map_or(1, |n| n + 1)
}

/// The `N` of every `libvirt-N-` node name in `text`.
pub(crate) fn node_indices(text: &str) -> Vec<u32> {
    text.split("libvirt-")
        .skip(1)
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let after = rest[digits.len()..].starts_with('-');
            (after && !digits.is_empty())
                .then(|| digits.parse().ok())
                .flatten()
        })
        .collect()
}

/// `disk` with each of its `libvirt-N-` node indices replaced by a fresh one from `next`.
pub(crate) fn renumber_nodes(
    disk: &render::DiskHotplug,
    next: &mut u32,
) -> Result<render::DiskHotplug, SyncError> {
    let mut json = serde_json::to_string(&(&disk.blockdevs, &disk.device, &disk.blockdev_del))
        .map_err(SyncError::EncodeDomain)?;
    let mut old: Vec<u32> = node_indices(&json);
    old.sort_unstable();
    old.dedup();
    for k in old {
        json = json.replace(&format!("\"libvirt-{k}-"), &format!("\"qlnode-{next}-"));
        *next += 1;
    }
    let json = json.replace("\"qlnode-", "\"libvirt-");
    let (blockdevs, device, blockdev_del) =
        serde_json::from_str(&json).map_err(SyncError::EncodeDomain)?;
    Ok(render::DiskHotplug {
        blockdevs,
        device,
        blockdev_del,
        ..disk.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(name: &str) -> render::DiskHotplug {
        render::DiskHotplug {
            name: name.into(),
            id: format!("ua-{name}"),
            target: None,
            blockdevs: vec![serde_json::json!({"node-name": "libvirt-1-storage"})],
            device: serde_json::json!({"id": format!("ua-{name}"), "drive": "libvirt-1-storage"}),
            device_del: serde_json::json!({"id": format!("ua-{name}")}),
            blockdev_del: vec![serde_json::json!({"node-name": "libvirt-1-storage"})],
        }
    }

    #[test]
    fn a_plan_without_disks_starts_nodes_at_one() {
        assert_eq!(next_node_index(&DomainPlan::default()), 1);
    }

    #[test]
    fn disk_diff_detaches_then_attaches() {
        let running = |names: &[&str]| -> BTreeMap<String, render::DiskHotplug> {
            names.iter().map(|n| (format!("ua-{n}"), disk(n))).collect()
        };
        let detach = |n: &str| DiskStep::Detach {
            id: format!("ua-{n}"),
            node_names: vec!["libvirt-1-storage".into()],
        };
        let attach = |n: &str| DiskStep::Attach(disk(n));
        let cases: Vec<(&[&str], Vec<render::DiskHotplug>, Vec<DiskStep>)> = vec![
            (&[], vec![], vec![]),
            (&["a"], vec![disk("a")], vec![]),
            (
                &[],
                vec![disk("b"), disk("a")],
                vec![attach("a"), attach("b")],
            ),
            (&["a", "b"], vec![], vec![detach("a"), detach("b")]),
            (&["a"], vec![disk("b")], vec![detach("a"), attach("b")]),
        ];
        for (run, wanted, steps) in cases {
            assert_eq!(diff(&running(run), &wanted), steps, "{run:?}");
        }
    }

    #[test]
    fn hotplugged_disk_nodes_get_fresh_indices() {
        let disk = render::DiskHotplug {
            name: "hp1".into(),
            id: "ua-hp1".into(),
            target: None,
            blockdevs: vec![
                serde_json::json!({"node-name": "libvirt-1-storage", "filename": "/x"}),
                serde_json::json!({"node-name": "libvirt-1-format", "file": "libvirt-1-storage"}),
            ],
            device: serde_json::json!({"id": "ua-hp1", "drive": "libvirt-1-format"}),
            device_del: serde_json::json!({"id": "ua-hp1"}),
            blockdev_del: vec![
                serde_json::json!({"node-name": "libvirt-1-format"}),
                serde_json::json!({"node-name": "libvirt-1-storage"}),
            ],
        };
        let mut next = 4;
        let d = renumber_nodes(&disk, &mut next).unwrap();
        assert_eq!(next, 5);
        assert_eq!(
            d.blockdevs[1],
            serde_json::json!({"node-name": "libvirt-4-format", "file": "libvirt-4-storage"})
        );
        assert_eq!(d.device["drive"], "libvirt-4-format");
        assert_eq!(d.blockdev_del[1]["node-name"], "libvirt-4-storage");
        assert_eq!(
            node_indices("a libvirt-3-x libvirt-12-y libvirt-z"),
            vec![3, 12]
        );
    }
}
