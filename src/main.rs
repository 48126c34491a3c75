//! The `qlauncher` command.
use clap::Parser;

#[path = "cli/qmp.rs"]
mod cli_qmp;

/// qlauncher: a libvirt-free virt-launcher for KubeVirt.
#[derive(Parser)]
#[command(version, about)]
enum Cli {
    /// Run one QMP command on a QEMU's monitor socket and print the reply.
    Qmp(cli_qmp::QmpArgs),
    /// Hotplug or unplug a disk or NIC through a QEMU's monitor socket.
    Hotplug(cli_qmp::HotplugArgs),
}

fn main() -> std::process::ExitCode {
    let result = match Cli::parse() {
        Cli::Qmp(args) => cli_qmp::run_qmp(args),
        Cli::Hotplug(args) => cli_qmp::run_hotplug(args),
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
