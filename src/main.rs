//! The `qlauncher` command.
use clap::Parser;

mod cli {
    pub mod convert;
}

/// qlauncher: a libvirt-free virt-launcher for KubeVirt.
#[derive(Parser)]
#[command(version, about)]
enum Cli {
    /// Print the QEMU command line or QMP device plan for a VMI.
    Convert(cli::convert::ConvertArgs),
}

fn main() -> std::process::ExitCode {
    let result = match Cli::parse() {
        Cli::Convert(args) => cli::convert::run(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
