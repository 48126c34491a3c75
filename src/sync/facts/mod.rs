//! Gathering everything the converter needs before QEMU starts: the role of KubeVirt's
//! `generateConverterContext` (`pkg/virt-launcher/virtwrap/manager.go`, v1.9.0), plus the
//! preparation libvirt or virt-handler would do (overlays, ISOs, the pod network).
//!
//! `gather::gather` is the one gathering-and-convert every caller uses (boot, resync, the
//! vCPU and memory RPCs, the migration target). In boot order: `base_context` (the
//! launcher's settings), the QMP monitor as fd 3 and QEMU's version (waiting for
//! [`crate::sync::qemu_version::QemuProbe`]), [`storage::link_image_volumes`] and
//! [`storage::prepare_storage`] (volumes), [`network`] (the pod network binding and its DHCP
//! servers), [`secondary`] (Multus interfaces, set up by the NIC state of `reconcile/nics.rs`),
//! `hardware::add_hardware_facts` (VFIO devices, virtiofsd sockets) and
//! [`hardware::open_vhost_vsock`] (vsock's `vhostfd`), then, for every purpose,
//! `hotplug::add_hotplug_facts` (hotplug volumes) before the conversion. A resync starts from
//! the running domain's context instead and prepares only the secondary interfaces.

pub mod cache;
pub(crate) mod gather;
pub mod hardware;
pub mod hotplug;
pub mod network;
pub mod secondary;
pub mod storage;
pub mod volumes;

use crate::cmdline::context::MonitorSocket;
use crate::cmdline::{ConverterContext, FieldPath};
use crate::sync::config::SyncConfig;
use crate::vmi::Vmi;

/// The JSON path of the volume `name` in `vmi`: `spec.volumes[i]` (`spec.volumes` when no volume
/// has that name).
pub(crate) fn volume_field(vmi: &Vmi, name: &str) -> FieldPath {
    let volumes = FieldPath::new("spec.volumes");
    match vmi
        .spec
        .volumes
        .iter()
        .flatten()
        .position(|v| v.name == name)
    {
        Some(i) => volumes.index(i),
        None => volumes,
    }
}

/// The converter context of `config` before any volume or interface is known: QEMU version,
/// KVM, paths, the QMP socket, the runtime uid, the EFI firmware files found on the host and
/// the current time (seconds since the epoch).
pub(crate) fn base_context(config: &SyncConfig) -> ConverterContext {
    ConverterContext {
        qemu: config.qemu_version,
        kvm: config.kvm,
        allow_emulation: config.allow_emulation,
        paths: config.paths.clone(),
        monitor: MonitorSocket::Path(config.qmp_socket.display().to_string()),
        runtime_uid: config.runtime_uid,
        efi: crate::storage::detect_efi(
            &config.ovmf_dir,
            std::path::Path::new(crate::storage::nvram::DEBIAN_OVMF_DIR),
        ),
        now_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0),
        ..ConverterContext::default()
    }
}
