//! PID 1 of the compute container, as KubeVirt's virt-launcher-monitor, and the process plumbing of
//! virt-launcher.
//!
//! Becomes child subreaper, starts the launcher, reaps every zombie without stealing the exit status
//! of children that others wait on, forwards termination signals, enforces the grace period on
//! QEMU, removes the container-disk sockets and exits with the launcher's code.
//!
//! What lives here:
//! - [`pid1`], [`reaper`], [`procfs`], [`flags`], [`istio`]: re-exported from the
//!   `qlauncher-monitor` crate, which the dedicated `virt-launcher-monitor` binary links alone
//!   (libc and nix): the monitor's signal and reap loop, the zombie reaper that leaves alone the
//!   children someone else waits on, `/proc` reading, Go-style flag scanning shared by both
//!   command lines, telling an Istio sidecar to quit once the VM is gone;
//! - [`qemu`]: starting QEMU detached so that it becomes a child of PID 1, and watching a QEMU pid
//!   through a pidfd;
//! - [`grace`]: the graceful-shutdown logic (ACPI power button, kill when the grace period ends);
//! - [`launcher`]: virt-launcher's flags, directories, `STANDALONE_VMI` and the `--qemu-timeout`
//!   wait, generic over a [`launcher::SupervisedDomain`] that the sync module implements;
//! - [`trim`]: giving back start-up memory once the domain runs;
//! - [`kvm_probe`]: whether KVM actually runs a guest (a tiny probe guest under `accel=kvm`), for
//!   `--emulation auto` and `--allow-emulation`.
//!
//! This module imports nothing else from the crate but [`crate::sys`] (error chains) and
//! [`crate::log`] (the launcher's log setup): the sync module implements its traits, never the
//! other way round.
use std::path::PathBuf;

pub mod grace;
pub mod kvm_probe;
pub mod launcher;
pub mod qemu;
pub mod trim;

pub use qlauncher_monitor::{flags, istio, pid1, procfs, reaper};

/// Errors of the monitor and launcher plumbing. Each variant names the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// A flag value does not parse.
    #[error("flag --{flag}: {reason}")]
    ParseFlag {
        /// Flag name without dashes.
        flag: String,
        /// What is wrong with the value.
        reason: String,
    },
    /// `prctl(PR_SET_CHILD_SUBREAPER)` failed.
    #[error("becoming child subreaper")]
    Subreaper(#[source] nix::Error),
    /// Blocking or waiting for signals failed.
    #[error("handling signals")]
    Signals(#[source] std::io::Error),
    /// The launcher process could not be started.
    #[error("starting the launcher {program}")]
    SpawnLauncher {
        /// The program executed.
        program: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A launcher directory could not be created or given its mode and owner.
    #[error("creating directory {path}")]
    CreateDirectory {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `STANDALONE_VMI` holds neither YAML nor JSON.
    #[error("reading the VMI from STANDALONE_VMI")]
    ReadStandaloneVmi(#[source] serde_yaml_ng::Error),
    /// No domain was started within `--qemu-timeout` (KubeVirt panics with
    /// "timed out waiting for domain to be defined").
    #[error("timed out waiting for domain to be defined: no QEMU started within --qemu-timeout {}s", .timeout.as_secs_f64())]
    QemuTimeout {
        /// The `--qemu-timeout` value.
        timeout: std::time::Duration,
    },
    /// QEMU could not be started.
    #[error("starting QEMU {program}")]
    SpawnQemu {
        /// The QEMU binary.
        program: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A pidfd for the QEMU process could not be opened or watched.
    #[error("watching QEMU pid {pid}")]
    WatchQemu {
        /// The QEMU pid.
        pid: i32,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The ACPI power button request failed.
    #[error("pressing the ACPI power button")]
    PowerButton(#[source] std::io::Error),
    /// A step of the launcher itself failed (collecting the hook sidecars, the command server,
    /// a standalone VMI), whether or not QEMU ever ran.
    #[error("the launcher failed: {reason}")]
    LauncherFailed {
        /// The step and its error chain, e.g. `collecting the hook sidecars: ...`.
        reason: String,
    },
    /// QEMU ended without a shutdown request (crash or unexpected exit).
    #[error("QEMU exited unexpectedly: {reason}")]
    QemuExited {
        /// What is known about the exit (QEMU's last error line or exit status).
        reason: String,
    },
    /// The KVM probe's scratch `-bios` image could not be written.
    #[error("writing the KVM probe image {path}")]
    KvmProbeImage {
        /// The scratch file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The KVM probe guest did not finish in time (QEMU was killed).
    #[error("the KVM probe guest reached {reached} but did not get past {next} within {}s", .timeout.as_secs_f64())]
    KvmProbeTimeout {
        /// The last stage reached and when (ms since QEMU's start), or "nothing".
        reached: String,
        /// What the guest was doing.
        next: String,
        /// The bound that ran out.
        timeout: std::time::Duration,
    },
    /// QEMU ended the KVM probe without the success status.
    #[error("QEMU running the KVM probe exited with {status} (guest reached {reached}): {stderr}")]
    KvmProbeExited {
        /// Exit status or signal.
        status: String,
        /// The last stage reached and when, or "nothing".
        reached: String,
        /// QEMU's last stderr lines.
        stderr: String,
    },
}

impl From<flags::FlagError> for MonitorError {
    fn from(e: flags::FlagError) -> Self {
        MonitorError::ParseFlag {
            flag: e.flag,
            reason: e.reason,
        }
    }
}
