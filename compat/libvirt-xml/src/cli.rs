//! The command-line side of the compatibility tools, shared by the `qlauncher-compat` binary and
//! the `qlauncher convert --format libvirt-xml`, `qlauncher compare` and `qlauncher golden`
//! subcommands.
//!
//! Pod facts are placeholders (as `qlauncher convert`), adjusted by `FILE.facts.json` beside a
//! `FILE.yaml` when present (the converter fixtures' format). Each command prints its result on
//! standard output and returns the process exit code: 0 when everything matched, 1 on a difference
//! that is not allowlisted; errors (unreadable file, invalid VMI, libvirt missing) are `Err`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use qlauncher_core::cmdline::context::QemuVersion;
use qlauncher_core::cmdline::{convert, render, ConverterContext, DomainPlan, FactsFile};
use qlauncher_core::vmi::Vmi;

use crate::context::{apply_webhook_defaults, context};
use crate::libvirt::EmbedRoot;
use crate::{argv, export, golden, harness, libvirt, to_xml};

/// Output formats of `convert`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// KubeVirt's libvirt domain XML.
    LibvirtXml,
    /// qlauncher's QEMU argv, one word per line.
    Argv,
}

/// What every subcommand reads: the VMI file and the QEMU it plans for.
#[derive(Debug, clap::Args)]
pub struct Common {
    /// VMI manifest (YAML or JSON).
    pub file: PathBuf,
    /// QEMU version to plan for (default: `convert` the facts file's, else 10.1; `compare` the
    /// installed QEMU's, which libvirt probes).
    #[arg(long, value_name = "X.Y")]
    pub qemu_version: Option<String>,
    /// Plan for TCG (as `--allow-emulation` without KVM).
    #[arg(long)]
    pub tcg: bool,
}

/// Reads the VMI file, applies KubeVirt's webhook defaults (validation problems are warnings on
/// standard error, as KubeVirt's converter tests convert such VMIs anyway), builds the converter
/// context from `FILE.facts.json` when present and converts. `installed`: plan for the QEMU that
/// libvirt would probe here when no `--qemu-version` is given.
///
/// Errors: unreadable file, unreadable VMI or facts, bad QEMU version, conversion failure.
pub fn load(c: &Common, installed: bool) -> anyhow::Result<(Vmi, ConverterContext, DomainPlan)> {
    let text = std::fs::read_to_string(&c.file)
        .with_context(|| format!("cannot read {}", c.file.display()))?;
    let mut vmi = Vmi::from_json_or_yaml(&text).context("cannot read the VMI")?;
    if let Some(uid) = vmi.assign_stand_in_uid() {
        // The API server assigns UIDs; a manifest from disk has none.
        eprintln!("note: the manifest has no metadata.uid; using {uid}");
    }
    let stem = c
        .file
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    apply_webhook_defaults(&mut vmi, &stem);
    if let Err(errors) = vmi.validate() {
        // virt-api would reject it; converted anyway, as KubeVirt's converter tests do.
        eprintln!("warning: virt-api would reject this VMI:");
        for e in errors {
            eprintln!("  {e}");
        }
    }
    let facts_path = facts_path(&c.file);
    let mut facts = match facts_path.as_deref().filter(|p| p.exists()) {
        Some(p) => FactsFile::from_json(&std::fs::read_to_string(p)?)
            .with_context(|| format!("cannot read {}", p.display()))?,
        None => FactsFile::default(),
    };
    if c.tcg {
        facts.tcg = true;
    }
    let qemu = match &c.qemu_version {
        Some(v) => Some(QemuVersion::parse(v).with_context(|| format!("bad QEMU version {v:?}"))?),
        // Compare against the QEMU libvirt probes here.
        None if installed => libvirt::installed_qemu(),
        None => None,
    };
    let ctx = context(&vmi, &facts, qemu);
    let plan = convert(&vmi, &ctx).context("cannot convert the VMI")?;
    Ok((vmi, ctx, plan))
}

fn facts_path(file: &Path) -> Option<PathBuf> {
    let stem = file.file_stem()?.to_string_lossy().to_string();
    Some(file.with_file_name(format!("{stem}.facts.json")))
}

/// `convert`: prints the libvirt domain XML KubeVirt v1.9 would hand libvirt for the VMI
/// (`Format::Argv`: qlauncher's own argv, one word per line); with `validate`, also checks the XML
/// with libvirt's `virt-xml-validate` and reports on standard error.
pub fn convert_cmd(common: &Common, format: Format, validate: bool) -> anyhow::Result<ExitCode> {
    let (vmi, ctx, plan) = load(common, false)?;
    match format {
        Format::LibvirtXml => {
            let xml = to_xml(&export(&vmi, &ctx, &plan)?)?;
            print!("{xml}");
            if validate {
                libvirt::validate(&libvirt::for_libvirt9(&xml))?;
                eprintln!("virt-xml-validate: valid");
            }
        }
        Format::Argv => {
            for w in render::argv(&plan) {
                println!("{w}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `compare`: exports the XML, asks libvirt (`virsh domxml-to-native`, embedded driver rooted at
/// `libvirt_root`, default [`EmbedRoot::default_dir`]) for its argv, prints the side-by-side table,
/// and returns 1 when a difference is not allowlisted ([`harness`]).
pub fn compare_cmd(common: &Common, libvirt_root: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let (vmi, ctx, plan) = load(common, true)?;
    let xml = to_xml(&export(&vmi, &ctx, &plan)?)?;
    let root = EmbedRoot::keep(&libvirt_root.unwrap_or_else(EmbedRoot::default_dir))?;
    let theirs = root.domxml_to_native(&libvirt::for_libvirt9(&xml))?;
    let root_s = root.dir().to_string_lossy().to_string();
    let ours = argv::records(&render::argv(&plan), None)?;
    let theirs = argv::records(&theirs, Some(&root_s))?;
    let report = harness::compare(&ours, &theirs);
    print!("{}", report.table());
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `golden`: compares the exported XML with an expected domain XML (e.g. KubeVirt's converter
/// test data) element by element; returns 1 on a difference not in the golden allowlist.
pub fn golden_cmd(common: &Common, expected: &Path) -> anyhow::Result<ExitCode> {
    let (vmi, ctx, plan) = load(common, false)?;
    let ours = golden::parse(&to_xml(&export(&vmi, &ctx, &plan)?)?, "export")?;
    let text = std::fs::read_to_string(expected)
        .with_context(|| format!("cannot read {}", expected.display()))?;
    let theirs = golden::parse(&text, "expected")?;
    let diffs = golden::diff(&ours, &theirs);
    print!("{}", golden::table(&diffs));
    Ok(if golden::unexpected(&diffs).is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
