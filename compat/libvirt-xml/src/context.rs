//! The pod facts a VMI is converted with for export and comparison: placeholder launch-path facts
//! (QMP on inherited fd 3, taps on fds 10, 11, ..., MTU 1500), optionally adjusted by a
//! `NAME.facts.json` beside the manifest, in the format of the converter's fixtures
//! (`tests/fixtures/cmdline/*.facts.json`: `qemu`, `tcg`, `volumes.<name>.{block,qcow2,direct_io,
//! preallocated}`, `interfaces.<name>.{mac,mtu,queues,vhost}`, `vsock_fd`, `now_unix`).

use std::collections::BTreeMap;

use qlauncher_core::cmdline::context::{
    Backing, ConverterContext, IfaceFacts, ImageFormat, MonitorSocket, QemuVersion, TapSource,
    VolumeFacts,
};
use qlauncher_core::vmi::Vmi;
use serde::Deserialize;

/// Per-volume facts.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct VolFacts {
    /// Block device (else a file).
    pub block: bool,
    /// Base image is qcow2 (else raw).
    pub qcow2: bool,
    /// O_DIRECT works.
    pub direct_io: bool,
    /// Preallocated image.
    pub preallocated: bool,
}

/// Per-interface facts.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct NicFacts {
    /// MAC chosen by the network setup.
    pub mac: Option<String>,
    /// Pod link MTU (default 1500).
    pub mtu: Option<u32>,
    /// Tap queues.
    pub queues: Option<usize>,
    /// vhost-net fds are passed.
    pub vhost: bool,
}

/// A facts file. Unknown keys are ignored (the converter's fixtures carry test-only keys).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Facts {
    /// QEMU version `X.Y`.
    pub qemu: Option<String>,
    /// KVM unusable, emulation allowed.
    pub tcg: bool,
    /// KVM unusable, emulation not allowed.
    pub no_kvm: bool,
    /// Facts per volume.
    pub volumes: BTreeMap<String, VolFacts>,
    /// Facts per interface.
    pub interfaces: BTreeMap<String, NicFacts>,
    /// vhost-vsock fd.
    pub vsock_fd: Option<i32>,
    /// Unix time at start.
    pub now_unix: i64,
    /// The conversion is expected to fail.
    pub rejected: bool,
}

/// Builds the context for `vmi` from `facts`; `qemu` overrides the facts' QEMU version.
pub fn context(vmi: &Vmi, facts: &Facts, qemu: Option<QemuVersion>) -> ConverterContext {
    let mut ctx = ConverterContext {
        monitor: MonitorSocket::Fd(3),
        now_unix: facts.now_unix,
        vsock_fd: facts.vsock_fd,
        ..Default::default()
    };
    if let Some(v) = facts.qemu.as_deref().and_then(QemuVersion::parse) {
        ctx.qemu = v;
    }
    if let Some(v) = qemu {
        ctx.qemu = v;
    }
    if facts.tcg {
        ctx.kvm = false;
        ctx.allow_emulation = true;
    }
    if facts.no_kvm {
        ctx.kvm = false;
    }
    for (name, f) in &facts.volumes {
        ctx.volumes.insert(
            name.clone(),
            VolumeFacts {
                backing: if f.block {
                    Backing::Block
                } else {
                    Backing::File
                },
                format: if f.qcow2 {
                    ImageFormat::Qcow2
                } else {
                    ImageFormat::Raw
                },
                virtual_size: None,
                direct_io: f.direct_io,
                preallocated: f.preallocated,
            },
        );
    }
    let multiqueue = vmi.spec.domain.devices.network_interface_multi_queue == Some(true);
    let vcpus = qlauncher_core::cmdline::devices::vcpus(vmi)
        .unwrap_or(1)
        .min(256) as usize;
    let (mut fd, mut vfd) = (10, 40);
    for iface in vmi
        .spec
        .domain
        .devices
        .interfaces
        .as_deref()
        .unwrap_or_default()
    {
        let nf = facts
            .interfaces
            .get(&iface.name)
            .cloned()
            .unwrap_or_default();
        let virtio = matches!(iface.model.as_deref(), None | Some("") | Some("virtio"));
        let n = nf
            .queues
            .unwrap_or(1)
            .max(if multiqueue && virtio { vcpus } else { 1 });
        let fds: Vec<i32> = (fd..fd + n as i32).collect();
        fd += n as i32;
        let vhostfds: Vec<i32> = if nf.vhost {
            let v = (vfd..vfd + n as i32).collect();
            vfd += n as i32;
            v
        } else {
            vec![]
        };
        ctx.interfaces.insert(
            iface.name.clone(),
            IfaceFacts {
                // At launch the pod interface's MAC is always known (KubeVirt's network phase 2
                // writes it into the domain); a fixed local placeholder stands in for it here.
                mac: nf.mac.clone().or_else(|| {
                    iface
                        .mac_address
                        .is_none()
                        .then(|| format!("02:00:00:00:00:{:02x}", (fd - 10) % 256))
                }),
                mtu: nf.mtu.or(Some(1500)),
                tap: TapSource::Fds { fds, vhostfds },
            },
        );
    }
    ctx
}

/// Applies what virt-api's webhook does before the converter sees a VMI: KubeVirt's defaults
/// (`qlauncher_core::vmi::defaults`). A VMI without a firmware UUID gets the one KubeVirt derives
/// for a VM named `vm_name` (stable output), as the converter's fixture tests do.
pub fn apply_webhook_defaults(vmi: &mut Vmi, vm_name: &str) {
    let mut cfg = qlauncher_core::vmi::DefaultsConfig::for_vmi(vmi);
    if cfg.vm_name.is_none() {
        cfg.vm_name = Some(vm_name.to_string());
    }
    vmi.apply_defaults(&cfg);
}
