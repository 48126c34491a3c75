//! `NAME.facts.json`: pod facts written down beside a VMI manifest, and the [`ConverterContext`]
//! they stand for. The one reader of the format, shared by the converter's fixtures
//! (`tests/fixtures/cmdline/*.facts.json`), `qlauncher-compat convert` (compat/libvirt-xml),
//! `qlauncher convert` (placeholder facts only) and the convert benchmark.
//!
//! The format (every key optional; an unknown key is an error):
//!
//! ```json
//! {
//!   "qemu": "7.2",               // render for this QEMU version (default 10.1)
//!   "tcg": true,                 // KVM unusable, emulation allowed (--allow-emulation)
//!   "no_kvm": true,              // KVM unusable, emulation not allowed
//!   "now_unix": 1700000000,      // Unix time at start, seconds (clock.utc.offsetSeconds)
//!   "vsock_fd": 5,               // vhost-vsock fd (status.VSOCKCID set)
//!   "volumes": {"<volume>": {"block": true, "qcow2": true, "direct_io": true, "preallocated": true}},
//!   "interfaces": {"<interface>": {"mac": "02:..", "mtu": 9000, "queues": 4, "vhost": true}},
//!   "host_pci": {"ua-gpu-<name>": "0000:65:00.0"},     // PCI function per host device id
//!   "host_mdev": {"ua-gpu-<name>": "<mdev uuid>"},     // mediated device per host device id
//!   "sev": {"cbitpos": 51, "reduced_phys_bits": 1, "snp": false},
//!   "tdx": true,
//!   "virtiofs_ready": ["<filesystem>"],                // virtiofsd sockets that exist
//!   "no_acceptance": "why QEMU here cannot start it",  // test-only
//!   "rejected": true                                   // test-only: conversion must fail
//! }
//! ```
//!
//! Pure: the caller reads the file; [`FactsFile::from_json`] parses text.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

use super::context::{
    ConverterContext, HostDeviceSource, IfaceFacts, ImageFormat, MonitorSocket, QemuVersion,
    SevCapabilities, StorageKind, TapSource, VolumeFacts,
};
use crate::vmi::{Interface, Vmi};

/// One volume's entry in a facts file (`volumes.<name>`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VolumeEntry {
    /// A block device (else a regular file).
    pub block: bool,
    /// The base image is qcow2 (else raw).
    pub qcow2: bool,
    /// O_DIRECT works on the backend.
    pub direct_io: bool,
    /// The image is preallocated.
    pub preallocated: bool,
}

/// One interface's entry in a facts file (`interfaces.<name>`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InterfaceEntry {
    /// MAC chosen by the network setup (none: the VMI's, or QEMU's choice).
    pub mac: Option<String>,
    /// Pod link MTU (default 1500).
    pub mtu: Option<u32>,
    /// Tap queues (default 1; see [`FactsFile::tap_queues`]).
    pub queues: Option<usize>,
    /// vhost-net fds are passed, one per queue.
    pub vhost: bool,
}

/// The host's SEV parameters in a facts file (`sev`), as QMP `query-sev-capabilities` reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SevEntry {
    /// C-bit position.
    pub cbitpos: u32,
    /// Physical address bits lost to encryption.
    pub reduced_phys_bits: u32,
    /// The host also runs SEV-SNP guests.
    pub snp: bool,
}

/// A parsed `NAME.facts.json` (format in the [module docs](self)).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FactsFile {
    /// Render for this QEMU version (`"X.Y"`; none: 10.1, KubeVirt v1.9.0's).
    #[serde(deserialize_with = "qemu_version")]
    pub qemu: Option<QemuVersion>,
    /// KVM unusable and emulation allowed.
    pub tcg: bool,
    /// KVM unusable and emulation not allowed.
    pub no_kvm: bool,
    /// Facts per volume name.
    pub volumes: BTreeMap<String, VolumeEntry>,
    /// Facts per interface name.
    pub interfaces: BTreeMap<String, InterfaceEntry>,
    /// vhost-vsock fd.
    pub vsock_fd: Option<i32>,
    /// Unix time at start, seconds.
    pub now_unix: i64,
    /// Host PCI function (`DDDD:BB:SS.F`) per host device id (`ua-gpu-<name>`, ...).
    pub host_pci: BTreeMap<String, String>,
    /// Mediated device UUID per host device id.
    pub host_mdev: BTreeMap<String, String>,
    /// The host offers SEV with these parameters.
    pub sev: Option<SevEntry>,
    /// The host offers TDX.
    pub tdx: bool,
    /// virtiofs filesystems whose virtiofsd socket exists.
    pub virtiofs_ready: Vec<String>,
    /// Test-only: why QEMU on the test host cannot start this VMI (missing hardware), if so.
    pub no_acceptance: Option<String>,
    /// Test-only: the conversion is expected to fail.
    pub rejected: bool,
}

fn qemu_version<'de, D: Deserializer<'de>>(d: D) -> Result<Option<QemuVersion>, D::Error> {
    let Some(s) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    QemuVersion::parse(&s)
        .map(Some)
        .ok_or_else(|| serde::de::Error::custom(format!("bad QEMU version {s:?} (want X.Y)")))
}

/// Where the placeholder launch resources of [`FactsFile::context_with`] go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FdLayout {
    /// The QMP monitor.
    pub monitor: MonitorSocket,
    /// The first tap fd; each interface takes one per queue, in VMI order.
    pub first_tap_fd: i32,
    /// The first vhost-net fd, for interfaces whose entry says `vhost`.
    pub first_vhost_fd: i32,
}

impl Default for FdLayout {
    /// The launch path's: QMP on inherited fd 3, taps on fds 10, 11, ..., vhost fds 40, 41, ...
    fn default() -> Self {
        FdLayout {
            monitor: MonitorSocket::Fd(3),
            first_tap_fd: 10,
            first_vhost_fd: 40,
        }
    }
}

impl FactsFile {
    /// Parses a facts file's text.
    ///
    /// Errors: not JSON, an unknown key, a wrong type, a bad `qemu` version (serde_json's
    /// message, with line and column).
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The context `vmi` is converted with under these facts, with the launch path's fds
    /// ([`FdLayout::default`]).
    pub fn context(&self, vmi: &Vmi) -> ConverterContext {
        self.context_with(vmi, &FdLayout::default())
    }

    /// The context `vmi` is converted with under these facts: every other fact is
    /// [`ConverterContext::default`]'s; each interface of the VMI gets
    /// [`tap_queues`](Self::tap_queues) tap fds from `layout` (and as many vhost fds if its
    /// entry says `vhost`), its entry's MAC and its MTU (default 1500).
    pub fn context_with(&self, vmi: &Vmi, layout: &FdLayout) -> ConverterContext {
        let mut ctx = ConverterContext {
            monitor: layout.monitor.clone(),
            now_unix: self.now_unix,
            vsock_fd: self.vsock_fd,
            volumes: self.volume_facts(),
            ..Default::default()
        };
        if let Some(v) = self.qemu {
            ctx.qemu = v;
        }
        if self.tcg {
            ctx.kvm = false;
            ctx.allow_emulation = true;
        }
        if self.no_kvm {
            ctx.kvm = false;
        }
        for (id, a) in &self.host_pci {
            ctx.host_devices
                .insert(id.clone(), HostDeviceSource::Pci(a.clone()));
        }
        for (id, u) in &self.host_mdev {
            ctx.host_devices
                .insert(id.clone(), HostDeviceSource::Mdev(u.clone()));
        }
        ctx.sev = self.sev.map(|s| SevCapabilities {
            cbitpos: s.cbitpos,
            reduced_phys_bits: s.reduced_phys_bits,
            snp: s.snp,
        });
        ctx.tdx = self.tdx;
        ctx.virtiofs_ready = self.virtiofs_ready.iter().cloned().collect();
        let (mut fd, mut vfd) = (layout.first_tap_fd, layout.first_vhost_fd);
        for iface in interfaces(vmi) {
            let entry = self.interface(&iface.name);
            let n = self.tap_queues(vmi, iface) as i32;
            let fds: Vec<i32> = (fd..fd + n).collect();
            fd += n;
            let vhostfds: Vec<i32> = if entry.vhost {
                let v = (vfd..vfd + n).collect();
                vfd += n;
                v
            } else {
                vec![]
            };
            ctx.interfaces.insert(
                iface.name.clone(),
                IfaceFacts {
                    mac: entry.mac,
                    mtu: entry.mtu.or(Some(1500)),
                    tap: TapSource::Fds { fds, vhostfds },
                },
            );
        }
        ctx
    }

    /// The converter's [`VolumeFacts`] per volume name (size unknown).
    pub fn volume_facts(&self) -> BTreeMap<String, VolumeFacts> {
        self.volumes
            .iter()
            .map(|(name, f)| {
                let facts = VolumeFacts {
                    kind: if f.block {
                        StorageKind::Block
                    } else {
                        StorageKind::File
                    },
                    format: if f.qcow2 {
                        ImageFormat::Qcow2
                    } else {
                        ImageFormat::Raw
                    },
                    virtual_size: None,
                    direct_io: f.direct_io,
                    preallocated: f.preallocated,
                    cbt_overlay: false,
                };
                (name.clone(), facts)
            })
            .collect()
    }

    /// The entry for interface `name` (the default entry when the file has none).
    pub fn interface(&self, name: &str) -> InterfaceEntry {
        self.interfaces.get(name).cloned().unwrap_or_default()
    }

    /// How many tap queues `iface` of `vmi` gets: its entry's `queues` (default 1), and for a
    /// virtio NIC of a VMI with `networkInterfaceMultiqueue` at least one per vCPU (at most 256).
    pub fn tap_queues(&self, vmi: &Vmi, iface: &Interface) -> usize {
        let multiqueue = vmi.spec.domain.devices.network_interface_multi_queue == Some(true);
        let virtio = matches!(iface.model.as_deref(), None | Some("") | Some("virtio"));
        let per_vcpu = if multiqueue && virtio {
            super::devices::vcpus(vmi).unwrap_or(1).min(256) as usize
        } else {
            1
        };
        self.interface(&iface.name)
            .queues
            .unwrap_or(1)
            .max(per_vcpu)
    }
}

fn interfaces(vmi: &Vmi) -> &[Interface] {
    vmi.spec
        .domain
        .devices
        .interfaces
        .as_deref()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vmi(devices: serde_json::Value) -> Vmi {
        serde_json::from_value(json!({
            "metadata": {"name": "t"},
            "spec": {"domain": {"cpu": {"cores": 4}, "devices": devices}}
        }))
        .unwrap()
    }

    #[test]
    fn taps_are_numbered_per_queue_in_vmi_order_with_vhost_after() {
        let vmi = vmi(json!({
            "networkInterfaceMultiqueue": true,
            "interfaces": [{"name": "a"}, {"name": "b", "model": "e1000"}, {"name": "c"}]
        }));
        let facts = FactsFile::from_json(
            r#"{"qemu": "7.2", "tcg": true, "interfaces": {"c": {"vhost": true, "mtu": 9000, "mac": "02:00:00:00:00:0c"}}}"#,
        )
        .unwrap();
        let ctx = facts.context(&vmi);
        assert_eq!(ctx.qemu, QemuVersion { major: 7, minor: 2 });
        assert!(!ctx.kvm && ctx.allow_emulation);
        assert_eq!(ctx.monitor, MonitorSocket::Fd(3));
        let tap = |n: &str| ctx.interfaces[n].tap.clone();
        let fds = |fds: Vec<i32>, vhostfds: Vec<i32>| TapSource::Fds { fds, vhostfds };
        assert_eq!(tap("a"), fds(vec![10, 11, 12, 13], vec![]));
        assert_eq!(tap("b"), fds(vec![14], vec![]));
        assert_eq!(tap("c"), fds(vec![15, 16, 17, 18], vec![40, 41, 42, 43]));
        assert_eq!(ctx.interfaces["a"].mtu, Some(1500));
        assert_eq!(ctx.interfaces["c"].mtu, Some(9000));
        assert_eq!(
            ctx.interfaces["c"].mac.as_deref(),
            Some("02:00:00:00:00:0c")
        );
    }

    #[test]
    fn volumes_and_hardware_become_context_facts() {
        let facts = FactsFile::from_json(
            r#"{"volumes": {"d": {"block": true, "qcow2": true, "direct_io": true}},
                "host_pci": {"ua-gpu-g": "0000:65:00.0"}, "host_mdev": {"ua-gpu-m": "u"},
                "sev": {"cbitpos": 51, "reduced_phys_bits": 1, "snp": true}, "tdx": true,
                "virtiofs_ready": ["fs"], "now_unix": 7, "vsock_fd": 5, "no_kvm": true}"#,
        )
        .unwrap();
        let ctx = facts.context(&vmi(json!({})));
        assert_eq!(
            ctx.volumes["d"],
            VolumeFacts {
                kind: StorageKind::Block,
                format: ImageFormat::Qcow2,
                virtual_size: None,
                direct_io: true,
                preallocated: false,
                cbt_overlay: false,
            }
        );
        assert_eq!(
            ctx.host_devices["ua-gpu-g"],
            HostDeviceSource::Pci("0000:65:00.0".into())
        );
        assert_eq!(
            ctx.host_devices["ua-gpu-m"],
            HostDeviceSource::Mdev("u".into())
        );
        assert_eq!(ctx.sev.map(|s| (s.cbitpos, s.snp)), Some((51, true)));
        assert!(ctx.tdx && !ctx.kvm && !ctx.allow_emulation);
        assert!(ctx.virtiofs_ready.contains("fs"));
        assert_eq!((ctx.now_unix, ctx.vsock_fd), (7, Some(5)));
    }

    #[test]
    fn unknown_keys_and_bad_versions_are_rejected() {
        for bad in [
            r#"{"qemu": "ten"}"#,
            r#"{"kvm": true}"#,
            r#"{"volumes": {"d": {"raw": true}}}"#,
        ] {
            assert!(FactsFile::from_json(bad).is_err(), "{bad}");
        }
        assert_eq!(FactsFile::from_json("{}").unwrap(), FactsFile::default());
    }
}
