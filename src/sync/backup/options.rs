//! The two JSON payloads of the backup RPCs as virt-handler sends them (KubeVirt v1.9.0
//! `staging/src/kubevirt.io/api/backup/v1alpha1/types.go`): `BackupOptions` in
//! `BackupRequest.options` and `BackupCheckpoint` in `RedefineCheckpointRequest.checkpoint`,
//! decoded and checked with the command server's texts (`cmd-server/server.go`,
//! `getBackupOptionsFromRequest`, `validateBackupExportRequest`), plus qlauncher's own checks
//! that no name or path sent can make a bad bitmap name, file name or a path outside the
//! backup volume ([`StartRequest::check`]).

use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

use serde::Deserialize;

/// `backupv1.BackupOptions` (every member `omitempty`; unknown members ignored).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BackupOptions {
    /// The `VirtualMachineBackup`'s name.
    pub backup_name: String,
    /// `Start`, `Abort` or `Export`.
    pub cmd: String,
    /// `Push` or `Pull`.
    pub mode: String,
    /// The backup's creation time (`metav1.Time`: RFC 3339, seconds, UTC).
    pub backup_start_time: Option<String>,
    /// The checkpoint an incremental backup starts from.
    pub incremental: Option<String>,
    /// The backup volume's directory (`/var/run/kubevirt/hotplug-disks/<volume>`).
    pub target_path: Option<String>,
    /// Do not freeze the guest.
    pub skip_quiesce: bool,
    /// Pull: the export server's address.
    pub export_server_addr: Option<String>,
    /// Pull: the export server's TLS name.
    pub export_server_name: Option<String>,
    /// Pull: the client key (PEM).
    pub backup_key: Option<String>,
    /// Pull: the client certificate (PEM).
    pub backup_cert: Option<String>,
    /// Pull: the export server's CA (PEM).
    pub ca_cert: Option<String>,
}

/// The command of a [`BackupOptions`], once KubeVirt's checks passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackupCmd {
    /// `Start` (with a mode and `targetPath`).
    Start,
    /// `Abort`.
    Abort,
    /// `Export` (pull, with every TLS member).
    Export,
}

/// KubeVirt's `getBackupOptionsFromRequest`: the options and their command.
///
/// # Errors
/// The command server's message: no options, undecodable JSON, a Start without a known mode
/// or a `targetPath`, an Export missing a member, an unknown command.
pub fn decode_options(bytes: &[u8]) -> Result<(BackupOptions, BackupCmd), String> {
    if bytes.is_empty() {
        return Err("backup options object not present in command server request".into());
    }
    let options: BackupOptions = serde_json::from_slice(bytes).map_err(|e| {
        format!("no valid backup options object present in command server request: {e}")
    })?;
    let cmd = match options.cmd.as_str() {
        "Start" => {
            if !matches!(options.mode.as_str(), "Push" | "Pull") {
                return Err("unknown backup mode: only Push and Pull are supported".into());
            }
            if options.target_path.is_none() {
                return Err("backup targetPath wasn't provided".into());
            }
            BackupCmd::Start
        }
        "Export" => {
            let missing = |what: &str| Err(format!("{what} wasn't provided"));
            if options.mode != "Pull" {
                return Err("can only export Pull mode backup".into());
            }
            if options.export_server_addr.is_none() {
                return missing("backup export server address");
            }
            if options.export_server_name.is_none() {
                return missing("backup export server name");
            }
            if options.backup_name.is_empty() {
                return missing("backup name");
            }
            if options.backup_start_time.is_none() {
                return missing("backup start time");
            }
            if options.backup_cert.is_none() {
                return missing("backup certificate");
            }
            if options.backup_key.is_none() {
                return missing("backup key");
            }
            if options.ca_cert.is_none() {
                return missing("backup export server CA cert");
            }
            BackupCmd::Export
        }
        "Abort" => BackupCmd::Abort,
        _ => return Err("cmd unsupported, backup command only supports start or abort".into()),
    };
    Ok((options, cmd))
}

/// The longest file name a backup may make (Linux `NAME_MAX`).
pub const NAME_MAX: usize = 255;

/// A push Start whose names and paths were checked ([`StartRequest::check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartRequest {
    /// `backupName`, a DNS-1123 subdomain.
    pub name: String,
    /// `backupStartTime` as sent (echoed in the metadata).
    pub start_timestamp: String,
    /// `backupStartTime` parsed (the de-duplication compares instants).
    pub start: SystemTime,
    /// `<name>-<UTC YYYY-MM-DD_HH-MM-SS>`, lowercased: the new checkpoint and bitmap.
    pub checkpoint: String,
    /// The checkpoint an incremental backup starts from (`None`: full).
    pub incremental: Option<String>,
    /// `targetPath`, inside the hotplug-disks directory.
    pub target_path: PathBuf,
    /// `Push` or `Pull`, as sent.
    pub mode: String,
    /// Do not freeze the guest.
    pub skip_quiesce: bool,
}

/// Parses `backupStartTime`: RFC 3339 in UTC (`Z`), as `metav1.Time` prints it.
///
/// # Errors
/// The field and the reason.
pub fn parse_start_time(start: Option<&str>) -> Result<(String, SystemTime), String> {
    let Some(start) = start else {
        return Err("backupStartTime: missing".into());
    };
    humantime::parse_rfc3339(start)
        .map(|t| (start.to_string(), t))
        .map_err(|_| format!("backupStartTime: {start:?} is not an RFC 3339 UTC time"))
}

/// Whether `name` is a DNS-1123 subdomain (a Kubernetes object name): 1 to 253 of lowercase
/// letters, digits, `-` and `.`, starting and ending alphanumeric, no empty label.
pub fn is_dns_subdomain(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.starts_with(alnum)
                && label.ends_with(alnum)
                && label.chars().all(|c| alnum(c) || c == '-')
        })
}

/// Whether `name` can be a checkpoint (bitmap) name of KubeVirt's shape: 1 to 1023 bytes of
/// lowercase letters, digits, `-`, `.` and `_`, not starting with `-` or `.`.
pub fn is_checkpoint_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 1023
        && !name.starts_with(['-', '.'])
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.' | '_'))
}

/// Whether `name` is one plain path component (no `/`, NUL, `.` or `..`, at most
/// [`NAME_MAX`] bytes).
pub fn is_path_component(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0'])
}

impl StartRequest {
    /// The checks qlauncher adds to KubeVirt's: `backupName` a DNS-1123 subdomain whose
    /// checkpoint directory name fits a file name; `backupStartTime` RFC 3339 UTC;
    /// `incremental` (when set and not empty) of a checkpoint name's shape; `targetPath`
    /// absolute, without `.`/`..`, and inside `hotplug_root` (where virt-handler mounts the
    /// backup volume). `options` passed [`decode_options`] as a Start.
    ///
    /// # Errors
    /// `invalid backup options: <field>: <reason>`.
    pub fn check(options: &BackupOptions, hotplug_root: &Path) -> Result<StartRequest, String> {
        let invalid = |reason: String| format!("invalid backup options: {reason}");
        let name = &options.backup_name;
        if !is_dns_subdomain(name) {
            return Err(invalid(format!(
                "backupName: {name:?} is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')"
            )));
        }
        let (start_timestamp, start) =
            parse_start_time(options.backup_start_time.as_deref()).map_err(invalid)?;
        let checkpoint = crate::qmp::commands::checkpoint_name(name, &start_timestamp)
            .map_err(|e| invalid(format!("backupStartTime: {e}")))?;
        if checkpoint.len() > NAME_MAX {
            return Err(invalid(format!(
                "backupName: {name:?} makes a backup directory name over {NAME_MAX} bytes"
            )));
        }
        let incremental = match options.incremental.as_deref() {
            None | Some("") => None,
            Some(c) if is_checkpoint_name(c) => Some(c.to_string()),
            Some(c) => {
                return Err(invalid(format!(
                    "incremental: {c:?} is not a checkpoint name"
                )))
            }
        };
        let target = options.target_path.as_deref().unwrap_or_default();
        let target_path = PathBuf::from(target);
        // Every segment a plain name (`components()` would hide a `.` or a `//`).
        let plain = target.starts_with('/')
            && target
                .trim_end_matches('/')
                .split('/')
                .skip(1)
                .all(is_path_component)
            && target_path
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !plain || !target_path.starts_with(hotplug_root) || target_path == hotplug_root {
            return Err(invalid(format!(
                "targetPath: {target:?} is not a directory under {}",
                hotplug_root.display()
            )));
        }
        Ok(StartRequest {
            name: name.clone(),
            start_timestamp,
            start,
            checkpoint,
            incremental,
            target_path,
            mode: options.mode.clone(),
            skip_quiesce: options.skip_quiesce,
        })
    }
}

/// `backupv1.BackupCheckpoint`: the tracker's checkpoint to register again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BackupCheckpoint {
    /// The checkpoint (bitmap) name.
    pub name: String,
    /// When the backup that made it started.
    pub creation_time: Option<String>,
    /// The volumes it covered (informational; the bitmaps decide).
    pub volumes: Vec<crate::vmi::BackupVolumeInfo>,
}

/// KubeVirt's decoding of `RedefineCheckpointRequest.checkpoint`.
///
/// # Errors
/// `Redefine checkpoint failed: invalid checkpoint info: <err>`.
pub fn decode_checkpoint(bytes: &[u8]) -> Result<BackupCheckpoint, String> {
    serde_json::from_slice(bytes)
        .map_err(|e| format!("Redefine checkpoint failed: invalid checkpoint info: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(json: serde_json::Value) -> Result<StartRequest, String> {
        let (options, cmd) = decode_options(json.to_string().as_bytes())?;
        assert_eq!(cmd, BackupCmd::Start);
        StartRequest::check(&options, Path::new("/var/run/kubevirt/hotplug-disks"))
    }

    #[test]
    fn kubevirts_texts_for_bad_options() {
        let err = |b: &[u8]| decode_options(b).unwrap_err();
        assert_eq!(
            err(b""),
            "backup options object not present in command server request"
        );
        assert!(err(b"{x")
            .starts_with("no valid backup options object present in command server request: "));
        assert_eq!(
            err(br#"{"cmd":"Start","mode":"Other","targetPath":"/t"}"#),
            "unknown backup mode: only Push and Pull are supported"
        );
        assert_eq!(
            err(br#"{"cmd":"Start","mode":"Push"}"#),
            "backup targetPath wasn't provided"
        );
        assert_eq!(
            err(br#"{"cmd":"Export","mode":"Push"}"#),
            "can only export Pull mode backup"
        );
        assert_eq!(
            err(br#"{"cmd":"Export","mode":"Pull","exportServerAddr":"a"}"#),
            "backup export server name wasn't provided"
        );
        assert_eq!(
            err(br#"{"cmd":"Delete"}"#),
            "cmd unsupported, backup command only supports start or abort"
        );
        let (o, cmd) = decode_options(br#"{"cmd":"Abort","backupName":"b1"}"#).unwrap();
        assert_eq!((o.backup_name.as_str(), cmd), ("b1", BackupCmd::Abort));
    }

    #[test]
    fn a_v19_start_decodes() {
        let s = start(
            serde_json::json!({"backupName": "b1", "cmd": "Start", "mode": "Push",
            "backupStartTime": "2026-01-02T03:04:05Z", "incremental": "b0-2026-01-01_00-00-00",
            "targetPath": "/var/run/kubevirt/hotplug-disks/b1-backup-target-pvc",
            "skipQuiesce": true}),
        )
        .unwrap();
        assert_eq!(s.checkpoint, "b1-2026-01-02_03-04-05");
        assert_eq!(s.incremental.as_deref(), Some("b0-2026-01-01_00-00-00"));
        assert!(s.skip_quiesce);
        assert_eq!(s.start_timestamp, "2026-01-02T03:04:05Z");
    }

    #[test]
    fn names_and_paths_that_would_make_bad_files_are_refused_with_their_field() {
        let base = serde_json::json!({"backupName": "b1", "cmd": "Start", "mode": "Push",
            "backupStartTime": "2026-01-02T03:04:05Z",
            "targetPath": "/var/run/kubevirt/hotplug-disks/t"});
        let with = |k: &str, v: serde_json::Value| {
            let mut o = base.clone();
            o[k] = v;
            start(o).unwrap_err()
        };
        for bad in [
            "",
            "B1",
            "a/b",
            "../x",
            "a b",
            "-a",
            "a..b",
            &"a".repeat(254),
        ] {
            let e = with("backupName", bad.into());
            assert!(e.starts_with("invalid backup options: backupName: "), "{e}");
        }
        let e = with("backupName", "a".repeat(240).into());
        assert!(e.contains("over 255 bytes"), "{e}");
        for bad in [
            "2026-01-02 03:04:05",
            "yesterday",
            "2026-01-02T03:04:05+02:00",
        ] {
            let e = with("backupStartTime", bad.into());
            assert!(
                e.starts_with("invalid backup options: backupStartTime: "),
                "{e}"
            );
        }
        for bad in ["../../x", "a/b", "A", "-x", "x y"] {
            let e = with("incremental", bad.into());
            assert!(
                e.starts_with("invalid backup options: incremental: "),
                "{e}"
            );
        }
        for bad in [
            "relative",
            "/var/run/kubevirt/hotplug-disks",
            "/var/run/kubevirt/hotplug-disks/../../../etc",
            "/var/run/kubevirt/hotplug-disks/./t",
            "/etc",
        ] {
            let e = with("targetPath", bad.into());
            assert!(e.starts_with("invalid backup options: targetPath: "), "{e}");
        }
        assert!(start({
            let mut o = base.clone();
            o["incremental"] = "".into();
            o
        })
        .unwrap()
        .incremental
        .is_none());
    }

    #[test]
    fn checkpoints_decode_with_kubevirts_text_on_error() {
        let c = decode_checkpoint(
            br#"{"name":"b1-2026-01-02_03-04-05","creationTime":"2026-01-02T03:04:05Z","volumes":[{"volumeName":"rootdisk","diskTarget":"vda"}]}"#,
        )
        .unwrap();
        assert_eq!(c.name, "b1-2026-01-02_03-04-05");
        assert_eq!(c.volumes[0].disk_target, "vda");
        assert!(decode_checkpoint(b"[")
            .unwrap_err()
            .starts_with("Redefine checkpoint failed: invalid checkpoint info: "));
    }
}
