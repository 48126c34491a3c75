//! The drive side of a disk: cache and IO modes with KubeVirt's defaults (`SetDriverCacheMode`,
//! `SetOptimalIOMode`, `converter.go:400-500`), error policy, discard, serial, shareable and
//! custom block sizes; and the `-blockdev` chain libvirt builds from the image layers (a
//! protocol node and a format node per layer, `libvirt-N-storage`/`libvirt-N-format`, the
//! backing layer read-only below its overlay).

use super::buses::{Bus, Kind};
use super::sources::Layer;
use crate::cmdline::context::{StorageKind, VolumeFacts};
use crate::cmdline::error::{ConvertError, FieldPath};
use crate::cmdline::qemu::{
    Aio, BackingNode, Blockdev, BlockdevCache, BlockdevFormat, BlockdevProtocol, FormatDriver,
    OnError,
};
use crate::vmi::{Disk, Vmi, Volume};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cache {
    None,
    Writethrough,
    Writeback,
}

/// What KubeVirt's volume conversion does to a disk's `driver.discard`, by volume kind
/// (`pkg/virt-launcher/virtwrap/converter/converter.go`, v1.9.0; `setDiskDriver` at 663-669
/// sets `unmap` when asked and never clears it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum VolumeDiscard {
    /// containerDisk (`:898-920`), ephemeral (`:922-946`), emptyDisk (`:886-896`) and a disk
    /// with no volume (`Convert_v1_Missing_Volume_To_api_Disk`, `:637-642`): `unmap` always,
    /// even on a cdrom or a preallocated volume.
    Always,
    /// PVC and DataVolume, block or file, with or without CBT, and every hotplug volume
    /// (`setDiskDriver(.., !VolumesDiscardIgnore)`, `:671-816`): `unmap` unless preallocated.
    UnlessPreallocated,
    /// hostDisk (`:818-838`; virt-handler hands the launcher a filesystem PVC as one,
    /// `pkg/host-disk/host-disk.go` `ReplacePVCByHostDisk`), cloud-init NoCloud/ConfigDrive
    /// (`:851-869`), configMap/secret/downwardAPI/serviceAccount (`:644-661`) and sysprep
    /// (`:840-849`): the volume leaves discard as the device set it.
    Leaves,
    /// downwardMetrics (`:871-884`) replaces the whole driver: no discard.
    Clears,
}

impl VolumeDiscard {
    /// The class of `vol` (`None`: a disk without a volume, i.e. an empty cdrom); `hotplug`
    /// volumes go through KubeVirt's hotplug conversion (`:618-634`).
    pub(super) fn of(vol: Option<&Volume>, hotplug: bool) -> Self {
        let Some(v) = vol else {
            return Self::Always;
        };
        if hotplug || v.persistent_volume_claim.is_some() || v.data_volume.is_some() {
            Self::UnlessPreallocated
        } else if v.container_disk.is_some() || v.ephemeral.is_some() || v.empty_disk.is_some() {
            Self::Always
        } else if v.downward_metrics.is_some() {
            Self::Clears
        } else {
            Self::Leaves
        }
    }
}

/// Whether virt-handler lists volume `name` in `PreallocatedVolumes`, the launcher's
/// `VolumesDiscardIgnore` (`pkg/virt-handler/vm.go` `getPreallocatedVolumes`:
/// `status.volumeStatus[].persistentVolumeClaimInfo.preallocated`). Not the same as the image
/// being fully allocated on the host (`VolumeFacts::preallocated`, which picks `io=native`).
pub(super) fn discard_ignored(vmi: &Vmi, name: &str) -> bool {
    vmi.status
        .as_ref()
        .and_then(|st| st.volume_status.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|s| {
            s.name == name
                && s.persistent_volume_claim_info
                    .as_ref()
                    .and_then(|i| i.preallocated)
                    == Some(true)
        })
}

/// KubeVirt's `driver.discard` for a disk of `kind` whose volume is of class `vd`: the disk
/// stage sets `unmap` on a `disk` or `lun` device unless the volume is in
/// `VolumesDiscardIgnore` (`Convert_v1_Disk_To_api_Disk`, `converter.go:157-160`; a cdrom gets
/// nothing there), then the volume stage adds or clears it ([`VolumeDiscard`]). KubeVirt never
/// sets `detect_zeroes`, so libvirt adds no `detect-zeroes` either way.
pub(super) fn discard(kind: Kind, vd: VolumeDiscard, ignored: bool) -> Option<&'static str> {
    let device = kind != Kind::Cdrom && !ignored;
    let unmap = match vd {
        VolumeDiscard::Always => true,
        VolumeDiscard::UnlessPreallocated => device || !ignored,
        VolumeDiscard::Leaves => device,
        VolumeDiscard::Clears => false,
    };
    unmap.then_some("unmap")
}

/// What the frontends and blockdevs of one disk carry besides the image.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct DriveOptions {
    /// Blockdev cache flags (none for an empty cdrom).
    pub(super) cache: Option<BlockdevCache>,
    /// Frontend `write-cache`.
    pub(super) write_cache: Option<&'static str>,
    /// `aio` of the protocol nodes.
    pub(super) aio: Option<Aio>,
    /// `werror`.
    pub(super) werror: OnError,
    /// `rerror` (none for `enospace`).
    pub(super) rerror: Option<OnError>,
    /// `discard` of the format nodes.
    pub(super) discard: Option<&'static str>,
    /// Disk serial.
    pub(super) serial: Option<String>,
    /// `share-rw` (shareable disks).
    pub(super) share_rw: Option<bool>,
    /// Logical and physical block size, discard granularity.
    pub(super) block_sizes: (Option<u32>, Option<u32>, Option<u32>),
}

/// The drive options of disk `d` (at `p`), whose volume has `facts`; `has_image` is false for
/// an empty cdrom; `discard` comes from [`discard`]; `bus` is the disk's bus.
pub(super) fn options(
    d: &Disk,
    p: &FieldPath,
    bus: Bus,
    has_image: bool,
    facts: &VolumeFacts,
    discard: Option<&'static str>,
) -> Result<DriveOptions, ConvertError> {
    let shareable = d.shareable == Some(true);
    let cache = match d.cache.as_deref() {
        None if !has_image => None,
        None if shareable || facts.direct_io => Some(Cache::None),
        None => Some(Cache::Writethrough),
        Some("none") => Some(Cache::None),
        Some("writethrough") => Some(Cache::Writethrough),
        Some("writeback") => Some(Cache::Writeback),
        Some(o) => {
            return Err(ConvertError::unsupported(
                p.key("cache"),
                format!("cache mode {o:?}"),
            ))
        }
    };
    if shareable && cache != Some(Cache::None) {
        return Err(ConvertError::invalid(
            p.key("cache"),
            "a shareable disk needs cache \"none\"",
        ));
    }
    if cache == Some(Cache::None) && !facts.direct_io && d.cache.is_some() && has_image {
        return Err(ConvertError::invalid(
            p.key("cache"),
            "cache \"none\" needs O_DIRECT, which the volume's file system does not support",
        ));
    }
    let aio = match d.io.as_deref() {
        None => (cache == Some(Cache::None)
            && (facts.kind == StorageKind::Block || facts.preallocated))
            .then_some(Aio::Native),
        Some("native") => {
            if cache != Some(Cache::None) {
                return Err(ConvertError::invalid(
                    p.key("io"),
                    "io \"native\" needs cache \"none\"",
                ));
            }
            Some(Aio::Native)
        }
        Some("threads") => Some(Aio::Threads),
        Some(o) => {
            return Err(ConvertError::unsupported(
                p.key("io"),
                format!("io mode {o:?}"),
            ))
        }
    };
    let werror = match d.error_policy.as_deref().unwrap_or("stop") {
        "stop" => OnError::Stop,
        "report" => OnError::Report,
        "ignore" => OnError::Ignore,
        "enospace" => OnError::Enospc,
        o => {
            return Err(ConvertError::unsupported(
                p.key("errorPolicy"),
                format!("error policy {o:?}"),
            ))
        }
    };
    let serial = match d.serial.as_deref() {
        None => None,
        // KubeVirt leaves an empty serial out of the domain.
        Some("") => None,
        Some(s) => {
            // The one serial rule validation applies.
            crate::vmi::validate::check_disk_serial(s, bus.name())
                .map_err(|reason| ConvertError::invalid(p.key("serial"), reason))?;
            Some(s.to_string())
        }
    };
    let block_sizes = match &d.block_size {
        None => (None, None, None),
        Some(b)
            if b.match_volume
                .as_ref()
                .is_some_and(|m| m.enabled.unwrap_or(true)) =>
        {
            return Err(ConvertError::unsupported(
                p.key("blockSize").key("matchVolume"),
                "matching the volume's block size",
            ))
        }
        Some(b) => {
            let c = b.custom.clone().unwrap_or_default();
            for (v, f) in [(c.logical, "logical"), (c.physical, "physical")] {
                if let Some(v) = v {
                    if !(512..=65536).contains(&v) || !v.is_power_of_two() {
                        return Err(ConvertError::invalid(
                            p.key("blockSize").key("custom").key(f),
                            "block size must be a power of two from 512 to 65536",
                        ));
                    }
                }
            }
            (c.logical, c.physical, c.discard_granularity)
        }
    };
    Ok(DriveOptions {
        cache: cache.map(|c| BlockdevCache {
            direct: c == Cache::None,
            no_flush: false,
        }),
        write_cache: cache.map(|c| match c {
            Cache::None | Cache::Writeback => "on",
            Cache::Writethrough => "off",
        }),
        aio,
        werror,
        rerror: (werror != OnError::Enospc).then_some(werror),
        discard,
        serial,
        share_rw: shareable.then_some(true),
        block_sizes,
    })
}

/// The blockdev chain of `layers` (bottom first), numbering nodes down from `*node`; the top
/// format node is read-only when `top_read_only`, every lower one always. Every format node
/// carries the disk's discard, read-only or not, as libvirt passes it down the whole chain
/// (`qemuDomainPrepareDiskSourceData`); every protocol node `unmap`. Returns the nodes in argv
/// order and the top node name (the frontend's `drive`; none for an empty cdrom).
pub(super) fn chain(
    layers: &[Layer],
    node: &mut usize,
    top_read_only: bool,
    o: &DriveOptions,
) -> (Vec<Blockdev>, Option<String>) {
    let mut blockdevs = Vec::new();
    let mut below: Option<String> = None;
    for (li, layer) in layers.iter().enumerate() {
        let storage = format!("libvirt-{node}-storage");
        let format = format!("libvirt-{node}-format");
        *node -= 1;
        let is_top = li + 1 == layers.len();
        // A raw data file: its own protocol node (libvirt's `<dataStore>` source), first.
        let data_file = layer.data_file.as_ref().map(|(protocol, path)| {
            let name = format!("libvirt-{node}-storage");
            *node -= 1;
            blockdevs.push(Blockdev::Protocol(BlockdevProtocol {
                driver: *protocol,
                filename: path.clone(),
                node_name: name.clone(),
                aio: o.aio,
                cache: o.cache,
                auto_read_only: true,
                discard: Some("unmap"),
            }));
            name
        });
        blockdevs.push(Blockdev::Protocol(BlockdevProtocol {
            driver: layer.protocol,
            filename: layer.path.clone(),
            node_name: storage.clone(),
            aio: o.aio,
            cache: o.cache,
            auto_read_only: true,
            discard: Some("unmap"),
        }));
        let backing = match (layer.format, &below) {
            (FormatDriver::Qcow2, Some(b)) => BackingNode::Node(b.clone()),
            (FormatDriver::Qcow2, None) => BackingNode::Null,
            (FormatDriver::Raw, _) => BackingNode::Absent,
        };
        let read_only = if is_top { top_read_only } else { true };
        blockdevs.push(Blockdev::Format(BlockdevFormat {
            detect_zeroes: None,
            node_name: format.clone(),
            read_only,
            discard: o.discard,
            cache: o.cache,
            driver: layer.format,
            file: storage,
            data_file,
            backing,
        }));
        below = Some(format);
    }
    (blockdevs, below)
}
