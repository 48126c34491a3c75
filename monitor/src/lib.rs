//! PID 1 of the compute container, as KubeVirt's `virt-launcher-monitor`
//! (`cmd/virt-launcher-monitor/` of v1.9.0), in a crate of its own so that its binary links only
//! libc and nix: it stays resident for the pod's whole life, next to QEMU.
//!
//! Becomes child subreaper, starts the launcher, reaps every zombie without stealing the exit
//! status of children that others wait on, forwards termination signals, stops a leftover QEMU,
//! removes the container-disk sockets and exits with the launcher's code.
//!
//! What lives here:
//! - [`pid1`]: the signal and reap loop, synchronous and without threads;
//! - [`reaper`]: the zombie reaper that leaves alone the children someone else waits on;
//! - [`procfs`]: `/proc` reading (children, zombies, QEMU recognition, RSS);
//! - [`flags`]: Go-style flag scanning, shared with the launcher's command line;
//! - [`istio`]: telling an Istio sidecar to quit once the VM is gone;
//! - [`log`](mod@log): KubeVirt-shaped JSON log lines without a logging framework;
//! - [`trim`]: giving clean file-backed pages and free heap back while the pod idles.
//!
//! [`main`] is the program: the `virt-launcher-monitor` binary and `qlauncher monitor` run it.
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

pub mod caps;
pub mod flags;
pub mod istio;
pub mod log;
pub mod pid1;
pub mod procfs;
pub mod reaper;
pub mod trim;

use flags::{scan, FlagKind};

/// Test-only: run this program (with the launcher's arguments) instead of the launcher.
pub const TEST_LAUNCHER_ENV: &str = "QLAUNCHER_TEST_LAUNCHER";

/// A `qlauncher` binary whose `launcher` subcommand is the launcher, in place of the one the
/// monitor would pick ([`sibling_launcher`]): `qlauncher run` names its own binary, whose pages
/// are then already in memory, and never a stale `virt-launcher` left in a build directory.
/// Not passed on to the launcher.
pub const LAUNCHER_ENV: &str = "QLAUNCHER_LAUNCHER";

/// The flags virt-launcher-monitor reads (KubeVirt v1.9.0); everything else goes to the launcher.
pub const MONITOR_FLAGS: &[(&str, FlagKind)] = &[
    ("container-disk-dir", FlagKind::Value),
    ("keep-after-failure", FlagKind::Bool),
    ("uid", FlagKind::Value),
    ("name", FlagKind::Value),
    ("namespace", FlagKind::Value),
    ("v", FlagKind::Value),
];

/// Drops `--keep-after-failure` in every spelling; the launcher gets the rest unchanged.
pub fn launcher_args(args: &[String]) -> Vec<OsString> {
    args.iter()
        .filter(|a| {
            let body = a.trim_start_matches('-');
            !(a.starts_with('-')
                && (body == "keep-after-failure" || body.starts_with("keep-after-failure=")))
        })
        .map(OsString::from)
        .collect()
}

/// Runs the monitor with `args` (without the program name); `launcher` is the launcher's program
/// and the arguments put before the launcher flags (e.g. `qlauncher` and `["launcher"]`);
/// [`LAUNCHER_ENV`] (`qlauncher run`) replaces it with `<that binary> launcher`, and
/// `QLAUNCHER_TEST_LAUNCHER` replaces both. Returns the process exit code: the launcher's, 2 for
/// a bad command line, 1 when the monitor itself failed.
pub fn main(args: Vec<String>, launcher: (PathBuf, Vec<OsString>)) -> u8 {
    let flags = scan(&args, MONITOR_FLAGS);
    let verbosity = flags.int("v", 2u32).unwrap_or(2);
    log::init(log::Logger {
        component: "virt-launcher-monitor".into(),
        name: flags.get("name").map(str::to_string),
        namespace: flags.get("namespace").map(str::to_string),
        uid: flags.get("uid").map(str::to_string),
        level: Some(log::Level::for_verbosity(verbosity)),
    });
    let _ = nix::sys::prctl::set_name(c"virt-launcher-m");
    let keep_after_failure = match flags.bool("keep-after-failure") {
        Ok(b) => b,
        Err(e) => {
            error!("bad command line", error = e.to_string());
            return 2;
        }
    };
    let mut args_out = launcher_args(&args);
    let launcher = match std::env::var_os(LAUNCHER_ENV) {
        Some(p) if !p.is_empty() => (PathBuf::from(p), vec!["launcher".into()]),
        _ => launcher,
    };
    let launcher_program = match std::env::var_os(TEST_LAUNCHER_ENV) {
        Some(p) => PathBuf::from(p),
        None => {
            let (program, prefix) = launcher;
            args_out.splice(0..0, prefix);
            program
        }
    };
    let config = pid1::MonitorConfig {
        launcher_program,
        launcher_args: args_out,
        container_disk_dir: flags
            .get("container-disk-dir")
            .unwrap_or("/var/run/kubevirt/container-disks")
            .into(),
        keep_after_failure,
        qemu_stop_timeout: Duration::from_secs(10),
        istio: Some(istio::IstioProxy::default()),
    };
    match pid1::run(&config) {
        Ok(code) => code.clamp(0, 255) as u8,
        Err(e) => {
            error!("virt-launcher-monitor failed", error = e.to_string());
            1
        }
    }
}

/// The launcher a standalone `virt-launcher-monitor` at `exe` starts: `virt-launcher` next to it
/// (KubeVirt's image has both in `/usr/bin`), else `qlauncher launcher` next to it.
pub fn sibling_launcher(exe: &std::path::Path) -> (PathBuf, Vec<OsString>) {
    let dir = exe.parent().unwrap_or(std::path::Path::new("/usr/bin"));
    let virt_launcher = dir.join("virt-launcher");
    if virt_launcher.exists() {
        (virt_launcher, Vec::new())
    } else {
        (dir.join("qlauncher"), vec!["launcher".into()])
    }
}
