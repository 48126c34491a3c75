//! The control protocol between the source and the target launcher of a live migration.
//!
//! KubeVirt's launchers let libvirt talk to libvirt over the migration proxy's role-0 channel (the
//! source pod's `migrationproxy/<uid>-source.sock` reaches the target pod's
//! `/var/run/libvirt/virtqemud-sock`, `pkg/virt-handler/migration-proxy`, v1.9.0). virt-handler
//! never reads those bytes, so qlauncher carries its own handshake on that channel: the source
//! sends the definition of its running domain, the target starts QEMU from it and answers ready,
//! and both settle the outcome.
//!
//! Wire format: every message is one frame, a 4-byte big-endian length followed by that many
//! bytes of JSON (one [`Message`]). Frames larger than [`MAX_FRAME`] are refused before any
//! allocation. The first frame each way is a [`Hello`]; the side that cannot speak the peer's
//! [`PROTOCOL_VERSION`] answers [`Message::Refused`] and closes, so two launchers of different
//! qlauncher versions fail the migration with a clear reason instead of misreading each other.
//!
//! Sequence (source `S`, target `T`):
//!
//! ```text
//! S -> T  Hello { version, launcher }
//! T -> S  Hello { version, launcher }          (or Refused { reason })
//! S -> T  Prepare(RunningDomain)
//! T -> S  Ready { stream_socket, nbd_exports } (or Failed { reason })
//! S -> T  Outcome { completed, paused }        (after QEMU's migration ended on the source)
//! T -> S  Done                                 (target resumed, or cleaned up)
//! ```
//!
//! Either side may send [`Message::Abort`] at any point after the hello; the peer cleans up.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The control protocol version this launcher speaks. Bump it on any incompatible change of
/// [`Message`] or of the meaning of a field.
///
/// Version 2: [`RunningDomain::hotplugged`] carries the hot-plugged disks as
/// [`HotpluggedDevice`] placements (version 1 always sent an empty list of keyval strings, so a
/// version 1 peer cannot migrate a domain with hot-plugged devices and is refused at the hello).
///
/// Version 3: [`RunningDomain::cpu`] carries a host-model CPU's static expansion, which the
/// target starts from; hot-plugged NICs travel as [`HotplugKind::Nic`] placements (with
/// [`HotpluggedDevice::model`] and [`HotpluggedDevice::netdev`]); [`RunningDomain::argv`] leaves
/// out the SR-IOV devices the source unplugged; and in a decentralized migration
/// [`RunningDomain::vmi_uid`] is the target VMI's UID (the target names its sockets after the
/// source VMI's). A version 2 peer cannot decode the first two (its messages deny unknown
/// fields) and would misread the last two (an argv difference, sockets under the wrong name), so
/// it is refused at the hello.
pub const PROTOCOL_VERSION: u32 = 3;

/// The largest frame accepted, in bytes (a domain definition is a few KiB).
pub const MAX_FRAME: u32 = 4 * 1024 * 1024;

/// The first message of each side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// The protocol version the sender speaks ([`PROTOCOL_VERSION`]).
    pub version: u32,
    /// The sender's qlauncher version (`CARGO_PKG_VERSION`), for the logs and the refusal text.
    pub launcher: String,
}

impl Hello {
    /// This launcher's hello.
    pub fn ours() -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            launcher: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }
}

/// The definition of the source's **running** domain: what the target must start QEMU with so
/// that the device state matches (the role libvirt's migratable XML plays).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunningDomain {
    /// The VMI's UID (the target refuses a definition for another VMI).
    pub vmi_uid: String,
    /// The migration UID (`status.migrationState.migrationUid`).
    pub migration_uid: String,
    /// The versioned machine type the source runs, resolved from its alias (e.g.
    /// `pc-q35-7.2`).
    pub machine: String,
    /// QEMU's argv as the source started it, machine resolved, without `-S` and `-incoming`
    /// (the target adds `-S -incoming defer`). In a decentralized migration to a VMI of another
    /// name or namespace it names the target's domain and pod paths instead of the source's
    /// ([`RunningDomain::for_target_domain`]), so that it equals the target's own conversion
    /// (a target of this version compares it word for word either way).
    pub argv: Vec<String>,
    /// Devices hot-plugged into the source since it started (disks, then NICs), to be added to
    /// the target before `migrate-incoming`.
    pub hotplugged: Vec<HotpluggedDevice>,
    /// Local disks the source mirrors to the target over NBD: the target exports these nodes.
    pub copied_disks: Vec<CopiedDisk>,
    /// The migration capabilities the source enables that the target must enable too
    /// (`multifd`, `postcopy-ram`, ...), as QEMU names them.
    pub capabilities: Vec<String>,
    /// `multifd-channels` when multifd is on.
    pub multifd_channels: Option<u32>,
    /// The domain was paused (by the user) when the migration started: the target stays paused.
    pub paused: bool,
    /// For a host-model CPU, the static expansion of the CPU the source runs (model `base` and
    /// every property, QEMU's `query-cpu-model-expansion`), which the target renders as its
    /// `-cpu` with `enforce=on` instead of its own `host`/`max` (libvirt migrates the expanded
    /// host-model definition in its cookie). `None` for host-passthrough and named models, whose
    /// `-cpu` both sides render alike from the VMI.
    ///
    /// Added after version 2 without a version bump: a version-2 peer's definition has no such
    /// member and still decodes (`None`); it is left out of the frame when `None`, so a
    /// version-2 target still decodes a definition without it, but one with it fails there as
    /// an undecodable frame (version 2 denies unknown fields) instead of being misread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<crate::cmdline::plan::CpuModel>,
}

impl RunningDomain {
    /// The definition for a target VMI of another UID (a decentralized, cross-cluster migration,
    /// `targetState.virtualMachineInstanceUID`): every occurrence of the source VMI's UID
    /// `source_uid` in any field (the VMI UID, the argv's socket paths, ...) replaced by
    /// `target_uid`, as KubeVirt replaces it in the whole migratable XML
    /// (`generateMigrationParams`). The replacement is made in the JSON form with `target_uid`
    /// JSON-escaped, so no UID can add or change a field. An empty `source_uid` or equal UIDs
    /// change nothing.
    ///
    /// # Errors
    /// [`ProtocolError::Encode`] / [`ProtocolError::Decode`] if the definition does not survive
    /// the round trip (it always does for UIDs).
    pub fn for_target_vmi(
        self,
        source_uid: &str,
        target_uid: &str,
    ) -> Result<RunningDomain, ProtocolError> {
        if source_uid.is_empty() || source_uid == target_uid {
            return Ok(self);
        }
        let escaped = |u: &str| -> Result<String, ProtocolError> {
            let quoted = serde_json::to_string(u).map_err(ProtocolError::Encode)?;
            Ok(quoted[1..quoted.len() - 1].to_owned())
        };
        let json = serde_json::to_string(&self).map_err(ProtocolError::Encode)?;
        let json = json.replace(&escaped(source_uid)?, &escaped(target_uid)?);
        serde_json::from_str(&json).map_err(ProtocolError::Decode)
    }

    /// The definition for a target VMI of another name or namespace (a decentralized migration
    /// with `targetState.domainName` and `targetState.domainNamespace`): what KubeVirt's source
    /// rewrites for it (`generateDomainName` as libvirt's `DestName`, and
    /// `updateFilePathsToNewDomain` for the disk paths holding the namespace), on the argv's
    /// words:
    ///
    /// - the `-name` value `guest=<source namespace>_<source name>,...` names the target's
    ///   domain;
    /// - a `-blockdev` whose `filename` is exactly one of the paths the converter derives from
    ///   the identity (the cloud-init ISOs under `<namespace>/<name>/`, the EFI variable store
    ///   `<name>_VARS.fd`) gets the target's path; the object is edited as JSON and checked by
    ///   parsing it back.
    ///
    /// No other word changes: a user's path that merely contains the names (a hostDisk under
    /// `/data/<namespace>_<name>`) is the same file on both sides, and anything the rewrite does
    /// not cover shows up as an argv difference the target refuses. Call it after
    /// [`Self::for_target_vmi`] with `source` as that rewrite left it (the UID in a name is
    /// replaced there too). Equal identities change nothing.
    ///
    /// # Errors
    /// [`ProtocolError::InvalidTargetDomain`] if the target's namespace or name is not a valid
    /// VMI namespace or name (it would become a path component and part of `-name`).
    pub fn for_target_domain(
        mut self,
        source: &DomainIdentity,
        target: &DomainIdentity,
    ) -> Result<RunningDomain, ProtocolError> {
        if source == target {
            return Ok(self);
        }
        target.check()?;
        let (from_name, to_name) = (source.domain_name(), target.domain_name());
        let (from_paths, to_paths) = (source.paths(), target.paths());
        let mut option: Option<String> = None;
        for word in &mut self.argv {
            let changed = match option.as_deref() {
                Some("-name") => renamed_guest(word, &from_name, &to_name),
                Some("-blockdev") => from_paths
                    .iter()
                    .zip(&to_paths)
                    .find_map(|(from, to)| moved_filename(word, from, to)),
                _ => None,
            };
            if let Some(changed) = changed {
                *word = changed;
            }
            option = word.starts_with('-').then(|| word.clone());
        }
        Ok(self)
    }
}

/// The identity of a domain in KubeVirt: its VMI's namespace and name. The domain is named
/// `<namespace>_<name>` (`util.DomainFromNamespaceName`, v1.9.0), and the converter puts the
/// name in a few paths of the pod (see [`RunningDomain::for_target_domain`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainIdentity {
    /// `metadata.namespace` (`default` when absent).
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl DomainIdentity {
    /// The domain name, `<namespace>_<name>`.
    pub fn domain_name(&self) -> String {
        format!("{}_{}", self.namespace, self.name)
    }

    /// The paths of the pod the converter derives from the identity, as the normalized argv
    /// words spell them (`${root}` placeholders): the cloud-init ISOs
    /// (`<cloud-init>/<namespace>/<name>/{noCloud,configdrive}.iso`, `disks/sources.rs`) and the
    /// EFI variable store (`<nvram>/<name>_VARS.fd`, `devices/firmware.rs`).
    fn paths(&self) -> [String; 3] {
        let (ns, name) = (&self.namespace, &self.name);
        [
            format!("${{cloud-init}}/{ns}/{name}/noCloud.iso"),
            format!("${{cloud-init}}/{ns}/{name}/configdrive.iso"),
            format!("${{nvram}}/{name}_VARS.fd"),
        ]
    }

    /// Checks the identity as the converter checks a VMI's (a namespace is a name of at most 63
    /// bytes, a name of at most 253, both `[A-Za-z0-9._-]` starting with a letter or digit): such names are a safe path component and cannot hold a QEMU option separator.
    fn check(&self) -> Result<(), ProtocolError> {
        use crate::cmdline::{names, FieldPath};
        let invalid =
            |e: crate::cmdline::ConvertError| ProtocolError::InvalidTargetDomain(format!("{e}"));
        names::check_name(
            &FieldPath::new("targetState.domainNamespace"),
            &self.namespace,
        )
        .map_err(invalid)?;
        names::check_name_len(&FieldPath::new("targetState.domainName"), &self.name, 253)
            .map_err(invalid)?;
        Ok(())
    }
}

/// `word` (a `-name` value, `guest=<domain>[,more]`) with the domain `from` replaced by `to`,
/// when it is exactly that: the `guest` key first, its value `from` as QEMU's keyval escapes it,
/// then the end or a separating comma (not an escaped one).
fn renamed_guest(word: &str, from: &str, to: &str) -> Option<String> {
    use crate::cmdline::qemu::KeyVal;
    let head = KeyVal::new().kv("guest", from).finish();
    let rest = word.strip_prefix(&head)?;
    if !(rest.is_empty() || (rest.starts_with(',') && !rest.starts_with(",,"))) {
        return None;
    }
    Some(format!("{}{rest}", KeyVal::new().kv("guest", to).finish()))
}

/// `word` (a `-blockdev` JSON object) with its `filename` moved from `from` to `to`, when its
/// `filename` is exactly `from`: the JSON string token of `from` after the `filename` key is
/// replaced (the word's member order stays as rendered, which the target compares word for word),
/// and the result is parsed again and must equal the original object with only `filename`
/// changed, else the word is left alone.
fn moved_filename(word: &str, from: &str, to: &str) -> Option<String> {
    let before: serde_json::Value = serde_json::from_str(word).ok()?;
    if before.get("filename")?.as_str()? != from {
        return None;
    }
    let token = |s: &str| {
        serde_json::to_string(s)
            .ok()
            .map(|q| format!("\"filename\":{q}"))
    };
    let (old, new) = (token(from)?, token(to)?);
    if word.matches(&old).count() != 1 {
        return None;
    }
    let moved = word.replacen(&old, &new, 1);
    let mut expected = before;
    expected["filename"] = serde_json::Value::String(to.to_owned());
    let after: serde_json::Value = serde_json::from_str(&moved).ok()?;
    (after == expected).then_some(moved)
}

/// The kind of a hot-plugged device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HotplugKind {
    /// A disk: block nodes plus its frontend device.
    Disk,
    /// A NIC: netdev plus its device.
    Nic,
}

/// One device hot-plugged into the running source since QEMU started, as the running domain
/// has it: what the target must reproduce so that the device state loads (the qdev id and the
/// place on the bus are in the migration stream; the block node names keep later unplugs and
/// the domain view the same). The target never runs these words: it converts the VMI itself
/// (with its own paths, e.g. its pod's hotplug disk image) and only takes the placement, after
/// checking the identity properties match (libvirt carries the same facts in the migrated XML).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HotpluggedDevice {
    /// Disk or NIC.
    pub kind: HotplugKind,
    /// The disk's (or interface's) name in the VMI.
    pub name: String,
    /// The qdev id (`ua-<name>`).
    pub id: String,
    /// The device's bus (`pci.7`, `scsi0.0`), when it has one.
    pub bus: Option<String>,
    /// The device's address on a PCI bus (`0x0`), when it has one.
    pub addr: Option<String>,
    /// The SCSI LUN, for a disk on a SCSI bus.
    pub lun: Option<u64>,
    /// A disk's block node names, bottom node first (`libvirt-5-storage`, `libvirt-5-format`).
    pub node_names: Vec<String>,
    /// A disk's serial.
    pub serial: Option<String>,
    /// A disk is read-only.
    pub read_only: bool,
    /// A NIC's guest MAC.
    pub mac: Option<String>,
    /// A NIC's device model, its QEMU driver (`virtio-net-pci-non-transitional`, `e1000e`).
    /// Added after version 2 (absent from a disk and from a version-2 peer's NIC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A NIC's netdev id (`hostua-<name>`). Added after version 2, as [`Self::model`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netdev: Option<String>,
}

/// A disk the source copies to the target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopiedDisk {
    /// The block node name on both sides (the format node of the disk's top image).
    pub node: String,
    /// The NBD export name (`drive-<alias>`, as libvirt names it).
    pub export: String,
    /// The image's virtual size in bytes; the target refuses an image of another size.
    pub size: u64,
}

/// What the target answers once its QEMU waits for the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ready {
    /// The NBD export names the target serves (one per [`CopiedDisk`]).
    pub nbd_exports: Vec<String>,
}

/// The result of QEMU's migration as the source saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    /// QEMU reported `completed` on the source.
    pub completed: bool,
    /// Why it failed, when it did.
    pub reason: Option<String>,
}

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "body", deny_unknown_fields)]
pub enum Message {
    /// The first frame of each side.
    Hello(Hello),
    /// The receiver cannot speak the sender's version (or refuses the peer for another reason);
    /// the connection closes after it.
    Refused {
        /// Why, for the migration's failure reason.
        reason: String,
    },
    /// Source to target: start QEMU from this definition.
    Prepare(Box<RunningDomain>),
    /// Target to source: QEMU waits on the stream socket.
    Ready(Ready),
    /// Source to target: the source's migration ended.
    Outcome(Outcome),
    /// Target to source: the target finished (resumed, or cleaned up after a failure).
    Done,
    /// Either way: a step failed; the peer cleans up.
    Failed {
        /// What failed.
        reason: String,
    },
    /// Either way: the migration is cancelled.
    Abort,
}

/// Errors of the control channel.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// Reading or writing the socket failed (including the peer closing it).
    #[error("migration control channel I/O")]
    Io(#[from] std::io::Error),
    /// A frame announced more than [`MAX_FRAME`] bytes.
    #[error("migration control frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    FrameTooLarge(u32),
    /// A frame is not a valid message.
    #[error("migration control frame is not a valid message")]
    Decode(#[source] serde_json::Error),
    /// Encoding a message failed.
    #[error("cannot encode a migration control message")]
    Encode(#[source] serde_json::Error),
    /// The peer speaks another protocol version.
    #[error(
        "migration peer speaks control protocol version {peer} (qlauncher {launcher}), this \
         launcher speaks version {ours}"
    )]
    VersionMismatch {
        /// The peer's version.
        peer: u32,
        /// The peer's qlauncher version.
        launcher: String,
        /// Ours.
        ours: u32,
    },
    /// The peer refused the connection.
    #[error("migration peer refused: {0}")]
    Refused(String),
    /// A decentralized migration names a target VMI whose namespace or name cannot name a
    /// domain (`targetState.domainNamespace` / `domainName`).
    #[error("invalid target domain: {0}")]
    InvalidTargetDomain(String),
    /// The peer sent a message this step does not expect.
    #[error("unexpected migration control message: expected {expected}, got {got}")]
    Unexpected {
        /// What this step waits for.
        expected: &'static str,
        /// The message's kind.
        got: &'static str,
    },
}

impl Message {
    /// The message's kind, for errors and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello(_) => "Hello",
            Message::Refused { .. } => "Refused",
            Message::Prepare(_) => "Prepare",
            Message::Ready(_) => "Ready",
            Message::Outcome(_) => "Outcome",
            Message::Done => "Done",
            Message::Failed { .. } => "Failed",
            Message::Abort => "Abort",
        }
    }
}

/// Writes one frame holding `message`.
pub async fn write_message<W: AsyncWrite + Unpin>(
    w: &mut W,
    message: &Message,
) -> Result<(), ProtocolError> {
    let body = serde_json::to_vec(message).map_err(ProtocolError::Encode)?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&n| n <= MAX_FRAME)
        .ok_or(ProtocolError::FrameTooLarge(u32::MAX))?;
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one frame and decodes it. A frame over [`MAX_FRAME`] is refused before its body is read.
pub async fn read_message<R: AsyncRead + Unpin>(r: &mut R) -> Result<Message, ProtocolError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len);
    if len > MAX_FRAME {
        return Err(ProtocolError::FrameTooLarge(len));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body).await?;
    serde_json::from_slice(&body).map_err(ProtocolError::Decode)
}

/// Checks the peer's hello against ours. Only an equal version is compatible: there is no
/// negotiation of optional parts (a version 1 peer, which cannot carry hot-plugged devices, is
/// refused before any definition is sent).
pub fn check_hello(peer: &Hello) -> Result<(), ProtocolError> {
    if peer.version == PROTOCOL_VERSION {
        Ok(())
    } else {
        Err(ProtocolError::VersionMismatch {
            peer: peer.version,
            launcher: peer.launcher.clone(),
            ours: PROTOCOL_VERSION,
        })
    }
}

/// The source's half of the hello: send ours, read the target's, check it. A `Refused` answer
/// becomes [`ProtocolError::Refused`]; a hello of another version [`ProtocolError::VersionMismatch`].
pub async fn hello_as_source<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
) -> Result<Hello, ProtocolError> {
    write_message(s, &Message::Hello(Hello::ours())).await?;
    match read_message(s).await? {
        Message::Hello(peer) => {
            check_hello(&peer)?;
            Ok(peer)
        }
        Message::Refused { reason } => Err(ProtocolError::Refused(reason)),
        other => Err(ProtocolError::Unexpected {
            expected: "Hello",
            got: other.kind(),
        }),
    }
}

/// The target's half of the hello: read the source's; on a version mismatch answer `Refused`
/// (naming both versions) and fail, else answer our hello.
///
/// A first frame that does not decode as a message at all (a peer of an incompatible
/// generation) is refused the same way.
pub async fn hello_as_target<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
) -> Result<Hello, ProtocolError> {
    let first = match read_message(s).await {
        Ok(m) => m,
        Err(ProtocolError::Decode(e)) => {
            let reason = format!(
                "the first control frame is not a qlauncher control protocol version \
                 {PROTOCOL_VERSION} hello"
            );
            // Best effort: the peer may not understand it either.
            let _ = write_message(s, &Message::Refused { reason }).await;
            return Err(ProtocolError::Decode(e));
        }
        Err(e) => return Err(e),
    };
    let peer = match first {
        Message::Hello(peer) => peer,
        other => {
            return Err(ProtocolError::Unexpected {
                expected: "Hello",
                got: other.kind(),
            })
        }
    };
    if let Err(e) = check_hello(&peer) {
        let _ = write_message(
            s,
            &Message::Refused {
                reason: format!(
                    "target qlauncher {} speaks control protocol version {PROTOCOL_VERSION}, \
                     source qlauncher {} speaks version {}",
                    env!("CARGO_PKG_VERSION"),
                    peer.launcher,
                    peer.version
                ),
            },
        )
        .await;
        return Err(e);
    }
    write_message(s, &Message::Hello(Hello::ours())).await?;
    Ok(peer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::plan::CpuProp;
    use tokio::io::duplex;

    fn domain() -> RunningDomain {
        RunningDomain {
            vmi_uid: "vmi-uid".into(),
            migration_uid: "mig-uid".into(),
            machine: "pc-q35-7.2".into(),
            argv: vec!["-machine".into(), "pc-q35-7.2,accel=tcg".into()],
            hotplugged: vec![
                HotpluggedDevice {
                    kind: HotplugKind::Disk,
                    name: "hp1".into(),
                    id: "ua-hp1".into(),
                    bus: Some("pci.7".into()),
                    addr: Some("0x0".into()),
                    lun: None,
                    node_names: vec!["libvirt-5-storage".into(), "libvirt-5-format".into()],
                    serial: Some("HP1".into()),
                    read_only: false,
                    mac: None,
                    model: None,
                    netdev: None,
                },
                HotpluggedDevice {
                    kind: HotplugKind::Nic,
                    name: "blue".into(),
                    id: "ua-blue".into(),
                    bus: Some("pci.8".into()),
                    addr: Some("0x0".into()),
                    lun: None,
                    node_names: vec![],
                    serial: None,
                    read_only: false,
                    mac: Some("0a:58:0a:f4:01:07".into()),
                    model: Some("virtio-net-pci-non-transitional".into()),
                    netdev: Some("hostua-blue".into()),
                },
            ],
            copied_disks: vec![CopiedDisk {
                node: "libvirt-1-format".into(),
                export: "drive-ua-containerdisk".into(),
                size: 1 << 30,
            }],
            capabilities: vec!["multifd".into()],
            multifd_channels: Some(8),
            paused: false,
            cpu: Some(crate::cmdline::plan::CpuModel {
                name: "base".into(),
                props: [
                    ("family".to_owned(), CpuProp::Int(15)),
                    ("vendor".to_owned(), CpuProp::Text("AuthenticAMD".into())),
                    ("vmx".to_owned(), CpuProp::Bool(false)),
                ]
                .into(),
            }),
        }
    }

    #[test]
    fn a_decentralized_definition_names_the_target_vmi_everywhere() {
        let mut d = domain();
        d.argv.push("-chardev".into());
        d.argv
            .push("socket,id=charserial0,path=${private}/vmi-uid/virt-serial0".into());
        let t = d.clone().for_target_vmi("vmi-uid", "other-uid").unwrap();
        assert_eq!(t.vmi_uid, "other-uid");
        assert_eq!(
            t.argv.last().unwrap(),
            "socket,id=charserial0,path=${private}/other-uid/virt-serial0"
        );
        assert_eq!(t.migration_uid, d.migration_uid);
        assert_eq!(t.hotplugged, d.hotplugged);
        // Nothing to replace, or no source UID: unchanged.
        assert_eq!(d.clone().for_target_vmi("vmi-uid", "vmi-uid").unwrap(), d);
        assert_eq!(d.clone().for_target_vmi("", "x").unwrap(), d);
        // A target UID with JSON syntax stays one string.
        let evil = d
            .clone()
            .for_target_vmi("vmi-uid", r#"x","paused":true,"y":""#)
            .unwrap();
        assert_eq!(evil.vmi_uid, r#"x","paused":true,"y":""#);
        assert!(!evil.paused);
    }

    fn identity(namespace: &str, name: &str) -> DomainIdentity {
        DomainIdentity {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// An argv with every word that holds the domain's identity, and some that hold its
    /// names without being derived from them.
    fn named_argv(ns: &str, name: &str) -> Vec<String> {
        let file = |path: &str, node: &str| {
            serde_json::json!({"driver": "file", "filename": path, "node-name": node,
                "auto-read-only": true, "discard": "unmap"})
            .to_string()
        };
        vec![
            "-name".into(),
            format!("guest={ns}_{name},debug-threads=on"),
            "-S".into(),
            "-blockdev".into(),
            file(
                &format!("${{nvram}}/{name}_VARS.fd"),
                "libvirt-pflash1-storage",
            ),
            "-blockdev".into(),
            file(
                &format!("${{cloud-init}}/{ns}/{name}/noCloud.iso"),
                "libvirt-2-storage",
            ),
            "-blockdev".into(),
            file(
                &format!("/data/{ns}_{name}/{ns}/{name}/noCloud.iso"),
                "libvirt-3-storage",
            ),
            "-chardev".into(),
            format!("socket,id=x,path=${{cloud-init}}/{ns}/{name}/noCloud.iso"),
            "-device".into(),
            format!(r#"{{"driver":"virtio-blk-pci","id":"ua-{name}","serial":"{ns}_{name}"}}"#),
        ]
    }

    #[test]
    fn a_renamed_target_gets_its_domain_name_and_paths_and_nothing_else_changes() {
        let mut d = domain();
        d.argv = named_argv("default", "hv");
        let t = d
            .clone()
            .for_target_domain(&identity("default", "hv"), &identity("other-ns", "vm-2"))
            .unwrap();
        let mut want = named_argv("default", "hv");
        let expect = named_argv("other-ns", "vm-2");
        // The domain name, the NVRAM file and the cloud-init ISO follow the target...
        for i in [1, 4, 6] {
            want[i] = expect[i].clone();
        }
        // ...a user's path, another option and a device property holding the names do not.
        assert_eq!(t.argv, want);
        assert_eq!(
            (&t.hotplugged, &t.copied_disks),
            (&d.hotplugged, &d.copied_disks)
        );
        // The same identity: unchanged.
        assert_eq!(
            d.clone()
                .for_target_domain(&identity("default", "hv"), &identity("default", "hv"))
                .unwrap(),
            d
        );
        // Only the namespace differs: the ISO moves, the NVRAM (named after the name) stays.
        let t = d
            .clone()
            .for_target_domain(&identity("default", "hv"), &identity("ns2", "hv"))
            .unwrap();
        assert_eq!(t.argv[1], "guest=ns2_hv,debug-threads=on");
        assert_eq!(t.argv[4], d.argv[4]);
        assert_eq!(t.argv[6], named_argv("ns2", "hv")[6]);
    }

    #[test]
    fn hostile_target_names_are_refused_and_source_words_only_match_exactly() {
        let mut d = domain();
        d.argv = named_argv("default", "hv");
        let source = identity("default", "hv");
        for (ns, name) in [
            ("default", "a,b"),
            ("default", "../../etc"),
            ("default", "a/b"),
            ("default", ".."),
            ("default", ""),
            ("", "hv"),
            ("default", r#"x","filename":"/etc/shadow"#),
            ("default", "-rf"),
            ("default", "a\nb"),
            ("a/b", "hv"),
            ("default", &"n".repeat(254)),
            (&"n".repeat(64), "hv"),
        ] {
            let e = d
                .clone()
                .for_target_domain(&source, &identity(ns, name))
                .unwrap_err();
            assert!(
                matches!(e, ProtocolError::InvalidTargetDomain(_)),
                "{ns:?}/{name:?}: {e}"
            );
        }
        // The longest valid name is accepted.
        let long = "n".repeat(253);
        let t = d
            .clone()
            .for_target_domain(&source, &identity("default", &long))
            .unwrap();
        assert_eq!(t.argv[1], format!("guest=default_{long},debug-threads=on"));
        // A `-name` whose guest value merely starts with the source's domain name (an escaped
        // comma continues it), or a blockdev whose filename only starts with the path, is not
        // the source's: left alone (the target then refuses the argv difference).
        assert_eq!(
            renamed_guest("guest=default_hv,,x,debug-threads=on", "default_hv", "n_m"),
            None
        );
        assert_eq!(
            renamed_guest("guest=default_hvx", "default_hv", "n_m"),
            None
        );
        assert_eq!(
            renamed_guest("xguest=default_hv", "default_hv", "n_m"),
            None
        );
        assert_eq!(
            renamed_guest("guest=default_hv", "default_hv", "n_m").as_deref(),
            Some("guest=n_m")
        );
        let from = "${cloud-init}/default/hv/noCloud.iso";
        let longer = r#"{"driver":"file","filename":"${cloud-init}/default/hv/noCloud.iso.bak"}"#;
        assert_eq!(moved_filename(longer, from, "x"), None);
        // The path twice (a nested object too): ambiguous, left alone.
        let twice = serde_json::json!({"driver": "file", "filename": from,
            "file": {"filename": from}})
        .to_string();
        assert_eq!(moved_filename(&twice, from, "x"), None);
        // The path quoted inside another value is not the filename token.
        let quoted = serde_json::json!({"driver": "file", "filename": from,
            "note": format!("\"filename\":\"{from}\"")})
        .to_string();
        let moved = moved_filename(&quoted, from, "/new").unwrap();
        let v: serde_json::Value = serde_json::from_str(&moved).unwrap();
        assert_eq!(v["filename"], "/new");
        assert_eq!(v["note"], format!("\"filename\":\"{from}\""));
        // Not JSON, or no filename: left alone.
        assert_eq!(moved_filename("driver=file,filename=x", "x", "y"), None);
        assert_eq!(moved_filename(r#"{"node-name":"x"}"#, "x", "y"), None);
    }

    #[tokio::test]
    async fn messages_round_trip_through_frames() {
        let (mut a, mut b) = duplex(1 << 16);
        let sent = vec![
            Message::Hello(Hello::ours()),
            Message::Prepare(Box::new(domain())),
            Message::Ready(Ready {
                nbd_exports: vec!["drive-ua-containerdisk".into()],
            }),
            Message::Outcome(Outcome {
                completed: false,
                reason: Some("cancelled".into()),
            }),
            Message::Done,
            Message::Abort,
        ];
        for m in &sent {
            write_message(&mut a, m).await.unwrap();
        }
        for m in &sent {
            assert_eq!(&read_message(&mut b).await.unwrap(), m);
        }
    }

    #[tokio::test]
    async fn frame_is_length_prefixed_json() {
        let (mut a, mut b) = duplex(1 << 16);
        write_message(&mut a, &Message::Done).await.unwrap();
        drop(a);
        let mut raw = Vec::new();
        b.read_to_end(&mut raw).await.unwrap();
        let body = br#"{"type":"Done"}"#;
        assert_eq!(&raw[..4], &(body.len() as u32).to_be_bytes());
        assert_eq!(&raw[4..], body);
    }

    #[tokio::test]
    async fn oversized_frame_is_refused_before_reading_it() {
        let (mut a, mut b) = duplex(64);
        a.write_all(&(MAX_FRAME + 1).to_be_bytes()).await.unwrap();
        let e = read_message(&mut b).await.unwrap_err();
        assert!(matches!(e, ProtocolError::FrameTooLarge(n) if n == MAX_FRAME + 1));
    }

    #[tokio::test]
    async fn unknown_fields_and_kinds_do_not_decode() {
        for body in [
            &br#"{"type":"Done","extra":1}"#[..],
            br#"{"type":"Teleport"}"#,
            br#"{"type":"Hello","body":{"version":1,"launcher":"x","future":true}}"#,
            b"not json",
        ] {
            let (mut a, mut b) = duplex(1 << 12);
            a.write_all(&(body.len() as u32).to_be_bytes())
                .await
                .unwrap();
            a.write_all(body).await.unwrap();
            assert!(matches!(
                read_message(&mut b).await,
                Err(ProtocolError::Decode(_))
            ));
        }
    }

    #[tokio::test]
    async fn equal_versions_agree() {
        let (mut s, mut t) = duplex(1 << 12);
        let (src, tgt) = tokio::join!(hello_as_source(&mut s), hello_as_target(&mut t));
        assert_eq!(src.unwrap().version, PROTOCOL_VERSION);
        assert_eq!(tgt.unwrap().version, PROTOCOL_VERSION);
    }

    #[tokio::test]
    async fn a_newer_source_is_refused_with_both_versions_named() {
        let (mut s, mut t) = duplex(1 << 12);
        let source = async {
            write_message(
                &mut s,
                &Message::Hello(Hello {
                    version: PROTOCOL_VERSION + 1,
                    launcher: "9.9.9".into(),
                }),
            )
            .await
            .unwrap();
            read_message(&mut s).await.unwrap()
        };
        let (answer, target) = tokio::join!(source, hello_as_target(&mut t));
        assert!(matches!(
            target.unwrap_err(),
            ProtocolError::VersionMismatch { peer, .. } if peer == PROTOCOL_VERSION + 1
        ));
        let Message::Refused { reason } = answer else {
            panic!("expected Refused, got {answer:?}");
        };
        assert!(reason.contains("source qlauncher 9.9.9"), "{reason}");
        assert!(
            reason.contains(&format!("version {}", PROTOCOL_VERSION + 1)),
            "{reason}"
        );
    }

    #[test]
    fn a_disk_reads_as_version_2_wrote_it_and_only_a_nic_carries_model_and_netdev() {
        let d = domain();
        let disk = serde_json::to_value(&d.hotplugged[0]).unwrap();
        assert!(
            disk.get("model").is_none() && disk.get("netdev").is_none(),
            "{disk}"
        );
        let nic = serde_json::to_value(&d.hotplugged[1]).unwrap();
        assert_eq!(nic["model"], "virtio-net-pci-non-transitional");
        assert_eq!(nic["netdev"], "hostua-blue");
        // A version-2 NIC entry (no model, no netdev) still decodes.
        let mut v2 = nic.clone();
        v2.as_object_mut().unwrap().remove("model");
        v2.as_object_mut().unwrap().remove("netdev");
        let back: HotpluggedDevice = serde_json::from_value(v2).unwrap();
        assert_eq!((back.model, back.netdev), (None, None));
    }

    #[tokio::test]
    async fn a_version_1_source_which_cannot_carry_hotplugged_devices_is_refused() {
        let (mut s, mut t) = duplex(1 << 12);
        let source = async {
            write_message(
                &mut s,
                &Message::Hello(Hello {
                    version: 1,
                    launcher: "0.1.0".into(),
                }),
            )
            .await
            .unwrap();
            read_message(&mut s).await.unwrap()
        };
        let (answer, target) = tokio::join!(source, hello_as_target(&mut t));
        assert!(matches!(
            target.unwrap_err(),
            ProtocolError::VersionMismatch { peer: 1, .. }
        ));
        assert!(matches!(answer, Message::Refused { .. }), "{answer:?}");
    }

    #[tokio::test]
    async fn a_source_meeting_an_older_target_fails_cleanly() {
        let (mut s, mut t) = duplex(1 << 12);
        let target = async {
            let _ = read_message(&mut t).await.unwrap();
            write_message(
                &mut t,
                &Message::Hello(Hello {
                    version: 0,
                    launcher: "0.0.1".into(),
                }),
            )
            .await
            .unwrap();
        };
        let (src, ()) = tokio::join!(hello_as_source(&mut s), target);
        let e = src.unwrap_err();
        assert!(e.to_string().contains("version 0 (qlauncher 0.0.1)"), "{e}");
    }

    #[tokio::test]
    async fn a_refusal_reaches_the_source_as_its_reason() {
        let (mut s, mut t) = duplex(1 << 12);
        let target = async {
            let _ = read_message(&mut t).await.unwrap();
            write_message(
                &mut t,
                &Message::Refused {
                    reason: "busy".into(),
                },
            )
            .await
            .unwrap();
        };
        let (src, ()) = tokio::join!(hello_as_source(&mut s), target);
        assert!(matches!(src.unwrap_err(), ProtocolError::Refused(r) if r == "busy"));
    }

    #[tokio::test]
    async fn a_peer_closing_mid_frame_is_an_io_error() {
        let (mut a, mut b) = duplex(64);
        a.write_all(&10u32.to_be_bytes()).await.unwrap();
        a.write_all(b"{\"ty").await.unwrap();
        drop(a);
        assert!(matches!(
            read_message(&mut b).await,
            Err(ProtocolError::Io(_))
        ));
    }

    #[test]
    fn the_cpu_definition_is_additive_to_version_2() {
        // A version-2 source's definition (no `cpu`) decodes, without a CPU.
        let mut v2 = serde_json::to_value(domain()).unwrap();
        v2.as_object_mut().unwrap().remove("cpu");
        let d: RunningDomain = serde_json::from_value(v2).unwrap();
        assert_eq!(d.cpu, None);
        // Without a CPU the frame has no `cpu` member (a version-2 target decodes it).
        let sent = serde_json::to_value(&d).unwrap();
        assert!(sent.get("cpu").is_none(), "{sent}");
        // The CPU's properties keep their QEMU types on the wire.
        let sent = serde_json::to_value(domain()).unwrap();
        assert_eq!(
            sent["cpu"],
            serde_json::json!({"name": "base", "props":
                {"family": 15, "vendor": "AuthenticAMD", "vmx": false}})
        );
    }
}
