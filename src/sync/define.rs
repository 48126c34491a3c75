//! The define seam: where a converted plan becomes what QEMU runs and what virt-handler is
//! shown, in one place. It stands where KubeVirt's `SetDomainSpecStrWithHooks`
//! (`pkg/virt-launcher/virtwrap/manager.go`, v1.9.0) defines the domain with libvirt, after the
//! hook sidecars' `OnDefineDomain`: QEMU's argv, the QMP start-up and hotplug plan and the
//! `api.Domain` spec all come from the one [`Defined`] plan, so they cannot disagree. The first
//! start (`start::prepare`), the sync diff (`reconcile::hotplug`) and the migration target's boot
//! conversion (`migration/boot_conversion.rs`) each call [`define`]; edits of the plan that must
//! survive every later definition (a hook's) belong here, before the rendering.

use std::path::Path;

use qlauncher_libvirt_xml::hooks::{self, HookEdit, HookedDomain};
use tracing::info;

use crate::cmdline::qemu::KeyVal;
use crate::cmdline::{render, ConverterContext, DomainPlan};
use crate::hooks::plugins::pipeline::HookTarget;
use crate::hooks::plugins::pipeline::{self, InvocationContext, PlannedDomain, Times};
use crate::hooks::plugins::Plugin;
use crate::hooks::Sidecars;
use crate::sync::ctx::DomainCtx;
use crate::sync::domain::ApiDomain;
use crate::sync::domain_spec;
use crate::sync::error::SyncError;
use crate::vmi::Vmi;

/// A defined domain: the plan and the two renderings QEMU gets of it.
pub(crate) struct Defined {
    /// The plan, as defined (the converter's).
    pub(crate) plan: DomainPlan,
    /// QEMU's argv (with `-S`), with the operator's second QMP monitor when configured.
    pub(crate) argv: Vec<String>,
    /// The QMP start-up and hotplug plan ([`render::qmp_plan`]): what a start runs after QEMU
    /// is up and what the reconcilers compare with the running domain.
    pub(crate) qmp_plan: render::QmpPlan,
}

impl Defined {
    /// Puts this definition's `api.Domain` spec into `domain` (KubeVirt's JSON of the same model
    /// the libvirt XML export writes; the running devices keep their identity,
    /// [`domain_spec::apply_converted`]); `view` and `ctx` are the VMI and the facts the plan
    /// was converted from.
    ///
    /// # Errors
    /// [`SyncError::DomainSpec`]: the `api.Domain` cannot show the plan (a device the exporter
    /// has no element for): the definition fails rather than hide it from virt-handler.
    pub(crate) fn report(
        &self,
        domain: &mut ApiDomain,
        view: &Vmi,
        ctx: &ConverterContext,
    ) -> Result<(), SyncError> {
        domain_spec::apply_converted(domain, view, ctx, &self.plan)
    }
}

/// Defines the domain of `plan` (see the module doc): the hook sidecars' `edits` (from
/// [`on_define_domain`] at the first definition) applied, then QEMU's argv and QMP plan rendered
/// from it.
pub(crate) fn define(d: &DomainCtx, mut plan: DomainPlan, edits: &[HookEdit]) -> Defined {
    hooks::apply(edits, &mut plan);
    let mut argv = render::argv(&plan);
    if let Some(p) = &d.config.operator_qmp_socket {
        argv.push("-qmp".into());
        argv.push(operator_qmp_arg(p));
    }
    let qmp_plan = render::qmp_plan(&plan);
    Defined {
        plan,
        argv,
        qmp_plan,
    }
}

/// What the hooks made of a first definition ([`on_define_domain`]).
#[derive(Debug, Default)]
pub(crate) struct Hooked {
    /// The typed plan edits, in order, applied at every later definition ([`define`]).
    pub(crate) edits: Vec<HookEdit>,
    /// The XML the first hook got and the last one's answer: what a migration carries to its
    /// target ([`crate::sync::migration::protocol::RunningDomain::hooked`]). `None` without a
    /// subscribed hook.
    pub(crate) domain: Option<HookedDomain>,
}

/// The VEP-190 plugins a definition runs (from the SyncVirtualMachine options'
/// `pluginsJson`) and where their sockets are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PluginRun<'a> {
    /// The plugins, as virt-handler sent them.
    pub(crate) plugins: &'a [Plugin],
    /// Where `/var/run/kubevirt-plugin` is ([`crate::sync::config::SyncConfig::plugin_dir`]).
    pub(crate) dir: &'a Path,
    /// Why they run.
    pub(crate) context: InvocationContext,
}

/// The hook sidecars' `OnDefineDomain` (KubeVirt's `SetDomainSpecStrWithHooks`,
/// `pkg/hooks/manager.go`), then the plugins' domain hooks (KubeVirt's `ApplyDomainHooks`,
/// [`pipeline::apply_domain_hooks`]): the domain of `plan` as KubeVirt would send it (Go's
/// `encoding/xml` text of its `api.DomainSpec`, [`hooks::kubevirt_input`]) goes through every
/// subscribed sidecar in order, each answer diffed against the text that sidecar got
/// ([`hooks::diff_answer`]), and the differences become typed plan edits, in order; each
/// plugin's hook then gets the domain with those edits, and its answer (a CEL mutation's domain
/// printed the same way, or a sidecar's `MutateDomain` XML) takes the same diff. `vmi` is the VMI
/// virt-handler sent (as JSON to the hooks), `view` and `ctx` what the plan was converted from.
/// No subscriber and no plugin: no edits, no export ([`Hooked::default`]).
///
/// # Errors
/// [`SyncError::Hook`] (a sidecar cannot be called or fails), [`SyncError::HookRefused`] (an
/// answer asks for a change the plan cannot take, naming the sidecar and the element),
/// [`SyncError::Plugin`] (a plugin's condition or `Fail` hook, naming the plugin and the hook),
/// [`SyncError::DomainSpec`] (the plan cannot be exported).
pub(crate) async fn on_define_domain(
    sidecars: &Sidecars,
    plugins: PluginRun<'_>,
    vmi: &Vmi,
    view: &Vmi,
    ctx: &ConverterContext,
    plan: &DomainPlan,
) -> Result<Hooked, SyncError> {
    let subscribed = sidecars.subscribes(crate::hooks::ON_DEFINE_DOMAIN);
    if !subscribed && plugins.plugins.is_empty() {
        return Ok(Hooked::default());
    }
    let spec_err = |e: qlauncher_libvirt_xml::CompatError| SyncError::DomainSpec(Box::new(e));
    let domain = qlauncher_libvirt_xml::export(view, ctx, plan).map_err(spec_err)?;
    let sent = hooks::kubevirt_input(&domain).map_err(spec_err)?;
    // A `Vmi` (string keys, no maps with other keys) always serialises.
    let vmi_value = serde_json::to_value(vmi).unwrap_or_default();
    let vmi_json = serde_json::to_vec(&vmi_value).unwrap_or_default();
    let mut edits = Vec::new();
    let mut before = sent.clone();
    if subscribed {
        let steps = sidecars
            .on_define_domain_steps(&sent, &vmi_json)
            .await
            .map_err(SyncError::Hook)?;
        for step in steps {
            let changes = hooks::diff_answer(&before, &step.domain_xml).map_err(|refusal| {
                SyncError::HookRefused {
                    socket: step.socket.clone(),
                    refusal,
                }
            })?;
            for e in &changes {
                info!(sidecar = %step.socket.display(), edit = %e, "hook sidecar edits the domain");
            }
            edits.extend(changes);
            before = step.domain_xml;
        }
    }
    if !plugins.plugins.is_empty() {
        let mut target = PlannedDomain::new(view, ctx, plan, edits).map_err(spec_err)?;
        let sidecar_edits = target.edits().len();
        pipeline::apply_domain_hooks(
            plugins.plugins,
            &vmi_value,
            plugins.context,
            plugins.dir,
            Times::default(),
            &mut target,
        )
        .await
        .map_err(|e| SyncError::Plugin(Box::new(e)))?;
        if target.edits().len() > sidecar_edits {
            // What a migration carries is then the domain with every edit, as qlauncher runs it.
            before = target.xml().to_owned();
        }
        edits = target.into_edits();
    }
    Ok(Hooked {
        edits,
        domain: Some(HookedDomain {
            sent,
            answered: before,
        }),
    })
}

/// `-qmp`'s value for a QMP server on the Unix socket `path`: `unix:<path>,server=on,wait=off`,
/// commas of the path doubled (QEMU's option syntax).
fn operator_qmp_arg(path: &Path) -> String {
    let head = ["unix:", &path.display().to_string()].concat();
    KeyVal::with_head(&head)
        .on_off("server", true)
        .on_off("wait", false)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_qmp_socket_argument() {
        let cases = [
            ("/run/q/op.sock", "unix:/run/q/op.sock,server=on,wait=off"),
            (
                "/tmp/a,b/op.sock",
                "unix:/tmp/a,,b/op.sock,server=on,wait=off",
            ),
        ];
        for (path, want) in cases {
            assert_eq!(operator_qmp_arg(Path::new(path)), want);
        }
    }
}
