//! qcow2 header parsing (read-only), after QEMU's `docs/interop/qcow2.txt`.
//!
//! Only what the facts and the overlay need: version, virtual size, cluster size, encryption,
//! incompatible features, the backing file name and format, and the external data file name.

/// `QFI\xfb`, big-endian, at offset 0.
pub(crate) const MAGIC: [u8; 4] = *b"QFI\xfb";
/// Header extension: backing file format name.
const EXT_BACKING_FORMAT: u32 = 0xE279_2ACA;
/// Header extension: external data file name.
const EXT_DATA_FILE: u32 = 0x4441_5441;
/// Incompatible feature bits qlauncher understands: dirty, corrupt, external data file,
/// compression type, extended L2.
const KNOWN_INCOMPATIBLE: u64 = 0b1_1111;
/// Bit 1 of the autoclear features: the external data file is raw (`data-file-raw`).
const AUTOCLEAR_DATA_FILE_RAW: u64 = 1 << 1;
/// Bit 1 of the incompatible features: the image is marked corrupt.
const INCOMPAT_CORRUPT: u64 = 1 << 1;
/// The longest backing file name QEMU accepts.
const MAX_BACKING_NAME: u32 = 1023;
/// How many header bytes are read: enough for every cluster size QEMU writes extensions into
/// (they must fit in the first cluster; at most 2 MiB).
pub(crate) const HEADER_READ: usize = 64 * 1024;

/// The parsed header fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) version: u32,
    pub(crate) cluster_bits: u32,
    /// Virtual size in bytes.
    pub(crate) size: u64,
    pub(crate) encrypted: bool,
    pub(crate) corrupt: bool,
    /// Byte offset and length of the backing file name (0, 0 when there is none).
    pub(crate) backing_name_at: (u64, u32),
    pub(crate) backing_format: Option<String>,
    pub(crate) data_file: Option<String>,
    /// Autoclear bit 1 (`data-file-raw`): the external data file is raw.
    pub(crate) data_file_raw: bool,
}

/// A header problem: `Unsupported` (valid but not for us) or `Malformed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeaderError {
    Unsupported(String),
    Malformed(String),
}

fn be32(buf: &[u8], at: usize) -> Result<u32, HeaderError> {
    buf.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_be_bytes)
        .ok_or_else(|| HeaderError::Malformed(format!("header truncated at byte {at}")))
}

fn be64(buf: &[u8], at: usize) -> Result<u64, HeaderError> {
    buf.get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| HeaderError::Malformed(format!("header truncated at byte {at}")))
}

/// Parses the header from the first bytes of the image (`buf`, up to [`HEADER_READ`] bytes).
pub(crate) fn parse(buf: &[u8]) -> Result<Header, HeaderError> {
    if buf.get(..4) != Some(&MAGIC[..]) {
        return Err(HeaderError::Malformed("no qcow2 magic".into()));
    }
    let version = be32(buf, 4)?;
    if version != 2 && version != 3 {
        return Err(HeaderError::Unsupported(format!("qcow2 version {version}")));
    }
    let backing_offset = be64(buf, 8)?;
    let backing_len = be32(buf, 16)?;
    let cluster_bits = be32(buf, 20)?;
    if !(9..=21).contains(&cluster_bits) {
        return Err(HeaderError::Malformed(format!(
            "cluster_bits {cluster_bits} not in 9..=21"
        )));
    }
    let size = be64(buf, 24)?;
    let crypt_method = be32(buf, 32)?;
    if backing_len > MAX_BACKING_NAME {
        return Err(HeaderError::Malformed(format!(
            "backing file name of {backing_len} bytes (max {MAX_BACKING_NAME})"
        )));
    }
    let (incompatible, autoclear, header_len) = if version == 3 {
        (be64(buf, 72)?, be64(buf, 88)?, be32(buf, 100)?)
    } else {
        (0, 0, 72)
    };
    if version == 3 && (header_len < 104 || header_len % 8 != 0) {
        return Err(HeaderError::Malformed(format!(
            "header_length {header_len} is below 104 or not a multiple of 8"
        )));
    }
    let unknown = incompatible & !KNOWN_INCOMPATIBLE;
    if unknown != 0 {
        return Err(HeaderError::Unsupported(format!(
            "unknown incompatible qcow2 features {unknown:#x}"
        )));
    }
    let mut header = Header {
        version,
        cluster_bits,
        size,
        encrypted: crypt_method != 0,
        corrupt: incompatible & INCOMPAT_CORRUPT != 0,
        backing_name_at: if backing_offset == 0 {
            (0, 0)
        } else {
            (backing_offset, backing_len)
        },
        backing_format: None,
        data_file: None,
        data_file_raw: autoclear & AUTOCLEAR_DATA_FILE_RAW != 0,
    };
    // Header extensions follow the header, each {u32 type, u32 len, data padded to 8}, up to an
    // end marker of type 0 (or the end of the first cluster).
    let cluster = 1usize << cluster_bits;
    let end = buf.len().min(cluster);
    let mut at = header_len as usize;
    loop {
        if at + 8 > end {
            break;
        }
        let kind = be32(buf, at)?;
        let len = be32(buf, at + 4)? as usize;
        if kind == 0 {
            break;
        }
        let data = buf.get(at + 8..at + 8 + len).ok_or_else(|| {
            HeaderError::Malformed(format!("header extension {kind:#x} runs past the cluster"))
        })?;
        let text = || {
            String::from_utf8(data.to_vec()).map_err(|_| {
                HeaderError::Malformed(format!("header extension {kind:#x} is not UTF-8"))
            })
        };
        match kind {
            EXT_BACKING_FORMAT => header.backing_format = Some(text()?),
            EXT_DATA_FILE => header.data_file = Some(text()?),
            _ => {}
        }
        at += 8 + len.div_ceil(8) * 8;
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..600), magic in any::<bool>()) {
            if magic && bytes.len() >= 4 {
                bytes[..4].copy_from_slice(&MAGIC);
            }
            let _ = parse(&bytes);
        }
    }

    /// A v3 header with a backing format extension, as `qemu-img create -b base -F raw` writes.
    fn header_bytes(version: u32, backing: &str, format: Option<&str>) -> Vec<u8> {
        let mut buf = vec![0u8; 4096];
        buf[..4].copy_from_slice(&MAGIC);
        buf[4..8].copy_from_slice(&version.to_be_bytes());
        buf[20..24].copy_from_slice(&16u32.to_be_bytes());
        buf[24..32].copy_from_slice(&(1u64 << 30).to_be_bytes());
        let header_len = if version == 3 { 112 } else { 72 };
        if version == 3 {
            buf[100..104].copy_from_slice(&(header_len as u32).to_be_bytes());
        }
        let mut at = header_len;
        if let Some(format) = format {
            buf[at..at + 4].copy_from_slice(&EXT_BACKING_FORMAT.to_be_bytes());
            buf[at + 4..at + 8].copy_from_slice(&(format.len() as u32).to_be_bytes());
            buf[at + 8..at + 8 + format.len()].copy_from_slice(format.as_bytes());
            at += 8 + format.len().div_ceil(8) * 8;
        }
        at += 8; // end marker
        buf[at..at + backing.len()].copy_from_slice(backing.as_bytes());
        buf[8..16].copy_from_slice(&(at as u64).to_be_bytes());
        buf[16..20].copy_from_slice(&(backing.len() as u32).to_be_bytes());
        buf
    }

    #[test]
    fn v3_header_with_backing_format_parses() {
        let buf = header_bytes(3, "/bases/base.raw", Some("raw"));
        let header = parse(&buf).unwrap();
        assert_eq!(
            header,
            Header {
                version: 3,
                cluster_bits: 16,
                size: 1 << 30,
                encrypted: false,
                corrupt: false,
                backing_name_at: (136, 15),
                backing_format: Some("raw".into()),
                data_file: None,
                data_file_raw: false,
            }
        );
    }

    #[test]
    fn v2_header_without_backing_parses() {
        let mut buf = header_bytes(2, "", None);
        buf[8..20].fill(0);
        let header = parse(&buf).unwrap();
        assert_eq!((header.version, header.backing_name_at), (2, (0, 0)));
    }

    #[test]
    fn bad_headers_are_errors_not_panics() {
        assert!(matches!(parse(b"QFI"), Err(HeaderError::Malformed(_))));
        assert!(matches!(parse(&[0u8; 200]), Err(HeaderError::Malformed(_))));
        let mut v1 = header_bytes(3, "", None);
        v1[4..8].copy_from_slice(&1u32.to_be_bytes());
        assert!(matches!(parse(&v1), Err(HeaderError::Unsupported(_))));
        let mut features = header_bytes(3, "", None);
        features[72..80].copy_from_slice(&(1u64 << 40).to_be_bytes());
        assert!(matches!(parse(&features), Err(HeaderError::Unsupported(_))));
        let mut ext = header_bytes(3, "", None);
        ext[112..116].copy_from_slice(&EXT_BACKING_FORMAT.to_be_bytes());
        ext[116..120].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(parse(&ext), Err(HeaderError::Malformed(_))));
        // Every truncation of a valid header is an error or a parse, never a panic.
        let full = header_bytes(3, "/b", Some("qcow2"));
        for n in 0..200 {
            let _ = parse(&full[..n]);
        }
    }
}
