//! vCPU and memory hotplug: KubeVirt's `SyncVirtualMachineCPUs` (`UpdateVCPUs`, `manager.go`)
//! and `SyncVirtualMachineMemory` (`UpdateGuestMemory`, `pkg/liveupdate/memory`), over the QMP
//! commands libvirt issues for `SetVcpusFlags` and for a `virtio-mem` memory device.
//!
//! vCPUs: the domain boots with `-smp <vCPUs>,maxcpus=<maxSockets*cores*threads>` (converter);
//! a sync to N vCPUs lists `query-hotpluggable-cpus`, orders the slots by socket, die, cluster,
//! core and thread (the vCPU index), and `device_add`s the missing ones (`driver` = the slot's
//! CPU type, `id: vcpu<index>`, the slot's properties) until N are present, or `device_del`s the
//! hot-plugged ones from the highest index (waiting for `DEVICE_DELETED`) until N remain.
//!
//! Memory: the domain boots with `maxmem` and a NUMA node (converter). The first sync to more
//! memory than at boot adds a RAM backend `memvirtiomem0` of `maxGuest - boot` bytes and a
//! `virtio-mem-pci` device `virtiomem0` on node 0 with 2 MiB blocks and
//! `requested-size = guest - boot`, in a free PCIe root port; later syncs `qom-set` its
//! `requested-size`.

use std::time::Duration;

use serde_json::{json, Value};
use tracing::info;

use crate::cmdline::plan::DomainPlan;
use crate::qmp::client::QmpClient;
use crate::qmp::commands;
use crate::qmp::hotplug;
use crate::sync::SyncError;

/// The virtio-mem block size KubeVirt uses (2 MiB; 1 GiB hugepages are not supported here).
pub const VIRTIO_MEM_BLOCK: u64 = 2 * 1024 * 1024;
/// libvirt's id of the first virtio-mem device (the QOM path is `/machine/peripheral/<id>`).
pub const VIRTIO_MEM_ID: &str = "virtiomem0";
/// libvirt's id of its memory backend.
pub const VIRTIO_MEM_BACKEND_ID: &str = "memvirtiomem0";

/// One slot of `query-hotpluggable-cpus`.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuSlot {
    /// The CPU device type (`max-x86_64-cpu`).
    pub driver: String,
    /// The slot's properties (`socket-id`, `core-id`, `thread-id`, `node-id`, ...).
    pub props: serde_json::Map<String, Value>,
    /// The QOM path of the CPU in the slot; `None` when empty.
    pub qom_path: Option<String>,
}

/// The slots of a `query-hotpluggable-cpus` reply, in vCPU index order. Errors: the reply is not
/// a list of objects with `type` and `props`.
pub fn cpu_slots(reply: &Value) -> Result<Vec<CpuSlot>, SyncError> {
    let bad = || SyncError::Unsupported("unexpected query-hotpluggable-cpus reply".into());
    let mut slots = Vec::new();
    for entry in reply.as_array().ok_or_else(bad)? {
        let driver = entry["type"].as_str().ok_or_else(bad)?.to_string();
        let props = entry["props"].as_object().ok_or_else(bad)?.clone();
        slots.push(CpuSlot {
            driver,
            props,
            qom_path: entry["qom-path"].as_str().map(str::to_string),
        });
    }
    let key = |s: &CpuSlot| {
        ["socket-id", "die-id", "cluster-id", "core-id", "thread-id"]
            .map(|k| s.props.get(k).and_then(Value::as_u64).unwrap_or(0))
    };
    slots.sort_by_key(key);
    Ok(slots)
}

/// What a vCPU sync must do: `(index, slot)` to plug, or device ids to unplug (highest first).
#[derive(Debug, Clone, PartialEq)]
pub enum VcpuChange {
    /// Nothing.
    None,
    /// Plug these empty slots (`id: vcpu<index>`).
    Plug(Vec<(usize, CpuSlot)>),
    /// Unplug these hot-plugged vCPUs, by device id.
    Unplug(Vec<String>),
}

/// Plans the change from the slots' state to `wanted` vCPUs. Errors: more than the slots, or
/// fewer than the vCPUs that were not hot-plugged (they cannot be removed).
pub fn plan_vcpus(slots: &[CpuSlot], wanted: u32) -> Result<VcpuChange, SyncError> {
    let wanted = wanted as usize;
    if wanted == 0 || wanted > slots.len() {
        return Err(SyncError::InvalidVmi(format!(
            "spec.domain.cpu: {wanted} vCPUs, the domain has room for 1 to {}",
            slots.len()
        )));
    }
    let present = slots.iter().filter(|s| s.qom_path.is_some()).count();
    if wanted > present {
        let plug = slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.qom_path.is_none())
            .take(wanted - present)
            .map(|(i, s)| (i, s.clone()))
            .collect();
        return Ok(VcpuChange::Plug(plug));
    }
    if wanted == present {
        return Ok(VcpuChange::None);
    }
    let removable: Vec<String> = slots
        .iter()
        .rev()
        .filter_map(|s| s.qom_path.as_deref())
        .filter_map(|p| p.strip_prefix("/machine/peripheral/"))
        .take(present - wanted)
        .map(str::to_string)
        .collect();
    if removable.len() < present - wanted {
        return Err(SyncError::InvalidVmi(format!(
            "spec.domain.cpu: {wanted} vCPUs is below the vCPUs the domain booted with"
        )));
    }
    Ok(VcpuChange::Unplug(removable))
}

/// Sets the domain's vCPU count to `wanted` (boot vCPUs of the new VMI's topology).
pub async fn set_vcpus(
    client: &QmpClient,
    wanted: u32,
    unplug_timeout: Duration,
) -> Result<VcpuChange, SyncError> {
    let reply = client
        .run(&commands::QueryHotpluggableCpus)
        .await
        .map_err(SyncError::Qmp)?;
    let change = plan_vcpus(&cpu_slots(&reply)?, wanted)?;
    match &change {
        VcpuChange::None => {}
        VcpuChange::Plug(slots) => {
            for (index, slot) in slots {
                let add = commands::CpuDeviceAdd {
                    driver: slot.driver.clone(),
                    id: format!("vcpu{index}"),
                    props: slot.props.clone(),
                };
                client.run(&add).await.map_err(SyncError::Qmp)?;
                info!(vcpu = index, "vCPU plugged");
            }
        }
        VcpuChange::Unplug(ids) => {
            for id in ids {
                unplug_vcpu(client, id, unplug_timeout).await?;
                info!(device = %id, "vCPU unplugged");
            }
        }
    }
    Ok(change)
}

/// Unplugs the hot-plugged vCPU `id` as libvirt does for `SetVcpusFlags` downwards:
/// `device_del`, then waits up to `timeout` for the guest to eject it (ACPI) and QEMU to report
/// `DEVICE_DELETED`. QEMU 7.2 reports an x86 vCPU's removal only by its child's path
/// (`/machine/peripheral/<id>/lapic`, no `device` field), newer QEMU also by `device: <id>`; either
/// counts, and the slot is then checked empty in `query-hotpluggable-cpus`.
///
/// QEMU under TCG (not KVM), up to 10.1 at least, keeps an unplugged vCPU's memory listener
/// registered (a fix was posted after 10.1, "physmem: Destroy all CPU AddressSpaces on
/// unrealize"), so the next memory-topology change (virtio-mem or any PCI device plugged later)
/// corrupts QEMU's heap; nothing we render avoids it (see `tests/sync_vcpu_unplug.rs`). Under KVM
/// an unplug only leaks the vCPU's address space.
///
/// # Errors
/// [`SyncError::Qmp`]: `device_del` refused, no `DEVICE_DELETED` within `timeout` (a guest that
/// does not eject the CPU, e.g. without ACPI CPU hot-remove), or the slot still occupied.
pub async fn unplug_vcpu(client: &QmpClient, id: &str, timeout: Duration) -> Result<(), SyncError> {
    let path = format!("/machine/peripheral/{id}");
    let mut events = client.events();
    client
        .execute("device_del", Some(json!({ "id": id })))
        .await
        .map_err(SyncError::Qmp)?;
    events
        .wait_for("DEVICE_DELETED", id, timeout, |ev| {
            ev.name == "DEVICE_DELETED"
                && (ev.data["device"] == id
                    || ev.data["path"].as_str().is_some_and(|p| {
                        p == path
                            || p.strip_prefix(path.as_str())
                                .is_some_and(|r| r.starts_with('/'))
                    }))
        })
        .await
        .map_err(SyncError::Qmp)?;
    // The child goes first; the CPU itself is gone right after it.
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let reply = client
            .execute("query-hotpluggable-cpus", None)
            .await
            .map_err(SyncError::Qmp)?;
        let present = cpu_slots(&reply)?
            .iter()
            .any(|s| s.qom_path.as_deref() == Some(path.as_str()));
        if !present {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(SyncError::Unsupported(format!(
                "vCPU {id} is still plugged after DEVICE_DELETED"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The virtio-mem state of a running domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryState {
    /// Guest memory at boot, bytes (`status.memory.guestAtBoot`).
    pub boot: u64,
    /// Hotplug ceiling (`maxGuest`), bytes; `None`: no memory hotplug.
    pub max: Option<u64>,
    /// The virtio-mem device's `requested-size`, once the device exists.
    pub requested: Option<u64>,
}

impl MemoryState {
    /// The state of a domain started from `plan`.
    pub fn at_boot(plan: &DomainPlan) -> MemoryState {
        MemoryState {
            boot: plan.memory.size,
            max: plan.memory.maxmem,
            requested: None,
        }
    }
}

/// What a memory sync does, as QMP commands in order (pure).
pub fn plan_memory(
    state: &MemoryState,
    plan: &DomainPlan,
    wanted: u64,
    free_port: Option<&str>,
) -> Result<Vec<(&'static str, Value)>, SyncError> {
    let Some(max) = state.max else {
        return if wanted == state.boot {
            Ok(vec![])
        } else {
            Err(SyncError::Unsupported(
                "memory hotplug: the domain was started without maxGuest".into(),
            ))
        };
    };
    if wanted < state.boot || wanted > max {
        return Err(SyncError::InvalidVmi(format!(
            "spec.domain.memory.guest: {wanted} bytes is outside {}..={max}",
            state.boot
        )));
    }
    let requested = wanted - state.boot;
    if !requested.is_multiple_of(VIRTIO_MEM_BLOCK) {
        return Err(SyncError::InvalidVmi(format!(
            "spec.domain.memory.guest: {wanted} bytes is not {} MiB aligned above the boot memory",
            VIRTIO_MEM_BLOCK >> 20
        )));
    }
    match state.requested {
        Some(r) if r == requested => Ok(vec![]),
        Some(_) => Ok(vec![(
            "qom-set",
            json!({
                "path": format!("/machine/peripheral/{VIRTIO_MEM_ID}"),
                "property": "requested-size",
                "value": requested,
            }),
        )]),
        None if requested == 0 => Ok(vec![]),
        None => {
            let port = free_port.ok_or_else(|| {
                SyncError::Unsupported("memory hotplug: no free PCIe root port".into())
            })?;
            let backend = plan.memory.backend.as_ref();
            let mut object = json!({
                "qom-type": backend.map_or("memory-backend-ram", |b| b.qom_type),
                "id": VIRTIO_MEM_BACKEND_ID,
                "size": max - state.boot,
            });
            if let Some(b) = backend {
                for (k, v) in [("hugetlb", b.hugetlb), ("share", b.share)] {
                    if let Some(v) = v {
                        object[k] = v.into();
                    }
                }
                if let Some(s) = b.hugetlbsize {
                    object["hugetlbsize"] = s.into();
                }
            }
            Ok(vec![
                ("object-add", object),
                (
                    "device_add",
                    json!({
                        "driver": "virtio-mem-pci",
                        "id": VIRTIO_MEM_ID,
                        "memdev": VIRTIO_MEM_BACKEND_ID,
                        "node": 0,
                        "block-size": VIRTIO_MEM_BLOCK,
                        "requested-size": requested,
                        "bus": port,
                        "addr": "0x0",
                    }),
                ),
            ])
        }
    }
}

/// Sets the domain's memory to `wanted` bytes through virtio-mem; returns the new state.
pub async fn set_memory(
    client: &QmpClient,
    state: &MemoryState,
    plan: &DomainPlan,
    wanted: u64,
) -> Result<MemoryState, SyncError> {
    let port = if state.requested.is_none() && state.max.is_some() && wanted > state.boot {
        hotplug::free_root_ports(client)
            .await
            .map_err(SyncError::Qmp)?
            .into_iter()
            .next()
    } else {
        None
    };
    let steps = plan_memory(state, plan, wanted, port.as_deref())?;
    let mut added_backend = false;
    for (cmd, args) in &steps {
        let step = commands::Planned {
            execute: cmd,
            arguments: args,
        };
        if let Err(e) = client.run(&step).await {
            if added_backend {
                let del = commands::ObjectDel {
                    id: VIRTIO_MEM_BACKEND_ID.into(),
                };
                let _ = client.run(&del).await;
            }
            return Err(SyncError::Qmp(e));
        }
        added_backend |= *cmd == "object-add";
    }
    let mut next = *state;
    if !steps.is_empty() {
        next.requested = Some(wanted - state.boot);
        info!(
            requested = wanted - state.boot,
            "virtio-mem requested size set"
        );
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(socket: u64, present: Option<&str>) -> Value {
        let mut v = json!({
            "type": "max-x86_64-cpu", "vcpus-count": 1,
            "props": {"socket-id": socket, "core-id": 0, "thread-id": 0, "node-id": 0}
        });
        if let Some(p) = present {
            v["qom-path"] = p.into();
        }
        v
    }

    #[test]
    fn vcpu_slots_are_ordered_and_planned() {
        // QEMU lists the slots highest first.
        let reply = json!([
            slot(3, None),
            slot(2, None),
            slot(1, Some("/machine/peripheral/vcpu1")),
            slot(0, Some("/machine/unattached/device[0]"))
        ]);
        let slots = cpu_slots(&reply).unwrap();
        assert_eq!(
            slots
                .iter()
                .map(|s| s.props["socket-id"].as_u64().unwrap())
                .collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
        assert_eq!(plan_vcpus(&slots, 2).unwrap(), VcpuChange::None);
        let VcpuChange::Plug(p) = plan_vcpus(&slots, 4).unwrap() else {
            panic!("plug expected")
        };
        assert_eq!(p.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(
            plan_vcpus(&slots, 1).unwrap(),
            VcpuChange::Unplug(vec!["vcpu1".into()])
        );
        assert!(plan_vcpus(&slots, 5).is_err());
        assert!(plan_vcpus(&slots, 0).is_err());
        let boot_only = cpu_slots(&json!([
            slot(1, Some("/machine/unattached/device[1]")),
            slot(0, Some("/machine/unattached/device[0]"))
        ]))
        .unwrap();
        assert!(plan_vcpus(&boot_only, 1).is_err());
    }

    #[test]
    fn virtio_mem_is_added_once_then_resized() {
        let mut plan = DomainPlan::default();
        plan.memory.size = 1 << 30;
        plan.memory.maxmem = Some(4 << 30);
        let state = MemoryState::at_boot(&plan);
        assert_eq!(plan_memory(&state, &plan, 1 << 30, None).unwrap(), vec![]);
        let steps = plan_memory(&state, &plan, 2 << 30, Some("pci.7")).unwrap();
        assert_eq!(
            steps,
            vec![
                (
                    "object-add",
                    json!({"qom-type": "memory-backend-ram", "id": "memvirtiomem0", "size": 3u64 << 30})
                ),
                (
                    "device_add",
                    json!({"driver": "virtio-mem-pci", "id": "virtiomem0", "memdev": "memvirtiomem0",
                           "node": 0, "block-size": 2097152, "requested-size": 1u64 << 30,
                           "bus": "pci.7", "addr": "0x0"})
                )
            ]
        );
        let state = MemoryState {
            requested: Some(1 << 30),
            ..state
        };
        assert_eq!(
            plan_memory(&state, &plan, 3 << 30, None).unwrap(),
            vec![(
                "qom-set",
                json!({"path": "/machine/peripheral/virtiomem0", "property": "requested-size",
                       "value": 2u64 << 30})
            )]
        );
        assert!(plan_memory(&state, &plan, 5 << 30, None).is_err());
        assert!(plan_memory(&state, &plan, (1 << 30) + 4096, None).is_err());
        let no_max = MemoryState { max: None, ..state };
        assert!(plan_memory(&no_max, &plan, 2 << 30, None).is_err());
    }
}
