//! `spec.metadata.kubevirt.migration`: the migration record both launchers keep in their domain
//! and virt-handler reads (`api.MigrationMetadata`, `pkg/virt-launcher/virtwrap/api/schema.go`,
//! v1.9.0), and the rules by which the launcher changes it (`initializeMigrationMetadata`,
//! `setMigrationResult`, `cancelMigration` in `live-migration-source.go`).
//!
//! In the notify and GetDomain JSON the keys are the Go field names (the type has only XML tags);
//! timestamps are Kubernetes times (RFC 3339, whole seconds, UTC) or null.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::sync::domain::kubernetes_time;

/// `api.MigrationMetadata`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationMetadata {
    /// The migration UID (the VMIM's UID).
    #[serde(rename = "UID", default)]
    pub uid: String,
    /// When the launcher accepted the migration.
    #[serde(rename = "StartTimestamp", default)]
    pub start_timestamp: Option<String>,
    /// When it ended, successfully or not.
    #[serde(rename = "EndTimestamp", default)]
    pub end_timestamp: Option<String>,
    /// It failed.
    #[serde(rename = "Failed", default)]
    pub failed: bool,
    /// Why it failed.
    #[serde(rename = "FailureReason", default)]
    pub failure_reason: String,
    /// The state of a requested abort: `""`, `Aborting`, `Succeeded`, `Failed`.
    #[serde(rename = "AbortStatus", default)]
    pub abort_status: String,
    /// `PreCopy`, `PostCopy` or `Paused`.
    #[serde(rename = "Mode", default)]
    pub mode: String,
}

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

impl MigrationMetadata {
    /// What a `MigrateVirtualMachine` for `uid` does to `current` (KubeVirt
    /// `initializeMigrationMetadata`): a new UID (or none) replaces the record with
    /// `{UID, StartTimestamp: now, Mode: PreCopy}`.
    pub fn start(
        current: &mut Option<MigrationMetadata>,
        uid: &str,
        now: SystemTime,
    ) -> StartDecision {
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
    pub fn finish(&mut self, failure: Option<&str>, now: SystemTime) -> bool {
        if self.end_timestamp.is_some() {
            return false;
        }
        if let Some(reason) = failure {
            self.failed = true;
            self.failure_reason = if reason.contains("canceled by client") {
                ABORTED_REASON.to_owned()
            } else {
                reason.to_owned()
            };
        }
        self.end_timestamp = Some(kubernetes_time(now));
        true
    }

    /// Whether a cancel request is to be acted on (KubeVirt `cancelMigration`): not when the
    /// migration ended, failed, never started, or an abort runs or succeeded.
    pub fn cancel_applies(&self) -> bool {
        self.end_timestamp.is_none()
            && !self.failed
            && self.start_timestamp.is_some()
            && self.abort_status != abort::ABORTING
            && self.abort_status != abort::SUCCEEDED
    }
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
        assert_eq!(
            MigrationMetadata::start(&mut m, "u1", t(0)),
            StartDecision::Start
        );
        let first = m.clone().unwrap();
        assert_eq!(first.mode, "PreCopy");
        assert_eq!(
            first.start_timestamp.as_deref(),
            Some("2027-01-15T08:00:00Z")
        );
        assert_eq!(
            MigrationMetadata::start(&mut m, "u1", t(5)),
            StartDecision::AlreadyRunning
        );
        assert_eq!(m.as_ref().unwrap(), &first);
        assert!(m.as_mut().unwrap().finish(None, t(9)));
        assert_eq!(
            MigrationMetadata::start(&mut m, "u1", t(10)),
            StartDecision::AlreadyExecuted
        );
        assert_eq!(
            MigrationMetadata::start(&mut m, "u2", t(11)),
            StartDecision::Start
        );
        assert_eq!(m.unwrap().uid, "u2");
    }

    #[test]
    fn finish_sets_the_result_once_and_maps_cancel() {
        let mut m = None;
        MigrationMetadata::start(&mut m, "u", t(0));
        let mut m = m.unwrap();
        assert!(m.finish(Some("operation failed: canceled by client"), t(3)));
        assert!(m.failed);
        assert_eq!(m.failure_reason, ABORTED_REASON);
        assert!(!m.finish(None, t(4)));
        assert_eq!(m.end_timestamp.as_deref(), Some("2027-01-15T08:00:03Z"));
    }

    #[test]
    fn cancel_applies_only_to_a_running_migration_without_abort() {
        let mut m = MigrationMetadata::default();
        assert!(!m.cancel_applies(), "never started");
        m.start_timestamp = Some("x".into());
        assert!(m.cancel_applies());
        m.abort_status = abort::ABORTING.into();
        assert!(!m.cancel_applies());
        m.abort_status = abort::FAILED.into();
        assert!(m.cancel_applies(), "a failed abort may be retried");
        m.end_timestamp = Some("y".into());
        assert!(!m.cancel_applies());
    }

    #[test]
    fn json_keys_are_go_field_names() {
        let m = MigrationMetadata {
            uid: "u".into(),
            start_timestamp: Some("2027-01-15T08:00:00Z".into()),
            mode: "PreCopy".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            serde_json::json!({
                "UID": "u", "StartTimestamp": "2027-01-15T08:00:00Z", "EndTimestamp": null,
                "Failed": false, "FailureReason": "", "AbortStatus": "", "Mode": "PreCopy"
            })
        );
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
        MigrationMetadata::start(&mut d.spec.metadata.kubevirt.migration, "mig", now);
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
