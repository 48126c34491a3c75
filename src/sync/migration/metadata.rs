//! The rules by which a launcher changes its migration record
//! ([`MigrationMetadata`], `spec.metadata.kubevirt.migration`, defined with the domain):
//! KubeVirt's `initializeMigrationMetadata`, `setMigrationResult` and `cancelMigration`
//! (`live-migration-source.go`, v1.9.0).

use std::time::SystemTime;

use crate::sync::domain::{kubernetes_time, MigrationMetadata};

/// The answer to a `MigrateVirtualMachine` for a migration UID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartDecision {
    /// A new migration: the metadata is initialised, run it.
    Start,
    /// The same migration is already running: answer success, do nothing (virt-handler repeats
    /// the RPC until it sees the migration in progress).
    AlreadyRunning,
    /// The same migration already ended: refuse (one shot per UID).
    AlreadyExecuted,
}

/// `MigrationAbortStatus` values.
pub mod abort {
    /// An abort was requested and runs.
    pub const ABORTING: &str = "Aborting";
    /// The abort stopped the migration.
    pub const SUCCEEDED: &str = "Succeeded";
    /// The abort failed (no job, or an error, or 30 s passed).
    pub const FAILED: &str = "Failed";
}

/// The reason KubeVirt reports when a migration was cancelled by the client.
pub const ABORTED_REASON: &str = "Live migration has been aborted";

/// What a `MigrateVirtualMachine` for `uid` does to `current` (KubeVirt
/// `initializeMigrationMetadata`): a new UID (or none) replaces the record with
/// `{UID, StartTimestamp: now, Mode: PreCopy}`.
pub fn start(current: &mut Option<MigrationMetadata>, uid: &str, now: SystemTime) -> StartDecision {
    if let Some(m) = current.as_ref().filter(|m| m.uid == uid) {
        return if m.end_timestamp.is_none() {
            StartDecision::AlreadyRunning
        } else {
            StartDecision::AlreadyExecuted
        };
    }
    *current = Some(MigrationMetadata {
        uid: uid.to_owned(),
        start_timestamp: Some(kubernetes_time(now)),
        mode: "PreCopy".into(),
        ..MigrationMetadata::default()
    });
    StartDecision::Start
}

/// Records the result once (KubeVirt `setMigrationResult`): ignored when already ended. A
/// failure sets `Failed` and `FailureReason` (a "canceled by client" cause becomes
/// [`ABORTED_REASON`]) before `EndTimestamp`. Returns whether anything changed.
pub fn finish(m: &mut MigrationMetadata, failure: Option<&str>, now: SystemTime) -> bool {
    if m.end_timestamp.is_some() {
        return false;
    }
    if let Some(reason) = failure {
        m.failed = true;
        m.failure_reason = if reason.contains("canceled by client") {
            ABORTED_REASON.to_owned()
        } else {
            reason.to_owned()
        };
    }
    m.end_timestamp = Some(kubernetes_time(now));
    true
}

/// Whether a cancel request is to be acted on (KubeVirt `cancelMigration`): not when the
/// migration ended, failed, never started, or an abort runs or succeeded.
pub fn cancel_applies(m: &MigrationMetadata) -> bool {
    m.end_timestamp.is_none()
        && !m.failed
        && m.start_timestamp.is_some()
        && m.abort_status != abort::ABORTING
        && m.abort_status != abort::SUCCEEDED
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s)
    }

    #[test]
    fn start_is_idempotent_per_uid_and_one_shot() {
        let mut m = None;
        assert_eq!(start(&mut m, "u1", t(0)), StartDecision::Start);
        let first = m.clone().unwrap();
        assert_eq!(first.mode, "PreCopy");
        assert_eq!(
            first.start_timestamp.as_deref(),
            Some("2027-01-15T08:00:00Z")
        );
        assert_eq!(start(&mut m, "u1", t(5)), StartDecision::AlreadyRunning);
        assert_eq!(m.as_ref().unwrap(), &first);
        assert!(finish(m.as_mut().unwrap(), None, t(9)));
        assert_eq!(start(&mut m, "u1", t(10)), StartDecision::AlreadyExecuted);
        assert_eq!(start(&mut m, "u2", t(11)), StartDecision::Start);
        assert_eq!(m.unwrap().uid, "u2");
    }

    #[test]
    fn finish_sets_the_result_once_and_maps_cancel() {
        let mut m = None;
        start(&mut m, "u", t(0));
        let mut m = m.unwrap();
        assert!(finish(
            &mut m,
            Some("operation failed: canceled by client"),
            t(3)
        ));
        assert!(m.failed);
        assert_eq!(m.failure_reason, ABORTED_REASON);
        assert!(!finish(&mut m, None, t(4)));
        assert_eq!(m.end_timestamp.as_deref(), Some("2027-01-15T08:00:03Z"));
    }

    #[test]
    fn cancel_applies_only_to_a_running_migration_without_abort() {
        let mut m = MigrationMetadata::default();
        assert!(!cancel_applies(&m), "never started");
        m.start_timestamp = Some("x".into());
        assert!(cancel_applies(&m));
        m.abort_status = abort::ABORTING.into();
        assert!(!cancel_applies(&m));
        m.abort_status = abort::FAILED.into();
        assert!(cancel_applies(&m), "a failed abort may be retried");
        m.end_timestamp = Some("y".into());
        assert!(!cancel_applies(&m));
    }
}

#[cfg(test)]
mod domain_tests {
    use super::*;
    use crate::sync::domain::ApiDomain;

    #[test]
    fn the_domain_carries_the_record_under_metadata_kubevirt_migration() {
        let mut d = ApiDomain::for_vmi("ns", "vm", "vmi-uid");
        assert!(
            serde_json::to_value(&d).unwrap()["Spec"]["Metadata"]["KubeVirt"]
                .get("Migration")
                .is_none(),
            "absent before any migration"
        );
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        start(&mut d.spec.metadata.kubevirt.migration, "mig", now);
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["Spec"]["Metadata"]["KubeVirt"]["Migration"]["UID"], "mig");
        assert_eq!(
            v["Spec"]["Metadata"]["KubeVirt"]["Migration"]["Mode"],
            "PreCopy"
        );
        let back: ApiDomain = serde_json::from_value(v).unwrap();
        assert_eq!(back, d);
    }
}
