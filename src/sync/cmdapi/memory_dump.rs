//! `VirtualMachineMemoryDump`: a memory-only ELF core of the guest into the memory-dump volume,
//! with the domain metadata virt-handler watches (`storage/memoryDump.go`, v1.9.0; libvirt's
//! `virDomainCoreDumpWithFormat(RAW, MEMORY_ONLY)` underneath).
//!
//! virt-handler calls the RPC on every sync while the dump is in progress, so the call returns
//! success at once and dedups: while a dump runs, or when the metadata already names
//! `basename(dumpPath)`, nothing happens. Otherwise the metadata becomes `{FileName,
//! StartTimestamp}`, files whose name contains `memory.dump` in the target directory are removed,
//! and in the background, as libvirt does without `VIR_DUMP_LIVE`: `stop` (when running), the
//! file opened by us and passed with `getfd`, `dump-guest-memory {paging: false, protocol:
//! "fd:<name>", format: "elf", detach: true}`, the `DUMP_COMPLETED` event, `cont`. The metadata
//! then gets `Completed`, `EndTimestamp` and, on error, `Failed` with `FailureReason = "Domain
//! memory dump failed: <err>"`. Each metadata change is reported to the caller, who puts it in the
//! domain and sends the domain event.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, SystemTime};

use tracing::{info, warn};

use super::CmdApiError;
use crate::qmp::client::QmpClient;
use crate::qmp::commands::{Cont, DumpFormat, DumpGuestMemory, QueryStatus, Stop};
use crate::sync::domain::MemoryDumpMetadata;

/// Called with the metadata after each change.
pub type OnDumpMetadata = Arc<dyn Fn(MemoryDumpMetadata) + Send + Sync>;

/// The fd name the dump file gets in QEMU.
pub const DUMP_FD_NAME: &str = "qlauncher-memory-dump";

/// How long a dump may take before it counts as failed.
pub const DUMP_TIMEOUT: Duration = Duration::from_secs(3600);

/// KubeVirt's failure prefix (`FailedDomainMemoryDump`).
pub const FAILURE_PREFIX: &str = "Domain memory dump failed";

const QMP_TIMEOUT: Duration = Duration::from_secs(10);

/// The memory-dump state of one domain.
#[derive(Debug, Default)]
pub struct MemoryDumper {
    state: StdMutex<DumpState>,
}

#[derive(Debug, Default)]
struct DumpState {
    running: bool,
    metadata: Option<MemoryDumpMetadata>,
}

/// Now as `metav1.Time` prints it.
pub fn timestamp(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

impl MemoryDumper {
    /// The current metadata, if a dump was ever requested.
    pub fn metadata(&self) -> Option<MemoryDumpMetadata> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .metadata
            .clone()
    }

    /// Starts a dump to `dump_path` unless one runs or this file was already dumped; returns at
    /// once.
    ///
    /// # Errors
    /// [`CmdApiError::Refused`] for a path without a file name.
    pub fn request(
        self: &Arc<Self>,
        client: QmpClient,
        dump_path: &Path,
        on_metadata: OnDumpMetadata,
    ) -> Result<(), CmdApiError> {
        let Some(name) = dump_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
        else {
            return Err(CmdApiError::Refused(format!(
                "memory dump path {} has no file name",
                dump_path.display()
            )));
        };
        let metadata = {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if s.running || s.metadata.as_ref().is_some_and(|m| m.file_name == name) {
                return Ok(());
            }
            s.running = true;
            let m = MemoryDumpMetadata {
                file_name: name,
                start_timestamp: Some(timestamp(SystemTime::now())),
                ..MemoryDumpMetadata::default()
            };
            s.metadata = Some(m.clone());
            m
        };
        on_metadata(metadata);
        let me = self.clone();
        let path = dump_path.to_path_buf();
        tokio::spawn(async move {
            let result = dump(&client, &path).await;
            let metadata = {
                let mut s = me.state.lock().unwrap_or_else(|e| e.into_inner());
                s.running = false;
                let m = s.metadata.get_or_insert_with(MemoryDumpMetadata::default);
                m.completed = true;
                m.end_timestamp = Some(timestamp(SystemTime::now()));
                if let Err(e) = &result {
                    m.failed = true;
                    m.failure_reason = format!("{FAILURE_PREFIX}: {e}");
                }
                m.clone()
            };
            match &result {
                Ok(()) => info!(path = %path.display(), "memory dump completed"),
                Err(e) => warn!(path = %path.display(), error = %e, "memory dump failed"),
            }
            on_metadata(metadata);
        });
        Ok(())
    }
}

/// Removes earlier dumps next to `path` (names containing `memory.dump`).
fn remove_old_dumps(path: &Path) {
    let Some(dir) = path.parent() else { return };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().contains("memory.dump") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

async fn dump(client: &QmpClient, path: &PathBuf) -> Result<(), CmdApiError> {
    remove_old_dumps(path);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|source| CmdApiError::Io {
            what: format!("cannot create {}", path.display()),
            source,
        })?;
    let was_running = client.run_timeout(&QueryStatus, QMP_TIMEOUT).await?.running;
    let mut events = client.events();
    if was_running {
        client.run_timeout(&Stop, QMP_TIMEOUT).await?;
    }
    let result = async {
        client.getfd(DUMP_FD_NAME, file.as_fd()).await?;
        let cmd = DumpGuestMemory {
            paging: false,
            protocol: format!("fd:{DUMP_FD_NAME}"),
            detach: true,
            format: DumpFormat::Elf,
        };
        client.run_timeout(&cmd, QMP_TIMEOUT).await?;
        let ev = events
            .wait_for("DUMP_COMPLETED", "the memory dump", DUMP_TIMEOUT, |e| {
                e.name == "DUMP_COMPLETED"
            })
            .await?;
        match ev.data.get("error").and_then(|e| e.as_str()) {
            Some(error) => Err(CmdApiError::Refused(error.to_string())),
            None => Ok(()),
        }
    }
    .await;
    if was_running {
        if let Err(e) = client.run_timeout(&Cont, QMP_TIMEOUT).await {
            warn!(error = %e, "cannot resume the guest after the memory dump");
        }
    }
    result
}
