//! These RPCs over the domain context ([`DomainCtx`]): each takes the domain's QMP client, guest
//! agent and [`CmdApiState`](super::CmdApiState), calls the part in this module's siblings, and
//! records in the domain what KubeVirt's domain shows (freeze state, memory-dump metadata, host
//! devices). The dispatcher (`manager_impl.rs`) calls them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::guest_info::AgentUpdate;
use super::{freeze, host_devices, screenshot, sev, vm_stats, CmdApiError};
use crate::sync::ctx::DomainCtx;
use crate::sync::domain::{Alias, HostDevice, HostDeviceSource, PciAddress};
use crate::sync::error::SyncError;
use crate::sync::rpc::proto::cmd::v1::{VmStatsRequest, VmStatsResponse};
use crate::sync::state::Job;
use crate::sync::state::Running;
use crate::vmi::Vmi;

/// The VMI's interfaces with the `sriov` binding that virt-handler sees in Multus's status
/// (`infoSource` holds `multus-status`), KubeVirt's `sriov.CreateHostDevices` selection.
fn sriov_interfaces(vmi: &Vmi) -> Vec<host_devices::SriovInterface> {
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
    vmi.spec
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
        .collect()
}

/// `FreezeVirtualMachine` ([`super::freeze`]); refused while the domain's migration
/// metadata says a migration runs (KubeVirt's `StorageManager.MigrationInProgress`).
/// `UnfreezeVirtualMachine` has no such check, in KubeVirt either.
pub(crate) async fn freeze(d: &DomainCtx, unfreeze_timeout: Duration) -> Result<(), SyncError> {
    let migrating = d.domain().is_some_and(|domain| {
        freeze::migration_in_progress(domain.spec.metadata.kubevirt.migration.as_ref())
    });
    d.cmdapi
        .freezer
        .freeze(&d.info.agent, unfreeze_timeout, migrating)
        .await?;
    freeze_state(d, "frozen");
    Ok(())
}

/// `UnfreezeVirtualMachine`.
pub(crate) async fn unfreeze(d: &DomainCtx) -> Result<(), SyncError> {
    d.cmdapi.freezer.unfreeze(&d.info.agent).await?;
    freeze_state(d, "thawed");
    Ok(())
}

/// Records a freeze state learned from Freeze / Unfreeze in the store and the domain (the
/// poller confirms it within 5 s; an auto-thaw is seen by the poller only).
fn freeze_state(d: &DomainCtx, status: &str) {
    if d.cmdapi.store.set_fsfreeze(status) {
        d.shared
            .apply_agent_update(AgentUpdate::FsFreeze(status.to_string()));
    }
}

/// `GetScreenshot`; QEMU writes the image next to its QMP socket (a directory it owns).
pub(crate) async fn take_screenshot(
    d: &DomainCtx,
) -> Result<crate::sync::rpc::manager::Screenshot, SyncError> {
    let client = d.client()?;
    let dir = d
        .config
        .qmp_socket
        .parent()
        .unwrap_or(Path::new("/tmp"))
        .to_path_buf();
    Ok(screenshot::take(&client, &dir).await?)
}

/// `VirtualMachineMemoryDump`: starts the dump; each metadata change goes into the domain
/// with a MODIFIED event.
pub(crate) fn start_memory_dump(d: &DomainCtx, dump_path: &str) -> Result<(), SyncError> {
    let client = d.client()?;
    let shared = d.shared.clone();
    d.cmdapi.dumper.request(
        client,
        Path::new(dump_path),
        Arc::new(move |m| {
            // The guest is paused for the dump (domain reason Dump) until it completed.
            if m.completed {
                shared.end(Job::Dumping);
            } else {
                shared.begin(Job::Dumping);
            }
            shared.modify(|d| d.spec.metadata.kubevirt.memory_dump = Some(m));
        }),
    )?;
    Ok(())
}

/// `GetDomainDirtyRateStats`.
pub(crate) async fn dirty_rate_mbs(d: &DomainCtx) -> Result<i64, SyncError> {
    let client = d.client()?;
    Ok(d.cmdapi.dirty_rate.get(&client).await?)
}

/// `GetVMStats` ([`super::vm_stats`]).
pub(crate) async fn collect_vm_stats(
    d: &DomainCtx,
    request: VmStatsRequest,
    domain_stats: impl std::future::Future<Output = Result<serde_json::Value, SyncError>>,
) -> Result<VmStatsResponse, SyncError> {
    if !d.config.vm_stats_collector {
        return Err(CmdApiError::Refused(vm_stats::VM_STATS_DISABLED.into()).into());
    }
    let mut parts = vm_stats::VmStatsParts::default();
    if request.domain_stats.is_some() {
        parts.domain_stats = Some(
            domain_stats
                .await
                .map(|v| v.to_string())
                .map_err(|e| e.to_string()),
        );
    }
    if request.dirty_rate.is_some() {
        parts.dirty_rate = Some(dirty_rate_mbs(d).await.map_err(|e| e.to_string()));
    }
    parts.agent_version = d.cmdapi.store.snapshot().version;
    for command in vm_stats::requested_agent_commands(&request) {
        let reply = d.cmdapi.agent_replies.get(&d.info.agent, command).await;
        parts.agent.push((command, reply));
    }
    Ok(vm_stats::assemble(parts))
}

/// `HotplugHostDevices`: the VMI's SR-IOV interfaces that Multus reports and the domain lacks,
/// plugged as VFIO devices; the domain then lists them as `sriov-<iface>` host devices. VFs
/// QEMU already runs ([`host_devices::plugged_sriov`]: those of its command line) are listed
/// and not plugged again. After a migration the target has none (the source unplugged them,
/// [`crate::sync::migration::sriov`]) and plugs the target pod's VFs from its network-info.
/// Answers at once and plugs in the background under the domain-modify lock (the sync
/// lock), one hotplug at a time; only a call while one runs is refused
/// ([`host_devices::HotplugRunner`], KubeVirt's `HotplugHostDevices`).
pub(crate) async fn hotplug_sriov(
    d: &DomainCtx,
    modify: Arc<tokio::sync::Mutex<Option<Running>>>,
    vmi: &Vmi,
) -> Result<(), SyncError> {
    let desired = sriov_interfaces(vmi);
    let shared = d.shared.clone();
    let network_info = d.config.network_info.clone();
    let sysfs = d.config.sysfs.clone();
    let dev = PathBuf::from(&d.config.paths.dev);
    d.cmdapi.hotplug.start(async move {
        let _modify = modify.lock().await;
        let client = shared
            .client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| CmdApiError::Refused(SyncError::NoDomain.to_string()))?;
        if desired.is_empty() {
            return Ok(Vec::new());
        }
        let mut present: BTreeSet<String> = shared
            .domain
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|d| {
                d.spec
                    .devices
                    .host_devices
                    .iter()
                    .filter_map(|h| h.alias.as_ref().map(|a| a.name.clone()))
                    .collect()
            })
            .unwrap_or_default();
        // VFs QEMU already runs (from its command line) that the domain does not list yet:
        // listed now, not plugged twice.
        let running: Vec<host_devices::HostDevicePlug> = host_devices::plugged_sriov(&client)
            .await?
            .into_iter()
            .filter(|p| !present.contains(&p.alias()))
            .collect();
        present.extend(running.iter().map(host_devices::HostDevicePlug::alias));
        // An unreadable file is an empty pool: the plan names what is missing.
        let pool = std::fs::read_to_string(&network_info)
            .map(|s| host_devices::parse_network_info(&s))
            .unwrap_or_default();
        let plugged =
            host_devices::hotplug_sriov(&client, &desired, &pool, &present, &sysfs, &dev).await;
        let listed: Vec<&host_devices::HostDevicePlug> = running
            .iter()
            .chain(plugged.as_deref().unwrap_or_default())
            .collect();
        if !listed.is_empty() {
            shared.modify(|d| {
                for p in listed {
                    d.spec.devices.host_devices.push(HostDevice {
                        device_type: "pci".into(),
                        managed: "no".into(),
                        mode: "subsystem".into(),
                        source: HostDeviceSource {
                            address: PciAddress::parse(&p.host),
                        },
                        alias: Some(Alias {
                            name: p.alias(),
                            user_defined: true,
                        }),
                        ..Default::default()
                    });
                }
            });
        }
        plugged
    })?;
    Ok(())
}

fn sev_device(d: &DomainCtx) -> std::path::PathBuf {
    Path::new(&d.config.paths.dev).join("sev")
}

/// `GetSEVInfo`, a node query as in KubeVirt (no domain needed): the platform certificates
/// from the domain's QEMU, or before a domain exists from a probe QEMU
/// ([`sev::probe_platform_info`]). Without `/dev/sev`, or when QEMU refuses, libvirt's
/// refusal [`sev::NO_SEV_GUEST`] (libvirt serves this from the capabilities its probe found:
/// any failure there means "QEMU does not support SEV guest").
pub(crate) async fn sev_platform_info(d: &DomainCtx) -> Result<Vec<u8>, SyncError> {
    if sev::check_device(&sev_device(d)).is_err() {
        return Err(CmdApiError::Refused(sev::NO_SEV_GUEST.into()).into());
    }
    let mut cache = d.cmdapi.sev_platform.lock().await;
    if let Some(info) = cache.as_ref() {
        return Ok(info.clone());
    }
    let answer = match d.client() {
        Ok(client) => sev::platform_info(&client).await,
        Err(_) => {
            let dir = d.config.qmp_socket.parent().unwrap_or(Path::new("/tmp"));
            if let Err(source) = std::fs::create_dir_all(dir) {
                return Err(CmdApiError::Io {
                    what: format!("create {}", dir.display()),
                    source,
                }
                .into());
            }
            sev::probe_platform_info(&d.config.qemu, &dir.join("sev.sock")).await
        }
    };
    if let Ok(info) = &answer {
        *cache = Some(info.clone());
    }
    answer.map_err(|e| {
        tracing::warn!(error = %e, "query-sev-capabilities failed: the node cannot run SEV guests");
        CmdApiError::Refused(sev::NO_SEV_GUEST.into()).into()
    })
}

/// `GetLaunchMeasurement` of `vmi`'s domain: QEMU's measurement when the VMI asks for SEV
/// (`spec.domain.launchSecurity.sev`), only the loader's hash otherwise, as libvirt reports no
/// launch-security parameters for a domain without SEV ([`sev::launch_measurement`]).
pub(crate) async fn sev_launch_measurement(
    d: &DomainCtx,
    vmi: &crate::vmi::Vmi,
) -> Result<Vec<u8>, SyncError> {
    let client = d.client()?;
    // KubeVirt's EFI environment keeps the path only when the file exists
    // (`efi.DetectEFIEnvironment`); else it opens "" (`open : no such file or directory`).
    let loader = Some(d.config.ovmf_dir.join(sev::SEV_OVMF_CODE))
        .filter(|p| p.exists())
        .unwrap_or_default();
    Ok(sev::launch_measurement(&client, is_sev(vmi), &loader).await?)
}

/// `InjectLaunchSecret` with the request's options JSON: KubeVirt's option checks first, then
/// libvirt's refusal on a domain without SEV ([`sev::SECRET_NEEDS_SEV`]), then QEMU.
pub(crate) async fn sev_inject_secret(
    d: &DomainCtx,
    vmi: &crate::vmi::Vmi,
    options: &[u8],
) -> Result<(), SyncError> {
    let options = sev::secret_options(options)?;
    let client = d.client()?;
    if !is_sev(vmi) {
        return Err(CmdApiError::Refused(sev::SECRET_NEEDS_SEV.into()).into());
    }
    Ok(sev::inject_secret(&client, &options).await?)
}

/// Whether `vmi` runs as an AMD SEV guest (`spec.domain.launchSecurity.sev`; SEV-SNP and TDX
/// are other launch-security types to libvirt).
fn is_sev(vmi: &crate::vmi::Vmi) -> bool {
    vmi.spec
        .domain
        .launch_security
        .as_ref()
        .is_some_and(|l| l.sev.is_some())
}
