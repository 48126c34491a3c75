//! `ConverterContext`: every fact about the pod the converter needs, gathered beforehand by the
//! effect modules (`storage`, `net`, `sync`), as plain data. Mirrors KubeVirt's
//! `converter/types/converter-context.go`, minus its effectful members (no O_DIRECT checker, no
//! disk creator): probes run first, then the pure conversion.

use std::collections::{BTreeMap, BTreeSet};

use crate::vmi::Vmi;

/// Guest architecture (`spec.architecture`). Only amd64 is converted today; the others are
/// rejected with a field path, never silently treated as amd64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Arch {
    /// x86_64 (`amd64`).
    #[default]
    Amd64,
    /// aarch64 (`arm64`).
    Arm64,
    /// s390x.
    S390x,
}

/// The QEMU binary's version (from `qemu-system-x86_64 --version` or QMP `query-version`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct QemuVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl Default for QemuVersion {
    /// QEMU 10.1, the version KubeVirt v1.9.0 ships.
    fn default() -> Self {
        QemuVersion {
            major: 10,
            minor: 1,
        }
    }
}

impl QemuVersion {
    /// Parses `X.Y` or `X.Y.Z`.
    pub fn parse(s: &str) -> Option<Self> {
        let mut it = s.trim().split('.');
        let major = it.next()?.parse().ok()?;
        let minor = it.next()?.parse().ok()?;
        Some(QemuVersion { major, minor })
    }

    /// True when this version is at least `major.minor`.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

/// Whether an image lives in a regular file or on a block device (libvirt `type='file'` vs
/// `type='block'`, QEMU's `file` vs `host_device` protocol driver). `storage` probes it and
/// re-exports this type.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum StorageKind {
    /// A regular file.
    #[default]
    File,
    /// A block device node.
    Block,
}

/// Image format, as QEMU's `format` driver names it; `storage` probes it natively (the
/// `qemu-img info` equivalent) and re-exports this type.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    /// Raw bytes; the virtual size is the length.
    #[default]
    Raw,
    /// qcow2 (version 2 or 3).
    Qcow2,
}

impl ImageFormat {
    /// QEMU's driver name: `"raw"` or `"qcow2"` (what `-F` / `backing-fmt` take).
    pub fn as_str(self) -> &'static str {
        match self {
            ImageFormat::Raw => "raw",
            ImageFormat::Qcow2 => "qcow2",
        }
    }
}

/// Facts about one volume, keyed by volume name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeFacts {
    /// File or block device (PVCs: block mode or filesystem mode).
    pub kind: StorageKind,
    /// Format of the base image (containerDisk image, ephemeral PVC).
    pub format: ImageFormat,
    /// Virtual size in bytes, when known.
    pub virtual_size: Option<u64>,
    /// O_DIRECT works on the backend (KubeVirt's cache default: `none` if so, else `writethrough`).
    pub direct_io: bool,
    /// The image is fully allocated on the host (KubeVirt's `IsPreAllocated`: with cache `none`, io
    /// defaults to `native`). Discard does not read it: it follows
    /// `status.volumeStatus[].persistentVolumeClaimInfo.preallocated`, as KubeVirt's
    /// `VolumesDiscardIgnore` does.
    pub preallocated: bool,
    /// A hot-plugged volume's CBT overlay (`<private>/libvirt/qemu/cbt/<volume>.qcow2`) was
    /// created for it when it was mounted (KubeVirt `ApplyChangedBlockTracking` with a
    /// `MountedToPod` hotplug volume): the disk runs through it. Boot volumes follow the VMI's
    /// CBT state alone.
    pub cbt_overlay: bool,
}

/// How QEMU gets a tap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TapSource {
    /// Inherited fds (one per queue) and optional vhost fds; the launch path.
    Fds {
        /// Tap fd numbers in the QEMU process.
        fds: Vec<i32>,
        /// vhost-net fd numbers (empty: no vhost).
        vhostfds: Vec<i32>,
    },
    /// QEMU opens the existing tap by name (`ifname=`, `script=no`).
    Ifname(String),
}

impl Default for TapSource {
    fn default() -> Self {
        TapSource::Fds {
            fds: vec![],
            vhostfds: vec![],
        }
    }
}

/// Facts about one interface, keyed by interface name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IfaceFacts {
    /// MAC chosen by the network setup when the VMI gives none.
    pub mac: Option<String>,
    /// Pod link MTU (becomes virtio-net `host_mtu`).
    pub mtu: Option<u32>,
    /// How QEMU reaches the tap.
    pub tap: TapSource,
}

/// Where the QMP monitor listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MonitorSocket {
    /// An inherited listening unix socket (the launch path).
    Fd(i32),
    /// A socket path QEMU binds itself.
    Path(String),
}

impl Default for MonitorSocket {
    fn default() -> Self {
        MonitorSocket::Path("/var/run/kubevirt-private/qlauncher/monitor.sock".into())
    }
}

/// Path roots; every KubeVirt path is built under one of these, so tests can move them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRoots {
    /// `/var/run/kubevirt-private` (serial, VNC, vmi-disks, config-map-disks, ...).
    pub private_dir: String,
    /// `/var/run/kubevirt-ephemeral-disks` (containerDisk overlays, cloud-init data).
    pub ephemeral_disks: String,
    /// `/var/run/kubevirt/container-disks` (containerDisk images, kernel-boot).
    pub container_disks: String,
    /// `/var/run/kubevirt/hotplug-disks`.
    pub hotplug_disks: String,
    /// `/var/run/libvirt/empty-disks` (KubeVirt keeps libvirt's path for emptyDisk).
    pub empty_disks: String,
    /// `/var/run/kubevirt-ephemeral-disks/cloud-init-data`.
    pub cloud_init: String,
    /// `/dev` (block PVCs appear as `/dev/<vol>`).
    pub dev: String,
    /// Directory of the per-VM NVRAM copies (non-root: `/var/run/kubevirt-private/libvirt/qemu/nvram`).
    pub nvram: String,
    /// `/var/run/kubevirt/virtiofs-containers`, where the virtiofsd containers put their sockets.
    pub virtiofs: String,
}

impl Default for PathRoots {
    fn default() -> Self {
        PathRoots {
            private_dir: "/var/run/kubevirt-private".into(),
            ephemeral_disks: "/var/run/kubevirt-ephemeral-disks".into(),
            container_disks: "/var/run/kubevirt/container-disks".into(),
            hotplug_disks: "/var/run/kubevirt/hotplug-disks".into(),
            empty_disks: "/var/run/libvirt/empty-disks".into(),
            cloud_init: "/var/run/kubevirt-ephemeral-disks/cloud-init-data".into(),
            dev: "/dev".into(),
            nvram: "/var/run/kubevirt-private/libvirt/qemu/nvram".into(),
            virtiofs: "/var/run/kubevirt/virtiofs-containers".into(),
        }
    }
}

/// OVMF firmware files found on the host (`efi.go DetectEFIEnvironment`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EfiFiles {
    /// Code image without secure boot.
    pub code: String,
    /// Vars template without secure boot.
    pub vars: String,
    /// Secure-boot code image.
    pub secure_code: String,
    /// Secure-boot vars template.
    pub secure_vars: String,
    /// SEV/SEV-ES code image (`OVMF_CODE.cc.fd`; vars from the plain template).
    pub sev_code: String,
    /// SEV-SNP firmware, loaded as a ROM (`OVMF.amdsev.fd`).
    pub snp_rom: String,
    /// TDX firmware, loaded as a ROM (`OVMF.inteltdx.fd`).
    pub tdx_rom: String,
    /// TDX firmware with secure boot (`OVMF.inteltdx.secboot.fd`).
    pub tdx_secure_rom: String,
}

impl Default for EfiFiles {
    /// KubeVirt's default `--ovmf-path` (`/usr/share/OVMF`) file names.
    fn default() -> Self {
        EfiFiles {
            code: "/usr/share/OVMF/OVMF_CODE.fd".into(),
            vars: "/usr/share/OVMF/OVMF_VARS.fd".into(),
            secure_code: "/usr/share/OVMF/OVMF_CODE.secboot.fd".into(),
            secure_vars: "/usr/share/OVMF/OVMF_VARS.secboot.fd".into(),
            sev_code: "/usr/share/OVMF/OVMF_CODE.cc.fd".into(),
            snp_rom: "/usr/share/OVMF/OVMF.amdsev.fd".into(),
            tdx_rom: "/usr/share/OVMF/OVMF.inteltdx.fd".into(),
            tdx_secure_rom: "/usr/share/OVMF/OVMF.inteltdx.secboot.fd".into(),
        }
    }
}

/// Cluster-wide settings virt-handler passes down (KubeVirt CR).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterFlags {
    /// `bochs-display` for EFI guests (default true since the feature went GA).
    pub bochs_for_efi: bool,
    /// Balloon statistics period in seconds (default 10; 0 = off).
    pub balloon_stats_period: u32,
    /// Free page reporting allowed (default true).
    pub free_page_reporting: bool,
    /// Serial console log enabled by default (default true).
    pub serial_console_log: bool,
    /// SMBIOS system manufacturer (default `KubeVirt`).
    pub smbios_manufacturer: String,
    /// SMBIOS system family (default `KubeVirt`).
    pub smbios_family: String,
    /// SMBIOS system product (default `None`).
    pub smbios_product: String,
    /// SMBIOS SKU (default empty).
    pub smbios_sku: String,
    /// SMBIOS version (default empty).
    pub smbios_version: String,
}

impl Default for ClusterFlags {
    fn default() -> Self {
        ClusterFlags {
            bochs_for_efi: true,
            balloon_stats_period: 10,
            free_page_reporting: true,
            serial_console_log: true,
            smbios_manufacturer: "KubeVirt".into(),
            smbios_family: "KubeVirt".into(),
            smbios_product: "None".into(),
            smbios_sku: String::new(),
            smbios_version: String::new(),
        }
    }
}

/// Where a passed-through host device is, as the pod reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostDeviceSource {
    /// A PCI function `DDDD:BB:SS.F` (a device plugin's `PCI_RESOURCE_<RESOURCE>` entry, or the
    /// SR-IOV VF the network setup allocated).
    Pci(String),
    /// A mediated device UUID (`MDEV_PCI_RESOURCE_<RESOURCE>`, vGPUs).
    Mdev(String),
}

/// The host's SEV parameters, as QMP `query-sev-capabilities` reports them (libvirt reads the
/// same into its domain capabilities and fills `cbitpos`/`reduced-phys-bits` from them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SevCapabilities {
    /// C-bit position (47 on Naples/Rome, 51 on Milan/Genoa).
    pub cbitpos: u32,
    /// Physical address bits lost to encryption.
    pub reduced_phys_bits: u32,
    /// The host also runs SEV-SNP guests.
    pub snp: bool,
}

/// The environment variable a device plugin sets for `resource` (`nvidia.com/GA102` ->
/// `PCI_RESOURCE_NVIDIA_COM_GA102`), KubeVirt's `util.ResourceNameToEnvVar`.
pub fn resource_env_var(prefix: &str, resource: &str) -> String {
    format!(
        "{prefix}_{}",
        resource.replace(['.', '/'], "_").to_ascii_uppercase()
    )
}

/// Which host device each VMI GPU, host device and SR-IOV interface gets, from the pod's
/// environment, as KubeVirt's address pools hand them out (`device/hostdevice/addresspool.go`):
/// per resource, the comma-separated `PCI_RESOURCE_<RESOURCE>` list (then
/// `MDEV_PCI_RESOURCE_<RESOURCE>` for mediated devices) is consumed in VMI order, an address
/// taken by one device is removed from every pool; SR-IOV interfaces find their resource in
/// `KUBEVIRT_RESOURCE_NAME_<interface>`. Keys are the QEMU device ids ([`host_device_id`]).
/// Devices with no address left are absent: conversion still plans them and
/// `DomainPlan::missing_hardware` reports them. DRA claims are not looked up here.
pub fn host_devices_from_env(
    vmi: &Vmi,
    env: &BTreeMap<String, String>,
) -> BTreeMap<String, HostDeviceSource> {
    let devs = &vmi.spec.domain.devices;
    let mut wanted: Vec<(String, String)> = Vec::new();
    for g in devs.gpus.as_deref().unwrap_or_default() {
        if let Some(r) = &g.device_name {
            wanted.push((host_device_id(HostDeviceKind::Gpu, &g.name), r.clone()));
        }
    }
    for h in devs.host_devices.as_deref().unwrap_or_default() {
        if let Some(r) = &h.device_name {
            wanted.push((host_device_id(HostDeviceKind::Generic, &h.name), r.clone()));
        }
    }
    for i in devs.interfaces.as_deref().unwrap_or_default() {
        if i.sriov.is_some() {
            if let Some(r) = env.get(&format!("KUBEVIRT_RESOURCE_NAME_{}", i.name)) {
                wanted.push((host_device_id(HostDeviceKind::Sriov, &i.name), r.clone()));
            }
        }
    }
    let pool = |prefix: &str| -> BTreeMap<String, Vec<String>> {
        wanted
            .iter()
            .filter_map(|(_, r)| {
                let list = env.get(&resource_env_var(prefix, r))?;
                let addrs = list
                    .split(',')
                    .map(str::trim)
                    .filter(|a| !a.is_empty())
                    .map(str::to_string)
                    .collect();
                Some((r.clone(), addrs))
            })
            .collect()
    };
    let mut out = BTreeMap::new();
    for (prefix, mdev) in [("PCI_RESOURCE", false), ("MDEV_PCI_RESOURCE", true)] {
        let mut pools = pool(prefix);
        for (id, r) in &wanted {
            if out.contains_key(id) {
                continue;
            }
            let Some(addr) = pools.get(r).and_then(|a| a.first()).cloned() else {
                continue;
            };
            for list in pools.values_mut() {
                list.retain(|a| *a != addr);
            }
            out.insert(
                id.clone(),
                if mdev {
                    HostDeviceSource::Mdev(addr)
                } else {
                    HostDeviceSource::Pci(addr)
                },
            );
        }
    }
    out
}

/// The three kinds of VFIO host devices a VMI asks for, with KubeVirt's alias prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostDeviceKind {
    /// `devices.gpus[]` (`gpu-`).
    Gpu,
    /// `devices.hostDevices[]` (`hostdevice-`).
    Generic,
    /// `interfaces[]` with `sriov` (`sriov-`).
    Sriov,
}

/// The QEMU id (libvirt alias) of a host device: `ua-gpu-<name>`, `ua-hostdevice-<name>`,
/// `ua-sriov-<interface>` (KubeVirt's `AliasPrefix` + name as a user alias).
pub fn host_device_id(kind: HostDeviceKind, name: &str) -> String {
    let prefix = match kind {
        HostDeviceKind::Gpu => "gpu-",
        HostDeviceKind::Generic => "hostdevice-",
        HostDeviceKind::Sriov => "sriov-",
    };
    format!("ua-{prefix}{name}")
}

/// Every fact the converter reads. Plain data: `Default` + `Clone`, so tests write
/// `ConverterContext { kvm: false, ..Default::default() }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConverterContext {
    /// Guest architecture.
    pub arch: Arch,
    /// QEMU version (chooses renderer details).
    pub qemu: QemuVersion,
    /// `/dev/kvm` is usable.
    pub kvm: bool,
    /// `--allow-emulation`: fall back to TCG when KVM is not usable.
    pub allow_emulation: bool,
    /// Facts per volume name.
    pub volumes: BTreeMap<String, VolumeFacts>,
    /// Facts per interface name.
    pub interfaces: BTreeMap<String, IfaceFacts>,
    /// QMP monitor socket.
    pub monitor: MonitorSocket,
    /// Path roots.
    pub paths: PathRoots,
    /// OVMF files.
    pub efi: EfiFiles,
    /// The runtime uid (107 = qemu, 0 = root); root keeps NVRAM under `/var/lib/libvirt/qemu/nvram`.
    pub runtime_uid: u32,
    /// Cluster settings.
    pub cluster: ClusterFlags,
    /// Unix time at start (seconds), for `clock.utc.offsetSeconds` (QEMU's `-rtc base=<date>`).
    pub now_unix: i64,
    /// vhost-vsock fd, when `status.VSOCKCID` is set.
    pub vsock_fd: Option<i32>,
    /// swtpm control socket path, when a TPM is requested.
    pub swtpm_socket: Option<String>,
    /// Host devices allocated to the pod, by QEMU device id ([`host_device_id`]); see
    /// [`host_devices_from_env`]. A GPU, host device or SR-IOV interface without an entry is
    /// planned without a host address and reported by `DomainPlan::missing_hardware`.
    pub host_devices: BTreeMap<String, HostDeviceSource>,
    /// SEV works on this host (`/dev/sev` and KVM's `sev` parameter), with its parameters.
    pub sev: Option<SevCapabilities>,
    /// TDX works on this host (KVM's `tdx` parameter).
    pub tdx: bool,
    /// virtiofs filesystems (by name) whose virtiofsd socket
    /// (`/var/run/kubevirt/virtiofs-containers/<name>.sock`) exists.
    pub virtiofs_ready: BTreeSet<String>,
}

impl Default for ConverterContext {
    fn default() -> Self {
        ConverterContext {
            arch: Arch::Amd64,
            qemu: QemuVersion::default(),
            kvm: true,
            allow_emulation: false,
            volumes: BTreeMap::new(),
            interfaces: BTreeMap::new(),
            monitor: MonitorSocket::default(),
            paths: PathRoots::default(),
            efi: EfiFiles::default(),
            runtime_uid: 107,
            cluster: ClusterFlags::default(),
            now_unix: 0,
            vsock_fd: None,
            swtpm_socket: None,
            host_devices: BTreeMap::new(),
            sev: None,
            tdx: false,
            virtiofs_ready: BTreeSet::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn host_devices_come_from_the_device_plugin_variables_in_vmi_order() {
        let vmi: Vmi = serde_json::from_value(json!({
            "metadata": {"name": "t"},
            "spec": {"domain": {"devices": {
                "gpus": [
                    {"name": "a", "deviceName": "nvidia.com/GA102"},
                    {"name": "b", "deviceName": "nvidia.com/GA102"},
                    {"name": "v", "deviceName": "nvidia.com/GRID"}
                ],
                "hostDevices": [{"name": "h", "deviceName": "vendor.com/other"}],
                "interfaces": [{"name": "vf", "sriov": {}}]
            }}}
        }))
        .unwrap();
        let env: BTreeMap<String, String> = [
            (
                "PCI_RESOURCE_NVIDIA_COM_GA102",
                "0000:65:00.0,0000:66:00.0,",
            ),
            (
                "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID",
                "4b20d080-1b54-4048-85b3-a6a62d165c01",
            ),
            ("KUBEVIRT_RESOURCE_NAME_vf", "intel.com/sriov"),
            ("PCI_RESOURCE_INTEL_COM_SRIOV", "0000:3b:02.3"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let pci = |a: &str| HostDeviceSource::Pci(a.into());
        assert_eq!(
            host_devices_from_env(&vmi, &env),
            BTreeMap::from([
                ("ua-gpu-a".to_string(), pci("0000:65:00.0")),
                ("ua-gpu-b".to_string(), pci("0000:66:00.0")),
                (
                    "ua-gpu-v".to_string(),
                    HostDeviceSource::Mdev("4b20d080-1b54-4048-85b3-a6a62d165c01".into())
                ),
                ("ua-sriov-vf".to_string(), pci("0000:3b:02.3")),
            ])
        );
        assert_eq!(
            resource_env_var("PCI_RESOURCE", "nvidia.com/GA102GL_A10"),
            "PCI_RESOURCE_NVIDIA_COM_GA102GL_A10"
        );
    }
}
