//! The monitor and launcher as real processes: exit codes, signal forwarding, zombie reaping,
//! leftover QEMU, container-disk sockets, the process tree, the grace period, a crashing QEMU and
//! `--qemu-timeout`. Each test has its own temporary directory and kills its process tree on drop.
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use qlauncher::monitor::procfs;
use testkit::monitor::*;
use testkit::process::{wait_until, Running};

/// `qlauncher monitor ARGS` whose launcher is `sh -c SCRIPT` (through `QLAUNCHER_TEST_LAUNCHER`).
fn monitor_with_script(dir: &std::path::Path, script: &str, extra: &[&str]) -> Running {
    let mut cmd = Command::new(bin());
    // The monitor's own flags after the script: sh takes them as $0, $1, ...
    cmd.arg("monitor")
        .args(["-c", script])
        .args(extra)
        .env(TEST_LAUNCHER_ENV, "/bin/sh")
        .env("QLAUNCHER_LOG", "debug");
    Running::start(cmd, &dir.join("monitor.log"))
}

#[test]
fn monitor_exits_with_the_launcher_code() {
    let tmp = tempfile::tempdir().unwrap();
    for code in [0, 7, 42] {
        let mut m = monitor_with_script(tmp.path(), &format!("exit {code}"), &[]);
        let status = m
            .wait_timeout(Duration::from_secs(20))
            .expect("monitor exits");
        assert_eq!(status.code(), Some(code));
        let launcher_exit = m.record("virt-launcher exited").expect("exit logged");
        assert_eq!(launcher_exit["code"], code);
        assert_eq!(launcher_exit["component"], "virt-launcher-monitor");
    }
}

/// The dedicated `virt-launcher-monitor` binary (the image's PID 1) behaves as `qlauncher monitor`:
/// the launcher's exit code, the log's shape, `QLAUNCHER_MONITOR_PID` (recovery's scan of the
/// monitor's children) set to its own pid for the launcher, and none of the launcher's runtime
/// linked in.
#[test]
fn dedicated_monitor_binary_runs_the_launcher_and_links_no_runtime() {
    let tmp = tempfile::tempdir().unwrap();
    let monitor = env!("CARGO_BIN_EXE_virt-launcher-monitor");
    let env_out = tmp.path().join("monitor-pid");
    for code in [0, 9] {
        let script = format!(
            "echo \"$QLAUNCHER_MONITOR_PID $PPID\" > {}; exit {code}",
            env_out.display()
        );
        let mut cmd = Command::new(monitor);
        cmd.args(["-c", &script])
            .args(["--name", "testvmi"])
            .env(TEST_LAUNCHER_ENV, "/bin/sh")
            .env("QLAUNCHER_LOG", "debug");
        let mut m = Running::start(cmd, &tmp.path().join("monitor.log"));
        let pid = m.pid();
        let status = m
            .wait_timeout(Duration::from_secs(20))
            .expect("monitor exits");
        assert_eq!(status.code(), Some(code));
        let launcher_exit = m.record("virt-launcher exited").expect("exit logged");
        assert_eq!(launcher_exit["code"], code);
        assert_eq!(launcher_exit["component"], "virt-launcher-monitor");
        assert_eq!(launcher_exit["name"], "testvmi");
        assert_eq!(
            std::fs::read_to_string(&env_out).unwrap(),
            format!("{pid} {pid}\n"),
            "QLAUNCHER_MONITOR_PID is the monitor's pid, the launcher's parent"
        );
    }
    let image = std::fs::read(monitor).unwrap();
    for crate_name in [&b"tokio"[..], b"serde_json", b"clap", b"tracing_subscriber"] {
        assert!(
            !image.windows(crate_name.len()).any(|w| w == crate_name),
            "{} linked into virt-launcher-monitor",
            String::from_utf8_lossy(crate_name)
        );
    }
}

#[test]
fn launcher_gets_ambient_net_bind_service() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("caps");
    let script = format!("grep CapAmb /proc/$$/status > {}", out.display());
    let mut m = monitor_with_script(tmp.path(), &script, &[]);
    assert_eq!(
        m.wait_timeout(Duration::from_secs(20)).unwrap().code(),
        Some(0)
    );
    // Bit 10: CAP_NET_BIND_SERVICE.
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "CapAmb:\t0000000000000400\n"
    );
}

#[test]
fn launcher_killed_by_a_signal_gives_128_plus_signal() {
    let tmp = tempfile::tempdir().unwrap();
    let mut m = monitor_with_script(tmp.path(), "kill -KILL $$", &[]);
    let status = m
        .wait_timeout(Duration::from_secs(20))
        .expect("monitor exits");
    assert_eq!(status.code(), Some(128 + 9));
}

#[test]
fn termination_signals_reach_the_launcher_as_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGQUIT] {
        let got = tmp.path().join(format!("got-{sig}"));
        let ready = tmp.path().join(format!("ready-{sig}"));
        // Each trap records which signal the launcher received.
        let script = format!(
            "for s in INT TERM QUIT; do trap \"echo $s > {got}; exit 3\" $s; done; \
             touch {ready}; while :; do sleep 0.05; done",
            got = got.display(),
            ready = ready.display()
        );
        let mut m = monitor_with_script(tmp.path(), &script, &[]);
        assert!(wait_until(Duration::from_secs(20), || ready.exists()));
        m.signal(sig);
        let status = m
            .wait_timeout(Duration::from_secs(20))
            .expect("monitor exits");
        assert_eq!(status.code(), Some(3), "{sig}");
        assert_eq!(std::fs::read_to_string(&got).unwrap(), "TERM\n", "{sig}");
    }
}

#[test]
fn a_thousand_orphans_are_reaped() {
    let tmp = tempfile::tempdir().unwrap();
    let done = tmp.path().join("done");
    // `( : & )`: the subshell forks a background child and exits, orphaning it to the monitor.
    let script = format!(
        "i=0; while [ $i -lt 1000 ]; do ( : & ); i=$((i+1)); done; touch {}; \
         trap 'exit 0' TERM; while :; do sleep 0.05; done",
        done.display()
    );
    let mut m = monitor_with_script(tmp.path(), &script, &[]);
    assert!(wait_until(Duration::from_secs(60), || done.exists()));
    let monitor = m.pid();
    let zombies = || {
        procfs::children(monitor)
            .into_iter()
            .filter(|c| c.is_zombie())
            .count()
    };
    let reaped_orphans = |m: &Running| {
        m.log_records()
            .iter()
            .filter(|r| r["msg"] == "reaped")
            .count()
    };
    // Every orphan exited and was reaped: the launcher (and its `sleep`) are all that is left.
    // Most of the thousand went through the monitor (a subshell sometimes reaps its own child).
    let only_launcher = || {
        procfs::children(monitor)
            .iter()
            .all(|c| c.comm == "sh" && !c.is_zombie())
    };
    assert!(wait_until(Duration::from_secs(10), || zombies() == 0
        && only_launcher()));
    assert!(reaped_orphans(&m) > 500, "{}", reaped_orphans(&m));
    m.signal(Signal::SIGTERM);
    assert_eq!(
        m.wait_timeout(Duration::from_secs(20)).unwrap().code(),
        Some(0)
    );
}

#[test]
fn leftover_qemu_is_terminated_and_container_disk_sockets_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let disks = tmp.path().join("container-disks");
    std::fs::create_dir(&disks).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(disks.join("disk_0.sock")).unwrap();
    std::fs::write(disks.join("disk_0.img"), b"keep").unwrap();
    let pidfile = tmp.path().join("qemu.pid");
    let go = tmp.path().join("go");
    // The launcher stand-in daemonizes QEMU (as libvirt does) and exits when told to.
    let script = format!(
        "qemu-system-x86_64 -S -accel tcg -nodefaults -display none -m 64 -daemonize -pidfile {pid} \
         && while [ ! -e {go} ]; do sleep 0.05; done",
        pid = pidfile.display(),
        go = go.display()
    );
    let container_disk_dir = format!("--container-disk-dir={}", disks.display());
    let mut m = monitor_with_script(tmp.path(), &script, &[&container_disk_dir]);
    assert!(wait_until(Duration::from_secs(30), || {
        std::fs::read_to_string(&pidfile).is_ok_and(|s| s.trim().parse::<i32>().is_ok())
    }));
    let qemu: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The daemonized QEMU is re-parented to the monitor, the subreaper (once QEMU's intermediate
    // daemonizing process, its parent for a moment, has exited).
    let monitor = m.pid();
    assert!(wait_until(Duration::from_secs(10), || {
        procfs::stat(qemu).is_some_and(|s| s.ppid == monitor)
    }));
    std::fs::write(&go, b"").unwrap();
    let status = m
        .wait_timeout(Duration::from_secs(30))
        .expect("monitor exits");
    assert_eq!(status.code(), Some(0));
    assert!(procfs::stat(qemu).is_none_or(|s| s.ppid != m.pid()));
    let mut left: Vec<_> = std::fs::read_dir(&disks)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["disk_0.img"]);
    let stopped: Vec<_> = m
        .log_records()
        .into_iter()
        .filter(|r| r["msg"] == "QEMU still running after virt-launcher exited, sending SIGTERM")
        .map(|r| r["pid"].clone())
        .collect();
    assert_eq!(
        stopped,
        [serde_json::Value::from(qemu)],
        "{}",
        std::fs::read_to_string(&m.log).unwrap()
    );
}

/// `qlauncher monitor` running the launcher lifecycle with an idle QEMU as its domain (the static
/// launcher).
fn monitor_with_launcher(dir: &std::path::Path, extra: &[&str]) -> Running {
    let mut cmd = Command::new(bin());
    cmd.arg("monitor")
        .args(launcher_flags(dir, extra))
        .envs(static_launcher(dir));
    Running::start(cmd, &dir.join("monitor.log"))
}

fn thread_names(pid: i32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .map(|s| s.trim_end().to_string())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn process_tree_and_grace_period_kill() {
    let tmp = tempfile::tempdir().unwrap();
    let mut m = monitor_with_launcher(tmp.path(), &["--grace-period-seconds", "2"]);
    let monitor = m.pid();
    assert!(wait_until(Duration::from_secs(30), || {
        !procfs::qemu_children(monitor).is_empty() && tmp.path().join("qmp.sock").exists()
    }));
    // The tree virt-handler expects: monitor -> {launcher, QEMU}, QEMU a direct child of PID 1.
    let children = procfs::children(monitor);
    let mut comms: Vec<_> = children.iter().map(|c| c.comm.clone()).collect();
    comms.sort();
    assert_eq!(comms, ["qemu-system-x86", "virt-launcher"]);
    let qemu = procfs::qemu_children(monitor)[0].pid;
    // QEMU names its vCPU threads (`-name ...,debug-threads=on`), as virt-handler expects.
    assert!(wait_until(Duration::from_secs(10), || thread_names(qemu)
        .contains(&"CPU 0/TCG".to_string())));
    // Private directory created by the launcher.
    assert!(tmp.path().join("private/1234").is_dir());

    // Stop only once the launcher watches QEMU (a stop while the domain starts ends the launcher
    // at once, and the monitor then stops QEMU).
    assert!(wait_until(Duration::from_secs(30), || m
        .record("domain started, watching QEMU")
        .is_some()));
    let asked = Instant::now();
    m.signal(Signal::SIGTERM);
    let status = m
        .wait_timeout(Duration::from_secs(30))
        .expect("monitor exits");
    // The guest-less QEMU ignores the power button: it lasts the whole grace period.
    assert!(asked.elapsed() >= Duration::from_secs(2));
    assert_eq!(status.code(), Some(0));
    assert!(procfs::stat(qemu).is_none_or(|s| s.ppid != monitor));
    let expired = m
        .record("grace period expired, killing QEMU")
        .expect("grace expiry logged");
    assert_eq!(
        (
            &expired["component"],
            &expired["name"],
            &expired["namespace"],
            &expired["uid"],
            &expired["pid"]
        ),
        (
            &"virt-launcher".into(),
            &"testvmi".into(),
            &"default".into(),
            &"1234".into(),
            &qemu.into()
        )
    );
    assert!(m
        .record("QEMU still running after virt-launcher exited, sending SIGTERM")
        .is_none());
}

#[test]
fn crashing_qemu_makes_the_launcher_fail() {
    let tmp = tempfile::tempdir().unwrap();
    let mut m = monitor_with_launcher(tmp.path(), &[]);
    let monitor = m.pid();
    assert!(wait_until(Duration::from_secs(30), || {
        !procfs::qemu_children(monitor).is_empty()
    }));
    let qemu = procfs::qemu_children(monitor)[0].pid;
    assert!(wait_until(Duration::from_secs(30), || m
        .record("domain started, watching QEMU")
        .is_some()));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(qemu), Signal::SIGKILL).unwrap();
    let status = m
        .wait_timeout(Duration::from_secs(30))
        .expect("monitor exits");
    assert_eq!(status.code(), Some(1));
    let failed = m.record("virt-launcher failed").expect("failure logged");
    assert_eq!(
        failed["reason"],
        "QEMU exited unexpectedly: QEMU exited without a shutdown request"
    );
    assert_eq!(failed["level"], "error");
    let reaped = m.record("QEMU exited").expect("the monitor reaped QEMU");
    assert_eq!(reaped["code"], 128 + 9);
}

#[test]
fn no_domain_within_qemu_timeout_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(bin());
    cmd.arg("monitor")
        .args(launcher_flags(tmp.path(), &["--qemu-timeout", "1s"]))
        .env_remove(TEST_LAUNCHER_ENV);
    let mut m = Running::start(cmd, &tmp.path().join("monitor.log"));
    let status = m
        .wait_timeout(Duration::from_secs(30))
        .expect("monitor exits");
    assert_eq!(status.code(), Some(1));
    let failed = m.record("virt-launcher failed").expect("failure logged");
    assert_eq!(
        failed["reason"],
        "timed out waiting for domain to be defined: no QEMU started within --qemu-timeout 1s"
    );
}

#[test]
fn argv0_dispatch() {
    let tmp = tempfile::tempdir().unwrap();
    let link = tmp.path().join("virt-launcher");
    std::os::unix::fs::symlink(bin(), &link).unwrap();
    let out = Command::new(&link)
        .args(launcher_flags(
            tmp.path(),
            &["--grace-period-seconds", "soon"],
        ))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let line: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stderr).lines().next().unwrap()).unwrap();
    assert_eq!(line["component"], "virt-launcher");
    assert_eq!(
        line["error"],
        "flag --grace-period-seconds: \"soon\" is not an integer"
    );
}

#[test]
fn guest_powers_off_on_sigterm_within_the_grace_period() {
    let tmp = tempfile::tempdir().unwrap();
    let serial = tmp.path().join("serial.log");
    let mut cmd = Command::new(bin());
    cmd.arg("monitor")
        .args(launcher_flags(
            tmp.path(),
            &["--grace-period-seconds", "120"],
        ))
        .envs(static_launcher_with_guest(tmp.path(), &serial))
        .env("QLAUNCHER_LOG", "debug");
    let mut m = Running::start(cmd, &tmp.path().join("monitor.log"));
    let serial_has = |marker: &str| {
        std::fs::read_to_string(&serial).is_ok_and(|s| s.lines().any(|l| l.contains(marker)))
    };
    assert!(
        wait_until(Duration::from_secs(180), || serial_has("QLG: http ready")),
        "guest did not boot"
    );
    m.signal(Signal::SIGTERM);
    let status = m
        .wait_timeout(Duration::from_secs(120))
        .expect("monitor exits");
    assert_eq!(status.code(), Some(0));
    assert!(serial_has("QLG: poweroff"));
    let gone = m.record("QEMU is gone").expect("ending logged");
    assert_eq!(gone["ending"], "ShutDownGracefully");
    assert!(m.record("grace period expired, killing QEMU").is_none());
}

#[test]
fn keep_after_failure_waits_for_a_signal() {
    let tmp = tempfile::tempdir().unwrap();
    let mut m = monitor_with_script(tmp.path(), "exit 3", &["--keep-after-failure"]);
    assert!(wait_until(Duration::from_secs(20), || m
        .record("keeping the monitor alive after the failure (--keep-after-failure)")
        .is_some()));
    assert!(m.wait_timeout(Duration::from_millis(500)).is_none());
    m.signal(Signal::SIGTERM);
    let status = m
        .wait_timeout(Duration::from_secs(20))
        .expect("monitor exits");
    assert_eq!(status.code(), Some(3));
}

#[test]
fn unreadable_standalone_vmi_fails_the_launcher() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(bin())
        .arg("launcher")
        .args(launcher_flags(tmp.path(), &[]))
        .env("STANDALONE_VMI", "{unclosed")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let failed: serde_json::Value = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|r| r["msg"] == "virt-launcher failed")
        .expect("failure logged");
    let reason = failed["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("reading the VMI from STANDALONE_VMI: "),
        "{reason}"
    );
}
