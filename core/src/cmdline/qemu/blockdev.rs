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
    /// Format driver.
    pub driver: FormatDriver,
    /// Node name of the protocol node below.
    pub file: String,
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
