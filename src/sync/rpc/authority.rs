//! Any `:authority` on the command socket: a filter on each accepted Unix stream that replaces a
//! client's `:authority` the HTTP/2 server would reject by `localhost`.
//!
//! Why: on a Unix socket the authority means nothing, and clients send what their library makes of
//! the target. Go's gRPC (virt-handler) sends `localhost`. gRPC C-core, and so grpcio (Python, Ruby,
//! PHP, C++), sends the socket path with its leading `/` stripped: raw before C-core 1.57
//! (`var/run/kubevirt/sockets/launcher-sock`), percent-encoded since (grpc/grpc#33571:
//! `var%2Frun%2Fkubevirt%2Fsockets%2Flauncher-sock`; `ResolverFactory::GetDefaultAuthority`,
//! grpc/grpc#38142). grpc-java sends the path itself. The `h2` crate under tonic parses
//! `:authority` with `http::uri::Authority` and answers any such request with RST_STREAM
//! PROTOCOL_ERROR before a service sees it (hyperium/h2#487, still open); neither h2, hyper nor tonic
//! has a setting to relax it. So the client's side of the stream is filtered before h2 reads it.
//!
//! What the filter does: the 24-byte connection preface and every frame but HEADERS and CONTINUATION
//! pass unchanged (frame payloads stream through, nothing buffered). A header block (HEADERS plus its
//! CONTINUATIONs) is decoded with the client's HPACK context ([`loona_hpack::Decoder`]); an
//! `:authority` that `http::uri::Authority` does not accept, or that is empty, becomes `localhost`;
//! the block is re-encoded with the filter's own HPACK context ([`loona_hpack::Encoder`], the 4096
//! byte dynamic table both ends start with; the server never advertises another) and sent as one
//! HEADERS frame without padding, followed by CONTINUATIONs when it exceeds 16384 bytes (the
//! smallest maximum frame size HTTP/2 allows). HPACK is stateful, so every block is re-encoded, not
//! only the changed ones. Stream ids, END_STREAM and the PRIORITY fields are kept. A stream that does
//! not start with the HTTP/2 preface passes untouched. The server's side (responses) is not touched.
//!
//! Errors close the connection (`io::ErrorKind::InvalidData`) where h2 would have sent GOAWAY: an
//! undecodable header block, a CONTINUATION out of place, padding longer than its frame, or a header
//! block over [`MAX_HEADER_BLOCK`] (the server accepts 16 KiB of decoded headers).

use loona_hpack::{Decoder, Encoder};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tonic::codegen::http::uri::Authority;
use tonic::transport::server::{Connected, UdsConnectInfo};

/// The client connection preface (RFC 9113 section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame header length (RFC 9113 section 4.1).
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Largest frame payload the filter emits: SETTINGS_MAX_FRAME_SIZE's initial and smallest value.
const MAX_EMITTED_PAYLOAD: usize = 16_384;
/// Largest encoded header block (all its frames' fragments) the filter accepts, in bytes.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// HPACK dynamic table size both ends start with (SETTINGS_HEADER_TABLE_SIZE's initial value).
const HPACK_TABLE_SIZE: usize = 4096;
/// What an unusable `:authority` is replaced by: what Go's gRPC and KubeVirt send on Unix sockets.
pub const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// Where the filter is in the client's byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading the connection preface.
    Preface,
    /// Between frames: waiting for a frame header.
    FrameHeader,
    /// Inside a frame the filter does not look into: this many payload bytes still to pass.
    PassThrough(usize),
    /// Collecting a HEADERS or CONTINUATION frame's payload.
    HeaderFrame {
        kind: u8,
        flags: u8,
        stream_id: u32,
        len: usize,
    },
    /// Not HTTP/2 (no preface): everything passes.
    Transparent,
}

/// A header block whose END_HEADERS has not come yet.
#[derive(Debug)]
struct OpenBlock {
    stream_id: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The sans-I/O filter of one connection's client-to-server bytes (see the module docs).
pub struct AuthorityFilter {
    phase: Phase,
    /// Bytes received and not yet consumed by the current phase.
    pending: Vec<u8>,
    open: Option<OpenBlock>,
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
    replaced: u64,
}

impl std::fmt::Debug for AuthorityFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityFilter")
            .field("phase", &self.phase)
            .field("pending", &self.pending.len())
            .field("replaced", &self.replaced)
            .finish_non_exhaustive()
    }
}

impl Default for AuthorityFilter {
    fn default() -> Self {
        Self::new()
    }
}

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

impl AuthorityFilter {
    /// A filter at the start of a connection.
    pub fn new() -> AuthorityFilter {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(HPACK_TABLE_SIZE);
        AuthorityFilter {
            phase: Phase::Preface,
            pending: Vec::new(),
            open: None,
            decoder,
            encoder: Encoder::new(),
            replaced: 0,
        }
    }

    /// How many `:authority` values were replaced so far.
    pub fn replaced(&self) -> u64 {
        self.replaced
    }

    /// Feeds `input` (bytes read from the client, split anywhere) and appends to `out` the bytes to
    /// hand to the HTTP/2 server. Incomplete frames stay buffered until the next call.
    ///
    /// # Errors
    /// `InvalidData` (see the module docs); the connection should then be closed.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        if let Phase::Transparent = self.phase {
            out.extend_from_slice(input);
            return Ok(());
        }
        self.pending.extend_from_slice(input);
        let mut at = 0;
        loop {
            let rest = &self.pending[at..];
            match self.phase {
                Phase::Transparent => {
                    out.extend_from_slice(rest);
                    at = self.pending.len();
                    break;
                }
                Phase::Preface => {
                    let n = rest.len().min(PREFACE.len());
                    if rest[..n] != PREFACE[..n] {
                        self.phase = Phase::Transparent;
                        continue;
                    }
                    if n < PREFACE.len() {
                        break;
                    }
                    out.extend_from_slice(PREFACE);
                    at += PREFACE.len();
                    self.phase = Phase::FrameHeader;
                }
                Phase::FrameHeader => {
                    if rest.len() < FRAME_HEADER_LEN {
                        break;
                    }
                    let len = usize::from(rest[0]) << 16
                        | usize::from(rest[1]) << 8
                        | usize::from(rest[2]);
                    let kind = rest[3];
                    let flags = rest[4];
                    let stream_id =
                        u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
                    if kind == TYPE_HEADERS || kind == TYPE_CONTINUATION {
                        if len > MAX_HEADER_BLOCK {
                            return Err(invalid(format!(
                                "a header frame of {len} bytes exceeds {MAX_HEADER_BLOCK}"
                            )));
                        }
                        self.phase = Phase::HeaderFrame {
                            kind,
                            flags,
                            stream_id,
                            len,
                        };
                    } else {
                        if self.open.is_some() {
                            return Err(invalid(
                                "a frame other than CONTINUATION inside a header block",
                            ));
                        }
                        out.extend_from_slice(&rest[..FRAME_HEADER_LEN]);
                        self.phase = Phase::PassThrough(len);
                    }
                    at += FRAME_HEADER_LEN;
                }
                Phase::PassThrough(remaining) => {
                    if remaining == 0 {
                        self.phase = Phase::FrameHeader;
                        continue;
                    }
                    if rest.is_empty() {
                        break;
                    }
                    let n = rest.len().min(remaining);
                    out.extend_from_slice(&rest[..n]);
                    at += n;
                    self.phase = Phase::PassThrough(remaining - n);
                }
                Phase::HeaderFrame {
                    kind,
                    flags,
                    stream_id,
                    len,
                } => {
                    if rest.len() < len {
                        break;
                    }
                    let payload = rest[..len].to_vec();
                    at += len;
                    self.phase = Phase::FrameHeader;
                    self.header_frame(kind, flags, stream_id, &payload, out)?;
                }
            }
        }
        self.pending.drain(..at);
        Ok(())
    }

    fn header_frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream_id: u32,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        if kind == TYPE_HEADERS {
            if self.open.is_some() {
                return Err(invalid("HEADERS inside another header block"));
            }
            let mut body = payload;
            let mut pad = 0;
            if flags & FLAG_PADDED != 0 {
                let (&n, tail) = body
                    .split_first()
                    .ok_or_else(|| invalid("PADDED HEADERS without its pad length"))?;
                pad = usize::from(n);
                body = tail;
            }
            let mut priority = None;
            if flags & FLAG_PRIORITY != 0 {
                if body.len() < 5 {
                    return Err(invalid("HEADERS too short for its PRIORITY fields"));
                }
                let mut fields = [0; 5];
                fields.copy_from_slice(&body[..5]);
                priority = Some(fields);
                body = &body[5..];
            }
            if pad > body.len() {
                return Err(invalid("HEADERS padding longer than the frame"));
            }
            self.open = Some(OpenBlock {
                stream_id,
                end_stream: flags & FLAG_END_STREAM != 0,
                priority,
                fragment: body[..body.len() - pad].to_vec(),
            });
        } else {
            let block = self
                .open
                .as_mut()
                .filter(|block| block.stream_id == stream_id)
                .ok_or_else(|| invalid("CONTINUATION without its HEADERS"))?;
            if block.fragment.len() + payload.len() > MAX_HEADER_BLOCK {
                return Err(invalid(format!(
                    "a header block exceeds {MAX_HEADER_BLOCK} bytes"
                )));
            }
            block.fragment.extend_from_slice(payload);
        }
        if flags & FLAG_END_HEADERS != 0 {
            if let Some(block) = self.open.take() {
                self.finish(block, out)?;
            }
        }
        Ok(())
    }

    fn finish(&mut self, block: OpenBlock, out: &mut Vec<u8>) -> io::Result<()> {
        let mut headers = self
            .decoder
            .decode(&block.fragment)
            .map_err(|error| invalid(format!("decoding a header block: {error:?}")))?;
        for (name, value) in &mut headers {
            if name.as_slice() == b":authority" && !acceptable_authority(value) {
                tracing::debug!(
                    authority = %String::from_utf8_lossy(value),
                    "replacing the client's :authority by localhost"
                );
                *value = REPLACEMENT_AUTHORITY.to_vec();
                self.replaced += 1;
            }
        }
        let encoded = self
            .encoder
            .encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let mut first_flags = if block.end_stream { FLAG_END_STREAM } else { 0 };
        let mut prefix: &[u8] = &[];
        if let Some(priority) = &block.priority {
            first_flags |= FLAG_PRIORITY;
            prefix = priority;
        }
        let first_room = MAX_EMITTED_PAYLOAD - prefix.len();
        let (first, mut rest) = encoded.split_at(encoded.len().min(first_room));
        if rest.is_empty() {
            first_flags |= FLAG_END_HEADERS;
        }
        frame(
            out,
            TYPE_HEADERS,
            first_flags,
            block.stream_id,
            &[prefix, first],
        );
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(rest.len().min(MAX_EMITTED_PAYLOAD));
            let flags = if tail.is_empty() { FLAG_END_HEADERS } else { 0 };
            frame(out, TYPE_CONTINUATION, flags, block.stream_id, &[chunk]);
            rest = tail;
        }
        Ok(())
    }
}

/// True when h2 accepts `value` as `:authority` (it parses it with `http::uri::Authority`).
fn acceptable_authority(value: &[u8]) -> bool {
    !value.is_empty() && Authority::try_from(value).is_ok()
}

/// Appends one frame whose payload is the concatenation of `parts`.
fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream_id: u32, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let len = u32::try_from(len).expect("an emitted frame is at most 16384 bytes");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
    for part in parts {
        out.extend_from_slice(part);
    }
}

/// An accepted Unix stream whose client-to-server bytes pass through an [`AuthorityFilter`];
/// writes go straight to the socket.
#[derive(Debug)]
pub struct AuthorityFilteredStream {
    inner: UnixStream,
    filter: AuthorityFilter,
    /// Filtered bytes not yet handed to the reader, from `out_at` on.
    out: Vec<u8>,
    out_at: usize,
    raw: Box<[u8]>,
}

impl AuthorityFilteredStream {
    /// Wraps an accepted connection.
    pub fn new(inner: UnixStream) -> AuthorityFilteredStream {
        AuthorityFilteredStream {
            inner,
            filter: AuthorityFilter::new(),
            out: Vec::new(),
            out_at: 0,
            raw: vec![0; 16 * 1024].into_boxed_slice(),
        }
    }
}

impl AsyncRead for AuthorityFilteredStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_at < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_at);
                buf.put_slice(&this.out[this.out_at..this.out_at + n]);
                this.out_at += n;
                if this.out_at == this.out.len() {
                    this.out.clear();
                    this.out_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut raw = ReadBuf::new(&mut this.raw);
            match Pin::new(&mut this.inner).poll_read(cx, &mut raw) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Ready(Ok(())) => {
                    let filled = raw.filled();
                    if filled.is_empty() {
                        // End of stream; a partial frame left in the filter is dropped, as the
                        // server would have dropped it.
                        return Poll::Ready(Ok(()));
                    }
                    this.filter.feed(filled, &mut this.out)?;
                }
            }
        }
    }
}

impl AsyncWrite for AuthorityFilteredStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl Connected for AuthorityFilteredStream {
    type ConnectInfo = UdsConnectInfo;

    fn connect_info(&self) -> UdsConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers_frame(flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        frame(&mut out, TYPE_HEADERS, flags, stream_id, &[payload]);
        out
    }

    /// Splits filtered output into frames (after the preface) and decodes each header block.
    fn parse(output: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        assert_eq!(&output[..24], PREFACE);
        let mut frames = Vec::new();
        let mut at = 24;
        while at < output.len() {
            let h = &output[at..at + 9];
            let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
            let id = u32::from_be_bytes([h[5], h[6], h[7], h[8]]);
            frames.push((h[3], h[4], id, output[at + 9..at + 9 + len].to_vec()));
            at += 9 + len;
        }
        frames
    }

    fn request(authority: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (b":path".to_vec(), b"/kubevirt.cmd.v1.Cmd/Ping".to_vec()),
            (b":authority".to_vec(), authority.to_vec()),
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
            (b"te".to_vec(), b"trailers".to_vec()),
        ]
    }

    fn encode(encoder: &mut Encoder<'_>, headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
    }

    #[test]
    fn c_core_authorities_become_localhost_and_valid_ones_stay() {
        let mut client = Encoder::new();
        let mut input = PREFACE.to_vec();
        // SETTINGS (empty), passes through.
        frame(&mut input, 0x4, 0, 0, &[]);
        let authorities: [&[u8]; 5] = [
            b"var%2Frun%2Fkubevirt%2Fsockets%2Flauncher-sock",
            b"var/run/kubevirt/sockets/launcher-sock",
            b"/var/run/kubevirt/sockets/launcher-sock",
            b"",
            b"localhost:1234",
        ];
        for (i, authority) in authorities.iter().enumerate() {
            let block = encode(&mut client, &request(authority));
            input.extend(headers_frame(FLAG_END_HEADERS, 1 + 2 * i as u32, &block));
            // A DATA frame with END_STREAM, passed through.
            frame(
                &mut input,
                0x0,
                FLAG_END_STREAM,
                1 + 2 * i as u32,
                &[&[0, 0, 0, 0, 0]],
            );
        }
        // Fed one byte at a time: frames split anywhere.
        let mut filter = AuthorityFilter::new();
        let mut output = Vec::new();
        for byte in &input {
            filter
                .feed(std::slice::from_ref(byte), &mut output)
                .unwrap();
        }
        assert_eq!(filter.replaced(), 4);
        let frames = parse(&output);
        assert_eq!(frames.len(), 1 + 2 * authorities.len());
        assert_eq!((frames[0].0, frames[0].3.len()), (0x4, 0));
        let mut server = Decoder::new();
        for (i, authority) in authorities.iter().enumerate() {
            let (kind, flags, id, payload) = &frames[1 + 2 * i];
            assert_eq!(
                (*kind, *flags, *id),
                (TYPE_HEADERS, FLAG_END_HEADERS, 1 + 2 * i as u32)
            );
            let expected = if i == 4 {
                authority
            } else {
                &REPLACEMENT_AUTHORITY
            };
            assert_eq!(server.decode(payload).unwrap(), request(expected));
            assert_eq!(frames[2 + 2 * i].3, vec![0, 0, 0, 0, 0]);
        }
    }

    #[test]
    fn padding_priority_and_continuations_are_handled() {
        let mut client = Encoder::new();
        let mut headers = request(b"tmp%2Fx.sock");
        headers.push((b"x-big".to_vec(), vec![b'a'; 20_000]));
        let block = encode(&mut client, &headers);
        let mut input = PREFACE.to_vec();
        // HEADERS: PADDED | PRIORITY | END_STREAM, first 100 bytes of the block, 3 bytes of padding.
        let mut payload = vec![3];
        payload.extend_from_slice(&[0x80, 0, 0, 0, 15]);
        payload.extend_from_slice(&block[..100]);
        payload.extend_from_slice(&[0, 0, 0]);
        input.extend(headers_frame(
            FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM,
            3,
            &payload,
        ));
        frame(&mut input, TYPE_CONTINUATION, 0, 3, &[&block[100..5000]]);
        frame(
            &mut input,
            TYPE_CONTINUATION,
            FLAG_END_HEADERS,
            3,
            &[&block[5000..]],
        );
        let mut filter = AuthorityFilter::new();
        let mut output = Vec::new();
        filter.feed(&input, &mut output).unwrap();
        let frames = parse(&output);
        assert_eq!(frames.len(), 2, "the 20 KB block needs one CONTINUATION");
        let (kind, flags, id, first) = &frames[0];
        assert_eq!(
            (*kind, *flags, *id),
            (TYPE_HEADERS, FLAG_PRIORITY | FLAG_END_STREAM, 3)
        );
        assert_eq!(&first[..5], &[0x80, 0, 0, 0, 15]);
        assert_eq!(first.len(), MAX_EMITTED_PAYLOAD);
        let (kind, flags, id, second) = &frames[1];
        assert_eq!(
            (*kind, *flags, *id),
            (TYPE_CONTINUATION, FLAG_END_HEADERS, 3)
        );
        let mut reassembled = first[5..].to_vec();
        reassembled.extend_from_slice(second);
        let mut expected = headers.clone();
        expected[3].1 = REPLACEMENT_AUTHORITY.to_vec();
        assert_eq!(Decoder::new().decode(&reassembled).unwrap(), expected);
    }

    #[test]
    fn the_dynamic_table_stays_in_step_across_blocks() {
        // The client indexes its headers; its second block refers to its dynamic table.
        let mut client = Encoder::new();
        let mut input = PREFACE.to_vec();
        for id in [1, 3, 5] {
            let block = encode(&mut client, &request(b"a%2Fb"));
            input.extend(headers_frame(
                FLAG_END_HEADERS | FLAG_END_STREAM,
                id,
                &block,
            ));
        }
        let mut filter = AuthorityFilter::new();
        let mut output = Vec::new();
        filter.feed(&input, &mut output).unwrap();
        let mut server = Decoder::new();
        for (_, _, _, payload) in parse(&output) {
            assert_eq!(server.decode(&payload).unwrap(), request(b"localhost"));
        }
    }

    #[test]
    fn malformed_input_is_refused_and_non_http2_passes() {
        let mut out = Vec::new();
        let mut input = PREFACE.to_vec();
        frame(&mut input, TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &[b"x"]);
        assert!(AuthorityFilter::new().feed(&input, &mut out).is_err());

        let mut input = PREFACE.to_vec();
        input.extend(headers_frame(FLAG_END_HEADERS | FLAG_PADDED, 1, &[9, 0x82]));
        assert!(AuthorityFilter::new().feed(&input, &mut out).is_err());

        let mut input = PREFACE.to_vec();
        input.extend(headers_frame(
            FLAG_END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff],
        ));
        assert!(AuthorityFilter::new().feed(&input, &mut out).is_err());

        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&[0x01, 0x00, 0x01, TYPE_HEADERS, 0, 0, 0, 0, 1]);
        assert!(
            AuthorityFilter::new().feed(&input, &mut out).is_err(),
            "64 KiB + 1 header frame"
        );

        let mut out = Vec::new();
        AuthorityFilter::new()
            .feed(b"GET / HTTP/1.1\r\n\r\n", &mut out)
            .unwrap();
        assert_eq!(out, b"GET / HTTP/1.1\r\n\r\n");
    }
}
