//! The definition of the running domain that the source sends in `Prepare`: QEMU's argv,
//! the hot-plugged devices, the copied disks, the capabilities and the CPU, and its rewrites for a
//! target VMI of another UID, name or namespace (a decentralized migration).

use qlauncher_libvirt_xml::hooks::HookedDomain;
use serde::{Deserialize, Serialize};

use super::ProtocolError;

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
    /// What the source's hooks made of its first definition (the domain XML the first hook got
    /// and the last one's answer; `None`: no hook edited it). The target takes the source's
    /// edits from it, checked as a hook's answer is ([`HookedDomain::edits`]), and defines the
    /// domain with them, as libvirt's target defines the hooked domain XML the source
    /// migrates; its own sidecars' answers are not used (version 4).
    #[serde(default)]
    pub hooked: Option<HookedDomain>,
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::cmdline::plan::CpuProp;

    /// A definition with one hot-plugged disk and NIC, a copied disk, multifd and a host-model CPU.
    pub(in crate::sync::migration::protocol) fn domain() -> RunningDomain {
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
            hooked: None,
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
