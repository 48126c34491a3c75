//! `qlauncher-static-launcher`: qlauncher's launcher lifecycle (flags, JSON log, directories,
//! `--qemu-timeout`, grace period; [`qlauncher::monitor::launcher`]) whose domain is one fixed
//! QEMU command line instead of a SyncVMI, for the monitor's process tests (`tests/monitor_*.rs`).
//!
//! A test makes `qlauncher monitor` run it in place of `qlauncher launcher` through
//! `QLAUNCHER_TEST_LAUNCHER` and gives the domain as JSON `{"argv": [...], "qmp": "/path"}` in
//! `QLAUNCHER_STATIC_QEMU` (`testkit::monitor::static_launcher`). It is a binary of the qlauncher
//! package built only with the `static-launcher` feature, which only the test kit turns on: the
//! product binary carries no test hook.

use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use qlauncher::monitor::grace::{DomainControl, Ending};
use qlauncher::monitor::launcher::{self, LauncherConfig, SupervisedDomain};
use qlauncher::monitor::qemu::spawn_detached;
use qlauncher::monitor::MonitorError;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tracing::warn;

/// JSON `{"argv": [...], "qmp": "/path/to/qmp.sock"}`: the QEMU to start as the domain.
const STATIC_QEMU_ENV: &str = "QLAUNCHER_STATIC_QEMU";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    launcher::main(&args, run)
}

async fn run(config: LauncherConfig, stop: watch::Receiver<bool>) -> Result<(), MonitorError> {
    let spec = std::env::var(STATIC_QEMU_ENV).map_err(|e| MonitorError::ParseFlag {
        flag: STATIC_QEMU_ENV.into(),
        reason: e.to_string(),
    })?;
    let domain = StaticQemu::from_spec(&spec)?;
    launcher::run(&config, &domain, stop).await?;
    Ok(())
}

/// A domain that is one fixed QEMU command line with a QMP socket.
struct StaticQemu {
    argv: Vec<String>,
    qmp: String,
    powerdown_sent: AtomicBool,
    last_stderr: Arc<Mutex<Option<String>>>,
}

impl StaticQemu {
    fn from_spec(spec: &str) -> Result<Self, MonitorError> {
        #[derive(serde::Deserialize)]
        struct Spec {
            argv: Vec<String>,
            qmp: String,
        }
        let spec: Spec = serde_json::from_str(spec).map_err(|e| MonitorError::ParseFlag {
            flag: STATIC_QEMU_ENV.into(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            argv: spec.argv,
            qmp: spec.qmp,
            powerdown_sent: false.into(),
            last_stderr: Arc::default(),
        })
    }
}

impl DomainControl for StaticQemu {
    fn mark_graceful_shutdown(&self) {
        self.powerdown_sent.store(true, Ordering::SeqCst);
    }

    async fn power_button(&self) -> Result<(), MonitorError> {
        qmp_powerdown(&self.qmp)
            .await
            .map_err(MonitorError::PowerButton)
    }
}

impl SupervisedDomain for StaticQemu {
    async fn started(&self) -> Result<i32, MonitorError> {
        let (program, args) = self.argv.split_first().ok_or(MonitorError::ParseFlag {
            flag: STATIC_QEMU_ENV.into(),
            reason: "empty argv".into(),
        })?;
        let mut command = std::process::Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let qemu = spawn_detached(command)?;
        if let Some(stderr) = qemu.stderr {
            let last = self.last_stderr.clone();
            if let Ok(stderr) = tokio::process::ChildStderr::from_std(stderr) {
                tokio::spawn(async move {
                    let mut lines = BufReader::new(stderr).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        warn!(component_output = "qemu", line = %line, "QEMU stderr");
                        *last.lock().unwrap_or_else(|e| e.into_inner()) = Some(line);
                    }
                });
            }
        }
        // Wait for the QMP socket to accept, as libvirt waits for QEMU's monitor.
        for _ in 0..100 {
            if tokio::net::UnixStream::connect(&self.qmp).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(qemu.pid)
    }

    async fn check_exit(&self, ending: Ending) -> Result<(), MonitorError> {
        if ending != Ending::ExitedOnItsOwn || self.powerdown_sent.load(Ordering::SeqCst) {
            return Ok(());
        }
        // Let the stderr reader catch the last line.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let last = self
            .last_stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Err(MonitorError::QemuExited {
            reason: last.unwrap_or_else(|| "QEMU exited without a shutdown request".into()),
        })
    }
}

/// Sends `system_powerdown` over a fresh QMP connection.
async fn qmp_powerdown(path: &str) -> std::io::Result<()> {
    let stream = tokio::net::UnixStream::connect(path).await?;
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    lines.next_line().await?; // greeting
    for cmd in [
        "{\"execute\":\"qmp_capabilities\"}\n",
        "{\"execute\":\"system_powerdown\"}\n",
    ] {
        write.write_all(cmd.as_bytes()).await?;
        loop {
            let Some(line) = lines.next_line().await? else {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            };
            if line.contains("\"return\"") || line.contains("\"error\"") {
                break;
            }
        }
    }
    Ok(())
}
