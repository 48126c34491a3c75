//! `virt-launcher`: the pod's launcher as a binary of its own. It runs the same program as
//! `qlauncher launcher` ([`qlauncher::sync::launcher::main`]) but reaches none of the `qlauncher`
//! tool's commands (their argument parser, the libvirt XML text export, comparison and golden
//! code), so that its text and resident pages stay small.
use std::process::ExitCode;

fn main() -> ExitCode {
    qlauncher::sync::launcher::main(std::env::args().skip(1).collect())
}
