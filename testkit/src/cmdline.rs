//! The converter's fixtures for the cmdline tests: fixture VMIs from `tests/fixtures/cmdline/`
//! with the pod facts each one is converted with (`NAME.facts.json` beside `NAME.yaml`, read as
//! [`FactsFile`]; `FactsFile::context` is the snapshot context), and the context for starting a
//! fixture under the real QEMU here.

use std::path::{Path, PathBuf};

use qlauncher::cmdline::context::{
    ConverterContext, IfaceFacts, MonitorSocket, QemuVersion, TapSource,
};
use qlauncher::cmdline::plan::{Backend, DomainPlan};
use qlauncher::cmdline::qemu::{Blockdev, FormatDriver, SocketAddr};
use qlauncher::cmdline::FactsFile;
use qlauncher::vmi::{DefaultsConfig, Vmi};

/// `tests/fixtures/cmdline` of the repository.
pub fn fixture_dir() -> PathBuf {
    crate::repo_root().join("tests/fixtures/cmdline")
}

/// Every fixture: (name, defaulted VMI, facts), sorted by name.
pub fn fixtures() -> Vec<(String, Vmi, FactsFile)> {
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
        // The converter sees what virt-api's webhook made of the manifest.
        vmi.apply_defaults(&DefaultsConfig::for_manifest(&vmi, &name));
        let fp = p.with_extension("facts.json");
        let facts = if fp.exists() {
            FactsFile::from_json(&std::fs::read_to_string(&fp).unwrap())
                .unwrap_or_else(|e| panic!("{name} facts: {e}"))
        } else {
            FactsFile::default()
        };
        out.push((name, vmi, facts));
    }
    out
}

/// The context for starting a fixture under the real QEMU here: TCG, QEMU 7.2, every path under
/// `root`, QMP on `root/qmp.sock`, taps opened by QEMU by name (`tap_prefix` + index); the
/// facts' volumes, MACs and MTUs, no host hardware.
pub fn acceptance_context(
    vmi: &Vmi,
    facts: &FactsFile,
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
        volumes: facts.volume_facts(),
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
        let entry = facts.interface(&iface.name);
        ctx.interfaces.insert(
            iface.name.clone(),
            IfaceFacts {
                mac: entry.mac,
                mtu: entry.mtu.or(Some(1500)),
                tap: TapSource::Ifname(format!("{tap_prefix}{i}")),
            },
        );
    }
    ctx
}

/// Creates the pod directories under `root` that [`acceptance_context`]'s paths lie in.
pub fn create_pod_dirs(root: &Path) {
    for d in ["p", "e", "c", "h", "m", "ci", "dev", "nv"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
}

/// Puts the test guest's kernel and initrd (`guest`) where the plan's kernel boot reads them,
/// if it has one, and creates the VNC socket's directory, if it has one.
pub fn place_kernel_and_vnc(plan: &DomainPlan, guest: &crate::guest::GuestImages) {
    if let Some(k) = &plan.kernel_boot {
        for (want, have) in [(&k.kernel, &guest.vmlinuz), (&k.initrd, &guest.initrd)] {
            let want = want.as_ref().unwrap();
            std::fs::create_dir_all(Path::new(want).parent().unwrap()).unwrap();
            std::fs::copy(have, want).unwrap();
        }
    }
    if let Some(v) = &plan.vnc {
        std::fs::create_dir_all(Path::new(v).parent().unwrap()).unwrap();
    }
}

/// Creates the directory of each chardev's unix socket in the plan; returns the devices' block
/// nodes, in plan order.
pub fn chardev_dirs_and_blockdevs(plan: &DomainPlan) -> Vec<&Blockdev> {
    let mut blockdevs = Vec::new();
    for d in &plan.devices {
        match &d.backend {
            Backend::Blockdevs(b) => blockdevs.extend(b.iter()),
            Backend::Chardev(c) => {
                if let SocketAddr::Path(p) = &c.addr {
                    std::fs::create_dir_all(Path::new(p).parent().unwrap()).unwrap();
                }
            }
            _ => {}
        }
    }
    blockdevs
}

/// The image files of `blockdevs` that do not exist yet, each with the format of the node over
/// it (`None` when no format node reads it); creates each file's directory.
pub fn missing_images<'a>(blockdevs: &[&'a Blockdev]) -> Vec<(&'a Path, Option<FormatDriver>)> {
    let mut out = Vec::new();
    for b in blockdevs {
        if let Blockdev::Protocol(p) = b {
            let fmt = blockdevs.iter().find_map(|f| match f {
                Blockdev::Format(f) if f.file == p.node_name => Some(f.driver),
                _ => None,
            });
            let path = Path::new(&p.filename);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            if !path.exists() {
                out.push((path, fmt));
            }
        }
    }
    out
}
