//! The `qlauncher` command.
use clap::Parser;

mod cli {
    pub mod validate;
}

/// qlauncher: a libvirt-free virt-launcher for KubeVirt.
#[derive(Parser)]
#[command(version, about)]
enum Cli {
    /// Read a VMI (or VirtualMachine) manifest, apply KubeVirt's defaults and validate it.
    Validate(cli::validate::Args),
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    match Cli::parse() {
        Cli::Validate(args) => cli::validate::run(args),
    }
}
