//! Applying a sync's diff to the running domain, KubeVirt's `SyncVMI` on a running domain
//! (`manager.go`, v1.9.0). The VMI is converted again against the running domain's facts and the
//! new plan (`define.rs`: argv, QMP plan) compared with what runs. Each reconciler has a step
//! type, a pure `diff` of its running side against the wanted one with table tests beside it, and
//! an executor that runs the steps; they run in the order of [`RECONCILERS`]:
//!
//! 1. [`disks`]: hot-pluggable disks attached and detached ([`disks::DiskStep`]: `Running`'s
//!    disks against the QMP plan's; `disks::apply`);
//! 2. [`media`]: cdrom media inserted, changed, ejected ([`media::MediumChange`]: `Running`'s
//!    cdroms against the plan's; `media::apply`);
//! 3. [`resize`]: claim-backed disks grown ([`resize::ResizeStep`]: QEMU's `query-block` drives
//!    against the plan's claim disks; [`resize::grow_disks`]);
//! 4. [`nics`]: NICs on Multus networks plugged and unplugged, link states set
//!    ([`nics::NicStep`]: the [`nics::NicState`] view against the plan's;
//!    [`nics::NicState::apply`]).
//!
//! vCPUs and memory change through their own RPCs ([`resources`]: `diff_vcpus`, `diff_memory`).
//! Any other change of the spec is neither applied to the running domain nor logged; the domain's
//! next start runs it. A sync whose `SpecKey` (`admit.rs`) is unchanged does nothing but log
//! "domain is up to date".
//!
//! To add a sync diff: see ARCHITECTURE.md's recipe ("Add a sync diff").

pub mod disks;
pub mod media;
pub mod nics;
pub mod resize;
pub mod resources;

use crate::sync::admit::admit;
use crate::sync::config::HOTPLUG_TIMEOUT;
use crate::sync::ctx::DomainCtx;
use crate::sync::define::{define, Defined};
use crate::sync::domain_live;
use crate::sync::error::SyncError;
use crate::sync::facts::gather::{gather, Gathered, Purpose};
use crate::sync::state::Running;
use crate::vmi::Vmi;

/// One reconciler of a sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciler {
    /// [`disks`].
    Disks,
    /// [`media`].
    Media,
    /// [`resize`].
    Resize,
    /// [`nics`].
    Nics,
}

/// Every reconciler of a sync, in the order they run (as the converter's `CONFIGURATORS`): disks
/// leave and join, media change, claims grow, then NICs take the free root ports the disks left.
pub const RECONCILERS: [Reconciler; 4] = [
    Reconciler::Disks,
    Reconciler::Media,
    Reconciler::Resize,
    Reconciler::Nics,
];

/// Applies the difference between the running domain and `vmi` (see the module doc).
pub(crate) async fn hotplug(
    d: &DomainCtx,
    running: &mut Running,
    vmi: &Vmi,
) -> Result<(), SyncError> {
    let client = d.client()?;
    let Gathered {
        ctx,
        view,
        secondary,
        plan,
    } = gather(
        &d.config,
        vmi,
        Purpose::Resync {
            running: &running.ctx,
            nics: &mut running.nics,
        },
    )
    .await?;
    let Defined { plan, qmp_plan, .. } = define(d, plan, &running.hook_edits);
    let mut nics = nics::NicChanges::default();
    for reconciler in RECONCILERS {
        match reconciler {
            Reconciler::Disks => disks::apply(&client, running, &qmp_plan.disks).await?,
            Reconciler::Media => media::apply(&client, running, &plan).await?,
            Reconciler::Resize => resize::grow_disks(&client, vmi, &plan).await,
            Reconciler::Nics => {
                nics = running
                    .nics
                    .apply(&client, &plan, &qmp_plan.nics, &secondary, HOTPLUG_TIMEOUT)
                    .await?;
            }
        }
    }
    // The domain as it now runs: hotplugged disks and NICs with their targets and aliases.
    domain_live::report_hotplug(&d.shared, &client, &view, &ctx, &plan).await?;
    running.ctx = ctx;
    d.shared.publish_nic_changes(&nics);
    Ok(())
}

/// SyncVirtualMachineCPUs: plugs or unplugs vCPUs of the running domain `r` until it has as
/// many as `vmi` asks (down to the first socket), then shows them enabled in the domain
/// (`VCPUs`), as libvirt's live XML does. An unplug on a QEMU that would crash after it
/// ([`resources::tcg_unplug_crashes`]) is refused, naming the QEMU version.
pub(crate) async fn apply_vcpus(d: &DomainCtx, r: &Running, vmi: Vmi) -> Result<(), SyncError> {
    let plan = resource_plan(d, r, vmi).await?;
    let client = d.client()?;
    let version = client
        .run(&crate::qmp::commands::QueryVersion)
        .await
        .map_err(SyncError::Qmp)?
        .qemu;
    let v = (version.major, version.minor, version.micro);
    let hazard = resources::tcg_unplug_crashes(r.ctx.kvm, v);
    let refused = (hazard && !d.config.allow_unsafe_tcg_vcpu_unplug).then(|| {
        format!(
            "unplugging vCPUs is refused under TCG (no KVM) on QEMU {}.{}.{}: before QEMU 10.2 \
             (10.0.5 in the 10.0 series) an unplugged vCPU stays registered for memory updates \
             and QEMU aborts at the next device hotplug (QEMU issue 2517)",
            v.0, v.1, v.2
        )
    });
    resources::set_vcpus(&client, plan.smp.cpus, refused, HOTPLUG_TIMEOUT).await?;
    let enabled = plan.smp.cpus;
    d.shared
        .update_domain(|dom| dom.spec.set_vcpus_enabled(enabled));
    Ok(())
}

/// SyncVirtualMachineMemory: sizes the virtio-mem device of the running domain `r` to the
/// memory `vmi` asks for.
pub(crate) async fn apply_memory(
    d: &DomainCtx,
    r: &mut Running,
    vmi: Vmi,
) -> Result<(), SyncError> {
    let plan = resource_plan(d, r, vmi).await?;
    let client = d.client()?;
    r.memory = resources::set_memory(&client, &r.memory, &plan, plan.memory.size).await?;
    // The virtio-mem device as it runs, in the domain (libvirt's live `<memory
    // model='virtio-mem'>`).
    if let Some(device) = resources::virtio_mem_device(&client, &r.memory).await {
        d.shared
            .update_domain(|dom| dom.spec.devices.set_memory_device(device));
    }
    Ok(())
}

/// The converter's plan of `vmi` (defaults applied, validated) against the running domain's
/// facts: the vCPU and memory sizes a CPU or memory sync aims at.
async fn resource_plan(
    d: &DomainCtx,
    running: &Running,
    vmi: Vmi,
) -> Result<crate::cmdline::DomainPlan, SyncError> {
    let vmi = admit(vmi, Some(&running.firmware_uuid))?.vmi;
    let purpose = Purpose::Resources {
        running: &running.ctx,
    };
    Ok(gather(&d.config, &vmi, purpose).await?.plan)
}
