//! The one gathering: the converter's context and input for a VMI, and its plan, for each
//! purpose the orchestrator converts (KubeVirt's `generateConverterContext` followed by
//! `Convert_v1_VirtualMachineInstance_To_api_Domain`, `manager.go`, v1.9.0).
//!
//! - [`Purpose::Boot`], the first sync and a migration target: the launcher's settings and
//!   QEMU's version, storage (overlays, empty disks, ISOs, claims), the pod network and its DHCP
//!   servers, the secondary (Multus) interfaces bound at boot, host hardware, vhost-vsock.
//! - [`Purpose::Resync`], a later sync: the running domain's facts, with the secondary
//!   interfaces that became ready bound for plugging.
//! - [`Purpose::Resources`], the vCPU and memory RPCs: the running domain's facts, interfaces not
//!   plugged yet left pending.
//!
//! Every purpose adds the hotplug volumes ([`hotplug::add_hotplug_facts`]) and converts the VMI
//! as the converter sees it ([`secondary::convert_view`]).

use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{hardware, hotplug, network, secondary, storage};
use crate::cmdline::context::{IfaceFacts, MonitorSocket, TapSource};
use crate::cmdline::{convert, ConverterContext, DomainPlan};
use crate::sync::config::SyncConfig;
use crate::sync::error::SyncError;
use crate::sync::reconcile::nics::NicState;
use crate::sys::mac::MacAddr;
use crate::vmi::Vmi;

/// The fd QEMU inherits its QMP monitor's listening socket as (`-chardev socket,fd=3`).
pub const QMP_FD: i32 = 3;

/// Why the VMI is converted (see the module doc).
pub(crate) enum Purpose<'a> {
    /// The first sync or a migration target: everything gathered anew; what only a boot
    /// yields goes into the [`BootFacts`].
    Boot(&'a mut BootFacts),
    /// A later sync against the running domain's context `running`; `nics` binds the secondary
    /// interfaces that became ready.
    Resync {
        /// The running domain's converter context.
        running: &'a ConverterContext,
        /// The running domain's NICs.
        nics: &'a mut NicState,
    },
    /// A vCPU or memory RPC against the running domain's context `running`.
    Resources {
        /// The running domain's converter context.
        running: &'a ConverterContext,
    },
}

/// What only a boot gathers besides the context; made when the boot begins.
pub(crate) struct BootFacts {
    /// The VMI interfaces bound, with the guest MAC of each (pod network first, then the
    /// secondary interfaces), for the `api.Domain`.
    pub(crate) interfaces: Vec<(String, String)>,
    /// The secondary NICs bound at boot.
    pub(crate) nics: NicState,
    /// The vhost-vsock fd QEMU inherits.
    pub(crate) vsock: Option<std::os::fd::OwnedFd>,
    /// Stops the DHCP servers (sending `true`, or dropped).
    pub(crate) dhcp_stop: watch::Sender<bool>,
    /// When the boot began.
    pub(crate) t0: Instant,
    /// Waiting for QEMU's version (the record read at launcher start, or the `qemu --version`
    /// probe started with the launcher).
    pub(crate) t_probe: Duration,
    /// Where the version came from: `record`, `probe` or `configured` (no probe configured).
    pub(crate) version_source: &'static str,
    /// Storage done (since `t0`).
    pub(crate) t_storage: Duration,
    /// Network done (since `t0`).
    pub(crate) t_network: Duration,
}

impl Default for BootFacts {
    fn default() -> BootFacts {
        BootFacts {
            interfaces: Vec::new(),
            nics: NicState::default(),
            vsock: None,
            dhcp_stop: watch::channel(false).0,
            t0: Instant::now(),
            t_probe: Duration::ZERO,
            version_source: "configured",
            t_storage: Duration::ZERO,
            t_network: Duration::ZERO,
        }
    }
}

/// The converter's context and input, and the plan.
pub(crate) struct Gathered {
    /// The converter context.
    pub(crate) ctx: ConverterContext,
    /// The VMI as the converter saw it (secondary interfaces not ready left out).
    pub(crate) view: Vmi,
    /// The VMI's secondary (Multus) interfaces.
    pub(crate) secondary: Vec<secondary::SecondaryIface>,
    /// The converted plan.
    pub(crate) plan: DomainPlan,
}

/// Gathers the facts of `vmi` (admitted) for `purpose` and converts it.
///
/// # Errors
/// [`SyncError::Storage`], [`SyncError::Net`], [`SyncError::InvalidField`],
/// [`SyncError::PrepareQemu`] (vhost-vsock) from the gathering; [`SyncError::Convert`].
pub(crate) async fn gather(
    config: &SyncConfig,
    vmi: &Vmi,
    purpose: Purpose<'_>,
) -> Result<Gathered, SyncError> {
    let (mut ctx, secondary, converted_as) = match purpose {
        Purpose::Boot(boot) => {
            let (ctx, secondary) = boot_context(config, vmi, boot).await?;
            let converted_as = secondary.clone();
            (ctx, secondary, converted_as)
        }
        Purpose::Resync { running, nics } => {
            let mut ctx = running.clone();
            let secondary = secondary::secondary_ifaces(vmi, config.runtime_uid)?;
            nics.prepare(&secondary, &mut ctx, &config.resolv_conf)
                .await?;
            let converted_as = secondary.clone();
            (ctx, secondary, converted_as)
        }
        Purpose::Resources { running } => {
            let ctx = running.clone();
            let secondary = secondary::secondary_ifaces(vmi, config.runtime_uid)?;
            // Interfaces the running domain does not have yet are not plugged by these RPCs.
            let pending = secondary
                .iter()
                .filter(|s| !ctx.interfaces.contains_key(&s.name))
                .map(|s| secondary::SecondaryIface {
                    ready: false,
                    ..s.clone()
                })
                .collect();
            (ctx, secondary, pending)
        }
    };
    let owner = (config.runtime_uid != 0).then_some(crate::storage::Owner::QEMU);
    hotplug::add_hotplug_facts(vmi, &mut ctx, owner)?;
    let view = secondary::convert_view(vmi, &converted_as);
    let plan = convert(&view, &ctx).map_err(SyncError::Convert)?;
    Ok(Gathered {
        ctx,
        view,
        secondary,
        plan,
    })
}

/// The context of a boot: settings, QEMU's version, storage, pod network, secondary interfaces,
/// host hardware and vhost-vsock; returns it with the secondary interfaces.
async fn boot_context(
    config: &SyncConfig,
    vmi: &Vmi,
    boot: &mut BootFacts,
) -> Result<(ConverterContext, Vec<secondary::SecondaryIface>), SyncError> {
    let t0 = boot.t0;
    let mut ctx = super::base_context(config);
    ctx.monitor = MonitorSocket::Fd(QMP_FD);
    if let Some(probe) = &config.qemu_probe {
        let (answer, source) = probe.answer_with_source().await;
        boot.version_source = source.as_str();
        if let Some((version, _)) = answer {
            ctx.qemu = version;
        }
    }
    // The version record read at launcher start, or the `qemu --version` probe started with
    // the launcher: waiting for it is on this path.
    boot.t_probe = t0.elapsed();
    // Storage (blocking file work on a blocking thread).
    let storage_vmi = vmi.clone();
    let paths = config.paths.clone();
    let owner = (config.runtime_uid != 0).then_some(crate::storage::Owner::QEMU);
    // `--image-volume`: the containerDisks' `disk_<i>.img` are linked into the image volumes
    // first (KubeVirt's SyncVMI and migration target do so before converting).
    let image_volume = config.image_volume.clone();
    let hooks = config.hooks.clone();
    ctx.volumes = tokio::task::spawn_blocking(move || {
        if let Some(dirs) = &image_volume {
            storage::link_image_volumes(&storage_vmi, dirs, &paths)?;
        }
        storage::prepare_storage(&storage_vmi, &paths, owner, &hooks)
    })
    .await
    .map_err(|e| SyncError::Task(e.to_string()))??;
    boot.t_storage = t0.elapsed();

    // Network, in this (the pod's) network namespace.
    let dhcp_rx = boot.dhcp_stop.subscribe();
    for (iface, cfg) in network::net_configs(vmi, config.runtime_uid)? {
        let plan = network::setup_network(&config.resolv_conf, &cfg, dhcp_rx.clone()).await?;
        let mac = MacAddr(plan.guest_mac).to_string();
        boot.interfaces.push((iface.clone(), mac.clone()));
        ctx.interfaces.insert(
            iface,
            IfaceFacts {
                mac: Some(mac),
                mtu: Some(plan.mtu),
                tap: TapSource::Ifname(plan.tap.clone()),
            },
        );
    }
    let secondary = secondary::secondary_ifaces(vmi, config.runtime_uid)?;
    for (iface, mac, facts) in boot
        .nics
        .setup_at_boot(&secondary, &config.resolv_conf)
        .await?
    {
        boot.interfaces.push((iface.clone(), mac));
        ctx.interfaces.insert(iface, facts);
    }
    boot.t_network = t0.elapsed();

    hardware::add_hardware_facts(vmi, &mut ctx);
    boot.vsock = hardware::open_vhost_vsock(vmi, &config.vhost_vsock)?;
    if boot.vsock.is_some() {
        ctx.vsock_fd = Some(hardware::VSOCK_FD);
    }
    Ok((ctx, secondary))
}
