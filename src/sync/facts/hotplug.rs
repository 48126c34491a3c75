//! Facts of hotplug volumes: the images virt-handler mounts under `<hotplug-disks>/`, probed.

use std::path::PathBuf;

use crate::cmdline::context::VolumeFacts;
use crate::cmdline::ConverterContext;
use crate::storage;
use crate::sync::error::SyncError;
use crate::vmi::Vmi;

/// Facts of the hotplug volumes (`<hotplug-disks>/<volume>.img`, probed) not yet in `ctx`.
/// With CBT Initializing or Enabled, a mounted one also gets its CBT overlay
/// (`<private>/libvirt/qemu/cbt/<volume>.qcow2` over the mounted image, created or reused, owned
/// by `owner`; KubeVirt `ApplyChangedBlockTracking` for a `MountedToPod` hotplug volume), and
/// its facts say so ([`VolumeFacts::cbt_overlay`]).
pub(crate) fn add_hotplug_facts(
    vmi: &Vmi,
    ctx: &mut ConverterContext,
    owner: Option<storage::Owner>,
) -> Result<(), SyncError> {
    let cbt = vmi.status.as_ref().is_some_and(|s| s.cbt_active());
    for vol in vmi.spec.volumes.iter().flatten() {
        if !vmi.is_hotplug_volume(vol) || ctx.volumes.contains_key(&vol.name) {
            continue;
        }
        storage::validate_volume_name(&vol.name).map_err(SyncError::Storage)?;
        let path = PathBuf::from(&ctx.paths.hotplug_disks).join(format!("{}.img", vol.name));
        if !path.exists() {
            continue;
        }
        let facts = storage::probe_image(&vol.name, &path, &storage::ChainPolicy::default())
            .map_err(SyncError::Storage)?;
        if cbt {
            let dir = PathBuf::from(&ctx.paths.private_dir).join("libvirt/qemu/cbt");
            let mut spec = storage::CbtOverlaySpec::at_kubevirt_path(&vol.name, &path, &dir);
            spec.owner = owner;
            let (outcome, _) = storage::create_cbt_overlay(&spec).map_err(SyncError::Storage)?;
            tracing::info!(volume = %vol.name, ?outcome, overlay = %spec.overlay.display(), "hotplug CBT overlay");
        }
        ctx.volumes.insert(
            vol.name.clone(),
            VolumeFacts {
                format: facts.format,
                virtual_size: Some(facts.virtual_size),
                cbt_overlay: cbt,
                ..VolumeFacts::default()
            },
        );
    }
    Ok(())
}
