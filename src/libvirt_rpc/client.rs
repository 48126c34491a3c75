//! The source's side of libvirt's remote protocol: what a peer-to-peer migration source (libvirt's
//! QEMU driver, `qemuMigrationSrcPerformPeer2Peer3` over the remote driver) calls on the target's
//! virtqemud, for qlauncher to drive a stock target: `AUTH_LIST`, `CONNECT_OPEN`,
//! `CONNECT_SUPPORTS_FEATURE`, `DOMAIN_MIGRATE_PREPARE3_PARAMS`, `DOMAIN_MIGRATE_FINISH3_PARAMS`,
//! `CONNECT_CLOSE`; keepalive pings from the peer are answered while a call waits, and between
//! calls while [`Client::keepalive_while`] runs something else (the QEMU stream of a migration).
//!
//! Every reply is untrusted: frames are bounded by [`super::packet::MESSAGE_MAX`], strings and
//! cookies by the protocol's limits, and a reply that is not the answer to the call in flight
//! is an error, never a panic.

use std::future::Future;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use super::packet::{
    decode_frame, write_packet, FrameError, Header, MessageType, Packet, Status, HEADER_LEN,
    MESSAGE_MAX,
};
use super::remote::{
    Feature, Finish3ParamsArgs, Finish3ParamsRet, OpenArgs, Prepare3ParamsArgs, Prepare3ParamsRet,
    Procedure, FROM_RPC, KEEPALIVE_PROC_PING, KEEPALIVE_PROC_PONG, KEEPALIVE_PROGRAM,
    REMOTE_PROGRAM, REMOTE_PROTOCOL_VERSION, STRING_MAX,
};
use super::xdr::{Decoder, Encoder, XdrError};

/// qlauncher's private program number, called first by a qlauncher source to tell a qlauncher
/// target (which answers it) from a stock libvirt (which answers `VIR_ERR_RPC` from
/// `VIR_FROM_RPC`, "Cannot find program", and keeps the connection open: checked against
/// libvirtd 9.0).
pub const QLAUNCHER_PROGRAM: u32 = 0x51a7_c4e5;
/// The version of [`QLAUNCHER_PROGRAM`].
pub const QLAUNCHER_PROGRAM_VERSION: u32 = 1;
/// Its one procedure: "which protocol do you speak" (no arguments; a qlauncher target answers
/// with its protocol version, a `u32`).
pub const QLAUNCHER_PROC_HELLO: i32 = 1;

/// `VIR_ERR_RPC`: the code libvirt's server answers a call to an unknown program with.
const ERR_RPC: i32 = 39;

/// A `remote_error` the peer answered with (its `virErrorNumber`, `virErrorDomain`, message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerError {
    /// `virErrorNumber`.
    pub code: i32,
    /// `virErrorDomain`.
    pub domain: i32,
    /// The message (empty when the peer sent none).
    pub message: String,
}

impl PeerError {
    /// Decodes the leading fields of a `remote_error` body; the rest (level, domain, extra
    /// strings) is not needed and not read.
    pub fn decode(body: &[u8]) -> Result<PeerError, XdrError> {
        let mut d = Decoder::new(body);
        let code = d.i32()?;
        let domain = d.i32()?;
        let message = d
            .optional(|d| d.string("error message", STRING_MAX))?
            .unwrap_or_default();
        Ok(PeerError {
            code,
            domain,
            message,
        })
    }
}

/// Why a call failed.
#[derive(Debug)]
pub enum ClientError {
    /// The connection failed or carried something that is not a libvirt frame.
    Frame(FrameError),
    /// The reply's body is not the procedure's `_ret`.
    Reply(XdrError),
    /// The peer answered with an error.
    Peer(PeerError),
    /// The peer answered something other than the reply to the call in flight.
    Unexpected(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Frame(e) => write!(f, "{e}"),
            ClientError::Reply(e) => write!(f, "libvirt peer's reply: {e}"),
            ClientError::Peer(e) => write!(
                f,
                "libvirt peer refused (code {}, domain {}): {}",
                e.code, e.domain, e.message
            ),
            ClientError::Unexpected(m) => write!(f, "libvirt peer: {m}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<FrameError> for ClientError {
    fn from(e: FrameError) -> ClientError {
        ClientError::Frame(e)
    }
}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> ClientError {
        ClientError::Frame(FrameError::Io(e))
    }
}

/// What answered [`Client::probe_peer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerKind {
    /// A qlauncher target, with the protocol version it speaks.
    Qlauncher(u32),
    /// A stock libvirt daemon (it does not know [`QLAUNCHER_PROGRAM`]).
    StockLibvirt,
}

/// One connection to a libvirt remote-protocol server, calls made one at a time.
#[derive(Debug)]
pub struct Client<S> {
    conn: S,
    serial: u32,
    /// Bytes read and not yet a whole frame: reads are cancel-safe ([`Self::keepalive_while`]
    /// may stop between two reads, never inside a frame).
    buf: Vec<u8>,
    /// Keepalive pings answered.
    pongs: u64,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
    /// A client over an open connection (the migration proxy's socket).
    pub fn new(conn: S) -> Client<S> {
        Client {
            conn,
            serial: 0,
            buf: Vec::new(),
            pongs: 0,
        }
    }

    /// The connection back, after the last call (bytes the peer sent after the last reply are
    /// lost with the client: a peer sends none unasked but keepalive).
    pub fn into_inner(self) -> S {
        self.conn
    }

    /// The next whole frame. Cancel-safe: the bytes of a frame read so far stay in `buf`. The
    /// length word is checked before the frame is buffered.
    async fn next_packet(&mut self) -> Result<Packet, ClientError> {
        loop {
            if self.buf.len() >= 4 {
                let n = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
                if !(HEADER_LEN..=MESSAGE_MAX).contains(&n) {
                    return Err(FrameError::BadLength(n).into());
                }
                if self.buf.len() >= n as usize {
                    let rest = self.buf.split_off(n as usize);
                    let frame = std::mem::replace(&mut self.buf, rest);
                    return Ok(decode_frame(&frame)?);
                }
                self.buf.reserve(n as usize - self.buf.len());
            }
            let read = self.conn.read_buf(&mut self.buf).await?;
            if read == 0 {
                return Err(if self.buf.is_empty() {
                    FrameError::Closed
                } else {
                    FrameError::Io(std::io::ErrorKind::UnexpectedEof.into())
                }
                .into());
            }
        }
    }

    /// Answers a keepalive ping (a PONG); true when `p` was keepalive or an asynchronous
    /// message (an event), which the caller skips.
    async fn asynchronous(&mut self, p: &Packet) -> Result<bool, ClientError> {
        let h = p.header;
        if h.program == KEEPALIVE_PROGRAM {
            if h.procedure == KEEPALIVE_PROC_PING {
                let pong = Header {
                    procedure: KEEPALIVE_PROC_PONG,
                    kind: MessageType::Message,
                    status: Status::Ok,
                    ..h
                };
                write_packet(&mut self.conn, &pong, &[]).await?;
                self.pongs += 1;
                if self.pongs == 1 {
                    tracing::info!("libvirt peer: answering its keepalive pings");
                } else {
                    tracing::debug!(pongs = self.pongs, "libvirt peer: keepalive ping answered");
                }
            }
            return Ok(true);
        }
        Ok(h.kind == MessageType::Message)
    }

    /// Runs `f` to its end while answering the peer's keepalive pings between calls (libvirt's
    /// server closes a connection whose pings go unanswered: 5 pings 5 s apart by default, once
    /// the client asked for `VIR_DRV_FEATURE_PROGRAM_KEEPALIVE`). When the connection fails
    /// or the peer sends anything but keepalive and events meanwhile, `on_lost` is called once
    /// (to stop what `f` does) and `f` is still run to its end. Returns `f`'s output and the
    /// connection's failure, if any.
    pub async fn keepalive_while<F: Future>(
        &mut self,
        f: F,
        on_lost: impl FnOnce(),
    ) -> (F::Output, Option<ClientError>) {
        tokio::pin!(f);
        let mut on_lost = Some(on_lost);
        let mut lost = None;
        loop {
            if lost.is_some() {
                return ((&mut f).await, lost);
            }
            tokio::select! {
                out = &mut f => return (out, None),
                p = self.next_packet() => {
                    let failed = match p {
                        Ok(p) => match self.asynchronous(&p).await {
                            Ok(true) => None,
                            Ok(false) => Some(ClientError::Unexpected(format!(
                                "a {:?} for program {:#x} procedure {} while no call waits",
                                p.header.kind, p.header.program, p.header.procedure
                            ))),
                            Err(e) => Some(e),
                        },
                        Err(e) => Some(e),
                    };
                    if let Some(e) = failed {
                        if let Some(stop) = on_lost.take() {
                            stop();
                        }
                        lost = Some(e);
                    }
                }
            }
        }
    }

    /// Calls `procedure` of `program` with `body` and waits for its reply, answering keepalive
    /// pings and skipping asynchronous messages (events) meanwhile. Ok is the reply's body.
    pub async fn call(
        &mut self,
        program: u32,
        version: u32,
        procedure: i32,
        body: &[u8],
    ) -> Result<Vec<u8>, ClientError> {
        self.serial = self.serial.wrapping_add(1);
        let call = Header {
            program,
            version,
            procedure,
            kind: MessageType::Call,
            serial: self.serial,
            status: Status::Ok,
        };
        write_packet(&mut self.conn, &call, body).await?;
        loop {
            let p = self.next_packet().await?;
            if self.asynchronous(&p).await? {
                continue;
            }
            let h = p.header;
            if h.kind != MessageType::Reply
                || h.serial != call.serial
                || h.program != program
                || h.procedure != procedure
            {
                return Err(ClientError::Unexpected(format!(
                    "a {:?} for program {:#x} procedure {} serial {} while waiting for the reply \
                     to procedure {procedure} serial {}",
                    h.kind, h.program, h.procedure, h.serial, call.serial
                )));
            }
            return match h.status {
                Status::Ok => Ok(p.body),
                Status::Error => Err(ClientError::Peer(
                    PeerError::decode(&p.body).map_err(ClientError::Reply)?,
                )),
                Status::Continue => Err(ClientError::Unexpected(
                    "a stream continuation as a reply".into(),
                )),
            };
        }
    }

    async fn remote(&mut self, procedure: Procedure, body: &[u8]) -> Result<Vec<u8>, ClientError> {
        self.call(
            REMOTE_PROGRAM,
            REMOTE_PROTOCOL_VERSION,
            procedure as i32,
            body,
        )
        .await
    }

    /// Calls [`QLAUNCHER_PROGRAM`]: a qlauncher target answers with its protocol version, a
    /// stock libvirt with "Cannot find program" (`VIR_ERR_RPC` from `VIR_FROM_RPC`), the
    /// connection still open for its remote program. Any other answer is an error.
    pub async fn probe_peer(&mut self) -> Result<PeerKind, ClientError> {
        match self
            .call(
                QLAUNCHER_PROGRAM,
                QLAUNCHER_PROGRAM_VERSION,
                QLAUNCHER_PROC_HELLO,
                &[],
            )
            .await
        {
            Ok(body) => {
                let mut d = Decoder::new(&body);
                let v = d.u32().map_err(ClientError::Reply)?;
                d.finish().map_err(ClientError::Reply)?;
                Ok(PeerKind::Qlauncher(v))
            }
            Err(ClientError::Peer(e)) if e.code == ERR_RPC && e.domain == FROM_RPC => {
                Ok(PeerKind::StockLibvirt)
            }
            Err(e) => Err(e),
        }
    }

    /// `AUTH_LIST`: the auth types the server offers (`REMOTE_AUTH_NONE` is 0).
    pub async fn auth_list(&mut self) -> Result<Vec<i32>, ClientError> {
        let body = self.remote(Procedure::AuthList, &[]).await?;
        let mut d = Decoder::new(&body);
        // REMOTE_AUTH_TYPE_LIST_MAX.
        let types = d
            .array("auth types", 20, |d| d.i32())
            .map_err(ClientError::Reply)?;
        d.finish().map_err(ClientError::Reply)?;
        Ok(types)
    }

    /// `CONNECT_OPEN` of `uri` (`qemu:///system`, as the remote driver opens on the server).
    pub async fn open(&mut self, uri: Option<&str>, flags: u32) -> Result<(), ClientError> {
        let a = OpenArgs {
            name: uri.map(str::to_owned),
            flags,
        };
        self.remote(Procedure::ConnectOpen, &a.encode()).await?;
        Ok(())
    }

    /// `CONNECT_SUPPORTS_FEATURE`: whether the server's driver claims `feature`.
    pub async fn supports_feature(&mut self, feature: Feature) -> Result<bool, ClientError> {
        let mut e = Encoder::new();
        e.i32(feature as i32);
        let body = self
            .remote(Procedure::ConnectSupportsFeature, &e.into_bytes())
            .await?;
        let mut d = Decoder::new(&body);
        let v = d.i32().map_err(ClientError::Reply)?;
        d.finish().map_err(ClientError::Reply)?;
        Ok(v != 0)
    }

    /// `CONNECT_GET_LIB_VERSION`: the server's libvirt version, `major * 1_000_000 + minor *
    /// 1000 + micro` (9.0.0 is `9_000_000`).
    pub async fn lib_version(&mut self) -> Result<u64, ClientError> {
        let body = self.remote(Procedure::ConnectGetLibVersion, &[]).await?;
        let mut d = Decoder::new(&body);
        let v = d.u64().map_err(ClientError::Reply)?;
        d.finish().map_err(ClientError::Reply)?;
        Ok(v)
    }

    /// `DOMAIN_MIGRATE_PREPARE3_PARAMS`: the target defines the domain and starts its QEMU
    /// waiting for the stream; the reply names the stream's URI and carries its cookie (the
    /// NBD server's port for copied disks).
    pub async fn prepare3_params(
        &mut self,
        args: &Prepare3ParamsArgs,
    ) -> Result<Prepare3ParamsRet, ClientError> {
        let body = self
            .remote(Procedure::DomainMigratePrepare3Params, &args.encode())
            .await?;
        Prepare3ParamsRet::decode(&body).map_err(ClientError::Reply)
    }

    /// `DOMAIN_MIGRATE_FINISH3_PARAMS`: after the stream (or with `cancelled` when it failed),
    /// the target resumes (or discards) the domain.
    pub async fn finish3_params(
        &mut self,
        args: &Finish3ParamsArgs,
    ) -> Result<Finish3ParamsRet, ClientError> {
        let body = self
            .remote(Procedure::DomainMigrateFinish3Params, &args.encode())
            .await?;
        Finish3ParamsRet::decode(&body).map_err(ClientError::Reply)
    }

    /// `CONNECT_CLOSE`.
    pub async fn close(&mut self) -> Result<(), ClientError> {
        self.remote(Procedure::ConnectClose, &[]).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::packet::read_packet;
    use super::super::remote::{Domain, RemoteError, TypedParam};
    use super::super::server::{serve, MigrationTarget};
    use super::*;

    /// Between calls, pings are answered while something else runs; the peer's close is the
    /// lost connection, and what runs still ends.
    #[tokio::test]
    async fn keepalive_is_answered_between_calls_and_a_close_is_reported() {
        let (a, mut b) = tokio::io::duplex(1 << 12);
        let peer = tokio::spawn(async move {
            let ping = Header {
                program: KEEPALIVE_PROGRAM,
                version: 1,
                procedure: KEEPALIVE_PROC_PING,
                kind: MessageType::Message,
                serial: 0,
                status: Status::Ok,
            };
            // One ping split over two writes: the client's reads may stop in between.
            let frame = super::super::packet::encode_frame(&ping, &[]);
            use tokio::io::AsyncWriteExt;
            b.write_all(&frame[..10]).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            b.write_all(&frame[10..]).await.unwrap();
            let pong = read_packet(&mut b).await.unwrap();
            assert_eq!(pong.header.procedure, KEEPALIVE_PROC_PONG);
            drop(b);
        });
        let mut c = Client::new(a);
        let mut stopped = false;
        let (out, lost) = c
            .keepalive_while(
                async {
                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                    7
                },
                || stopped = true,
            )
            .await;
        peer.await.unwrap();
        assert_eq!(out, 7);
        assert!(stopped);
        assert!(
            matches!(lost, Some(ClientError::Frame(FrameError::Closed))),
            "{lost:?}"
        );
    }

    struct Refuses;

    impl MigrationTarget for Refuses {
        async fn prepare(
            &mut self,
            args: Prepare3ParamsArgs,
        ) -> Result<Prepare3ParamsRet, RemoteError> {
            assert_eq!(
                super::super::remote::param_string(&args.params, "destination_xml"),
                Some("<domain/>")
            );
            Err(RemoteError::qemu(
                super::super::remote::ErrorCode::ConfigUnsupported,
                "no",
            ))
        }

        async fn finish(
            &mut self,
            args: Finish3ParamsArgs,
        ) -> Result<Finish3ParamsRet, RemoteError> {
            Ok(Finish3ParamsRet {
                domain: Domain {
                    name: "d".into(),
                    uuid: [7; 16],
                    id: if args.cancelled { -1 } else { 1 },
                },
                cookie: b"c\0".to_vec(),
            })
        }
    }

    /// The client's calls against this crate's own server: every procedure a source calls
    /// round-trips, a refused Prepare is the peer's error, the connection stays usable.
    #[tokio::test]
    async fn a_source_conversation_round_trips() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move { serve(b, &mut Refuses).await.map(|s| s.len()) });
        let mut c = Client::new(a);
        // This server does not know the private program yet: it answers as libvirt does.
        assert_eq!(c.probe_peer().await.unwrap(), PeerKind::StockLibvirt);
        assert_eq!(c.auth_list().await.unwrap(), vec![0]);
        c.open(Some("qemu:///system"), 0).await.unwrap();
        assert!(c.supports_feature(Feature::MigrationParams).await.unwrap());
        assert!(!c.supports_feature(Feature::MigrationV1).await.unwrap());
        let prep = Prepare3ParamsArgs {
            params: vec![TypedParam::string("destination_xml", "<domain/>")],
            cookie: b"<qemu-migration/>\0".to_vec(),
            flags: 0,
        };
        match c.prepare3_params(&prep).await {
            Err(ClientError::Peer(e)) => assert_eq!((e.code, e.message.as_str()), (67, "no")),
            other => panic!("{other:?}"),
        }
        let fin = Finish3ParamsArgs {
            params: vec![TypedParam::string("destination_name", "d")],
            cookie: vec![],
            flags: 0,
            cancelled: true,
        };
        let r = c.finish3_params(&fin).await.unwrap();
        assert_eq!((r.domain.id, r.cookie), (-1, b"c\0".to_vec()));
        c.close().await.unwrap();
        drop(c);
        assert_eq!(server.await.unwrap().unwrap(), 8);
    }

    /// Replies that are not libvirt's, or not the answer to the call, are errors.
    #[tokio::test]
    async fn a_hostile_reply_is_an_error() {
        use tokio::io::AsyncWriteExt;
        let (a, mut b) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let _ = read_packet(&mut b).await;
            // A reply to another serial, then a huge length word.
            let h = Header {
                program: REMOTE_PROGRAM,
                version: 1,
                procedure: 66,
                kind: MessageType::Reply,
                serial: 99,
                status: Status::Ok,
            };
            let _ = write_packet(&mut b, &h, &[]).await;
            let _ = read_packet(&mut b).await;
            let _ = b.write_all(&u32::MAX.to_be_bytes()).await;
        });
        let mut c = Client::new(a);
        assert!(matches!(
            c.auth_list().await,
            Err(ClientError::Unexpected(_))
        ));
        assert!(matches!(
            c.auth_list().await,
            Err(ClientError::Frame(FrameError::BadLength(_)))
        ));
    }
}
