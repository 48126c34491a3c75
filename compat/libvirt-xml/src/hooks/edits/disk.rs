//! Tier 2, disks: what an answer may change on a `<disk>` with an alias (`driver@cache`, `@io`,
//! `@discard`, `@error_policy`, `@rerror_policy`, `@queues`, `<serial>`, `<iotune>`, `<wwn>`),
//! as typed [`DiskEdit`]s, and how each is applied to the disk's blockdev chain and frontend the
//! way libvirt renders the attribute (`qemu_block.c` `qemuBlockStorageSourceGetBlockdevProps`,
//! `qemu_command.c` `qemuBuildDiskDeviceProps`), or, for `<iotune>`, to the plan's QMP start-up
//! (`qemu_process.c` `qemuProcessSetupDiskThrottling`: `block_set_io_throttle` before the guest
//! runs).

use super::*;
use qlauncher_core::cmdline::plan::{Backend, DeviceClass};
use qlauncher_core::cmdline::qemu::{
    Aio, BlockSetIoThrottle, Blockdev, BlockdevCache, Device, IoThrottle, OnError,
};

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
    /// `<iotune>`: the disk's I/O limits (libvirt's element names mapped to QEMU's in
    /// [`IOTUNE`]), checked as QEMU's `throttle_is_valid` and libvirt's
    /// `qemuValidateDomainDeviceDefDiskIOThrottle` check them; `None` removes every limit.
    IoTune(Option<Box<IoThrottle>>),
    /// `<wwn>`: a SCSI disk's World Wide Name, 16 hex digits (libvirt's `virValidateWWN`); as
    /// libvirt, only on a `scsi` disk (`Only ide and scsi disk support wwn`, q35 has no IDE).
    Wwn(Option<u64>),
}

/// libvirt's `<iotune>` children and QEMU's `block_set_io_throttle` names
/// (`qemuDiskConfigBlkdeviotuneEnabled`, `qemuMonitorJSONSetBlockIoThrottle`), besides
/// `group_name` (QEMU's `group`).
pub const IOTUNE: [(&str, &str); 19] = [
    ("total_bytes_sec", "bps"),
    ("read_bytes_sec", "bps_rd"),
    ("write_bytes_sec", "bps_wr"),
    ("total_iops_sec", "iops"),
    ("read_iops_sec", "iops_rd"),
    ("write_iops_sec", "iops_wr"),
    ("total_bytes_sec_max", "bps_max"),
    ("read_bytes_sec_max", "bps_rd_max"),
    ("write_bytes_sec_max", "bps_wr_max"),
    ("total_iops_sec_max", "iops_max"),
    ("read_iops_sec_max", "iops_rd_max"),
    ("write_iops_sec_max", "iops_wr_max"),
    ("size_iops_sec", "iops_size"),
    ("total_bytes_sec_max_length", "bps_max_length"),
    ("read_bytes_sec_max_length", "bps_rd_max_length"),
    ("write_bytes_sec_max_length", "bps_wr_max_length"),
    ("total_iops_sec_max_length", "iops_max_length"),
    ("read_iops_sec_max_length", "iops_rd_max_length"),
    ("write_iops_sec_max_length", "iops_wr_max_length"),
];

/// The largest limit QEMU takes (`THROTTLE_VALUE_MAX`, libvirt's `QEMU_BLOCK_IOTUNE_MAX`).
pub const IOTUNE_MAX: u64 = 1_000_000_000_000_000;

/// Longest throttle group name taken from a hook (bytes).
pub const MAX_GROUP_NAME: usize = 255;

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
            DiskEdit::IoTune(None) => write!(f, "iotune removed"),
            DiskEdit::IoTune(Some(t)) => {
                write!(f, "iotune")?;
                for name in IoThrottle::NUMBERS {
                    match t.number(name) {
                        Some(0) | None => {}
                        Some(v) => write!(f, " {name}={v}")?,
                    }
                }
                match &t.group {
                    Some(g) => write!(f, " group={g:?}"),
                    None => Ok(()),
                }
            }
            DiskEdit::Wwn(Some(w)) => write!(f, "wwn 0x{w:016x}"),
            DiskEdit::Wwn(None) => write!(f, "wwn removed"),
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

/// The tier-2 view of one `<disk>`: the attributes of [`DRIVER_ATTRS`], `<serial>`,
/// `<iotune>` (its children's text by name, zeros dropped: 0 is "no limit") and `<wwn>` (16
/// lower-case hex digits when it is a WWN, else as written), taken out of the tree; the bus,
/// the `device` and whether it has an image, kept for the checks.
#[derive(Debug, Default, PartialEq)]
pub(in crate::hooks) struct DiskView {
    driver: BTreeMap<&'static str, String>,
    serial: Option<String>,
    iotune: BTreeMap<String, String>,
    wwn: Option<String>,
    bus: String,
    device: String,
    has_image: bool,
}

/// A `<wwn>` as 16 lower-case hex digits (`0x` prefix allowed, as libvirt's `virValidateWWN`).
fn wwn_number(text: &str) -> Option<u64> {
    let hex = text.strip_prefix("0x").unwrap_or(text);
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
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
                device: disk.attrs.get("device").cloned().unwrap_or_default(),
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
                // `rerror_policy` equal to what `error_policy` implies is no setting of its own.
                let w = v.driver.get("error_policy");
                if w.is_some_and(|w| w != "enospace") && v.driver.get("rerror_policy") == w {
                    v.driver.remove("rerror_policy");
                }
            }
            disk.children.retain(|c| {
                let plain = c.attrs.is_empty() && c.children.is_empty();
                match c.name.as_str() {
                    "serial" if plain => {
                        v.serial = Some(c.text.clone()).filter(|t| !t.is_empty());
                        false
                    }
                    "wwn" if plain => {
                        v.wwn = Some(match wwn_number(&c.text) {
                            Some(n) => format!("{n:016x}"),
                            None => c.text.clone(),
                        });
                        false
                    }
                    // Only plain children: anything else stays for the general diff to refuse.
                    "iotune"
                        if c.attrs.is_empty()
                            && c.children
                                .iter()
                                .all(|t| t.attrs.is_empty() && t.children.is_empty()) =>
                    {
                        for t in &c.children {
                            if t.text != "0" {
                                v.iotune.insert(t.name.clone(), t.text.clone());
                            }
                        }
                        false
                    }
                    _ => true,
                }
            });
            out.insert(alias, v);
        }
    }
    out
}

/// A refusal of the disk `alias`'s `what` ([`device_refusal`]).
fn refuse(
    alias: &str,
    what: &str,
    sent: Option<&str>,
    answered: Option<&str>,
    why: &str,
) -> Refusal {
    device_refusal("disk", alias, what, sent, answered, why)
}

/// The edits between the disks `sent` and `answered` (a disk only one side has is the device
/// diff's business, not this one's).
pub(in crate::hooks) fn diff_disks(
    sent: &BTreeMap<String, DiskView>,
    answered: &BTreeMap<String, DiskView>,
) -> Result<Vec<HookEdit>, Refusal> {
    keyed_diff(sent, answered, Keys::Both, |alias, a, b| {
        let (Some(a), Some(b)) = (a, b) else {
            return Ok(vec![]);
        };
        Ok(diff_disk(alias, a, b)?
            .into_iter()
            .map(|edit| HookEdit::Disk {
                alias: alias.clone(),
                edit,
            })
            .collect())
    })
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
    if a.iotune != b.iotune {
        if !b.has_image {
            return Err(refuse(alias, "iotune", None, None, "the disk has no image"));
        }
        edits.push(DiskEdit::IoTune(iotune(alias, a, b)?.map(Box::new)));
    }
    if a.wwn != b.wwn {
        let wwn = match &b.wwn {
            None => None,
            Some(w) => {
                let bad = |why: &str| refuse(alias, "wwn#text", a.wwn.as_deref(), Some(w), why);
                let n = wwn_number(w).ok_or_else(|| bad("not a WWN (16 hex digits)"))?;
                if b.bus != "scsi" {
                    return Err(bad(
                        "only a scsi disk takes a wwn (libvirt: only ide and scsi \
                         disks support wwn; q35 has no IDE)",
                    ));
                }
                if b.device == "lun" {
                    return Err(bad("a lun passes the device's own wwn through"));
                }
                Some(n)
            }
        };
        edits.push(DiskEdit::Wwn(wwn));
    }
    Ok(edits)
}

/// The answer's `<iotune>` of disk `alias` as QEMU's limits, or `None` when it sets none;
/// refused (with the element) when a value is not a number up to [`IOTUNE_MAX`], an element
/// is not libvirt's, or the limits break QEMU's rules: a total and a read/write limit of one
/// kind together, a burst without its rate or below it, a burst length without a burst or
/// longer than QEMU allows for it, a group without a limit.
fn iotune(alias: &str, a: &DiskView, b: &DiskView) -> Result<Option<IoThrottle>, Refusal> {
    let what = |name: &str| format!("iotune/{name}#text");
    let bad = |name: &str, why: &str| {
        refuse(
            alias,
            &what(name),
            a.iotune.get(name).map(String::as_str),
            b.iotune.get(name).map(String::as_str),
            why,
        )
    };
    let mut t = IoThrottle::default();
    for (name, text) in &b.iotune {
        if name == "group_name" {
            check_text(
                &format!("domain/devices/disk[{alias}]/{}", what(name)),
                a.iotune.get(name).map_or("-", String::as_str),
                text,
            )?;
            if text.is_empty() || text.len() > MAX_GROUP_NAME {
                return Err(bad(name, "not a throttle group name (1 to 255 bytes)"));
            }
            t.group = Some(text.clone());
            continue;
        }
        let Some((_, qemu)) = IOTUNE.iter().find(|(l, _)| l == name) else {
            return Err(bad(name, "not an iotune element qlauncher runs"));
        };
        let n = text
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= IOTUNE_MAX)
            .ok_or_else(|| {
                bad(
                    name,
                    "not a number from 0 to 1000000000000000 (QEMU's THROTTLE_VALUE_MAX)",
                )
            })?;
        t.set_number(qemu, n);
    }
    let libvirt = |qemu: &str| {
        IOTUNE
            .iter()
            .find(|(_, q)| *q == qemu)
            .map_or("-", |(l, _)| l)
    };
    let get = |qemu: &str| t.number(qemu).unwrap_or(0);
    for kind in ["bps", "iops", "bps_max", "iops_max"] {
        let (rd, wr) = if let Some(k) = kind.strip_suffix("_max") {
            (format!("{k}_rd_max"), format!("{k}_wr_max"))
        } else {
            (format!("{kind}_rd"), format!("{kind}_wr"))
        };
        if get(kind) != 0 && (get(&rd) != 0 || get(&wr) != 0) {
            return Err(bad(
                libvirt(kind),
                "a total limit and a read or write limit of one kind cannot be set together",
            ));
        }
    }
    for avg in ["bps", "bps_rd", "bps_wr", "iops", "iops_rd", "iops_wr"] {
        let max = format!("{avg}_max");
        let length = format!("{avg}_max_length");
        let (avg_v, max_v, len_v) = (get(avg), get(&max), get(&length));
        if max_v != 0 && avg_v == 0 {
            return Err(bad(
                libvirt(&max),
                &format!("a burst needs its rate ({})", libvirt(avg)),
            ));
        }
        if max_v != 0 && max_v < avg_v {
            return Err(bad(
                libvirt(&max),
                &format!("a burst cannot be lower than its rate ({})", libvirt(avg)),
            ));
        }
        if len_v > 1 && max_v == 0 {
            return Err(bad(
                libvirt(&length),
                &format!("a burst length needs its burst ({})", libvirt(&max)),
            ));
        }
        if max_v != 0 && len_v > IOTUNE_MAX / max_v {
            return Err(bad(
                libvirt(&length),
                "the burst length is too long for its burst (QEMU's THROTTLE_VALUE_MAX)",
            ));
        }
    }
    let any = IoThrottle::NUMBERS
        .iter()
        .filter(|n| **n != "iops_size" && !n.ends_with("_length"))
        .any(|n| get(n) != 0);
    if !any {
        if t.group.is_some() || get("iops_size") != 0 {
            return Err(bad(
                if t.group.is_some() {
                    "group_name"
                } else {
                    "size_iops_sec"
                },
                "needs a limit (a bytes or iops rate)",
            ));
        }
        return Ok(None);
    }
    Ok(Some(t))
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
    if let DiskEdit::IoTune(limits) = edit {
        plan.io_throttles.retain(|t| t.id != alias);
        if let Some(limits) = limits {
            plan.io_throttles.push(BlockSetIoThrottle {
                id: alias.into(),
                limits: (**limits).clone(),
            });
        }
        return;
    }
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
        (DiskEdit::Wwn(w), Device::DiskFrontend(f)) => f.wwn = *w,
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::*;
    use qlauncher_core::cmdline::qemu::{Aio, IoThrottle, OnError};

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
        <alias name=\"ua-cd\"></alias></disk>\
        <disk device=\"disk\" type=\"file\"><source file=\"/s.img\"></source>\
        <target bus=\"scsi\" dev=\"sdc\"></target>\
        <driver error_policy=\"stop\" name=\"qemu\" type=\"raw\"></driver>\
        <alias name=\"ua-scsi\"></alias></disk></devices></domain>";

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

    /// `<iotune>` inserted into the root disk.
    fn with_iotune(body: &str) -> String {
        SENT.replace(
            "<alias name=\"ua-root\">",
            &format!("<iotune>{body}</iotune><alias name=\"ua-root\">"),
        )
    }

    #[test]
    fn iotune_is_qemus_throttle_limits() {
        let answer = with_iotune(
            "<total_bytes_sec>1000000</total_bytes_sec><read_iops_sec>100</read_iops_sec>\
             <read_iops_sec_max>200</read_iops_sec_max>\
             <read_iops_sec_max_length>5</read_iops_sec_max_length>\
             <write_iops_sec>0</write_iops_sec><size_iops_sec>4096</size_iops_sec>\
             <group_name>g1</group_name>",
        );
        let want = IoThrottle {
            bps: 1_000_000,
            iops_rd: 100,
            iops_rd_max: Some(200),
            iops_rd_max_length: Some(5),
            iops_size: Some(4096),
            group: Some("g1".into()),
            ..IoThrottle::default()
        };
        assert_eq!(
            diff_answer(SENT, &answer).unwrap(),
            vec![edit("ua-root", DiskEdit::IoTune(Some(Box::new(want))))]
        );
        assert_eq!(
            hook_diff(SENT, &answer).unwrap(),
            "disk ua-root iotune bps=1000000 iops_rd=100 iops_rd_max=200 \
             iops_rd_max_length=5 iops_size=4096 group=\"g1\"\n"
        );
        // Zeros are no limit: an all-zero `<iotune>` is no change; removing one is.
        let zeros = with_iotune("<total_bytes_sec>0</total_bytes_sec>");
        assert_eq!(diff_answer(SENT, &zeros).unwrap(), vec![]);
        assert_eq!(
            diff_answer(&answer, SENT).unwrap(),
            vec![edit("ua-root", DiskEdit::IoTune(None))]
        );
    }

    #[test]
    fn bad_iotune_is_refused_with_the_element() {
        let el = |k: &str| format!("domain/devices/disk[ua-root]/iotune/{k}#text");
        let cases = [
            ("<total_bytes_sec>x</total_bytes_sec>", "total_bytes_sec"),
            ("<total_bytes_sec>-1</total_bytes_sec>", "total_bytes_sec"),
            (
                "<total_bytes_sec>1000000000000001</total_bytes_sec>",
                "total_bytes_sec",
            ),
            ("<total_bytes_secs>1</total_bytes_secs>", "total_bytes_secs"),
            (
                "<total_bytes_sec>1</total_bytes_sec><read_bytes_sec>1</read_bytes_sec>",
                "total_bytes_sec",
            ),
            (
                "<total_iops_sec_max>9</total_iops_sec_max><write_iops_sec_max>9</write_iops_sec_max>\
                 <total_iops_sec>1</total_iops_sec><write_iops_sec>1</write_iops_sec>",
                "total_iops_sec",
            ),
            ("<write_bytes_sec_max>9</write_bytes_sec_max>", "write_bytes_sec_max"),
            (
                "<write_bytes_sec>10</write_bytes_sec><write_bytes_sec_max>9</write_bytes_sec_max>",
                "write_bytes_sec_max",
            ),
            (
                "<total_iops_sec>10</total_iops_sec><total_iops_sec_max_length>9</total_iops_sec_max_length>",
                "total_iops_sec_max_length",
            ),
            (
                "<total_iops_sec>10</total_iops_sec><total_iops_sec_max>1000000000000000</total_iops_sec_max>\
                 <total_iops_sec_max_length>2</total_iops_sec_max_length>",
                "total_iops_sec_max_length",
            ),
            ("<group_name>g</group_name>", "group_name"),
            (
                "<total_iops_sec>1</total_iops_sec><group_name>a&#xA;b</group_name>",
                "group_name",
            ),
            ("<size_iops_sec>4096</size_iops_sec>", "size_iops_sec"),
        ];
        for (body, element) in cases {
            let r = diff_answer(SENT, &with_iotune(body)).unwrap_err();
            assert_eq!(r.path, el(element), "{body}: {r}");
        }
        // Not plain text children: the general diff refuses the element.
        let odd = with_iotune("<total_bytes_sec unit=\"k\">1</total_bytes_sec>");
        assert!(diff_answer(SENT, &odd).unwrap_err().path.contains("iotune"));
        // An empty cdrom has no drive to throttle.
        let cd = SENT.replace(
            "<alias name=\"ua-cd\">",
            "<iotune><total_iops_sec>5</total_iops_sec></iotune><alias name=\"ua-cd\">",
        );
        assert_eq!(
            diff_answer(SENT, &cd).unwrap_err().path,
            "domain/devices/disk[ua-cd]/iotune"
        );
    }

    #[test]
    fn wwn_on_a_scsi_disk_only() {
        let wwn = |alias: &str, w: &str| {
            SENT.replace(
                &format!("<alias name=\"{alias}\">"),
                &format!("<wwn>{w}</wwn><alias name=\"{alias}\">"),
            )
        };
        let want = vec![edit("ua-scsi", DiskEdit::Wwn(Some(0x5000_c500_15ea_71ac)))];
        assert_eq!(
            diff_answer(SENT, &wwn("ua-scsi", "5000c50015ea71ac")).unwrap(),
            want
        );
        // libvirt's `0x` and upper case are the same WWN.
        let upper = wwn("ua-scsi", "0x5000C50015EA71AC");
        assert_eq!(diff_answer(SENT, &upper).unwrap(), want);
        assert_eq!(
            diff_answer(&wwn("ua-scsi", "5000c50015ea71ac"), &upper).unwrap(),
            vec![]
        );
        for (alias, w) in [
            ("ua-scsi", "5000c50015ea71a"),
            ("ua-scsi", "5000c50015ea71ag"),
            ("ua-scsi", "5000c50015ea71ac,x=1"),
            ("ua-root", "5000c50015ea71ac"),
            ("ua-data", "5000c50015ea71ac"),
        ] {
            let r = diff_answer(SENT, &wwn(alias, w)).unwrap_err();
            assert_eq!(
                r.path,
                format!("domain/devices/disk[{alias}]/wwn#text"),
                "{w}"
            );
        }
        assert_eq!(
            hook_diff(SENT, &upper).unwrap(),
            "disk ua-scsi wwn 0x5000c50015ea71ac\n"
        );
    }
}
