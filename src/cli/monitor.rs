//! `qlauncher monitor` / `virt-launcher-monitor`: PID 1 of the compute container.
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use qlauncher::log::{self, VmiRef};
use qlauncher::monitor::flags::{scan, FlagKind};
use qlauncher::monitor::istio::IstioProxy;
use qlauncher::monitor::pid1::{self, MonitorConfig};

/// Test-only: run this program (with the launcher's arguments) instead of `qlauncher launcher`.
pub const TEST_LAUNCHER_ENV: &str = "QLAUNCHER_TEST_LAUNCHER";

/// The flags virt-launcher-monitor reads (KubeVirt v1.9.0); everything else goes to the launcher.
const MONITOR_FLAGS: &[(&str, FlagKind)] = &[
    ("container-disk-dir", FlagKind::Value),
    ("keep-after-failure", FlagKind::Bool),
    ("uid", FlagKind::Value),
    ("name", FlagKind::Value),
    ("namespace", FlagKind::Value),
    ("v", FlagKind::Value),
];

/// Drops `--keep-after-failure` in every spelling; the launcher gets the rest unchanged.
fn launcher_args(args: &[String]) -> Vec<OsString> {
    args.iter()
        .filter(|a| {
            let body = a.trim_start_matches('-');
            !(a.starts_with('-')
                && (body == "keep-after-failure" || body.starts_with("keep-after-failure=")))
        })
        .map(OsString::from)
        .collect()
}

/// Runs the monitor; returns the launcher's exit code.
pub fn main(args: Vec<String>) -> ExitCode {
    let flags = scan(&args, MONITOR_FLAGS);
    let verbosity = flags.int("v", 2u32).unwrap_or(2);
    log::init(
        "virt-launcher-monitor",
        VmiRef {
            name: flags.get("name").map(str::to_string),
            namespace: flags.get("namespace").map(str::to_string),
            uid: flags.get("uid").map(str::to_string),
        },
        verbosity,
    );
    let _ = nix::sys::prctl::set_name(c"virt-launcher-m");
    let keep_after_failure = match flags.bool("keep-after-failure") {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = &e as &dyn std::error::Error, "bad command line");
            return ExitCode::from(2);
        }
    };
    let mut launcher_args = launcher_args(&args);
    let launcher_program = match std::env::var_os(TEST_LAUNCHER_ENV) {
        Some(p) => PathBuf::from(p),
        None => {
            launcher_args.insert(0, "launcher".into());
            std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"))
        }
    };
    let config = MonitorConfig {
        launcher_program,
        launcher_args,
        container_disk_dir: flags
            .get("container-disk-dir")
            .unwrap_or("/var/run/kubevirt/container-disks")
            .into(),
        keep_after_failure,
        qemu_stop_timeout: Duration::from_secs(10),
        istio: Some(IstioProxy::default()),
    };
    match pid1::run(&config) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            tracing::error!(
                error = &e as &dyn std::error::Error,
                "virt-launcher-monitor failed"
            );
            ExitCode::FAILURE
        }
    }
}
