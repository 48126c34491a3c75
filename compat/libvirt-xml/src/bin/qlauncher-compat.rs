//! `qlauncher-compat`: libvirt compatibility tools for qlauncher.
//!
//! * `convert FILE --format libvirt-xml`: prints the libvirt domain XML KubeVirt v1.9 would
//!   hand libvirt for the VMI (`--format argv` prints qlauncher's own argv for comparison).
//! * `compare FILE`: exports the XML, asks libvirt (`virsh domxml-to-native`) for its argv,
//!   prints the side-by-side table and exits 1 when a difference is not allowlisted.
//!
//! Pod facts are placeholders (as `qlauncher convert`), adjusted by `FILE.facts.json` beside a
//! `FILE.yaml` when present (the converter fixtures' format).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use qlauncher::cmdline::context::QemuVersion;
use qlauncher::cmdline::{convert, render, ConverterContext, DomainPlan};
use qlauncher::vmi::Vmi;
use qlauncher_libvirt_xml::context::{context, Facts};
use qlauncher_libvirt_xml::libvirt::EmbedRoot;
use qlauncher_libvirt_xml::{argv, export, golden, harness, libvirt, to_xml};

/// Output formats of `convert`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    /// KubeVirt's libvirt domain XML.
    LibvirtXml,
    /// qlauncher's QEMU argv, one word per line.
    Argv,
}

#[derive(Debug, clap::Args)]
struct Common {
    /// VMI manifest (YAML or JSON).
    file: PathBuf,
    /// QEMU version to plan for (default: `convert` the facts file's, else 10.1; `compare` the
    /// installed QEMU's, which libvirt probes).
    #[arg(long, value_name = "X.Y")]
    qemu_version: Option<String>,
    /// Plan for TCG (as `--allow-emulation` without KVM).
    #[arg(long)]
    tcg: bool,
}

/// libvirt compatibility tools for qlauncher.
#[derive(Parser)]
#[command(version, about)]
enum Cli {
    /// Print the libvirt domain XML (or qlauncher's argv) for a VMI.
    Convert {
        #[command(flatten)]
        common: Common,
        /// Output format.
        #[arg(long, value_enum, default_value = "libvirt-xml")]
        format: Format,
        /// Also check the XML with `virt-xml-validate` (to standard error).
        #[arg(long)]
        validate: bool,
    },
    /// Compare qlauncher's argv with libvirt's for the exported XML.
    Compare {
        #[command(flatten)]
        common: Common,
        /// libvirt embed root, reused between runs (capabilities cache).
        #[arg(long, value_name = "DIR")]
        libvirt_root: Option<PathBuf>,
    },
    /// Compare the exported XML with an expected domain XML (e.g. KubeVirt's converter test
    /// data), element by element; exits 1 on a difference not in the golden allowlist.
    Golden {
        #[command(flatten)]
        common: Common,
        /// The expected domain XML.
        expected: PathBuf,
    },
}

fn load(c: &Common, installed: bool) -> anyhow::Result<(Vmi, ConverterContext, DomainPlan)> {
    let text = std::fs::read_to_string(&c.file)
        .with_context(|| format!("cannot read {}", c.file.display()))?;
    let vmi = Vmi::from_json_or_yaml(&text).context("cannot read the VMI")?;
    let facts_path = facts_path(&c.file);
    let mut facts: Facts = match facts_path.as_deref().filter(|p| p.exists()) {
        Some(p) => serde_json::from_str(&std::fs::read_to_string(p)?)
            .with_context(|| format!("cannot read {}", p.display()))?,
        None => Facts::default(),
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

fn run() -> anyhow::Result<ExitCode> {
    match Cli::parse() {
        Cli::Convert {
            common,
            format,
            validate,
        } => {
            let (vmi, ctx, plan) = load(&common, false)?;
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
        Cli::Compare {
            common,
            libvirt_root,
        } => {
            let (vmi, ctx, plan) = load(&common, true)?;
            let xml = to_xml(&export(&vmi, &ctx, &plan)?)?;
            let root = EmbedRoot::keep(&libvirt_root.unwrap_or_else(EmbedRoot::default_dir))?;
            let theirs = root.domxml_to_native(&xml)?;
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
        Cli::Golden { common, expected } => {
            let (vmi, ctx, plan) = load(&common, false)?;
            let ours = golden::parse(&to_xml(&export(&vmi, &ctx, &plan)?)?, "export")?;
            let text = std::fs::read_to_string(&expected)
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
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::from(2)
        }
    }
}
