//! The target launcher's half of a migration, on the QMP and control-channel level: accept the
//! source's hello and definition, prepare the incoming QEMU (capabilities, parameters, NBD
//! exports, `migrate-incoming`), answer ready, and finish: wait until the incoming side
//! completed, stop the NBD server and `cont` unless the VMI was paused.
//!
//! The order follows libvirt's Prepare and Finish phases (`qemuMigrationDstPrepare`,
//! `qemuMigrationDstFinish` in `src/qemu/qemu_migration.c`), which KubeVirt's target launcher
//! relies on (`live-migration-target.go`, v1.9.0). Starting the QEMU process itself (with
//! `-S -incoming defer`, from [`RunningDomain::argv`]) is the caller's: it owns the process.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite};

use crate::qmp::migration::{
    BlockExportAddNbd, Capability, MigrateIncoming, MigrateSetCapabilities, MigrateSetParameters,
    NbdServerStart, NbdServerStop, QueryMigrate, SocketAddressLegacy,
};
use crate::qmp::QmpClient;
use crate::sync::migration::protocol::{
    hello_as_target, read_message, write_message, Message, ProtocolError, Ready, RunningDomain,
};
use crate::sync::migration::MigrationError;

/// Where the target's QEMU listens: the migration proxy's stream and NBD sockets in this pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSockets {
    /// The QEMU migration stream (`<uid>-49152-source.sock`).
    pub stream: PathBuf,
    /// The NBD server for copied disks (`<uid>-49153-source.sock`).
    pub nbd: PathBuf,
    /// Where QEMU itself listens for the stream when the launcher orders the multifd channels
    /// in front of it ([`order_channels`], QEMU before 8.0); a path of the launcher's private
    /// directory, writable by QEMU's user.
    pub ordered_stream: PathBuf,
}

/// The first four bytes of the main migration channel (`QEMU_VM_FILE_MAGIC`, "QEVM",
/// `migration/savevm.c`).
pub const MAIN_CHANNEL_MAGIC: [u8; 4] = *b"QEVM";

/// The first four bytes of a multifd channel (`MULTIFD_MAGIC` 0x11223344, big-endian, of the
/// initial packet, `migration/multifd.c`).
pub const MULTIFD_CHANNEL_MAGIC: [u8; 4] = [0x11, 0x22, 0x33, 0x44];

/// The first QEMU version whose incoming side tells the main channel from multifd channels by
/// their first bytes (`migration_ioc_process_incoming` peeks at the magic since 8.0). Before it,
/// the first connection QEMU accepts is taken as the main channel, which KubeVirt's migration
/// proxy does not guarantee: its per-connection dials to the target race, and a multifd
/// channel accepted first fails the migration (`multifd channel N: received packet magic
/// 5145564d expected 11223344`).
pub const PEEKS_CHANNEL_MAGIC: (u64, u64, u64) = (8, 0, 0);

/// True when the target QEMU of `version` with `multifd_channels` needs the launcher to order
/// the connections ([`order_channels`]).
pub fn needs_channel_order(version: (u64, u64, u64), multifd_channels: Option<u32>) -> bool {
    multifd_channels.is_some_and(|n| n > 0) && version < PEEKS_CHANNEL_MAGIC
}

/// How long [`order_channels`] keeps retrying a connection to QEMU's socket whose accept queue
/// is full (`EAGAIN`: QEMU 7.2 listens with a backlog of the channel count).
const QEMU_CONNECT_RETRY: Duration = Duration::from_secs(10);

/// Puts the main channel first in front of a QEMU that takes the first accepted connection as it
/// (before [`PEEKS_CHANNEL_MAGIC`]): accepts the migration proxy's connections on `listener`,
/// reads each one's first four bytes ([`MAIN_CHANNEL_MAGIC`], [`MULTIFD_CHANNEL_MAGIC`] or
/// anything else), connects to QEMU's own socket `qemu` for the main channel first and for
/// every other channel only after it (held until then, in their order of arrival), writes the
/// bytes read and copies both ways until either side closes. QEMU's listener accepts in the
/// order the connections were queued, so one connection at a time is made. Runs until the
/// listener fails or the task is dropped; copies already running go on until their sockets
/// close.
pub async fn order_channels(listener: tokio::net::UnixListener, qemu: PathBuf) {
    use tokio::io::AsyncReadExt;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut main_connected = false;
    let mut held: Vec<(tokio::net::UnixStream, [u8; 4])> = Vec::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((mut conn, _)) = accepted else { return };
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut head = [0u8; 4];
                    if conn.read_exact(&mut head).await.is_ok() {
                        let _ = tx.send((conn, head));
                    }
                });
            }
            Some((conn, head)) = rx.recv() => {
                let main = head == MAIN_CHANNEL_MAGIC;
                if !main && !main_connected {
                    tracing::debug!(held = held.len() + 1, "migration channel held until the main channel");
                    held.push((conn, head));
                    continue;
                }
                forward_channel(conn, head, &qemu).await;
                if main && !main_connected {
                    main_connected = true;
                    for (conn, head) in held.drain(..) {
                        forward_channel(conn, head, &qemu).await;
                    }
                }
            }
        }
    }
}

/// Connects to QEMU's socket `qemu` (retrying while its accept queue is full), sends `head`
/// and copies between it and `conn` in a task of its own. A channel QEMU cannot be reached for
/// is dropped: the source then fails the migration.
async fn forward_channel(conn: tokio::net::UnixStream, head: [u8; 4], qemu: &std::path::Path) {
    use tokio::io::AsyncWriteExt;
    let t0 = Instant::now();
    let mut upstream = loop {
        match tokio::net::UnixStream::connect(qemu).await {
            Ok(s) => break s,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    && t0.elapsed() < QEMU_CONNECT_RETRY =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, socket = %qemu.display(), "cannot pass a migration channel to QEMU");
                return;
            }
        }
    };
    tokio::spawn(async move {
        let mut conn = conn;
        if upstream.write_all(&head).await.is_ok() {
            let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
        }
    });
}

/// Aborts the task when dropped.
pub(super) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How the target's part ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetEnd {
    /// The domain runs here (or stays paused for a user-paused VMI).
    Completed {
        /// The domain was left paused.
        paused: bool,
    },
    /// The source reported a failure or an abort; the caller stops its QEMU.
    Failed {
        /// The source's reason.
        reason: String,
    },
}

/// How long the target waits for the incoming side to report `completed` after the source did.
pub const INCOMING_COMPLETION_TIMEOUT: Duration = Duration::from_secs(60);

/// One incoming migration on an accepted control connection.
pub struct TargetSession<S> {
    control: S,
    /// The source's running-domain definition.
    pub domain: RunningDomain,
    /// The channel ordering in front of QEMU's stream socket, while the session lives.
    channel_order: Option<AbortOnDrop>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> TargetSession<S> {
    /// Runs the hello (refusing another protocol version) and reads the source's definition.
    /// Errors: [`MigrationError::Protocol`]; a definition for another VMI is refused with
    /// [`MigrationError::Peer`] after telling the source.
    pub async fn accept(mut control: S, vmi_uid: &str) -> Result<TargetSession<S>, MigrationError> {
        hello_as_target(&mut control).await?;
        let domain = match read_message(&mut control).await? {
            Message::Prepare(d) => *d,
            Message::Abort => return Err(MigrationError::Aborted),
            other => {
                return Err(ProtocolError::Unexpected {
                    expected: "Prepare",
                    got: other.kind(),
                }
                .into())
            }
        };
        if domain.vmi_uid != vmi_uid {
            let reason = format!(
                "the target pod is prepared for VMI {vmi_uid}, the source sent VMI {}",
                domain.vmi_uid
            );
            let _ = write_message(
                &mut control,
                &Message::Failed {
                    reason: reason.clone(),
                },
            )
            .await;
            return Err(MigrationError::Peer(reason));
        }
        Ok(TargetSession {
            control,
            domain,
            channel_order: None,
        })
    }

    /// Tells the source that preparing failed (QEMU did not start, an image is missing).
    pub async fn fail(&mut self, reason: &str) {
        let _ = write_message(
            &mut self.control,
            &Message::Failed {
                reason: reason.to_owned(),
            },
        )
        .await;
    }

    /// Prepares the incoming QEMU `qmp` (started `-S -incoming defer` from the definition):
    /// capabilities (`events`, `return-path`, `late-block-activate` and the source's),
    /// `multifd-channels`, the NBD server with one writable export per copied disk, then
    /// `migrate-incoming unix:<stream>`; answers Ready. With multifd on a QEMU before 8.0
    /// ([`needs_channel_order`]) QEMU listens on `ordered_stream` instead and the launcher
    /// listens on `stream`, putting the main channel first ([`order_channels`]) for as long as
    /// the session lives.
    pub async fn incoming(
        &mut self,
        qmp: &QmpClient,
        sockets: &TargetSockets,
    ) -> Result<(), MigrationError> {
        let result = self.prepare_incoming(qmp, sockets).await;
        match result {
            Ok(ready) => {
                write_message(&mut self.control, &Message::Ready(ready)).await?;
                Ok(())
            }
            Err(e) => {
                self.fail(&e.to_string()).await;
                Err(e)
            }
        }
    }

    async fn prepare_incoming(
        &mut self,
        qmp: &QmpClient,
        sockets: &TargetSockets,
    ) -> Result<Ready, MigrationError> {
        let (ready, order) = prepare_incoming_qemu(qmp, &self.domain, sockets).await?;
        self.channel_order = order;
        Ok(ready)
    }

    /// Waits for the source's outcome. On success: waits until the incoming side reports
    /// `completed` (within [`INCOMING_COMPLETION_TIMEOUT`]), stops the NBD server, `cont`s unless
    /// the definition says paused, and answers Done. On failure or abort: answers Done and
    /// returns [`TargetEnd::Failed`] (the caller stops QEMU).
    ///
    /// With `postcopy-ram`, the guest is resumed here as soon as the incoming side enters
    /// `postcopy-active` (libvirt `cont`s at post-copy start): a QEMU started with `-S` stays
    /// paused in post-copy otherwise, and the guest would only run after the last page arrived.
    pub async fn finish(&mut self, qmp: &QmpClient) -> Result<TargetEnd, MigrationError> {
        let watcher = (!self.domain.paused
            && self.domain.capabilities.iter().any(|c| c == "postcopy-ram"))
        .then(|| tokio::spawn(resume_at_postcopy(qmp.clone())));
        let message = read_message(&mut self.control).await;
        if let Some(w) = watcher {
            w.abort();
        }
        let end = match message? {
            Message::Outcome(o) if o.completed => {
                complete_incoming(qmp, &self.domain).await?;
                TargetEnd::Completed {
                    paused: self.domain.paused,
                }
            }
            Message::Outcome(o) => TargetEnd::Failed {
                reason: o
                    .reason
                    .unwrap_or_else(|| "the source's migration failed".into()),
            },
            Message::Abort => TargetEnd::Failed {
                reason: super::metadata::ABORTED_REASON.into(),
            },
            Message::Failed { reason } => TargetEnd::Failed { reason },
            other => {
                return Err(ProtocolError::Unexpected {
                    expected: "Outcome",
                    got: other.kind(),
                }
                .into())
            }
        };
        let _ = write_message(&mut self.control, &Message::Done).await;
        Ok(end)
    }
}

/// The incoming QEMU `qmp` (started `-S -incoming defer` from `domain`'s definition) made ready
/// for the stream: capabilities (`events`, `return-path`, `late-block-activate` and the
/// source's), `multifd-channels`, the NBD server with one writable export per copied disk, then
/// `migrate-incoming unix:<stream>`. With multifd on a QEMU before 8.0 ([`needs_channel_order`])
/// QEMU listens on `ordered_stream` and the launcher on `stream`, putting the main channel first
/// ([`order_channels`]) for as long as the returned guard lives. Shared by qlauncher's own
/// control protocol ([`TargetSession::incoming`]) and libvirt's (`super::libvirt_peer`).
pub(super) async fn prepare_incoming_qemu(
    qmp: &QmpClient,
    domain: &RunningDomain,
    sockets: &TargetSockets,
) -> Result<(Ready, Option<AbortOnDrop>), MigrationError> {
    let mut caps = vec![
        Capability::Events,
        Capability::ReturnPath,
        Capability::LateBlockActivate,
    ];
    for c in &domain.capabilities {
        let c = target_capability(c).ok_or_else(|| {
            MigrationError::Peer(format!("the source asks for unknown capability {c:?}"))
        })?;
        if !caps.contains(&c) {
            caps.push(c);
        }
    }
    qmp.run(&MigrateSetCapabilities::enable(&caps)).await?;
    if let Some(n) = domain.multifd_channels {
        qmp.run(&MigrateSetParameters {
            multifd_channels: Some(n),
            ..Default::default()
        })
        .await?;
    }
    let mut exports = Vec::new();
    if !domain.copied_disks.is_empty() {
        let _ = std::fs::remove_file(&sockets.nbd);
        qmp.run(&NbdServerStart {
            addr: SocketAddressLegacy::Unix {
                path: sockets.nbd.display().to_string(),
            },
        })
        .await?;
        for d in &domain.copied_disks {
            qmp.run(&BlockExportAddNbd::writable(&d.node, &d.export))
                .await?;
            exports.push(d.export.clone());
        }
    }
    let _ = std::fs::remove_file(&sockets.stream);
    let ordered = needs_channel_order(qmp.greeting().version, domain.multifd_channels);
    let listen = if ordered {
        let _ = std::fs::remove_file(&sockets.ordered_stream);
        &sockets.ordered_stream
    } else {
        &sockets.stream
    };
    qmp.run(&MigrateIncoming {
        uri: format!("unix:{}", listen.display()),
    })
    .await?;
    let mut guard = None;
    if ordered {
        let listener = tokio::net::UnixListener::bind(&sockets.stream).map_err(|e| {
            MigrationError::Peer(format!(
                "cannot listen for the migration stream on {}: {e}",
                sockets.stream.display()
            ))
        })?;
        tracing::info!(
            channels = domain.multifd_channels.unwrap_or(0),
            "QEMU before 8.0 takes the first connection as the main channel: the launcher \
             orders the multifd channels"
        );
        let qemu = sockets.ordered_stream.clone();
        guard = Some(AbortOnDrop(tokio::spawn(order_channels(listener, qemu))));
    }
    Ok((
        Ready {
            nbd_exports: exports,
        },
        guard,
    ))
}

/// The end of a successful incoming migration of `domain` on `qmp`: waits until the incoming
/// side reports `completed` (within [`INCOMING_COMPLETION_TIMEOUT`]), stops the NBD server when
/// disks were copied, and `cont`s unless the domain was paused (libvirt's Finish,
/// `qemuMigrationDstFinish`).
pub(super) async fn complete_incoming(
    qmp: &QmpClient,
    domain: &RunningDomain,
) -> Result<(), MigrationError> {
    wait_incoming_completed(qmp).await?;
    if !domain.copied_disks.is_empty() {
        qmp.run(&NbdServerStop).await?;
    }
    if !domain.paused {
        crate::qmp::lifecycle::resume(qmp).await?;
    }
    Ok(())
}

/// Polls the incoming side and `cont`s once it is in `postcopy-active` and the device state is
/// loaded (QEMU's run state left `inmigrate`: the incoming side reports `postcopy-active` from
/// the listen phase on, and refuses `cont` until the source's run command); ends there or when
/// the incoming migration ended otherwise.
async fn resume_at_postcopy(qmp: QmpClient) {
    loop {
        match qmp.run(&QueryMigrate).await.map(|i| i.status) {
            Ok(Some(s)) if s == "postcopy-active" => {
                let loaded = crate::qmp::lifecycle::query_status(&qmp)
                    .await
                    .is_ok_and(|(state, _)| state == "paused");
                if loaded && crate::qmp::lifecycle::resume(&qmp).await.is_ok() {
                    return;
                }
            }
            Ok(Some(s)) if s == "completed" || s == "failed" || s == "cancelled" => return,
            Err(_) => return,
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The capabilities the source may ask the target to mirror.
fn target_capability(name: &str) -> Option<Capability> {
    serde_json::from_value::<Capability>(serde_json::Value::String(name.to_owned()))
        .ok()
        .filter(|c| {
            matches!(
                c,
                Capability::Multifd | Capability::PostcopyRam | Capability::DirtyBitmaps
            )
        })
}

async fn wait_incoming_completed(qmp: &QmpClient) -> Result<(), MigrationError> {
    let t0 = Instant::now();
    loop {
        let info = qmp.run(&QueryMigrate).await?;
        match info.status.as_deref() {
            Some("completed") => return Ok(()),
            Some("failed") | Some("cancelled") => {
                return Err(MigrationError::Qemu(
                    info.error_desc
                        .unwrap_or_else(|| "the incoming migration failed".into()),
                ))
            }
            _ => {}
        }
        if t0.elapsed() > INCOMING_COMPLETION_TIMEOUT {
            return Err(MigrationError::Timeout(format!(
                "the incoming migration did not complete within {INCOMING_COMPLETION_TIMEOUT:?} \
                 after the source's"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// QEMU's argv for the incoming side: the target's own conversion of the VMI (`local`, trusted:
/// the target never runs argv words it received), with the machine type replaced by the
/// source's resolved one and `-incoming defer` appended (`local` already holds `-S`).
///
/// When the source sent its argv, it must equal `local` word for word apart from the machine
/// type: a different device model (another qlauncher version rendering differently, or a VMI
/// spec changed since the source started) cannot take the source's device state, so the
/// migration is refused naming the first difference. An operator's second QMP monitor (`-qmp`,
/// [`crate::sync::config::SyncConfig::operator_qmp_socket`]) is left out of the comparison: it
/// is each launcher's own setting and carries no device state.
pub fn incoming_argv(
    local: &[String],
    domain: &RunningDomain,
) -> Result<Vec<String>, MigrationError> {
    let valid_machine = !domain.machine.is_empty()
        && domain
            .machine
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_');
    if !valid_machine {
        return Err(MigrationError::Peer(format!(
            "invalid machine type {:?} in the source's definition",
            domain.machine
        )));
    }
    let with_machine = |argv: &[String]| -> Vec<String> {
        let mut out = argv.to_vec();
        for i in 1..out.len() {
            if out[i - 1] == "-machine" {
                let rest = out[i].find(',').map_or("", |p| &out[i][p..]).to_owned();
                out[i] = format!("{}{rest}", domain.machine);
            }
        }
        out
    };
    let mut argv = with_source_rtc(&with_machine(local), &domain.argv);
    if argv.iter().any(|w| w == "-incoming") {
        return Err(MigrationError::Peer(
            "the local argv already has -incoming".into(),
        ));
    }
    if !domain.argv.is_empty() {
        let theirs = without_operator_monitor(&with_machine(&domain.argv));
        let argv = without_operator_monitor(&argv);
        if let Some(i) = (0..argv.len().max(theirs.len())).find(|&i| argv.get(i) != theirs.get(i)) {
            return Err(MigrationError::Peer(format!(
                "the target's QEMU definition differs from the source's at word {i}: target {:?}, \
                 source {:?}",
                argv.get(i),
                theirs.get(i)
            )));
        }
    }
    argv.extend(["-incoming".to_owned(), "defer".to_owned()]);
    Ok(argv)
}

/// `local` with the source's `-rtc` value when the two differ only in their start date
/// (`base=YYYY-MM-DDTHH:MM:SS`, a clock shifted by `utc.offsetSeconds` or a hook's
/// `adjustment`): each launcher computes that date from the time it converted the VMI, and
/// QEMU migrates the RTC's state, so the target starts from the source's date, as the rest of
/// its definition is the source's. Other `-rtc` differences stay differences.
fn with_source_rtc(local: &[String], theirs: &[String]) -> Vec<String> {
    let rtc = |argv: &[String]| {
        argv.windows(2)
            .position(|w| w[0] == "-rtc")
            .map(|i| (i + 1, argv[i + 1].clone()))
    };
    // The start date and the options after it.
    let split = |v: &str| -> Option<(String, String)> {
        let rest = v.strip_prefix("base=")?;
        let (date, opts) = rest.split_once(',').unwrap_or((rest, ""));
        let dated = date.len() == 19
            && date.as_bytes()[10] == b'T'
            && date
                .bytes()
                .all(|b| b.is_ascii_digit() || b"-:T".contains(&b));
        dated.then(|| (date.to_owned(), opts.to_owned()))
    };
    let mut out = local.to_vec();
    if let (Some((i, ours)), Some((_, source))) = (rtc(local), rtc(theirs)) {
        if let (Some((_, a)), Some((_, b))) = (split(&ours), split(&source)) {
            if a == b {
                out[i] = source;
            }
        }
    }
    out
}

/// `argv` without its `-qmp <chardev>` pairs: the launcher's own monitor is a `-chardev` and
/// `-mon` pair, so a `-qmp` is only ever the operator's second monitor.
fn without_operator_monitor(argv: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut words = argv.iter();
    while let Some(w) = words.next() {
        if w == "-qmp" {
            words.next();
            continue;
        }
        out.push(w.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Either launcher may have an operator's QMP monitor (`QLAUNCHER_OPERATOR_QMP`): the
    /// comparison skips it, and the target keeps its own.
    #[test]
    fn an_operators_qmp_monitor_on_either_side_is_not_a_difference() {
        let local =
            words("-name guest=x -S -machine q35 -m 128 -qmp unix:/t.sock,server=on,wait=off");
        let source = domain("pc-q35-7.2", "-name guest=x -S -machine q35 -m 128");
        let argv = incoming_argv(&local, &source).unwrap();
        assert_eq!(
            argv,
            words(
                "-name guest=x -S -machine pc-q35-7.2 -m 128 -qmp unix:/t.sock,server=on,wait=off \
                 -incoming defer"
            )
        );
        let plain = words("-name guest=x -S -machine q35 -m 128");
        let source = domain(
            "pc-q35-7.2",
            "-name guest=x -S -machine q35 -m 128 -qmp unix:/s.sock,server=on,wait=off",
        );
        assert!(incoming_argv(&plain, &source).is_ok());
        let other = domain(
            "pc-q35-7.2",
            "-name guest=x -S -machine q35 -m 256 -qmp unix:/s",
        );
        assert!(incoming_argv(&local, &other).is_err());
    }

    fn words(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_owned).collect()
    }

    fn domain(machine: &str, argv: &str) -> RunningDomain {
        RunningDomain {
            vmi_uid: "u".into(),
            migration_uid: "m".into(),
            machine: machine.into(),
            argv: if argv.is_empty() { vec![] } else { words(argv) },
            hotplugged: vec![],
            copied_disks: vec![],
            capabilities: vec![],
            multifd_channels: None,
            paused: false,
            cpu: None,
            hooked: None,
        }
    }

    /// A shifted RTC's start date is the source's; any other `-rtc` difference is refused.
    #[test]
    fn a_shifted_rtc_starts_from_the_sources_date() {
        let local = words("-machine q35 -rtc base=2026-12-01T01:00:05,clock=vm -m 128");
        let source = domain(
            "q35",
            "-machine q35 -rtc base=2026-12-01T01:00:00,clock=vm -m 128",
        );
        assert_eq!(
            incoming_argv(&local, &source).unwrap(),
            words("-machine q35 -rtc base=2026-12-01T01:00:00,clock=vm -m 128 -incoming defer")
        );
        for other in [
            "-machine q35 -rtc base=2026-12-01T01:00:00 -m 128",
            "-machine q35 -rtc base=utc,clock=vm -m 128",
        ] {
            assert!(
                incoming_argv(&local, &domain("q35", other)).is_err(),
                "{other}"
            );
        }
    }

    #[test]
    fn the_machine_is_the_sources_and_incoming_is_deferred() {
        let local = words("-name guest=x -S -machine q35,usb=off -m 128");
        let argv = incoming_argv(&local, &domain("pc-q35-7.2", "")).unwrap();
        assert_eq!(
            argv,
            words("-name guest=x -S -machine pc-q35-7.2,usb=off -m 128 -incoming defer")
        );
        // The source's argv (alias or resolved) matching ours is accepted.
        let same = domain("pc-q35-7.2", "-name guest=x -S -machine q35,usb=off -m 128");
        assert!(incoming_argv(&local, &same).is_ok());
    }

    #[test]
    fn a_different_device_model_or_a_bad_machine_is_refused() {
        let local = words("-name guest=x -S -machine q35,usb=off -m 128");
        let other = domain("pc-q35-7.2", "-name guest=x -S -machine q35,usb=off -m 256");
        let e = incoming_argv(&local, &other).unwrap_err().to_string();
        assert!(e.contains("word 6") && e.contains("\"256\""), "{e}");
        for bad in ["", "q35,accel=kvm", "pc q35", "x;y"] {
            assert!(incoming_argv(&local, &domain(bad, "")).is_err(), "{bad:?}");
        }
    }
}
