//! The drive side of a disk: cache and IO modes with KubeVirt's defaults (`SetDriverCacheMode`,
//! `SetOptimalIOMode`, `converter.go:400-500`), error policy, discard, serial, shareable and
//! custom block sizes; and the `-blockdev` chain libvirt builds from the image layers (a
//! protocol node and a format node per layer, `libvirt-N-storage`/`libvirt-N-format`, the
//! backing layer read-only below its overlay).

use super::buses::Kind;
use super::sources::Layer;
use crate::cmdline::context::{StorageKind, VolumeFacts};
use crate::cmdline::error::{ConvertError, FieldPath};
use crate::cmdline::qemu::{
    Aio, BackingNode, Blockdev, BlockdevCache, BlockdevFormat, BlockdevProtocol, FormatDriver,
    OnError,
};
use crate::vmi::Disk;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cache {
    None,
    Writethrough,
    Writeback,
}

/// What the frontends and blockdevs of one disk carry besides the image.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct DriveOptions {
    /// Blockdev cache flags (none for an empty cdrom).
    pub(super) cache: Option<BlockdevCache>,
    /// Frontend `write-cache`.
    pub(super) write_cache: Option<&'static str>,
    /// `aio` of the protocol nodes.
    pub(super) aio: Option<Aio>,
    /// `werror`.
    pub(super) werror: OnError,
    /// `rerror` (none for `enospace`).
    pub(super) rerror: Option<OnError>,
    /// `discard` of the format nodes.
    pub(super) discard: Option<&'static str>,
    /// Disk serial.
    pub(super) serial: Option<String>,
    /// `share-rw` (shareable disks).
    pub(super) share_rw: Option<bool>,
    /// Logical and physical block size, discard granularity.
    pub(super) block_sizes: (Option<u32>, Option<u32>, Option<u32>),
}

/// The drive options of disk `d` (at `p`) of `kind`, whose volume has `facts`; `has_image` is
/// false for an empty cdrom.
pub(super) fn options(
    d: &Disk,
    p: &FieldPath,
    kind: Kind,
    has_image: bool,
    facts: &VolumeFacts,
) -> Result<DriveOptions, ConvertError> {
    let shareable = d.shareable == Some(true);
    let cache = match d.cache.as_deref() {
        None if !has_image => None,
        None if shareable || facts.direct_io => Some(Cache::None),
        None => Some(Cache::Writethrough),
        Some("none") => Some(Cache::None),
        Some("writethrough") => Some(Cache::Writethrough),
        Some("writeback") => Some(Cache::Writeback),
        Some(o) => {
            return Err(ConvertError::unsupported(
                p.key("cache"),
                format!("cache mode {o:?}"),
            ))
        }
    };
    if shareable && cache != Some(Cache::None) {
        return Err(ConvertError::invalid(
            p.key("cache"),
            "a shareable disk needs cache \"none\"",
        ));
    }
    if cache == Some(Cache::None) && !facts.direct_io && d.cache.is_some() && has_image {
        return Err(ConvertError::invalid(
            p.key("cache"),
            "cache \"none\" needs O_DIRECT, which the volume's file system does not support",
        ));
    }
    let aio = match d.io.as_deref() {
        None => (cache == Some(Cache::None)
            && (facts.kind == StorageKind::Block || facts.preallocated))
            .then_some(Aio::Native),
        Some("native") => {
            if cache != Some(Cache::None) {
                return Err(ConvertError::invalid(
                    p.key("io"),
                    "io \"native\" needs cache \"none\"",
                ));
            }
            Some(Aio::Native)
        }
        Some("threads") => Some(Aio::Threads),
        Some(o) => {
            return Err(ConvertError::unsupported(
                p.key("io"),
                format!("io mode {o:?}"),
            ))
        }
    };
    let werror = match d.error_policy.as_deref().unwrap_or("stop") {
        "stop" => OnError::Stop,
        "report" => OnError::Report,
        "ignore" => OnError::Ignore,
        "enospace" => OnError::Enospc,
        o => {
            return Err(ConvertError::unsupported(
                p.key("errorPolicy"),
                format!("error policy {o:?}"),
            ))
        }
    };
    let serial = match d.serial.as_deref() {
        None => None,
        Some(s) => {
            if s.is_empty()
                || s.len() > 20
                || !s
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.+-".contains(&b))
            {
                return Err(ConvertError::invalid(
                    p.key("serial"),
                    "a serial is 1 to 20 letters, digits, '_', '.', '+' or '-'",
                ));
            }
            Some(s.to_string())
        }
    };
    let block_sizes = match &d.block_size {
        None => (None, None, None),
        Some(b)
            if b.match_volume
                .as_ref()
                .is_some_and(|m| m.enabled.unwrap_or(true)) =>
        {
            return Err(ConvertError::unsupported(
                p.key("blockSize").key("matchVolume"),
                "matching the volume's block size",
            ))
        }
        Some(b) => {
            let c = b.custom.clone().unwrap_or_default();
            for (v, f) in [(c.logical, "logical"), (c.physical, "physical")] {
                if let Some(v) = v {
                    if !(512..=65536).contains(&v) || !v.is_power_of_two() {
                        return Err(ConvertError::invalid(
                            p.key("blockSize").key("custom").key(f),
                            "block size must be a power of two from 512 to 65536",
                        ));
                    }
                }
            }
            (c.logical, c.physical, c.discard_granularity)
        }
    };
    Ok(DriveOptions {
        cache: cache.map(|c| BlockdevCache {
            direct: c == Cache::None,
            no_flush: false,
        }),
        write_cache: cache.map(|c| match c {
            Cache::None | Cache::Writeback => "on",
            Cache::Writethrough => "off",
        }),
        aio,
        werror,
        rerror: (werror != OnError::Enospc).then_some(werror),
        discard: (kind != Kind::Cdrom && !facts.preallocated).then_some("unmap"),
        serial,
        share_rw: shareable.then_some(true),
        block_sizes,
    })
}

/// The blockdev chain of `layers` (bottom first), numbering nodes down from `*node`; the top
/// format node is read-only when `top_read_only`, every lower one always. Returns the nodes in
/// argv order and the top node name (the frontend's `drive`; none for an empty cdrom).
pub(super) fn chain(
    layers: &[Layer],
    node: &mut usize,
    top_read_only: bool,
    kind: Kind,
    o: &DriveOptions,
) -> (Vec<Blockdev>, Option<String>) {
    let mut blockdevs = Vec::new();
    let mut below: Option<String> = None;
    for (li, layer) in layers.iter().enumerate() {
        let storage = format!("libvirt-{node}-storage");
        let format = format!("libvirt-{node}-format");
        *node -= 1;
        let is_top = li + 1 == layers.len();
        blockdevs.push(Blockdev::Protocol(BlockdevProtocol {
            driver: layer.protocol,
            filename: layer.path.clone(),
            node_name: storage.clone(),
            aio: o.aio,
            cache: o.cache,
            auto_read_only: true,
            discard: Some("unmap"),
        }));
        let backing = match (layer.format, &below) {
            (FormatDriver::Qcow2, Some(b)) => BackingNode::Node(b.clone()),
            (FormatDriver::Qcow2, None) => BackingNode::Null,
            (FormatDriver::Raw, _) => BackingNode::Absent,
        };
        let read_only = if is_top { top_read_only } else { true };
        blockdevs.push(Blockdev::Format(BlockdevFormat {
            node_name: format.clone(),
            read_only,
            discard: if read_only && kind == Kind::Cdrom {
                None
            } else {
                o.discard
            },
            cache: o.cache,
            driver: layer.format,
            file: storage,
            backing,
        }));
        below = Some(format);
    }
    (blockdevs, below)
}
