//! libvirt's RPC framing (`src/rpc/virnetprotocol.x`): a four-byte big-endian length that
//! counts itself, a six-word header, the XDR body. One frame is one message.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::xdr::{Decoder, Encoder, XdrError};

/// The largest frame libvirt sends or accepts (`VIR_NET_MESSAGE_MAX`, 32 MiB).
pub const MESSAGE_MAX: u32 = 32 << 20;
/// Length word plus header: the shortest frame.
pub const HEADER_LEN: u32 = 4 + 24;

/// The message type (`virNetMessageType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    /// A call that expects a reply.
    Call,
    /// The reply to a call.
    Reply,
    /// An asynchronous message (events, keepalive).
    Message,
    /// Stream data.
    Stream,
    /// A call with file descriptors attached.
    CallWithFds,
    /// A reply with file descriptors attached.
    ReplyWithFds,
    /// A stream hole.
    StreamHole,
}

impl MessageType {
    fn from_wire(v: i32) -> Result<MessageType, XdrError> {
        Ok(match v {
            0 => MessageType::Call,
            1 => MessageType::Reply,
            2 => MessageType::Message,
            3 => MessageType::Stream,
            4 => MessageType::CallWithFds,
            5 => MessageType::ReplyWithFds,
            6 => MessageType::StreamHole,
            value => {
                return Err(XdrError::BadDiscriminant {
                    what: "message type",
                    value,
                })
            }
        })
    }

    fn wire(self) -> i32 {
        self as i32
    }
}

/// The message status (`virNetMessageStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Success (a reply's body is the procedure's `_ret`).
    Ok,
    /// Failure (the body is a `remote_error`).
    Error,
    /// More stream data follows.
    Continue,
}

impl Status {
    fn from_wire(v: i32) -> Result<Status, XdrError> {
        Ok(match v {
            0 => Status::Ok,
            1 => Status::Error,
            2 => Status::Continue,
            value => {
                return Err(XdrError::BadDiscriminant {
                    what: "message status",
                    value,
                })
            }
        })
    }
}

/// The six header words of every frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Program number (`REMOTE_PROGRAM`, `KEEPALIVE_PROGRAM`, ...).
    pub program: u32,
    /// Program version.
    pub version: u32,
    /// Procedure number within the program.
    pub procedure: i32,
    /// Message type.
    pub kind: MessageType,
    /// The caller's serial, echoed by the reply.
    pub serial: u32,
    /// Status.
    pub status: Status,
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Packet {
    /// Its header.
    pub header: Header,
    /// The XDR body after the header.
    pub body: Vec<u8>,
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum FrameError {
    /// The peer closed the connection between frames.
    Closed,
    /// The socket failed, or closed inside a frame.
    Io(std::io::Error),
    /// The length word is shorter than a header or longer than [`MESSAGE_MAX`].
    BadLength(u32),
    /// The header is not XDR libvirt defines.
    Header(XdrError),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Closed => write!(f, "connection closed"),
            FrameError::Io(e) => write!(f, "libvirt RPC socket: {e}"),
            FrameError::BadLength(n) => write!(f, "libvirt RPC frame length {n}"),
            FrameError::Header(e) => write!(f, "libvirt RPC header: {e}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Decodes a whole frame (length word included) from a buffer: what [`read_packet`] does after
/// reading the bytes. Public for the fuzz target.
pub fn decode_frame(frame: &[u8]) -> Result<Packet, FrameError> {
    let mut d = Decoder::new(frame);
    let len = d.u32().map_err(FrameError::Header)?;
    if !(HEADER_LEN..=MESSAGE_MAX).contains(&len) || len as usize != frame.len() {
        return Err(FrameError::BadLength(len));
    }
    let header = decode_header(&mut d).map_err(FrameError::Header)?;
    Ok(Packet {
        header,
        body: frame[HEADER_LEN as usize..].to_vec(),
    })
}

fn decode_header(d: &mut Decoder<'_>) -> Result<Header, XdrError> {
    Ok(Header {
        program: d.u32()?,
        version: d.u32()?,
        procedure: d.i32()?,
        kind: MessageType::from_wire(d.i32()?)?,
        serial: d.u32()?,
        status: Status::from_wire(d.i32()?)?,
    })
}

/// Reads one frame. The length is checked before the body is allocated.
pub async fn read_packet<R: AsyncRead + Unpin>(r: &mut R) -> Result<Packet, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(FrameError::Io(e)),
    }
    let n = u32::from_be_bytes(len);
    if !(HEADER_LEN..=MESSAGE_MAX).contains(&n) {
        return Err(FrameError::BadLength(n));
    }
    let mut rest = vec![0u8; n as usize - 4];
    r.read_exact(&mut rest).await.map_err(FrameError::Io)?;
    let mut d = Decoder::new(&rest);
    let header = decode_header(&mut d).map_err(FrameError::Header)?;
    rest.drain(..24);
    Ok(Packet { header, body: rest })
}

/// Encodes a frame: length, header, body.
pub fn encode_frame(header: &Header, body: &[u8]) -> Vec<u8> {
    let mut e = Encoder::new();
    e.u32(HEADER_LEN + body.len() as u32)
        .u32(header.program)
        .u32(header.version)
        .i32(header.procedure)
        .i32(header.kind.wire())
        .u32(header.serial)
        .i32(header.status as i32);
    let mut out = e.into_bytes();
    out.extend_from_slice(body);
    out
}

/// Writes one frame.
pub async fn write_packet<W: AsyncWrite + Unpin>(
    w: &mut W,
    header: &Header,
    body: &[u8],
) -> std::io::Result<()> {
    w.write_all(&encode_frame(header, body)).await?;
    w.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip_and_bad_lengths() {
        let h = Header {
            program: 0x2000_8086,
            version: 1,
            procedure: 66,
            kind: MessageType::Call,
            serial: 3,
            status: Status::Ok,
        };
        let f = encode_frame(&h, &[0, 0, 0, 1]);
        let p = decode_frame(&f).unwrap();
        assert_eq!(p.header, h);
        assert_eq!(p.body, vec![0, 0, 0, 1]);
        assert!(matches!(
            decode_frame(&f[..f.len() - 1]),
            Err(FrameError::BadLength(_))
        ));
        let mut huge = f.clone();
        huge[..4].copy_from_slice(&(MESSAGE_MAX + 1).to_be_bytes());
        assert!(matches!(decode_frame(&huge), Err(FrameError::BadLength(_))));
    }
}
