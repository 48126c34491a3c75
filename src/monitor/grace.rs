//! Graceful shutdown of a running domain: KubeVirt's `ProcessMonitor` grace logic
//! (`pkg/virt-launcher/monitor.go` of v1.9.0) over a QEMU pid.
//!
//! On the first stop request (SIGTERM to the launcher) the domain is marked as shutting down
//! gracefully, the graceful shutdown is sent (the guest agent or the ACPI power button) and sent
//! again every [`SHUTDOWN_RESEND`], and a timer of `--grace-period-seconds` starts.
//! When QEMU is still there when it runs out, QEMU is killed the way libvirt destroys a domain
//! (`virProcessKillPainfully`): SIGTERM, then SIGKILL after [`KILL_ESCALATION`].
use std::future::Future;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::watch;
use tracing::{info, warn};

use super::qemu::Qemu;
use super::MonitorError;

/// Time between the SIGTERM and the SIGKILL of a kill (libvirt waits 10 s).
pub const KILL_ESCALATION: Duration = Duration::from_secs(10);

/// Time between two graceful shutdown requests during the grace period: virt-handler sends
/// `SignalShutdownVMI` again every 5 s, since a booting guest can miss an ACPI event and its
/// agent may connect later (`pkg/virt-handler/vm.go`, v1.9.0).
pub const SHUTDOWN_RESEND: Duration = Duration::from_secs(5);

/// The domain operations the grace logic needs. The sync module implements it over its QMP
/// connection; tests implement it with a bare QMP socket.
pub trait DomainControl: Send + Sync {
    /// Records that the shutdown is graceful (KubeVirt's `MarkGracefulShutdownVMI`, reported to
    /// virt-handler in the domain metadata). The default does nothing.
    fn mark_graceful_shutdown(&self) {}

    /// Sends the graceful shutdown: the guest agent's `guest-shutdown` when it is connected, or
    /// the ACPI power button (QMP `system_powerdown`). Called again every [`SHUTDOWN_RESEND`].
    fn power_button(&self) -> impl Future<Output = Result<(), MonitorError>> + Send;
}

/// How a supervised QEMU ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// QEMU exited while no stop had been requested (guest poweroff, crash, external kill).
    ExitedOnItsOwn,
    /// QEMU exited within the grace period after the power button.
    ShutDownGracefully,
    /// The grace period ran out and QEMU was killed.
    KilledAfterGracePeriod,
}

/// Resolves when `stop` holds `true` (never, if the sender is gone without setting it).
pub async fn stop_requested(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Kills QEMU as libvirt's destroy does: SIGTERM, then SIGKILL after `escalation`; returns when
/// it has exited.
pub async fn kill(qemu: &Qemu, escalation: Duration) -> Result<(), MonitorError> {
    qemu.signal(Signal::SIGTERM)?;
    if tokio::time::timeout(escalation, qemu.exited())
        .await
        .is_err()
    {
        warn!(pid = qemu.pid(), "QEMU ignored SIGTERM, sending SIGKILL");
        qemu.signal(Signal::SIGKILL)?;
        qemu.exited().await;
    }
    Ok(())
}

/// Watches `qemu` until it exits. When `stop` turns `true` first: marks the graceful shutdown,
/// sends it ([`DomainControl::power_button`]) and again every [`SHUTDOWN_RESEND`], and kills
/// QEMU after `grace` ([`kill`]). A failing request is logged; the grace timer still runs.
pub async fn supervise<D: DomainControl>(
    qemu: &Qemu,
    domain: &D,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
) -> Result<Ending, MonitorError> {
    tokio::select! {
        _ = qemu.exited() => return Ok(Ending::ExitedOnItsOwn),
        _ = stop_requested(&mut stop) => {}
    }
    info!(
        pid = qemu.pid(),
        grace_seconds = grace.as_secs(),
        "graceful shutdown requested"
    );
    domain.mark_graceful_shutdown();
    let deadline = tokio::time::Instant::now() + grace;
    loop {
        if let Err(e) = domain.power_button().await {
            warn!(
                error = &e as &dyn std::error::Error,
                "graceful shutdown request failed"
            );
        }
        let resend = (tokio::time::Instant::now() + SHUTDOWN_RESEND).min(deadline);
        tokio::select! {
            _ = qemu.exited() => return Ok(Ending::ShutDownGracefully),
            _ = tokio::time::sleep_until(resend) => {}
        }
        if tokio::time::Instant::now() >= deadline {
            info!(pid = qemu.pid(), "grace period expired, killing QEMU");
            kill(qemu, KILL_ESCALATION).await?;
            return Ok(Ending::KilledAfterGracePeriod);
        }
    }
}
