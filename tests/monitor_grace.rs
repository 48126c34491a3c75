//! The grace-period logic over a real QEMU: a QEMU without a guest ignores the ACPI power button
//! and is killed when the grace period ends; a QEMU that stops by itself is reported as such.

use std::time::{Duration, Instant};

use qlauncher::monitor::grace::{supervise, DomainControl, Ending};
use qlauncher::monitor::qemu::{spawn_detached, Qemu};
use qlauncher::monitor::MonitorError;
use testkit::monitor::idle_qemu_argv;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;

/// Kills QEMU on drop through its pidfd (it is not our child, and its pid may be recycled).
struct KillOnDrop(Qemu);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.signal(nix::sys::signal::Signal::SIGKILL);
    }
}

/// Talks QMP to one socket: enough for `system_powerdown` and `quit`.
struct Qmp(std::path::PathBuf);

impl Qmp {
    async fn execute(&self, command: &str) -> std::io::Result<String> {
        let stream = tokio::net::UnixStream::connect(&self.0).await?;
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        lines.next_line().await?;
        let mut last = String::new();
        for cmd in ["qmp_capabilities", command] {
            write
                .write_all(format!("{{\"execute\":\"{cmd}\"}}\n").as_bytes())
                .await?;
            loop {
                let line = lines.next_line().await?.unwrap_or_default();
                if line.is_empty() || line.contains("\"return\"") || line.contains("\"error\"") {
                    last = line;
                    break;
                }
            }
        }
        Ok(last)
    }
}

struct PowerButton {
    qmp: Qmp,
    marked: std::sync::atomic::AtomicBool,
    presses: std::sync::atomic::AtomicU32,
}

impl DomainControl for PowerButton {
    fn mark_graceful_shutdown(&self) {
        self.marked.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    async fn power_button(&self) -> Result<(), MonitorError> {
        self.presses
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let reply = self
            .qmp
            .execute("system_powerdown")
            .await
            .map_err(MonitorError::PowerButton)?;
        assert_eq!(reply, "{\"return\": {}}");
        Ok(())
    }
}

async fn start_idle_qemu(dir: &std::path::Path) -> (KillOnDrop, PowerButton) {
    let qmp = dir.join("qmp.sock");
    let argv = idle_qemu_argv(&qmp);
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    let detached = spawn_detached(cmd).unwrap();
    let qemu = KillOnDrop(Qemu::from_pid(detached.pid).unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::UnixStream::connect(&qmp).await.is_err() {
        assert!(Instant::now() < deadline, "no QMP socket");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let control = PowerButton {
        qmp: Qmp(qmp),
        marked: false.into(),
        presses: 0.into(),
    };
    (qemu, control)
}

/// The button is pressed again every 5 s of the grace period (virt-handler's re-send), then QEMU
/// is killed: 7 s of grace give the presses at 0 s and 5 s.
#[tokio::test]
async fn qemu_ignoring_the_power_button_is_killed_when_the_grace_period_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let (guard, control) = start_idle_qemu(tmp.path()).await;
    let qemu = &guard.0;
    let (tx, rx) = watch::channel(false);
    tx.send(true).unwrap();
    let started = Instant::now();
    let ending = supervise(qemu, &control, rx, Duration::from_secs(7))
        .await
        .unwrap();
    assert_eq!(ending, Ending::KilledAfterGracePeriod);
    assert!(started.elapsed() >= Duration::from_secs(7));
    assert_eq!(control.presses.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert!(control.marked.load(std::sync::atomic::Ordering::SeqCst));
    assert!(qemu.has_exited());
}

#[tokio::test]
async fn qemu_quitting_by_itself_ends_supervision() {
    let tmp = tempfile::tempdir().unwrap();
    let (guard, control) = start_idle_qemu(tmp.path()).await;
    let qemu = &guard.0;
    let (_tx, rx) = watch::channel(false);
    let supervised = supervise(qemu, &control, rx, Duration::from_secs(30));
    let quit = async {
        control.qmp.execute("quit").await.unwrap();
    };
    let (ending, ()) = tokio::join!(supervised, quit);
    assert_eq!(ending.unwrap(), Ending::ExitedOnItsOwn);
    assert!(!control.marked.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(control.presses.load(std::sync::atomic::Ordering::SeqCst), 0);
}
