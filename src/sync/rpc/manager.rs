//! The launcher behaviour behind the command server ([`DomainManager`]), KubeVirt's
//! `virtwrap.DomainManager` (`pkg/virt-launcher/virtwrap/manager.go`, v1.9.0).

use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::sync::domain::ApiDomain;
use crate::sync::rpc::proto::cmd::v1 as cmd;
use crate::sync::rpc::proto::cmd::v1::VirtualMachineOptions;

/// The message virt-launcher answers when `vmiJson` does not decode
/// (`cmd-server/server.go`, `getVMIFromRequest`); also the text of
/// [`SyncError::UndecodableVmi`](crate::sync::error::SyncError::UndecodableVmi).
pub use crate::sync::error::INVALID_VMI_MESSAGE;

/// What `GetScreenshot` answers: the MIME type and the image bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Screenshot {
    /// `image/png` (or `image/x-portable-pixmap` from an old QEMU).
    pub mime: String,
    /// The image file's bytes.
    pub data: Vec<u8>,
}

/// What `Exec` reports of a guest command that ran: its exit code and standard output. A non-zero
/// exit code is a successful RPC (KubeVirt's `agent.ExecExitCode`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// The command's exit code.
    pub exit_code: i32,
    /// The command's standard output, as text.
    pub stdout: String,
}

/// A refused `RedefineCheckpoint`: the error and whether the checkpoint is unusable
/// (`checkpointInvalid`: virt-controller then forgets it and the next backup is full).
#[derive(Debug)]
pub struct CheckpointRefusal<E> {
    /// The checkpoint's bitmap is missing or broken everywhere.
    pub invalid: bool,
    /// Why.
    pub error: E,
}

/// The launcher behaviour behind the command server: KubeVirt's `virtwrap.DomainManager`, reduced to
/// the operations qlauncher implements. The orchestrator implements it; the server only decodes,
/// dispatches and encodes.
///
/// `Vmi` is the type the request's `vmiJson` is decoded into (a request whose JSON does not decode
/// is answered with [`INVALID_VMI_MESSAGE`] without calling the manager). An `Err` becomes
/// `success=false` with the error and its sources joined by `": "` as the message.
///
/// Calls arrive concurrently (virt-handler may sync while it reads the domain); serialising
/// domain changes (KubeVirt's `domainModifyLock`) is the manager's job.
pub trait DomainManager: Send + Sync + 'static {
    /// The VirtualMachineInstance type decoded from `VMI.vmiJson`.
    type Vmi: DeserializeOwned + Send + 'static;
    /// The manager's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// `SyncVirtualMachine`: define, start and reconcile the domain (KubeVirt `SyncVMI`).
    fn sync_vmi(
        &self,
        vmi: Self::Vmi,
        options: Option<VirtualMachineOptions>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `PauseVirtualMachine`: pause the vCPUs on user request.
    fn pause_vmi(&self, vmi: Self::Vmi) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `UnpauseVirtualMachine`: resume vCPUs paused on user request.
    fn unpause_vmi(&self, vmi: Self::Vmi) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `ResetVirtualMachine`: hard reset.
    fn reset_vmi(&self, vmi: Self::Vmi) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `SoftRebootVirtualMachine`: reboot through the guest agent, else the ACPI power button.
    fn soft_reboot_vmi(
        &self,
        vmi: Self::Vmi,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `ShutdownVirtualMachine`: signal a graceful (ACPI) shutdown (KubeVirt `SignalShutdownVMI`).
    fn shutdown_vmi(&self, vmi: Self::Vmi) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `KillVirtualMachine`: stop QEMU now.
    fn kill_vmi(&self, vmi: Self::Vmi) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `DeleteVirtualMachine`: forget the stopped domain.
    fn delete_vmi(&self, vmi: Self::Vmi) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `SyncVirtualMachineCPUs`: vCPU hotplug to the VMI's socket count (KubeVirt `UpdateVCPUs`).
    fn sync_vcpus(
        &self,
        vmi: Self::Vmi,
        options: Option<VirtualMachineOptions>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `SyncVirtualMachineMemory`: memory hotplug (KubeVirt `UpdateGuestMemory`).
    fn sync_memory(
        &self,
        vmi: Self::Vmi,
        options: Option<VirtualMachineOptions>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `GetDomain`: the current domain with the guest agent's OS info and interfaces merged into
    /// its status, as KubeVirt's `GetDomain` does; `None` when there is none (answered as an empty
    /// string, which virt-handler reads as "no domain").
    fn get_domain(&self) -> impl Future<Output = Result<Option<ApiDomain>, Self::Error>> + Send;
    /// `GetDomainStats`: KubeVirt's `stats.DomainStats` as a JSON value.
    fn get_domain_stats(
        &self,
    ) -> impl Future<Output = Result<serde_json::Value, Self::Error>> + Send;
    /// `GetQemuVersion`: the QEMU version string, e.g. `7.2.0`.
    fn qemu_version(&self) -> impl Future<Output = Result<String, Self::Error>> + Send;
    /// `GuestPing`: ping the guest agent of `domain_name` within `timeout`.
    fn guest_ping(
        &self,
        domain_name: String,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// `Exec`: run `command args...` in the guest through the agent within `timeout`.
    fn exec(
        &self,
        domain_name: String,
        command: String,
        args: Vec<String>,
        timeout: Duration,
    ) -> impl Future<Output = Result<ExecOutput, Self::Error>> + Send;

    // The RPCs below default to `None`: this manager does not implement them, answered
    // "<Rpc> is not supported by qlauncher".

    /// `MigrateVirtualMachine` (source): `vmi_json` is the request's VMI (its
    /// `status.migrationState` names the migration), `options` virt-handler's
    /// `cmdclient.MigrationOptions` JSON. Returns once the migration runs.
    fn migrate_vmi(
        self: std::sync::Arc<Self>,
        _vmi_json: Vec<u8>,
        _options: Vec<u8>,
    ) -> impl Future<Output = Option<Result<(), Self::Error>>> + Send {
        async { None }
    }
    /// `SyncMigrationTarget` (target): prepare the pod and wait for the source.
    fn sync_migration_target(
        self: std::sync::Arc<Self>,
        _vmi_json: Vec<u8>,
        _options: Option<VirtualMachineOptions>,
    ) -> impl Future<Output = Option<Result<(), Self::Error>>> + Send {
        async { None }
    }
    /// `CancelVirtualMachineMigration` (source).
    fn cancel_migration(
        self: std::sync::Arc<Self>,
        _vmi_json: Vec<u8>,
    ) -> impl Future<Output = Option<Result<(), Self::Error>>> + Send {
        async { None }
    }
    /// `SignalTargetPodCleanup` (target, after a failed migration).
    fn signal_target_pod_cleanup(
        self: std::sync::Arc<Self>,
        _vmi_json: Vec<u8>,
    ) -> impl Future<Output = Option<Result<(), Self::Error>>> + Send {
        async { None }
    }
    /// `FinalizeVirtualMachineMigration` (target, twice after a success).
    fn finalize_migration(
        self: std::sync::Arc<Self>,
        _vmi_json: Vec<u8>,
        _options: Option<VirtualMachineOptions>,
    ) -> impl Future<Output = Option<Result<(), Self::Error>>> + Send {
        async { None }
    }

    /// `FreezeVirtualMachine`: freeze the guest's file systems, thawing after `unfreeze_timeout`
    /// unless it is zero.
    fn freeze_vmi(
        &self,
        _vmi: Self::Vmi,
        _unfreeze_timeout: Duration,
    ) -> impl Future<Output = Option<Result<(), Self::Error>>> + Send {
        async { None }
    }
    /// `UnfreezeVirtualMachine`.
    fn unfreeze_vmi(
        &self,
        _vmi: Self::Vmi,
    ) -> impl Future<Output = Option<Result<(), Self::Error>>> + Send {
        async { None }
    }
    /// `GetGuestInfo`: the JSON of `VirtualMachineInstanceGuestAgentInfo`; always answers.
    fn guest_info(&self) -> impl Future<Output = Option<String>> + Send {
        async { None }
    }
    /// `GetUsers`: the JSON array of the guest's users; always answers.
    fn guest_users(&self) -> impl Future<Output = Option<String>> + Send {
        async { None }
    }
    /// `GetFilesystems`: the JSON array of the guest's file systems; always answers.
    fn guest_filesystems(&self) -> impl Future<Output = Option<String>> + Send {
        async { None }
    }
    /// `GetScreenshot`: MIME type and image bytes.
    fn screenshot(
        &self,
        _vmi: Self::Vmi,
    ) -> impl Future<Output = Option<Result<Screenshot, Self::Error>>> + Send {
        async { None }
    }
    /// `VirtualMachineMemoryDump` to `dump_path` (returns at once; progress in the metadata).
    fn memory_dump(
        &self,
        _vmi: Self::Vmi,
        _dump_path: String,
    ) -> impl Future<Output = Option<Result<(), Self::Error>>> + Send {
        async { None }
    }
    /// `GetDomainDirtyRateStats`: MB/s.
    fn dirty_rate(&self) -> impl Future<Output = Option<Result<i64, Self::Error>>> + Send {
        async { None }
    }
    /// `GetVMStats`; an `Err` is a gRPC error (the flag is off), in-band failures are in the
    /// response.
    fn vm_stats(
        &self,
        _request: cmd::VmStatsRequest,
    ) -> impl Future<Output = Option<Result<cmd::VmStatsResponse, Self::Error>>> + Send {
        async { None }
    }
    /// `HotplugHostDevices`: plug the VMI's SR-IOV VFs.
    fn hotplug_host_devices(
        &self,
        _vmi: Self::Vmi,
    ) -> impl Future<Output = Option<Result<(), Self::Error>>> + Send {
        async { None }
    }
    /// `BackupVirtualMachine` with `options`, the JSON of `backupv1.BackupOptions` (Start,
    /// Abort, Export; a Start returns once the backup jobs run, progress in the metadata).
    fn backup(
        &self,
        _vmi: Self::Vmi,
        _options: Vec<u8>,
    ) -> impl Future<Output = Option<Result<(), Self::Error>>> + Send {
        async { None }
    }
    /// `RedefineCheckpoint` with `checkpoint`, the JSON of `backupv1.BackupCheckpoint`; the
    /// error carries `checkpointInvalid`.
    fn redefine_checkpoint(
        &self,
        _vmi: Self::Vmi,
        _checkpoint: Vec<u8>,
    ) -> impl Future<Output = Option<Result<(), CheckpointRefusal<Self::Error>>>> + Send {
        async { None }
    }
    /// `GetSEVInfo`: the JSON of `SEVPlatformInfo`.
    fn sev_info(&self) -> impl Future<Output = Option<Result<Vec<u8>, Self::Error>>> + Send {
        async { None }
    }
    /// `GetLaunchMeasurement`: the JSON of `SEVMeasurementInfo`.
    fn launch_measurement(
        &self,
        _vmi: Self::Vmi,
    ) -> impl Future<Output = Option<Result<Vec<u8>, Self::Error>>> + Send {
        async { None }
    }
    /// `InjectLaunchSecret` with the JSON `options` (`SEVSecretOptions`).
    fn inject_launch_secret(
        &self,
        _vmi: Self::Vmi,
        _options: Vec<u8>,
    ) -> impl Future<Output = Option<Result<(), Self::Error>>> + Send {
        async { None }
    }
}
