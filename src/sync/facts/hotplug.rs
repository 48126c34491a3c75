//! Facts of hotplug volumes: the images virt-handler mounts under `<hotplug-disks>/`, probed.

use std::path::PathBuf;

use crate::cmdline::context::VolumeFacts;
use crate::cmdline::ConverterContext;
use crate::storage;
use crate::sync::error::SyncError;
use crate::vmi::Vmi;

/// Facts of the hotplug volumes (`<hotplug-disks>/<volume>.img`, probed) not yet in `ctx`.
pub(crate) fn add_hotplug_facts(vmi: &Vmi, ctx: &mut ConverterContext) -> Result<(), SyncError> {
    for vol in vmi.spec.volumes.iter().flatten() {
        let hotpluggable = vol
            .persistent_volume_claim
            .as_ref()
            .and_then(|p| p.hotpluggable)
            .or(vol.data_volume.as_ref().and_then(|d| d.hotpluggable))
            .unwrap_or(false);
        if !hotpluggable || ctx.volumes.contains_key(&vol.name) {
            continue;
        }
        storage::validate_volume_name(&vol.name).map_err(SyncError::Storage)?;
        let path = PathBuf::from(&ctx.paths.hotplug_disks).join(format!("{}.img", vol.name));
        if !path.exists() {
            continue;
        }
        let facts = storage::probe_image(&vol.name, &path, &storage::ChainPolicy::default())
            .map_err(SyncError::Storage)?;
        ctx.volumes.insert(
            vol.name.clone(),
            VolumeFacts {
                format: facts.format,
                virtual_size: Some(facts.virtual_size),
                ..VolumeFacts::default()
            },
        );
    }
    Ok(())
}
