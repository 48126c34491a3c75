//! The cache facts of a disk's files, which decide `cache=` and `io=` in the converter
//! (KubeVirt's `SetDriverCacheMode` with its `DirectIOChecker`, and `SetOptimalIOMode`,
//! `converter.go`, v1.9.0): whether every file opens with `O_DIRECT`, and whether an image is
//! fully allocated.

use std::path::Path;

use crate::cmdline::context::VolumeFacts;
use crate::storage;

/// KubeVirt's O_DIRECT check of a disk (`converter.go SetDriverCacheMode` with its
/// `DirectIOChecker`): true when every file of `paths` (the disk's backend and, for an overlay,
/// its backing file) can be opened with `O_DIRECT`. The converter then picks `cache=none` by
/// default and accepts an explicit `none`; otherwise `writethrough`. A failed check counts as
/// unsupported, as in KubeVirt, and is logged.
pub(crate) fn direct_io(volume: &str, paths: &[&Path]) -> bool {
    paths.iter().all(|p| match storage::direct_io_supported(p) {
        Ok(supported) => supported,
        Err(e) => {
            tracing::warn!(volume, path = %p.display(), error = %e, "direct I/O check failed");
            false
        }
    })
}

/// The cache facts of a disk image file of `size` bytes: O_DIRECT support
/// ([`direct_io`]) and KubeVirt's `IsPreAllocated` (the bytes allocated on the
/// host cover the virtual size), which with `cache=none` makes the converter choose
/// `io=native` (`SetOptimalIOMode`).
pub(crate) fn cache_facts(volume: &str, image: &Path, size: u64) -> (bool, bool) {
    let direct_io = direct_io(volume, &[image]);
    let preallocated = std::fs::metadata(image)
        .is_ok_and(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512 >= size);
    (direct_io, preallocated)
}

/// The converter facts of an ISO the launcher generated (cloud-init NoCloud/ConfigDrive,
/// configMap, secret, downwardAPI, serviceAccount, sysprep): KubeVirt runs the same
/// `SetDriverCacheMode` and `SetOptimalIOMode` over every disk with a backend file
/// (`manager.go`, after the config disks are written), so an ISO on a file system with O_DIRECT
/// gets `cache=none` (and, being fully written, `io=native`), and on one without it
/// `writethrough`; an explicit `none` is accepted only with O_DIRECT.
pub fn iso_facts(volume: &str, iso: &Path) -> VolumeFacts {
    let size = std::fs::metadata(iso).map(|m| m.len()).unwrap_or(0);
    let (direct_io, preallocated) = cache_facts(volume, iso, size);
    VolumeFacts {
        direct_io,
        preallocated,
        ..VolumeFacts::default()
    }
}
