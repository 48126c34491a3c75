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

use tracing::info;

use crate::cmdline::plan::DomainPlan;
use crate::cmdline::qemu::{ObjectMemoryBackend, QomSet};
use crate::cmdline::FieldPath;
use crate::qmp::client::QmpClient;
use crate::qmp::commands::{
    self, CpuDeviceAdd, DeviceDel, HotpluggableCpu, ObjectAdd, ObjectDel, VirtioMemPciAdd,
};
use crate::qmp::hotplug;
use crate::sync::error::SyncError;

/// The virtio-mem block size KubeVirt uses (2 MiB; 1 GiB hugepages are not supported here).
pub const VIRTIO_MEM_BLOCK: u64 = 2 * 1024 * 1024;
/// libvirt's id of the first virtio-mem device (the QOM path is `/machine/peripheral/<id>`).
pub const VIRTIO_MEM_ID: &str = "virtiomem0";
/// libvirt's id of its memory backend.
pub const VIRTIO_MEM_BACKEND_ID: &str = "memvirtiomem0";

/// One slot of `query-hotpluggable-cpus`.
pub type CpuSlot = HotpluggableCpu;

/// The slots of a `query-hotpluggable-cpus` reply in vCPU index order (socket, die, cluster,
/// core, thread; QEMU lists them highest first).
pub fn cpu_slots(mut reply: Vec<HotpluggableCpu>) -> Vec<CpuSlot> {
    let key = |s: &CpuSlot| {
        ["socket-id", "die-id", "cluster-id", "core-id", "thread-id"]
            .map(|k| s.props.get(k).copied().unwrap_or(0))
    };
    reply.sort_by_key(key);
    reply
}

/// One step of a vCPU or memory sync, a QMP command (or, for an unplug, a command and the wait
/// for the guest).
#[derive(Debug, Clone, PartialEq)]
pub enum ResourceStep {
    /// `device_add` of a vCPU into an empty slot (`id: vcpu<index>`).
    PlugVcpu(CpuDeviceAdd),
    /// `device_del` of a hot-plugged vCPU and the wait for the guest to eject it.
    UnplugVcpu {
        /// Device id (`vcpu<index>`).
        id: String,
    },
    /// `object-add` of the virtio-mem device's RAM backend.
    AddMemoryBackend(ObjectMemoryBackend),
    /// `device_add` of the virtio-mem device.
    AddVirtioMem(VirtioMemPciAdd),
    /// `qom-set` of the virtio-mem device's `requested-size`.
    SetVirtioMemSize(QomSet),
}

/// The vCPU diff: from the slots' state (`running`, in vCPU index order) to `wanted` vCPUs,
/// the empty slots to plug from the lowest index, or the plugged vCPUs (`vcpu<index>`, the ones
/// of every socket but the first, plugged at start or later) to unplug from the highest. Pure.
///
/// # Errors
/// [`SyncError::InvalidField`] at `spec.domain.cpu.sockets`: more vCPUs than the slots, or
/// fewer than the first socket's (QEMU's own vCPUs, libvirt's `hotpluggable='no'`, which
/// cannot be unplugged).
pub fn diff_vcpus(running: &[CpuSlot], wanted: u32) -> Result<Vec<ResourceStep>, SyncError> {
    let wanted = wanted as usize;
    if wanted == 0 || wanted > running.len() {
        return Err(SyncError::invalid_field(
            FieldPath::new("spec.domain.cpu.sockets"),
            format!(
                "{wanted} vCPUs, the domain has room for 1 to {}",
                running.len()
            ),
        ));
    }
    let present = running.iter().filter(|s| s.qom_path.is_some()).count();
    if wanted >= present {
        return Ok(running
            .iter()
            .enumerate()
            .filter(|(_, s)| s.qom_path.is_none())
            .take(wanted - present)
            .map(|(i, s)| {
                ResourceStep::PlugVcpu(CpuDeviceAdd {
                    driver: s.driver.clone(),
                    id: format!("vcpu{i}"),
                    props: s.props.clone(),
                })
            })
            .collect());
    }
    let pluggable: Vec<&str> = running
        .iter()
        .rev()
        .filter_map(|s| s.qom_path.as_deref())
        .filter_map(|p| p.strip_prefix("/machine/peripheral/"))
        .collect();
    let fixed = present - pluggable.len();
    if wanted < fixed {
        return Err(SyncError::invalid_field(
            FieldPath::new("spec.domain.cpu.sockets"),
            format!(
                "{wanted} vCPUs is below the {fixed} vCPUs of the first socket, which cannot be \
                 unplugged"
            ),
        ));
    }
    Ok(pluggable
        .into_iter()
        .take(present - wanted)
        .map(|id| ResourceStep::UnplugVcpu { id: id.to_string() })
        .collect())
}

/// Whether unplugging a vCPU would leave QEMU `version` (major, minor, micro) to corrupt its
/// heap: under TCG (`kvm` false), QEMU before the fix of QEMU issue 2517 ("physmem: Destroy all
/// CPU AddressSpaces on unrealize", commit 300a87c502c4, in 10.2.0 and the 10.0.5 stable
/// release) leaves the unplugged vCPU's `tcg_commit` memory listener registered, so the next
/// memory-topology change (any PCI `device_add`, a virtio-mem device, a guest remapping a BAR)
/// calls it on the freed vCPU: QEMU aborts (`corrupted double-linked list`, reproduced with QEMU
/// 7.2 alone on the first `device_add` after a `device_del` of a vCPU). No order of commands
/// avoids it, so such an unplug is refused. The 10.1 series is counted as affected (no stable
/// release of it is known here to carry the fix). Under KVM QEMU registers no such listener.
pub fn tcg_unplug_crashes(kvm: bool, version: (u64, u64, u64)) -> bool {
    let (major, minor, micro) = version;
    !kvm && (major, minor) < (10, 2) && !(major == 10 && minor == 0 && micro >= 5)
}

/// Sets the domain's vCPU count to `wanted` (boot vCPUs of the new VMI's topology); returns the
/// steps run. `unplug_refused`: the reason an unplug must not run on this QEMU
/// ([`tcg_unplug_crashes`]), when it must not.
///
/// # Errors
/// As [`diff_vcpus`]; [`SyncError::InvalidField`] at `spec.domain.cpu.sockets` with
/// `unplug_refused` when the diff unplugs;
/// [`SyncError::Qmp`] from QEMU.
pub async fn set_vcpus(
    client: &QmpClient,
    wanted: u32,
    unplug_refused: Option<String>,
    unplug_timeout: Duration,
) -> Result<Vec<ResourceStep>, SyncError> {
    let reply = client
        .run(&commands::QueryHotpluggableCpus)
        .await
        .map_err(SyncError::Qmp)?;
    let steps = diff_vcpus(&cpu_slots(reply), wanted)?;
    if let Some(reason) = unplug_refused {
        if steps
            .iter()
            .any(|s| matches!(s, ResourceStep::UnplugVcpu { .. }))
        {
            return Err(SyncError::invalid_field(
                FieldPath::new("spec.domain.cpu.sockets"),
                reason,
            ));
        }
    }
    run(client, &steps, unplug_timeout).await?;
    Ok(steps)
}

/// Runs resource steps in order. A failed `device_add` of the virtio-mem device deletes the
/// backend this run added.
pub async fn run(
    client: &QmpClient,
    steps: &[ResourceStep],
    unplug_timeout: Duration,
) -> Result<(), SyncError> {
    let mut added_backend = None;
    for step in steps {
        let done = match step {
            ResourceStep::PlugVcpu(add) => client.run(add).await.map(|_| {
                info!(device = %add.id, "vCPU plugged");
            }),
            ResourceStep::UnplugVcpu { id } => {
                unplug_vcpu(client, id, unplug_timeout).await?;
                info!(device = %id, "vCPU unplugged");
                Ok(())
            }
            ResourceStep::AddMemoryBackend(object) => {
                client.run(&ObjectAdd(object)).await.map(|_| {
                    added_backend = Some(object.id.clone());
                })
            }
            ResourceStep::AddVirtioMem(add) => client.run(add).await.map(drop),
            ResourceStep::SetVirtioMemSize(set) => client.run(set).await.map(drop),
        };
        if let Err(e) = done {
            if let Some(id) = added_backend {
                let _ = client.run(&ObjectDel { id }).await;
            }
            return Err(SyncError::Qmp(e));
        }
    }
    Ok(())
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
        .run(&DeviceDel { id: id.to_string() })
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
            .run(&commands::QueryHotpluggableCpus)
            .await
            .map_err(SyncError::Qmp)?;
        let present = reply
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

/// The memory diff: from `running` to `wanted` bytes of guest memory. The first growth adds the
/// RAM backend and the virtio-mem device (in `free_port`), later ones set its requested size.
/// Pure. Errors: outside boot..=maxGuest, not block-aligned, no maxGuest, no free port.
pub fn diff_memory(
    running: &MemoryState,
    plan: &DomainPlan,
    wanted: u64,
    free_port: Option<&str>,
) -> Result<Vec<ResourceStep>, SyncError> {
    let state = running;
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
        return Err(SyncError::invalid_field(
            FieldPath::new("spec.domain.memory.guest"),
            format!("{wanted} bytes is outside {}..={max}", state.boot),
        ));
    }
    let requested = wanted - state.boot;
    if !requested.is_multiple_of(VIRTIO_MEM_BLOCK) {
        return Err(SyncError::invalid_field(
            FieldPath::new("spec.domain.memory.guest"),
            format!(
                "{wanted} bytes is not {} MiB aligned above the boot memory",
                VIRTIO_MEM_BLOCK >> 20
            ),
        ));
    }
    match state.requested {
        Some(r) if r == requested => Ok(vec![]),
        Some(_) => Ok(vec![ResourceStep::SetVirtioMemSize(QomSet {
            path: format!("/machine/peripheral/{VIRTIO_MEM_ID}"),
            property: "requested-size".into(),
            value: requested,
        })]),
        None if requested == 0 => Ok(vec![]),
        None => {
            let port = free_port.ok_or_else(|| {
                SyncError::Unsupported("memory hotplug: no free PCIe root port".into())
            })?;
            let backend = plan.memory.backend.as_ref();
            let object = ObjectMemoryBackend {
                qom_type: backend.map_or("memory-backend-ram", |b| b.qom_type),
                id: VIRTIO_MEM_BACKEND_ID.into(),
                size: max - state.boot,
                hugetlb: backend.and_then(|b| b.hugetlb),
                hugetlbsize: backend.and_then(|b| b.hugetlbsize),
                share: backend.and_then(|b| b.share),
                prealloc: None,
            };
            Ok(vec![
                ResourceStep::AddMemoryBackend(object),
                ResourceStep::AddVirtioMem(VirtioMemPciAdd {
                    driver: "virtio-mem-pci",
                    id: VIRTIO_MEM_ID.into(),
                    memdev: VIRTIO_MEM_BACKEND_ID.into(),
                    node: 0,
                    block_size: VIRTIO_MEM_BLOCK,
                    requested_size: requested,
                    bus: port.into(),
                    addr: "0x0".into(),
                }),
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
    let steps = diff_memory(state, plan, wanted, port.as_deref())?;
    run(client, &steps, Duration::ZERO).await?;
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

/// The `api.MemoryDevice` of the running virtio-mem device of `memory` (KubeVirt's
/// `BuildMemoryDevice`, `pkg/liveupdate/memory`, as libvirt's live XML reports it): model
/// `virtio-mem`, target `Size` (maxGuest - boot), `Node` 0, `Block` 2 MiB, `Requested` and
/// `Current` (QEMU's `requested-size` and `size`, bytes), alias `virtiomem0` and the PCI address
/// QEMU gave it. `None` when there is no device (no growth yet) or QEMU does not answer.
pub(crate) async fn virtio_mem_device(
    client: &QmpClient,
    memory: &MemoryState,
) -> Option<serde_json::Value> {
    use crate::qmp::commands::QomGet;
    use serde_json::json;
    let (max, requested) = (memory.max?, memory.requested?);
    let path = format!("/machine/peripheral/{VIRTIO_MEM_ID}");
    let current = client
        .run(&QomGet {
            path,
            property: "size".into(),
        })
        .await
        .ok()?
        .as_u64()?;
    let bytes = |v: u64| json!({"Value": v, "Unit": "b"});
    let mut device = json!({
        "Model": "virtio-mem",
        "Target": {
            "Size": bytes(max.saturating_sub(memory.boot)),
            "Requested": bytes(requested),
            "Current": bytes(current),
            "Node": "0",
            "Block": bytes(VIRTIO_MEM_BLOCK),
        },
        "Alias": {"Name": VIRTIO_MEM_ID},
    });
    if let Some(address) = crate::sync::domain_spec::qemu_pci_address(client, VIRTIO_MEM_ID).await {
        crate::sync::domain::identity::DeviceIdentity {
            address: Some(address),
            ..Default::default()
        }
        .write_into(&mut device);
    }
    Some(device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::plan::MemoryPlan;

    fn slot(socket: i64, present: Option<&str>) -> CpuSlot {
        CpuSlot {
            driver: "max-x86_64-cpu".into(),
            vcpus_count: 1,
            props: [
                ("socket-id", socket),
                ("core-id", 0),
                ("thread-id", 0),
                ("node-id", 0),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
            qom_path: present.map(str::to_string),
        }
    }

    fn plug(index: usize, socket: i64) -> ResourceStep {
        let CpuSlot { driver, props, .. } = slot(socket, None);
        ResourceStep::PlugVcpu(CpuDeviceAdd {
            driver,
            id: format!("vcpu{index}"),
            props,
        })
    }

    #[test]
    fn vcpu_slots_are_ordered_by_index() {
        // QEMU lists the slots highest first.
        let slots = cpu_slots(vec![
            slot(3, None),
            slot(1, None),
            slot(2, None),
            slot(0, None),
        ]);
        let sockets: Vec<i64> = slots.iter().map(|s| s.props["socket-id"]).collect();
        assert_eq!(sockets, vec![0, 1, 2, 3]);
    }

    #[test]
    fn vcpu_diff_plugs_from_the_lowest_and_unplugs_from_the_highest() {
        let two_of_four = vec![
            slot(0, Some("/machine/unattached/device[0]")),
            slot(1, Some("/machine/peripheral/vcpu1")),
            slot(2, None),
            slot(3, None),
        ];
        let boot_only = vec![
            slot(0, Some("/machine/unattached/device[0]")),
            slot(1, Some("/machine/unattached/device[1]")),
        ];
        // 2 sockets of 2 cores booted with maxSockets 4: QEMU's own first socket (0, 1), the
        // second socket plugged at start (vcpu2, vcpu3).
        let two_sockets = vec![
            slot(0, Some("/machine/unattached/device[0]")),
            slot(0, Some("/machine/unattached/device[1]")),
            slot(1, Some("/machine/peripheral/vcpu2")),
            slot(1, Some("/machine/peripheral/vcpu3")),
            slot(2, None),
            slot(2, None),
            slot(3, None),
            slot(3, None),
        ];
        let unplug = |id: &str| ResourceStep::UnplugVcpu { id: id.into() };
        let ok_cases = [
            (&two_of_four, 2, vec![]),
            (&two_of_four, 3, vec![plug(2, 2)]),
            (&two_of_four, 4, vec![plug(2, 2), plug(3, 3)]),
            (&two_of_four, 1, vec![unplug("vcpu1")]),
            (&boot_only, 2, vec![]),
            // Down to the first socket, from the highest index.
            (&two_sockets, 2, vec![unplug("vcpu3"), unplug("vcpu2")]),
            (&two_sockets, 4, vec![]),
        ];
        for (running, wanted, steps) in ok_cases {
            assert_eq!(diff_vcpus(running, wanted).unwrap(), steps, "{wanted}");
        }
        // Beyond the slots, zero, or below the first socket.
        for (running, wanted) in [(&two_of_four, 5), (&two_of_four, 0), (&boot_only, 1)] {
            assert!(diff_vcpus(running, wanted).is_err(), "{wanted}");
        }
        assert_eq!(
            diff_vcpus(&two_sockets, 1).unwrap_err().to_string(),
            "invalid VMI: spec.domain.cpu.sockets: 1 vCPUs is below the 2 vCPUs of the first \
             socket, which cannot be unplugged"
        );
    }

    #[test]
    fn vcpu_unplug_under_tcg_is_refused_on_qemu_without_the_fix() {
        for (kvm, version, crashes) in [
            (false, (7, 2, 22), true),
            (false, (10, 0, 4), true),
            (false, (10, 0, 5), false),
            (false, (10, 1, 2), true),
            (false, (10, 2, 0), false),
            (false, (11, 0, 0), false),
            (true, (7, 2, 22), false),
        ] {
            assert_eq!(
                tcg_unplug_crashes(kvm, version),
                crashes,
                "{kvm} {version:?}"
            );
        }
    }

    #[test]
    fn memory_diff_adds_virtio_mem_once_then_resizes() {
        let plan = DomainPlan {
            memory: MemoryPlan {
                size: 1 << 30,
                maxmem: Some(4 << 30),
                ..Default::default()
            },
            ..Default::default()
        };
        let boot = MemoryState::at_boot(&plan);
        let resized = MemoryState {
            requested: Some(1 << 30),
            ..boot
        };
        let add = vec![
            ResourceStep::AddMemoryBackend(ObjectMemoryBackend {
                qom_type: "memory-backend-ram",
                id: "memvirtiomem0".into(),
                size: 3 << 30,
                hugetlb: None,
                hugetlbsize: None,
                share: None,
                prealloc: None,
            }),
            ResourceStep::AddVirtioMem(VirtioMemPciAdd {
                driver: "virtio-mem-pci",
                id: "virtiomem0".into(),
                memdev: "memvirtiomem0".into(),
                node: 0,
                block_size: 2 << 20,
                requested_size: 1 << 30,
                bus: "pci.7".into(),
                addr: "0x0".into(),
            }),
        ];
        let set = |bytes: u64| {
            vec![ResourceStep::SetVirtioMemSize(QomSet {
                path: "/machine/peripheral/virtiomem0".into(),
                property: "requested-size".into(),
                value: bytes,
            })]
        };
        let ok_cases = [
            (boot, 1u64 << 30, None, vec![]),
            (boot, 2 << 30, Some("pci.7"), add),
            (resized, 2 << 30, None, vec![]),
            (resized, 3 << 30, None, set(2 << 30)),
            (resized, 1 << 30, None, set(0)),
        ];
        for (running, wanted, port, steps) in ok_cases {
            assert_eq!(
                diff_memory(&running, &plan, wanted, port).unwrap(),
                steps,
                "{wanted}"
            );
        }
        let no_max = MemoryState { max: None, ..boot };
        let err_cases = [
            (resized, 5u64 << 30, None),
            (resized, (1 << 30) + 4096, None),
            (boot, 512 << 20, None),
            (boot, 2 << 30, None),
            (no_max, 2 << 30, None),
        ];
        for (running, wanted, port) in err_cases {
            assert!(
                diff_memory(&running, &plan, wanted, port).is_err(),
                "{wanted}"
            );
        }
    }
}
