//! A small NBD client for the local pull-backup export (the NBD server QEMU runs on a unix
//! socket): fixed newstyle handshake, `NBD_OPT_GO`, structured replies and
//! `NBD_OPT_SET_META_CONTEXT` for block status, `NBD_CMD_READ` with simple replies.
//! Wire format: the NBD protocol (`doc/proto.md` of the NBD project), as libnbd speaks it for
//! KubeVirt's `pkg/storage/nbdclient` (v1.9.0).
//!
//! Every server reply is untrusted: lengths are bounded before anything is allocated, magic
//! numbers, cookies and option numbers are checked, and a violation is an error, never a panic.

use std::io;
use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::UnixStream;

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;

const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const OPT_SET_META_CONTEXT: u32 = 10;

const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_META_CONTEXT: u32 = 4;
const REP_ERROR_BIT: u32 = 1 << 31;
const INFO_EXPORT: u16 = 0;

const CMD_READ: u16 = 0;
const CMD_DISC: u16 = 2;
const CMD_BLOCK_STATUS: u16 = 7;

const REPLY_FLAG_DONE: u16 = 1;
const REPLY_TYPE_NONE: u16 = 0;
const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
const REPLY_TYPE_ERROR_BIT: u16 = 1 << 15;

/// The NBD protocol's limit on a string (export or context name), bytes.
pub const MAX_STRING: usize = 4096;
/// The largest option reply accepted, bytes (an export's info, a context name, a message).
const MAX_OPTION_REPLY: u32 = 64 * 1024;
/// The largest block-status chunk accepted, bytes (up to 128 Ki extents).
const MAX_BLOCK_STATUS_CHUNK: u32 = 1 << 20;
/// The largest single read, bytes: KubeVirt's 256 KiB chunk, with room.
pub const MAX_READ: u32 = 1 << 20;
/// The length asked for by one block-status request, bytes (the server may answer less).
const BLOCK_STATUS_SPAN: u64 = 1 << 30;

/// `base:allocation`: reads as zeroes.
pub const STATE_ZERO: u32 = 2;
/// `qemu:dirty-bitmap:<name>`: the extent is dirty.
pub const STATE_DIRTY: u32 = 1;

/// The base allocation meta context.
pub const CONTEXT_BASE_ALLOCATION: &str = "base:allocation";
/// The prefix of a QEMU dirty-bitmap meta context.
pub const CONTEXT_DIRTY_BITMAP: &str = "qemu:dirty-bitmap:";

/// One extent of a block-status reply: `length` bytes with `flags`, context-relative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawExtent {
    /// Bytes, > 0.
    pub length: u64,
    /// The context's flag bits.
    pub flags: u32,
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// A connection to one export, in transmission phase.
pub struct NbdConn {
    rd: BufReader<tokio::net::unix::OwnedReadHalf>,
    wr: BufWriter<tokio::net::unix::OwnedWriteHalf>,
    size: u64,
    structured: bool,
    /// (context id, name) of each meta context the server agreed to.
    contexts: Vec<(u32, String)>,
    cookie: u64,
}

impl NbdConn {
    /// Connects to `socket`, negotiates export `export` and, when `contexts` is not empty,
    /// structured replies and those meta contexts (each must be granted, else
    /// `server does not support requested context: <name>`, as KubeVirt's client says).
    pub async fn connect(socket: &Path, export: &str, contexts: &[String]) -> io::Result<Self> {
        if export.len() > MAX_STRING || contexts.iter().any(|c| c.len() > MAX_STRING) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "export or context name longer than 4096 bytes",
            ));
        }
        let stream = UnixStream::connect(socket).await.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("failed to connect to {}: {e}", socket.display()),
            )
        })?;
        let (r, w) = stream.into_split();
        let mut conn = NbdConn {
            rd: BufReader::new(r),
            wr: BufWriter::new(w),
            size: 0,
            structured: false,
            contexts: Vec::new(),
            cookie: 0,
        };
        conn.handshake(export, contexts).await?;
        Ok(conn)
    }

    /// The export's size, bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    async fn handshake(&mut self, export: &str, contexts: &[String]) -> io::Result<()> {
        if self.rd.read_u64().await? != NBDMAGIC || self.rd.read_u64().await? != IHAVEOPT {
            return Err(bad("not a newstyle NBD server"));
        }
        let flags = self.rd.read_u16().await?;
        if flags & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(bad("NBD server is not fixed newstyle"));
        }
        let client_flags = u32::from(FLAG_FIXED_NEWSTYLE | (flags & FLAG_NO_ZEROES));
        self.wr.write_u32(client_flags).await?;
        if !contexts.is_empty() {
            self.send_option(OPT_STRUCTURED_REPLY, &[]).await?;
            let (rep, _) = self.read_option_reply(OPT_STRUCTURED_REPLY).await?;
            if rep != REP_ACK {
                return Err(bad("NBD server refused structured replies"));
            }
            self.structured = true;
            let mut data = Vec::new();
            put_string(&mut data, export);
            data.extend_from_slice(&(contexts.len() as u32).to_be_bytes());
            for c in contexts {
                put_string(&mut data, c);
            }
            self.send_option(OPT_SET_META_CONTEXT, &data).await?;
            loop {
                let (rep, payload) = self.read_option_reply(OPT_SET_META_CONTEXT).await?;
                match rep {
                    REP_ACK => break,
                    REP_META_CONTEXT if payload.len() >= 4 => {
                        let id =
                            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                        let name = String::from_utf8_lossy(&payload[4..]).into_owned();
                        self.contexts.push((id, name));
                    }
                    _ => return Err(bad("malformed NBD meta context reply")),
                }
            }
            for c in contexts {
                if !self.contexts.iter().any(|(_, n)| n == c) {
                    return Err(bad(format!(
                        "server does not support requested context: {c}"
                    )));
                }
            }
        }
        let mut data = Vec::new();
        put_string(&mut data, export);
        data.extend_from_slice(&0u16.to_be_bytes());
        self.send_option(OPT_GO, &data).await?;
        let mut size = None;
        loop {
            let (rep, payload) = self.read_option_reply(OPT_GO).await?;
            match rep {
                REP_ACK => break,
                REP_INFO => {
                    if payload.len() >= 12
                        && u16::from_be_bytes([payload[0], payload[1]]) == INFO_EXPORT
                    {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(&payload[2..10]);
                        size = Some(u64::from_be_bytes(b));
                    }
                }
                _ => return Err(bad("unexpected NBD reply to NBD_OPT_GO")),
            }
        }
        self.size = size.ok_or_else(|| bad("NBD server sent no export size"))?;
        Ok(())
    }

    async fn send_option(&mut self, option: u32, data: &[u8]) -> io::Result<()> {
        self.wr.write_u64(IHAVEOPT).await?;
        self.wr.write_u32(option).await?;
        self.wr.write_u32(data.len() as u32).await?;
        self.wr.write_all(data).await?;
        self.wr.flush().await
    }

    /// One option reply: (reply type, payload). An error reply is an error naming it.
    async fn read_option_reply(&mut self, option: u32) -> io::Result<(u32, Vec<u8>)> {
        if self.rd.read_u64().await? != OPT_REPLY_MAGIC {
            return Err(bad("bad NBD option reply magic"));
        }
        if self.rd.read_u32().await? != option {
            return Err(bad("NBD option reply for another option"));
        }
        let rep = self.rd.read_u32().await?;
        let len = self.rd.read_u32().await?;
        if len > MAX_OPTION_REPLY {
            return Err(bad(format!("NBD option reply of {len} bytes")));
        }
        let mut payload = vec![0u8; len as usize];
        self.rd.read_exact(&mut payload).await?;
        if rep & REP_ERROR_BIT != 0 {
            return Err(bad(format!(
                "NBD server refused option {option} ({:#x}): {}",
                rep,
                String::from_utf8_lossy(&payload)
            )));
        }
        Ok((rep, payload))
    }

    async fn send_request(
        &mut self,
        flags: u16,
        kind: u16,
        offset: u64,
        length: u32,
    ) -> io::Result<u64> {
        self.cookie = self.cookie.wrapping_add(1);
        self.wr.write_u32(REQUEST_MAGIC).await?;
        self.wr.write_u16(flags).await?;
        self.wr.write_u16(kind).await?;
        self.wr.write_u64(self.cookie).await?;
        self.wr.write_u64(offset).await?;
        self.wr.write_u32(length).await?;
        self.wr.flush().await?;
        Ok(self.cookie)
    }

    /// Reads `buf.len()` (≤ [`MAX_READ`]) bytes at `offset`. Needs a connection without
    /// meta contexts (simple replies).
    pub async fn read(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.structured || buf.len() > MAX_READ as usize {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad NBD read"));
        }
        let cookie = self
            .send_request(0, CMD_READ, offset, buf.len() as u32)
            .await?;
        if self.rd.read_u32().await? != SIMPLE_REPLY_MAGIC {
            return Err(bad("bad NBD reply magic"));
        }
        let error = self.rd.read_u32().await?;
        if self.rd.read_u64().await? != cookie {
            return Err(bad("NBD reply for another request"));
        }
        if error != 0 {
            return Err(io::Error::other(format!(
                "NBD read at {offset} failed: error {error}"
            )));
        }
        self.rd.read_exact(buf).await?;
        Ok(())
    }

    /// Block status of `[offset, offset + length)`: for each negotiated context (by name), its
    /// extents from `offset` on, as the server answered them (possibly shorter than asked;
    /// each context's total clamped to the asked length).
    pub async fn block_status(
        &mut self,
        offset: u64,
        length: u64,
    ) -> io::Result<Vec<(String, Vec<RawExtent>)>> {
        if !self.structured {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no meta context",
            ));
        }
        let span = length.min(BLOCK_STATUS_SPAN) as u32;
        let cookie = self.send_request(0, CMD_BLOCK_STATUS, offset, span).await?;
        let mut out: Vec<(String, Vec<RawExtent>)> = Vec::new();
        loop {
            if self.rd.read_u32().await? != STRUCTURED_REPLY_MAGIC {
                return Err(bad("bad NBD structured reply magic"));
            }
            let flags = self.rd.read_u16().await?;
            let kind = self.rd.read_u16().await?;
            if self.rd.read_u64().await? != cookie {
                return Err(bad("NBD reply for another request"));
            }
            let len = self.rd.read_u32().await?;
            if len > MAX_BLOCK_STATUS_CHUNK {
                return Err(bad(format!("NBD reply chunk of {len} bytes")));
            }
            let mut payload = vec![0u8; len as usize];
            self.rd.read_exact(&mut payload).await?;
            match kind {
                REPLY_TYPE_NONE => {}
                REPLY_TYPE_BLOCK_STATUS => {
                    if payload.len() < 4 || !(payload.len() - 4).is_multiple_of(8) {
                        return Err(bad("malformed NBD block status chunk"));
                    }
                    let id = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                    let name = self
                        .contexts
                        .iter()
                        .find(|(i, _)| *i == id)
                        .map(|(_, n)| n.clone())
                        .ok_or_else(|| bad("NBD block status for an unknown context"))?;
                    let mut extents = Vec::with_capacity((payload.len() - 4) / 8);
                    let mut total = 0u64;
                    for d in payload[4..].chunks_exact(8) {
                        let l = u64::from(u32::from_be_bytes([d[0], d[1], d[2], d[3]]));
                        let f = u32::from_be_bytes([d[4], d[5], d[6], d[7]]);
                        let l = l.min(u64::from(span) - total);
                        if l == 0 {
                            break;
                        }
                        total += l;
                        extents.push(RawExtent {
                            length: l,
                            flags: f,
                        });
                    }
                    out.push((name, extents));
                }
                k if k & REPLY_TYPE_ERROR_BIT != 0 => {
                    let code = payload
                        .get(..4)
                        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                        .unwrap_or(0);
                    let msg = payload
                        .get(6..)
                        .map(|m| String::from_utf8_lossy(m).into_owned())
                        .unwrap_or_default();
                    return Err(io::Error::other(format!(
                        "NBD block status at {offset} failed: error {code} {msg}"
                    )));
                }
                _ => return Err(bad(format!("unexpected NBD reply chunk type {kind}"))),
            }
            if flags & REPLY_FLAG_DONE != 0 {
                break;
            }
        }
        Ok(out)
    }

    /// Sends `NBD_CMD_DISC` (best effort; the server closes the connection).
    pub async fn disconnect(mut self) {
        let _ = self.send_request(0, CMD_DISC, 0, 0).await;
    }
}

fn put_string(data: &mut Vec<u8>, s: &str) {
    data.extend_from_slice(&(s.len() as u32).to_be_bytes());
    data.extend_from_slice(s.as_bytes());
}
