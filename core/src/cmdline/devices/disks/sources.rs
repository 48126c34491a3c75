//! Where a disk's data comes from: the image layers behind each volume type at KubeVirt's paths
//! (`Convert_v1_Volume_To_api_Disk`, `converter.go:567-616`), bottom first, and whether a
//! hotplug volume is ready to be attached (`converter.go:1170-1178`).

use crate::cmdline::context::{ConverterContext, ImageFormat, StorageKind, VolumeFacts};
use crate::cmdline::devices::{vmi_name, vmi_namespace};
use crate::cmdline::error::{ConvertError, FieldPath};
use crate::cmdline::names::check_name_len;
use crate::cmdline::qemu::{FormatDriver, ProtocolDriver};
use crate::vmi::{Vmi, Volume};

/// One image layer of a disk, bottom first.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Layer {
    pub(super) protocol: ProtocolDriver,
    pub(super) path: String,
    pub(super) format: FormatDriver,
    pub(super) read_only: bool,
    /// qcow2 only: the raw external data file (protocol and path) the image's clusters map to
    /// one to one (a CBT overlay's volume image).
    pub(super) data_file: Option<(ProtocolDriver, String)>,
}

fn file_or_block(f: &VolumeFacts) -> ProtocolDriver {
    match f.kind {
        StorageKind::File => ProtocolDriver::File,
        StorageKind::Block => ProtocolDriver::HostDevice,
    }
}

fn fmt_of(f: &VolumeFacts) -> FormatDriver {
    match f.format {
        ImageFormat::Raw => FormatDriver::Raw,
        ImageFormat::Qcow2 => FormatDriver::Qcow2,
    }
}

/// The image layers behind a volume, bottom first.
pub(super) fn layers(
    vmi: &Vmi,
    ctx: &ConverterContext,
    vol: &Volume,
    vol_index: usize,
    vp: &FieldPath,
    hotplug: bool,
) -> Result<Vec<Layer>, ConvertError> {
    let facts = ctx.volumes.get(&vol.name).cloned().unwrap_or_default();
    let p = &ctx.paths;
    let name = &vol.name;
    let raw = |protocol, path: String| Layer {
        protocol,
        path,
        format: FormatDriver::Raw,
        read_only: false,
        data_file: None,
    };
    let iso = |dir: &str| {
        raw(
            ProtocolDriver::File,
            format!("{}/{dir}/{name}.iso", p.private_dir),
        )
    };
    let overlay = |base: Layer| {
        vec![
            Layer {
                read_only: true,
                ..base
            },
            Layer {
                protocol: ProtocolDriver::File,
                path: format!("{}/disk-data/{name}/disk.qcow2", p.ephemeral_disks),
                format: FormatDriver::Qcow2,
                read_only: false,
                data_file: None,
            },
        ]
    };
    let pvc = || {
        if hotplug {
            match facts.kind {
                StorageKind::Block => raw(
                    ProtocolDriver::HostDevice,
                    format!("{}/{name}", p.hotplug_disks),
                ),
                StorageKind::File => raw(
                    ProtocolDriver::File,
                    format!("{}/{name}.img", p.hotplug_disks),
                ),
            }
        } else {
            match facts.kind {
                StorageKind::Block => raw(ProtocolDriver::HostDevice, format!("{}/{name}", p.dev)),
                StorageKind::File => raw(
                    ProtocolDriver::File,
                    format!("{}/vmi-disks/{name}/disk.img", p.private_dir),
                ),
            }
        }
    };
    // CBT (`convertVolumeWithCBT`, `converter.go:671-829`): a PVC, DataVolume or hostDisk
    // volume runs through `<private>/libvirt/qemu/cbt/<volume>.qcow2`, whose raw data file is the
    // volume's image. A hot-plugged volume only once its overlay was made at mount time.
    let cbt = |image: Layer| -> Result<Vec<Layer>, ConvertError> {
        let active = vmi.status.as_ref().is_some_and(|s| s.cbt_active());
        if !active || (hotplug && !facts.cbt_overlay) {
            return Ok(vec![image]);
        }
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(ConvertError::invalid(
                vp.key("name"),
                "a CBT volume name must be a plain file name",
            ));
        }
        check_name_len(&vp.key("name"), name, 249)?;
        Ok(vec![Layer {
            protocol: ProtocolDriver::File,
            path: cbt_overlay_path(p, name),
            format: FormatDriver::Qcow2,
            read_only: false,
            data_file: Some((image.protocol, image.path)),
        }])
    };
    let kinds = vol.source_kinds();
    if kinds.len() != 1 {
        return Err(ConvertError::invalid(
            vp.clone(),
            format!("a volume needs exactly one source, found {}", kinds.len()),
        ));
    }
    Ok(if vol.container_disk.is_some() {
        overlay(Layer {
            protocol: ProtocolDriver::File,
            path: format!("{}/disk_{vol_index}.img", p.container_disks),
            format: fmt_of(&facts),
            read_only: true,
            data_file: None,
        })
    } else if let Some(e) = &vol.ephemeral {
        if e.persistent_volume_claim.is_none() {
            return Err(ConvertError::missing(
                vp.key("ephemeral").key("persistentVolumeClaim"),
                "the PVC of an ephemeral volume",
            ));
        }
        overlay(Layer {
            protocol: file_or_block(&facts),
            ..pvc()
        })
    } else if vol.persistent_volume_claim.is_some() || vol.data_volume.is_some() {
        cbt(pvc())?
    } else if let Some(h) = &vol.host_disk {
        let hp = vp.key("hostDisk").key("path");
        let base = h.path.rsplit('/').next().unwrap_or_default();
        check_name_len(&hp, base, 255)?;
        cbt(raw(
            ProtocolDriver::File,
            format!("{}/vmi-disks/{name}/{base}", p.private_dir),
        ))?
    } else if vol.empty_disk.is_some() {
        vec![Layer {
            protocol: ProtocolDriver::File,
            path: format!("{}/{name}.qcow2", p.empty_disks),
            format: FormatDriver::Qcow2,
            read_only: false,
            data_file: None,
        }]
    } else if vol.cloud_init_no_cloud.is_some() || vol.cloud_init_config_drive.is_some() {
        let file = if vol.cloud_init_no_cloud.is_some() {
            "noCloud.iso"
        } else {
            "configdrive.iso"
        };
        vec![raw(
            ProtocolDriver::File,
            format!(
                "{}/{}/{}/{file}",
                p.cloud_init,
                vmi_namespace(vmi)?,
                vmi_name(vmi)?
            ),
        )]
    } else if vol.config_map.is_some() {
        vec![iso("config-map-disks")]
    } else if vol.secret.is_some() {
        vec![iso("secret-disks")]
    } else if vol.downward_api.is_some() {
        vec![iso("downwardapi-disks")]
    } else if vol.sysprep.is_some() {
        vec![iso("sysprep-disks")]
    } else if vol.service_account.is_some() {
        vec![raw(
            ProtocolDriver::File,
            format!("{}/service-account-disk/service-account.iso", p.private_dir),
        )]
    } else if vol.downward_metrics.is_some() {
        vec![Layer {
            read_only: true,
            ..raw(
                ProtocolDriver::File,
                format!("{}/downwardapi-disks/vhostmd0", p.private_dir),
            )
        }]
    } else {
        return Err(ConvertError::unsupported(
            vp.clone(),
            format!("volume source {} as a disk", kinds.join(", ")),
        ));
    })
}

/// `<private>/libvirt/qemu/cbt/<volume>.qcow2`: a non-root launcher's CBT overlay
/// (`cbt.PathForCBT`, `pkg/storage/cbt/cbt.go:304-316`, where the backend-storage PVC is
/// mounted with `subPath: cbt`, plus `GetQCOW2OverlayPath`).
pub fn cbt_overlay_path(p: &crate::cmdline::context::PathRoots, volume: &str) -> String {
    format!("{}/libvirt/qemu/cbt/{volume}.qcow2", p.private_dir)
}

/// Hotplug volume status: `(is_hotplug, ready)` (`converter.go:1170-1178`).
pub(super) fn hotplug_state(vmi: &Vmi, vol: &Volume) -> (bool, bool) {
    let status = vmi
        .status
        .as_ref()
        .and_then(|s| s.volume_status.as_ref())
        .and_then(|v| v.iter().find(|s| s.name == vol.name));
    let is_hotplug = vmi.is_hotplug_volume(vol);
    let ready = status
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "MountedToPod" || p == "Ready");
    (is_hotplug, !is_hotplug || ready)
}
