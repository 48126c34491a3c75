//! The control protocol between the source and the target launcher of a live migration.
//!
//! KubeVirt's launchers let libvirt talk to libvirt over the migration proxy's role-0 channel (the
//! source pod's `migrationproxy/<uid>-source.sock` reaches the target pod's
//! `/var/run/libvirt/virtqemud-sock`, `pkg/virt-handler/migration-proxy`, v1.9.0). virt-handler
//! never reads those bytes, so qlauncher carries its own handshake on that channel: the source
//! sends the definition of its running domain, the target starts QEMU from it and answers ready,
//! and both settle the outcome.
//!
//! Wire format: every message is one frame, a 4-byte big-endian length followed by that many
//! bytes of JSON (one [`Message`]). Frames larger than [`MAX_FRAME`] are refused before any
//! allocation. The first frame each way is a [`Hello`]; the side that cannot speak the peer's
//! [`PROTOCOL_VERSION`] answers [`Message::Refused`] and closes, so two launchers of different
//! qlauncher versions fail the migration with a clear reason instead of misreading each other.
//!
//! Sequence (source `S`, target `T`):
//!
//! ```text
//! S -> T  probe: a call of qlauncher's private program in libvirt's framing
//!         (`crate::libvirt_rpc::client::Client::probe_peer`); a stock launcher's libvirt
//!         answers "Cannot find program", and the source drives it as libvirt's peer instead
//!         (`crate::sync::migration::source::libvirt`)
//! T -> S  the probe's reply: OK and PROTOCOL_VERSION
//! S -> T  Hello { version, launcher }
//! T -> S  Hello { version, launcher }          (or Refused { reason })
//! S -> T  Prepare(RunningDomain)
//! T -> S  Ready { stream_socket, nbd_exports } (or Failed { reason })
//! S -> T  Outcome { completed, paused }        (after QEMU's migration ended on the source)
//! T -> S  Done                                 (target resumed, or cleaned up)
//! ```
//!
//! Either side may send [`Message::Abort`] at any point after the hello; the peer cleans up.
//!
//! The messages and their framing live here; the definition the source sends
//! ([`RunningDomain`] and what it carries) is in [`definition`].

mod definition;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub use definition::{CopiedDisk, DomainIdentity, HotplugKind, HotpluggedDevice, RunningDomain};

/// The control protocol version this launcher speaks. Bump it on any incompatible change of
/// [`Message`] or of the meaning of a field.
///
/// Version 2: [`RunningDomain::hotplugged`] carries the hot-plugged disks as
/// [`HotpluggedDevice`] placements (version 1 always sent an empty list of keyval strings, so a
/// version 1 peer cannot migrate a domain with hot-plugged devices and is refused at the hello).
///
/// Version 3: [`RunningDomain::cpu`] carries a host-model CPU's static expansion, which the
/// target starts from; hot-plugged NICs travel as [`HotplugKind::Nic`] placements (with
/// [`HotpluggedDevice::model`] and [`HotpluggedDevice::netdev`]); [`RunningDomain::argv`] leaves
/// out the SR-IOV devices the source unplugged; and in a decentralized migration
/// [`RunningDomain::vmi_uid`] is the target VMI's UID (the target names its sockets after the
/// source VMI's). A version 2 peer cannot decode the first two (its messages deny unknown
/// fields) and would misread the last two (an argv difference, sockets under the wrong name), so
/// it is refused at the hello.
///
/// Version 4: [`RunningDomain::hooked`] carries what the source's hooks made of its first
/// definition, and the target runs with the source's hook edits instead of its own sidecars'
/// (which it still calls, for their side effects only, as KubeVirt's target does). A version 3
/// target would run its own sidecars' edits, and a version 3 source sends none, so either is
/// refused at the hello.
pub const PROTOCOL_VERSION: u32 = 4;

/// The largest frame accepted, in bytes (a domain definition is a few KiB).
pub const MAX_FRAME: u32 = 4 * 1024 * 1024;

/// The first message of each side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// The protocol version the sender speaks ([`PROTOCOL_VERSION`]).
    pub version: u32,
    /// The sender's qlauncher version (`CARGO_PKG_VERSION`), for the logs and the refusal text.
    pub launcher: String,
}

impl Hello {
    /// This launcher's hello.
    pub fn ours() -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            launcher: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }
}

/// What the target answers once its QEMU waits for the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ready {
    /// The NBD export names the target serves (one per [`CopiedDisk`]).
    pub nbd_exports: Vec<String>,
}

/// The result of QEMU's migration as the source saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    /// QEMU reported `completed` on the source.
    pub completed: bool,
    /// Why it failed, when it did.
    pub reason: Option<String>,
}

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "body", deny_unknown_fields)]
pub enum Message {
    /// The first frame of each side.
    Hello(Hello),
    /// The receiver cannot speak the sender's version (or refuses the peer for another reason);
    /// the connection closes after it.
    Refused {
        /// Why, for the migration's failure reason.
        reason: String,
    },
    /// Source to target: start QEMU from this definition.
    Prepare(Box<RunningDomain>),
    /// Target to source: QEMU waits on the stream socket.
    Ready(Ready),
    /// Source to target: the source's migration ended.
    Outcome(Outcome),
    /// Target to source: the target finished (resumed, or cleaned up after a failure).
    Done,
    /// Either way: a step failed; the peer cleans up.
    Failed {
        /// What failed.
        reason: String,
    },
    /// Either way: the migration is cancelled.
    Abort,
}

/// Errors of the control channel.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// Reading or writing the socket failed (including the peer closing it).
    #[error("migration control channel I/O")]
    Io(#[from] std::io::Error),
    /// A frame announced more than [`MAX_FRAME`] bytes.
    #[error("migration control frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    FrameTooLarge(u32),
    /// A frame is not a valid message.
    #[error("migration control frame is not a valid message")]
    Decode(#[source] serde_json::Error),
    /// Encoding a message failed.
    #[error("cannot encode a migration control message")]
    Encode(#[source] serde_json::Error),
    /// The peer speaks another protocol version.
    #[error(
        "migration peer speaks control protocol version {peer} (qlauncher {launcher}), this \
         launcher speaks version {ours}"
    )]
    VersionMismatch {
        /// The peer's version.
        peer: u32,
        /// The peer's qlauncher version.
        launcher: String,
        /// Ours.
        ours: u32,
    },
    /// The peer refused the connection.
    #[error("migration peer refused: {0}")]
    Refused(String),
    /// A decentralized migration names a target VMI whose namespace or name cannot name a
    /// domain (`targetState.domainNamespace` / `domainName`).
    #[error("invalid target domain: {0}")]
    InvalidTargetDomain(String),
    /// The peer sent a message this step does not expect.
    #[error("unexpected migration control message: expected {expected}, got {got}")]
    Unexpected {
        /// What this step waits for.
        expected: &'static str,
        /// The message's kind.
        got: &'static str,
    },
}

impl Message {
    /// The message's kind, for errors and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello(_) => "Hello",
            Message::Refused { .. } => "Refused",
            Message::Prepare(_) => "Prepare",
            Message::Ready(_) => "Ready",
            Message::Outcome(_) => "Outcome",
            Message::Done => "Done",
            Message::Failed { .. } => "Failed",
            Message::Abort => "Abort",
        }
    }
}

/// Writes one frame holding `message`.
pub async fn write_message<W: AsyncWrite + Unpin>(
    w: &mut W,
    message: &Message,
) -> Result<(), ProtocolError> {
    let body = serde_json::to_vec(message).map_err(ProtocolError::Encode)?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&n| n <= MAX_FRAME)
        .ok_or(ProtocolError::FrameTooLarge(u32::MAX))?;
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one frame and decodes it. A frame over [`MAX_FRAME`] is refused before its body is read.
pub async fn read_message<R: AsyncRead + Unpin>(r: &mut R) -> Result<Message, ProtocolError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len);
    if len > MAX_FRAME {
        return Err(ProtocolError::FrameTooLarge(len));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body).await?;
    serde_json::from_slice(&body).map_err(ProtocolError::Decode)
}

/// Checks the peer's hello against ours. Only an equal version is compatible: there is no
/// negotiation of optional parts (a version 1 peer, which cannot carry hot-plugged devices, is
/// refused before any definition is sent).
pub fn check_hello(peer: &Hello) -> Result<(), ProtocolError> {
    if peer.version == PROTOCOL_VERSION {
        Ok(())
    } else {
        Err(ProtocolError::VersionMismatch {
            peer: peer.version,
            launcher: peer.launcher.clone(),
            ours: PROTOCOL_VERSION,
        })
    }
}

/// The source's half of the hello: send ours, read the target's, check it. A `Refused` answer
/// becomes [`ProtocolError::Refused`]; a hello of another version [`ProtocolError::VersionMismatch`].
pub async fn hello_as_source<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
) -> Result<Hello, ProtocolError> {
    write_message(s, &Message::Hello(Hello::ours())).await?;
    match read_message(s).await? {
        Message::Hello(peer) => {
            check_hello(&peer)?;
            Ok(peer)
        }
        Message::Refused { reason } => Err(ProtocolError::Refused(reason)),
        other => Err(ProtocolError::Unexpected {
            expected: "Hello",
            got: other.kind(),
        }),
    }
}

/// The target's half of the hello: read the source's; on a version mismatch answer `Refused`
/// (naming both versions) and fail, else answer our hello.
///
/// A first frame that does not decode as a message at all (a peer of an incompatible
/// generation) is refused the same way.
pub async fn hello_as_target<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
) -> Result<Hello, ProtocolError> {
    let first = match read_message(s).await {
        Ok(m) => m,
        Err(ProtocolError::Decode(e)) => {
            let reason = format!(
                "the first control frame is not a qlauncher control protocol version \
                 {PROTOCOL_VERSION} hello"
            );
            // Best effort: the peer may not understand it either.
            let _ = write_message(s, &Message::Refused { reason }).await;
            return Err(ProtocolError::Decode(e));
        }
        Err(e) => return Err(e),
    };
    let peer = match first {
        Message::Hello(peer) => peer,
        other => {
            return Err(ProtocolError::Unexpected {
                expected: "Hello",
                got: other.kind(),
            })
        }
    };
    if let Err(e) = check_hello(&peer) {
        let _ = write_message(
            s,
            &Message::Refused {
                reason: format!(
                    "target qlauncher {} speaks control protocol version {PROTOCOL_VERSION}, \
                     source qlauncher {} speaks version {}",
                    env!("CARGO_PKG_VERSION"),
                    peer.launcher,
                    peer.version
                ),
            },
        )
        .await;
        return Err(e);
    }
    write_message(s, &Message::Hello(Hello::ours())).await?;
    Ok(peer)
}

#[cfg(test)]
mod tests {
    use super::definition::tests::domain;
    use super::*;
    use tokio::io::duplex;

    #[tokio::test]
    async fn messages_round_trip_through_frames() {
        let (mut a, mut b) = duplex(1 << 16);
        let sent = vec![
            Message::Hello(Hello::ours()),
            Message::Prepare(Box::new(domain())),
            Message::Ready(Ready {
                nbd_exports: vec!["drive-ua-containerdisk".into()],
            }),
            Message::Outcome(Outcome {
                completed: false,
                reason: Some("cancelled".into()),
            }),
            Message::Done,
            Message::Abort,
        ];
        for m in &sent {
            write_message(&mut a, m).await.unwrap();
        }
        for m in &sent {
            assert_eq!(&read_message(&mut b).await.unwrap(), m);
        }
    }

    #[tokio::test]
    async fn frame_is_length_prefixed_json() {
        let (mut a, mut b) = duplex(1 << 16);
        write_message(&mut a, &Message::Done).await.unwrap();
        drop(a);
        let mut raw = Vec::new();
        b.read_to_end(&mut raw).await.unwrap();
        let body = br#"{"type":"Done"}"#;
        assert_eq!(&raw[..4], &(body.len() as u32).to_be_bytes());
        assert_eq!(&raw[4..], body);
    }

    #[tokio::test]
    async fn oversized_frame_is_refused_before_reading_it() {
        let (mut a, mut b) = duplex(64);
        a.write_all(&(MAX_FRAME + 1).to_be_bytes()).await.unwrap();
        let e = read_message(&mut b).await.unwrap_err();
        assert!(matches!(e, ProtocolError::FrameTooLarge(n) if n == MAX_FRAME + 1));
    }

    #[tokio::test]
    async fn unknown_fields_and_kinds_do_not_decode() {
        for body in [
            &br#"{"type":"Done","extra":1}"#[..],
            br#"{"type":"Teleport"}"#,
            br#"{"type":"Hello","body":{"version":1,"launcher":"x","future":true}}"#,
            b"not json",
        ] {
            let (mut a, mut b) = duplex(1 << 12);
            a.write_all(&(body.len() as u32).to_be_bytes())
                .await
                .unwrap();
            a.write_all(body).await.unwrap();
            assert!(matches!(
                read_message(&mut b).await,
                Err(ProtocolError::Decode(_))
            ));
        }
    }

    #[tokio::test]
    async fn equal_versions_agree() {
        let (mut s, mut t) = duplex(1 << 12);
        let (src, tgt) = tokio::join!(hello_as_source(&mut s), hello_as_target(&mut t));
        assert_eq!(src.unwrap().version, PROTOCOL_VERSION);
        assert_eq!(tgt.unwrap().version, PROTOCOL_VERSION);
    }

    #[tokio::test]
    async fn a_newer_source_is_refused_with_both_versions_named() {
        let (mut s, mut t) = duplex(1 << 12);
        let source = async {
            write_message(
                &mut s,
                &Message::Hello(Hello {
                    version: PROTOCOL_VERSION + 1,
                    launcher: "9.9.9".into(),
                }),
            )
            .await
            .unwrap();
            read_message(&mut s).await.unwrap()
        };
        let (answer, target) = tokio::join!(source, hello_as_target(&mut t));
        assert!(matches!(
            target.unwrap_err(),
            ProtocolError::VersionMismatch { peer, .. } if peer == PROTOCOL_VERSION + 1
        ));
        let Message::Refused { reason } = answer else {
            panic!("expected Refused, got {answer:?}");
        };
        assert!(reason.contains("source qlauncher 9.9.9"), "{reason}");
        assert!(
            reason.contains(&format!("version {}", PROTOCOL_VERSION + 1)),
            "{reason}"
        );
    }

    #[tokio::test]
    async fn a_version_1_source_which_cannot_carry_hotplugged_devices_is_refused() {
        let (mut s, mut t) = duplex(1 << 12);
        let source = async {
            write_message(
                &mut s,
                &Message::Hello(Hello {
                    version: 1,
                    launcher: "0.1.0".into(),
                }),
            )
            .await
            .unwrap();
            read_message(&mut s).await.unwrap()
        };
        let (answer, target) = tokio::join!(source, hello_as_target(&mut t));
        assert!(matches!(
            target.unwrap_err(),
            ProtocolError::VersionMismatch { peer: 1, .. }
        ));
        assert!(matches!(answer, Message::Refused { .. }), "{answer:?}");
    }

    #[tokio::test]
    async fn a_source_meeting_an_older_target_fails_cleanly() {
        let (mut s, mut t) = duplex(1 << 12);
        let target = async {
            let _ = read_message(&mut t).await.unwrap();
            write_message(
                &mut t,
                &Message::Hello(Hello {
                    version: 0,
                    launcher: "0.0.1".into(),
                }),
            )
            .await
            .unwrap();
        };
        let (src, ()) = tokio::join!(hello_as_source(&mut s), target);
        let e = src.unwrap_err();
        assert!(e.to_string().contains("version 0 (qlauncher 0.0.1)"), "{e}");
    }

    #[tokio::test]
    async fn a_refusal_reaches_the_source_as_its_reason() {
        let (mut s, mut t) = duplex(1 << 12);
        let target = async {
            let _ = read_message(&mut t).await.unwrap();
            write_message(
                &mut t,
                &Message::Refused {
                    reason: "busy".into(),
                },
            )
            .await
            .unwrap();
        };
        let (src, ()) = tokio::join!(hello_as_source(&mut s), target);
        assert!(matches!(src.unwrap_err(), ProtocolError::Refused(r) if r == "busy"));
    }

    #[tokio::test]
    async fn a_peer_closing_mid_frame_is_an_io_error() {
        let (mut a, mut b) = duplex(64);
        a.write_all(&10u32.to_be_bytes()).await.unwrap();
        a.write_all(b"{\"ty").await.unwrap();
        drop(a);
        assert!(matches!(
            read_message(&mut b).await,
            Err(ProtocolError::Io(_))
        ));
    }
}
