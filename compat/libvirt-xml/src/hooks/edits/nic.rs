//! Tier 2, interfaces: what an answer may change on an `<interface>` with an alias (`<model
//! type>`, `<mtu size>`, `<driver rx_queue_size tx_queue_size>`, `<rom enabled bar file>`), as
//! typed [`NicEdit`]s on the NIC's `-device`, the way libvirt renders them
//! (`qemu_command.c` `qemuBuildNicDevProps`, `qemuBuildRomProps`; checks of
//! `qemu_validate.c` `qemuValidateDomainDeviceDefNetwork`).

use super::*;
use qlauncher_core::cmdline::plan::DeviceClass;
use qlauncher_core::cmdline::qemu::Device;

/// One change of one NIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NicEdit {
    /// `<model type>`: an emulated model for a virtio NIC (`e1000`, `e1000e`, `rtl8139`, the
    /// QEMU driver of the same name). Only a single-queue NIC, and the answer must drop the
    /// `<mtu>` (libvirt: MTU only on virtio-net).
    Model(&'static str),
    /// `<mtu size>`: virtio-net's `host_mtu` (68 to 65535); `None` removes it.
    Mtu(Option<u32>),
    /// `<driver rx_queue_size tx_queue_size>`: virtio-net's queue sizes, each a power of two
    /// from 256 to 1024 (QEMU's `virtio_net_device_realize` rule); `None` is QEMU's default.
    QueueSizes {
        /// `rx_queue_size`.
        rx: Option<u16>,
        /// `tx_queue_size`: 256 only, since QEMU uses more only with vhost-user and quietly
        /// sets a tap NIC's to 256 (`virtio_net_max_tx_queue_size`); more is refused.
        tx: Option<u16>,
    },
    /// `<rom>`: `enabled="no"` is `romfile=""`; otherwise the ROM image (`file`, an absolute
    /// path under the pod's directories or QEMU's firmware directories, [`ROM_DIRS`]) and whether
    /// its BAR is visible (`bar`, QEMU's `rombar`).
    Rom {
        /// `enabled` (absent: yes).
        enabled: bool,
        /// `bar`: on or off.
        bar: Option<bool>,
        /// `file`.
        file: Option<String>,
    },
}

impl std::fmt::Display for NicEdit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NicEdit::Model(m) => write!(f, "model {m}"),
            NicEdit::Mtu(Some(m)) => write!(f, "mtu {m}"),
            NicEdit::Mtu(None) => write!(f, "mtu removed"),
            NicEdit::QueueSizes { rx, tx } => {
                let n = |v: &Option<u16>| v.map_or("-".to_string(), |v| v.to_string());
                write!(f, "driver rx_queue_size={} tx_queue_size={}", n(rx), n(tx))
            }
            NicEdit::Rom { enabled, bar, file } => write!(
                f,
                "rom enabled={} bar={} file={}",
                if *enabled { "yes" } else { "no" },
                bar.map_or("-", |b| if b { "on" } else { "off" }),
                file.as_deref().unwrap_or("-")
            ),
        }
    }
}

/// Where a hook's ROM file may be: the pod's directories QEMU can read (a hook sidecar's
/// shared directory, the launcher's private and ephemeral-disk directories) and QEMU's own
/// firmware directories in the image.
pub const ROM_DIRS: [&str; 6] = [
    "/var/run/kubevirt-hooks/",
    "/var/run/kubevirt-private/",
    "/var/run/kubevirt-ephemeral-disks/",
    "/usr/share/qemu/",
    "/usr/share/ipxe/",
    "/usr/lib/ipxe/",
];

/// The emulated models a virtio NIC may become, libvirt's name and QEMU's driver (the plan's
/// models KubeVirt allows that QEMU 7.2 has).
const MODELS: [(&str, &str); 3] = [
    ("e1000", "e1000"),
    ("e1000e", "e1000e"),
    ("rtl8139", "rtl8139"),
];

/// The tier-2 view of one `<interface>`, taken out of the tree.
#[derive(Debug, Default, PartialEq)]
pub(in crate::hooks) struct NicView {
    model: Option<String>,
    mtu: Option<String>,
    rx: Option<String>,
    tx: Option<String>,
    /// `<rom>`'s attributes; `None`: no `<rom>`.
    rom: Option<BTreeMap<String, String>>,
    /// `<driver queues>` (kept in the tree too: the general diff refuses a change).
    queues: Option<String>,
}

/// Takes the tier-2 interface elements out of every `<interface>` with an alias, by alias.
pub(in crate::hooks) fn take_nics(d: &mut Node) -> BTreeMap<String, NicView> {
    let mut out = BTreeMap::new();
    for devices in d.children.iter_mut().filter(|c| c.name == "devices") {
        for nic in devices
            .children
            .iter_mut()
            .filter(|c| c.name == "interface")
        {
            let Some(alias) = nic
                .children
                .iter()
                .find(|c| c.name == "alias")
                .and_then(|a| a.attrs.get("name").cloned())
            else {
                continue;
            };
            let mut v = NicView::default();
            let only = |c: &Node, keys: &[&str]| {
                c.children.is_empty()
                    && c.text.is_empty()
                    && c.attrs.keys().all(|k| keys.contains(&k.as_str()))
            };
            nic.children.retain_mut(|c| match c.name.as_str() {
                "model" if only(c, &["type"]) => {
                    v.model = c.attrs.get("type").cloned();
                    false
                }
                "mtu" if only(c, &["size"]) => {
                    v.mtu = c.attrs.get("size").cloned();
                    false
                }
                "rom" if only(c, &["enabled", "bar", "file"]) => {
                    let mut attrs: BTreeMap<String, String> = c
                        .attrs
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    // `enabled="yes"` is the default.
                    if attrs.get("enabled").map(String::as_str) == Some("yes") {
                        attrs.remove("enabled");
                    }
                    v.rom = Some(attrs);
                    false
                }
                "driver" => {
                    v.rx = c.attrs.remove("rx_queue_size");
                    v.tx = c.attrs.remove("tx_queue_size");
                    v.queues = c.attrs.get("queues").cloned();
                    // An empty `<driver>` left is none.
                    !(c.attrs.is_empty() && c.children.is_empty())
                }
                _ => true,
            });
            out.insert(alias, v);
        }
    }
    out
}

/// A refusal of the interface `alias`'s `what` ([`device_refusal`]).
fn refuse(
    alias: &str,
    what: &str,
    sent: Option<&str>,
    answered: Option<&str>,
    why: &str,
) -> Refusal {
    device_refusal("interface", alias, what, sent, answered, why)
}

/// The edits between the interfaces `sent` and `answered`.
pub(in crate::hooks) fn diff_nics(
    sent: &BTreeMap<String, NicView>,
    answered: &BTreeMap<String, NicView>,
) -> Result<Vec<HookEdit>, Refusal> {
    keyed_diff(sent, answered, Keys::Both, |alias, a, b| {
        let (Some(a), Some(b)) = (a, b) else {
            return Ok(vec![]);
        };
        Ok(diff_nic(alias, a, b)?
            .into_iter()
            .map(|edit| HookEdit::Nic {
                alias: alias.clone(),
                edit,
            })
            .collect())
    })
}

/// Whether a libvirt model is one of virtio's.
fn is_virtio(model: Option<&str>) -> bool {
    model.is_some_and(|m| m.starts_with("virtio"))
}

fn diff_nic(alias: &str, a: &NicView, b: &NicView) -> Result<Vec<NicEdit>, Refusal> {
    let mut edits = Vec::new();
    let virtio = is_virtio(b.model.as_deref());
    if a.model != b.model {
        let bad = |why: &str| {
            refuse(
                alias,
                "model@type",
                a.model.as_deref(),
                b.model.as_deref(),
                why,
            )
        };
        if !is_virtio(a.model.as_deref()) {
            return Err(bad("only a virtio NIC's model can change"));
        }
        let Some((_, driver)) = MODELS.iter().find(|(m, _)| Some(*m) == b.model.as_deref()) else {
            return Err(bad(
                "not a model qlauncher runs for a virtio NIC (e1000, e1000e, rtl8139)",
            ));
        };
        if a.queues.as_deref().is_some_and(|q| q != "1") {
            return Err(bad("a multiqueue NIC must stay virtio"));
        }
        if b.mtu.is_some() {
            return Err(refuse(
                alias,
                "mtu@size",
                a.mtu.as_deref(),
                b.mtu.as_deref(),
                "libvirt sets an MTU on virtio-net only: remove it with the model change",
            ));
        }
        edits.push(NicEdit::Model(driver));
    }
    if a.mtu != b.mtu {
        let mtu = match &b.mtu {
            None => None,
            Some(m) => {
                let bad = |why: &str| refuse(alias, "mtu@size", a.mtu.as_deref(), Some(m), why);
                if !virtio {
                    return Err(bad("an MTU is a virtio-net setting"));
                }
                let n = m
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (68..=65535).contains(n))
                    .ok_or_else(|| bad("not an MTU from 68 to 65535"))?;
                Some(n)
            }
        };
        edits.push(NicEdit::Mtu(mtu));
    }
    if a.rx != b.rx || a.tx != b.tx {
        let size = |k: &str,
                    s: &Option<String>,
                    v: &Option<String>|
         -> Result<Option<u16>, Refusal> {
            let Some(text) = v else { return Ok(None) };
            let bad =
                |why: &str| refuse(alias, &format!("driver@{k}"), s.as_deref(), Some(text), why);
            if !virtio {
                return Err(bad("queue sizes are a virtio-net setting"));
            }
            text.parse::<u16>()
                .ok()
                .filter(|n| n.is_power_of_two() && (256..=1024).contains(n))
                .map(Some)
                .ok_or_else(|| bad("not a power of two from 256 to 1024 (QEMU's virtio-net rule)"))
        };
        let tx = size("tx_queue_size", &a.tx, &b.tx)?;
        if tx.is_some_and(|t| t > 256) {
            return Err(refuse(
                alias,
                "driver@tx_queue_size",
                a.tx.as_deref(),
                b.tx.as_deref(),
                "QEMU uses a transmit queue above 256 only with vhost-user (it sets a tap \
                 NIC's to 256): qlauncher's NICs are taps",
            ));
        }
        edits.push(NicEdit::QueueSizes {
            rx: size("rx_queue_size", &a.rx, &b.rx)?,
            tx,
        });
    }
    if a.rom != b.rom {
        let empty = BTreeMap::new();
        let (ra, rb) = (
            a.rom.as_ref().unwrap_or(&empty),
            b.rom.as_ref().unwrap_or(&empty),
        );
        let attr = |k: &str| rb.get(k).map(String::as_str);
        let bad = |k: &str, why: &str| {
            refuse(
                alias,
                &format!("rom@{k}"),
                ra.get(k).map(String::as_str),
                attr(k),
                why,
            )
        };
        let enabled = match attr("enabled") {
            None => true,
            Some("no") => false,
            Some(_) => return Err(bad("enabled", "not yes or no")),
        };
        let bar = match attr("bar") {
            None => None,
            Some("on") => Some(true),
            Some("off") => Some(false),
            Some(_) => return Err(bad("bar", "not on or off")),
        };
        let file = attr("file").map(str::to_string);
        if !enabled && (bar.is_some() || file.is_some()) {
            return Err(bad("enabled", "a disabled ROM takes no bar or file"));
        }
        if let Some(f) = &file {
            check_rom_file(f).map_err(|why| bad("file", &why))?;
        }
        edits.push(NicEdit::Rom { enabled, bar, file });
    }
    Ok(edits)
}

/// A ROM file QEMU may read for a hook: an absolute path (libvirt's schema takes no other)
/// without `.`/`..` components under one of [`ROM_DIRS`].
fn check_rom_file(f: &str) -> Result<(), String> {
    if f.len() > 4096 || f.chars().any(char::is_control) || !f.starts_with('/') {
        return Err("not an absolute file path".into());
    }
    let plain = |s: &str| !s.is_empty() && s != "." && s != "..";
    let inside = ROM_DIRS.iter().any(|d| {
        f.strip_prefix(d)
            .is_some_and(|rest| rest.split('/').all(plain))
    });
    if !inside {
        return Err(format!(
            "outside the pod's directories QEMU may read ({})",
            ROM_DIRS.join(", ")
        ));
    }
    Ok(())
}

/// Applies `edit` to the NIC with QEMU id `alias`.
pub(in crate::hooks) fn apply_nic(plan: &mut DomainPlan, alias: &str, edit: &NicEdit) {
    for d in plan
        .devices
        .iter_mut()
        .filter(|d| d.class == DeviceClass::Nic && d.device.id() == alias)
    {
        let Device::Nic(n) = &mut d.device else {
            continue;
        };
        match edit {
            NicEdit::Model(driver) => {
                n.driver = driver;
                n.host_mtu = None;
                n.mq = None;
                n.vectors = None;
                n.rx_queue_size = None;
                n.tx_queue_size = None;
                // KubeVirt hot-plugs virtio NICs only.
                d.hotpluggable = false;
            }
            NicEdit::Mtu(m) => n.host_mtu = *m,
            NicEdit::QueueSizes { rx, tx } => {
                n.rx_queue_size = *rx;
                n.tx_queue_size = *tx;
            }
            NicEdit::Rom { enabled, bar, file } => {
                if *enabled {
                    n.romfile = file.clone();
                    n.rombar = bar.map(u32::from);
                } else {
                    n.romfile = Some(String::new());
                    n.rombar = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::*;

    const SENT: &str = "<domain type=\"kvm\"><name>ns_vm</name><devices>\
        <interface type=\"ethernet\"><source></source><target dev=\"tap0\" managed=\"no\"></target>\
        <model type=\"virtio-non-transitional\"></model><mac address=\"02:00:00:00:00:01\"></mac>\
        <mtu size=\"1450\"></mtu><alias name=\"ua-default\"></alias><rom enabled=\"no\"></rom></interface>\
        <interface type=\"ethernet\"><source></source><target dev=\"tap1\" managed=\"no\"></target>\
        <model type=\"virtio-non-transitional\"></model><mtu size=\"1450\"></mtu>\
        <alias name=\"ua-mq\"></alias><driver name=\"vhost\" queues=\"2\"></driver></interface>\
        </devices></domain>";

    fn edit(alias: &str, edit: NicEdit) -> HookEdit {
        HookEdit::Nic {
            alias: alias.into(),
            edit,
        }
    }

    #[test]
    fn interface_changes_are_typed_edits() {
        let answer = SENT
            .replacen("<mtu size=\"1450\">", "<mtu size=\"9000\">", 1)
            .replace(
                "<rom enabled=\"no\"></rom>",
                "<rom bar=\"off\" file=\"/var/run/kubevirt-hooks/hook-sidecar-0/pxe.rom\"/>\
                 <driver rx_queue_size=\"1024\" tx_queue_size=\"256\"/>",
            );
        assert_eq!(
            diff_answer(SENT, &answer).unwrap(),
            vec![
                edit("ua-default", NicEdit::Mtu(Some(9000))),
                edit(
                    "ua-default",
                    NicEdit::QueueSizes {
                        rx: Some(1024),
                        tx: Some(256)
                    }
                ),
                edit(
                    "ua-default",
                    NicEdit::Rom {
                        enabled: true,
                        bar: Some(false),
                        file: Some("/var/run/kubevirt-hooks/hook-sidecar-0/pxe.rom".into())
                    }
                ),
            ]
        );
        let e1000 = SENT.replacen(
            "<model type=\"virtio-non-transitional\"></model><mac address=\"02:00:00:00:00:01\"></mac>\
             <mtu size=\"1450\"></mtu>",
            "<model type=\"e1000\"/><mac address=\"02:00:00:00:00:01\"/>",
            1,
        );
        assert_eq!(
            hook_diff(SENT, &e1000).unwrap(),
            "interface ua-default model e1000\ninterface ua-default mtu removed\n"
        );
        // The queue sizes of a multiqueue NIC keep its `<driver name queues>`.
        let mq = SENT.replace("queues=\"2\">", "queues=\"2\" rx_queue_size=\"512\">");
        assert_eq!(
            diff_answer(SENT, &mq).unwrap(),
            vec![edit(
                "ua-mq",
                NicEdit::QueueSizes {
                    rx: Some(512),
                    tx: None
                }
            )]
        );
    }

    #[test]
    fn bad_interface_values_are_refused_with_the_path() {
        let at = |a: &str, k: &str| format!("domain/devices/interface[{a}]/{k}");
        let cases = [
            (
                SENT.replacen("size=\"1450\"", "size=\"67\"", 1),
                at("ua-default", "mtu@size"),
            ),
            (
                SENT.replacen("size=\"1450\"", "size=\"65536\"", 1),
                at("ua-default", "mtu@size"),
            ),
            (
                SENT.replacen("virtio-non-transitional", "e1000", 1),
                at("ua-default", "mtu@size"),
            ),
            (
                SENT.replacen("virtio-non-transitional", "ne2k_pci", 1),
                at("ua-default", "model@type"),
            ),
            (
                SENT.replace(
                    "<model type=\"virtio-non-transitional\"></model><mtu size=\"1450\"></mtu>",
                    "<model type=\"e1000\"></model>",
                ),
                at("ua-mq", "model@type"),
            ),
            (
                SENT.replace("queues=\"2\">", "queues=\"2\" rx_queue_size=\"300\">"),
                at("ua-mq", "driver@rx_queue_size"),
            ),
            (
                SENT.replace("queues=\"2\">", "queues=\"2\" tx_queue_size=\"2048\">"),
                at("ua-mq", "driver@tx_queue_size"),
            ),
            (
                SENT.replace("queues=\"2\">", "queues=\"2\" tx_queue_size=\"512\">"),
                at("ua-mq", "driver@tx_queue_size"),
            ),
            (
                SENT.replace("<rom enabled=\"no\">", "<rom file=\"/etc/shadow\">"),
                at("ua-default", "rom@file"),
            ),
            (
                SENT.replace(
                    "<rom enabled=\"no\">",
                    "<rom file=\"/var/run/kubevirt-hooks/../../etc/x\">",
                ),
                at("ua-default", "rom@file"),
            ),
            (
                SENT.replace("<rom enabled=\"no\">", "<rom enabled=\"no\" bar=\"on\">"),
                at("ua-default", "rom@enabled"),
            ),
            (
                SENT.replace("<rom enabled=\"no\">", "<rom bar=\"maybe\">"),
                at("ua-default", "rom@bar"),
            ),
        ];
        for (answer, path) in cases {
            let r = diff_answer(SENT, &answer).unwrap_err();
            assert_eq!(r.path, path, "{answer}: {r}");
        }
        // Queue count changes need taps qlauncher did not open: the general diff refuses them.
        let q = SENT.replace("queues=\"2\"", "queues=\"4\"");
        assert!(diff_answer(SENT, &q)
            .unwrap_err()
            .path
            .contains("driver@queues"));
        // libvirt's schema takes only an absolute ROM path; QEMU's own ROMs are in its
        // firmware directories.
        let own = SENT.replace("<rom enabled=\"no\">", "<rom file=\"efi-e1000.rom\">");
        assert_eq!(
            diff_answer(SENT, &own).unwrap_err().path,
            at("ua-default", "rom@file")
        );
        let own = SENT.replace(
            "<rom enabled=\"no\">",
            "<rom file=\"/usr/lib/ipxe/qemu/efi-e1000.rom\">",
        );
        assert!(diff_answer(SENT, &own).is_ok());
    }
}
