//! The target's QEMU definition for the source's running domain: the prepared boot conversion,
//! or, when the source hot-plugged devices, the VMI converted again without them and those
//! devices placed as the source runs them; the source's CPU and hook edits adopted; the whole
//! refused unless its
//! argv is the source's word for word (libvirt compares the migrated XML's ABI the same way,
//! `virDomainDefCheckABIStability`).

use qlauncher_libvirt_xml::hooks::HookEdit;
use tracing::info;

use crate::cmdline::context::TapSource;
use crate::cmdline::plan::{CpuPlan, DomainPlan};
use crate::cmdline::render::{qmp_plan, DiskHotplug, NicHotplug};
use crate::sync::ctx::DomainCtx;
use crate::sync::define::{define, Defined};
use crate::sync::domain::ApiDomain;
use crate::sync::migration::hotplug;
use crate::sync::migration::launcher::{normalized, PreparedTarget};
use crate::sync::migration::protocol::{HotplugKind, HotpluggedDevice, RunningDomain};
use crate::sync::migration::sriov;
use crate::sync::migration::target::incoming_argv;
use crate::sync::migration::MigrationError;
use crate::sync::state::Running;

/// The target's QEMU definition for one incoming migration ([`boot_conversion`]).
pub(super) struct BootConversion {
    /// QEMU's argv (with `-S`, without `-incoming`): what the source's QEMU started with.
    pub(super) argv: Vec<String>,
    /// The source's hot-plugged disks, placed as the source runs them, attached before
    /// `migrate-incoming`.
    pub(super) placed: Vec<DiskHotplug>,
    /// The plan `argv` renders, when it differs from the prepared one (hot-plugged devices).
    pub(super) plan: Option<DomainPlan>,
    /// The source's hot-plugged NICs, on this pod's taps, placed as the source runs them,
    /// plugged before `migrate-incoming`.
    pub(super) nics: Vec<NicHotplug>,
    /// The CPU adopted from the source's definition ([`RunningDomain::cpu`]), which `argv`
    /// renders instead of the prepared plan's.
    pub(super) cpu: Option<CpuPlan>,
    /// The source's hook edits ([`RunningDomain::hooked`]), which every later definition here
    /// applies.
    pub(super) edits: Vec<HookEdit>,
    /// When the source's hook edits are not those of this pod's own sidecars: the full plan
    /// defined with the source's edits and its `api.Domain`, which replace the prepared ones.
    pub(super) redefined: Option<(Defined, ApiDomain)>,
}

/// The source's hook edits ([`RunningDomain::hooked`]), taken from its hooked domain with the
/// checks a sidecar's answer gets; none when no hook edited the source's domain.
///
/// Errors: [`MigrationError::Peer`] with the refusal (a peer sent a change no hook may make).
fn source_hook_edits(domain: &RunningDomain) -> Result<Vec<HookEdit>, MigrationError> {
    match &domain.hooked {
        None => Ok(Vec::new()),
        Some(h) => h
            .edits()
            .map_err(|r| MigrationError::Peer(format!("the source's hook edits are refused: {r}"))),
    }
}

/// The prepared (full) plan defined again with the source's hook `edits`, and its `api.Domain`,
/// when they are not the edits the target's own sidecars gave at preparation (whose answers a
/// target only calls for their side effects, as KubeVirt's does); `None` when they are.
fn redefine_with_source_edits(
    d: &DomainCtx,
    target: &PreparedTarget,
    edits: &[HookEdit],
) -> Result<Option<(Defined, ApiDomain)>, MigrationError> {
    if edits == target.prepared.running.hook_edits.as_slice() {
        return Ok(None);
    }
    let ctx = &target.prepared.running.ctx;
    let plan = crate::cmdline::convert(&target.view, ctx)
        .map_err(|e| MigrationError::Peer(format!("cannot convert the VMI again: {e}")))?;
    let defined = define(d, plan, edits);
    let mut domain = target.prepared.domain.clone();
    defined
        .report(&mut domain, &target.view, ctx)
        .map_err(|e| MigrationError::Peer(format!("cannot report the hooked domain: {e}")))?;
    info!(
        edits = edits.len(),
        "the source's hook edits replace this pod's sidecars' edits"
    );
    Ok(Some((defined, domain)))
}

/// `argv` with the value of its `-cpu` replaced by that of `ours` (when both have one): the
/// source's argv as the target compares it once the CPU comes from the source's definition, which
/// carries (and `enforce`s) the CPU identity itself. The source may run `-cpu max` or `host`
/// (host-model at its start) or an adopted `base,...` (an earlier migration).
fn with_cpu_of(argv: &[String], ours: &[String]) -> Vec<String> {
    let cpu = |a: &[String]| a.iter().position(|w| w == "-cpu").map(|i| i + 1);
    let mut out = argv.to_vec();
    if let (Some(i), Some(j)) = (cpu(argv), cpu(ours)) {
        if let (Some(w), Some(v)) = (out.get_mut(i), ours.get(j)) {
            w.clone_from(v);
        }
    }
    out
}

/// Checks this target's normalized argv `local` word for word against the source's
/// ([`incoming_argv`]); when the source sent a CPU definition, its `-cpu` is compared as the
/// adopted one ([`with_cpu_of`], see `adopt_source_cpu`), which the definition itself enforces.
fn matches_source(local: &[String], domain: &RunningDomain) -> Result<Vec<String>, MigrationError> {
    if domain.cpu.is_none() {
        return incoming_argv(local, domain);
    }
    let mut compared = domain.clone();
    compared.argv = with_cpu_of(&compared.argv, local);
    incoming_argv(local, &compared)
}

/// What runs once the target boots a plan of its own (the source had hot-plugged devices):
/// the boot plan's disks and media, then the source's hot-plugged disks (`placed`), and the
/// next free node index after them all.
pub(super) fn run_boot_plan(running: &mut Running, plan: &DomainPlan, placed: &[DiskHotplug]) {
    let mut disks: std::collections::BTreeMap<String, DiskHotplug> = qmp_plan(plan)
        .disks
        .into_iter()
        .map(|d| (d.id.clone(), d))
        .collect();
    for d in placed {
        disks.insert(d.id.clone(), d.clone());
    }
    running.next_node =
        hotplug::next_node_after(&disks, crate::sync::reconcile::disks::next_node_index(plan));
    running.disks = disks;
    running.cdroms = crate::sync::reconcile::media::cdroms(plan);
}

/// The argv the target's QEMU starts with for the source's `domain` (with `-incoming
/// defer`), and what it plugs before the device state arrives ([`BootConversion`]): the
/// boot conversion with the source's CPU adopted, without SR-IOV devices, refused unless it
/// matches the source's argv.
///
/// KubeVirt's target creates no SR-IOV devices: the source unplugged its VFs and sends
/// none; virt-handler plugs the target pod's VFs after the migration.
pub(super) fn incoming_definition(
    d: &DomainCtx,
    target: &PreparedTarget,
    domain: &RunningDomain,
) -> Result<BootConversion, MigrationError> {
    let mut b =
        boot_conversion(d, target, domain).and_then(|b| adopt_source_cpu(d, target, b, domain))?;
    b.argv = sriov::without_sriov_devices(&b.argv);
    matches_source(&normalized(&b.argv, &d.config), domain)?;
    let mut d = domain.clone();
    d.argv.clear();
    b.argv = incoming_argv(&b.argv, &d)?;
    Ok(b)
}

/// The target's QEMU definition for the source's `domain` ([`BootConversion`]): without
/// hot-plugged devices the prepared argv; with them the VMI converted again without those
/// devices ([`hotplug::boot_views`]: with hot-plugged NICs, the first view whose argv is the
/// source's), the disks from the prepared (full) plan with the target's own paths and the
/// NICs from the full VMI converted with their taps passed by fd, each placed as the source
/// runs it ([`hotplug::place_like_source`], [`hotplug::place_nic_like_source`]).
fn boot_conversion(
    d: &DomainCtx,
    target: &PreparedTarget,
    domain: &RunningDomain,
) -> Result<BootConversion, MigrationError> {
    let edits = source_hook_edits(domain)?;
    let redefined = redefine_with_source_edits(d, target, &edits)?;
    if domain.hotplugged.is_empty() {
        let argv = match &redefined {
            Some((defined, _)) => defined.argv.clone(),
            None => target.prepared.argv.clone(),
        };
        return Ok(BootConversion {
            argv,
            placed: Vec::new(),
            plan: None,
            cpu: None,
            nics: Vec::new(),
            edits,
            redefined,
        });
    }
    let ctx = &target.prepared.running.ctx;
    let mut boots = Vec::new();
    for view in hotplug::boot_views(&target.view, &domain.hotplugged) {
        let plan = crate::cmdline::convert(&view, ctx).map_err(|e| {
            MigrationError::Peer(format!(
                "cannot convert the VMI without its hot-plugged devices: {e}"
            ))
        })?;
        let Defined { plan, argv, .. } = define(d, plan, &edits);
        boots.push((plan, argv));
    }
    // The view whose argv is the source's; none: the first, whose difference the caller
    // reports.
    let matching = boots
        .iter()
        .position(|(_, argv)| {
            let local = normalized(&sriov::without_sriov_devices(argv), &d.config);
            matches_source(&local, domain).is_ok()
        })
        .unwrap_or(0);
    let Some((plan, argv)) = boots.into_iter().nth(matching) else {
        return Err(MigrationError::Peer("no boot conversion of the VMI".into()));
    };
    let (disks, nic_devices): (Vec<_>, Vec<_>) = domain
        .hotplugged
        .iter()
        .partition(|h| h.kind == HotplugKind::Disk);
    let full_disks = match &redefined {
        Some((defined, _)) => &defined.qmp_plan.disks,
        None => &target.prepared.qmp_plan.disks,
    };
    let placed = disks
        .into_iter()
        .map(|h| hotplug::place_like_source(full_disks, h))
        .collect::<Result<Vec<_>, _>>()?;
    let nics = if nic_devices.is_empty() {
        Vec::new()
    } else {
        let local = nic_plans_by_fd(target, &nic_devices)?;
        nic_devices
            .into_iter()
            .map(|h| hotplug::place_nic_like_source(&local, h))
            .collect::<Result<Vec<_>, _>>()?
    };
    Ok(BootConversion {
        argv,
        placed,
        plan: Some(plan),
        nics,
        cpu: None,
        edits,
        redefined,
    })
}

/// `boot` with the CPU of the source's definition ([`RunningDomain::cpu`], a host-model CPU's
/// static expansion): its plan's `-cpu` becomes the adopted `base,<properties>,enforce=on`
/// ([`crate::cmdline::devices::cpu::adopted_cpu_plan`]) and its argv is rendered again, so
/// the guest keeps the source's CPUID identity; QEMU then refuses to start if this host
/// cannot provide a property. Without a definition (host-passthrough, a named model, a
/// version-2 source) `boot` is unchanged.
///
/// Errors: a definition for a VMI that is not host-model here, or one that is not a plain
/// model and properties (one that would inject a `-cpu` option, refused with the property's
/// path).
fn adopt_source_cpu(
    d: &DomainCtx,
    target: &PreparedTarget,
    mut boot: BootConversion,
    domain: &RunningDomain,
) -> Result<BootConversion, MigrationError> {
    let Some(def) = &domain.cpu else {
        return Ok(boot);
    };
    if !target.prepared.plan.cpu.host_model {
        return Err(MigrationError::Peer(
            "the source sent a CPU definition for a VMI whose CPU is not host-model".into(),
        ));
    }
    let cpu = crate::cmdline::devices::cpu::adopted_cpu_plan(def).map_err(|e| {
        MigrationError::Peer(format!("cannot adopt the source's CPU definition: {e}"))
    })?;
    let mut plan = boot.plan.take().unwrap_or_else(|| match &boot.redefined {
        Some((defined, _)) => defined.plan.clone(),
        None => target.prepared.plan.clone(),
    });
    plan.cpu = cpu.clone();
    let Defined { plan, argv, .. } = define(d, plan, &boot.edits);
    boot.argv = argv;
    // Only a plan of other disks than the prepared one replaces it (the CPU is in `cpu`).
    if domain.hotplugged.is_empty() {
        boot.plan = None;
    } else {
        boot.plan = Some(plan);
    }
    info!(model = %cpu.model, props = cpu.flags.len() - 1, "source's CPU adopted");
    boot.cpu = Some(cpu);
    Ok(boot)
}

/// This target's QMP plan of the NICs `hot` (the full VMI converted with the tap of each
/// passed by fd, as a hot-plug by diff does; the binding of each was set up when the target
/// was prepared).
fn nic_plans_by_fd(
    target: &PreparedTarget,
    hot: &[&HotpluggedDevice],
) -> Result<Vec<NicHotplug>, MigrationError> {
    let mut ctx = target.prepared.running.ctx.clone();
    for h in hot {
        if let Some(facts) = ctx.interfaces.get_mut(&h.name) {
            facts.tap = TapSource::Fds {
                fds: vec![-1],
                vhostfds: vec![],
            };
        }
    }
    let plan = crate::cmdline::convert(&target.view, &ctx).map_err(|e| {
        MigrationError::Peer(format!(
            "cannot convert the VMI with its hot-plugged interfaces: {e}"
        ))
    })?;
    Ok(qmp_plan(&plan).nics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use qlauncher_libvirt_xml::hooks::{CacheMode, DiskEdit, HookedDomain};

    #[test]
    fn the_sources_cpu_word_is_compared_as_the_adopted_one() {
        let w = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        let ours = w("-machine q35 -cpu base,family=15,enforce=on -m 128");
        assert_eq!(with_cpu_of(&w("-machine q35 -cpu max -m 128"), &ours), ours);
        // Nothing to replace: unchanged.
        assert_eq!(with_cpu_of(&w("-machine q35"), &ours), w("-machine q35"));
        assert_eq!(with_cpu_of(&w("-cpu"), &ours), w("-cpu"));
    }

    fn definition(hooked: Option<HookedDomain>) -> RunningDomain {
        RunningDomain {
            vmi_uid: "u".into(),
            migration_uid: "m".into(),
            machine: "pc-q35-7.2".into(),
            argv: Vec::new(),
            hotplugged: Vec::new(),
            copied_disks: Vec::new(),
            capabilities: Vec::new(),
            multifd_channels: None,
            paused: false,
            cpu: None,
            hooked,
        }
    }

    const SENT: &str = "<domain type=\"kvm\">\n\t<name>ns_vm</name>\n\t<devices>\n\t\t<disk device=\"disk\" type=\"file\">\n\t\t\t<driver cache=\"none\" name=\"qemu\"></driver>\n\t\t\t<alias name=\"ua-root\"></alias>\n\t\t</disk>\n\t</devices>\n</domain>";

    #[test]
    fn the_sources_hook_edits_are_checked_as_an_answer_is() {
        assert!(source_hook_edits(&definition(None)).unwrap().is_empty());
        let cache = HookedDomain {
            sent: SENT.into(),
            answered: SENT.replace("cache=\"none\"", "cache=\"writeback\""),
        };
        assert_eq!(
            source_hook_edits(&definition(Some(cache))).unwrap(),
            vec![HookEdit::Disk {
                alias: "ua-root".into(),
                edit: DiskEdit::Cache(CacheMode::Writeback)
            }]
        );
        // A peer cannot send what no hook may answer: a launcher option in qemu:commandline.
        let qmp = HookedDomain {
            sent: SENT.into(),
            answered: SENT.replace(
                "<devices>",
                "<qemu:commandline xmlns:qemu=\"http://libvirt.org/schemas/domain/qemu/1.0\"><qemu:arg value=\"-qmp\"></qemu:arg></qemu:commandline>\n\t<devices>",
            ),
        };
        let e = source_hook_edits(&definition(Some(qmp))).unwrap_err();
        assert!(
            e.to_string()
                .contains("the source's hook edits are refused"),
            "{e}"
        );
        assert!(e.to_string().contains("qemu:commandline"), "{e}");
    }
}
