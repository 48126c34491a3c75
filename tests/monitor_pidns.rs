//! The monitor as PID 1 of its own PID namespace (`unshare --pid --fork --mount-proc`), as in the
//! compute container: the launcher's parent is PID 1, termination signals from the parent
//! namespace are taken (PID 1 gets only signals it handles), orphans are reaped, and QEMU is a
//! direct child of PID 1.
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use qlauncher::monitor::procfs;
use testkit::monitor::*;
use testkit::process::{wait_until, Running};

/// The innermost pid of `pid` (last field of `NSpid` in `/proc/<pid>/status`).
fn ns_pid(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

fn unshared_monitor(dir: &std::path::Path, args: &[String], envs: &[(&str, String)]) -> Running {
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(bin())
        .arg("monitor")
        .args(args)
        .env_remove(TEST_LAUNCHER_ENV)
        .env("QLAUNCHER_LOG", "debug");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    Running::start(cmd, &dir.join("monitor.log"))
}

fn monitor_of(unshare: &Running) -> Option<i32> {
    procfs::children(unshare.pid()).first().map(|c| c.pid)
}

#[test]
fn monitor_is_pid_1_takes_sigterm_and_reaps() {
    let tmp = tempfile::tempdir().unwrap();
    let ppid_file = tmp.path().join("ppid");
    let script = format!(
        "trap 'exit 4' TERM; i=0; while [ $i -lt 100 ]; do ( : & ); i=$((i+1)); done; \
         echo $PPID > {}; while :; do sleep 0.05; done",
        ppid_file.display()
    );
    let mut u = unshared_monitor(
        tmp.path(),
        &["-c".into(), script],
        &[(TEST_LAUNCHER_ENV, "/bin/sh".into())],
    );
    assert!(wait_until(Duration::from_secs(30), || {
        std::fs::read_to_string(&ppid_file).is_ok_and(|s| s.ends_with('\n'))
    }));
    assert_eq!(std::fs::read_to_string(&ppid_file).unwrap(), "1\n");
    let monitor = monitor_of(&u).expect("monitor process");
    assert_eq!(ns_pid(monitor), Some(1));
    assert!(wait_until(Duration::from_secs(10), || {
        procfs::children(monitor).iter().all(|c| !c.is_zombie())
    }));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(monitor), Signal::SIGTERM).unwrap();
    let status = u.wait_timeout(Duration::from_secs(30)).expect("exits");
    assert_eq!(status.code(), Some(4));
}

#[test]
fn qemu_is_a_child_of_pid_1_and_stops_within_the_grace_period() {
    let tmp = tempfile::tempdir().unwrap();
    let mut u = unshared_monitor(
        tmp.path(),
        &launcher_flags(tmp.path(), &["--grace-period-seconds", "1"]),
        &static_launcher(tmp.path()),
    );
    assert!(wait_until(Duration::from_secs(30), || {
        monitor_of(&u).is_some_and(|m| !procfs::qemu_children(m).is_empty())
    }));
    let monitor = monitor_of(&u).unwrap();
    let qemu = procfs::qemu_children(monitor)[0].pid;
    assert_eq!(ns_pid(monitor), Some(1));
    let launcher = procfs::children(monitor)
        .into_iter()
        .find(|c| c.comm == "virt-launcher")
        .expect("launcher is a child of PID 1");
    assert_eq!(
        (ns_pid(launcher.pid), ns_pid(qemu).is_some()),
        (Some(2), true)
    );
    // Wait until the launcher watches QEMU, then stop.
    assert!(wait_until(Duration::from_secs(30), || u
        .record("domain started, watching QEMU")
        .is_some()));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(monitor), Signal::SIGTERM).unwrap();
    let status = u.wait_timeout(Duration::from_secs(30)).expect("exits");
    assert_eq!(status.code(), Some(0));
    assert!(u.record("grace period expired, killing QEMU").is_some());
}
