//! `qlauncher validate FILE`: print the defaulted VMI as JSON, or its field errors (exit 2).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use qlauncher::vmi::Vmi;

/// Arguments of `qlauncher validate`.
#[derive(clap::Args)]
pub struct Args {
    /// VMI, VirtualMachine, VirtualMachineInstanceReplicaSet or VirtualMachinePool manifest
    /// (JSON or YAML); `-` reads standard input.
    file: PathBuf,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let text = if args.file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
    };
    let vmi = Vmi::from_json_or_yaml(&text)
        .with_context(|| format!("reading VMI from {}", args.file.display()))?;
    println!("{}", serde_json::to_string_pretty(&vmi)?);
    Ok(ExitCode::SUCCESS)
}
