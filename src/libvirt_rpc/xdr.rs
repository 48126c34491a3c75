//! XDR (RFC 4506) as libvirt's remote protocol uses it: big-endian 32-bit words, 64-bit
//! "hyper"s, variable-length opaque data and strings padded to four bytes, optional data as a
//! boolean discriminant followed by the value.
//!
//! The decoder reads untrusted bytes: every length is checked against the caller's bound and
//! against what is left of the buffer before anything is allocated, and every failure is an
//! [`XdrError`], never a panic.

use std::fmt;

/// Why a buffer is not the XDR the caller expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XdrError {
    /// The buffer ended inside a value.
    Truncated,
    /// A variable-length item declares more than its bound (`remote_protocol.x`'s `<MAX>`).
    TooLong {
        /// What was being read.
        what: &'static str,
        /// The declared length.
        len: u64,
        /// Its bound.
        max: u64,
    },
    /// A string is not UTF-8.
    NotUtf8(&'static str),
    /// An optional's discriminant or a boolean is neither 0 nor 1.
    BadBool(u32),
    /// A union discriminant the protocol does not define.
    BadDiscriminant {
        /// The union.
        what: &'static str,
        /// The value read.
        value: i32,
    },
    /// Bytes follow the last field of a message body.
    Trailing(usize),
    /// Padding bytes are not zero.
    BadPadding,
}

impl fmt::Display for XdrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XdrError::Truncated => write!(f, "XDR data truncated"),
            XdrError::TooLong { what, len, max } => {
                write!(f, "XDR {what} of {len} exceeds its limit {max}")
            }
            XdrError::NotUtf8(what) => write!(f, "XDR string {what} is not UTF-8"),
            XdrError::BadBool(v) => write!(f, "XDR boolean/optional discriminant {v}"),
            XdrError::BadDiscriminant { what, value } => {
                write!(f, "XDR union {what}: unknown discriminant {value}")
            }
            XdrError::Trailing(n) => write!(f, "{n} bytes after the XDR message body"),
            XdrError::BadPadding => write!(f, "XDR padding is not zero"),
        }
    }
}

impl std::error::Error for XdrError {}

fn pad(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// Reads XDR items from a byte slice, front to back.
#[derive(Debug)]
pub struct Decoder<'a> {
    buf: &'a [u8],
}

impl<'a> Decoder<'a> {
    /// A decoder over `buf`.
    pub fn new(buf: &'a [u8]) -> Decoder<'a> {
        Decoder { buf }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Fails unless everything was read (a message body has no trailing bytes).
    pub fn finish(&self) -> Result<(), XdrError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(XdrError::Trailing(self.buf.len()))
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], XdrError> {
        if self.buf.len() < n {
            return Err(XdrError::Truncated);
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    /// `unsigned int`.
    pub fn u32(&mut self) -> Result<u32, XdrError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// `int`.
    pub fn i32(&mut self) -> Result<i32, XdrError> {
        Ok(self.u32()? as i32)
    }

    /// `unsigned hyper`.
    pub fn u64(&mut self) -> Result<u64, XdrError> {
        let hi = self.u32()? as u64;
        let lo = self.u32()? as u64;
        Ok((hi << 32) | lo)
    }

    /// `hyper`.
    pub fn i64(&mut self) -> Result<i64, XdrError> {
        Ok(self.u64()? as i64)
    }

    /// `double` (IEEE 754, big-endian).
    pub fn f64(&mut self) -> Result<f64, XdrError> {
        Ok(f64::from_bits(self.u64()?))
    }

    /// `bool` (and an optional's discriminant).
    pub fn bool(&mut self) -> Result<bool, XdrError> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(XdrError::BadBool(v)),
        }
    }

    /// `opaque name[n]` (fixed length).
    pub fn fixed_opaque(&mut self, n: usize) -> Result<&'a [u8], XdrError> {
        let data = self.take(n)?;
        self.padding(n)?;
        Ok(data)
    }

    fn padding(&mut self, n: usize) -> Result<(), XdrError> {
        if self.take(pad(n))?.iter().any(|b| *b != 0) {
            return Err(XdrError::BadPadding);
        }
        Ok(())
    }

    /// The length word of a variable-length item, refused when it exceeds the item's bound
    /// `max` ([`XdrError::TooLong`] naming `what`).
    fn length(&mut self, what: &'static str, max: usize) -> Result<usize, XdrError> {
        let len = self.u32()?;
        if len as usize > max {
            return Err(XdrError::TooLong {
                what,
                len: u64::from(len),
                max: max as u64,
            });
        }
        Ok(len as usize)
    }

    /// `opaque name<max>`: the length is checked against `max` and the buffer before any copy.
    pub fn opaque(&mut self, what: &'static str, max: usize) -> Result<Vec<u8>, XdrError> {
        let len = self.length(what, max)?;
        Ok(self.fixed_opaque(len)?.to_vec())
    }

    /// `string name<max>` as UTF-8.
    pub fn string(&mut self, what: &'static str, max: usize) -> Result<String, XdrError> {
        String::from_utf8(self.opaque(what, max)?).map_err(|_| XdrError::NotUtf8(what))
    }

    /// `type *name` (an optional): the value when present.
    pub fn optional<T>(
        &mut self,
        f: impl FnOnce(&mut Decoder<'a>) -> Result<T, XdrError>,
    ) -> Result<Option<T>, XdrError> {
        if self.bool()? {
            Ok(Some(f(self)?))
        } else {
            Ok(None)
        }
    }

    /// `type name<max>` (a variable-length array). Each element takes at least four bytes on
    /// the wire, so a count larger than a quarter of what is left is refused before allocating.
    pub fn array<T>(
        &mut self,
        what: &'static str,
        max: usize,
        mut f: impl FnMut(&mut Decoder<'a>) -> Result<T, XdrError>,
    ) -> Result<Vec<T>, XdrError> {
        let n = self.length(what, max)?;
        if n > self.remaining() / 4 {
            return Err(XdrError::Truncated);
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(f(self)?);
        }
        Ok(out)
    }
}

/// Appends XDR items to a byte buffer.
#[derive(Debug, Default, Clone)]
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    /// An empty buffer.
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// The bytes written.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    /// `unsigned int`.
    pub fn u32(&mut self, v: u32) -> &mut Encoder {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// `int`.
    pub fn i32(&mut self, v: i32) -> &mut Encoder {
        self.u32(v as u32)
    }

    /// `unsigned hyper`.
    pub fn u64(&mut self, v: u64) -> &mut Encoder {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// `hyper`.
    pub fn i64(&mut self, v: i64) -> &mut Encoder {
        self.u64(v as u64)
    }

    /// `double`.
    pub fn f64(&mut self, v: f64) -> &mut Encoder {
        self.u64(v.to_bits())
    }

    /// `bool`.
    pub fn bool(&mut self, v: bool) -> &mut Encoder {
        self.u32(v as u32)
    }

    /// `opaque name[n]` (fixed length, written as given).
    pub fn fixed_opaque(&mut self, v: &[u8]) -> &mut Encoder {
        self.buf.extend_from_slice(v);
        self.buf.extend(std::iter::repeat_n(0u8, pad(v.len())));
        self
    }

    /// `opaque name<>`.
    pub fn opaque(&mut self, v: &[u8]) -> &mut Encoder {
        self.u32(v.len() as u32);
        self.fixed_opaque(v)
    }

    /// `string name<>`.
    pub fn string(&mut self, v: &str) -> &mut Encoder {
        self.opaque(v.as_bytes())
    }

    /// `string *name` (libvirt's `remote_string`).
    pub fn optional_string(&mut self, v: Option<&str>) -> &mut Encoder {
        match v {
            Some(s) => self.bool(true).string(s),
            None => self.bool(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_pads() {
        let mut e = Encoder::new();
        e.u32(7)
            .i64(-2)
            .string("abcde")
            .optional_string(None)
            .optional_string(Some("x"));
        let b = e.into_bytes();
        assert_eq!(b.len(), 4 + 8 + 4 + 8 + 4 + 4 + 4 + 4);
        let mut d = Decoder::new(&b);
        assert_eq!(d.u32().unwrap(), 7);
        assert_eq!(d.i64().unwrap(), -2);
        assert_eq!(d.string("s", 16).unwrap(), "abcde");
        assert_eq!(d.optional(|d| d.string("o", 16)).unwrap(), None);
        assert_eq!(
            d.optional(|d| d.string("o", 16)).unwrap().as_deref(),
            Some("x")
        );
        d.finish().unwrap();
    }

    #[test]
    fn refuses_long_and_truncated_items_before_allocating() {
        let b = [0xff, 0xff, 0xff, 0xf0];
        assert!(matches!(
            Decoder::new(&b).opaque("cookie", 1 << 20),
            Err(XdrError::TooLong { .. })
        ));
        assert_eq!(
            Decoder::new(&b).array("params", usize::MAX, |d| d.u32()),
            Err(XdrError::Truncated)
        );
        assert_eq!(
            Decoder::new(&[0, 0, 0, 3, b'a']).string("s", 10),
            Err(XdrError::Truncated)
        );
        assert_eq!(
            Decoder::new(&[0, 0, 0, 1, b'a', 1, 0, 0]).string("s", 10),
            Err(XdrError::BadPadding)
        );
        assert_eq!(
            Decoder::new(&[0, 0, 0, 2]).bool(),
            Err(XdrError::BadBool(2))
        );
    }
}
