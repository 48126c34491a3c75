//! Lifecycle control and the mapping of QEMU's run state and events to KubeVirt's domain states.
//!
//! KubeVirt reads libvirt's domain state and reason (`pkg/virt-launcher/virtwrap/api/types.go`:
//! `LifeCycle` and `StateChangeReason`) and reports them to virt-handler. Without libvirt, the
//! same values are derived here from QMP: `query-status` at connect time, then events. The rules
//! follow libvirt's QEMU driver (`qemu_process.c` event handlers): a guest-initiated SHUTDOWN is
//! `ShuttingDown/User` until QEMU exits (`Shutoff/Shutdown`); a host-initiated one (quit, signal)
//! ends as `Shutoff/Destroyed`; a panic is `Crashed/Panicked` and ends as `Shutoff/Crashed`; an
//! exit without any SHUTDOWN is `Shutoff/Crashed`; `BLOCK_IO_ERROR` with action `stop` pauses with
//! `IOError`, and the STOP that QEMU emits right after keeps that reason.

use super::client::{Event, EventStream, QmpClient};
use super::commands;
use super::QmpError;

/// KubeVirt's `LifeCycle` values (the strings virt-handler expects).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DomainState {
    /// `NoState`: no information yet.
    NoState,
    /// `Running`.
    Running,
    /// `Paused`.
    Paused,
    /// `ShuttingDown` (libvirt's VIR_DOMAIN_SHUTDOWN).
    ShuttingDown,
    /// `Shutoff`.
    Shutoff,
    /// `Crashed`.
    Crashed,
    /// `PMSuspended` (S3/S4).
    PmSuspended,
}

impl DomainState {
    /// The string KubeVirt uses.
    pub fn as_str(self) -> &'static str {
        match self {
            DomainState::NoState => "NoState",
            DomainState::Running => "Running",
            DomainState::Paused => "Paused",
            DomainState::ShuttingDown => "ShuttingDown",
            DomainState::Shutoff => "Shutoff",
            DomainState::Crashed => "Crashed",
            DomainState::PmSuspended => "PMSuspended",
        }
    }
}

/// KubeVirt's `StateChangeReason` values used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateReason {
    /// `Unknown`.
    Unknown,
    /// `User`: paused by a `stop`, or shutting down at the guest's or user's request.
    User,
    /// `IOError`: paused by a disk error with `werror/rerror=stop`.
    IoError,
    /// `Watchdog`: paused by the watchdog action.
    Watchdog,
    /// `Migration`: paused for an incoming or finished migration.
    Migration,
    /// `StartingUp`: started with `-S`, before `cont`.
    StartingUp,
    /// `Shutdown`: QEMU exited after the guest shut down.
    Shutdown,
    /// `Destroyed`: QEMU exited at the host's request (quit, SIGTERM, SIGKILL).
    Destroyed,
    /// `Crashed`: QEMU exited after a guest panic or without any SHUTDOWN event.
    Crashed,
    /// `Panicked`: the guest panicked (GUEST_PANICKED, pvpanic).
    Panicked,
    /// `Dump`: paused while its memory is dumped (libvirt's core dump without `VIR_DUMP_LIVE`).
    Dump,
    /// `Migrated`: QEMU was stopped after its state migrated to the target (libvirt's
    /// `VIR_DOMAIN_SHUTOFF_MIGRATED`).
    Migrated,
}

impl StateReason {
    /// The string KubeVirt uses.
    pub fn as_str(self) -> &'static str {
        match self {
            StateReason::Unknown => "Unknown",
            StateReason::User => "User",
            StateReason::IoError => "IOError",
            StateReason::Watchdog => "Watchdog",
            StateReason::Migration => "Migration",
            StateReason::StartingUp => "StartingUp",
            StateReason::Shutdown => "Shutdown",
            StateReason::Destroyed => "Destroyed",
            StateReason::Crashed => "Crashed",
            StateReason::Panicked => "Panicked",
            StateReason::Dump => "Dump",
            StateReason::Migrated => "Migrated",
        }
    }
}

/// Who asked for the shutdown in progress, remembered until QEMU exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShutdownOrigin {
    /// The guest (ACPI poweroff, triple fault, `guest-shutdown`, `guest-reset` with reboot=shutdown).
    Guest,
    /// The host (`quit`, a signal to QEMU, `host-ui`).
    Host,
    /// The guest panicked.
    Panic,
}

/// A domain state, its reason, and the shutdown origin needed to name the final Shutoff reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DomainStatus {
    /// The state.
    pub state: DomainState,
    /// Why it is in that state.
    pub reason: StateReason,
    /// Set by SHUTDOWN / GUEST_PANICKED until QEMU exits.
    pub shutdown: Option<ShutdownOrigin>,
}

impl DomainStatus {
    /// A status without shutdown origin.
    pub const fn new(state: DomainState, reason: StateReason) -> Self {
        DomainStatus {
            state,
            reason,
            shutdown: None,
        }
    }
}

impl Default for DomainStatus {
    fn default() -> Self {
        DomainStatus::new(DomainState::NoState, StateReason::Unknown)
    }
}

/// What changes the domain state: a QMP event, or QEMU exiting.
#[derive(Debug, Clone, PartialEq)]
pub enum LifecycleInput {
    /// A QMP event (any; events that do not change the state leave it as it is).
    Event(Event),
    /// The QEMU process exited (status already reaped).
    QemuExited,
}

/// Maps `query-status`'s `status` (QEMU's `RunState`) to a domain status; unknown values, from a
/// newer QEMU, give `NoState/Unknown` rather than an error.
pub fn status_from_run_state(status: &str) -> DomainStatus {
    use DomainState as S;
    use StateReason as R;
    let (state, reason) = match status {
        "running" | "colo" => (S::Running, R::Unknown),
        "paused" | "debug" => (S::Paused, R::User),
        "prelaunch" => (S::Paused, R::StartingUp),
        "io-error" => (S::Paused, R::IoError),
        "watchdog" => (S::Paused, R::Watchdog),
        "inmigrate" | "postmigrate" | "finish-migrate" => (S::Paused, R::Migration),
        "internal-error" | "restore-vm" | "save-vm" => (S::Paused, R::Unknown),
        "shutdown" => (S::ShuttingDown, R::User),
        "guest-panicked" => (S::Crashed, R::Panicked),
        "suspended" => (S::PmSuspended, R::Unknown),
        _ => (S::NoState, R::Unknown),
    };
    DomainStatus::new(state, reason)
}

/// The pure transition function: the domain status after `input`, given the current one.
///
/// | input | result |
/// |---|---|
/// | RESUME | Running/Unknown, shutdown origin cleared |
/// | STOP | Paused/User, or unchanged when already Paused/IOError (the STOP after BLOCK_IO_ERROR) |
/// | BLOCK_IO_ERROR action=stop | Paused/IOError (other actions: unchanged) |
/// | SHUTDOWN guest=true (guest-shutdown, guest-reset, ...) | ShuttingDown/User, origin Guest |
/// | SHUTDOWN reason guest-panic | Crashed/Panicked, origin Panic |
/// | SHUTDOWN guest=false (host-qmp-quit, host-signal, host-ui, ...) | ShuttingDown/User, origin Host |
/// | GUEST_PANICKED | Crashed/Panicked, origin Panic |
/// | POWERDOWN, RESET, DEVICE_DELETED, NIC_RX_FILTER_CHANGED, unknown | unchanged (the guest may ignore the button; a reset keeps the run state) |
/// | QEMU exited | Shutoff/Shutdown (origin Guest), Destroyed (Host), Crashed (Panic or none) |
pub fn next_status(current: DomainStatus, input: &LifecycleInput) -> DomainStatus {
    use DomainState as S;
    use StateReason as R;
    let ev = match input {
        LifecycleInput::QemuExited => {
            let reason = match current.shutdown {
                Some(ShutdownOrigin::Guest) => R::Shutdown,
                Some(ShutdownOrigin::Host) => R::Destroyed,
                Some(ShutdownOrigin::Panic) | None => R::Crashed,
            };
            return DomainStatus {
                state: S::Shutoff,
                reason,
                shutdown: current.shutdown,
            };
        }
        LifecycleInput::Event(ev) => ev,
    };
    let with = |state, reason| DomainStatus {
        state,
        reason,
        shutdown: current.shutdown,
    };
    match ev.name.as_str() {
        // A resumed guest (also after a paused panic) is no longer on its way out.
        "RESUME" => DomainStatus::new(S::Running, R::Unknown),
        "STOP" => {
            if current.state == S::Paused && current.reason == R::IoError {
                current
            } else if current.shutdown.is_some() {
                // QEMU stops the VM as part of shutting down with -no-shutdown.
                current
            } else {
                with(S::Paused, R::User)
            }
        }
        "BLOCK_IO_ERROR" if ev.data["action"] == "stop" => with(S::Paused, R::IoError),
        "SHUTDOWN" => {
            let reason = ev.data["reason"].as_str().unwrap_or("");
            let guest = ev.data["guest"].as_bool().unwrap_or(false);
            if reason == "guest-panic" {
                DomainStatus {
                    state: S::Crashed,
                    reason: R::Panicked,
                    shutdown: Some(ShutdownOrigin::Panic),
                }
            } else {
                let origin = if guest {
                    ShutdownOrigin::Guest
                } else {
                    ShutdownOrigin::Host
                };
                DomainStatus {
                    state: S::ShuttingDown,
                    reason: R::User,
                    shutdown: Some(origin),
                }
            }
        }
        "GUEST_PANICKED" => DomainStatus {
            state: S::Crashed,
            reason: R::Panicked,
            shutdown: Some(ShutdownOrigin::Panic),
        },
        _ => current,
    }
}

/// Follows the domain status: a task applies [`next_status`] to every event of `events`, starting
/// from `initial` (usually [`query_status`]'s), and publishes each change. The task ends when the
/// connection closes; the owner of the process then applies [`LifecycleInput::QemuExited`].
pub fn track_status(
    mut events: EventStream,
    initial: DomainStatus,
) -> tokio::sync::watch::Receiver<DomainStatus> {
    let (tx, rx) = tokio::sync::watch::channel(initial);
    tokio::spawn(async move {
        let mut current = initial;
        while let Some(ev) = events.recv().await {
            let next = next_status(current, &LifecycleInput::Event(ev));
            if next != current {
                current = next;
                if tx.send(next).is_err() {
                    break;
                }
            }
        }
    });
    rx
}

/// `query-status`: QEMU's run state string (`running`, `paused`, `prelaunch`, ...) and the
/// matching domain status.
pub async fn query_status(client: &QmpClient) -> Result<(String, DomainStatus), QmpError> {
    let r = client.run(&commands::QueryStatus).await?;
    let domain = status_from_run_state(&r.status);
    Ok((r.status, domain))
}

/// `stop`: pauses the vCPUs (KubeVirt pause).
pub async fn pause(client: &QmpClient) -> Result<(), QmpError> {
    client.run(&commands::Stop).await.map(drop)
}

/// `cont`: resumes the vCPUs (KubeVirt unpause, and the start after `-S`).
pub async fn resume(client: &QmpClient) -> Result<(), QmpError> {
    client.run(&commands::Cont).await.map(drop)
}

/// `system_powerdown`: presses the ACPI power button; the guest may ignore it.
pub async fn powerdown(client: &QmpClient) -> Result<(), QmpError> {
    client.run(&commands::SystemPowerdown).await.map(drop)
}

/// `system_reset`: hard reset of the machine.
pub async fn reset(client: &QmpClient) -> Result<(), QmpError> {
    client.run(&commands::SystemReset).await.map(drop)
}

/// `quit`: QEMU exits right away (SHUTDOWN reason `host-qmp-quit`).
pub async fn quit(client: &QmpClient) -> Result<(), QmpError> {
    client.run(&commands::Quit).await.map(drop)
}

/// `set-action`: what QEMU does on guest shutdown/reboot/panic/watchdog, e.g.
/// `shutdown: pause, panic: pause` (the pre-start setting libvirt sends on 6.0+).
pub async fn set_action(client: &QmpClient, actions: &commands::SetAction) -> Result<(), QmpError> {
    client.run(actions).await.map(drop)
}

/// `inject-nmi`.
pub async fn inject_nmi(client: &QmpClient) -> Result<(), QmpError> {
    client.run(&commands::InjectNmi {}).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use DomainState as S;
    use StateReason as R;

    fn ev(name: &str, data: Value) -> LifecycleInput {
        LifecycleInput::Event(Event {
            name: name.into(),
            data,
            timestamp_us: 0,
        })
    }

    fn st(
        state: DomainState,
        reason: StateReason,
        shutdown: Option<ShutdownOrigin>,
    ) -> DomainStatus {
        DomainStatus {
            state,
            reason,
            shutdown,
        }
    }

    #[test]
    fn events_map_to_kubevirt_states() {
        let running = st(S::Running, R::Unknown, None);
        let paused_user = st(S::Paused, R::User, None);
        let io_paused = st(S::Paused, R::IoError, None);
        let cases: Vec<(&str, DomainStatus, LifecycleInput, DomainStatus)> = vec![
            (
                "resume after -S",
                st(S::Paused, R::StartingUp, None),
                ev("RESUME", Value::Null),
                running,
            ),
            (
                "stop pauses by user",
                running,
                ev("STOP", Value::Null),
                paused_user,
            ),
            (
                "resume after pause",
                paused_user,
                ev("RESUME", Value::Null),
                running,
            ),
            (
                "io error with stop action",
                running,
                ev(
                    "BLOCK_IO_ERROR",
                    json!({"device": "", "node-name": "libvirt-1-format", "operation": "write", "action": "stop", "nospace": false}),
                ),
                io_paused,
            ),
            (
                "stop after io error keeps IOError",
                io_paused,
                ev("STOP", Value::Null),
                io_paused,
            ),
            (
                "io error with report action",
                running,
                ev(
                    "BLOCK_IO_ERROR",
                    json!({"action": "report", "operation": "read"}),
                ),
                running,
            ),
            (
                "guest shutdown",
                running,
                ev(
                    "SHUTDOWN",
                    json!({"guest": true, "reason": "guest-shutdown"}),
                ),
                st(S::ShuttingDown, R::User, Some(ShutdownOrigin::Guest)),
            ),
            (
                "quit",
                running,
                ev(
                    "SHUTDOWN",
                    json!({"guest": false, "reason": "host-qmp-quit"}),
                ),
                st(S::ShuttingDown, R::User, Some(ShutdownOrigin::Host)),
            ),
            (
                "signal",
                paused_user,
                ev("SHUTDOWN", json!({"guest": false, "reason": "host-signal"})),
                st(S::ShuttingDown, R::User, Some(ShutdownOrigin::Host)),
            ),
            (
                "unknown future reason from the host",
                running,
                ev(
                    "SHUTDOWN",
                    json!({"guest": false, "reason": "brand-new-reason"}),
                ),
                st(S::ShuttingDown, R::User, Some(ShutdownOrigin::Host)),
            ),
            (
                "panic via shutdown reason",
                running,
                ev("SHUTDOWN", json!({"guest": true, "reason": "guest-panic"})),
                st(S::Crashed, R::Panicked, Some(ShutdownOrigin::Panic)),
            ),
            (
                "guest panicked",
                running,
                ev("GUEST_PANICKED", json!({"action": "pause"})),
                st(S::Crashed, R::Panicked, Some(ShutdownOrigin::Panic)),
            ),
            (
                "stop during shutdown",
                st(S::ShuttingDown, R::User, Some(ShutdownOrigin::Guest)),
                ev("STOP", Value::Null),
                st(S::ShuttingDown, R::User, Some(ShutdownOrigin::Guest)),
            ),
            (
                "resume after a paused panic",
                st(S::Crashed, R::Panicked, Some(ShutdownOrigin::Panic)),
                ev("RESUME", Value::Null),
                running,
            ),
            (
                "powerdown changes nothing",
                running,
                ev("POWERDOWN", Value::Null),
                running,
            ),
            (
                "reset changes nothing",
                running,
                ev(
                    "RESET",
                    json!({"guest": false, "reason": "host-qmp-system-reset"}),
                ),
                running,
            ),
            (
                "device deleted",
                running,
                ev(
                    "DEVICE_DELETED",
                    json!({"device": "ua-disk1", "path": "/machine/peripheral/ua-disk1"}),
                ),
                running,
            ),
            (
                "rx filter",
                running,
                ev(
                    "NIC_RX_FILTER_CHANGED",
                    json!({"name": "ua-net1", "path": "/machine/peripheral/ua-net1/virtio-backend"}),
                ),
                running,
            ),
            (
                "unknown event",
                running,
                ev("FUTURE_EVENT", json!({"x": 1})),
                running,
            ),
            (
                "exit after guest shutdown",
                st(S::ShuttingDown, R::User, Some(ShutdownOrigin::Guest)),
                LifecycleInput::QemuExited,
                st(S::Shutoff, R::Shutdown, Some(ShutdownOrigin::Guest)),
            ),
            (
                "exit after quit",
                st(S::ShuttingDown, R::User, Some(ShutdownOrigin::Host)),
                LifecycleInput::QemuExited,
                st(S::Shutoff, R::Destroyed, Some(ShutdownOrigin::Host)),
            ),
            (
                "exit after panic",
                st(S::Crashed, R::Panicked, Some(ShutdownOrigin::Panic)),
                LifecycleInput::QemuExited,
                st(S::Shutoff, R::Crashed, Some(ShutdownOrigin::Panic)),
            ),
            (
                "exit without shutdown",
                running,
                LifecycleInput::QemuExited,
                st(S::Shutoff, R::Crashed, None),
            ),
        ];
        for (name, from, input, want) in cases {
            assert_eq!(next_status(from, &input), want, "case {name}");
        }
    }

    #[test]
    fn run_states_map_to_kubevirt_states() {
        let cases = [
            ("running", S::Running, R::Unknown),
            ("paused", S::Paused, R::User),
            ("prelaunch", S::Paused, R::StartingUp),
            ("io-error", S::Paused, R::IoError),
            ("watchdog", S::Paused, R::Watchdog),
            ("inmigrate", S::Paused, R::Migration),
            ("shutdown", S::ShuttingDown, R::User),
            ("guest-panicked", S::Crashed, R::Panicked),
            ("suspended", S::PmSuspended, R::Unknown),
            ("from-the-future", S::NoState, R::Unknown),
        ];
        for (status, state, reason) in cases {
            assert_eq!(
                status_from_run_state(status),
                DomainStatus::new(state, reason),
                "status {status}"
            );
        }
    }

    #[test]
    fn kubevirt_strings() {
        assert_eq!(DomainState::ShuttingDown.as_str(), "ShuttingDown");
        assert_eq!(DomainState::PmSuspended.as_str(), "PMSuspended");
        assert_eq!(StateReason::IoError.as_str(), "IOError");
    }
}
