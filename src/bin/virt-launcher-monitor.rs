//! `virt-launcher-monitor`: PID 1 of the compute container, a binary of its own that links only
//! `qlauncher-monitor` (libc and nix), not the launcher. It starts `virt-launcher` next to it
//! (else `qlauncher launcher`); see [`qlauncher_monitor::main`].
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let exe =
        std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/usr/bin/virt-launcher-monitor"));
    let launcher = qlauncher_monitor::sibling_launcher(&exe);
    ExitCode::from(qlauncher_monitor::main(
        std::env::args().skip(1).collect(),
        launcher,
    ))
}
