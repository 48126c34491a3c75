//! The `qlauncher` command.
use std::process::ExitCode;

use clap::Parser;

mod cli;

/// qlauncher: a libvirt-free virt-launcher for KubeVirt.
#[derive(Parser)]
#[command(version, about)]
enum Cli {
    /// PID 1 of the compute container (virt-launcher-monitor): starts the launcher, reaps
    /// zombies, forwards signals. Takes virt-launcher-monitor's and virt-launcher's flags.
    Monitor {
        /// virt-launcher-monitor flags, passed on to the launcher.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The launcher (virt-launcher): runs one VMI's QEMU. Takes virt-launcher's flags.
    Launcher {
        /// virt-launcher flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    // Installed under KubeVirt's names, the binary behaves as that program.
    let mut argv = std::env::args();
    let argv0 = argv.next().unwrap_or_default();
    match argv0.rsplit('/').next().unwrap_or_default() {
        "virt-launcher-monitor" => return cli::monitor::main(argv.collect()),
        "virt-launcher" => return cli::launcher::main(argv.collect()),
        _ => {}
    }
    match Cli::parse() {
        Cli::Monitor { args } => cli::monitor::main(args),
        Cli::Launcher { args } => cli::launcher::main(args),
    }
}
