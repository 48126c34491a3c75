//! The `qlauncher` command.
use clap::Parser;

/// qlauncher: a libvirt-free virt-launcher for KubeVirt.
#[derive(Parser)]
#[command(version, about)]
enum Cli {}

fn main() {
    let _cli = Cli::parse();
}
