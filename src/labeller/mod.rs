//! The node labeller without libvirt: what the launcher image's `node-labeller.sh` does for
//! virt-handler's init container (KubeVirt v1.9.0 `cmd/virt-launcher/node-labeller/node-labeller.sh`,
//! run as `/bin/sh -c node-labeller.sh`, root, privileged, with `PREFERRED_VIRTTYPE` and
//! `HYPERVISOR_DEVICE`), with qlauncher's own code in place of `virtqemud` and `virsh`.
//!
//! One [`run`] picks the virt type from the hypervisor device as the script does
//! ([`host::choose_virttype`]), probes the image's QEMU over QMP as libvirt does
//! ([`probe::probe_qemu`]), decodes its host CPU against libvirt's CPU map ([`cpu_map`],
//! [`x86`]), reads the TSC and the NUMA cells from the host ([`host`]), and writes, each under a
//! temporary name then renamed, into `/var/lib/kubevirt-node-labeller` ([`OUT_DIR`]):
//!
//! | file | as libvirt's | read by virt-handler for |
//! |---|---|---|
//! | `virsh_domcapabilities.xml` | `virsh domcapabilities --machine q35 --arch x86_64 --virttype V` | host-model, CPU models, SEV |
//! | `supported_features.xml` | `virsh hypervisor-cpu-baseline --features` of that | `cpu-feature.node.kubevirt.io/*` |
//! | `capabilities.xml` | `virsh capabilities` | machine types, TSC, NUMA topology |
//! | `virsh_domcapabilities_aarch64.xml` | empty (the image has no aarch64 QEMU) | cross-arch label |
//!
//! so that KubeVirt's node-labeller code computes the same labels from them as from libvirt's
//! files for the same QEMU on the same host ([`render`]). A step that fails (QEMU will not start,
//! a QMP query errors, a sysfs file is unreadable, the CPU map is missing) leaves its part out with
//! a warning in [`Report::warnings`]; the files are still ones virt-handler starts with. Only a
//! directory that cannot be written is an error.

pub mod cpu_map;
pub mod host;
pub mod probe;
pub mod render;
pub mod x86;
pub mod xml;

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use host::HostPaths;
pub use render::is_label_name;

/// virt-handler's node-labeller directory (a hostPath mounted at the same path in the init
/// container and in virt-handler; `nodeLabellerVolumePath` in virt-operator).
pub const OUT_DIR: &str = "/var/lib/kubevirt-node-labeller";

/// `virsh_domcapabilities.xml`.
pub const DOMCAPABILITIES: &str = "virsh_domcapabilities.xml";
/// `supported_features.xml`.
pub const SUPPORTED_FEATURES: &str = "supported_features.xml";
/// `capabilities.xml`.
pub const CAPABILITIES: &str = "capabilities.xml";
/// The cross-arch file of an x86_64 node: written empty, as the v1.9.0 image (no aarch64 QEMU)
/// leaves it, so no earlier file keeps `kubevirt.io/vm-arch-arm64` on the node.
pub const CROSS_ARCH: &str = "virsh_domcapabilities_aarch64.xml";

/// Where the CPU map is looked for, in order: the image's copy, then the distribution's libvirt.
pub const CPU_MAP_DIRS: &[&str] = &["/usr/share/qlauncher/cpu_map", "/usr/share/libvirt/cpu_map"];

/// What one run uses.
#[derive(Debug, Clone)]
pub struct Options {
    /// The directory the files go to ([`OUT_DIR`]).
    pub out_dir: PathBuf,
    /// The QEMU to probe ([`probe::IMAGE_QEMU`]).
    pub qemu: PathBuf,
    /// libvirt's CPU map directory; `None` looks in [`CPU_MAP_DIRS`].
    pub cpu_map: Option<PathBuf>,
    /// The host's `/dev`, `/sys`, `/proc`.
    pub host: HostPaths,
    /// `HYPERVISOR_DEVICE` (`kvm`, `mshv`; empty: `kvm`).
    pub hypervisor_device: String,
    /// `PREFERRED_VIRTTYPE` (`kvm`, `hyperv`; empty: `kvm`).
    pub preferred_virttype: String,
    /// Make the hypervisor device usable as `node-labeller.sh` does (`mknod` when missing,
    /// `chmod o+rw`, also of `/dev/sev`). Off, the host is only read.
    pub prepare_device: bool,
    /// The virt type to describe (`kvm`, `qemu`) instead of the script's device rule.
    pub virttype: Option<String>,
    /// Bound on QEMU's start and on each QMP command.
    pub timeout: Duration,
}

impl Options {
    /// KubeVirt's init container: the defaults, with the two environment variables virt-operator
    /// sets.
    pub fn from_env() -> Options {
        let var = |k| std::env::var(k).unwrap_or_default();
        Options {
            out_dir: OUT_DIR.into(),
            qemu: probe::find_qemu(Path::new(probe::IMAGE_QEMU)),
            cpu_map: None,
            host: HostPaths::default(),
            hypervisor_device: var("HYPERVISOR_DEVICE"),
            preferred_virttype: var("PREFERRED_VIRTTYPE"),
            prepare_device: true,
            virttype: None,
            timeout: Duration::from_secs(60),
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// The virt type the files describe (`kvm`, `qemu`).
    pub virttype: String,
    /// QEMU's version, when the probe got it.
    pub qemu_version: Option<String>,
    /// The files written, in order.
    pub files: Vec<PathBuf>,
    /// What was skipped, one line each.
    pub warnings: Vec<String>,
}

/// Why a run failed: only when the files cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum LabellerError {
    /// Creating the directory or writing, syncing or renaming a file failed.
    #[error("cannot write {path}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Probes, renders and writes the files (see the module docs).
pub async fn run(opts: &Options) -> Result<Report, LabellerError> {
    let mut warnings = Vec::new();
    let accel = choose_accel(opts, &mut warnings);
    let probed = probe::probe_qemu(&opts.qemu, accel, opts.timeout, &mut warnings).await;
    write_files(opts, accel, &probed, warnings)
}

/// The accelerator to probe: [`Options::virttype`], else `node-labeller.sh`'s device rule
/// ([`host::choose_virttype`], which prepares the device when [`Options::prepare_device`]).
pub fn choose_accel(opts: &Options, warnings: &mut Vec<String>) -> probe::Accel {
    let virttype = match &opts.virttype {
        Some(v) => v.clone(),
        None => {
            host::choose_virttype(
                &opts.host,
                &opts.hypervisor_device,
                &opts.preferred_virttype,
                opts.prepare_device,
                warnings,
            )
            .virttype
        }
    };
    match virttype.as_str() {
        "kvm" => probe::Accel::Kvm,
        "qemu" => probe::Accel::Tcg,
        other => {
            warnings.push(format!(
                "virt type {other:?} is not one this QEMU offers; probing TCG"
            ));
            probe::Accel::Tcg
        }
    }
}

/// Reads the host, renders the files from `probed` (a probe of [`Options::qemu`] with `accel`)
/// and writes them; `warnings` so far are kept in the report.
pub fn write_files(
    opts: &Options,
    accel: probe::Accel,
    probed: &probe::QemuProbe,
    mut warnings: Vec<String>,
) -> Result<Report, LabellerError> {
    let map = load_cpu_map(opts.cpu_map.as_deref(), &mut warnings);
    let virttype = if accel == probe::Accel::Kvm && probed.kvm {
        "kvm"
    } else {
        "qemu"
    };
    let tsc = host::tsc_counter(&opts.host.dev.join("kvm"), &mut warnings);
    let cells = host::numa_cells(&opts.host, &mut warnings);
    let host_cpu = map.as_ref().map(host::host_cpu_data);
    let vendor = host_vendor_string();
    let inputs = render::Inputs {
        virttype,
        emulator: &opts.qemu,
        probe: probed,
        map: map.as_ref(),
        tsc,
        cells: &cells,
        sev_guests: host::sev_max_guests(),
        host_cpu,
        host_vendor: &vendor,
    };
    let files = render::render(&inputs, &mut warnings);
    let mut written = Vec::new();
    std::fs::create_dir_all(&opts.out_dir).map_err(|source| LabellerError::Write {
        path: opts.out_dir.clone(),
        source,
    })?;
    for (name, text) in [
        (DOMCAPABILITIES, files.domcapabilities.as_str()),
        (SUPPORTED_FEATURES, files.supported_features.as_str()),
        (CAPABILITIES, files.capabilities.as_str()),
        (CROSS_ARCH, ""),
    ] {
        let path = opts.out_dir.join(name);
        write_atomic(&path, text.as_bytes()).map_err(|source| LabellerError::Write {
            path: path.clone(),
            source,
        })?;
        written.push(path);
    }
    Ok(Report {
        virttype: virttype.to_owned(),
        qemu_version: probed.version.clone(),
        files: written,
        warnings,
    })
}

/// The CPU map from `dir`, or the first of [`CPU_MAP_DIRS`] that has an `index.xml`; `None`
/// (warning) when there is none or it does not load.
pub fn load_cpu_map(dir: Option<&Path>, warnings: &mut Vec<String>) -> Option<cpu_map::CpuMap> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => match CPU_MAP_DIRS
            .iter()
            .map(PathBuf::from)
            .find(|d| d.join("index.xml").exists())
        {
            Some(d) => d,
            None => {
                warnings.push(format!(
                    "no CPU map in {}: no CPU models, features or host-model decoding",
                    CPU_MAP_DIRS.join(" or ")
                ));
                return None;
            }
        },
    };
    match cpu_map::CpuMap::load(&dir) {
        Ok(m) => Some(m),
        Err(e) => {
            warnings.push(format!(
                "CPU map {} not loaded ({e}): no CPU models, features or host-model decoding",
                dir.display()
            ));
            None
        }
    }
}

/// The host's CPUID vendor string (`AuthenticAMD`), empty off x86.
fn host_vendor_string() -> String {
    let r = host::cpuid(0, 0);
    let mut b = Vec::with_capacity(12);
    for w in [r[1], r[3], r[2]] {
        b.extend_from_slice(&w.to_le_bytes());
    }
    String::from_utf8_lossy(&b)
        .trim_end_matches('\0')
        .to_owned()
}

/// Writes `data` to `.NAME.tmp.PID` beside `path` (mode 0644) and renames it over `path`:
/// readers see the old file or the new one, never part of one. Nothing is fsynced: virt-handler
/// reads the files once, after the init container ended, and every virt-handler start writes them
/// again; on a busy node an fsync costs seconds of that start (measured: 7 s of 12 s under this
/// machine's build load), as libvirt's `virsh ... > file` never pays.
pub fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)?;
        f.write_all(data)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("capabilities.xml");
        write_atomic(&p, b"old").unwrap();
        write_atomic(&p, b"new").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(write_atomic(&dir.path().join("no/such/dir/x"), b"x").is_err());
    }
}
