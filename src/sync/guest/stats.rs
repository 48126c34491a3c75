//! `GetDomainStats`: KubeVirt's `stats.DomainStats` (`pkg/virt-launcher/virtwrap/stats/types.go`,
//! v1.9.0) filled from QMP and `/proc` instead of libvirt's bulk stats.
//!
//! KubeVirt asks libvirt for the balloon, cpu-total, vcpu, interface, block and dirty-rate groups
//! (`manager.go`, `getDomainStats`) and converts them field by field (`statsconv/converter.go`);
//! the JSON keys are the Go field names (no json tags). Where each libvirt value comes from here,
//! following libvirt's QEMU driver (`qemu_driver.c`, `qemuDomainGetStats*`):
//!
//! - `Cpu`: `Time`, `User`, `System` in ns from QEMU's `/proc/<pid>/stat` (`utime`, `stime`);
//!   libvirt reads the same counters from the cpuacct cgroup of the QEMU process.
//! - `Vcpu[]`: one entry per `query-cpus-fast` vCPU, `State` 1 (running), `Time` in ns from
//!   `/proc/<pid>/task/<thread-id>/stat`, `Delay` (run-queue wait, ns) from its `schedstat`,
//!   `Wait` from `wait_sum` of its `sched` file when the kernel keeps schedstats.
//! - `Memory` (KiB, as `virDomainMemoryStats`): `ActualBalloon` and `Total` from `query-balloon`
//!   `actual`; `Unused`, `Available`, `Usable`, `Cached`, `SwapIn`, `SwapOut`, `MajorFault`,
//!   `MinorFault` from the balloon's `guest-stats` (`qom-get`, needs the stats polling interval
//!   the start sequence sets); `RSS` from `/proc/<pid>/statm`.
//! - `Block[]`: one entry per `query-blockstats` device with a medium: `Name` is the guest target
//!   (`vda`), `Alias` the VMI disk name (KubeVirt's device alias map); read/write/flush requests,
//!   bytes and times (ns); `Path`, `Capacity` (virtual size) and `Physical` (file size) from
//!   `query-block`; `Allocation` from `wr_highest_offset`.
//! - `Net[]`: one entry per tap: `Name` the tap, `Alias` the VMI interface name, counters from
//!   the tap's `/proc/net/dev` line seen from the guest (rx and tx swapped, as libvirt's
//!   `virNetDevTapInterfaceStats` does for tap devices). The file is read as
//!   `/proc/thread-self/net/dev`: the calling thread's network namespace, which is the pod's.
//! - `CPUMap`: per vCPU thread, its affinity over the host CPUs (`virDomainGetVcpuPinInfo`).
//! - `DirtyRate`: present and empty (qlauncher does not measure it); `MigrateDomainJobInfo` and
//!   `Load` are `null` (no migration, no guest-agent load polling).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::cmdline::context::{IfaceFacts, TapSource};
use crate::cmdline::plan::{DeviceClass, DomainPlan};
use crate::qmp::client::QmpClient;
use crate::qmp::commands::{
    BalloonInfo, BlockDeviceInfo, BlockInfo, BlockStatsInfo, CpuInfoFast, GuestStats,
    QomGetGuestStats, QueryBalloon, QueryBlock, QueryBlockstats, QueryCpusFast,
};
use crate::sync::error::SyncError;
use crate::sys::procfs::stat_times;

/// KubeVirt `stats.DomainStats`, serialised with Go's field names.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct DomainStats {
    /// Domain name (`<namespace>_<name>`).
    pub name: String,
    /// Domain (firmware) UUID.
    #[serde(rename = "UUID")]
    pub uuid: String,
    /// Whole-process CPU time.
    pub cpu: Option<CpuStats>,
    /// Memory (KiB).
    pub memory: Option<MemoryStats>,
    /// Migration job info: `null` unless an outgoing migration runs (then filled by
    /// `sync::migration::outgoing::job_info`).
    pub migrate_domain_job_info: Option<Value>,
    /// One entry per vCPU.
    pub vcpu: Vec<VcpuStats>,
    /// One entry per tap.
    pub net: Vec<NetStats>,
    /// One entry per disk with a medium.
    pub block: Vec<BlockStats>,
    /// `CPUMap` is filled.
    #[serde(rename = "CPUMapSet")]
    pub cpu_map_set: bool,
    /// Per vCPU, whether each host CPU is in its affinity.
    #[serde(rename = "CPUMap")]
    pub cpu_map: Vec<Vec<bool>>,
    /// Dirty rate (left empty).
    pub dirty_rate: Option<DirtyRateStats>,
    /// Guest load (always `null`).
    pub load: Option<Value>,
}

/// KubeVirt `stats.DomainStatsCPU` (ns).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct CpuStats {
    pub time_set: bool,
    pub time: u64,
    pub user_set: bool,
    pub user: u64,
    pub system_set: bool,
    pub system: u64,
}

/// KubeVirt `stats.DomainStatsVcpu` (`State` 1 = running; times in ns).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct VcpuStats {
    pub state_set: bool,
    pub state: i32,
    pub time_set: bool,
    pub time: u64,
    pub wait_set: bool,
    pub wait: u64,
    pub delay_set: bool,
    pub delay: u64,
}

/// KubeVirt `stats.DomainStatsNet`, from the guest's point of view.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NetStats {
    pub name_set: bool,
    pub name: String,
    pub alias_set: bool,
    pub alias: String,
    pub rx_bytes_set: bool,
    pub rx_bytes: u64,
    pub rx_pkts_set: bool,
    pub rx_pkts: u64,
    pub rx_errs_set: bool,
    pub rx_errs: u64,
    pub rx_drop_set: bool,
    pub rx_drop: u64,
    pub tx_bytes_set: bool,
    pub tx_bytes: u64,
    pub tx_pkts_set: bool,
    pub tx_pkts: u64,
    pub tx_errs_set: bool,
    pub tx_errs: u64,
    pub tx_drop_set: bool,
    pub tx_drop: u64,
}

/// KubeVirt `stats.DomainStatsBlock` (bytes, requests, times in ns).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct BlockStats {
    pub name_set: bool,
    pub name: String,
    pub alias: String,
    pub backing_index_set: bool,
    pub backing_index: u32,
    pub path_set: bool,
    pub path: String,
    pub rd_reqs_set: bool,
    pub rd_reqs: u64,
    pub rd_bytes_set: bool,
    pub rd_bytes: u64,
    pub rd_times_set: bool,
    pub rd_times: u64,
    pub wr_reqs_set: bool,
    pub wr_reqs: u64,
    pub wr_bytes_set: bool,
    pub wr_bytes: u64,
    pub wr_times_set: bool,
    pub wr_times: u64,
    pub fl_reqs_set: bool,
    pub fl_reqs: u64,
    pub fl_times_set: bool,
    pub fl_times: u64,
    pub errors_set: bool,
    pub errors: u64,
    pub allocation_set: bool,
    pub allocation: u64,
    pub capacity_set: bool,
    pub capacity: u64,
    pub physical_set: bool,
    pub physical: u64,
}

/// KubeVirt `stats.DomainStatsMemory` (KiB, faults as counts).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct MemoryStats {
    pub unused_set: bool,
    pub unused: u64,
    pub cached_set: bool,
    pub cached: u64,
    pub available_set: bool,
    pub available: u64,
    pub actual_balloon_set: bool,
    pub actual_balloon: u64,
    #[serde(rename = "RSSSet")]
    pub rss_set: bool,
    #[serde(rename = "RSS")]
    pub rss: u64,
    pub swap_in_set: bool,
    pub swap_in: u64,
    pub swap_out_set: bool,
    pub swap_out: u64,
    pub major_fault_set: bool,
    pub major_fault: u64,
    pub minor_fault_set: bool,
    pub minor_fault: u64,
    pub usable_set: bool,
    pub usable: u64,
    pub total_set: bool,
    pub total: u64,
}

/// KubeVirt `stats.DomainStatsDirtyRate`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct DirtyRateStats {
    pub calc_status_set: bool,
    pub calc_status: i32,
    pub calc_start_time_set: bool,
    pub calc_start_time: i64,
    pub calc_period_set: bool,
    pub calc_period: i32,
    pub megabytes_per_second_set: bool,
    pub megabytes_per_second: i64,
}

/// Names the stats carry for the running domain's devices: KubeVirt's device alias map (target
/// device to VMI name) plus the taps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceNames {
    /// Domain name (`<namespace>_<name>`).
    pub domain: String,
    /// Domain UUID.
    pub uuid: String,
    /// Disk device id (`ua-<disk>`) to (guest target such as `vda`, VMI disk name).
    pub disks: BTreeMap<String, (String, String)>,
    /// (tap name, VMI interface name), in plan order.
    pub taps: Vec<(String, String)>,
    /// QOM path of the balloon device (`/machine/peripheral/balloon0`), if any.
    pub balloon: Option<String>,
}

impl DeviceNames {
    /// The names of `plan`'s disks, taps (from the converter context's `interfaces`) and balloon.
    pub fn from_plan(plan: &DomainPlan, interfaces: &BTreeMap<String, IfaceFacts>) -> DeviceNames {
        let disks = plan
            .devices_of(DeviceClass::Disk)
            .filter_map(|d| {
                let name = d.name.clone()?;
                let target = d
                    .target
                    .clone()
                    .unwrap_or_else(|| d.device.id().to_string());
                Some((d.device.id().to_string(), (target, name)))
            })
            .collect();
        let taps = plan
            .devices_of(DeviceClass::Nic)
            .filter_map(|d| {
                let name = d.name.clone()?;
                match &interfaces.get(&name)?.tap {
                    TapSource::Ifname(tap) => Some((tap.clone(), name)),
                    TapSource::Fds { .. } => None,
                }
            })
            .collect();
        let balloon = plan
            .devices_of(DeviceClass::Balloon)
            .next()
            .map(|b| format!("/machine/peripheral/{}", b.device.id()));
        DeviceNames {
            domain: plan.name.clone(),
            uuid: plan.uuid.clone(),
            disks,
            taps,
            balloon,
        }
    }
}

/// Collects the stats of the domain whose QEMU is `pid` over `client`.
///
/// # Errors
/// [`SyncError::Qmp`] when `query-cpus-fast`, `query-blockstats` or `query-block` fail. The
/// balloon queries and `/proc` or `/sys` files that cannot be read leave their fields unset, as
/// libvirt does for groups it cannot fill.
pub async fn collect(
    client: &QmpClient,
    pid: i32,
    names: &DeviceNames,
) -> Result<DomainStats, SyncError> {
    let cpus = client.run(&QueryCpusFast).await.map_err(SyncError::Qmp)?;
    let blockstats = client.run(&QueryBlockstats).await.map_err(SyncError::Qmp)?;
    let block = client.run(&QueryBlock).await.map_err(SyncError::Qmp)?;
    let balloon = client.run(&QueryBalloon).await.ok();
    let guest_stats = match &names.balloon {
        Some(path) => client.run(&QomGetGuestStats::of(path)).await.ok(),
        None => None,
    };
    let proc_dir = Path::new("/proc").join(pid.to_string());
    let net_dev = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap_or_default();
    let ns_per_tick = ns_per_tick();
    let threads = vcpu_threads(&cpus);
    let host_cpus = host_cpu_count();
    let mut stats = DomainStats {
        name: names.domain.clone(),
        uuid: names.uuid.clone(),
        cpu: Some(cpu_stats(
            std::fs::read_to_string(proc_dir.join("stat"))
                .ok()
                .as_deref(),
            ns_per_tick,
        )),
        memory: Some(memory_stats(
            balloon.as_ref(),
            guest_stats.as_ref(),
            std::fs::read_to_string(proc_dir.join("statm"))
                .ok()
                .as_deref(),
            page_size(),
        )),
        vcpu: threads
            .iter()
            .map(|tid| {
                let task = proc_dir.join("task").join(tid.to_string());
                let read = |f: &str| std::fs::read_to_string(task.join(f)).ok();
                vcpu_stats(
                    read("stat").as_deref(),
                    read("schedstat").as_deref(),
                    read("sched").as_deref(),
                    ns_per_tick,
                )
            })
            .collect(),
        net: names
            .taps
            .iter()
            .map(|(tap, alias)| net_stats(&net_dev, tap, alias))
            .collect(),
        block: block_stats(&blockstats, &block, names),
        dirty_rate: Some(DirtyRateStats::default()),
        ..DomainStats::default()
    };
    if host_cpus > 0 {
        stats.cpu_map = threads
            .iter()
            .map(|&tid| affinity(tid, host_cpus))
            .collect();
        stats.cpu_map_set = true;
    }
    Ok(stats)
}

/// Nanoseconds per clock tick (`sysconf(_SC_CLK_TCK)`, 100 Hz when unknown).
fn ns_per_tick() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    1_000_000_000 / u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100)
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

fn host_cpu_count() -> usize {
    // SAFETY: sysconf has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    usize::try_from(n).unwrap_or(0)
}

fn affinity(tid: i32, host_cpus: usize) -> Vec<bool> {
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(tid)) {
        Ok(set) => (0..host_cpus)
            .map(|c| set.is_set(c).unwrap_or(false))
            .collect(),
        Err(_) => vec![false; host_cpus],
    }
}

/// The vCPU thread ids of a `query-cpus-fast` answer, in vCPU order.
fn vcpu_threads(cpus: &[CpuInfoFast]) -> Vec<i32> {
    let mut list: Vec<(i64, i32)> = cpus
        .iter()
        .filter_map(|c| Some((c.cpu_index, i32::try_from(c.thread_id).ok()?)))
        .collect();
    list.sort_unstable();
    list.into_iter().map(|(_, tid)| tid).collect()
}

fn cpu_stats(stat: Option<&str>, ns_per_tick: u64) -> CpuStats {
    match stat.and_then(stat_times) {
        Some((user, system)) => {
            let (user, system) = (user * ns_per_tick, system * ns_per_tick);
            CpuStats {
                time_set: true,
                time: user + system,
                user_set: true,
                user,
                system_set: true,
                system,
            }
        }
        None => CpuStats::default(),
    }
}

fn vcpu_stats(
    stat: Option<&str>,
    schedstat: Option<&str>,
    sched: Option<&str>,
    ns_per_tick: u64,
) -> VcpuStats {
    let mut v = VcpuStats {
        state_set: true,
        state: 1,
        ..VcpuStats::default()
    };
    if let Some((user, system)) = stat.and_then(stat_times) {
        v.time_set = true;
        v.time = (user + system) * ns_per_tick;
    }
    // schedstat: "<on-cpu ns> <run-queue wait ns> <timeslices>".
    if let Some(delay) = schedstat
        .and_then(|s| s.split_whitespace().nth(1))
        .and_then(|d| d.parse().ok())
    {
        v.delay_set = true;
        v.delay = delay;
    }
    // sched: "wait_sum : 12.345678" (ms) when the kernel keeps schedstats.
    if let Some(ms) = sched.and_then(|s| {
        s.lines().find_map(|l| {
            let (key, value) = l.split_once(':')?;
            let key = key.trim();
            (key == "wait_sum" || key.ends_with(".wait_sum"))
                .then(|| value.trim().parse::<f64>().ok())
                .flatten()
        })
    }) {
        v.wait_set = true;
        v.wait = (ms * 1_000_000.0) as u64;
    }
    v
}

fn memory_stats(
    balloon: Option<&BalloonInfo>,
    guest_stats: Option<&GuestStats>,
    statm: Option<&str>,
    page_size: u64,
) -> MemoryStats {
    let mut m = MemoryStats::default();
    if let Some(actual) = balloon.map(|b| b.actual) {
        m.actual_balloon_set = true;
        m.actual_balloon = actual / 1024;
        m.total_set = true;
        m.total = actual / 1024;
    }
    if let Some(stats) = guest_stats {
        let kib = |key: &str| stats.get(key).map(|v| v / 1024);
        let set = |slot: (&mut bool, &mut u64), value: Option<u64>| {
            if let Some(v) = value {
                *slot.0 = true;
                *slot.1 = v;
            }
        };
        set((&mut m.swap_in_set, &mut m.swap_in), kib("stat-swap-in"));
        set((&mut m.swap_out_set, &mut m.swap_out), kib("stat-swap-out"));
        set(
            (&mut m.major_fault_set, &mut m.major_fault),
            stats.get("stat-major-faults"),
        );
        set(
            (&mut m.minor_fault_set, &mut m.minor_fault),
            stats.get("stat-minor-faults"),
        );
        set((&mut m.unused_set, &mut m.unused), kib("stat-free-memory"));
        set(
            (&mut m.available_set, &mut m.available),
            kib("stat-total-memory"),
        );
        set(
            (&mut m.usable_set, &mut m.usable),
            kib("stat-available-memory"),
        );
        set((&mut m.cached_set, &mut m.cached), kib("stat-disk-caches"));
    }
    if let Some(pages) = statm
        .and_then(|s| s.split_whitespace().nth(1))
        .and_then(|p| p.parse::<u64>().ok())
    {
        m.rss_set = true;
        m.rss = pages * page_size / 1024;
    }
    m
}

/// The qdev id in a `query-blockstats`/`query-block` `qdev` value:
/// `/machine/peripheral/ua-disk0/virtio-backend` and `ua-disk0` both give `ua-disk0`.
fn qdev_id(qdev: &str) -> &str {
    let s = qdev.strip_prefix("/machine/peripheral/").unwrap_or(qdev);
    s.strip_suffix("/virtio-backend").unwrap_or(s)
}

fn block_stats(
    blockstats: &[BlockStatsInfo],
    block: &[BlockInfo],
    names: &DeviceNames,
) -> Vec<BlockStats> {
    let images: BTreeMap<&str, &BlockDeviceInfo> = block
        .iter()
        .filter_map(|b| Some((qdev_id(b.qdev.as_deref()?), b.inserted.as_ref()?)))
        .collect();
    let mut out = Vec::new();
    for entry in blockstats {
        let Some(id) = entry.qdev.as_deref().map(qdev_id) else {
            continue;
        };
        let Some(inserted) = images.get(id) else {
            // An empty cdrom tray: libvirt lists no stats for it either.
            continue;
        };
        let s = &entry.stats;
        let (name, alias) = match names.disks.get(id) {
            Some((target, alias)) => (target.clone(), alias.clone()),
            None => (
                id.to_string(),
                id.strip_prefix("ua-").unwrap_or(id).to_string(),
            ),
        };
        let mut b = BlockStats {
            name_set: true,
            name,
            alias,
            ..BlockStats::default()
        };
        let pairs: [(Option<u64>, &mut bool, &mut u64); 8] = [
            (s.rd_operations, &mut b.rd_reqs_set, &mut b.rd_reqs),
            (s.rd_bytes, &mut b.rd_bytes_set, &mut b.rd_bytes),
            (s.rd_total_time_ns, &mut b.rd_times_set, &mut b.rd_times),
            (s.wr_operations, &mut b.wr_reqs_set, &mut b.wr_reqs),
            (s.wr_bytes, &mut b.wr_bytes_set, &mut b.wr_bytes),
            (s.wr_total_time_ns, &mut b.wr_times_set, &mut b.wr_times),
            (s.flush_operations, &mut b.fl_reqs_set, &mut b.fl_reqs),
            (s.flush_total_time_ns, &mut b.fl_times_set, &mut b.fl_times),
        ];
        for (counter, set, value) in pairs {
            if let Some(v) = counter {
                *set = true;
                *value = v;
            }
        }
        if let Some(v) = s.wr_highest_offset {
            b.allocation_set = true;
            b.allocation = v;
        }
        let image = inserted.image.clone().unwrap_or_default();
        if let Some(path) = image.filename.as_deref().or(inserted.file.as_deref()) {
            b.path_set = true;
            b.path = path.to_string();
        }
        if let Some(v) = image.virtual_size {
            b.capacity_set = true;
            b.capacity = v;
        }
        if let Some(v) = image.actual_size {
            b.physical_set = true;
            b.physical = v;
        }
        out.push(b);
    }
    out
}

/// The counters of a tap from the guest's side, from a `/proc/net/dev` text: the tap's transmit
/// counters are the guest's receive counters (libvirt `virNetDevTapInterfaceStats`, `swapped`).
/// Counters stay unset when the tap has no line.
fn net_stats(net_dev: &str, tap: &str, alias: &str) -> NetStats {
    let mut n = NetStats {
        name_set: true,
        name: tap.to_string(),
        alias_set: !alias.is_empty(),
        alias: alias.to_string(),
        ..NetStats::default()
    };
    // "  tap0: rx_bytes rx_packets rx_errs rx_drop fifo frame compressed multicast
    //          tx_bytes tx_packets tx_errs tx_drop fifo colls carrier compressed"
    let Some(counters) = net_dev.lines().find_map(|l| {
        let (name, rest) = l.split_once(':')?;
        (name.trim() == tap).then(|| {
            rest.split_whitespace()
                .map(|v| v.parse::<u64>().ok())
                .collect::<Option<Vec<u64>>>()
        })?
    }) else {
        return n;
    };
    if counters.len() < 12 {
        return n;
    }
    let pairs: [(usize, &mut bool, &mut u64); 8] = [
        (8, &mut n.rx_bytes_set, &mut n.rx_bytes),
        (9, &mut n.rx_pkts_set, &mut n.rx_pkts),
        (10, &mut n.rx_errs_set, &mut n.rx_errs),
        (11, &mut n.rx_drop_set, &mut n.rx_drop),
        (0, &mut n.tx_bytes_set, &mut n.tx_bytes),
        (1, &mut n.tx_pkts_set, &mut n.tx_pkts),
        (2, &mut n.tx_errs_set, &mut n.tx_errs),
        (3, &mut n.tx_drop_set, &mut n.tx_drop),
    ];
    for (index, set, value) in pairs {
        *set = true;
        *value = counters[index];
    }
    n
}

#[cfg(test)]
mod tests;
