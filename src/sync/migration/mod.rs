//! Live migration as KubeVirt drives it (issue 19), without libvirt.
//!
//! - [`protocol`]: the versioned control protocol the two launchers speak over the migration
//!   proxy's role-0 channel (the channel libvirt uses between its daemons);
//! - [`metadata`]: `spec.metadata.kubevirt.migration` and the rules that change it;
//! - [`source`], [`target`]: the two QMP halves of a migration;
//! - [`hotplug`]: hot-plugged disks and NICs carried to the target (what the source describes,
//!   where the target places its own plan of each);
//! - [`sriov`]: SR-IOV VFs unplugged before the migration (re-plugged on the target by
//!   `HotplugHostDevices`), and the host devices that refuse it;
//! - [`launcher`]: the five migration RPCs of the launcher over them and what both sides share;
//!   [`outgoing`] the source's (`MigrateVirtualMachine`, cancel, job statistics),
//!   [`incoming`] the target's (`SyncMigrationTarget`, pod cleanup, finalize), [`libvirt_peer`]
//!   the target's answer to a stock launcher's libvirt (libvirt's remote protocol on the same
//!   role-0 socket), and
//!   [`boot_conversion`] the target's QEMU definition for the source's domain (hot-plugged
//!   devices where the source runs them, the adopted CPU, the argv compared word for word);
//! - this module: the sockets virt-handler's migration proxy connects
//!   (`pkg/virt-handler/migration-proxy/migration-proxy.go`, v1.9.0), the options virt-handler
//!   sends with `MigrateVirtualMachine` (`cmdclient.MigrationOptions`) and the deadlines derived
//!   from them (`live-migration-source.go`, `manager.go`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub mod bitmap_cookie;
pub mod boot_conversion;
pub mod hotplug;
pub mod incoming;
pub mod launcher;
pub mod libvirt_peer;
pub mod metadata;
pub mod outgoing;
pub mod protocol;
pub mod source;
pub mod sriov;
pub mod stock_cpu;
pub mod target;

/// Errors of a migration. [`MigrationError::failure_reason`] is the text recorded in the
/// migration metadata.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// The control channel failed or the peer refused.
    #[error("migration control channel")]
    Protocol(#[from] protocol::ProtocolError),
    /// A QMP command failed.
    #[error("QMP")]
    Qmp(#[from] crate::qmp::QmpError),
    /// The peer launcher reported a failure.
    #[error("migration peer failed: {0}")]
    Peer(String),
    /// QEMU reported the migration failed.
    #[error("QEMU migration failed: {0}")]
    Qemu(String),
    /// A deadline passed (progress, completion, or a peer's answer); the migration was aborted.
    #[error("migration aborted: {0}")]
    Timeout(String),
    /// The migration was cancelled (CancelVirtualMachineMigration, or the peer's abort).
    #[error("migration canceled by client")]
    Aborted,
    /// virt-handler's options are invalid.
    #[error("invalid migration options: {0}")]
    Options(String),
    /// Preparing the domain failed: its SR-IOV devices were not unplugged ([`sriov`]); the
    /// reason reads as KubeVirt's (`migrateHelper`).
    #[error("{}", sriov::PREPARE_FAILED)]
    Prepare(#[source] sriov::SriovDetachError),
    /// The migration failed (`failed`) and its roll-back did not end every disk mirror: the
    /// jobs `jobs` still ran `after` their forced cancel (libvirt fails the same way when
    /// `qemuMigrationSrcNBDCopyCancel` does not see them end). The source runs on (or stays
    /// paused) with them.
    #[error(
        "{failed}; the roll-back left the disk mirrors {} running {} seconds after their cancel",
        .jobs.join(", "),
        .after.as_secs()
    )]
    RollBack {
        /// Why the migration failed.
        failed: Box<MigrationError>,
        /// The mirrors' job ids still running.
        jobs: Vec<String>,
        /// How long the roll-back waited for them.
        after: Duration,
    },
}

impl MigrationError {
    /// The `FailureReason` KubeVirt records: [`metadata::ABORTED_REASON`] for a cancel (libvirt's
    /// "canceled by client"), else the error and its causes joined by `": "`.
    pub fn failure_reason(&self) -> String {
        if matches!(self, MigrationError::Aborted) {
            return metadata::ABORTED_REASON.to_owned();
        }
        if let MigrationError::RollBack {
            failed,
            jobs,
            after,
        } = self
        {
            return format!(
                "{}; the roll-back left the disk mirrors {} running {} seconds after their cancel",
                failed.failure_reason(),
                jobs.join(", "),
                after.as_secs()
            );
        }
        let mut message = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        message
    }

    /// Whether the migration ended because it was cancelled ([`MigrationError::Aborted`], also
    /// behind a [`MigrationError::RollBack`]): the abort succeeded.
    pub fn is_abort(&self) -> bool {
        match self {
            MigrationError::Aborted => true,
            MigrationError::RollBack { failed, .. } => failed.is_abort(),
            _ => false,
        }
    }
}

/// The TCP role of the QEMU migration stream (`LibvirtDirectMigrationPort`).
pub const DIRECT_MIGRATION_PORT: u16 = 49152;
/// The TCP role of the NBD server for copied disks (`LibvirtBlockMigrationPort`).
pub const BLOCK_MIGRATION_PORT: u16 = 49153;

/// The directory of the migration proxy's unix sockets in a pod, owned by qemu (107).
pub const MIGRATION_PROXY_DIR: &str = "/var/run/kubevirt/migrationproxy";

/// A migration proxy socket under `dir` (normally [`MIGRATION_PROXY_DIR`]) for the VMI `uid` and
/// the role `port` (0, [`DIRECT_MIGRATION_PORT`] or [`BLOCK_MIGRATION_PORT`]):
/// `<dir>/<uid>-source.sock` for role 0, else `<dir>/<uid>-<port>-source.sock`
/// (`ConstructProxyKey`, `SourceUnixFile`). The same path names the stream and NBD sockets on
/// both pods.
pub fn proxy_socket(dir: &Path, uid: &str, port: u16) -> PathBuf {
    let key = if port == 0 {
        uid.to_owned()
    } else {
        format!("{uid}-{port}")
    };
    dir.join(format!("{key}-source.sock"))
}

/// `cmdclient.MigrationOptions` as virt-handler marshals it (Go field names, no tags).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct MigrationOptions {
    /// `bandwidthPerMigration`, a Kubernetes quantity (`"0"` = not limited).
    pub bandwidth: Option<String>,
    /// Seconds without progress before the migration is aborted (0 = never).
    pub progress_timeout: i64,
    /// Seconds per GB of data before the migration is aborted (0 = never).
    #[serde(rename = "CompletionTimeoutPerGiB")]
    pub completion_timeout_per_gib: i64,
    /// Used only by the stall detector.
    pub max_downtime_ms: u64,
    /// Skip the safety checks.
    pub unsafe_migration: bool,
    /// Enable QEMU's `auto-converge`.
    pub allow_auto_converge: bool,
    /// Allow switching to post-copy.
    pub allow_post_copy: bool,
    /// multifd channels, when parallel migration is on.
    pub parallel_migration_threads: Option<u32>,
    /// Allow post-copy or pausing the guest when the completion time is exceeded.
    pub allow_workload_disruption: bool,
    /// `zstd` or `none`.
    pub compression: Option<String>,
}

impl MigrationOptions {
    /// Decodes the request's `options` bytes (empty = all defaults).
    pub fn from_json(bytes: &[u8]) -> Result<MigrationOptions, serde_json::Error> {
        if bytes.is_empty() {
            return Ok(MigrationOptions::default());
        }
        serde_json::from_slice(bytes)
    }

    /// `max-bandwidth` in bytes/s: the quantity in whole MiB/s times 1 MiB, or, when not limited, the
    /// "unlimited" value libvirt sets (`(i64::MAX / 1 MiB) * 1 MiB`) instead of QEMU's own
    /// 128 MiB/s default. Errors name the quantity.
    pub fn max_bandwidth(&self) -> Result<u64, String> {
        const MIB: u64 = 1 << 20;
        let unlimited = (i64::MAX as u64 / MIB) * MIB;
        let Some(q) = self.bandwidth.as_deref().filter(|q| !q.is_empty()) else {
            return Ok(unlimited);
        };
        let bytes = crate::vmi::quantity::Quantity::new(q)
            .to_bytes()
            .map_err(|e| format!("invalid migration bandwidth {q:?}: {e}"))?;
        // KubeVirt's QuantityToMebiByte: nearest MiB, at least 1 MiB for a non-zero value.
        let mib = match bytes {
            0 => return Ok(unlimited),
            b if b < MIB => 1,
            b => (b + MIB / 2) / MIB,
        };
        Ok(mib.saturating_mul(MIB))
    }

    /// The disk mirrors' `speed` in bytes/s: the limited bandwidth, or `None` (unlimited) when
    /// virt-handler sets none (libvirt passes the migration bandwidth to its block copy jobs,
    /// `qemuMigrationSrcNBDStorageCopy`).
    pub fn mirror_speed(&self) -> Option<u64> {
        const MIB: u64 = 1 << 20;
        let unlimited = (i64::MAX as u64 / MIB) * MIB;
        self.max_bandwidth().ok().filter(|&b| b != unlimited)
    }

    /// The completion deadline for `data_bytes` of memory and copied disks: the per-GiB timeout
    /// times the size in decimal GB rounded up (KubeVirt's `ScaledValue(Giga)`); `None` when
    /// disabled.
    pub fn completion_deadline(&self, data_bytes: u64) -> Option<Duration> {
        let per = u64::try_from(self.completion_timeout_per_gib)
            .ok()
            .filter(|&s| s > 0)?;
        let gb = data_bytes.div_ceil(1_000_000_000);
        Some(Duration::from_secs(per.saturating_mul(gb)))
    }

    /// The progress timeout; `None` when disabled.
    pub fn progress_deadline(&self) -> Option<Duration> {
        u64::try_from(self.progress_timeout)
            .ok()
            .filter(|&s| s > 0)
            .map(Duration::from_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_sockets_follow_the_proxy_key() {
        let d = Path::new(MIGRATION_PROXY_DIR);
        assert_eq!(
            proxy_socket(d, "u1", 0),
            Path::new("/var/run/kubevirt/migrationproxy/u1-source.sock")
        );
        assert_eq!(
            proxy_socket(d, "u1", DIRECT_MIGRATION_PORT),
            Path::new("/var/run/kubevirt/migrationproxy/u1-49152-source.sock")
        );
        assert_eq!(
            proxy_socket(d, "u1", BLOCK_MIGRATION_PORT),
            Path::new("/var/run/kubevirt/migrationproxy/u1-49153-source.sock")
        );
    }

    #[test]
    fn options_decode_virt_handlers_json() {
        let o = MigrationOptions::from_json(
            br#"{"Bandwidth":"64Mi","ProgressTimeout":150,"CompletionTimeoutPerGiB":150,
                 "MaxDowntimeMs":900,"UnsafeMigration":false,"AllowAutoConverge":true,
                 "AllowPostCopy":false,"ParallelMigrationThreads":8,
                 "AllowWorkloadDisruption":false,"StallDetectorOptions":null,"Compression":null}"#,
        )
        .unwrap();
        assert_eq!(o.parallel_migration_threads, Some(8));
        assert!(o.allow_auto_converge);
        assert_eq!(o.max_bandwidth().unwrap(), 64 << 20);
        assert_eq!(o.mirror_speed(), Some(64 << 20));
        assert_eq!(MigrationOptions::default().mirror_speed(), None);
        assert_eq!(o.progress_deadline(), Some(Duration::from_secs(150)));
        // A 1 GiB guest is 2 decimal GB: 300 s.
        assert_eq!(
            o.completion_deadline(1 << 30),
            Some(Duration::from_secs(300))
        );
    }

    #[test]
    fn zero_bandwidth_is_libvirts_unlimited() {
        let o = MigrationOptions {
            bandwidth: Some("0".into()),
            ..Default::default()
        };
        assert_eq!(o.max_bandwidth().unwrap(), 9_223_372_036_853_727_232);
        assert_eq!(
            MigrationOptions::default().completion_deadline(1 << 30),
            None
        );
        assert!(MigrationOptions {
            bandwidth: Some("lots".into()),
            ..Default::default()
        }
        .max_bandwidth()
        .unwrap_err()
        .contains("\"lots\""));
    }
}
