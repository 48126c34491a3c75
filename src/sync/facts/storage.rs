//! Storage preparation before QEMU starts: containerDisk overlays, emptyDisk images, the
//! cloud-init NoCloud or ConfigDrive ISO, and (through [`super::volumes`]) config-volume ISOs,
//! hostDisks and PVCs. Each yields the converter's [`VolumeFacts`] of its volume.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tracing::info;

use super::cache::{direct_io, iso_facts};
use crate::cmdline::context::{PathRoots, StorageKind, VolumeFacts};
use crate::cmdline::plan::FirmwarePlan;
use crate::hooks::Sidecars;
use crate::storage::paths::container_disk_path;
use crate::storage::{
    self, CloudInitData, CloudInitKind, CloudInitSpec, EmptyDiskSpec, OverlaySpec, VmiIdentity,
};
use crate::sync::error::SyncError;
use crate::vmi::Vmi;

/// With the ImageVolume feature (`--image-volume`): links each containerDisk's `disk_<i>.img` and
/// the kernel boot artifacts under `paths.container_disks` to their files in the image volumes
/// `dirs` (KubeVirt `linkImageVolumeFilePaths`, run before every conversion). Errors name the
/// volume ([`crate::storage::StorageError::ImageVolume`]).
pub fn link_image_volumes(
    vmi: &Vmi,
    dirs: &storage::image_volume::ImageVolumeDirs,
    paths: &PathRoots,
) -> Result<(), SyncError> {
    let container_disks = PathBuf::from(&paths.container_disks);
    for (index, vol) in vmi.spec.volumes.iter().flatten().enumerate() {
        if let Some(cd) = &vol.container_disk {
            let (target, outcome) = storage::image_volume::link_container_disk(
                &dirs.disks,
                &container_disks,
                &vol.name,
                index,
                cd.path.as_deref(),
            )
            .map_err(SyncError::Storage)?;
            info!(volume = %vol.name, target = %target.display(), ?outcome, "containerDisk image volume");
        }
    }
    let kernel_boot = vmi
        .spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.kernel_boot.as_ref())
        .and_then(|k| k.container.as_ref());
    if let Some(k) = kernel_boot {
        storage::image_volume::link_kernel_boot(
            &dirs.kernel_boot,
            &container_disks,
            &[k.kernel_path.as_deref(), k.initrd_path.as_deref()],
        )
        .map_err(SyncError::Storage)?;
    }
    Ok(())
}

/// Overlays, empty disks, the cloud-init ISO (through the hook sidecars' `PreCloudInitIso` when
/// one subscribes, [`pre_cloud_init_iso`]), config-volume ISOs, hostDisks and PVCs of `vmi`
/// ([`super::volumes`]); returns the converter's volume facts. Called on a blocking thread of
/// the launcher's runtime (the hook call waits on it).
pub fn prepare_storage(
    vmi: &Vmi,
    paths: &PathRoots,
    owner: Option<storage::Owner>,
    hooks: &Sidecars,
) -> Result<BTreeMap<String, VolumeFacts>, SyncError> {
    let mut facts = BTreeMap::new();
    let ephemeral = PathBuf::from(&paths.ephemeral_disks);
    let mut cloud_init_done = false;
    for (index, vol) in vmi.spec.volumes.iter().flatten().enumerate() {
        if vol.container_disk.is_some() {
            let base = container_disk_path(Path::new(&paths.container_disks), index);
            facts.insert(
                vol.name.clone(),
                container_disk_overlay(vol, &base, &ephemeral, owner)?,
            );
        } else if vol.ephemeral.is_some() {
            facts.insert(vol.name.clone(), ephemeral_overlay(vol, paths, owner)?);
        } else if let Some(spec) = EmptyDiskSpec::from_volume(vol, Path::new(&paths.empty_disks)) {
            let mut spec = spec.map_err(SyncError::Storage)?;
            spec.owner = owner;
            let (outcome, size) = storage::create_empty_disk(&spec).map_err(SyncError::Storage)?;
            let direct_io = direct_io(&vol.name, &[&spec.path]);
            info!(volume = %vol.name, ?outcome, size, direct_io, "emptyDisk");
            facts.insert(
                vol.name.clone(),
                VolumeFacts {
                    format: storage::ImageFormat::Qcow2,
                    virtual_size: Some(size),
                    direct_io,
                    ..VolumeFacts::default()
                },
            );
        } else if let Some(spec) = CloudInitSpec::from_volume(vol) {
            // KubeVirt uses the first cloud-init volume only.
            if cloud_init_done {
                continue;
            }
            cloud_init_done = true;
            facts.insert(
                vol.name.clone(),
                cloud_init_iso(vmi, &spec, paths, owner, hooks)?,
            );
        } else if let Some(f) = super::volumes::prepare(vmi, vol, paths, owner)? {
            let f = if vmi.status.as_ref().is_some_and(|s| s.cbt_active()) {
                cbt_overlay(vol, &f, paths, owner)?
            } else {
                f
            };
            facts.insert(vol.name.clone(), f);
        }
    }
    Ok(facts)
}

/// The CBT overlay of a (non-hotplug) PVC, DataVolume or hostDisk volume whose `facts`
/// [`super::volumes::prepare`] gave: `<private>/libvirt/qemu/cbt/<volume>.qcow2` over the image
/// the converter opens (`/dev/<volume>`, `<private>/vmi-disks/<volume>/disk.img` or the
/// hostDisk's mounted file) as its raw data file, created or reused
/// ([`storage::create_cbt_overlay`]; KubeVirt `ApplyChangedBlockTracking`). Other volumes'
/// facts are returned unchanged. `direct_io` then needs both files to support `O_DIRECT`.
///
/// # Errors
/// [`SyncError::Storage`]: a bad volume name, an image that is not raw, a foreign file at the
/// overlay path, or a failed write.
fn cbt_overlay(
    vol: &crate::vmi::Volume,
    facts: &VolumeFacts,
    paths: &PathRoots,
    owner: Option<storage::Owner>,
) -> Result<VolumeFacts, SyncError> {
    let private = Path::new(&paths.private_dir);
    let image = if let Some(h) = &vol.host_disk {
        match storage::paths::host_disk_path(
            &private.join("vmi-disks"),
            &vol.name,
            Path::new(&h.path),
        ) {
            Some(p) => p,
            None => return Ok(facts.clone()),
        }
    } else if vol.persistent_volume_claim.is_some() || vol.data_volume.is_some() {
        match facts.kind {
            StorageKind::Block => Path::new(&paths.dev).join(&vol.name),
            StorageKind::File => private.join("vmi-disks").join(&vol.name).join("disk.img"),
        }
    } else {
        return Ok(facts.clone());
    };
    storage::validate_volume_name(&vol.name).map_err(SyncError::Storage)?;
    let cbt_dir = private.join("libvirt").join("qemu").join("cbt");
    let mut spec = storage::CbtOverlaySpec::at_kubevirt_path(&vol.name, &image, &cbt_dir);
    spec.owner = owner;
    let (outcome, _) = storage::create_cbt_overlay(&spec).map_err(SyncError::Storage)?;
    let direct_io = facts.direct_io && direct_io(&vol.name, &[&spec.overlay]);
    info!(volume = %vol.name, ?outcome, image = %image.display(), overlay = %spec.overlay.display(), direct_io, "CBT overlay");
    Ok(VolumeFacts {
        direct_io,
        ..facts.clone()
    })
}

/// The overlay of a `containerDisk` volume over its `base` image, under `ephemeral` (KubeVirt's
/// `<ephemeral>/disk-data/<volume>/disk.qcow2`), kept when it exists.
///
/// # Errors
/// [`SyncError::Storage`]: the base is missing or unusable, or the overlay cannot be written.
fn container_disk_overlay(
    vol: &crate::vmi::Volume,
    base: &Path,
    ephemeral: &Path,
    owner: Option<storage::Owner>,
) -> Result<VolumeFacts, SyncError> {
    let mut spec = OverlaySpec::at_kubevirt_path(&vol.name, base, ephemeral);
    spec.owner = owner;
    let (outcome, base_facts) = storage::create_overlay(&spec).map_err(SyncError::Storage)?;
    let base_facts = match base_facts {
        Some(f) => f,
        None => storage::probe_image(&vol.name, base, &spec.policy).map_err(SyncError::Storage)?,
    };
    let direct_io = direct_io(&vol.name, &[&spec.overlay, base]);
    info!(volume = %vol.name, ?outcome, overlay = %spec.overlay.display(), direct_io, "containerDisk overlay");
    Ok(VolumeFacts {
        kind: StorageKind::File,
        format: base_facts.format,
        virtual_size: Some(base_facts.virtual_size),
        direct_io,
        preallocated: false,
        cbt_overlay: false,
    })
}

/// The cloud-init NoCloud or ConfigDrive ISO of `spec` (KubeVirt `pkg/cloud-init`), its data
/// resolved against the VMI's identity ([`VmiIdentity::from_vmi`]: name, namespace, hostname,
/// firmware UUID as NoCloud's instance-id, instancetype) and the secrets under the private
/// directory, written under the ephemeral-disk directory.
///
/// # Errors
/// [`SyncError::Storage`] from the resolution or the ISO writer; [`SyncError::PrepareQemu`]
/// when the ISO's directory cannot be created.
fn cloud_init_iso(
    vmi: &Vmi,
    spec: &CloudInitSpec,
    paths: &PathRoots,
    owner: Option<storage::Owner>,
    hooks: &Sidecars,
) -> Result<VolumeFacts, SyncError> {
    let kind = spec.kind.unwrap_or(CloudInitKind::NoCloud);
    let mut identity = VmiIdentity::from_vmi(vmi);
    // A VMI without a namespace is in `default`.
    if identity.namespace.is_empty() {
        identity.namespace = "default".into();
    }
    let secret_dir = PathBuf::from(&paths.private_dir).join("secret");
    let mut data =
        CloudInitData::resolve(spec, &identity, &secret_dir).map_err(SyncError::Storage)?;
    pre_cloud_init_iso(hooks, vmi, &mut data)?;
    let ephemeral = Path::new(&paths.ephemeral_disks);
    let iso = storage::cloud_init::cloud_init_iso_path(ephemeral, &identity, kind)
        .map_err(SyncError::Storage)?;
    if let Some(dir) = iso.parent() {
        std::fs::create_dir_all(dir).map_err(|source| SyncError::PrepareQemu {
            what: format!("create {}", dir.display()),
            source,
        })?;
    }
    storage::write_cloud_init_iso(&data, &iso, owner).map_err(SyncError::Storage)?;
    let facts = iso_facts(&spec.volume, &iso);
    info!(volume = %spec.volume, iso = %iso.display(), direct_io = facts.direct_io,
        preallocated = facts.preallocated, "cloud-init ISO");
    Ok(facts)
}

/// KubeVirt's `PreCloudInitIso` (`pkg/hooks/manager.go`, v1.9.0), before the ISO is written:
/// the resolved `data` in KubeVirt's `CloudInitData` form (and the older
/// `cloudInitNoCloudSource`) goes to the first v1alpha2+ subscriber, and its answer, read as
/// KubeVirt reads it ([`crate::hooks::cloud_init::CloudInitData::from_answer`]), replaces the user,
/// network and meta data. The ISO writer's limits and checks then apply to the answer as to any
/// VMI's data. Nothing happens without a subscriber. Blocks the calling (blocking) thread on the
/// launcher's runtime for the call.
///
/// # Errors
/// [`SyncError::Hook`]: the sidecar cannot be called, fails, or answers unreadable JSON.
fn pre_cloud_init_iso(
    hooks: &Sidecars,
    vmi: &Vmi,
    data: &mut CloudInitData,
) -> Result<(), SyncError> {
    use crate::hooks::cloud_init as hook;
    if !hooks.subscribes(crate::hooks::PRE_CLOUD_INIT_ISO) {
        return Ok(());
    }
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let no_cloud = data.kind == CloudInitKind::NoCloud;
    let source = if no_cloud {
        hook::DataSource::NoCloud
    } else {
        hook::DataSource::ConfigDrive
    };
    let sent = hook::CloudInitData {
        data_source: source,
        no_cloud_meta_data: no_cloud
            .then(|| serde_json::from_slice(&data.meta_data).ok())
            .flatten(),
        config_drive_meta_data: (!no_cloud)
            .then(|| serde_json::from_slice(&data.meta_data).ok())
            .flatten(),
        user_data: text(&data.user_data),
        network_data: text(&data.network_data),
        devices_data: None,
        volume_name: data.volume.clone(),
    };
    // Plain strings and maps: the serialiser cannot fail on them.
    let (legacy, cloud_init_data) = sent.hook_payloads().unwrap_or_default();
    // A `Vmi` (string keys) always serialises.
    let vmi_json = serde_json::to_vec(vmi).unwrap_or_default();
    let answer = tokio::runtime::Handle::current()
        .block_on(hooks.pre_cloud_init_iso(&legacy, &cloud_init_data, &vmi_json))
        .map_err(SyncError::Hook)?;
    let Some(answer) = answer else {
        return Ok(());
    };
    let answered = hook::CloudInitData::from_answer(source, &answer).map_err(SyncError::Hook)?;
    data.user_data = answered.user_data.into_bytes();
    data.network_data = answered.network_data.into_bytes();
    let meta = if no_cloud {
        answered.no_cloud_meta_data.map(|m| serde_json::to_vec(&m))
    } else {
        answered
            .config_drive_meta_data
            .map(|m| serde_json::to_vec(&m))
    };
    if let Some(Ok(meta)) = meta {
        data.meta_data = meta;
    }
    info!(sidecar = %answer.socket.display(), volume = %data.volume, "cloud-init data from the hook sidecar");
    Ok(())
}

/// The EFI NVRAM of `firmware`: `<nvram>/<name>_VARS.fd` copied from the plan's vars template
/// when missing, kept when present ([`storage::prepare_nvram`], libvirt's NVRAM handling under
/// KubeVirt's file name). Nothing for BIOS and stateless (ROM) firmware.
///
/// # Errors
/// [`SyncError::Storage`] naming the VMI and the file (missing template, something other than a
/// file at the NVRAM path, a failed copy).
pub(crate) fn prepare_nvram(
    firmware: &FirmwarePlan,
    vmi_name: &str,
    owner: Option<storage::Owner>,
) -> Result<(), SyncError> {
    let FirmwarePlan::Efi {
        vars_template,
        vars,
        ..
    } = firmware
    else {
        return Ok(());
    };
    let spec = storage::NvramSpec {
        vmi: vmi_name.to_string(),
        template: PathBuf::from(vars_template),
        vars: PathBuf::from(vars),
        owner,
    };
    let outcome = storage::prepare_nvram(&spec).map_err(SyncError::Storage)?;
    info!(?outcome, vars = %vars, template = %vars_template, "EFI NVRAM");
    Ok(())
}

/// An `ephemeral` volume (KubeVirt `pkg/ephemeral-disk`): a qcow2 overlay at
/// `<ephemeral>/disk-data/<volume>/disk.qcow2` over the PVC, which stays untouched: the block
/// device `<dev>/<volume>` of a block-mode claim, else the filesystem claim's
/// `<private>/vmi-disks/<volume>/disk.img` (`getBackingFilePath`), recorded as raw. The overlay is
/// kept when it exists (a re-sync keeps the guest's writes); the base must be self-contained.
///
/// # Errors
/// [`SyncError::Storage`]: the PVC is missing or unusable, or the overlay cannot be written.
pub(crate) fn ephemeral_overlay(
    vol: &crate::vmi::Volume,
    paths: &PathRoots,
    owner: Option<storage::Owner>,
) -> Result<VolumeFacts, SyncError> {
    use std::os::unix::fs::FileTypeExt;
    storage::validate_volume_name(&vol.name).map_err(SyncError::Storage)?;
    let device = Path::new(&paths.dev).join(&vol.name);
    let block = std::fs::metadata(&device).is_ok_and(|m| m.file_type().is_block_device());
    let base = if block {
        device
    } else {
        Path::new(&paths.private_dir)
            .join("vmi-disks")
            .join(&vol.name)
            .join("disk.img")
    };
    let mut spec =
        OverlaySpec::at_kubevirt_path(&vol.name, &base, Path::new(&paths.ephemeral_disks));
    spec.owner = owner;
    let (outcome, base_facts) = storage::create_overlay(&spec).map_err(SyncError::Storage)?;
    let virtual_size = match base_facts {
        Some(f) => f.virtual_size,
        None => {
            storage::probe_image(&vol.name, &base, &spec.policy)
                .map_err(SyncError::Storage)?
                .virtual_size
        }
    };
    let direct_io = direct_io(&vol.name, &[&spec.overlay, &base]);
    info!(volume = %vol.name, ?outcome, base = %base.display(), overlay = %spec.overlay.display(), direct_io, "ephemeral overlay");
    Ok(VolumeFacts {
        kind: if block {
            StorageKind::Block
        } else {
            StorageKind::File
        },
        format: storage::ImageFormat::Raw,
        virtual_size: Some(virtual_size),
        direct_io,
        preallocated: false,
        cbt_overlay: false,
    })
}
