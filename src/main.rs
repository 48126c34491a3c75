//! The `qlauncher` command.
use clap::Parser;

#[path = "cli/net.rs"]
mod cli_net;
#[path = "cli/sync.rs"]
mod cli_sync;

/// qlauncher: a libvirt-free virt-launcher for KubeVirt.
#[derive(Parser)]
#[command(version, about)]
enum Cli {
    /// Query a launcher's command socket (Info, Ping, GetDomain, GetQemuVersion) as virt-handler does.
    LauncherSock(cli_sync::LauncherSockArgs),
    /// Print the pod interface facts and the masquerade NAT tables (read-only).
    NetProbe(cli_net::NetProbe),
}

fn main() -> std::process::ExitCode {
    let result = match Cli::parse() {
        Cli::LauncherSock(args) => cli_sync::run(args),
        Cli::NetProbe(args) => cli_net::run(args),
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
