//! A QEMU argv as normalised records, so qlauncher's argv and libvirt's can be compared device by
//! device regardless of option order, JSON vs key=value syntax, fd numbers and node names.
//!
//! One record per option occurrence, keyed `<option> <id>`: `device ua-disk0`, `netdev nic0`,
//! `chardev charserial0`, `object iothread1`, `global kvm-pit.lost_tick_policy`, `smbios type=1`,
//! or just the option (`machine`, `cpu`, `smp`). Normalisation:
//! * JSON objects are flattened (`cache.direct`); booleans become `on`/`off` in both syntaxes;
//! * blockdev node names become `storage:<filename>@<device id>` / `format:<filename>@<device
//!   id>` (`@..` only on the nodes under a device's drive; libvirt numbers its `libvirt-N-*` nodes
//!   over the whole domain, the file and its user identify a node), in `drive`, `file`,
//!   `backing` and `pflash0/1` too;
//! * fd numbers (`fd`, `fds`, `vhostfd`, `vhostfds`) become `<fd>`;
//! * NICs become `nic<N>` in argv order with their netdev `netdev<N>` (libvirt's
//!   domxml-to-native renames NICs to `net0`/`hostnet0`); the NIC's own `id` stays a property;
//! * `-m` becomes `size` in bytes; a path under libvirt's embed root starts with `<root>`.

use std::collections::BTreeMap;

use crate::CompatError;

/// Options that take no value.
const FLAGS: &[&str] = &[
    "-S",
    "-no-user-config",
    "-nodefaults",
    "-no-shutdown",
    "-no-hpet",
    "-no-acpi",
    "-no-reboot",
    "-enable-kvm",
    "-daemonize",
];

/// One normalised option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// `device ua-disk0`, `machine`, ...
    pub key: String,
    /// Properties (the unnamed head, e.g. a machine type, is under `""`).
    pub props: BTreeMap<String, String>,
}

fn bool_norm(v: &str) -> String {
    match v {
        "on" | "true" | "yes" => "on".into(),
        "off" | "false" | "no" => "off".into(),
        other => other.into(),
    }
}

fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        serde_json::Value::String(s) => {
            out.insert(prefix.into(), bool_norm(s));
        }
        serde_json::Value::Bool(b) => {
            out.insert(prefix.into(), bool_norm(&b.to_string()));
        }
        other => {
            out.insert(prefix.into(), other.to_string());
        }
    }
}

/// Splits QEMU key=value syntax (`,,` is a literal comma); a leading item without `=` is the
/// head, stored under `""`.
pub fn parse_keyval(s: &str) -> BTreeMap<String, String> {
    let mut items = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                cur.push(',');
            } else {
                items.push(std::mem::take(&mut cur));
            }
        } else {
            cur.push(c);
        }
    }
    items.push(cur);
    let mut out = BTreeMap::new();
    for (i, item) in items.into_iter().enumerate() {
        match item.split_once('=') {
            Some((k, v)) => {
                out.insert(k.to_string(), bool_norm(v));
            }
            None if i == 0 => {
                out.insert(String::new(), item);
            }
            None => {
                out.insert(item, "on".into());
            }
        }
    }
    out
}

/// `-m` in bytes: `size=1048576k`, `1024` (MiB), `1G`.
fn memory_bytes(props: &BTreeMap<String, String>) -> Option<u64> {
    let v = props.get("size").or_else(|| props.get(""))?;
    let (num, mult) = match v.chars().last()? {
        'k' | 'K' => (&v[..v.len() - 1], 1u64 << 10),
        'M' | 'm' => (&v[..v.len() - 1], 1 << 20),
        'G' | 'g' => (&v[..v.len() - 1], 1 << 30),
        _ => (v.as_str(), 1 << 20),
    };
    num.parse::<u64>().ok().map(|n| n * mult)
}

/// One option's properties (JSON flattened, or key=value), by name.
type Props = BTreeMap<String, String>;

/// Parses an argv (without the binary and environment) into normalised records.
/// `embed_root` is libvirt's embed root directory, replaced by `<root>` in values.
///
/// Errors: an option without its value, or a JSON value that does not parse.
pub fn records(argv: &[String], embed_root: Option<&str>) -> Result<Vec<Record>, CompatError> {
    let raw = options(argv, embed_root)?;
    let node_files = node_files(&raw);
    let netdev_nic = nic_numbers(&raw);
    let mut out: Vec<Record> = Vec::new();
    for (opt, mut p) in raw {
        for k in ["drive", "file", "backing", "pflash0", "pflash1"] {
            if let Some(v) = p.get(k).and_then(|v| node_files.get(v)) {
                p.insert(k.into(), v.clone());
            }
        }
        for k in ["fd", "fds", "vhostfd", "vhostfds"] {
            if let Some(v) = p.get_mut(k) {
                *v = "<fd>".into();
            }
        }
        let mut key = record_key(&opt, &mut p, &node_files, &netdev_nic);
        let mut n = 2;
        while out.iter().any(|r| r.key == key) {
            key = format!("{} #{n}", key.split(" #").next().unwrap_or_default());
            n += 1;
        }
        out.push(Record { key, props: p });
    }
    Ok(out)
}

/// The argv as options with their properties, in order: a flag or a bare word has none; a
/// JSON value is flattened, any other parsed as key=value; `embed_root` becomes `<root>`.
fn options(argv: &[String], embed_root: Option<&str>) -> Result<Vec<(String, Props)>, CompatError> {
    let mut raw: Vec<(String, Props)> = Vec::new();
    let mut it = argv.iter();
    while let Some(opt) = it.next() {
        if FLAGS.contains(&opt.as_str()) || !opt.starts_with('-') {
            raw.push((opt.clone(), BTreeMap::new()));
            continue;
        }
        let value = it.next().ok_or_else(|| CompatError::ArgvMissingValue {
            option: opt.clone(),
        })?;
        let mut props = if value.starts_with('{') {
            let v: serde_json::Value =
                serde_json::from_str(value).map_err(|source| CompatError::ArgvJson {
                    option: opt.clone(),
                    source,
                })?;
            let mut m = BTreeMap::new();
            flatten("", &v, &mut m);
            m
        } else {
            parse_keyval(value)
        };
        if let Some(root) = embed_root {
            for v in props.values_mut() {
                if v.contains(root) {
                    *v = v.replace(root, "<root>");
                }
            }
        }
        raw.push((opt.clone(), props));
    }
    Ok(raw)
}

/// Blockdev node names -> file-based names (`storage:<file>` for a protocol node,
/// `format:<file>` for the format node over it), qualified by the device whose drive they back
/// (one image may back two devices, e.g. a cloud-init ISO as a disk and as a cdrom).
fn node_files(raw: &[(String, Props)]) -> BTreeMap<String, String> {
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for (opt, p) in raw {
        if opt == "-device" {
            if let (Some(drive), Some(id)) = (p.get("drive"), p.get("id")) {
                owner.insert(drive.clone(), id.clone());
            }
        }
    }
    for (opt, p) in raw {
        if opt == "-blockdev" && !p.contains_key("filename") {
            if let (Some(n), Some(f)) = (p.get("node-name"), p.get("file")) {
                if let Some(o) = owner.get(n).cloned() {
                    owner.insert(f.clone(), o);
                }
            }
        }
    }
    let qualify = |node: &str, name: String| match owner.get(node) {
        Some(o) => format!("{name}@{o}"),
        None => name,
    };
    let mut node_files: BTreeMap<String, String> = BTreeMap::new();
    for (opt, p) in raw {
        if opt == "-blockdev" {
            if let (Some(n), Some(f)) = (p.get("node-name"), p.get("filename")) {
                node_files.insert(n.clone(), qualify(n, format!("storage:{f}")));
            }
        }
    }
    for (opt, p) in raw {
        if opt == "-blockdev" && !p.contains_key("filename") {
            if let (Some(n), Some(f)) = (p.get("node-name"), p.get("file")) {
                let file = raw
                    .iter()
                    .find(|(o, q)| o == "-blockdev" && q.get("node-name") == Some(f))
                    .and_then(|(_, q)| q.get("filename").cloned())
                    .unwrap_or_else(|| f.clone());
                node_files.insert(n.clone(), qualify(n, format!("format:{file}")));
            }
        }
    }
    node_files
}

/// NIC numbering by netdev id, in the order the NIC devices come.
fn nic_numbers(raw: &[(String, Props)]) -> BTreeMap<String, usize> {
    let mut netdev_nic: BTreeMap<String, usize> = BTreeMap::new();
    for (opt, p) in raw {
        if opt == "-device" {
            if let Some(n) = p.get("netdev") {
                let i = netdev_nic.len();
                netdev_nic.entry(n.clone()).or_insert(i);
            }
        }
    }
    netdev_nic
}

/// The record's key for option `opt` (before any ` #n` for repeats), rewriting `p` where the
/// key takes a property's place: a blockdev by its file-based name, a NIC and its netdev by
/// their number, other objects by id, `-global` as `driver.property` with only the value,
/// `-smbios` by type, `-numa` by node, and `-m`'s size in bytes.
fn record_key(
    opt: &str,
    p: &mut Props,
    node_files: &BTreeMap<String, String>,
    netdev_nic: &BTreeMap<String, usize>,
) -> String {
    let name = opt.trim_start_matches('-').to_string();
    let id = p.get("id").cloned();
    match opt {
        "-blockdev" => {
            let node = p.remove("node-name").unwrap_or_default();
            format!(
                "blockdev {}",
                node_files.get(&node).cloned().unwrap_or(node)
            )
        }
        "-device" => match p.get("netdev").and_then(|n| netdev_nic.get(n)).copied() {
            Some(i) => {
                p.insert("netdev".into(), format!("netdev{i}"));
                format!("device nic{i}")
            }
            None => format!(
                "device {}",
                id.or_else(|| p.get("driver").cloned()).unwrap_or_default()
            ),
        },
        "-netdev" => {
            p.remove("id");
            match id.as_ref().and_then(|i| netdev_nic.get(i)) {
                Some(i) => format!("netdev nic{i}"),
                None => format!("netdev {}", id.unwrap_or_default()),
            }
        }
        "-chardev" | "-object" | "-audiodev" | "-tpmdev" => {
            format!("{name} {}", id.unwrap_or_default())
        }
        "-global" => {
            let (k, v) = match (p.get("driver"), p.get("property"), p.get("value")) {
                (Some(d), Some(pr), Some(v)) => (format!("{d}.{pr}"), v.clone()),
                _ => p
                    .iter()
                    .find(|(k, _)| !k.is_empty())
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .unwrap_or_default(),
            };
            *p = BTreeMap::from([("value".to_string(), v)]);
            format!("global {k}")
        }
        "-smbios" => format!("smbios type={}", p.get("type").cloned().unwrap_or_default()),
        "-numa" => format!("numa {}", p.get("nodeid").cloned().unwrap_or_default()),
        "-m" => {
            if let Some(b) = memory_bytes(p) {
                p.remove("");
                p.insert("size".into(), b.to_string());
            }
            name
        }
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn keyval_head_and_escaped_commas() {
        let m = parse_keyval("q35,usb=off,name=a,,b");
        assert_eq!(m.get("").map(String::as_str), Some("q35"));
        assert_eq!(m.get("usb").map(String::as_str), Some("off"));
        assert_eq!(m.get("name").map(String::as_str), Some("a,b"));
    }

    #[test]
    fn blockdevs_nics_and_fds_are_normalised() {
        let ours = s(&[
            "-blockdev",
            r#"{"driver":"file","filename":"/d.img","node-name":"libvirt-1-storage"}"#,
            "-blockdev",
            r#"{"driver":"raw","file":"libvirt-1-storage","node-name":"libvirt-1-format","read-only":false}"#,
            "-device",
            r#"{"driver":"virtio-blk-pci","drive":"libvirt-1-format","id":"ua-d"}"#,
            "-netdev",
            r#"{"type":"tap","fd":"10","id":"hostua-default"}"#,
            "-device",
            r#"{"driver":"virtio-net-pci","netdev":"hostua-default","id":"ua-default"}"#,
            "-m",
            "size=1048576k",
            "-S",
        ]);
        let libvirt = s(&[
            "-blockdev",
            r#"{"driver":"file","filename":"/d.img","node-name":"libvirt-7-storage"}"#,
            "-blockdev",
            r#"{"node-name":"libvirt-7-format","read-only":false,"driver":"raw","file":"libvirt-7-storage"}"#,
            "-device",
            r#"{"driver":"virtio-blk-pci","drive":"libvirt-7-format","id":"ua-d"}"#,
            "-netdev",
            r#"{"type":"tap","fd":"5","id":"hostnet0"}"#,
            "-device",
            r#"{"driver":"virtio-net-pci","netdev":"hostnet0","id":"net0"}"#,
            "-m",
            "1024",
            "-S",
        ]);
        let a = records(&ours, None).unwrap();
        let b = records(&libvirt, None).unwrap();
        let keys: Vec<_> = a.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "blockdev storage:/d.img@ua-d",
                "blockdev format:/d.img@ua-d",
                "device ua-d",
                "netdev nic0",
                "device nic0",
                "m",
                "S"
            ]
        );
        for i in [0, 1, 2, 3, 5, 6] {
            assert_eq!(a[i], b[i], "{}", a[i].key);
        }
        assert_eq!(a[4].props.get("id").map(String::as_str), Some("ua-default"));
        assert_eq!(b[4].props.get("id").map(String::as_str), Some("net0"));
    }
}
