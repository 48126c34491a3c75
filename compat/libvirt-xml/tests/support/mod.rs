//! Shared helpers for the compat tests: the converter's fixture VMIs (read from the main crate's
//! `tests/fixtures/cmdline/`), this crate's fixtures, and the one-time setup of libvirt's tools.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;

use qlauncher_core::cmdline::FactsFile;
use qlauncher_core::cmdline::{convert, ConverterContext, DomainPlan};
use qlauncher_core::vmi::Vmi;
use qlauncher_libvirt_xml::context::{apply_webhook_defaults, context};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// This crate's fixtures.
pub fn own_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// One converted fixture.
pub struct Converted {
    pub name: String,
    pub vmi: Vmi,
    pub ctx: ConverterContext,
    pub plan: DomainPlan,
}

/// Loads `NAME.yaml` (+ `NAME.facts.json`) and converts it for `qemu` (None: the facts' version).
pub fn load(
    yaml: &Path,
    qemu: Option<qlauncher_core::cmdline::context::QemuVersion>,
) -> Option<Converted> {
    let name = yaml.file_stem()?.to_string_lossy().to_string();
    let text = std::fs::read_to_string(yaml).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut vmi = Vmi::from_json_or_yaml(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    apply_webhook_defaults(&mut vmi, &name);
    let fp = yaml.with_file_name(format!("{name}.facts.json"));
    let facts = if fp.exists() {
        FactsFile::from_json(&std::fs::read_to_string(&fp).unwrap())
            .unwrap_or_else(|e| panic!("{name} facts: {e}"))
    } else {
        FactsFile::default()
    };
    if facts.rejected || needs_unexported_hardware(&vmi) {
        return None;
    }
    let ctx = context(&vmi, &facts, qemu);
    let plan = convert(&vmi, &ctx).unwrap_or_else(|e| panic!("{name}: {e}"));
    // Hardware the pod lacks: the launcher refuses the VMI before any domain exists.
    if !plan.missing_hardware().is_empty() {
        return None;
    }
    Some(Converted {
        name,
        vmi,
        ctx,
        plan,
    })
}

/// TDX (the exporter does not write it) and SEV-SNP (this machine's libvirt 9.0 has no
/// schema for it and its QEMU 7.2 no `sev-snp-guest`).
fn needs_unexported_hardware(vmi: &Vmi) -> bool {
    vmi.spec
        .domain
        .launch_security
        .as_ref()
        .is_some_and(|l| l.tdx.is_some() || l.snp.is_some())
}

/// The exported XML with the VFIO backend named on each PCI `<hostdev>` (`<driver
/// name="vfio"/>`), for `domxml-to-native` on this machine: libvirt probes `/dev/vfio` for the
/// backend, which a host without VFIO lacks ("invalid PCI passthrough type 'default'"); a node
/// with VFIO picks it itself, as for KubeVirt's domain, which names none.
pub fn with_vfio_backend(xml: &str) -> String {
    const PCI_HOSTDEV: &str = "<hostdev type=\"pci\" managed=\"no\" mode=\"subsystem\">";
    xml.replace(
        PCI_HOSTDEV,
        &format!("{PCI_HOSTDEV}<driver name=\"vfio\"/>"),
    )
}

/// Every converter fixture that converts and that the exporter writes (the `reject-*` ones, those
/// whose host hardware the pod lacks, and the SNP/TDX ones are skipped), sorted by name.
pub fn converter_fixtures(
    qemu: Option<qlauncher_core::cmdline::context::QemuVersion>,
) -> Vec<Converted> {
    let dir = repo_root().join("tests/fixtures/cmdline");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("converter fixture dir")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    paths.sort();
    paths.iter().filter_map(|p| load(p, qemu)).collect()
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

static SETUP: Once = Once::new();

/// Installs libvirt's tools through `scripts/install-deps` when one is missing (needs root then).
/// Nothing else: the embedded driver's `libvirt-qemu` user is provided by `EmbedRoot` itself,
/// so no test relies on another having prepared the machine.
pub fn ensure_libvirt_tools() {
    SETUP.call_once(|| {
        let driver =
            Path::new("/usr/lib/x86_64-linux-gnu/libvirt/connection-driver/libvirt_driver_qemu.so");
        if !(have("virsh") && have("virt-xml-validate") && have("xmllint") && driver.exists()) {
            let status = Command::new(repo_root().join("scripts/install-deps"))
                .status()
                .expect("run scripts/install-deps");
            assert!(status.success(), "scripts/install-deps failed");
        }
    });
}

/// A per-process scratch directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("qlauncher-compat-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
