//! The migration target for a stock KubeVirt source: its libvirt migrates peer-to-peer
//! (`virDomainMigrateToURI3(VIR_MIGRATE_LIVE | PEER2PEER | PERSIST_DEST)`,
//! `pkg/virt-launcher/virtwrap/live-migration-source.go`, v1.9.0) and calls the target pod's
//! `/var/run/libvirt/virtqemud-sock` through virt-handler's migration proxy
//! (`handleTargetMigrationProxy`, `pkg/virt-handler/migration-target.go`), which is where
//! qlauncher's target listens for its own control protocol too. A connection whose first
//! frame is a call of libvirt's remote program ([`first_frame_of`]) is served here, with the
//! wire of [`crate::libvirt_rpc`] and the QEMU half of qlauncher's own target.
//!
//! Prepare (`virDomainMigratePrepare3Params`): the source's domain XML (`destination_xml`) is
//! read with the bounded parser of hook answers; the resolved machine type and, for a
//! host-model VMI, the expanded CPU (`<cpu mode='custom'>`, model and features) are adopted;
//! every device is compared with qlauncher's own export of the plan it built from the VMI
//! virt-handler sent, and the first difference refuses the migration naming its element (the
//! source keeps running); each NIC's guest MAC is adopted ([`adopted_macs`]). Then QEMU starts
//! with `-incoming` on the proxy's stream socket, and the answer carries that URI (as the source
//! names the socket in its own pod, [`answered_uri`]) and the cookie libvirt checks (`<qemu-migration>`: the domain's
//! name and UUID, this host's name and a host UUID that is not the source's;
//! `qemuMigrationCookieXMLParse`). Finish (`virDomainMigrateFinish3Params`): the incoming side
//! completes, the guest resumes, the domain is answered; a cancelled Perform, or a source gone
//! before Finish, stops the target's QEMU (libvirt's auto-destroy of an incoming domain).

use std::os::fd::AsRawFd;

use qlauncher_libvirt_xml::golden::Node;
use tokio::net::UnixStream;
use tracing::{info, warn};

use crate::libvirt_rpc::remote::{
    param_string, Domain, ErrorCode, Finish3ParamsArgs, Finish3ParamsRet, Prepare3ParamsArgs,
    Prepare3ParamsRet, RemoteError, TypedParam, TypedValue, KEEPALIVE_PROGRAM, REMOTE_PROGRAM,
};
use crate::libvirt_rpc::server::MigrationTarget;
use crate::qmp::commands::Quit;
use crate::sync::ctx::DomainCtx;
use crate::sync::define::define;
use crate::sync::migration::bitmap_cookie::{self, DiskBitmaps};
use crate::sync::migration::incoming::StartedTarget;
use crate::sync::migration::launcher::{MigrationCtx, PreparedTarget};
use crate::sync::migration::protocol::RunningDomain;
use crate::sync::migration::target::{complete_incoming, prepare_incoming_qemu, AbortOnDrop};
use crate::sync::migration::MigrationError;
use crate::sys::mac::MacAddr;

/// `VIR_MIGRATE_*` flags (`include/libvirt/libvirt-domain.h`) a Prepare may carry.
pub mod flags {
    /// `VIR_MIGRATE_LIVE`.
    pub const LIVE: u32 = 1;
    /// `VIR_MIGRATE_PEER2PEER`.
    pub const PEER2PEER: u32 = 1 << 1;
    /// `VIR_MIGRATE_PERSIST_DEST`.
    pub const PERSIST_DEST: u32 = 1 << 3;
    /// `VIR_MIGRATE_UNSAFE` (KubeVirt's `UnsafeMigration`): checked on the source only.
    pub const UNSAFE: u32 = 1 << 9;
    /// `VIR_MIGRATE_TUNNELLED`: the stream inside libvirt's connection; not served.
    pub const TUNNELLED: u32 = 1 << 2;
    /// `VIR_MIGRATE_PAUSED`: the domain stays paused on the target.
    pub const PAUSED: u32 = 1 << 5;
    /// `VIR_MIGRATE_NON_SHARED_DISK`: full copy of local disks over NBD.
    pub const NON_SHARED_DISK: u32 = 1 << 6;
    /// `VIR_MIGRATE_NON_SHARED_INC`: incremental copy of local disks over NBD (KubeVirt's).
    pub const NON_SHARED_INC: u32 = 1 << 7;
    /// `VIR_MIGRATE_OFFLINE`: no running domain; not served.
    pub const OFFLINE: u32 = 1 << 10;
    /// `VIR_MIGRATE_COMPRESSED`.
    pub const COMPRESSED: u32 = 1 << 11;
    /// `VIR_MIGRATE_RDMA_PIN_ALL`: not served.
    pub const RDMA_PIN_ALL: u32 = 1 << 14;
    /// `VIR_MIGRATE_POSTCOPY`: `postcopy-ram` on both sides.
    pub const POSTCOPY: u32 = 1 << 15;
    /// `VIR_MIGRATE_TLS`: QEMU's own TLS; not served (KubeVirt's proxies carry TLS).
    pub const TLS: u32 = 1 << 16;
    /// `VIR_MIGRATE_PARALLEL`: multifd with `parallel.connections` channels.
    pub const PARALLEL: u32 = 1 << 17;
    /// `VIR_MIGRATE_POSTCOPY_RESUME`: not served.
    pub const POSTCOPY_RESUME: u32 = 1 << 19;
}

/// libvirt's default number of multifd channels when `parallel.connections` is not given
/// (`QEMU_MIGRATION_PARALLEL_CONNECTIONS` default of QEMU's `multifd-channels`).
const DEFAULT_PARALLEL_CONNECTIONS: u32 = 2;
/// The most multifd channels accepted (QEMU caps `multifd-channels` at 255).
const MAX_PARALLEL_CONNECTIONS: u32 = 255;

/// What the first frame of a control connection is ([`first_frame`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstFrame {
    /// A call of libvirt's remote program (or a keepalive): a stock source's libvirt.
    Libvirt,
    /// A call of qlauncher's private program ([`crate::libvirt_rpc::client::QLAUNCHER_PROGRAM`],
    /// libvirt's framing): a qlauncher source asking whether this is a qlauncher target; it
    /// speaks qlauncher's own protocol once answered.
    QlauncherProbe,
    /// Anything else: qlauncher's own protocol from the first byte (a JSON frame; a source
    /// that does not probe), or a peer that closed.
    Qlauncher,
}

/// What the peer on `conn` speaks, from its first eight bytes (peeked, not consumed): a frame
/// length and a program number for libvirt's framing; qlauncher's own frames have a JSON
/// object there. Waits for the eight bytes (or the peer's close: [`FirstFrame::Qlauncher`]).
pub(super) async fn first_frame_of(conn: &UnixStream) -> std::io::Result<FirstFrame> {
    let mut head = [0u8; 8];
    loop {
        conn.readable().await?;
        let peeked = conn.try_io(tokio::io::Interest::READABLE, || {
            nix::sys::socket::recv(
                conn.as_raw_fd(),
                &mut head,
                nix::sys::socket::MsgFlags::MSG_PEEK,
            )
            .map_err(std::io::Error::from)
        });
        match peeked {
            Ok(0) => return Ok(FirstFrame::Qlauncher),
            Ok(n) if n >= head.len() => return Ok(first_frame(&head)),
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

/// What eight bytes start: a libvirt RPC frame (length, then a program libvirt's client calls
/// first), qlauncher's probe in libvirt's framing, or neither.
pub fn first_frame(head: &[u8; 8]) -> FirstFrame {
    let program = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
    match program {
        REMOTE_PROGRAM | KEEPALIVE_PROGRAM => FirstFrame::Libvirt,
        crate::libvirt_rpc::client::QLAUNCHER_PROGRAM => FirstFrame::QlauncherProbe,
        _ => FirstFrame::Qlauncher,
    }
}

/// Serves one libvirt connection with the prepared `target` ([`LibvirtPeer`]). Ok once the
/// domain runs here; an error hands the prepared target back when QEMU never started. A
/// connection that calls no Prepare within `prepare_within` is dropped, so that an idle peer
/// cannot hold the target's only control socket (qlauncher's own protocol has the same bound
/// for its definition).
pub(super) async fn serve(
    m: &MigrationCtx,
    conn: UnixStream,
    target: PreparedTarget,
    prepare_within: std::time::Duration,
) -> Result<(), (Option<PreparedTarget>, MigrationError)> {
    let prepared = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut peer = LibvirtPeer {
        m: m.clone(),
        target: Some(target),
        run: None,
        completed: false,
        host_uuid: uuid::Uuid::new_v4(),
        prepared: prepared.clone(),
    };
    let idle = async {
        tokio::time::sleep(prepare_within).await;
        if prepared.load(std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    };
    let served = tokio::select! {
        served = crate::libvirt_rpc::server::serve(conn, &mut peer) => served,
        () = idle => {
            warn!("the libvirt source called no Prepare in time: connection dropped");
            Ok(Vec::new())
        }
    };
    if peer.completed {
        return Ok(());
    }
    let why = match &served {
        Ok(calls) => format!(
            "the libvirt source closed the connection after {} calls without finishing",
            calls.len()
        ),
        Err(e) => format!("the libvirt source's connection failed: {e}"),
    };
    if let Some(run) = peer.run.take() {
        // libvirt destroys an incoming domain whose controlling connection went away.
        warn!(reason = %why, "stopping the target's QEMU");
        let _ = run.started.client.run(&Quit).await;
        return Err((None, MigrationError::Peer(why)));
    }
    Err((peer.target.take(), MigrationError::Peer(why)))
}

/// The incoming QEMU between Prepare and Finish.
struct Run {
    started: StartedTarget,
    domain: RunningDomain,
    identity: Identity,
    cookie: Vec<u8>,
    _channel_order: Option<AbortOnDrop>,
}

/// [`MigrationTarget`] over one prepared target.
pub(super) struct LibvirtPeer {
    m: MigrationCtx,
    target: Option<PreparedTarget>,
    run: Option<Run>,
    completed: bool,
    host_uuid: uuid::Uuid,
    /// Set when the first Prepare arrives.
    prepared: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

fn refuse(message: impl Into<String>) -> RemoteError {
    RemoteError::qemu(ErrorCode::ConfigUnsupported, message)
}

fn failed(message: impl Into<String>) -> RemoteError {
    RemoteError::qemu(ErrorCode::OperationFailed, message)
}

/// The domain's name and UUID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `<name>` (or the `destination_name` parameter).
    pub name: String,
    /// `<uuid>`.
    pub uuid: uuid::Uuid,
}

/// What the target takes from the source's domain XML.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceDomain {
    /// Name and UUID.
    pub identity: Identity,
    /// `os/type@machine`: the versioned machine type libvirt resolved at start.
    pub machine: String,
    /// The CPU of `<cpu mode='custom'>` as a model and properties (`None` for
    /// host-passthrough or no `<cpu>`).
    pub cpu: Option<crate::cmdline::plan::CpuModel>,
    /// The whole document, for the device comparison.
    pub tree: Node,
}

fn child<'a>(n: &'a Node, name: &str) -> Option<&'a Node> {
    n.children.iter().find(|c| c.name == name)
}

/// libvirt's CPU feature names that QEMU spells otherwise (`virQEMUCapsCPUFeatureTranslate`);
/// QEMU reads `_` as `-` in every other name.
fn qemu_feature_name(libvirt: &str) -> &str {
    match libvirt {
        "pclmuldq" => "pclmulqdq",
        other => other,
    }
}

/// Reads the source's domain XML. Errors name the element.
pub fn source_domain(xml: &str, dname: Option<&str>) -> Result<SourceDomain, String> {
    let tree = qlauncher_libvirt_xml::hooks::parse(xml).map_err(|e| e.to_string())?;
    if tree.name != "domain" {
        return Err(format!("the document is <{}>, not <domain>", tree.name));
    }
    let name = match dname {
        Some(n) => n.to_owned(),
        None => child(&tree, "name")
            .map(|n| n.text.clone())
            .ok_or("domain/name is missing")?,
    };
    let uuid_text = child(&tree, "uuid").map(|n| n.text.as_str()).unwrap_or("");
    let uuid =
        uuid::Uuid::parse_str(uuid_text).map_err(|e| format!("domain/uuid {uuid_text:?}: {e}"))?;
    let machine = child(&tree, "os")
        .and_then(|os| child(os, "type"))
        .and_then(|t| t.attrs.get("machine"))
        .cloned()
        .ok_or("domain/os/type@machine is missing")?;
    let cpu =
        match child(&tree, "cpu") {
            Some(c) if c.attrs.get("mode").map(String::as_str) == Some("custom") => {
                let model = child(c, "model")
                    .map(|m| m.text.clone())
                    .filter(|m| !m.is_empty())
                    .ok_or("domain/cpu/model is missing for a custom CPU")?;
                let mut props = std::collections::BTreeMap::new();
                for f in c.children.iter().filter(|f| f.name == "feature") {
                    let name = f
                        .attrs
                        .get("name")
                        .ok_or("domain/cpu/feature@name is missing")?;
                    let on = match f.attrs.get("policy").map(String::as_str) {
                        Some("require") | Some("force") | None => true,
                        Some("disable") | Some("forbid") => false,
                        Some("optional") => continue,
                        Some(p) => return Err(format!("domain/cpu/feature[{name}]@policy {p:?}")),
                    };
                    props.insert(
                        qemu_feature_name(name).to_owned(),
                        crate::cmdline::plan::CpuProp::Bool(on),
                    );
                }
                Some(crate::cmdline::plan::CpuModel { name: model, props })
            }
            Some(c) if c.attrs.get("mode").map(String::as_str) == Some("host-model") => return Err(
                "domain/cpu@mode is host-model: a running domain's XML carries the expanded CPU"
                    .into(),
            ),
            _ => None,
        };
    Ok(SourceDomain {
        identity: Identity { name, uuid },
        machine,
        cpu,
        tree,
    })
}

/// Device kinds that hold guest-visible state: one the source runs and qlauncher's conversion
/// has none of refuses the migration.
const STATEFUL_KINDS: &[&str] = &[
    "disk",
    "interface",
    "controller",
    "hostdev",
    "filesystem",
    "rng",
    "watchdog",
    "memballoon",
    "input",
    "video",
    "sound",
    "tpm",
    "vsock",
    "redirdev",
    "smartcard",
    "shmem",
    "memory",
    "iommu",
    "panic",
    "hub",
    "parallel",
    "serial",
    "channel",
];

/// Devices libvirt adds to every x86 q35 domain whatever the XML says, which QEMU creates from
/// the machine itself (no `-device` of their own): the PS/2 mouse and keyboard, the SATA
/// controller and the PCIe root of q35.
fn implicit(kind: &str, n: &Node) -> bool {
    let a = |k: &str| n.attrs.get(k).map(String::as_str);
    match kind {
        "input" => a("bus") == Some("ps2"),
        "controller" => {
            matches!(
                (a("type"), a("index")),
                (Some("sata"), Some("0")) | (Some("pci"), Some("0"))
            )
        }
        _ => false,
    }
}

/// A device's key: its kind and alias (`disk[ua-rootdisk]`), or for an unaliased device its
/// kind and identifying attributes (`controller[pci/3]`, `input[tablet/usb]`).
fn device_key(n: &Node) -> String {
    if let Some(alias) = child(n, "alias").and_then(|a| a.attrs.get("name")) {
        if alias.starts_with("ua-") {
            return format!("{}[{alias}]", n.name);
        }
    }
    let a = |k: &str| n.attrs.get(k).cloned().unwrap_or_default();
    match n.name.as_str() {
        "controller" => format!("controller[{}/{}]", a("type"), a("index")),
        "input" => format!("input[{}/{}]", a("type"), a("bus")),
        "channel" => {
            let t = child(n, "target")
                .and_then(|t| t.attrs.get("name"))
                .cloned()
                .unwrap_or_default();
            format!("channel[{t}]")
        }
        "serial" | "video" | "memballoon" | "watchdog" | "rng" => {
            format!("{}[{}]", n.name, a("model"))
        }
        other => format!("{other}[{}]", a("model")),
    }
}

/// The PCI address of a device, as `bus:slot.function` numbers (libvirt writes hex with or
/// without leading zeros).
fn pci_address(n: &Node) -> Option<(u64, u64, u64, u64)> {
    let addr = child(n, "address")?;
    if addr.attrs.get("type").map(String::as_str) != Some("pci") {
        return None;
    }
    let num = |k: &str| {
        let v = addr.attrs.get(k).map(String::as_str).unwrap_or("0");
        let v = v.trim_start_matches("0x");
        u64::from_str_radix(if v.is_empty() { "0" } else { v }, 16).ok()
    };
    Some((num("domain")?, num("bus")?, num("slot")?, num("function")?))
}

/// Compares the devices of the source's domain (`theirs`, libvirt's live XML) with qlauncher's
/// own export of its plan (`ours`): every device of a stateful kind ([`STATEFUL_KINDS`]) the
/// source runs must be in the plan (by alias, else by kind and identifying attributes), every
/// aliased device of the plan must run on the source, and both must sit at the same PCI
/// address. Errors name the first differing element (`domain/devices/disk[ua-x]/address`).
pub fn compare_devices(theirs: &Node, ours: &Node) -> Result<(), String> {
    let devices = |n: &Node| -> Vec<(String, Node)> {
        child(n, "devices")
            .map(|d| {
                d.children
                    .iter()
                    .filter(|c| STATEFUL_KINDS.contains(&c.name.as_str()))
                    .map(|c| (device_key(c), c.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (t, o) = (devices(theirs), devices(ours));
    for (key, dev) in &t {
        let Some((_, mine)) = o.iter().find(|(k, _)| k == key) else {
            if implicit(&dev.name, dev) {
                continue;
            }
            return Err(format!(
                "domain/devices/{key}: the source runs it, qlauncher's conversion of the VMI \
                 has no such device"
            ));
        };
        if let (Some(a), Some(b)) = (pci_address(dev), pci_address(mine)) {
            if a != b {
                let show =
                    |(d, b, s, f): (u64, u64, u64, u64)| format!("{d:04x}:{b:02x}:{s:02x}.{f:x}");
                return Err(format!(
                    "domain/devices/{key}/address: the source runs it at PCI {}, qlauncher's \
                     conversion at {}",
                    show(a),
                    show(b)
                ));
            }
        }
    }
    for (key, dev) in &o {
        let aliased = child(dev, "alias")
            .and_then(|a| a.attrs.get("name"))
            .is_some_and(|a| a.starts_with("ua-"));
        if aliased && !t.iter().any(|(k, _)| k == key) {
            return Err(format!(
                "domain/devices/{key}: qlauncher's conversion of the VMI has it, the source \
                 does not run it"
            ));
        }
    }
    Ok(())
}

/// One `<interface>` of a domain XML as the migration sees it ([`source_nics`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainNic {
    /// The VMI interface name (the `ua-<name>` alias without `ua-`).
    pub name: String,
    /// `mac@address`, parsed (the guest's MAC).
    pub mac: MacAddr,
    /// `target@dev`: the tap in the pod that runs the domain. Not guest-visible: the target
    /// runs the NIC on its own pod's tap, whatever the source's is named.
    pub tap: Option<String>,
    /// `model@type` (`virtio-non-transitional`, `e1000e`, ...).
    pub model: String,
    /// The option ROM as QEMU loads it (`<rom>`; libvirt's default is the model's own ROM):
    /// `None` with `<rom enabled='no'/>`, else the `file` (empty: the model's default) and
    /// whether its BAR is visible (`bar`, default on).
    pub rom: Option<(String, bool)>,
}

/// The interfaces of a domain XML `tree` that have a KubeVirt alias (`ua-<name>`), in document
/// order. Errors name the element: a MAC that is missing or not six octets, a `<rom>` attribute
/// libvirt would not take.
pub fn source_nics(tree: &Node) -> Result<Vec<DomainNic>, String> {
    let mut out = Vec::new();
    let Some(devices) = child(tree, "devices") else {
        return Ok(out);
    };
    for n in devices.children.iter().filter(|c| c.name == "interface") {
        let Some(name) = child(n, "alias")
            .and_then(|a| a.attrs.get("name"))
            .and_then(|a| a.strip_prefix("ua-"))
        else {
            continue;
        };
        let at = format!("domain/devices/interface[ua-{name}]");
        let mac_text = child(n, "mac")
            .and_then(|m| m.attrs.get("address"))
            .ok_or_else(|| format!("{at}/mac@address is missing"))?;
        let mac = mac_text
            .parse::<MacAddr>()
            .map_err(|e| format!("{at}/mac@address: {e}"))?;
        let attr = |el: &str, k: &str| child(n, el).and_then(|e| e.attrs.get(k)).cloned();
        let on_off = |k: &str, v: Option<String>| match v.as_deref() {
            None | Some("yes") | Some("on") => Ok(true),
            Some("no") | Some("off") => Ok(false),
            Some(other) => Err(format!("{at}/rom@{k} {other:?} is not yes or no")),
        };
        let rom = match child(n, "rom") {
            None => Some((String::new(), true)),
            Some(_) => {
                if on_off("enabled", attr("rom", "enabled"))? {
                    Some((
                        attr("rom", "file").unwrap_or_default(),
                        on_off("bar", attr("rom", "bar"))?,
                    ))
                } else {
                    None
                }
            }
        };
        out.push(DomainNic {
            name: name.to_owned(),
            mac,
            tap: attr("target", "dev"),
            model: attr("model", "type").unwrap_or_default(),
            rom,
        });
    }
    Ok(out)
}

/// What the target takes from the source's NICs (`theirs`, libvirt's live XML) for its own
/// (`ours`, qlauncher's export of the VMI it was sent), by interface name: the MAC is adopted
/// (the guest runs with the source's, which virt-handler's VMI may not name yet, and the target
/// pod's own MAC is another: returns the `(interface, MAC)` pairs that differ); the tap is the
/// target pod's own; the model and the option ROM must be the same (a ROM is a RAM block QEMU
/// migrates, and the model is the guest's device): else the refusal names the element. A NIC
/// on one side only is [`compare_devices`]'s to refuse.
pub fn adopted_macs(
    theirs: &[DomainNic],
    ours: &[DomainNic],
) -> Result<Vec<(String, MacAddr)>, String> {
    let mut adopt = Vec::new();
    for t in theirs {
        let Some(o) = ours.iter().find(|o| o.name == t.name) else {
            continue;
        };
        let at = format!("domain/devices/interface[ua-{}]", t.name);
        if t.model != o.model {
            return Err(format!(
                "{at}/model: the source runs {:?}, qlauncher's conversion {:?}",
                t.model, o.model
            ));
        }
        if t.rom != o.rom {
            let show = |r: &Option<(String, bool)>| match r {
                None => "no option ROM".to_owned(),
                Some((f, bar)) if f.is_empty() => format!("the model's ROM (bar {bar})"),
                Some((f, bar)) => format!("ROM {f} (bar {bar})"),
            };
            return Err(format!(
                "{at}/rom: the source runs {}, qlauncher's conversion {}",
                show(&t.rom),
                show(&o.rom)
            ));
        }
        if t.mac != o.mac {
            adopt.push((t.name.clone(), t.mac));
        }
    }
    Ok(adopt)
}

/// The `<qemu-migration>` cookie of this target (NUL-terminated, as libvirt sends and checks
/// cookies): the domain's name and UUID, this host's name and UUID, and with `nbd` an `<nbd/>`
/// (the target's NBD server for copied disks listens on the `disks_uri` the source has, so no
/// port; libvirt's source mirrors only to a target whose cookie has it). The host UUID is a random
/// one per connection, so never the source's (libvirt refuses a migration to its own host,
/// `qemuMigrationCookieXMLParse`); the source's cookie (its capabilities, `lockstate`) asks
/// nothing of a target that answers without features. `bitmaps`: the source's dirty bitmaps
/// this target takes ([`crate::sync::migration::bitmap_cookie`]; libvirt's source migrates only
/// those the answer lists).
pub fn target_cookie(
    identity: &Identity,
    hostname: &str,
    host_uuid: &uuid::Uuid,
    nbd: bool,
    bitmaps: &[DiskBitmaps],
) -> Vec<u8> {
    let esc = |s: &str| quick_xml::escape::escape(s).into_owned();
    let xml = format!(
        "<qemu-migration>\n  <name>{}</name>\n  <uuid>{}</uuid>\n  <hostname>{}</hostname>\n  \
         <hostuuid>{}</hostuuid>\n{}{}</qemu-migration>\n",
        esc(&identity.name),
        identity.uuid.hyphenated(),
        esc(hostname),
        host_uuid.hyphenated(),
        if nbd { "  <nbd/>\n" } else { "" },
        bitmap_cookie::element(bitmaps)
    );
    let mut out = xml.into_bytes();
    out.push(0);
    out
}

/// The stream URI Prepare answers: the source's own `migrate_uri` when it is a unix socket
/// of this migration's name (KubeVirt's `<share>/migrationproxy/<uid>-49152-source.sock`, the
/// source pod's proxy socket: libvirt's target answers the path it was given, which is the same
/// in every pod of a cluster, so the source connects to its own pod's proxy), else this pod's
/// stream socket, where the target listens (through the proxy's target side) either way.
pub fn answered_uri(params: &[TypedParam], stream: &std::path::Path) -> String {
    let theirs = param_string(params, "migrate_uri").and_then(|u| {
        let path = std::path::Path::new(u.strip_prefix("unix://")?);
        (path.is_absolute() && path.file_name() == stream.file_name()).then_some(u)
    });
    match theirs {
        Some(u) => u.to_owned(),
        None => format!("unix://{}", stream.display()),
    }
}

/// How the source's libvirt sends the domain ([`stream_settings`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSettings {
    /// Migration capabilities the target enables too (`multifd`, `postcopy-ram`).
    pub capabilities: Vec<String>,
    /// `multifd-channels` with `VIR_MIGRATE_PARALLEL`.
    pub multifd_channels: Option<u32>,
    /// `VIR_MIGRATE_PAUSED`.
    pub paused: bool,
    /// With `VIR_MIGRATE_NON_SHARED_DISK`/`_INC`: the source mirrors these disks (target device
    /// names, the `migrate_disks` parameters; empty: every writable disk) to the NBD server at
    /// `disks_uri`'s path.
    pub copy_storage: Option<(Vec<String>, std::path::PathBuf)>,
}

/// The settings of a Prepare's `flags` and `params`; other flags a target here cannot honour
/// are refused naming them. A storage copy needs a `unix://` `disks_uri` (KubeVirt's
/// `<uid>-49153-source.sock`): the target's NBD server listens on the proxy's socket.
fn stream_settings(flags: u32, params: &[TypedParam]) -> Result<StreamSettings, String> {
    let unserved = [
        (flags::TUNNELLED, "VIR_MIGRATE_TUNNELLED"),
        (flags::OFFLINE, "VIR_MIGRATE_OFFLINE"),
        (flags::COMPRESSED, "VIR_MIGRATE_COMPRESSED"),
        (flags::RDMA_PIN_ALL, "VIR_MIGRATE_RDMA_PIN_ALL"),
        (flags::TLS, "VIR_MIGRATE_TLS"),
        (flags::POSTCOPY_RESUME, "VIR_MIGRATE_POSTCOPY_RESUME"),
    ];
    if let Some((_, name)) = unserved.iter().find(|(f, _)| flags & f != 0) {
        return Err(format!("qlauncher's target does not serve {name}"));
    }
    let mut caps = Vec::new();
    let mut channels = None;
    if flags & flags::PARALLEL != 0 {
        caps.push("multifd".to_owned());
        let n = params
            .iter()
            .find(|p| p.field == "parallel.connections")
            .map(|p| match p.value {
                TypedValue::Int(n) => u32::try_from(n).ok(),
                TypedValue::UInt(n) => Some(n),
                _ => None,
            })
            .unwrap_or(Some(DEFAULT_PARALLEL_CONNECTIONS))
            .filter(|n| (1..=MAX_PARALLEL_CONNECTIONS).contains(n))
            .ok_or("parallel.connections is not a number of channels from 1 to 255")?;
        channels = Some(n);
    }
    if flags & flags::POSTCOPY != 0 {
        caps.push("postcopy-ram".to_owned());
    }
    let copy_storage = if flags & (flags::NON_SHARED_DISK | flags::NON_SHARED_INC) != 0 {
        let uri = param_string(params, "disks_uri").ok_or(
            "copying local disks needs a unix:// disks_uri (the migration proxy's NBD socket)",
        )?;
        let path = uri
            .strip_prefix("unix://")
            .or_else(|| uri.strip_prefix("unix:"))
            .filter(|p| p.starts_with('/'))
            .ok_or_else(|| format!("disks_uri {uri:?} is not a unix:// socket path"))?;
        let disks = crate::libvirt_rpc::remote::param_strings(params, "migrate_disks")
            .into_iter()
            .map(str::to_owned)
            .collect();
        Some((disks, std::path::PathBuf::from(path)))
    } else {
        None
    };
    Ok(StreamSettings {
        capabilities: caps,
        multifd_channels: channels,
        paused: flags & flags::PAUSED != 0,
        copy_storage,
    })
}

/// The aliases of the disks the source copies: those named in `devs` (target device names,
/// `vda`), or with none named every writable, unshared disk with a source (libvirt's default,
/// `qemuMigrationAnyCopyDisk`). Errors name a device the domain does not have.
fn copied_aliases(tree: &Node, devs: &[String]) -> Result<Vec<String>, String> {
    let disks: Vec<&Node> = child(tree, "devices")
        .map(|d| d.children.iter().filter(|c| c.name == "disk").collect())
        .unwrap_or_default();
    let dev = |d: &Node| {
        child(d, "target")
            .and_then(|t| t.attrs.get("dev"))
            .cloned()
            .unwrap_or_default()
    };
    let alias = |d: &Node| {
        child(d, "alias")
            .and_then(|a| a.attrs.get("name"))
            .cloned()
            .filter(|a| !a.is_empty())
            .ok_or_else(|| format!("domain/devices/disk[{}] has no alias", dev(d)))
    };
    if devs.is_empty() {
        return disks
            .iter()
            .filter(|d| {
                d.attrs.get("device").map(String::as_str) != Some("cdrom")
                    && child(d, "readonly").is_none()
                    && child(d, "shareable").is_none()
                    && child(d, "source").is_some()
            })
            .map(|d| alias(d))
            .collect();
    }
    devs.iter()
        .map(|want| {
            let d = disks
                .iter()
                .find(|d| dev(d) == *want)
                .ok_or_else(|| format!("migrate_disks names {want:?}, which the domain lacks"))?;
            alias(d)
        })
        .collect()
}

/// The target QEMU's disks for `aliases`, as NBD exports libvirt's source mirrors to: each
/// device's top format node, export `drive-<alias>` (`qemuAliasDiskDriveFromDisk`).
async fn nbd_exports(
    qmp: &crate::qmp::QmpClient,
    aliases: &[String],
) -> Result<Vec<crate::sync::migration::protocol::CopiedDisk>, MigrationError> {
    let blocks = qmp.run(&crate::qmp::commands::QueryBlock).await?;
    let mut out = Vec::new();
    for alias in aliases {
        let found = blocks.iter().find_map(|b| {
            let qdev = b.qdev.as_deref()?;
            let id = qdev
                .strip_prefix("/machine/peripheral/")
                .map_or(qdev, |rest| rest.split('/').next().unwrap_or(rest));
            let ins = b.inserted.as_ref()?;
            (id == alias).then(|| {
                (
                    ins.node_name.clone(),
                    ins.image.as_ref().and_then(|i| i.virtual_size),
                )
            })
        });
        let Some((Some(node), size)) = found else {
            return Err(MigrationError::Peer(format!(
                "domain/devices/disk[{alias}]: the source copies it, the target's QEMU has no \
                 such disk"
            )));
        };
        out.push(crate::sync::migration::protocol::CopiedDisk {
            node,
            export: format!("drive-{alias}"),
            size: size.unwrap_or(0),
        });
    }
    Ok(out)
}

/// Each disk's target device (`vda`) and alias (`ua-rootdisk`) in the domain `tree`.
fn disk_devs(tree: &Node) -> Vec<(String, String)> {
    child(tree, "devices")
        .map(|d| {
            d.children
                .iter()
                .filter(|c| c.name == "disk")
                .filter_map(|d| {
                    let dev = child(d, "target")?.attrs.get("dev")?.clone();
                    let alias = child(d, "alias")?.attrs.get("name")?.clone();
                    Some((dev, alias))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The source's `offered` dirty bitmaps this target takes, as libvirt's target does
/// (`qemuMigrationDstPrepareAnyBlockDirtyBitmaps`): those of a copied disk (`copied`, aliases;
/// `devs`, each disk's target device and alias) whose node on this side is a qcow2 without a
/// bitmap of that name yet. Sets the incoming QEMU's `block-bitmap-mapping` for them (its
/// caller turns `dirty-bitmaps` on); sets nothing when none is taken.
///
/// # Errors
/// [`MigrationError::Qmp`] from QEMU's queries or the mapping.
async fn take_bitmaps(
    qmp: &crate::qmp::QmpClient,
    offered: &[DiskBitmaps],
    devs: &[(String, String)],
    copied: &[String],
    domain: &RunningDomain,
) -> Result<Vec<DiskBitmaps>, MigrationError> {
    if offered.is_empty() {
        return Ok(Vec::new());
    }
    let node_of = |target: &str| -> Option<String> {
        let alias = devs.iter().find(|(dev, _)| dev == target).map(|(_, a)| a)?;
        let i = copied.iter().position(|a| a == alias)?;
        domain.copied_disks.get(i).map(|d| d.node.clone())
    };
    let nodes = qmp.run(&crate::qmp::commands::QueryNamedBlockNodes).await?;
    let mut room = Vec::new();
    for disk in offered {
        let Some(node) = node_of(&disk.target) else {
            warn!(disk = %disk.target, "the source offers bitmaps of a disk it does not copy here: not taken");
            continue;
        };
        let Some(info) = nodes.iter().find(|n| n.node_name == node) else {
            continue;
        };
        if info.drv != "qcow2" {
            warn!(disk = %disk.target, driver = %info.drv, "bitmaps migrate only to qcow2: not taken");
            continue;
        }
        let bitmaps = disk
            .bitmaps
            .iter()
            .filter(|b| !info.dirty_bitmaps.iter().any(|x| x.name == b.name))
            .cloned()
            .collect();
        room.push(DiskBitmaps {
            target: disk.target.clone(),
            bitmaps,
        });
    }
    let taken = bitmap_cookie::agreed(offered, &room);
    let mapping = bitmap_cookie::mapping(&taken, node_of);
    if mapping.is_empty() {
        return Ok(Vec::new());
    }
    qmp.run(&crate::qmp::migration::MigrateSetParameters {
        block_bitmap_mapping: Some(mapping),
        ..Default::default()
    })
    .await?;
    info!(
        bitmaps = taken.iter().map(|d| d.bitmaps.len()).sum::<usize>(),
        "the source's dirty bitmaps migrate in the stream"
    );
    Ok(taken)
}

/// What Prepare takes from a source it accepts ([`LibvirtPeer::check_source`]).
struct Checked {
    source: SourceDomain,
    /// The source's domain as qlauncher's own definition of it.
    domain: RunningDomain,
    /// The aliases of the disks the source copies over NBD.
    copied: Option<Vec<String>>,
    /// The guest MACs to adopt ([`adopted_macs`]).
    macs: Vec<(String, MacAddr)>,
    /// The dirty bitmaps the source's cookie offers ([`bitmap_cookie::parse`]).
    offered: Vec<DiskBitmaps>,
}

/// Adopts the source's guest MACs `macs` ([`adopted_macs`]) into the prepared `target`: the VMI
/// view and the converter's interface facts take them (so a later sync, whose VMI may name no
/// MAC, converts the same), and the plan, argv, QMP plan and `api.Domain` are defined again
/// (the preparation's hook edits applied), as KubeVirt's target runs the migrated XML's MAC.
/// Nothing changes when the conversion fails (the error is the refusal).
fn adopt_macs(
    d: &DomainCtx,
    target: &mut PreparedTarget,
    macs: &[(String, MacAddr)],
) -> Result<(), String> {
    if macs.is_empty() {
        return Ok(());
    }
    let mut view = target.view.clone();
    let mut ctx = target.prepared.running.ctx.clone();
    for (name, mac) in macs {
        let text = mac.to_string();
        let iface = view
            .spec
            .domain
            .devices
            .interfaces
            .iter_mut()
            .flatten()
            .find(|i| i.name == *name);
        if let Some(iface) = iface {
            iface.mac_address = Some(text.clone());
        }
        if let Some(facts) = ctx.interfaces.get_mut(name) {
            facts.mac = Some(text);
        }
        info!(interface = %name, mac = %mac, "the source's guest MAC adopted");
    }
    let plan = crate::cmdline::convert(&view, &ctx)
        .map_err(|e| format!("cannot convert the VMI with the source's guest MACs: {e}"))?;
    let p = &mut target.prepared;
    let defined = define(d, plan, &p.running.hook_edits);
    let mut api = p.domain.clone();
    defined
        .report(&mut api, &view, &ctx)
        .map_err(|e| format!("cannot report the domain with the source's guest MACs: {e}"))?;
    p.domain = api;
    p.plan = defined.plan;
    p.qmp_plan = defined.qmp_plan;
    p.argv = defined.argv;
    p.view = view.clone();
    p.running.ctx = ctx;
    target.view = view;
    Ok(())
}

impl LibvirtPeer {
    async fn prepare_inner(
        &mut self,
        a: Prepare3ParamsArgs,
    ) -> Result<Prepare3ParamsRet, RemoteError> {
        self.prepared
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if self.run.is_some() {
            return Err(RemoteError::qemu(
                ErrorCode::OperationInvalid,
                "an incoming migration is already prepared on this connection",
            ));
        }
        let Some(mut target) = self.target.take() else {
            return Err(RemoteError::qemu(
                ErrorCode::OperationInvalid,
                "this target pod's migration already ran",
            ));
        };
        let checked = self
            .check_source(&a, &target)
            .and_then(|c| adopt_macs(&self.m.ctx, &mut target, &c.macs).map(|()| c));
        let Checked {
            source,
            mut domain,
            copied,
            offered,
            ..
        } = match checked {
            Ok(v) => v,
            Err(e) => {
                warn!(reason = %e, "libvirt source refused in Prepare");
                self.target = Some(target);
                return Err(refuse(e));
            }
        };
        info!(
            name = %source.identity.name,
            machine = %source.machine,
            cpu = ?source.cpu.as_ref().map(|c| &c.name),
            "libvirt source's domain accepted; starting the incoming QEMU"
        );
        let started = match self.m.start_incoming(target, &domain).await {
            Ok(s) => s,
            Err((target, reason, _)) => {
                self.target = target;
                return Err(refuse(reason));
            }
        };
        let sockets = self.m.target_sockets(&started.proxy_key);
        let mut bitmaps = Vec::new();
        if let Some(aliases) = &copied {
            match nbd_exports(&started.client, aliases).await {
                Ok(d) => domain.copied_disks = d,
                Err(e) => {
                    let _ = started.client.run(&Quit).await;
                    return Err(refuse(e.failure_reason()));
                }
            }
            let devs = disk_devs(&source.tree);
            match take_bitmaps(&started.client, &offered, &devs, aliases, &domain).await {
                Ok(taken) => bitmaps = taken,
                Err(e) => {
                    let _ = started.client.run(&Quit).await;
                    return Err(failed(e.failure_reason()));
                }
            }
            if !bitmaps.is_empty() {
                domain.capabilities.push("dirty-bitmaps".to_owned());
            }
        }
        let order = match prepare_incoming_qemu(&started.client, &domain, &sockets).await {
            Ok((_, order)) => order,
            Err(e) => {
                let _ = started.client.run(&Quit).await;
                return Err(failed(e.failure_reason()));
            }
        };
        let hostname = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "qlauncher".into());
        let cookie = target_cookie(
            &source.identity,
            &hostname,
            &self.host_uuid,
            copied.is_some(),
            &bitmaps,
        );
        let uri = answered_uri(&a.params, &sockets.stream);
        info!(uri = %uri, "incoming QEMU waits for the libvirt source's stream");
        self.run = Some(Run {
            started,
            domain,
            identity: source.identity,
            cookie: cookie.clone(),
            _channel_order: order,
        });
        Ok(Prepare3ParamsRet {
            cookie,
            uri: Some(uri),
        })
    }

    /// The source's domain checked against this target's plan, as qlauncher's own definition
    /// of it. Errors are the refusal's message.
    fn check_source(
        &self,
        a: &Prepare3ParamsArgs,
        target: &PreparedTarget,
    ) -> Result<Checked, String> {
        let xml = param_string(&a.params, "destination_xml")
            .ok_or("the Prepare has no destination_xml parameter")?;
        let source = source_domain(xml, param_string(&a.params, "destination_name"))?;
        let settings = stream_settings(a.flags, &a.params)?;
        let copied = match &settings.copy_storage {
            Some((devs, path)) => {
                // The source names its own pod's proxy socket (KubeVirt's
                // `<share>/migrationproxy/<uid>-49153-source.sock`, at the same path in every
                // pod of a cluster, but another in each pod's mount namespace): its name must be
                // this migration's, which the target's NBD server listens on in this pod.
                let ours = self.m.target_sockets(&target.proxy_key).nbd;
                if path.file_name() != ours.file_name() {
                    return Err(format!(
                        "disks_uri names {}, the migration's NBD socket is {}",
                        path.display(),
                        ours.display()
                    ));
                }
                Some(copied_aliases(&source.tree, devs)?)
            }
            None => None,
        };
        let p = &target.prepared;
        let ours = qlauncher_libvirt_xml::export(&target.view, &p.running.ctx, &p.plan)
            .and_then(|d| qlauncher_libvirt_xml::to_xml(&d))
            .map_err(|e| format!("cannot export qlauncher's own domain XML: {e}"))?;
        let ours = qlauncher_libvirt_xml::hooks::parse(&ours).map_err(|e| e.to_string())?;
        let our_name = child(&ours, "name").map(|n| n.text.as_str()).unwrap_or("");
        if source.identity.name != our_name {
            return Err(format!(
                "domain/name: the source migrates {:?}, this target runs {our_name:?}",
                source.identity.name
            ));
        }
        // libvirt takes a domain without <uuid> from its SMBIOS system UUID, the VMI's
        // firmware UUID (KubeVirt's converter sets no domain UUID).
        let our_uuid = p.plan.uuid.as_str();
        if uuid::Uuid::parse_str(our_uuid).ok() != Some(source.identity.uuid) {
            return Err(format!(
                "domain/uuid: the source's is {}, this target's {our_uuid:?}",
                source.identity.uuid
            ));
        }
        compare_devices(&source.tree, &ours)?;
        let macs = adopted_macs(&source_nics(&source.tree)?, &source_nics(&ours)?)?;
        for (name, mac) in &macs {
            let bridged = target
                .view
                .spec
                .domain
                .devices
                .interfaces
                .iter()
                .flatten()
                .any(|i| i.name == *name && i.bridge.is_some());
            if bridged {
                return Err(format!(
                    "domain/devices/interface[ua-{name}]/mac: the source's guest runs {mac}, and \
                     this pod's bridge binding serves DHCP to its own guest MAC only"
                ));
            }
        }
        let cpu = source.cpu.clone().filter(|_| p.plan.cpu.host_model);
        let migration_uid = self.m.ctl.metadata().map(|m| m.uid).unwrap_or_default();
        let domain = RunningDomain {
            vmi_uid: target.vmi_uid.clone(),
            migration_uid,
            machine: source.machine.clone(),
            argv: Vec::new(),
            hotplugged: Vec::new(),
            copied_disks: Vec::new(),
            capabilities: settings.capabilities,
            multifd_channels: settings.multifd_channels,
            paused: settings.paused,
            cpu,
            hooked: None,
        };
        let offered = bitmap_cookie::parse(&a.cookie)?;
        Ok(Checked {
            source,
            domain,
            copied,
            macs,
            offered,
        })
    }

    async fn finish_inner(
        &mut self,
        a: Finish3ParamsArgs,
    ) -> Result<Finish3ParamsRet, RemoteError> {
        let Some(run) = self.run.take() else {
            return Err(RemoteError::qemu(
                ErrorCode::OperationInvalid,
                "no incoming migration was prepared on this connection",
            ));
        };
        let Run {
            started,
            domain,
            identity,
            cookie,
            _channel_order,
        } = run;
        if a.cancelled {
            warn!("the libvirt source's Perform failed: stopping the target's QEMU");
            let _ = started.client.run(&Quit).await;
            return Err(failed(
                "the migration was cancelled; the target's QEMU stopped",
            ));
        }
        if let Err(e) = complete_incoming(&started.client, &domain).await {
            let _ = started.client.run(&Quit).await;
            return Err(failed(e.failure_reason()));
        }
        drop(_channel_order);
        self.m
            .incoming_completed(domain.paused, started.prepared.running)
            .await;
        self.completed = true;
        info!(name = %identity.name, "incoming migration from libvirt completed");
        Ok(Finish3ParamsRet {
            domain: Domain {
                name: identity.name,
                uuid: *identity.uuid.as_bytes(),
                id: 1,
            },
            cookie,
        })
    }
}

impl MigrationTarget for LibvirtPeer {
    async fn prepare(&mut self, a: Prepare3ParamsArgs) -> Result<Prepare3ParamsRet, RemoteError> {
        self.prepare_inner(a).await
    }

    async fn finish(&mut self, a: Finish3ParamsArgs) -> Result<Finish3ParamsRet, RemoteError> {
        self.finish_inner(a).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const XML: &str = r#"<domain type='qemu' id='1'>
  <name>default_hv</name>
  <uuid>bbbbbbbb-0000-4000-8000-000000000001</uuid>
  <os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type></os>
  <cpu mode='custom' match='exact' check='full'>
    <model fallback='forbid'>EPYC</model>
    <vendor>AMD</vendor>
    <feature policy='require' name='x2apic'/>
    <feature policy='disable' name='svm'/>
    <feature policy='require' name='pclmuldq'/>
  </cpu>
  <devices>
    <disk type='file' device='disk'>
      <alias name='ua-rootdisk'/>
      <address type='pci' domain='0x0000' bus='0x03' slot='0x00' function='0x0'/>
    </disk>
    <controller type='sata' index='0'><alias name='ide'/></controller>
    <input type='mouse' bus='ps2'><alias name='input1'/></input>
  </devices>
</domain>"#;

    #[test]
    fn the_source_domain_gives_machine_cpu_and_identity() {
        let d = source_domain(XML, None).unwrap();
        assert_eq!(d.identity.name, "default_hv");
        assert_eq!(d.machine, "pc-q35-7.2");
        let cpu = d.cpu.unwrap();
        assert_eq!(cpu.name, "EPYC");
        use crate::cmdline::plan::CpuProp;
        assert_eq!(cpu.props.get("x2apic"), Some(&CpuProp::Bool(true)));
        assert_eq!(cpu.props.get("svm"), Some(&CpuProp::Bool(false)));
        assert_eq!(cpu.props.get("pclmulqdq"), Some(&CpuProp::Bool(true)));
        assert_eq!(
            source_domain(XML, Some("ns_other")).unwrap().identity.name,
            "ns_other"
        );
        let e = source_domain(&XML.replace("machine='pc-q35-7.2'", ""), None).unwrap_err();
        assert!(e.contains("domain/os/type@machine"), "{e}");
        assert!(source_domain("<domain><name>x", None).is_err());
        assert!(source_domain("<other/>", None).is_err());
    }

    #[test]
    fn devices_are_compared_by_alias_and_pci_address() {
        let theirs = source_domain(XML, None).unwrap().tree;
        let ours = qlauncher_libvirt_xml::hooks::parse(
            "<domain><devices><disk><alias name='ua-rootdisk'/>\
             <address type='pci' domain='0x0000' bus='0x03' slot='0x00' function='0x0'/>\
             </disk></devices></domain>",
        )
        .unwrap();
        compare_devices(&theirs, &ours).unwrap();
        let moved = qlauncher_libvirt_xml::hooks::parse(
            "<domain><devices><disk><alias name='ua-rootdisk'/>\
             <address type='pci' domain='0' bus='4' slot='0' function='0'/>\
             </disk></devices></domain>",
        )
        .unwrap();
        let e = compare_devices(&theirs, &moved).unwrap_err();
        assert!(
            e.starts_with("domain/devices/disk[ua-rootdisk]/address"),
            "{e}"
        );
        let extra = source_domain(
            &XML.replace(
                "</devices>",
                "<sound model='ich9'><alias name='sound0'/></sound></devices>",
            ),
            None,
        )
        .unwrap()
        .tree;
        let e = compare_devices(&extra, &ours).unwrap_err();
        assert!(e.starts_with("domain/devices/sound[ich9]"), "{e}");
        let none = qlauncher_libvirt_xml::hooks::parse("<domain><devices/></domain>").unwrap();
        let e = compare_devices(&none, &ours).unwrap_err();
        assert!(
            e.contains("disk[ua-rootdisk]") && e.contains("does not run"),
            "{e}"
        );
    }

    /// A domain with one KubeVirt NIC `ua-default` (`extra` inside the `<interface>`), as
    /// KubeVirt's converter (and qlauncher's export) writes a masquerade interface.
    fn nic_domain(mac: &str, tap: &str, extra: &str) -> Node {
        qlauncher_libvirt_xml::hooks::parse(&format!(
            "<domain><devices><interface type='ethernet'>\
             <address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x0'/>\
             <target dev='{tap}' managed='no'/><model type='virtio-non-transitional'/>\
             <mac address='{mac}'/><mtu size='1500'/><alias name='ua-default'/>{extra}\
             </interface><interface type='user'><alias name='net9'/>\
             <mac address='52:54:00:00:00:09'/></interface></devices></domain>"
        ))
        .unwrap()
    }

    #[test]
    fn a_nic_is_read_with_its_mac_tap_model_and_rom() {
        let nics = source_nics(&nic_domain(
            "0A:58:0A:F4:00:05",
            "tap0",
            "<rom enabled='no'/>",
        ))
        .unwrap();
        // Only KubeVirt's interfaces (a `ua-` alias): libvirt's own `net9` is not the VMI's.
        assert_eq!(
            nics,
            vec![DomainNic {
                name: "default".into(),
                mac: MacAddr([0x0a, 0x58, 0x0a, 0xf4, 0, 5]),
                tap: Some("tap0".into()),
                model: "virtio-non-transitional".into(),
                rom: None,
            }]
        );
        let rom = |extra: &str| source_nics(&nic_domain("0a:58:0a:f4:00:05", "tap0", extra));
        assert_eq!(rom("").unwrap()[0].rom, Some((String::new(), true)));
        assert_eq!(
            rom("<rom bar='off' file='/usr/share/qemu/pxe.rom'/>").unwrap()[0].rom,
            Some(("/usr/share/qemu/pxe.rom".into(), false))
        );
        let e = rom("<rom enabled='maybe'/>").unwrap_err();
        assert!(
            e.starts_with("domain/devices/interface[ua-default]/rom@enabled"),
            "{e}"
        );
        let e = source_nics(&nic_domain("0a:58:zz:f4:00:05", "tap0", "")).unwrap_err();
        assert!(
            e.starts_with("domain/devices/interface[ua-default]/mac@address"),
            "{e}"
        );
    }

    #[test]
    fn the_sources_mac_is_adopted_its_tap_ignored_and_a_rom_or_model_refused() {
        let ours = source_nics(&nic_domain(
            "0a:58:0a:f4:00:66",
            "tap0",
            "<rom enabled='no'/>",
        ))
        .unwrap();
        // The source pod's tap has another name: not guest-visible, nothing to adopt.
        let theirs = source_nics(&nic_domain(
            "0a:58:0a:f4:00:66",
            "tap-src",
            "<rom enabled='no'/>",
        ))
        .unwrap();
        assert_eq!(adopted_macs(&theirs, &ours).unwrap(), vec![]);
        let theirs = source_nics(&nic_domain(
            "0a:58:0a:f4:00:05",
            "tap0",
            "<rom enabled='no'/>",
        ))
        .unwrap();
        assert_eq!(
            adopted_macs(&theirs, &ours).unwrap(),
            vec![(
                "default".to_owned(),
                MacAddr([0x0a, 0x58, 0x0a, 0xf4, 0, 5])
            )]
        );
        // The model's ROM on the source, none here: a RAM block the target would lack.
        let theirs = source_nics(&nic_domain("0a:58:0a:f4:00:05", "tap0", "")).unwrap();
        let e = adopted_macs(&theirs, &ours).unwrap_err();
        assert!(
            e.starts_with("domain/devices/interface[ua-default]/rom"),
            "{e}"
        );
        assert!(e.contains("no option ROM"), "{e}");
        let mut e1000e = ours.clone();
        e1000e[0].model = "e1000e".into();
        let e = adopted_macs(&e1000e, &ours).unwrap_err();
        assert!(
            e.starts_with("domain/devices/interface[ua-default]/model"),
            "{e}"
        );
        // A NIC on one side only is compare_devices' to refuse.
        assert_eq!(adopted_macs(&[], &ours).unwrap(), vec![]);
    }

    #[test]
    fn the_copied_disks_are_the_named_or_every_writable_one() {
        let tree = qlauncher_libvirt_xml::hooks::parse(
            "<domain><devices>\
             <disk device='disk'><source file='/a'/><target dev='vda'/><alias name='ua-root'/></disk>\
             <disk device='disk'><source file='/b'/><target dev='vdb'/><readonly/>\
             <alias name='ua-ro'/></disk>\
             <disk device='cdrom'><source file='/c'/><target dev='sda'/><alias name='ua-cd'/></disk>\
             <disk device='disk'><source file='/d'/><target dev='vdc'/></disk>\
             </devices></domain>",
        )
        .unwrap();
        assert_eq!(
            copied_aliases(&tree, &["vda".into()]).unwrap(),
            vec!["ua-root".to_owned()]
        );
        let e = copied_aliases(&tree, &["vdz".into()]).unwrap_err();
        assert!(e.contains("vdz"), "{e}");
        // Every writable disk: vdc has no alias, which names it.
        let e = copied_aliases(&tree, &[]).unwrap_err();
        assert!(e.contains("disk[vdc]"), "{e}");
    }

    #[test]
    fn flags_qlauncher_cannot_honour_are_refused() {
        let live_p2p = 1 | 2 | 8;
        let plain = stream_settings(live_p2p, &[]).unwrap();
        assert_eq!(
            (plain.capabilities, plain.multifd_channels, plain.paused),
            (vec![], None, false)
        );
        let par = [TypedParam {
            field: "parallel.connections".into(),
            value: TypedValue::Int(8),
        }];
        let multifd = stream_settings(live_p2p | flags::PARALLEL, &par).unwrap();
        assert_eq!(
            (multifd.capabilities, multifd.multifd_channels),
            (vec!["multifd".to_owned()], Some(8))
        );
        let e = stream_settings(live_p2p | flags::NON_SHARED_INC, &[]).unwrap_err();
        assert!(e.contains("disks_uri"), "{e}");
        let nbd = [
            TypedParam {
                field: "disks_uri".into(),
                value: TypedValue::String("unix:///run/m/u-49153-source.sock".into()),
            },
            TypedParam {
                field: "migrate_disks".into(),
                value: TypedValue::String("vda".into()),
            },
        ];
        let s = stream_settings(live_p2p | flags::NON_SHARED_INC, &nbd).unwrap();
        assert_eq!(
            s.copy_storage,
            Some((vec!["vda".to_owned()], "/run/m/u-49153-source.sock".into()))
        );
        let e = stream_settings(live_p2p | flags::TLS, &[]).unwrap_err();
        assert!(e.contains("VIR_MIGRATE_TLS"), "{e}");
        let zero = [TypedParam {
            field: "parallel.connections".into(),
            value: TypedValue::Int(0),
        }];
        assert!(stream_settings(live_p2p | flags::PARALLEL, &zero).is_err());
    }

    #[test]
    fn the_stream_uri_is_the_sources_own_proxy_socket_of_this_migration() {
        let ours = std::path::Path::new("/pod-b/migrationproxy/u-49152-source.sock");
        let uri = |u: &str| vec![TypedParam::string("migrate_uri", u)];
        assert_eq!(
            answered_uri(
                &uri("unix:///var/run/kubevirt/migrationproxy/u-49152-source.sock"),
                ours
            ),
            "unix:///var/run/kubevirt/migrationproxy/u-49152-source.sock"
        );
        // Another socket's name, a relative path, TCP, or none: this pod's own socket.
        for other in [
            "unix:///var/run/kubevirt/migrationproxy/v-49152-source.sock",
            "unix://u-49152-source.sock",
            "tcp://10.0.0.1:49152",
        ] {
            assert_eq!(
                answered_uri(&uri(other), ours),
                format!("unix://{}", ours.display())
            );
        }
        assert_eq!(
            answered_uri(&[], ours),
            format!("unix://{}", ours.display())
        );
    }

    #[test]
    fn the_cookie_names_the_domain_and_another_host() {
        let id = Identity {
            name: "default_<hv>".into(),
            uuid: uuid::Uuid::nil(),
        };
        let host = uuid::Uuid::new_v4();
        let c = target_cookie(&id, "node", &host, true, &[]);
        assert_eq!(c.last(), Some(&0));
        let text = std::str::from_utf8(&c[..c.len() - 1]).unwrap();
        assert!(text.contains("<name>default_&lt;hv&gt;</name>"), "{text}");
        assert!(text.contains(&format!("<hostuuid>{}</hostuuid>", host.hyphenated())));
        assert_eq!(
            first_frame(&[0, 0, 0, 28, 0x20, 0, 0x80, 0x86]),
            FirstFrame::Libvirt
        );
        assert_eq!(
            first_frame(&[0, 0, 0, 28, 0x51, 0xa7, 0xc4, 0xe5]),
            FirstFrame::QlauncherProbe
        );
        assert_eq!(
            first_frame(&[0, 0, 0, 28, b'{', b'"', b'h', b'e']),
            FirstFrame::Qlauncher
        );
    }
}
