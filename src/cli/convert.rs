//! `qlauncher convert FILE [--qemu-version X.Y] [--format argv|shell|plan-json|libvirt-xml|hook-xml]`:
//! applies KubeVirt's defaults to a VMI manifest, validates it, and prints the QEMU command line,
//! the QMP device plan, or the libvirt domain XML KubeVirt v1.9 would produce, with placeholder pod
//! facts (tap fds 3, 4, ... per interface and queue, QMP on a socket path), for review and
//! debugging. `libvirt-xml` is `qlauncher-compat convert` (compat/libvirt-xml): it also reads
//! `FILE.facts.json` beside the manifest when present, and `--validate` checks the XML with
//! libvirt's `virt-xml-validate`. `hook-xml` is the domain XML a hook sidecar's `OnDefineDomain`
//! gets (`qlauncher::hooks::domain_xml`), the BEFORE of `qlauncher hook-diff`.

use std::path::PathBuf;

use anyhow::Context;
use qlauncher::cmdline::context::{MonitorSocket, QemuVersion};
use qlauncher::cmdline::facts_file::{FactsFile, FdLayout};
use qlauncher::cmdline::{convert, render};
use qlauncher::vmi::Vmi;

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One argv word per line.
    Argv,
    /// A shell command line (quoted, for reading; qlauncher never runs a shell).
    Shell,
    /// The QMP device plan as JSON.
    PlanJson,
    /// The libvirt domain XML KubeVirt v1.9 would hand libvirt for this VMI.
    LibvirtXml,
    /// The domain XML a hook sidecar's `OnDefineDomain` gets (KubeVirt's `api.DomainSpec` as Go's
    /// `xml.MarshalIndent(spec, "", "\t")` prints it).
    HookXml,
}

/// Arguments of `convert`.
#[derive(Debug, clap::Args)]
pub struct ConvertArgs {
    /// VMI manifest (YAML or JSON; a VirtualMachine's template works too).
    pub file: PathBuf,
    /// QEMU version to render for (default 10.1).
    #[arg(long, value_name = "X.Y")]
    pub qemu_version: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "argv")]
    pub format: Format,
    /// Plan for TCG (as `--allow-emulation` on a host without KVM).
    #[arg(long)]
    pub tcg: bool,
    /// With `--format libvirt-xml`: also check the XML with libvirt's `virt-xml-validate`
    /// (needs Debian's libvirt-clients; the result goes to standard error).
    #[arg(long)]
    pub validate: bool,
}

/// Runs `convert`.
pub fn run(args: &ConvertArgs) -> anyhow::Result<()> {
    if args.format == Format::HookXml && !args.validate {
        let common = qlauncher_libvirt_xml::cli::Common {
            file: args.file.clone(),
            qemu_version: args.qemu_version.clone(),
            tcg: args.tcg,
        };
        let (vmi, ctx, plan) = qlauncher_libvirt_xml::cli::load(&common, false)?;
        println!("{}", qlauncher::hooks::domain_xml(&vmi, &ctx, &plan)?);
        return Ok(());
    }
    if args.format == Format::LibvirtXml {
        let common = qlauncher_libvirt_xml::cli::Common {
            file: args.file.clone(),
            qemu_version: args.qemu_version.clone(),
            tcg: args.tcg,
        };
        qlauncher_libvirt_xml::cli::convert_cmd(
            &common,
            qlauncher_libvirt_xml::cli::Format::LibvirtXml,
            args.validate,
        )?;
        return Ok(());
    }
    if args.validate {
        anyhow::bail!("--validate applies to --format libvirt-xml only");
    }
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let mut vmi = Vmi::from_json_or_yaml(&text).context("cannot read the VMI")?;
    if let Some(uid) = vmi.assign_stand_in_uid() {
        // The API server assigns UIDs; a manifest from disk has none.
        eprintln!("note: the manifest has no metadata.uid; using {uid}");
    }
    // What virt-api's webhook would hand on: KubeVirt's defaults, then validation.
    if let Err(errors) = vmi.admit() {
        let list: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        anyhow::bail!("invalid VMI:\n  {}", list.join("\n  "));
    }
    // Placeholder pod facts: tap fds 3, 4, ... (one per interface and queue), MTU 1500, QMP on
    // the default socket path.
    let facts = FactsFile {
        tcg: args.tcg,
        ..Default::default()
    };
    let layout = FdLayout {
        monitor: MonitorSocket::default(),
        first_tap_fd: 3,
        first_vhost_fd: 3,
    };
    let mut ctx = facts.context_with(&vmi, &layout);
    if let Some(v) = &args.qemu_version {
        ctx.qemu = QemuVersion::parse(v).with_context(|| format!("bad QEMU version {v:?}"))?;
    }
    let plan = convert(&vmi, &ctx).context("cannot convert the VMI")?;
    match args.format {
        Format::Argv => {
            for w in render::argv(&plan) {
                println!("{w}");
            }
        }
        Format::Shell => print!("{}", render::shell_line("qemu-system-x86_64", &plan)),
        // Printed through the compat exporter before conversion, above.
        Format::LibvirtXml | Format::HookXml => {}
        Format::PlanJson => println!(
            "{}",
            serde_json::to_string_pretty(&render::qmp_plan(&plan))?
        ),
    }
    Ok(())
}
