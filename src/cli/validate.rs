//! `qlauncher validate FILE`: print the defaulted VMI as JSON, or its field errors (exit 2).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use qlauncher::vmi::{DefaultBinding, DefaultsConfig, Vmi};

/// Arguments of `qlauncher validate`.
#[derive(clap::Args)]
pub struct Args {
    /// VMI, VirtualMachine, VirtualMachineInstanceReplicaSet or VirtualMachinePool manifest
    /// (JSON or YAML); `-` reads standard input.
    file: PathBuf,
    /// Binding of the default pod interface added when the VMI has none (the KubeVirt CR's
    /// `defaultNetworkInterface`).
    #[arg(long, value_enum, default_value = "bridge")]
    default_binding: Binding,
    /// Skip KubeVirt's defaults: validate the VMI as written.
    #[arg(long)]
    no_defaults: bool,
}

/// `--default-binding` values.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Binding {
    Bridge,
    Masquerade,
}

/// Runs the subcommand: exit 0 and the defaulted VMI as JSON on stdout, or exit 2 and one
/// `path: reason` line per error on stderr.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let text = if args.file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
    };
    let mut vmi = match Vmi::from_json_or_yaml(&text) {
        Ok(vmi) => vmi,
        Err(err) => {
            eprintln!("{}: {err}", args.file.display());
            return Ok(ExitCode::from(2));
        }
    };
    if !args.no_defaults {
        let mut cfg = DefaultsConfig::for_vmi(&vmi);
        cfg.default_binding = match args.default_binding {
            Binding::Bridge => DefaultBinding::Bridge,
            Binding::Masquerade => DefaultBinding::Masquerade,
        };
        vmi.apply_defaults(&cfg);
    }
    if let Err(errors) = vmi.validate() {
        for err in errors {
            eprintln!("{err}");
        }
        return Ok(ExitCode::from(2));
    }
    println!("{}", serde_json::to_string_pretty(&vmi)?);
    Ok(ExitCode::SUCCESS)
}
