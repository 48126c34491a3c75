//! Shared helpers for the cmdline tests: fixture VMIs from `tests/fixtures/cmdline/` and the
//! pod facts each one is converted with (`NAME.facts.json` beside `NAME.yaml`).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use qlauncher::cmdline::context::{
    Backing, ConverterContext, HostDeviceSource, IfaceFacts, ImageFormat, MonitorSocket,
    QemuVersion, SevCapabilities, TapSource, VolumeFacts,
};
use qlauncher::vmi::{DefaultsConfig, Vmi};
use serde::Deserialize;

/// Per-volume facts as written in a facts file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VolFacts {
    pub block: bool,
    pub qcow2: bool,
    pub direct_io: bool,
    pub preallocated: bool,
}

/// Per-interface facts as written in a facts file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NicFacts {
    pub mac: Option<String>,
    pub mtu: Option<u32>,
    pub queues: Option<usize>,
    pub vhost: bool,
}

/// The host's SEV parameters in a facts file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SevFacts {
    pub cbitpos: u32,
    pub reduced_phys_bits: u32,
    pub snp: bool,
}

/// `NAME.facts.json`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Facts {
    /// Render for this QEMU version (default 10.1).
    pub qemu: Option<String>,
    /// KVM unusable and emulation allowed.
    pub tcg: bool,
    /// KVM unusable and emulation not allowed.
    pub no_kvm: bool,
    pub volumes: BTreeMap<String, VolFacts>,
    pub interfaces: BTreeMap<String, NicFacts>,
    pub vsock_fd: Option<i32>,
    pub now_unix: i64,
    /// Host PCI function per host device id (`ua-gpu-<name>`, ...).
    pub host_pci: BTreeMap<String, String>,
    /// Mediated device UUID per host device id.
    pub host_mdev: BTreeMap<String, String>,
    /// The host offers SEV with these parameters.
    pub sev: Option<SevFacts>,
    /// The host offers TDX.
    pub tdx: bool,
    /// virtiofs filesystems whose virtiofsd socket exists.
    pub virtiofs_ready: Vec<String>,
    /// Why the QEMU acceptance test cannot start this fixture here (missing hardware), if so.
    pub no_acceptance: Option<String>,
    /// The conversion is expected to fail.
    pub rejected: bool,
}

pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cmdline")
}

/// Every fixture: (name, defaulted VMI, facts), sorted by name.
pub fn fixtures() -> Vec<(String, Vmi, Facts)> {
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(fixture_dir())
        .expect("fixture dir")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    entries.sort();
    for p in entries {
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&p).unwrap();
        let mut vmi = Vmi::from_json_or_yaml(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        // The converter sees what virt-api's webhook made of the manifest. A VMI without a
        // firmware UUID gets the name-derived one (as a VM's would) to keep snapshots stable.
        let mut cfg = DefaultsConfig::for_vmi(&vmi);
        if cfg.vm_name.is_none() {
            cfg.vm_name = Some(name.clone());
        }
        vmi.apply_defaults(&cfg);
        let fp = p.with_extension("facts.json");
        let facts = if fp.exists() {
            serde_json::from_str(&std::fs::read_to_string(&fp).unwrap())
                .unwrap_or_else(|e| panic!("{name} facts: {e}"))
        } else {
            Facts::default()
        };
        out.push((name, vmi, facts));
    }
    out
}

/// The number of tap queues an interface gets.
fn queues(vmi: &Vmi, facts: &Facts, name: &str) -> usize {
    facts
        .interfaces
        .get(name)
        .and_then(|n| n.queues)
        .unwrap_or(1)
        .max(
            if vmi.spec.domain.devices.network_interface_multi_queue == Some(true) {
                let iface = vmi
                    .spec
                    .domain
                    .devices
                    .interfaces
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .find(|i| i.name == name);
                let virtio =
                    iface.is_some_and(|i| matches!(i.model.as_deref(), None | Some("virtio")));
                if virtio {
                    qlauncher::cmdline::devices::vcpus(vmi).unwrap_or(1) as usize
                } else {
                    1
                }
            } else {
                1
            },
        )
}

/// The context a fixture is converted with for snapshots: the launch path (QMP on inherited fd
/// 3, taps on fds 10, 11, ..., vhost fds 40, 41, ...).
pub fn snapshot_context(vmi: &Vmi, facts: &Facts) -> ConverterContext {
    let mut ctx = ConverterContext {
        monitor: MonitorSocket::Fd(3),
        now_unix: facts.now_unix,
        vsock_fd: facts.vsock_fd,
        ..Default::default()
    };
    if let Some(v) = &facts.qemu {
        ctx.qemu = QemuVersion::parse(v).unwrap();
    }
    if facts.tcg {
        ctx.kvm = false;
        ctx.allow_emulation = true;
    }
    if facts.no_kvm {
        ctx.kvm = false;
    }
    fill_volumes(&mut ctx, facts);
    fill_hardware(&mut ctx, facts);
    let mut fd = 10;
    let mut vfd = 40;
    for iface in vmi
        .spec
        .domain
        .devices
        .interfaces
        .as_deref()
        .unwrap_or_default()
    {
        let nf = facts
            .interfaces
            .get(&iface.name)
            .cloned()
            .unwrap_or_default();
        let n = queues(vmi, facts, &iface.name);
        let fds: Vec<i32> = (fd..fd + n as i32).collect();
        fd += n as i32;
        let vhostfds: Vec<i32> = if nf.vhost {
            let v = (vfd..vfd + n as i32).collect();
            vfd += n as i32;
            v
        } else {
            vec![]
        };
        ctx.interfaces.insert(
            iface.name.clone(),
            IfaceFacts {
                mac: nf.mac.clone(),
                mtu: nf.mtu.or(Some(1500)),
                tap: TapSource::Fds { fds, vhostfds },
            },
        );
    }
    ctx
}

/// The hardware facts (host devices, SEV, TDX, virtiofsd sockets).
pub fn fill_hardware(ctx: &mut ConverterContext, facts: &Facts) {
    for (id, a) in &facts.host_pci {
        ctx.host_devices
            .insert(id.clone(), HostDeviceSource::Pci(a.clone()));
    }
    for (id, u) in &facts.host_mdev {
        ctx.host_devices
            .insert(id.clone(), HostDeviceSource::Mdev(u.clone()));
    }
    ctx.sev = facts.sev.as_ref().map(|s| SevCapabilities {
        cbitpos: s.cbitpos,
        reduced_phys_bits: s.reduced_phys_bits,
        snp: s.snp,
    });
    ctx.tdx = facts.tdx;
    ctx.virtiofs_ready = facts.virtiofs_ready.iter().cloned().collect();
}

fn fill_volumes(ctx: &mut ConverterContext, facts: &Facts) {
    for (name, f) in &facts.volumes {
        ctx.volumes.insert(
            name.clone(),
            VolumeFacts {
                backing: if f.block {
                    Backing::Block
                } else {
                    Backing::File
                },
                format: if f.qcow2 {
                    ImageFormat::Qcow2
                } else {
                    ImageFormat::Raw
                },
                virtual_size: None,
                direct_io: f.direct_io,
                preallocated: f.preallocated,
            },
        );
    }
}

/// The context for starting a fixture under the real QEMU here: TCG, QEMU 7.2, every path under
/// `root`, QMP on `root/qmp.sock`, taps opened by QEMU by name (`tap_prefix` + index).
pub fn acceptance_context(
    vmi: &Vmi,
    facts: &Facts,
    root: &Path,
    tap_prefix: &str,
) -> ConverterContext {
    let r = |s: &str| root.join(s).to_string_lossy().to_string();
    let mut ctx = ConverterContext {
        qemu: QemuVersion { major: 7, minor: 2 },
        kvm: false,
        allow_emulation: true,
        monitor: MonitorSocket::Path(r("qmp.sock")),
        now_unix: facts.now_unix,
        ..Default::default()
    };
    ctx.paths.private_dir = r("p");
    ctx.paths.ephemeral_disks = r("e");
    ctx.paths.container_disks = r("c");
    ctx.paths.hotplug_disks = r("h");
    ctx.paths.empty_disks = r("m");
    ctx.paths.cloud_init = r("ci");
    ctx.paths.dev = r("dev");
    ctx.paths.nvram = r("nv");
    ctx.efi.code = "/usr/share/OVMF/OVMF_CODE.fd".into();
    ctx.efi.vars = "/usr/share/OVMF/OVMF_VARS.fd".into();
    ctx.efi.secure_code = "/usr/share/OVMF/OVMF_CODE.secboot.fd".into();
    ctx.efi.secure_vars = "/usr/share/OVMF/OVMF_VARS.ms.fd".into();
    fill_volumes(&mut ctx, facts);
    for (i, iface) in vmi
        .spec
        .domain
        .devices
        .interfaces
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let nf = facts
            .interfaces
            .get(&iface.name)
            .cloned()
            .unwrap_or_default();
        ctx.interfaces.insert(
            iface.name.clone(),
            IfaceFacts {
                mac: nf.mac.clone(),
                mtu: nf.mtu.or(Some(1500)),
                tap: TapSource::Ifname(format!("{tap_prefix}{i}")),
            },
        );
    }
    ctx
}
