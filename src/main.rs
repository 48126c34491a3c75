//! The `qlauncher` command.
use clap::Parser;

#[path = "cli/net.rs"]
mod cli_net;

/// qlauncher: a libvirt-free virt-launcher for KubeVirt.
#[derive(Parser)]
#[command(version, about)]
enum Cli {
    /// Print the pod interface facts and the masquerade NAT tables (read-only).
    NetProbe(cli_net::NetProbe),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse() {
        Cli::NetProbe(args) => cli_net::run(args),
    }
}
