//! Node labels from a node-labeller directory, by KubeVirt v1.9.0's rules, and libvirt's own
//! files for this host, for the labeller tests.
//!
//! [`node_labels`] reads `capabilities.xml`, `virsh_domcapabilities.xml` and
//! `supported_features.xml` as virt-handler does (`cmd/virt-handler/virt-handler.go` `Run` and
//! `getMachines`; `pkg/virt-handler/node-labeller/` `loadAll`, `loadDomCapabilities`,
//! `getDomCapabilities`, `loadHostSupportedFeatures`, `prepareLabels`), without the labels that
//! come from the machine rather than the files (`hyperv.*`, `realtime`) and without the
//! cross-arch gate. What makes virt-handler panic is a [`Fatal`]; a label the API server rejects
//! is listed in [`NodeLabels::invalid`] (the whole patch fails). The shared reference's harness
//! runs KubeVirt's Go code itself; this is the same rule set for the suite, which has no Go.
//!
//! [`libvirt_files`] writes what `node-labeller.sh` writes with this host's libvirt (Debian 12:
//! 9.0, its QEMU driver embedded, `qemu:///embed`), in a private mount namespace whose
//! `/etc/passwd` and `/etc/group` carry the `libvirt-qemu` user the driver resolves: nothing on
//! the host changes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use qlauncher::labeller::xml::{self, Element};

/// KubeVirt's default obsolete CPU models (`pkg/virt-config` `DefaultObsoleteCPUModels`).
pub const DEFAULT_OBSOLETE: &[&str] = &[
    "486",
    "pentium",
    "pentium2",
    "pentium3",
    "pentiumpro",
    "coreduo",
    "n270",
    "core2duo",
    "Conroe",
    "athlon",
    "phenom",
    "qemu64",
    "qemu32",
    "kvm64",
    "kvm32",
    "Opteron_G1",
    "Opteron_G2",
    "486-v1",
    "pentium-v1",
    "pentium2-v1",
    "pentium3-v1",
    "pentiumpro-v1",
    "coreduo-v1",
    "n270-v1",
    "core2duo-v1",
    "Conroe-v1",
    "athlon-v1",
    "phenom-v1",
    "qemu64-v1",
    "qemu32-v1",
    "kvm64-v1",
    "kvm32-v1",
    "Opteron_G1-v1",
    "Opteron_G2-v1",
];

/// Why virt-handler would not start (or would panic at its first VMI) on a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fatal(pub String);

/// One NUMA cell as virt-handler sends it to launchers (`capabilitiesToTopology`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellView {
    /// Cell id.
    pub id: u32,
    /// `(cpu id, siblings)` where siblings are parsed as KubeVirt does (comma list; a range
    /// such as `0-1` is skipped).
    pub cpus: Vec<(u32, Vec<u32>)>,
    /// `(size, unit, count)` of each `<pages>`.
    pub pages: Vec<(u64, String, u64)>,
    /// `(id, value)` of each distance sibling.
    pub distances: Vec<(u32, u64)>,
}

/// What virt-handler derives from a directory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeLabels {
    /// The labels, `key -> value`.
    pub labels: BTreeMap<String, String>,
    /// Labels the API server would reject (`key=value`).
    pub invalid: Vec<String>,
    /// The host model virt-handler keeps (`GetHostCpuModel`).
    pub host_cpu_model: String,
    /// The NUMA topology it sends to launchers.
    pub topology: Vec<CellView>,
    /// Every model with a `usable` attribute (before the obsolete filter): `name -> usable`.
    pub models: BTreeMap<String, bool>,
}

fn read(dir: &Path, name: &str) -> Result<String, Fatal> {
    std::fs::read_to_string(dir.join(name)).map_err(|e| Fatal(format!("read {name}: {e}")))
}

fn parse(text: &str, name: &str) -> Result<Element, Fatal> {
    if text.trim().is_empty() {
        return Err(Fatal(format!("{name}: EOF")));
    }
    xml::parse(text).map_err(|e| Fatal(format!("{name}: {e}")))
}

fn child<'a>(el: &'a Element, name: &str) -> Option<&'a Element> {
    el.children.iter().find(|c| c.name == name)
}

fn path<'a>(el: &'a Element, names: &[&str]) -> Option<&'a Element> {
    names.iter().try_fold(el, |e, n| child(e, n))
}

/// The labels virt-handler computes from `dir` with the KubeVirt CR's `obsoleteCPUModels` set to
/// `obsolete` (`None`: not set, KubeVirt's [`DEFAULT_OBSOLETE`] applies).
pub fn node_labels(dir: &Path, obsolete: Option<&[&str]>) -> Result<NodeLabels, Fatal> {
    let caps = parse(&read(dir, "capabilities.xml")?, "capabilities.xml")?;
    if caps.name != "capabilities" {
        return Err(Fatal(format!(
            "capabilities.xml: expected element type <capabilities> but have <{}>",
            caps.name
        )));
    }
    let cpu = path(&caps, &["host", "cpu"]).ok_or_else(|| Fatal("no <host><cpu>".into()))?;
    let supported = parse(
        &read(dir, "supported_features.xml")?,
        "supported_features.xml",
    )?;
    let domcaps = parse(
        &read(dir, "virsh_domcapabilities.xml")?,
        "virsh_domcapabilities.xml",
    )?;
    let cells = path(&caps, &["host", "topology", "cells"])
        .ok_or_else(|| Fatal("no <host><topology><cells>: panics at the first VMI".into()))?;

    let mut out = NodeLabels::default();
    let mut labels = BTreeMap::new();
    let mut t = |k: String| {
        labels.insert(k, "true".to_string());
    };
    for f in supported.children.iter().filter(|c| c.name == "feature") {
        if f.get("policy") == Some("require") {
            t(format!(
                "cpu-feature.node.kubevirt.io/{}",
                f.get("name").unwrap_or("")
            ));
        }
    }
    let mut host_model = None;
    let mut vendor = String::new();
    let mut required = Vec::new();
    if let Some(cpu_el) = child(&domcaps, "cpu") {
        for mode in cpu_el.children.iter().filter(|c| c.name == "mode") {
            let models: Vec<&Element> =
                mode.children.iter().filter(|c| c.name == "model").collect();
            if mode.get("name") == Some("host-model") {
                vendor = child(mode, "vendor")
                    .map(|v| v.text.clone())
                    .unwrap_or_default();
                let first = models.first().ok_or_else(|| {
                    Fatal("host model mode is expected to contain a model".into())
                })?;
                host_model = Some(first.text.clone());
                for f in mode.children.iter().filter(|c| c.name == "feature") {
                    if f.get("policy") == Some("require") {
                        required.push(f.get("name").unwrap_or("").to_string());
                    }
                }
            }
            for m in models {
                let usable = m.get("usable").unwrap_or("");
                if usable.is_empty() || m.text.trim().is_empty() {
                    continue;
                }
                out.models.insert(m.text.trim().to_string(), usable != "no");
            }
        }
    }
    // A CR list replaces the default one; an empty CR list behaves as none.
    let cr = obsolete.filter(|l| !l.is_empty());
    let obsolete: BTreeSet<&str> = cr.unwrap_or(DEFAULT_OBSOLETE).iter().copied().collect();
    for (m, usable) in &out.models {
        if obsolete.contains(m.as_str()) {
            continue;
        }
        if *usable {
            t(format!("cpu-model.node.kubevirt.io/{m}"));
        }
        t(format!("cpu-model-migration.node.kubevirt.io/{m}"));
    }
    for guest in caps.children.iter().filter(|c| c.name == "guest") {
        if let Some(arch) = child(guest, "arch") {
            for m in arch.children.iter().filter(|c| c.name == "machine") {
                t(format!("machine-type.node.kubevirt.io/{}", m.text));
            }
        }
    }
    let hm = host_model.unwrap_or_default();
    // Only a CR-configured list marks the host model obsolete (`prepareLabels` reads the raw
    // CR map), never the default one.
    if cr.is_some_and(|l| l.contains(&hm.as_str())) {
        t("node-labeller.kubevirt.io/obsolete-host-model".into());
    }
    for f in &required {
        t(format!("host-model-required-features.node.kubevirt.io/{f}"));
    }
    t(format!("cpu-vendor.node.kubevirt.io/{vendor}"));
    t(format!("host-model-cpu.node.kubevirt.io/{hm}"));
    if let Some(features) = child(&domcaps, "features") {
        let sev = child(features, "sev");
        let sev_yes = sev.is_some_and(|s| s.get("supported") == Some("yes"));
        let es_guests = sev
            .and_then(|s| child(s, "maxESGuests"))
            .and_then(|g| g.text.parse::<u64>().ok())
            .unwrap_or(0);
        let ls = child(features, "launchSecurity");
        let snp = ls.is_some_and(|l| {
            l.get("supported") == Some("yes")
                && l.children
                    .iter()
                    .flat_map(|e| e.children.iter())
                    .any(|v| v.text == "sev-snp")
        });
        if sev_yes {
            t("kubevirt.io/sev".into());
        }
        if sev_yes && es_guests > 0 {
            t("kubevirt.io/sev-es".into());
            if snp {
                t("kubevirt.io/sev-snp".into());
            }
        }
        if child(features, "tdx").is_some_and(|x| x.get("supported") == Some("yes")) {
            t("kubevirt.io/tdx".into());
        }
    }
    if let Some(counter) = child(cpu, "counter") {
        if counter.get("name") == Some("tsc") {
            let freq: u64 = counter
                .get("frequency")
                .unwrap_or("0")
                .parse()
                .map_err(|_| Fatal("capabilities.xml: counter frequency is not a uint".into()))?;
            labels.insert(
                "cpu-timer.node.kubevirt.io/tsc-frequency".into(),
                freq.to_string(),
            );
            labels.insert(
                "cpu-timer.node.kubevirt.io/tsc-scalable".into(),
                (counter.get("scaling") == Some("yes")).to_string(),
            );
        }
    }
    for cell in cells.children.iter().filter(|c| c.name == "cell") {
        out.topology.push(cell_view(cell)?);
    }
    out.host_cpu_model = hm;
    for (k, v) in &labels {
        if !valid_key(k) || !valid_value(v) {
            out.invalid.push(format!("{k}={v}"));
        }
    }
    out.labels = labels;
    Ok(out)
}

fn cell_view(cell: &Element) -> Result<CellView, Fatal> {
    let num = |v: Option<&str>, what: &str| -> Result<u64, Fatal> {
        v.unwrap_or("0").trim().parse().map_err(|_| {
            Fatal(format!(
                "capabilities.xml: cell {what} {v:?} is not a number"
            ))
        })
    };
    let id = u32::try_from(num(cell.get("id"), "id")?).map_err(|_| Fatal("cell id".into()))?;
    let mut view = CellView {
        id,
        cpus: Vec::new(),
        pages: Vec::new(),
        distances: Vec::new(),
    };
    for p in cell.children.iter().filter(|c| c.name == "pages") {
        view.pages.push((
            num(p.get("size"), "page size")?,
            p.get("unit").unwrap_or("").to_string(),
            num(Some(&p.text), "page count")?,
        ));
    }
    if let Some(d) = child(cell, "distances") {
        for s in d.children.iter().filter(|c| c.name == "sibling") {
            view.distances.push((
                u32::try_from(num(s.get("id"), "sibling id")?).unwrap_or(0),
                num(s.get("value"), "distance")?,
            ));
        }
    }
    if let Some(cpus) = child(cell, "cpus") {
        for c in cpus.children.iter().filter(|c| c.name == "cpu") {
            let siblings = c
                .get("siblings")
                .unwrap_or("")
                .split(',')
                .filter_map(|s| s.parse::<u32>().ok())
                .collect();
            view.cpus.push((
                u32::try_from(num(c.get("id"), "cpu id")?).unwrap_or(0),
                siblings,
            ));
        }
    }
    Ok(view)
}

/// apimachinery's `IsQualifiedName` for `prefix/name` keys (prefix a DNS subdomain).
pub fn valid_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    prefix_ok && qlauncher::labeller::is_label_name(name)
}

/// apimachinery's `IsValidLabelValue`: empty, or a label name part.
pub fn valid_value(v: &str) -> bool {
    v.is_empty() || qlauncher::labeller::is_label_name(v)
}

/// Writes libvirt's node-labeller files for `virttype` (`kvm` or `qemu`) into `out`, as
/// `node-labeller.sh` makes them with this host's libvirt, and an empty cross-arch file. `scratch`
/// holds the embedded driver's root. Panics when virsh fails (with its stderr).
pub fn libvirt_files(out: &Path, scratch: &Path, virttype: &str) {
    let root = scratch.join("libvirt-embed");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(
        root.join("etc/qemu.conf"),
        "user = \"root\"\ngroup = \"root\"\n",
    )
    .unwrap();
    let add = |db: &str, entry: &str| {
        let text = std::fs::read_to_string(db).unwrap();
        if text.lines().any(|l| l.starts_with("libvirt-qemu:")) {
            text
        } else {
            format!("{}\n{entry}\n", text.trim_end())
        }
    };
    let passwd = scratch.join("passwd");
    let group = scratch.join("group");
    std::fs::write(
        &passwd,
        add(
            "/etc/passwd",
            "libvirt-qemu:x:65534:65534:libvirt-qemu:/nonexistent:/usr/sbin/nologin",
        ),
    )
    .unwrap();
    std::fs::write(&group, add("/etc/group", "libvirt-qemu:x:65534:")).unwrap();
    std::fs::create_dir_all(out).unwrap();
    let script = r#"set -e
mount --bind "$PASSWD" /etc/passwd
mount --bind "$GROUP" /etc/group
V="virsh -q -c qemu:///embed?root=$ROOT"
$V domcapabilities --machine q35 --arch x86_64 --virttype "$VT" > "$OUT/virsh_domcapabilities.xml"
$V hypervisor-cpu-baseline --features "$OUT/virsh_domcapabilities.xml" --machine q35 --arch x86_64 --virttype "$VT" > "$OUT/supported_features.xml"
$V capabilities > "$OUT/capabilities.xml"
: > "$OUT/virsh_domcapabilities_aarch64.xml"
"#;
    let r = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script])
        .env("PASSWD", &passwd)
        .env("GROUP", &group)
        .env("ROOT", &root)
        .env("OUT", out)
        .env("VT", virttype)
        .output()
        .expect("unshare (util-linux)");
    assert!(
        r.status.success(),
        "libvirt's files for {virttype}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
}

/// The machine types the node labeller labels for `qemu` (the names after
/// `machine-type.node.kubevirt.io/`), from `qlauncher node-labeller --virttype qemu` run on it
/// into a scratch directory. Panics when the labeller fails or virt-handler would reject its files.
pub fn labelled_machines(qemu: &Path) -> BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(crate::qlauncher_bin())
        .args(["node-labeller", "--virttype", "qemu", "--qemu"])
        .arg(qemu)
        .arg("--out")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "qlauncher node-labeller: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let labels = node_labels(dir.path(), None).unwrap_or_else(|f| panic!("{}", f.0));
    assert!(labels.invalid.is_empty(), "{:?}", labels.invalid);
    labels
        .labels
        .keys()
        .filter_map(|k| k.strip_prefix("machine-type.node.kubevirt.io/"))
        .map(str::to_owned)
        .collect()
}
