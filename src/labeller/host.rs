//! What the node labeller reads from the host itself, not from QEMU: the hypervisor device and
//! the virt type (KubeVirt's `node-labeller.sh`), the TSC counter (libvirt `virhostcpu.c`
//! `virHostCPUGetTscInfo`), the host CPUID (invariant TSC, SEV ASIDs, the host-model fallback)
//! and the NUMA cells (libvirt `conf/capabilities.c` `virCapabilitiesHostNUMAInitReal`,
//! `util/virnuma.c`, `util/virhostcpu.c`).
//!
//! Paths are relative to [`HostPaths`] so that tests can point them at a directory of their own.
//! Nothing here fails: a file that cannot be read leaves its fact out (or takes the value libvirt
//! uses when the file is missing) and adds a warning naming it.

use std::collections::BTreeSet;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::cpu_map::{CpuData, CpuMap, DataKey};

/// The roots the labeller reads the host through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    /// `/dev`: the hypervisor device, `/dev/kvm` for the TSC, `/dev/sev`.
    pub dev: PathBuf,
    /// `/sys`: `devices/system/node` and `devices/system/cpu`.
    pub sys: PathBuf,
    /// `/proc`: `misc` (the hypervisor device's minor), `meminfo`.
    pub proc: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        HostPaths {
            dev: "/dev".into(),
            sys: "/sys".into(),
            proc: "/proc".into(),
        }
    }
}

/// The virt type KubeVirt's `node-labeller.sh` picks, and what it did to the device on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtChoice {
    /// `kvm` (the hypervisor device is there: `PREFERRED_VIRTTYPE`) or `qemu` (TCG).
    pub virttype: String,
    /// The device path, when it exists (after a `mknod` if that was needed).
    pub device: Option<PathBuf>,
}

/// Decides the virt type as `node-labeller.sh` (KubeVirt v1.9.0) does and prepares the device the
/// same way: `HYPERVISOR_DEVICE` and `PREFERRED_VIRTTYPE` default to `kvm` when either is empty;
/// a device missing from `/dev` but listed in `/proc/misc` is created (`mknod c 10 <minor>`); an
/// existing device gets `o+rw` (so that QEMU as uid 107 opens it in the VMI pods) and selects
/// `PREFERRED_VIRTTYPE`, a missing one `qemu`; `/dev/sev` gets `o+rw` too. Without `prepare`
/// nothing on the host is changed (no `mknod`, no `chmod`): only the choice is made. A device name
/// that is not a plain file name is refused (warning) and `kvm` used.
pub fn choose_virttype(
    paths: &HostPaths,
    device: &str,
    preferred: &str,
    prepare: bool,
    warnings: &mut Vec<String>,
) -> VirtChoice {
    let (mut device, preferred) = if device.is_empty() || preferred.is_empty() {
        ("kvm", "kvm")
    } else {
        (device, preferred)
    };
    if device.contains('/') || device == "." || device == ".." {
        warnings.push(format!(
            "HYPERVISOR_DEVICE {device:?} is not a device name; using kvm"
        ));
        device = "kvm";
    }
    let path = paths.dev.join(device);
    if prepare && !path.exists() {
        if let Some(minor) = misc_minor(&paths.proc, device) {
            let dev = libc::makedev(10, minor);
            if let Err(e) = nix::sys::stat::mknod(
                &path,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o644),
                dev,
            ) {
                warnings.push(format!(
                    "cannot create {} (misc minor {minor}): {e}",
                    path.display()
                ));
            }
        }
    }
    if !path.exists() {
        return VirtChoice {
            virttype: "qemu".into(),
            device: None,
        };
    }
    if !prepare {
        return VirtChoice {
            virttype: preferred.to_owned(),
            device: Some(path),
        };
    }
    if let Err(e) = add_other_rw(&path) {
        warnings.push(format!("cannot chmod o+rw {}: {e}", path.display()));
    }
    let sev = paths.dev.join("sev");
    if sev.exists() {
        if let Err(e) = add_other_rw(&sev) {
            warnings.push(format!("cannot chmod o+rw {}: {e}", sev.display()));
        }
    }
    VirtChoice {
        virttype: preferred.to_owned(),
        device: Some(path),
    }
}

/// The minor of misc device `name` in `proc/misc` (`<minor> <name>` lines).
fn misc_minor(proc: &Path, name: &str) -> Option<u32> {
    let text = std::fs::read_to_string(proc.join("misc")).ok()?;
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        let minor = it.next()?.parse().ok()?;
        (it.next()? == name).then_some(minor)
    })
}

fn add_other_rw(path: &Path) -> std::io::Result<()> {
    let mode = std::fs::metadata(path)?.permissions().mode();
    if mode & 0o006 == 0o006 {
        return Ok(());
    }
    std::fs::set_permissions(
        path,
        std::fs::Permissions::from_mode((mode | 0o006) & 0o7777),
    )
}

/// `CPUID` of `leaf`/`subleaf` on this host: `[eax, ebx, ecx, edx]`.
#[cfg(target_arch = "x86_64")]
pub fn cpuid(leaf: u32, subleaf: u32) -> [u32; 4] {
    let r = std::arch::x86_64::__cpuid_count(leaf, subleaf);
    [r.eax, r.ebx, r.ecx, r.edx]
}

/// `CPUID` is x86 only; elsewhere every leaf reads as zero.
#[cfg(not(target_arch = "x86_64"))]
pub fn cpuid(_leaf: u32, _subleaf: u32) -> [u32; 4] {
    [0; 4]
}

/// Whether the host CPU has an invariant TSC (`CPUID.80000007H:EDX[8]`, libvirt's `invtsc`):
/// only then does libvirt report the TSC counter.
pub fn host_has_invtsc() -> bool {
    cpuid(0x8000_0000, 0)[0] >= 0x8000_0007 && cpuid(0x8000_0007, 0)[3] & (1 << 8) != 0
}

/// SEV guest limits from `CPUID 0x8000001F` (`virQEMUCapsGetSEVMaxGuests`): `ECX` is the highest
/// SEV ASID, `EDX` the lowest non-ES one; `(max_guests, max_es_guests)`, both 0 when either is 0.
pub fn sev_max_guests() -> (u32, u32) {
    if cpuid(0x8000_0000, 0)[0] < 0x8000_001f {
        return (0, 0);
    }
    let r = cpuid(0x8000_001f, 0);
    let (max_asid, min_asid) = (r[2], r[3]);
    if max_asid == 0 || min_asid == 0 || min_asid > max_asid + 1 {
        return (0, 0);
    }
    (max_asid - min_asid + 1, min_asid - 1)
}

/// The host's own CPU data for the leaves `map` uses, with the vendor string and signature:
/// what libvirt decodes when QEMU gives no host CPU model (`virCPUx86GetHost`, without the
/// `IA32_ARCH_CAPABILITIES` MSR, which needs `/dev/cpu/*/msr`).
pub fn host_cpu_data(map: &CpuMap) -> CpuData {
    let mut data = CpuData::default();
    let max_basic = cpuid(0, 0)[0];
    let max_ext = cpuid(0x8000_0000, 0)[0];
    let mut keys: BTreeSet<(u32, u32)> = BTreeSet::from([(0, 0), (1, 0)]);
    for f in &map.features {
        for k in f.data.keys() {
            if let DataKey::Cpuid { leaf, subleaf } = k {
                keys.insert((leaf, subleaf));
            }
        }
    }
    for (leaf, subleaf) in keys {
        let in_range = if leaf >= 0x8000_0000 {
            leaf <= max_ext
        } else {
            leaf <= max_basic
        };
        if !in_range || (0x4000_0000..0x8000_0000).contains(&leaf) {
            continue;
        }
        let mut r = cpuid(leaf, subleaf);
        if leaf == 0 {
            r[0] = 0;
        }
        data.set(DataKey::Cpuid { leaf, subleaf }, r);
    }
    data
}

/// The TSC counter libvirt writes into `capabilities.xml` (`<counter name='tsc'>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TscCounter {
    /// Frequency in Hz (KVM's kHz × 1000).
    pub frequency: u64,
    /// KVM can scale the guest TSC (`KVM_CAP_TSC_CONTROL`).
    pub scaling: bool,
}

/// The KVM ioctls libvirt's TSC probe makes (linux `include/uapi/linux/kvm.h`).
mod ioctl {
    const KVMIO: u8 = 0xAE;
    nix::ioctl_write_int_bad!(kvm_create_vm, nix::request_code_none!(KVMIO, 0x01));
    nix::ioctl_write_int_bad!(kvm_check_extension, nix::request_code_none!(KVMIO, 0x03));
    nix::ioctl_write_int_bad!(kvm_create_vcpu, nix::request_code_none!(KVMIO, 0x41));
    nix::ioctl_none_bad!(kvm_get_tsc_khz, nix::request_code_none!(KVMIO, 0xa3));
}
use ioctl::{kvm_check_extension, kvm_create_vcpu, kvm_create_vm, kvm_get_tsc_khz};
/// `KVM_CAP_TSC_CONTROL` (linux `include/uapi/linux/kvm.h`).
const KVM_CAP_TSC_CONTROL: i32 = 60;

/// The host TSC as libvirt probes it (`virHostCPUGetTscInfo`): only with an invariant TSC, through
/// `kvm` (a throw-away VM and vCPU, `KVM_GET_TSC_KHZ`, `KVM_CHECK_EXTENSION(KVM_CAP_TSC_CONTROL)`).
/// `None` without invariant TSC or `/dev/kvm` (warning for a `/dev/kvm` that exists but fails).
pub fn tsc_counter(kvm: &Path, warnings: &mut Vec<String>) -> Option<TscCounter> {
    if !host_has_invtsc() || !kvm.exists() {
        return None;
    }
    match probe_tsc(kvm) {
        Ok(t) => Some(t),
        Err(e) => {
            warnings.push(format!(
                "no TSC counter: probing it through {} failed: {e}",
                kvm.display()
            ));
            None
        }
    }
}

fn probe_tsc(kvm: &Path) -> std::io::Result<TscCounter> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(kvm)?;
    let owned = |fd: i32| -> std::io::Result<OwnedFd> {
        // SAFETY: a KVM ioctl that returned a non-negative value returned a new descriptor.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    // SAFETY: the ioctls take an integer argument (or none) on fds we own.
    let vm = owned(unsafe { kvm_create_vm(dev.as_raw_fd(), 0) }?)?;
    let vcpu = owned(unsafe { kvm_create_vcpu(vm.as_raw_fd(), 0) }?)?;
    let khz = unsafe { kvm_get_tsc_khz(vcpu.as_raw_fd()) }?;
    let scaling = unsafe { kvm_check_extension(dev.as_raw_fd(), KVM_CAP_TSC_CONTROL) }?;
    Ok(TscCounter {
        frequency: u64::try_from(khz).unwrap_or(0) * 1000,
        scaling: scaling > 0,
    })
}

/// One host CPU of a NUMA cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellCpu {
    /// CPU number.
    pub id: u32,
    /// `topology/physical_package_id` (0 when missing or negative).
    pub socket_id: u32,
    /// `topology/die_id` (0 when missing or negative).
    pub die_id: u32,
    /// `topology/core_id` (0 when missing).
    pub core_id: u32,
    /// `topology/thread_siblings_list` (the CPU itself when missing).
    pub siblings: BTreeSet<u32>,
}

/// One NUMA cell, as `capabilities.xml` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    /// Node number.
    pub id: u32,
    /// `MemTotal` of the node in KiB.
    pub memory_kib: u64,
    /// Page pools `(size KiB, count)`, smallest first: the base pages (memory not in huge pages)
    /// and each huge page size's `nr_hugepages`. Empty when unknown.
    pub pages: Vec<(u64, u64)>,
    /// Distances to other nodes `(node, value)`, zero values left out.
    pub distances: Vec<(u32, u32)>,
    /// The node's CPUs.
    pub cpus: Vec<CellCpu>,
}

/// The host's NUMA cells from `sys/devices/system/node`, or one cell of every online CPU and
/// `/proc/meminfo`'s memory when the node directories cannot be read
/// (`virCapabilitiesHostNUMAInitFake`). Unreadable per-CPU files take libvirt's default for a
/// missing file and add a warning.
pub fn numa_cells(paths: &HostPaths, warnings: &mut Vec<String>) -> Vec<Cell> {
    let node_dir = paths.sys.join("devices/system/node");
    let mut nodes: Vec<u32> = match std::fs::read_dir(&node_dir) {
        Ok(rd) => rd
            .flatten()
            .filter_map(|e| {
                let n = e.file_name();
                n.to_str()?.strip_prefix("node")?.parse().ok()
            })
            .collect(),
        Err(e) => {
            warnings.push(format!(
                "cannot list {}: {e}; one NUMA cell of all online CPUs instead",
                node_dir.display()
            ));
            Vec::new()
        }
    };
    nodes.sort_unstable();
    let page_kib = page_size_kib();
    let mut cells = Vec::new();
    for n in &nodes {
        let dir = node_dir.join(format!("node{n}"));
        let Some(cpus) = read_list(&dir.join("cpulist"), warnings) else {
            continue;
        };
        let memory_kib = node_memtotal_kib(&dir.join("meminfo"), warnings).unwrap_or(0);
        let mut pages = Vec::new();
        let mut huge_kib = 0u64;
        let hp_dir = dir.join("hugepages");
        if let Ok(rd) = std::fs::read_dir(&hp_dir) {
            for e in rd.flatten() {
                let name = e.file_name();
                let Some(size) = name
                    .to_str()
                    .and_then(|s| s.strip_prefix("hugepages-"))
                    .and_then(|s| s.strip_suffix("kB"))
                    .and_then(|s| s.parse::<u64>().ok())
                else {
                    continue;
                };
                let nr = e.path().join("nr_hugepages");
                match read_trimmed(&nr).map(|s| s.parse::<u64>()) {
                    Ok(Ok(count)) => {
                        huge_kib += size * count;
                        pages.push((size, count));
                    }
                    _ => warnings.push(format!(
                        "cannot read {}; page size {size} KiB skipped",
                        nr.display()
                    )),
                }
            }
        }
        pages.push((
            page_kib,
            memory_kib.saturating_sub(huge_kib) / page_kib.max(1),
        ));
        pages.sort_unstable();
        let distances = match read_trimmed(&dir.join("distance")) {
            Ok(s) => s
                .split_whitespace()
                .enumerate()
                .filter_map(|(i, v)| Some((u32::try_from(i).ok()?, v.parse::<u32>().ok()?)))
                .filter(|(_, v)| *v != 0)
                .collect(),
            Err(e) => {
                warnings.push(format!("cannot read {}/distance: {e}", dir.display()));
                Vec::new()
            }
        };
        let cpus = cpus.iter().map(|&c| cell_cpu(paths, c, warnings)).collect();
        cells.push(Cell {
            id: *n,
            memory_kib,
            pages,
            distances,
            cpus,
        });
    }
    if cells.is_empty() {
        cells.push(fake_cell(paths, warnings));
    }
    cells
}

fn fake_cell(paths: &HostPaths, warnings: &mut Vec<String>) -> Cell {
    let online = paths.sys.join("devices/system/cpu/online");
    let cpus = read_list(&online, warnings).unwrap_or_else(|| {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        (0..u32::try_from(n).unwrap_or(1)).collect()
    });
    let meminfo = paths.proc.join("meminfo");
    let memory_kib = std::fs::read_to_string(&meminfo)
        .ok()
        .and_then(|t| meminfo_kib(&t, "MemTotal:"))
        .unwrap_or_else(|| {
            warnings.push(format!("cannot read MemTotal from {}", meminfo.display()));
            0
        });
    Cell {
        id: 0,
        memory_kib,
        pages: Vec::new(),
        distances: Vec::new(),
        cpus: cpus
            .iter()
            .map(|&c| CellCpu {
                id: c,
                socket_id: 0,
                die_id: 0,
                core_id: c,
                siblings: BTreeSet::from([c]),
            })
            .collect(),
    }
}

fn cell_cpu(paths: &HostPaths, id: u32, warnings: &mut Vec<String>) -> CellCpu {
    let topo = paths
        .sys
        .join(format!("devices/system/cpu/cpu{id}/topology"));
    let mut int = |file: &str| -> u32 {
        let p = topo.join(file);
        match read_trimmed(&p) {
            Ok(s) => match s.parse::<i64>() {
                Ok(v) => u32::try_from(v).unwrap_or(0),
                Err(_) => {
                    warnings.push(format!("{} is not a number: {s:?}; 0 used", p.display()));
                    0
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => {
                warnings.push(format!("cannot read {}: {e}; 0 used", p.display()));
                0
            }
        }
    };
    let socket_id = int("physical_package_id");
    let die_id = int("die_id");
    let core_id = int("core_id");
    let sib = topo.join("thread_siblings_list");
    let siblings = if sib.exists() {
        read_list(&sib, warnings)
    } else {
        None
    }
    .unwrap_or_else(|| BTreeSet::from([id]));
    CellCpu {
        id,
        socket_id,
        die_id,
        core_id,
        siblings,
    }
}

fn read_trimmed(path: &Path) -> std::io::Result<String> {
    Ok(std::fs::read_to_string(path)?.trim().to_owned())
}

/// A kernel CPU list file (`0-3,8`), or `None` with a warning.
fn read_list(path: &Path, warnings: &mut Vec<String>) -> Option<BTreeSet<u32>> {
    let text = match read_trimmed(path) {
        Ok(t) => t,
        Err(e) => {
            warnings.push(format!("cannot read {}: {e}", path.display()));
            return None;
        }
    };
    let list = parse_list(&text);
    if list.is_none() {
        warnings.push(format!("{} is not a CPU list: {text:?}", path.display()));
    }
    list
}

/// Parses a kernel list (`0-3,8`, empty for none); `None` when malformed or above 65535.
pub fn parse_list(text: &str) -> Option<BTreeSet<u32>> {
    let mut set = BTreeSet::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let n = part.parse::<u32>().ok()?;
                (n, n)
            }
        };
        if a > b || b > 0xffff {
            return None;
        }
        set.extend(a..=b);
    }
    Some(set)
}

/// A set as libvirt formats bitmaps (`virBitmapFormat`): runs as `a-b`, single bits alone.
pub fn format_list(set: &BTreeSet<u32>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut it = set.iter().copied().peekable();
    while let Some(start) = it.next() {
        let mut end = start;
        while it.peek() == Some(&(end + 1)) {
            end += 1;
            it.next();
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    parts.join(",")
}

fn node_memtotal_kib(path: &Path, warnings: &mut Vec<String>) -> Option<u64> {
    let v = std::fs::read_to_string(path).ok().and_then(|t| {
        t.lines().find_map(|l| {
            let rest = l.split_once("MemTotal:")?.1;
            rest.split_whitespace().next()?.parse().ok()
        })
    });
    if v.is_none() {
        warnings.push(format!("cannot read MemTotal from {}", path.display()));
    }
    v
}

fn meminfo_kib(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.split_whitespace().next()?.parse().ok())
}

fn page_size_kib() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(bytes).map_or(4, |b| (b / 1024).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_format_as_libvirt_does() {
        let s = parse_list("0-3,8,10-11").unwrap();
        assert_eq!(format_list(&s), "0-3,8,10-11");
        assert_eq!(format_list(&parse_list("0,1").unwrap()), "0-1");
        assert_eq!(format_list(&parse_list("5").unwrap()), "5");
        assert_eq!(parse_list("").unwrap().len(), 0);
        assert!(parse_list("3-1").is_none());
        assert!(parse_list("x").is_none());
        assert!(parse_list("0-99999999").is_none());
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn cells_from_sysfs_with_huge_pages_and_gaps() {
        let root = tempfile::tempdir().unwrap();
        let sys = root.path().join("sys");
        let s = |rel: &str, text: &str| write(&sys, rel, text);
        s("devices/system/node/node0/cpulist", "0-1\n");
        s(
            "devices/system/node/node0/meminfo",
            "Node 0 MemTotal:       1048576 kB\nNode 0 MemFree: 1 kB\n",
        );
        s("devices/system/node/node0/distance", "10 20\n");
        s(
            "devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages",
            "16\n",
        );
        s("devices/system/node/node1/cpulist", "\n");
        s(
            "devices/system/node/node1/meminfo",
            "Node 1 MemTotal: 0 kB\n",
        );
        s("devices/system/node/node1/distance", "20 10\n");
        s("devices/system/cpu/cpu0/topology/core_id", "0\n");
        s(
            "devices/system/cpu/cpu0/topology/physical_package_id",
            "-1\n",
        );
        s(
            "devices/system/cpu/cpu0/topology/thread_siblings_list",
            "0-1\n",
        );
        s("devices/system/cpu/cpu1/topology/core_id", "garbage\n");
        let paths = HostPaths {
            sys,
            ..HostPaths::default()
        };
        let mut warnings = Vec::new();
        let cells = numa_cells(&paths, &mut warnings);
        assert_eq!(cells.len(), 2);
        let c0 = &cells[0];
        let base = page_size_kib();
        assert_eq!(c0.memory_kib, 1048576);
        assert_eq!(c0.pages, vec![(base, (1048576 - 32768) / base), (2048, 16)]);
        assert_eq!(c0.distances, vec![(0, 10), (1, 20)]);
        assert_eq!(c0.cpus[0].siblings, BTreeSet::from([0, 1]));
        assert_eq!(c0.cpus[0].socket_id, 0);
        // cpu1 has no siblings file (itself) and a core_id that is not a number (0, warned).
        assert_eq!(c0.cpus[1].siblings, BTreeSet::from([1]));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("cpu1/topology/core_id"),
            "{warnings:?}"
        );
        assert!(cells[1].cpus.is_empty());
    }

    #[test]
    fn no_node_directory_gives_one_cell_of_the_online_cpus() {
        let root = tempfile::tempdir().unwrap();
        write(root.path(), "sys/devices/system/cpu/online", "0-2\n");
        write(root.path(), "proc/meminfo", "MemTotal:   2048 kB\n");
        let paths = HostPaths {
            dev: root.path().join("dev"),
            sys: root.path().join("sys"),
            proc: root.path().join("proc"),
        };
        let mut warnings = Vec::new();
        let cells = numa_cells(&paths, &mut warnings);
        assert_eq!(cells.len(), 1);
        assert_eq!((cells[0].memory_kib, cells[0].cpus.len()), (2048, 3));
        assert!(warnings[0].contains("devices/system/node"), "{warnings:?}");
    }

    #[test]
    fn virttype_follows_the_device_as_node_labeller_sh_does() {
        let root = tempfile::tempdir().unwrap();
        let paths = HostPaths {
            dev: root.path().join("dev"),
            sys: root.path().join("sys"),
            proc: root.path().join("proc"),
        };
        std::fs::create_dir_all(&paths.dev).unwrap();
        let mut w = Vec::new();
        // No device and not in /proc/misc: TCG.
        assert_eq!(
            choose_virttype(&paths, "kvm", "kvm", true, &mut w).virttype,
            "qemu"
        );
        // A device (a plain file here) that exists: PREFERRED_VIRTTYPE, and o+rw added.
        std::fs::write(paths.dev.join("kvm"), "").unwrap();
        std::fs::set_permissions(
            paths.dev.join("kvm"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let c = choose_virttype(&paths, "", "", false, &mut w);
        assert_eq!(c.virttype, "kvm");
        let mode = std::fs::metadata(paths.dev.join("kvm"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "nothing changed without prepare");
        let c = choose_virttype(&paths, "", "", true, &mut w);
        assert_eq!(c.virttype, "kvm");
        let mode = std::fs::metadata(paths.dev.join("kvm"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o606);
        // A device name with a slash is refused.
        let c = choose_virttype(&paths, "../etc", "kvm", true, &mut w);
        assert_eq!(c.device.as_deref(), Some(paths.dev.join("kvm").as_path()));
        assert!(w.iter().any(|m| m.contains("not a device name")), "{w:?}");
        assert_eq!(misc_minor(&paths.proc, "kvm"), None);
        write(
            root.path(),
            "proc/misc",
            "232 kvm\n 58 network_throughput\n",
        );
        assert_eq!(misc_minor(&paths.proc, "kvm"), Some(232));
    }
}
