//! One client connection of a libvirt migration target: what a source's libvirt (its remote
//! driver, opened by the QEMU driver's peer-to-peer migration on
//! `qemu+unix:///system?socket=…`) calls, in the order libvirt 9.0 calls it: `AUTH_LIST`,
//! `CONNECT_OPEN`, `CONNECT_SUPPORTS_FEATURE` probes, keepalive pings, then
//! `DOMAIN_MIGRATE_PREPARE3_PARAMS` and `DOMAIN_MIGRATE_FINISH3_PARAMS`, `CONNECT_CLOSE`.
//! The migration itself is the [`MigrationTarget`]'s; this module is the wire.
//!
//! Keepalive pings are answered by the reader while a procedure runs (Prepare starts QEMU,
//! Finish waits for the stream), as libvirt's server answers them outside its worker pool.

use std::future::Future;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, Mutex};

use super::packet::{read_packet, write_packet, FrameError, Header, MessageType, Packet, Status};
use super::remote::{
    decode_supports_feature, ErrorCode, Feature, Finish3ParamsArgs, Finish3ParamsRet, OpenArgs,
    Prepare3ParamsArgs, Prepare3ParamsRet, Procedure, RemoteError, FROM_RPC, KEEPALIVE_PROC_PING,
    KEEPALIVE_PROC_PONG, KEEPALIVE_PROGRAM, REMOTE_PROGRAM, REMOTE_PROTOCOL_VERSION,
};
use super::xdr::Encoder;

/// The migration half behind the wire: Prepare and Finish of libvirt's migration protocol v3
/// with parameters.
pub trait MigrationTarget: Send {
    /// `virDomainMigratePrepare3Params`: take the domain (XML, cookie), start its QEMU waiting
    /// for the stream, answer with the stream's URI. An error refuses the migration; the source
    /// keeps running.
    fn prepare(
        &mut self,
        args: Prepare3ParamsArgs,
    ) -> impl Future<Output = Result<Prepare3ParamsRet, RemoteError>> + Send;

    /// `virDomainMigrateFinish3Params`: the source's Perform ended (`cancelled` when it failed):
    /// wait for the incoming stream, resume the guest, answer with the domain.
    fn finish(
        &mut self,
        args: Finish3ParamsArgs,
    ) -> impl Future<Output = Result<Finish3ParamsRet, RemoteError>> + Send;
}

/// What one served call was, for the log and the tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The procedure number.
    pub procedure: i32,
    /// Its name, when it is one of ours.
    pub known: Option<Procedure>,
    /// Whether it succeeded.
    pub ok: bool,
}

/// The features this target answers "supported" to.
fn supported(feature: i32) -> bool {
    matches!(
        Feature::from_number(feature),
        Some(
            Feature::MigrationV3
                | Feature::MigrationParams
                | Feature::MigrationP2p
                | Feature::TypedParamString
                | Feature::XmlMigratable
                | Feature::MigrateChangeProtection
                | Feature::ProgramKeepalive
        )
    )
}

type Writer<W> = Arc<Mutex<W>>;

async fn reply<W: AsyncWrite + Unpin>(
    w: &Writer<W>,
    call: &Header,
    result: Result<Vec<u8>, RemoteError>,
) -> std::io::Result<bool> {
    let (status, body, ok) = match result {
        Ok(b) => (Status::Ok, b, true),
        Err(e) => (Status::Error, e.encode(), false),
    };
    let h = Header {
        kind: MessageType::Reply,
        status,
        ..*call
    };
    write_packet(&mut *w.lock().await, &h, &body).await?;
    Ok(ok)
}

/// Serves one connection until the client closes it (or sends `CONNECT_CLOSE`). Returns every
/// call in order. Frames that are not libvirt's end the connection with an error; calls to
/// procedures not served are answered `VIR_ERR_NO_SUPPORT` and logged.
pub async fn serve<S, T>(conn: S, target: &mut T) -> Result<Vec<Served>, FrameError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
    T: MigrationTarget,
{
    let (mut rd, wr) = tokio::io::split(conn);
    let wr: Writer<_> = Arc::new(Mutex::new(wr));
    // The reader answers keepalive itself and queues calls for the dispatcher below.
    let (tx, mut rx) = mpsc::channel::<Packet>(16);
    let ka_wr = wr.clone();
    let reader = tokio::spawn(async move {
        loop {
            let p = match read_packet(&mut rd).await {
                Ok(p) => p,
                Err(FrameError::Closed) => return Ok(()),
                Err(e) => return Err(e),
            };
            if p.header.program == KEEPALIVE_PROGRAM {
                if p.header.procedure == KEEPALIVE_PROC_PING {
                    let h = Header {
                        procedure: KEEPALIVE_PROC_PONG,
                        kind: MessageType::Message,
                        status: Status::Ok,
                        ..p.header
                    };
                    let mut w = ka_wr.lock().await;
                    write_packet(&mut *w, &h, &[])
                        .await
                        .map_err(FrameError::Io)?;
                }
                continue;
            }
            if tx.send(p).await.is_err() {
                return Ok(());
            }
        }
    });
    let mut served = Vec::new();
    while let Some(p) = rx.recv().await {
        let h = p.header;
        if h.kind != MessageType::Call {
            tracing::warn!(kind = ?h.kind, program = h.program, procedure = h.procedure,
                "libvirt peer: ignoring a message that is not a call");
            continue;
        }
        let known = Procedure::from_number(h.procedure);
        let close = known == Some(Procedure::ConnectClose);
        let result = if h.program != REMOTE_PROGRAM || h.version != REMOTE_PROTOCOL_VERSION {
            Err(RemoteError {
                code: ErrorCode::Rpc,
                domain: FROM_RPC,
                message: format!("unknown program {:#x} version {}", h.program, h.version),
            })
        } else {
            dispatch(known, h.procedure, &p.body, target).await
        };
        let ok = match reply(&wr, &h, result).await {
            Ok(ok) => ok,
            Err(e) => {
                reader.abort();
                return Err(FrameError::Io(e));
            }
        };
        tracing::info!(procedure = h.procedure, known = ?known, ok, "libvirt peer: call");
        served.push(Served {
            procedure: h.procedure,
            known,
            ok,
        });
        if close {
            break;
        }
    }
    drop(rx);
    match reader.await {
        Ok(Ok(())) => Ok(served),
        Ok(Err(e)) => Err(e),
        Err(_) => Ok(served),
    }
}

/// Answers the first frame of a connection, a call of qlauncher's private program
/// ([`super::client::QLAUNCHER_PROGRAM`], what [`super::client::Client::probe_peer`] sends):
/// its hello procedure gets `OK` with `protocol_version` (a `u32`), and the connection is then
/// the caller's, for qlauncher's own control protocol. Any other call of that program (another
/// version or procedure) is answered `VIR_ERR_RPC` and is an error, as is a frame that is not
/// such a call.
pub async fn answer_qlauncher_probe<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut S,
    protocol_version: u32,
) -> Result<(), FrameError> {
    use super::client::{QLAUNCHER_PROC_HELLO, QLAUNCHER_PROGRAM, QLAUNCHER_PROGRAM_VERSION};
    let p = read_packet(conn).await?;
    let h = p.header;
    if h.program != QLAUNCHER_PROGRAM || h.kind != MessageType::Call {
        return Err(FrameError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "the first frame is a {:?} of program {:#x}, not qlauncher's probe",
                h.kind, h.program
            ),
        )));
    }
    let reply = Header {
        kind: MessageType::Reply,
        ..h
    };
    if h.version != QLAUNCHER_PROGRAM_VERSION || h.procedure != QLAUNCHER_PROC_HELLO {
        let e = RemoteError {
            code: ErrorCode::Rpc,
            domain: FROM_RPC,
            message: format!(
                "qlauncher's probe program has no procedure {} in version {}",
                h.procedure, h.version
            ),
        };
        let h = Header {
            status: Status::Error,
            ..reply
        };
        write_packet(conn, &h, &e.encode())
            .await
            .map_err(FrameError::Io)?;
        return Err(FrameError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            e.message,
        )));
    }
    let mut e = Encoder::new();
    e.u32(protocol_version);
    let h = Header {
        status: Status::Ok,
        ..reply
    };
    write_packet(conn, &h, &e.into_bytes())
        .await
        .map_err(FrameError::Io)
}

fn bad_args(e: super::xdr::XdrError) -> RemoteError {
    RemoteError {
        code: ErrorCode::Rpc,
        domain: FROM_RPC,
        message: format!("cannot decode the call's arguments: {e}"),
    }
}

async fn dispatch<T: MigrationTarget>(
    known: Option<Procedure>,
    number: i32,
    body: &[u8],
    target: &mut T,
) -> Result<Vec<u8>, RemoteError> {
    let mut e = Encoder::new();
    match known {
        Some(Procedure::AuthList) => {
            // One auth type: REMOTE_AUTH_NONE (the socket is the pod's, as virtqemud's is).
            e.u32(1).i32(0);
        }
        Some(Procedure::ConnectOpen) => {
            let a = OpenArgs::decode(body).map_err(bad_args)?;
            tracing::info!(uri = ?a.name, flags = a.flags, "libvirt peer: open");
        }
        Some(Procedure::ConnectClose) => {}
        Some(Procedure::ConnectSupportsFeature) => {
            let f = decode_supports_feature(body).map_err(bad_args)?;
            tracing::info!(feature = f, name = ?Feature::from_number(f), supported = supported(f),
                "libvirt peer: feature probe");
            e.i32(supported(f) as i32);
        }
        Some(Procedure::ConnectGetType) => {
            e.string("QEMU");
        }
        Some(Procedure::ConnectGetVersion) | Some(Procedure::ConnectGetLibVersion) => {
            // libvirt's encoding of 9.0.0 / QEMU 7.2.0: major * 1000000 + minor * 1000 + micro.
            e.u64(if known == Some(Procedure::ConnectGetVersion) {
                7_002_000
            } else {
                9_000_000
            });
        }
        Some(Procedure::ConnectGetHostname) => {
            let h = nix::unistd::gethostname().ok();
            e.string(h.as_ref().and_then(|h| h.to_str()).unwrap_or("qlauncher"));
        }
        Some(Procedure::DomainMigratePrepare3Params) => {
            let a = Prepare3ParamsArgs::decode(body).map_err(bad_args)?;
            return Ok(target.prepare(a).await?.encode());
        }
        Some(Procedure::DomainMigrateFinish3Params) => {
            let a = Finish3ParamsArgs::decode(body).map_err(bad_args)?;
            return Ok(target.finish(a).await?.encode());
        }
        Some(Procedure::DomainMigratePrepare3) | None => {
            tracing::warn!(procedure = number, "libvirt peer: procedure not served");
            return Err(RemoteError::qemu(
                ErrorCode::NoSupport,
                format!("qlauncher does not serve libvirt remote procedure {number}"),
            ));
        }
    }
    Ok(e.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A qlauncher target answers the probe with its version, and the connection then carries
    /// whatever follows (qlauncher's own protocol); a call of another procedure is refused.
    #[tokio::test]
    async fn the_probe_is_answered_with_the_version_and_the_connection_stays_the_callers() {
        use super::super::client::{Client, PeerKind};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (a, mut b) = tokio::io::duplex(1 << 12);
        let target = tokio::spawn(async move {
            answer_qlauncher_probe(&mut b, 5).await.unwrap();
            let mut rest = [0u8; 5];
            b.read_exact(&mut rest).await.unwrap();
            rest
        });
        let mut c = Client::new(a);
        assert_eq!(c.probe_peer().await.unwrap(), PeerKind::Qlauncher(5));
        let mut a = c.into_inner();
        a.write_all(b"hello").await.unwrap();
        assert_eq!(&target.await.unwrap(), b"hello");

        let (a, mut b) = tokio::io::duplex(1 << 12);
        let target = tokio::spawn(async move { answer_qlauncher_probe(&mut b, 5).await });
        let mut c = Client::new(a);
        let other = c
            .call(super::super::client::QLAUNCHER_PROGRAM, 1, 2, &[])
            .await;
        assert!(
            matches!(other, Err(super::super::client::ClientError::Peer(ref e)) if e.code == 39),
            "{other:?}"
        );
        assert!(target.await.unwrap().is_err());
    }

    /// libvirt 9.0's p2p source asks for these before it sends `PREPARE3_PARAMS` (303); without
    /// `MIGRATION_PARAMS` (13) it falls back to `PREPARE3` (214).
    #[test]
    fn the_features_a_p2p_source_needs_are_claimed() {
        for f in [4, 6, 7, 9, 10, 11, 13] {
            assert!(supported(f), "feature {f}");
        }
        for f in [1, 3, 5, 8, 12, 14, 15, 16, 17, -1] {
            assert!(!supported(f), "feature {f}");
        }
        assert_eq!(
            Procedure::from_number(303),
            Some(Procedure::DomainMigratePrepare3Params)
        );
        assert_eq!(
            Procedure::from_number(306),
            Some(Procedure::DomainMigrateFinish3Params)
        );
    }
}
