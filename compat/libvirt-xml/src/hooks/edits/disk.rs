//! Tier 2, disks: what an answer may change on a `<disk>` with an alias (`driver@cache`, `@io`,
//! `@discard`, `@error_policy`, `@rerror_policy`, `@queues`, `<serial>`), as typed
//! [`DiskEdit`]s, and how each is applied to the disk's blockdev chain and frontend the way
//! libvirt renders the attribute (`qemu_block.c` `qemuBlockStorageSourceGetBlockdevProps`,
//! `qemu_command.c` `qemuBuildDiskDeviceProps`).

use super::*;
use qlauncher_core::cmdline::plan::{Backend, DeviceClass};
use qlauncher_core::cmdline::qemu::{Aio, Blockdev, BlockdevCache, Device, OnError};

/// libvirt's disk cache modes and the QEMU flags each stands for (`qemuDomainDiskCachemodeFlags`):
/// `cache.direct` and `cache.no-flush` of every blockdev node, the frontend's `write-cache`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    /// `none`: O_DIRECT, guest write cache on.
    None,
    /// `writethrough`: host page cache, every write flushed (guest write cache off).
    Writethrough,
    /// `writeback`: host page cache, guest write cache on.
    Writeback,
    /// `directsync`: O_DIRECT, guest write cache off.
    Directsync,
    /// `unsafe`: flushes ignored.
    Unsafe,
}

impl CacheMode {
    /// The mode of a libvirt `cache` value; `None` for any other text.
    pub fn from_libvirt(value: &str) -> Option<CacheMode> {
        Some(match value {
            "none" => CacheMode::None,
            "writethrough" => CacheMode::Writethrough,
            "writeback" => CacheMode::Writeback,
            "directsync" => CacheMode::Directsync,
            "unsafe" => CacheMode::Unsafe,
            _ => return Option::None,
        })
    }

    /// `(direct, no_flush, write_cache)`.
    pub fn flags(self) -> (bool, bool, &'static str) {
        match self {
            CacheMode::None => (true, false, "on"),
            CacheMode::Writethrough => (false, false, "off"),
            CacheMode::Writeback => (false, false, "on"),
            CacheMode::Directsync => (true, false, "off"),
            CacheMode::Unsafe => (false, true, "on"),
        }
    }
}

/// libvirt's `discard` of a disk: `unmap` passes the guest's discards down the chain
/// (`discard=unmap` on every node), `ignore` leaves QEMU's default (discards dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discard {
    /// `unmap`.
    Unmap,
    /// `ignore`.
    Ignore,
}

/// One change of one disk's driver or serial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskEdit {
    /// `driver@cache`.
    Cache(CacheMode),
    /// `driver@io`: QEMU's `aio` of the disk's protocol nodes (`native`, `threads`,
    /// `io_uring`).
    Io(Aio),
    /// `driver@discard`.
    Discard(Discard),
    /// `driver@error_policy` and `driver@rerror_policy`: the frontend's `werror` and `rerror`
    /// (libvirt `qemuBuildDiskFrontendAttributeErrorPolicy`: `rerror` follows `error_policy`
    /// unless `rerror_policy` is given, and is left out for `enospace`, which QEMU's `rerror`
    /// does not take).
    ErrorPolicy {
        /// `werror`.
        write: OnError,
        /// `rerror`.
        read: Option<OnError>,
    },
    /// `driver@queues`: virtio-blk's `num-queues` (1 to QEMU's `VIRTIO_QUEUE_MAX`, 1024).
    Queues(u16),
    /// `<serial>`: the frontend's `serial` (and a SCSI disk's VPD `device_id`, which libvirt
    /// derives from it); `None` removes it. Checked as KubeVirt's admitter and the bus's QEMU
    /// device check it ([`qlauncher_core::vmi::validate::check_disk_serial`]).
    Serial(Option<String>),
}

impl std::fmt::Display for DiskEdit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiskEdit::Cache(m) => write!(f, "driver@cache {}", format!("{m:?}").to_lowercase()),
            DiskEdit::Io(a) => write!(f, "driver@io {}", io_name(*a)),
            DiskEdit::Discard(d) => {
                write!(f, "driver@discard {}", format!("{d:?}").to_lowercase())
            }
            DiskEdit::ErrorPolicy { write, read } => {
                write!(f, "driver@error_policy werror={}", on_error_name(*write))?;
                match read {
                    Some(r) => write!(f, " rerror={}", on_error_name(*r)),
                    None => write!(f, " rerror=-"),
                }
            }
            DiskEdit::Queues(n) => write!(f, "driver@queues {n}"),
            DiskEdit::Serial(Some(s)) => write!(f, "serial {s}"),
            DiskEdit::Serial(None) => write!(f, "serial removed"),
        }
    }
}

fn io_name(a: Aio) -> &'static str {
    match a {
        Aio::Native => "native",
        Aio::Threads => "threads",
        Aio::IoUring => "io_uring",
    }
}

fn on_error_name(e: OnError) -> &'static str {
    match e {
        OnError::Stop => "stop",
        OnError::Report => "report",
        OnError::Ignore => "ignore",
        OnError::Enospc => "enospace",
    }
}

/// The `<driver>` attributes of a disk this module reads.
const DRIVER_ATTRS: [&str; 6] = [
    "cache",
    "io",
    "discard",
    "error_policy",
    "rerror_policy",
    "queues",
];

/// The tier-2 view of one `<disk>`: the attributes of [`DRIVER_ATTRS`] and `<serial>`, taken
/// out of the tree; the bus and whether it has an image, kept for the checks.
#[derive(Debug, Default, PartialEq)]
pub(in crate::hooks) struct DiskView {
    driver: BTreeMap<&'static str, String>,
    serial: Option<String>,
    bus: String,
    has_image: bool,
}

/// Takes the tier-2 disk attributes out of every `<disk>` with an alias, by alias.
pub(in crate::hooks) fn take_disks(d: &mut Node) -> BTreeMap<String, DiskView> {
    let mut out = BTreeMap::new();
    for devices in d.children.iter_mut().filter(|c| c.name == "devices") {
        for disk in devices.children.iter_mut().filter(|c| c.name == "disk") {
            let child = |n: &str| disk.children.iter().find(|c| c.name == n);
            let Some(alias) = child("alias").and_then(|a| a.attrs.get("name").cloned()) else {
                continue;
            };
            let mut v = DiskView {
                bus: child("target")
                    .and_then(|t| t.attrs.get("bus").cloned())
                    .unwrap_or_default(),
                // An empty cdrom has no blockdev nodes for storage settings to go on.
                has_image: disk.attrs.get("device").map(String::as_str) != Some("cdrom")
                    || child("source").is_some_and(|s| s.attrs.values().any(|v| !v.is_empty())),
                ..DiskView::default()
            };
            if let Some(drv) = disk.children.iter_mut().find(|c| c.name == "driver") {
                for k in DRIVER_ATTRS {
                    if let Some(val) = drv.attrs.remove(k) {
                        v.driver.insert(k, val);
                    }
                }
            }
            disk.children.retain(|c| {
                if c.name == "serial" && c.attrs.is_empty() && c.children.is_empty() {
                    v.serial = Some(c.text.clone()).filter(|t| !t.is_empty());
                    return false;
                }
                true
            });
            out.insert(alias, v);
        }
    }
    out
}

/// A refusal of the disk `alias`'s `what` (`driver@io`, `serial`).
fn refuse(
    alias: &str,
    what: &str,
    sent: Option<&str>,
    answered: Option<&str>,
    why: &str,
) -> Refusal {
    Refusal {
        path: format!("domain/devices/disk[{alias}]/{what}"),
        sent: sent.unwrap_or("-").into(),
        answered: answered.unwrap_or("-").into(),
        reason: why.into(),
    }
}

/// The edits between the disks `sent` and `answered` (a disk only one side has is the device
/// diff's business, not this one's).
pub(in crate::hooks) fn diff_disks(
    sent: &BTreeMap<String, DiskView>,
    answered: &BTreeMap<String, DiskView>,
) -> Result<Vec<HookEdit>, Refusal> {
    let mut edits = Vec::new();
    for (alias, b) in answered {
        let Some(a) = sent.get(alias) else { continue };
        for e in diff_disk(alias, a, b)? {
            edits.push(HookEdit::Disk {
                alias: alias.clone(),
                edit: e,
            });
        }
    }
    Ok(edits)
}

/// The `driver@k` of `v`.
fn get<'a>(v: &'a DiskView, k: &str) -> Option<&'a str> {
    v.driver.get(k).map(String::as_str)
}

/// The edits of one disk, in the order of [`DiskEdit`].
fn diff_disk(alias: &str, a: &DiskView, b: &DiskView) -> Result<Vec<DiskEdit>, Refusal> {
    let mut edits = Vec::new();
    let changed = |k: &str| a.driver.get(k) != b.driver.get(k);
    let value = |k: &'static str| -> Result<Option<String>, Refusal> {
        if !changed(k) {
            return Ok(None);
        }
        let (s, n) = (get(a, k), get(b, k));
        let what = format!("driver@{k}");
        if n.is_none() {
            return Err(refuse(alias, &what, s, n, "removing it is not supported"));
        }
        if !a.has_image && ["cache", "io", "discard"].contains(&k) {
            return Err(refuse(alias, &what, s, n, "the disk has no image"));
        }
        Ok(n.map(str::to_string))
    };
    if let Some(c) = value("cache")? {
        let mode = CacheMode::from_libvirt(&c).ok_or_else(|| {
            refuse(
                alias,
                "driver@cache",
                get(a, "cache"),
                Some(&c),
                "not a cache mode (none, writethrough, writeback, directsync, unsafe)",
            )
        })?;
        edits.push(DiskEdit::Cache(mode));
    }
    if let Some(io) = value("io")? {
        let aio = match io.as_str() {
            "native" => Aio::Native,
            "threads" => Aio::Threads,
            "io_uring" => Aio::IoUring,
            _ => {
                return Err(refuse(
                    alias,
                    "driver@io",
                    get(a, "io"),
                    Some(&io),
                    "not an io mode (native, threads, io_uring)",
                ))
            }
        };
        edits.push(DiskEdit::Io(aio));
    }
    // QEMU's aio=native needs cache.direct=on (file-posix refuses the node otherwise); libvirt
    // passes both through, so the start fails there. Refused here, over the answer's final
    // cache and io.
    if (changed("io") || changed("cache")) && get(b, "io") == Some("native") {
        let direct = get(b, "cache")
            .and_then(CacheMode::from_libvirt)
            .is_some_and(|m| m.flags().0);
        if !direct {
            return Err(refuse(
                alias,
                "driver@io",
                get(a, "io"),
                get(b, "io"),
                &format!(
                    "io native needs cache none or directsync (QEMU's aio=native requires \
                     cache.direct), the answer has cache {}",
                    get(b, "cache").unwrap_or("-")
                ),
            ));
        }
    }
    if let Some(d) = value("discard")? {
        let d = match d.as_str() {
            "unmap" => Discard::Unmap,
            "ignore" => Discard::Ignore,
            _ => {
                return Err(refuse(
                    alias,
                    "driver@discard",
                    get(a, "discard"),
                    Some(&d),
                    "not a discard mode (unmap, ignore)",
                ))
            }
        };
        edits.push(DiskEdit::Discard(d));
    }
    if changed("error_policy") || changed("rerror_policy") {
        edits.push(error_policy(alias, a, b)?);
    }
    if let Some(q) = value("queues")? {
        let n = q.parse::<u16>().ok().filter(|n| (1..=1024).contains(n));
        let Some(n) = n else {
            return Err(refuse(
                alias,
                "driver@queues",
                get(a, "queues"),
                Some(&q),
                "not a queue count from 1 to 1024 (QEMU's VIRTIO_QUEUE_MAX)",
            ));
        };
        if b.bus != "virtio" {
            return Err(refuse(
                alias,
                "driver@queues",
                get(a, "queues"),
                Some(&q),
                "queues are a virtio-blk setting; this disk is not on bus virtio",
            ));
        }
        edits.push(DiskEdit::Queues(n));
    }
    if a.serial != b.serial {
        if let Some(s) = &b.serial {
            qlauncher_core::vmi::validate::check_disk_serial(s, &b.bus)
                .map_err(|why| refuse(alias, "serial#text", a.serial.as_deref(), Some(s), &why))?;
        }
        edits.push(DiskEdit::Serial(b.serial.clone()));
    }
    Ok(edits)
}

/// `werror`/`rerror` from the answer's `error_policy` and `rerror_policy` (libvirt's values;
/// `rerror_policy` takes no `enospace`).
fn error_policy(alias: &str, a: &DiskView, b: &DiskView) -> Result<DiskEdit, Refusal> {
    let parse = |k: &str, enospace: bool| -> Result<Option<OnError>, Refusal> {
        let Some(v) = b.driver.get(k) else {
            return Ok(None);
        };
        Ok(Some(match v.as_str() {
            "stop" => OnError::Stop,
            "report" => OnError::Report,
            "ignore" => OnError::Ignore,
            "enospace" if enospace => OnError::Enospc,
            _ => {
                return Err(refuse(
                    alias,
                    &format!("driver@{k}"),
                    a.driver.get(k).map(String::as_str),
                    Some(v),
                    if enospace {
                        "not an error policy (stop, report, ignore, enospace)"
                    } else {
                        "not a read error policy (stop, report, ignore)"
                    },
                ))
            }
        }))
    };
    let Some(write) = parse("error_policy", true)? else {
        return Err(refuse(
            alias,
            "driver@error_policy",
            a.driver.get("error_policy").map(String::as_str),
            None,
            "removing it is not supported",
        ));
    };
    let read = parse("rerror_policy", false)?.or((write != OnError::Enospc).then_some(write));
    Ok(DiskEdit::ErrorPolicy { write, read })
}

/// Applies `edit` to the disk with QEMU id `alias`: storage settings on the nodes of its
/// blockdev chain as libvirt sets them on the whole chain, frontend settings on its device.
pub(in crate::hooks) fn apply_disk(plan: &mut DomainPlan, alias: &str, edit: &DiskEdit) {
    for d in plan
        .devices
        .iter_mut()
        .filter(|d| d.class == DeviceClass::Disk && d.device.id() == alias)
    {
        if let Backend::Blockdevs(nodes) = &mut d.backend {
            for node in nodes.iter_mut() {
                apply_node(node, edit);
            }
        }
        apply_frontend(&mut d.device, edit);
    }
}

fn apply_node(node: &mut Blockdev, edit: &DiskEdit) {
    match (edit, node) {
        (DiskEdit::Cache(mode), n) => {
            let (direct, no_flush, _) = mode.flags();
            let c = match n {
                Blockdev::Protocol(p) => &mut p.cache,
                Blockdev::Format(f) => &mut f.cache,
            };
            if c.is_some() {
                *c = Some(BlockdevCache { direct, no_flush });
            }
        }
        (DiskEdit::Io(aio), Blockdev::Protocol(p)) => p.aio = Some(*aio),
        // Protocol nodes always carry `unmap` (libvirt's storage nodes do); the disk's discard
        // is the format nodes'.
        (DiskEdit::Discard(d), Blockdev::Format(f)) => {
            f.discard = (*d == Discard::Unmap).then_some("unmap");
        }
        _ => {}
    }
}

fn apply_frontend(device: &mut Device, edit: &DiskEdit) {
    match (edit, device) {
        (DiskEdit::Cache(mode), Device::VirtioBlk(v)) if v.write_cache.is_some() => {
            v.write_cache = Some(mode.flags().2);
        }
        (DiskEdit::Cache(mode), Device::DiskFrontend(f)) if f.write_cache.is_some() => {
            f.write_cache = Some(mode.flags().2);
        }
        (DiskEdit::ErrorPolicy { write, read }, Device::VirtioBlk(v)) => {
            v.werror = Some(*write);
            v.rerror = *read;
        }
        (DiskEdit::ErrorPolicy { write, read }, Device::DiskFrontend(f)) => {
            f.werror = Some(*write);
            f.rerror = *read;
        }
        (DiskEdit::Queues(n), Device::VirtioBlk(v)) => v.num_queues = Some(u32::from(*n)),
        (DiskEdit::Serial(s), Device::VirtioBlk(v)) => v.serial = s.clone(),
        (DiskEdit::Serial(s), Device::DiskFrontend(f)) => {
            // libvirt's VPD device id of a SCSI disk: the serial, else `drive-<alias>`.
            if f.device_id.is_some() {
                f.device_id = Some(s.clone().unwrap_or_else(|| format!("drive-{}", f.id)));
            }
            f.serial = s.clone();
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::*;
    use qlauncher_core::cmdline::qemu::{Aio, OnError};

    const SENT: &str = "<domain type=\"kvm\"><name>ns_vm</name><devices>\
        <disk device=\"disk\" type=\"file\"><source file=\"/r.qcow2\"></source>\
        <target bus=\"virtio\" dev=\"vda\"></target>\
        <driver cache=\"none\" error_policy=\"stop\" io=\"native\" name=\"qemu\" type=\"qcow2\" discard=\"unmap\"></driver>\
        <alias name=\"ua-root\"></alias></disk>\
        <disk device=\"disk\" type=\"file\"><source file=\"/d.img\"></source>\
        <target bus=\"sata\" dev=\"sda\"></target><serial>s1</serial>\
        <driver cache=\"writeback\" error_policy=\"stop\" name=\"qemu\" type=\"raw\"></driver>\
        <alias name=\"ua-data\"></alias></disk>\
        <disk device=\"cdrom\" type=\"block\"><target bus=\"sata\" dev=\"sdb\"></target>\
        <driver error_policy=\"stop\" name=\"qemu\" type=\"raw\"></driver>\
        <alias name=\"ua-cd\"></alias></disk></devices></domain>";

    fn edit(alias: &str, edit: DiskEdit) -> HookEdit {
        HookEdit::Disk {
            alias: alias.into(),
            edit,
        }
    }

    #[test]
    fn several_driver_attributes_of_one_disk_are_typed_edits() {
        let answer = SENT
            .replace("io=\"native\"", "io=\"io_uring\" queues=\"4\"")
            .replace("discard=\"unmap\"", "discard=\"ignore\"")
            .replacen(
                "error_policy=\"stop\"",
                "error_policy=\"report\" rerror_policy=\"ignore\"",
                1,
            )
            .replace(
                "<alias name=\"ua-root\">",
                "<serial>hooked-1</serial><alias name=\"ua-root\">",
            );
        assert_eq!(
            diff_answer(SENT, &answer).unwrap(),
            vec![
                edit("ua-root", DiskEdit::Io(Aio::IoUring)),
                edit("ua-root", DiskEdit::Discard(Discard::Ignore)),
                edit(
                    "ua-root",
                    DiskEdit::ErrorPolicy {
                        write: OnError::Report,
                        read: Some(OnError::Ignore)
                    }
                ),
                edit("ua-root", DiskEdit::Queues(4)),
                edit("ua-root", DiskEdit::Serial(Some("hooked-1".into()))),
            ]
        );
        // enospace: rerror left out; a serial removed.
        let answer = SENT
            .replace(
                "error_policy=\"stop\" name=\"qemu\" type=\"raw\"></driver><alias name=\"ua-data\"",
                "error_policy=\"enospace\" name=\"qemu\" type=\"raw\"></driver><alias name=\"ua-data\"",
            )
            .replace("<serial>s1</serial>", "");
        assert_eq!(
            diff_answer(SENT, &answer).unwrap(),
            vec![
                edit(
                    "ua-data",
                    DiskEdit::ErrorPolicy {
                        write: OnError::Enospc,
                        read: None
                    }
                ),
                edit("ua-data", DiskEdit::Serial(None)),
            ]
        );
    }

    fn refusal(answer: &str) -> (String, String, String) {
        let r = diff_answer(SENT, answer).unwrap_err();
        (r.path, r.sent, r.answered)
    }

    #[test]
    fn bad_disk_values_are_refused_with_the_path_and_both_values() {
        let root = |k: &str| format!("domain/devices/disk[ua-root]/{k}");
        let cases: Vec<(String, (String, String, String))> = vec![
            (
                SENT.replace("io=\"native\"", "io=\"fast\""),
                (root("driver@io"), "native".into(), "fast".into()),
            ),
            // native with a host-cached mode: QEMU would refuse the node.
            (
                SENT.replacen("cache=\"none\"", "cache=\"writeback\"", 1),
                (root("driver@io"), "native".into(), "native".into()),
            ),
            (
                SENT.replace("discard=\"unmap\"", "discard=\"trim\""),
                (root("driver@discard"), "unmap".into(), "trim".into()),
            ),
            (
                SENT.replace("discard=\"unmap\"", ""),
                (root("driver@discard"), "unmap".into(), "-".into()),
            ),
            (
                SENT.replacen("error_policy=\"stop\"", "error_policy=\"retry\"", 1),
                (root("driver@error_policy"), "stop".into(), "retry".into()),
            ),
            (
                SENT.replacen(
                    "error_policy=\"stop\"",
                    "error_policy=\"stop\" rerror_policy=\"enospace\"",
                    1,
                ),
                (root("driver@rerror_policy"), "-".into(), "enospace".into()),
            ),
            (
                SENT.replace("io=\"native\"", "io=\"native\" queues=\"0\""),
                (root("driver@queues"), "-".into(), "0".into()),
            ),
            (
                SENT.replace("io=\"native\"", "io=\"native\" queues=\"1025\""),
                (root("driver@queues"), "-".into(), "1025".into()),
            ),
            (
                SENT.replace("<serial>s1</serial>", "<serial>a b</serial>"),
                (
                    "domain/devices/disk[ua-data]/serial#text".into(),
                    "s1".into(),
                    "a b".into(),
                ),
            ),
            (
                SENT.replace(
                    "type=\"raw\"></driver><alias name=\"ua-data\"",
                    "type=\"raw\" queues=\"2\"></driver><alias name=\"ua-data\"",
                ),
                (
                    "domain/devices/disk[ua-data]/driver@queues".into(),
                    "-".into(),
                    "2".into(),
                ),
            ),
            (
                SENT.replace(
                    "type=\"raw\"></driver><alias name=\"ua-cd\"",
                    "type=\"raw\" cache=\"none\"></driver><alias name=\"ua-cd\"",
                ),
                (
                    "domain/devices/disk[ua-cd]/driver@cache".into(),
                    "-".into(),
                    "none".into(),
                ),
            ),
        ];
        for (answer, want) in cases {
            assert_eq!(refusal(&answer), want, "{answer}");
        }
        // KubeVirt's admitter takes at most 256 serial characters.
        let long = SENT.replace(
            "<serial>s1</serial>",
            &format!("<serial>{}</serial>", "a".repeat(257)),
        );
        assert!(diff_answer(SENT, &long).is_err());
    }

    #[test]
    fn hook_diff_prints_disk_edits() {
        let answer = SENT
            .replace("io=\"native\"", "io=\"native\" queues=\"2\"")
            .replace("<serial>s1</serial>", "<serial>s2</serial>");
        assert_eq!(
            hook_diff(SENT, &answer).unwrap(),
            "disk ua-data serial s2\ndisk ua-root driver@queues 2\n"
        );
    }
}
