//! The `qlauncher` command.
use clap::Parser;

mod cli {
    pub mod sync;
    pub mod validate;
}

/// qlauncher: a libvirt-free virt-launcher for KubeVirt.
#[derive(Parser)]
#[command(version, about)]
enum Cli {
    /// Read a VMI (or VirtualMachine) manifest, apply KubeVirt's defaults and validate it.
    Validate(cli::validate::Args),
    /// Query a launcher's command socket (Info, Ping, GetDomain, GetQemuVersion) as virt-handler does.
    LauncherSock(cli::sync::LauncherSockArgs),
}

fn main() -> std::process::ExitCode {
    let result = match Cli::parse() {
        Cli::Validate(args) => cli::validate::run(args),
        Cli::LauncherSock(args) => cli::sync::run(args).map(|()| std::process::ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
