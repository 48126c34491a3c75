//! `qlauncher monitor` / `virt-launcher-monitor` under the `qlauncher` binary: an alias of the
//! dedicated `virt-launcher-monitor` binary ([`qlauncher_monitor::main`]) that starts this
//! binary's `launcher` subcommand.
use std::path::PathBuf;
use std::process::ExitCode;

/// Runs the monitor with its and the launcher's flags; returns the launcher's exit code.
pub fn main(args: Vec<String>) -> ExitCode {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
    ExitCode::from(qlauncher_monitor::main(
        args,
        (exe, vec!["launcher".into()]),
    ))
}
