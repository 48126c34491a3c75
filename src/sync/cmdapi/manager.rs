//! The [`SyncVmi`] side of these RPCs: each takes the domain's QMP client, guest agent and
//! [`CmdApiState`](super::CmdApiState), calls the part in this module's siblings, and records in
//! the domain what KubeVirt's domain shows (freeze state, memory-dump metadata, host devices).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::guest_info::AgentUpdate;
use super::{host_devices, screenshot, sev, vm_stats, CmdApiError};
use crate::sync::domain::{Alias, HostDevice, HostDeviceSource, PciAddress};
use crate::sync::proto::cmd::v1::{VmStatsRequest, VmStatsResponse};
use crate::sync::{SyncError, SyncVmi};
use crate::vmi::Vmi;

impl SyncVmi {
    /// `FreezeVirtualMachine` ([`super::freeze`]); no migration runs while qlauncher cannot
    /// migrate.
    pub(crate) async fn freeze(&self, unfreeze_timeout: Duration) -> Result<(), SyncError> {
        self.cmdapi
            .freezer
            .freeze(&self.info.agent, unfreeze_timeout, false)
            .await?;
        self.freeze_state("frozen");
        Ok(())
    }

    /// `UnfreezeVirtualMachine`.
    pub(crate) async fn unfreeze(&self) -> Result<(), SyncError> {
        self.cmdapi.freezer.unfreeze(&self.info.agent).await?;
        self.freeze_state("thawed");
        Ok(())
    }

    /// Records a freeze state learned from Freeze / Unfreeze in the store and the domain (the
    /// poller confirms it within 5 s; an auto-thaw is seen by the poller only).
    fn freeze_state(&self, status: &str) {
        if self.cmdapi.store.set_fsfreeze(status) {
            self.shared
                .apply_agent_update(AgentUpdate::FsFreeze(status.to_string()));
        }
    }

    /// `GetScreenshot`; QEMU writes the image next to its QMP socket (a directory it owns).
    pub(crate) async fn take_screenshot(&self) -> Result<screenshot::Screenshot, SyncError> {
        let client = self.client()?;
        let dir = self
            .config
            .qmp_socket
            .parent()
            .unwrap_or(Path::new("/tmp"))
            .to_path_buf();
        Ok(screenshot::take(&client, &dir).await?)
    }

    /// `VirtualMachineMemoryDump`: starts the dump; each metadata change goes into the domain
    /// with a MODIFIED event.
    pub(crate) fn start_memory_dump(&self, dump_path: &str) -> Result<(), SyncError> {
        let client = self.client()?;
        let shared = self.shared.clone();
        self.cmdapi.dumper.request(
            client,
            Path::new(dump_path),
            Arc::new(move |m| {
                // The guest is paused for the dump (domain reason Dump) until it completed.
                shared
                    .dumping
                    .store(!m.completed, std::sync::atomic::Ordering::SeqCst);
                shared.modify(|d| d.spec.metadata.kubevirt.memory_dump = Some(m));
            }),
        )?;
        Ok(())
    }

    /// `GetDomainDirtyRateStats`.
    pub(crate) async fn dirty_rate_mbs(&self) -> Result<i64, SyncError> {
        let client = self.client()?;
        Ok(self.cmdapi.dirty_rate.get(&client).await?)
    }

    /// `GetVMStats` ([`super::vm_stats`]).
    pub(crate) async fn collect_vm_stats(
        &self,
        request: VmStatsRequest,
    ) -> Result<VmStatsResponse, SyncError> {
        use crate::sync::server::DomainManager;
        if !self.config.vm_stats_collector {
            return Err(CmdApiError::Refused(vm_stats::VM_STATS_DISABLED.into()).into());
        }
        let mut parts = vm_stats::VmStatsParts::default();
        if request.domain_stats.is_some() {
            parts.domain_stats = Some(
                self.get_domain_stats()
                    .await
                    .map(|v| v.to_string())
                    .map_err(|e| e.to_string()),
            );
        }
        if request.dirty_rate.is_some() {
            parts.dirty_rate = Some(self.dirty_rate_mbs().await.map_err(|e| e.to_string()));
        }
        parts.agent_version = self.cmdapi.store.snapshot().version;
        for command in vm_stats::requested_agent_commands(&request) {
            let reply = self
                .cmdapi
                .agent_replies
                .get(&self.info.agent, command)
                .await;
            parts.agent.push((command, reply));
        }
        Ok(vm_stats::assemble(parts))
    }

    /// `HotplugHostDevices`: the VMI's SR-IOV interfaces that Multus reports and the domain lacks,
    /// plugged as VFIO devices; the domain then lists them as `sriov-<iface>` host devices.
    pub(crate) async fn hotplug_sriov(&self, vmi: &Vmi) -> Result<(), SyncError> {
        let multus: BTreeSet<String> = vmi
            .status
            .as_ref()
            .and_then(|s| s.interfaces.as_deref())
            .unwrap_or_default()
            .iter()
            .filter(|i| {
                i.info_source
                    .as_deref()
                    .is_some_and(|s| s.contains("multus-status"))
            })
            .filter_map(|i| i.name.clone())
            .collect();
        let desired: Vec<host_devices::SriovInterface> = vmi
            .spec
            .domain
            .devices
            .interfaces
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter(|i| i.sriov.is_some() && multus.contains(&i.name))
            .map(|i| host_devices::SriovInterface {
                name: i.name.clone(),
                boot_order: i.boot_order,
            })
            .collect();
        if desired.is_empty() {
            return Ok(());
        }
        let present: BTreeSet<String> = self
            .domain()
            .map(|d| {
                d.spec
                    .devices
                    .host_devices
                    .iter()
                    .filter_map(|h| h.alias.as_ref().map(|a| a.name.clone()))
                    .collect()
            })
            .unwrap_or_default();
        // An unreadable file is an empty pool: the plan names what is missing.
        let pool = std::fs::read_to_string(&self.config.network_info)
            .map(|s| host_devices::parse_network_info(&s))
            .unwrap_or_default();
        let client = self.client()?;
        let plugged = host_devices::hotplug_sriov(
            &client,
            &desired,
            &pool,
            &present,
            &self.config.sysfs,
            Path::new(&self.config.paths.dev),
        )
        .await?;
        if !plugged.is_empty() {
            self.shared.modify(|d| {
                for p in &plugged {
                    d.spec.devices.host_devices.push(HostDevice {
                        device_type: "pci".into(),
                        managed: "no".into(),
                        source: HostDeviceSource {
                            address: PciAddress::parse(&p.host),
                        },
                        alias: Some(Alias {
                            name: p.alias(),
                            user_defined: true,
                        }),
                    });
                }
            });
        }
        Ok(())
    }

    fn sev_device(&self) -> std::path::PathBuf {
        Path::new(&self.config.paths.dev).join("sev")
    }

    /// `GetSEVInfo`: refused without `/dev/sev`, else QEMU's platform certificates.
    pub(crate) async fn sev_platform_info(&self) -> Result<Vec<u8>, SyncError> {
        sev::check_device(&self.sev_device())?;
        let client = self.client()?;
        Ok(sev::platform_info(&client).await?)
    }

    /// `GetLaunchMeasurement`.
    pub(crate) async fn sev_launch_measurement(&self) -> Result<Vec<u8>, SyncError> {
        sev::check_device(&self.sev_device())?;
        let client = self.client()?;
        let loader = self.config.ovmf_dir.join(sev::SEV_OVMF_CODE);
        Ok(sev::launch_measurement(&client, &loader).await?)
    }

    /// `InjectLaunchSecret` with the request's options JSON.
    pub(crate) async fn sev_inject_secret(&self, options: &[u8]) -> Result<(), SyncError> {
        let options = sev::secret_options(options)?;
        sev::check_device(&self.sev_device())?;
        let client = self.client()?;
        Ok(sev::inject_secret(&client, &options).await?)
    }
}
