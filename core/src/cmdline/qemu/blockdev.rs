//! `-blockdev` / `blockdev-add` argument structs (QEMU `BlockdevOptions`): a protocol node
//! (`file`, `host_device`) and a format node (`raw`, `qcow2`) on top of it, libvirt-style
//! (`libvirt-N-storage` / `libvirt-N-format`, see libvirt's `qemu_block.c`).

use serde::Serialize;
use serde_with::skip_serializing_none;

/// QEMU `BlockdevCacheOptions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BlockdevCache {
    /// O_DIRECT (`cache=none`/`directsync`).
    pub direct: bool,
    /// Ignore flushes (`cache=unsafe`).
    #[serde(rename = "no-flush")]
    pub no_flush: bool,
}

/// Protocol driver of the bottom node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ProtocolDriver {
    /// A regular file.
    #[serde(rename = "file")]
    File,
    /// A block device node.
    #[serde(rename = "host_device")]
    HostDevice,
}

/// Format driver of a format node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FormatDriver {
    /// Raw image.
    Raw,
    /// qcow2 image.
    Qcow2,
}

/// QEMU `BlockdevAioOptions` (KubeVirt's `io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Aio {
    /// Thread pool (QEMU default).
    Threads,
    /// Linux native AIO (needs O_DIRECT).
    Native,
    /// Linux io_uring (QEMU 5.0+, built with liburing; libvirt's `io='io_uring'`).
    #[serde(rename = "io_uring")]
    IoUring,
}

/// A protocol (storage) node: `{"driver":"file","filename":..,"node-name":"libvirt-N-storage",..}`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlockdevProtocol {
    /// `file` or `host_device`.
    pub driver: ProtocolDriver,
    /// Absolute path of the image or device.
    pub filename: String,
    /// Node name.
    #[serde(rename = "node-name")]
    pub node_name: String,
    /// AIO mode.
    pub aio: Option<Aio>,
    /// Cache flags.
    pub cache: Option<BlockdevCache>,
    /// Open read-only when the users above do not need write (always true, as libvirt).
    #[serde(rename = "auto-read-only")]
    pub auto_read_only: bool,
    /// `unmap` to pass discards down.
    pub discard: Option<&'static str>,
}

/// A format node: `{"node-name":"libvirt-N-format","driver":"qcow2","file":..,"backing":..}`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlockdevFormat {
    /// Node name.
    #[serde(rename = "node-name")]
    pub node_name: String,
    /// Read-only node (cdrom, readonly disks, backing files).
    #[serde(rename = "read-only")]
    pub read_only: bool,
    /// `unmap` to pass discards down.
    pub discard: Option<&'static str>,
    /// Cache flags.
    pub cache: Option<BlockdevCache>,
    /// `detect-zeroes` (`unmap`: zero writes become discards). libvirt sets it only from a
    /// disk's `<driver detect_zeroes>`, which KubeVirt never writes; qlauncher sets it on a
    /// push backup's target only (`src/sync/backup`), so a full backup stays as sparse as
    /// the disk's data.
    #[serde(rename = "detect-zeroes")]
    pub detect_zeroes: Option<&'static str>,
    /// Format driver.
    pub driver: FormatDriver,
    /// Node name of the protocol node below.
    pub file: String,
    /// qcow2 only: the node name of the protocol node of the external data file (libvirt's
    /// `<dataStore>`, KubeVirt's CBT overlays, `data-file-raw` recorded in the image).
    #[serde(rename = "data-file")]
    pub data_file: Option<String>,
    /// qcow2 only: the node name of the backing format node; libvirt always names it so QEMU
    /// never opens a backing file by itself. `None` on a qcow2 base means `"backing": null`.
    #[serde(skip_serializing_if = "BackingNode::is_absent")]
    pub backing: BackingNode,
}

/// The `backing` member of a qcow2 node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum BackingNode {
    /// Not written (raw nodes).
    #[default]
    Absent,
    /// `"backing": null`: no backing file is opened.
    Null,
    /// `"backing": "<node-name>"`.
    Node(String),
}

impl BackingNode {
    fn is_absent(&self) -> bool {
        matches!(self, BackingNode::Absent)
    }
}

impl Serialize for BackingNode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            BackingNode::Absent | BackingNode::Null => s.serialize_none(),
            BackingNode::Node(n) => s.serialize_str(n),
        }
    }
}

/// One blockdev node.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Blockdev {
    /// Protocol node.
    Protocol(BlockdevProtocol),
    /// Format node.
    Format(BlockdevFormat),
}

impl Blockdev {
    /// The node name.
    pub fn node_name(&self) -> &str {
        match self {
            Blockdev::Protocol(b) => &b.node_name,
            Blockdev::Format(b) => &b.node_name,
        }
    }
}

impl Blockdev {
    /// Renames every node name this node carries (its own `node-name`, a format node's `file`,
    /// `data-file` and `backing`) for which `rename` returns a new name; others stay.
    pub fn rename_nodes(&mut self, rename: &mut impl FnMut(&str) -> Option<String>) {
        let mut apply = |n: &mut String| {
            if let Some(new) = rename(n) {
                *n = new;
            }
        };
        match self {
            Blockdev::Protocol(b) => apply(&mut b.node_name),
            Blockdev::Format(b) => {
                apply(&mut b.node_name);
                apply(&mut b.file);
                if let Some(d) = &mut b.data_file {
                    apply(d);
                }
                if let BackingNode::Node(n) = &mut b.backing {
                    apply(n);
                }
            }
        }
    }
}

/// The index `N` of a libvirt-style node name `libvirt-<N>-<role>` (`libvirt-3-format`);
/// `None` for other names (`libvirt-pflash0-storage`, QEMU's `#block123`). libvirt numbers block
/// nodes per domain and never reuses an index (`qemu_block.c`).
pub fn node_index(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("libvirt-")?;
    let (digits, role) = rest.split_once('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || role.is_empty() {
        return None;
    }
    digits.parse().ok()
}

/// `name` with its libvirt node index replaced by `index` (`libvirt-3-format`, 7 ->
/// `libvirt-7-format`); `None` when `name` carries no index ([`node_index`]).
pub fn with_node_index(name: &str, index: u32) -> Option<String> {
    node_index(name)?;
    let role = name.strip_prefix("libvirt-")?.split_once('-')?.1;
    Some(format!("libvirt-{index}-{role}"))
}

/// Gives the nodes of `blockdevs` fresh libvirt indices from `next` on: each distinct index in
/// use, in ascending order, becomes `*next` (then `*next` + 1, ...), and `*next` ends past the
/// last one used. Returns the mapping (old index to new) so that the device above can follow.
pub fn renumber_nodes(
    blockdevs: &mut [Blockdev],
    next: &mut u32,
) -> std::collections::BTreeMap<u32, u32> {
    let mut old: Vec<u32> = Vec::new();
    for b in blockdevs.iter_mut() {
        b.rename_nodes(&mut |n| {
            old.extend(node_index(n));
            None
        });
    }
    old.sort_unstable();
    old.dedup();
    let map: std::collections::BTreeMap<u32, u32> = old
        .into_iter()
        .map(|k| {
            let n = *next;
            *next += 1;
            (k, n)
        })
        .collect();
    for b in blockdevs.iter_mut() {
        b.rename_nodes(&mut |n| renamed_node(n, &map));
    }
    map
}

/// `name` renamed through `map` (old index to new), `None` when it keeps its name.
pub fn renamed_node(name: &str, map: &std::collections::BTreeMap<u32, u32>) -> Option<String> {
    with_node_index(name, *map.get(&node_index(name)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_indices_come_from_libvirt_node_names_only() {
        let cases = [
            ("libvirt-3-format", Some(3)),
            ("libvirt-12-storage", Some(12)),
            ("libvirt-pflash0-storage", None),
            ("libvirt-3-", None),
            ("libvirt--x", None),
            ("#block123", None),
            ("xlibvirt-3-format", None),
        ];
        for (name, want) in cases {
            assert_eq!(node_index(name), want, "{name}");
        }
        assert_eq!(
            with_node_index("libvirt-3-format", 9).as_deref(),
            Some("libvirt-9-format")
        );
        assert_eq!(with_node_index("libvirt-pflash0-storage", 9), None);
    }

    #[test]
    fn renumbering_renames_nodes_and_their_references() {
        let storage = |n: u32| {
            Blockdev::Protocol(BlockdevProtocol {
                driver: ProtocolDriver::File,
                filename: format!("/d/{n}"),
                node_name: format!("libvirt-{n}-storage"),
                aio: None,
                cache: None,
                auto_read_only: true,
                discard: None,
            })
        };
        let format = |n: u32, backing: BackingNode| {
            Blockdev::Format(BlockdevFormat {
                detect_zeroes: None,
                node_name: format!("libvirt-{n}-format"),
                read_only: false,
                discard: None,
                cache: None,
                driver: FormatDriver::Qcow2,
                file: format!("libvirt-{n}-storage"),
                data_file: None,
                backing,
            })
        };
        let mut chain = vec![
            storage(2),
            format(2, BackingNode::Null),
            storage(1),
            format(1, BackingNode::Node("libvirt-2-format".into())),
        ];
        let mut next = 7;
        let map = renumber_nodes(&mut chain, &mut next);
        assert_eq!(next, 9);
        assert_eq!(map, [(1, 7), (2, 8)].into_iter().collect());
        assert_eq!(
            chain,
            vec![
                storage(8),
                format(8, BackingNode::Null),
                storage(7),
                format(7, BackingNode::Node("libvirt-8-format".into())),
            ]
            .into_iter()
            .map(|mut b| {
                if let Blockdev::Protocol(p) = &mut b {
                    // The file names are data, never renumbered.
                    p.filename = if p.node_name == "libvirt-8-storage" {
                        "/d/2".into()
                    } else {
                        "/d/1".into()
                    };
                }
                b
            })
            .collect::<Vec<_>>()
        );
    }

    /// A CBT overlay's format node names its raw data file's protocol node: a hot-plugged
    /// disk's renumbering renames that reference too, or the overlay would open another disk's
    /// image (QEMU refuses that with a permission conflict on the other node).
    #[test]
    fn renumbering_renames_a_data_file_reference() {
        let mut chain = vec![
            Blockdev::Protocol(BlockdevProtocol {
                driver: ProtocolDriver::File,
                filename: "/hotplug/hp.img".into(),
                node_name: "libvirt-1-storage".into(),
                aio: None,
                cache: None,
                auto_read_only: true,
                discard: None,
            }),
            Blockdev::Format(BlockdevFormat {
                detect_zeroes: None,
                node_name: "libvirt-2-format".into(),
                read_only: false,
                discard: None,
                cache: None,
                driver: FormatDriver::Qcow2,
                file: "libvirt-2-storage".into(),
                data_file: Some("libvirt-1-storage".into()),
                backing: BackingNode::Null,
            }),
        ];
        let mut next = 5;
        renumber_nodes(&mut chain, &mut next);
        let Blockdev::Format(f) = &chain[1] else {
            panic!("{chain:?}")
        };
        assert_eq!(f.data_file.as_deref(), Some("libvirt-5-storage"));
        assert_eq!(f.file, "libvirt-6-storage");
    }
}
