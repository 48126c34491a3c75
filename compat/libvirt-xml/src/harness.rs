//! The comparison harness: qlauncher's argv for a plan against the argv libvirt builds from the
//! exported domain XML, as a side-by-side table of normalised records ([`crate::argv`]):
//! `same`, `differs` (which properties), `only-ours`, `only-libvirt`. Every difference must be
//! covered by [`ALLOWLIST`], which says why it is intended; anything else fails the comparison.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::argv::Record;

/// How a record compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Present in both with equal properties.
    Same,
    /// Present in both; some properties differ.
    Differs,
    /// Only in qlauncher's argv.
    OnlyOurs,
    /// Only in libvirt's argv.
    OnlyLibvirt,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Same => "same",
            Kind::Differs => "differs",
            Kind::OnlyOurs => "only-ours",
            Kind::OnlyLibvirt => "only-libvirt",
        }
    }
}

/// One accepted difference.
#[derive(Debug, Clone, Copy)]
pub struct Allowed {
    /// Record key; a trailing `*` matches any suffix.
    pub key: &'static str,
    /// The kind of difference.
    pub kind: Kind,
    /// For `Differs`: the property (`*` = any; `""` = the head, e.g. the machine type).
    pub prop: &'static str,
    /// `true`: qlauncher differs on purpose, or libvirt's offline rendering differs from its
    /// real start. `false`: a known gap in qlauncher's converter, listed so it stays visible
    /// (marked `~` in the table) until fixed.
    pub intended: bool,
    /// Why.
    pub reason: &'static str,
}

const fn ok(key: &'static str, kind: Kind, prop: &'static str, reason: &'static str) -> Allowed {
    Allowed {
        key,
        kind,
        prop,
        intended: true,
        reason,
    }
}

// No known gap is listed today; the constructor stays for the next one.
#[allow(dead_code)]
const fn gap(key: &'static str, kind: Kind, prop: &'static str, reason: &'static str) -> Allowed {
    Allowed {
        key,
        kind,
        prop,
        intended: false,
        reason,
    }
}

const NIC_REBUILT: &str = "domxml-to-native re-creates NIC definitions around a tap it opens itself: it drops the user alias (net0 instead of ua-<name>), host_mtu, the ROM setting, boot order, acpi index, multiqueue and the PCI address (re-assigned, adding its own ports); libvirt's real start keeps them (libvirt's user-aliases and net-mtu cases)";
const TAP_FDS: &str = "domxml-to-native opens one tap fd and no vhost-net fd (not openable in its sandbox); a real start passes one tap fd per queue plus vhost fds, as qlauncher does";
const NIC_PORTS: &str = "ports and bridges libvirt adds while re-addressing the NICs domxml-to-native re-created (see the NIC rows)";

/// The documented accepted differences between qlauncher's argv and libvirt 9.0's
/// (`virsh domxml-to-native`, QEMU 7.2 capabilities) for the same KubeVirt domain.
pub const ALLOWLIST: &[Allowed] = &[
    ok("object masterKey0", Kind::OnlyLibvirt, "*", "libvirt's master key for encrypting secrets it passes to QEMU; qlauncher passes no secrets"),
    ok("chardev charmonitor", Kind::Differs, "*", "qlauncher hands QEMU a pre-opened QMP listener (fd=); domxml-to-native prints a path under its root (libvirt's real start also pre-opens it)"),
    ok("chardev charchannel0", Kind::Differs, "path", "KubeVirt leaves the guest-agent socket path to libvirt (<root>/lib/qemu/channel/target/...); qlauncher puts it under /var/run/kubevirt-private/<uid>/"),
    ok("machine", Kind::Differs, "", "libvirt expands the q35 alias to the newest versioned machine (pc-q35-7.2); qlauncher passes the alias"),
    ok("cpu", Kind::Differs, "*", "libvirt expands host-model into a named model plus the features it probed on this host; qlauncher runs -cpu host,migratable=on (TCG: max)"),
    ok("display", Kind::OnlyOurs, "*", "qlauncher always says -display none; libvirt leaves it out when VNC is configured (same effect: no local window)"),
    ok("device nic*", Kind::Differs, "id", NIC_REBUILT),
    ok("device nic*", Kind::Differs, "host_mtu", NIC_REBUILT),
    ok("device nic*", Kind::Differs, "romfile", NIC_REBUILT),
    ok("device nic*", Kind::Differs, "bootindex", NIC_REBUILT),
    ok("device nic*", Kind::Differs, "acpi-index", NIC_REBUILT),
    ok("device nic*", Kind::Differs, "bus", NIC_REBUILT),
    ok("device nic*", Kind::Differs, "addr", NIC_REBUILT),
    ok("device nic*", Kind::Differs, "mq", NIC_REBUILT),
    ok("device nic*", Kind::Differs, "vectors", NIC_REBUILT),
    ok("device pci.*", Kind::OnlyLibvirt, "*", NIC_PORTS),
    ok("device pci.*", Kind::Differs, "multifunction", NIC_PORTS),
    ok("netdev nic*", Kind::Differs, "*", TAP_FDS),
    ok("device ua-*", Kind::Differs, "discard_granularity", "<blockio discard_granularity> is newer than libvirt 9.0 (Debian 12), which ignores it; KubeVirt v1.9's libvirt 11.10 passes it like qlauncher"),
    ok("blockdev format:*", Kind::Differs, "backing", "a qcow2 without <backingStore> (emptyDisk): libvirt's real start probes the image and then writes \"backing\":null like qlauncher; domxml-to-native opens no images"),
    ok("rtc", Kind::Differs, "base", "clock.utc.offsetSeconds: the RTC start date is now + offset; the plan uses the context's fixed time, libvirt the current time"),
    ok("smp", Kind::Differs, "", "CPU hotplug: libvirt starts with the non-hotpluggable vCPUs (-smp 1) and device_adds the other enabled ones over QMP before the guest runs; qlauncher starts them all (-smp 2): same vCPUs at guest start"),
    ok("machine", Kind::Differs, "pflash1", "libvirt 9.0 puts a raw format node on the EFI vars file; libvirt 11 (KubeVirt v1.9) and qlauncher use the file node directly"),
    ok("blockdev format:/var/run/kubevirt-private/libvirt/qemu/nvram/*", Kind::OnlyLibvirt, "*", "libvirt 9.0 puts a raw format node on the EFI vars file; libvirt 11 (KubeVirt v1.9) and qlauncher use the file node directly"),
    ok("global kvm-pit.lost_tick_policy", Kind::OnlyLibvirt, "*", "under TCG there is no in-kernel PIT; qlauncher leaves the kvm-pit global out, libvirt emits it anyway (QEMU ignores it)"),
    ok("audiodev audio1", Kind::OnlyLibvirt, "*", "libvirt 9.0 gives every domain a 'none' audio backend; qlauncher adds it only when VNC or a sound card uses it"),
    ok("m", Kind::Differs, "slots", "memory hotplug: libvirt 9.0 insists on DIMM slots, so the harness hands it slots=1 (libvirt::for_libvirt9); KubeVirt v1.9 (libvirt 11.10) and qlauncher use virtio-mem only, slots=0"),
    ok("chardev chrtpm", Kind::Differs, "*", "domxml-to-native starts no swtpm and prints a null chardev; a real start connects to the swtpm socket libvirt started, as qlauncher connects to the swtpm it starts"),
    ok("no-reboot", Kind::OnlyOurs, "*", "rebootPolicy: Terminate: libvirt applies on_reboot=destroy over QMP (set-action) after start; qlauncher passes -no-reboot"),
    ok("device ua-*", Kind::Differs, "port", "libvirt numbers USB ports explicitly; qlauncher lets QEMU assign them in the same device order (same ports)"),
    ok("device ua-*", Kind::Differs, "removable", "libvirt writes usb-storage's default removable=off explicitly"),
];

fn key_matches(pattern: &str, key: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => key.starts_with(prefix),
        None => pattern == key,
    }
}

/// The allowlist entry covering a row, if any.
pub fn allowed(key: &str, kind: Kind, props: &[String]) -> Option<&'static Allowed> {
    let entries: Vec<&Allowed> = ALLOWLIST
        .iter()
        .filter(|a| a.kind == kind && key_matches(a.key, key))
        .collect();
    if kind != Kind::Differs {
        return entries.first().copied();
    }
    // Every differing property needs an entry.
    let mut first = None;
    for p in props {
        let hit = entries.iter().find(|a| a.prop == "*" || a.prop == p)?;
        first.get_or_insert(*hit);
    }
    first
}

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Row {
    /// Record key.
    pub key: String,
    /// Comparison.
    pub kind: Kind,
    /// Differing properties: (name, ours, libvirt's); `-` when absent.
    pub diffs: Vec<(String, String, String)>,
    /// The allowlist entry that covers this row.
    pub allowed: Option<&'static Allowed>,
}

/// The comparison of two record lists.
#[derive(Debug, Clone)]
pub struct Report {
    /// Rows: ours in argv order, then libvirt-only ones.
    pub rows: Vec<Row>,
}

impl Report {
    /// Rows that differ without an allowlist entry.
    pub fn unexpected(&self) -> impl Iterator<Item = &Row> {
        self.rows
            .iter()
            .filter(|r| r.kind != Kind::Same && r.allowed.is_none())
    }

    /// True when every difference is allowlisted.
    pub fn ok(&self) -> bool {
        self.unexpected().next().is_none()
    }

    /// The side-by-side table.
    pub fn table(&self) -> String {
        let w = self
            .rows
            .iter()
            .map(|r| r.key.len())
            .max()
            .unwrap_or(6)
            .max(6);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<12}  {:<w$}  DETAIL (ours | libvirt)",
            "STATUS", "RECORD"
        );
        for r in &self.rows {
            let detail = r
                .diffs
                .iter()
                .map(|(p, a, b)| {
                    let p = if p.is_empty() { "(head)" } else { p.as_str() };
                    format!("{p}: {a} | {b}")
                })
                .collect::<Vec<_>>()
                .join("; ");
            let status = match (r.kind, r.allowed) {
                (Kind::Same, _) => "same".to_string(),
                (k, Some(a)) if a.intended => format!("{}*", k.label()),
                (k, Some(_)) => format!("{}~", k.label()),
                (k, None) => format!("{}!", k.label()),
            };
            let _ = writeln!(s, "{status:<12}  {:<w$}  {detail}", r.key);
        }
        let counts = |k: Kind| self.rows.iter().filter(|r| r.kind == k).count();
        let _ = writeln!(
            s,
            "{} same, {} differ, {} only-ours, {} only-libvirt; {} unexpected (* = intended, ~ = known gap, ! = unexpected)",
            counts(Kind::Same),
            counts(Kind::Differs),
            counts(Kind::OnlyOurs),
            counts(Kind::OnlyLibvirt),
            self.unexpected().count()
        );
        let mut reasons: Vec<&Allowed> = Vec::new();
        for r in &self.rows {
            if let Some(a) = r.allowed {
                if !reasons.iter().any(|x| std::ptr::eq(*x, a)) {
                    reasons.push(a);
                }
            }
        }
        for a in reasons {
            let mark = if a.intended { '*' } else { '~' };
            let prop = match a.prop {
                "*" => String::new(),
                "" => " (head)".into(),
                p => format!(" {p}"),
            };
            let _ = writeln!(
                s,
                "  {mark} {} ({}{prop}): {}",
                a.key,
                a.kind.label(),
                a.reason
            );
        }
        s
    }
}

/// Compares qlauncher's records with libvirt's.
pub fn compare(ours: &[Record], libvirt: &[Record]) -> Report {
    let theirs: BTreeMap<&str, &Record> = libvirt.iter().map(|r| (r.key.as_str(), r)).collect();
    let mut rows = Vec::new();
    for r in ours {
        match theirs.get(r.key.as_str()) {
            Some(t) => {
                let mut diffs = Vec::new();
                let keys: std::collections::BTreeSet<&String> =
                    r.props.keys().chain(t.props.keys()).collect();
                for k in keys {
                    let a = r.props.get(k);
                    let b = t.props.get(k);
                    if a != b {
                        diffs.push((
                            k.clone(),
                            a.cloned().unwrap_or_else(|| "-".into()),
                            b.cloned().unwrap_or_else(|| "-".into()),
                        ));
                    }
                }
                let kind = if diffs.is_empty() {
                    Kind::Same
                } else {
                    Kind::Differs
                };
                let props: Vec<String> = diffs.iter().map(|d| d.0.clone()).collect();
                rows.push(Row {
                    allowed: allowed(&r.key, kind, &props),
                    key: r.key.clone(),
                    kind,
                    diffs,
                });
            }
            None => rows.push(Row {
                allowed: allowed(&r.key, Kind::OnlyOurs, &[]),
                key: r.key.clone(),
                kind: Kind::OnlyOurs,
                diffs: vec![],
            }),
        }
    }
    for t in libvirt {
        if !ours.iter().any(|r| r.key == t.key) {
            rows.push(Row {
                allowed: allowed(&t.key, Kind::OnlyLibvirt, &[]),
                key: t.key.clone(),
                kind: Kind::OnlyLibvirt,
                diffs: vec![],
            });
        }
    }
    Report { rows }
}
