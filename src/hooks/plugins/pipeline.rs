//! The domain hook pipeline (KubeVirt v1.9.0 `ApplyDomainHooks`,
//! `pkg/virt-launcher/virtwrap/plugins/pipeline.go`, and its sidecar client, `sidecar.go`): after
//! the hook sidecars' `OnDefineDomain`, every plugin in name order (a stable sort), each domain
//! hook in declaration order. A plugin's `condition`, then each hook's, decides whether the hook
//! runs; a condition that fails to evaluate fails the definition whatever the failure strategy
//! (as KubeVirt's). A hook is a CEL mutation ([`super::cel::mutation`]) or the plugin sidecar's
//! `MutateDomain` over its unix socket. A hook that fails (its CEL, its sidecar, or an answer
//! qlauncher cannot take) fails the definition under `Fail`, naming the plugin and the hook, and
//! is logged and skipped under `Ignore`, the domain staying as it was before that hook.
//!
//! The domain a hook gets and what its answer may change are the [`HookTarget`]'s: the
//! launcher's ([`PlannedDomain`]) diffs each answer against the text that hook got
//! ([`crate::hooks::diff_answer`], the path a sidecar's `OnDefineDomain` answer takes), so a
//! plugin can change exactly what a hook sidecar can, and the next hook sees the domain qlauncher
//! will run.
//!
//! Where qlauncher differs, on purpose: the XML a `MutateDomain` sidecar gets is the text a hook
//! sidecar gets (Go's `encoding/xml` of KubeVirt's `api.DomainSpec`), not libvirtxml's
//! `Domain.Marshal`; both are libvirt domain XML of the same domain.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use qlauncher_libvirt_xml::hooks::{self, HookEdit, Refusal};
use qlauncher_libvirt_xml::schema::Domain;
use tokio::time::Instant;
use tracing::{info, warn};

use super::cel::{self, CelError, Inputs};
use super::{FailureStrategy, Plugin, CALL_TIMEOUT, DIAL_TIMEOUT, PLUGIN_DIR, SOCKET_POLL};
use crate::cmdline::{ConverterContext, DomainPlan};
use crate::hooks::proto::plugins_v1alpha1 as proto;
use crate::vmi::Vmi;

/// `MutateDomainRequest.domain_type` (KubeVirt's `domainTypeLibvirt`).
pub const DOMAIN_TYPE: &str = "libvirt";

/// Why the hooks run (KubeVirt's `pluginv1alpha1.InvocationContext`), sent to the sidecars as
/// `sidecar_context.invocation_context`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvocationContext {
    /// The domain's first definition (KubeVirt's `SetDomainSpecStrWithHooks`).
    Boot,
    /// A migration target's preparation (KubeVirt's `PrepareMigrationTarget`).
    MigrationTarget,
}

impl InvocationContext {
    /// The wire value: `Boot`, `MigrationTarget`.
    pub fn as_str(self) -> &'static str {
        match self {
            InvocationContext::Boot => "Boot",
            InvocationContext::MigrationTarget => "MigrationTarget",
        }
    }
}

/// How long a sidecar hook waits and dials (KubeVirt's constants by default; tests shorten them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Times {
    /// How long a hook waits for its socket to appear ([`super::SOCKET_WAIT`]).
    pub socket_wait: Duration,
    /// How long the connection may take ([`DIAL_TIMEOUT`]).
    pub dial: Duration,
}

impl Default for Times {
    fn default() -> Self {
        Times {
            socket_wait: super::SOCKET_WAIT,
            dial: DIAL_TIMEOUT,
        }
    }
}

/// Why the pipeline stopped the definition. Texts start as KubeVirt's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// A plugin's `condition` (hook `None`) or a hook's could not be evaluated.
    #[error("plugin {plugin} {}condition evaluation failed: {error}", hook_label(*hook))]
    Condition {
        /// The plugin's name.
        plugin: String,
        /// The hook's index in `domainHooks`, `None` for the plugin's own condition.
        hook: Option<usize>,
        /// The CEL error.
        error: CelError,
    },
    /// A `Fail` hook failed: its CEL, its sidecar call, or its socket.
    #[error("plugin {plugin} hook {hook} failed: {reason}")]
    Hook {
        /// The plugin's name.
        plugin: String,
        /// The hook's index in `domainHooks`.
        hook: usize,
        /// What failed.
        reason: String,
    },
    /// A `Fail` hook's answer asks for a change qlauncher cannot make (or cannot read).
    #[error("plugin {plugin} hook {hook}: refused: {refusal}")]
    Refused {
        /// The plugin's name.
        plugin: String,
        /// The hook's index in `domainHooks`.
        hook: usize,
        /// The element, the values sent and answered, and why.
        refusal: Refusal,
    },
}

/// `hook <i> ` for a hook's condition, nothing for the plugin's (KubeVirt's texts).
fn hook_label(hook: Option<usize>) -> String {
    hook.map_or_else(String::new, |h| format!("hook {h} "))
}

/// The domain the hooks change, as the pipeline sees it.
pub trait HookTarget {
    /// The domain now (what the CEL expressions see as `domainSpec` and mutate).
    fn domain(&self) -> &Domain;
    /// The domain now as XML (what a `MutateDomain` sidecar gets and an answer is diffed with).
    fn xml(&self) -> &str;
    /// Takes a hook's answer, the domain XML it wants; on a refusal the domain is unchanged.
    ///
    /// # Errors
    /// The [`Refusal`] of a change that cannot be taken.
    fn take(&mut self, hook: &str, answer: &str) -> Result<(), Refusal>;
}

/// The launcher's [`HookTarget`]: a converted plan and the typed edits the hooks made of it so
/// far. Each answer is diffed against the text the hook got ([`hooks::diff_answer`]); its edits
/// are applied to the plan ([`hooks::apply`]) and the domain exported again
/// ([`qlauncher_libvirt_xml::export()`], printed as [`hooks::kubevirt_input`]) for the next hook.
#[derive(Debug, Clone)]
pub struct PlannedDomain<'a> {
    view: &'a Vmi,
    ctx: &'a ConverterContext,
    base: &'a DomainPlan,
    edits: Vec<HookEdit>,
    domain: Domain,
    xml: String,
}

impl<'a> PlannedDomain<'a> {
    /// The domain of `base` (converted from `view` with `ctx`) with `edits` applied.
    ///
    /// # Errors
    /// The exporter's error for a plan it cannot write.
    pub fn new(
        view: &'a Vmi,
        ctx: &'a ConverterContext,
        base: &'a DomainPlan,
        edits: Vec<HookEdit>,
    ) -> Result<Self, qlauncher_libvirt_xml::CompatError> {
        let (domain, xml) = render(view, ctx, base, &edits)?;
        Ok(PlannedDomain {
            view,
            ctx,
            base,
            edits,
            domain,
            xml,
        })
    }

    /// The edits so far, in order (the ones given to [`Self::new`] first).
    pub fn edits(&self) -> &[HookEdit] {
        &self.edits
    }

    /// The edits, taken.
    pub fn into_edits(self) -> Vec<HookEdit> {
        self.edits
    }
}

fn render(
    view: &Vmi,
    ctx: &ConverterContext,
    base: &DomainPlan,
    edits: &[HookEdit],
) -> Result<(Domain, String), qlauncher_libvirt_xml::CompatError> {
    let mut plan = base.clone();
    hooks::apply(edits, &mut plan);
    let domain = qlauncher_libvirt_xml::export(view, ctx, &plan)?;
    let xml = hooks::kubevirt_input(&domain)?;
    Ok((domain, xml))
}

impl HookTarget for PlannedDomain<'_> {
    fn domain(&self) -> &Domain {
        &self.domain
    }

    fn xml(&self) -> &str {
        &self.xml
    }

    fn take(&mut self, hook: &str, answer: &str) -> Result<(), Refusal> {
        let changes = hooks::diff_answer(&self.xml, answer)?;
        if changes.is_empty() {
            return Ok(());
        }
        let mut edits = self.edits.clone();
        for e in &changes {
            info!(hook, edit = %e, "plugin edits the domain");
        }
        edits.extend(changes);
        let (domain, xml) =
            render(self.view, self.ctx, self.base, &edits).map_err(|e| Refusal {
                path: "domain".into(),
                sent: "-".into(),
                answered: "-".into(),
                reason: format!("the edited domain cannot be exported: {e}"),
            })?;
        self.edits = edits;
        self.domain = domain;
        self.xml = xml;
        Ok(())
    }
}

/// Runs the domain hooks of `plugins` on `target` (see the module doc). `vmi_json` is the VMI as
/// virt-handler sent it (the sidecars get it as JSON, the CEL expressions as `vmi`);
/// `plugin_dir` is where [`PLUGIN_DIR`] is (`/var/run/kubevirt-plugin` in a pod), socket paths
/// being given as KubeVirt's. No plugins: nothing is done.
///
/// # Errors
/// [`PluginError`]: a condition that cannot be evaluated, or a `Fail` hook that failed or was
/// refused.
pub async fn apply_domain_hooks(
    plugins: &[Plugin],
    vmi_json: &serde_json::Value,
    context: InvocationContext,
    plugin_dir: &Path,
    times: Times,
    target: &mut impl HookTarget,
) -> Result<(), PluginError> {
    if plugins.is_empty() {
        return Ok(());
    }
    let mut sorted: Vec<&Plugin> = plugins.iter().collect();
    sorted.sort_by(|a, b| a.name().cmp(b.name()));
    let names: Vec<&str> = sorted.iter().map(|p| p.name()).collect();
    info!(
        "Evaluating domain hooks from plugins: [{}]",
        names.join(", ")
    );
    let vmi_bytes = serde_json::to_vec(vmi_json).unwrap_or_default();
    for plugin in sorted {
        let name = plugin.name();
        let spec = &plugin.spec;
        let inputs = || Inputs::new(vmi_json, target.domain());
        if !spec.condition.is_empty() {
            let matched = cel::condition(&spec.condition, &inputs()).map_err(|error| {
                PluginError::Condition {
                    plugin: name.into(),
                    hook: None,
                    error,
                }
            })?;
            if !matched {
                info!("Skipping plugin {name}: condition not met");
                continue;
            }
        }
        for (i, hook) in spec.domain_hooks.iter().enumerate() {
            let inputs = Inputs::new(vmi_json, target.domain());
            if !hook.condition.is_empty() {
                let matched = cel::condition(&hook.condition, &inputs).map_err(|error| {
                    PluginError::Condition {
                        plugin: name.into(),
                        hook: Some(i),
                        error,
                    }
                })?;
                if !matched {
                    continue;
                }
            }
            let answer = if let Some(c) = &hook.cel {
                cel::mutation(&c.expression, &inputs, target.domain())
                    .map_err(|e| e.to_string())
                    .and_then(|d| hooks::kubevirt_input(&d).map_err(|e| e.to_string()))
            } else if let Some(s) = &hook.sidecar {
                let deadline = Instant::now() + times.socket_wait;
                let call = MutateCall {
                    socket_path: &s.socket_path,
                    plugin: name,
                    plugin_dir,
                    domain: target.xml(),
                    vmi: &vmi_bytes,
                    context,
                    timeout: hook.timeout.unwrap_or(CALL_TIMEOUT),
                    deadline,
                    dial: times.dial,
                };
                call.run().await
            } else {
                continue;
            };
            let strategy = hook.strategy(spec);
            let label = format!("plugin {name} hook {i}");
            let failure = match answer {
                Ok(xml) => match target.take(&label, &xml) {
                    Ok(()) => continue,
                    Err(refusal) => PluginError::Refused {
                        plugin: name.into(),
                        hook: i,
                        refusal,
                    },
                },
                Err(reason) => PluginError::Hook {
                    plugin: name.into(),
                    hook: i,
                    reason,
                },
            };
            match strategy {
                FailureStrategy::Ignore => {
                    warn!("Plugin {name} hook {i} failed (ignored): {failure}");
                }
                FailureStrategy::Fail => return Err(failure),
            }
        }
    }
    info!(
        "Successfully applied domain hooks from {} plugin(s)",
        names.len()
    );
    Ok(())
}

/// One `MutateDomain` call (KubeVirt's `sidecarHookApplier.Apply` and `callSidecarHook`).
struct MutateCall<'a> {
    socket_path: &'a str,
    plugin: &'a str,
    plugin_dir: &'a Path,
    domain: &'a str,
    vmi: &'a [u8],
    context: InvocationContext,
    timeout: Duration,
    deadline: Instant,
    dial: Duration,
}

impl MutateCall<'_> {
    /// The answered domain XML, or why there is none.
    async fn run(&self) -> Result<String, String> {
        let socket = socket_in(self.socket_path, self.plugin, self.plugin_dir)?;
        wait_for_socket(&socket, self.socket_path, self.deadline).await?;
        let meta = std::fs::symlink_metadata(&socket).map_err(|e| {
            format!(
                "invalid socket path: stat socket path {:?}: {e}",
                self.socket_path
            )
        })?;
        if meta.file_type().is_symlink() {
            return Err(format!(
                "invalid socket path: socket path {:?} is a symlink, which is not allowed",
                self.socket_path
            ));
        }
        let channel = crate::hooks::dial_within(&socket, self.dial)
            .await
            .map_err(|e| format!("dialing sidecar socket {}: {e}", self.socket_path))?;
        let mut client = proto::domain_hook_service_client::DomainHookServiceClient::new(channel);
        let request = proto::MutateDomainRequest {
            domain_type: DOMAIN_TYPE.into(),
            domain: self.domain.as_bytes().to_vec(),
            vmi: self.vmi.to_vec(),
            sidecar_context: Some(proto::SidecarContext {
                invocation_context: self.context.as_str().into(),
            }),
        };
        let plugin = self.plugin;
        let answer = match tokio::time::timeout(self.timeout, client.mutate_domain(request)).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(st)) => {
                return Err(format!(
                    "MutateDomain RPC to {plugin} failed with {:?}: {}",
                    st.code(),
                    st.message()
                ))
            }
            Err(_) => {
                return Err(format!(
                "MutateDomain RPC to {plugin} failed with DeadlineExceeded: no answer within {:?}",
                self.timeout
            ))
            }
        };
        String::from_utf8(answer.domain)
            .map_err(|_| "unmarshal sidecar response: the domain XML answered is not UTF-8".into())
    }
}

/// The socket of `socket_path` (a path in the pod, KubeVirt's form) under `plugin_dir` (where
/// [`PLUGIN_DIR`] is), after KubeVirt's `validateSocketPath` prefix check: the lexically cleaned
/// path must be under `/var/run/kubevirt-plugin/<plugin>/`.
fn socket_in(socket_path: &str, plugin: &str, plugin_dir: &Path) -> Result<PathBuf, String> {
    let cleaned = clean(Path::new(socket_path));
    let outside = || {
        format!(
            "invalid socket path: socket path {socket_path:?} is outside {PLUGIN_DIR}/{plugin}/"
        )
    };
    if plugin.is_empty() || Path::new(plugin).components().count() != 1 {
        return Err(outside());
    }
    let rel = cleaned
        .strip_prefix(Path::new(PLUGIN_DIR).join(plugin))
        .map_err(|_| outside())?;
    if rel.as_os_str().is_empty() {
        return Err(outside());
    }
    Ok(plugin_dir.join(plugin).join(rel))
}

/// Go's `filepath.Clean` of an absolute path: `.` dropped, `..` taken back (never above `/`).
/// A relative path stays relative (and is then outside the plugin directory).
fn clean(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                if out.parent().is_some() {
                    out.pop();
                } else if !out.has_root() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// KubeVirt's `waitForSidecarSocket`: the socket looked for now and every [`SOCKET_POLL`] until
/// `deadline`.
async fn wait_for_socket(socket: &Path, shown: &str, deadline: Instant) -> Result<(), String> {
    loop {
        match std::fs::metadata(socket) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("checking socket {shown}: {e}")),
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(format!("sidecar socket {shown} not ready"));
        }
        tokio::time::sleep(SOCKET_POLL.min(deadline - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths_as_kubevirt_validates_them() {
        let dir = Path::new("/root/var/run/kubevirt-plugin");
        assert_eq!(
            socket_in("/var/run/kubevirt-plugin/p/hook.sock", "p", dir).unwrap(),
            dir.join("p/hook.sock")
        );
        assert_eq!(
            socket_in("/var/run/kubevirt-plugin/p/./x/../hook.sock", "p", dir).unwrap(),
            dir.join("p/hook.sock")
        );
        for bad in [
            "/var/run/kubevirt-plugin/q/hook.sock",
            "/var/run/kubevirt-plugin/p/../q/hook.sock",
            "/var/run/kubevirt-plugin/p",
            "/var/run/kubevirt-plugin/p/",
            "var/run/kubevirt-plugin/p/hook.sock",
            "/var/run/kubevirt-hooks/p/hook.sock",
        ] {
            assert!(socket_in(bad, "p", dir).is_err(), "{bad}");
        }
        assert!(socket_in("/var/run/kubevirt-plugin/../x/hook.sock", "../x", dir).is_err());
        assert!(socket_in("/var/run/kubevirt-plugin/hook.sock", "", dir).is_err());
    }

    #[test]
    fn invocation_contexts_are_kubevirts() {
        assert_eq!(InvocationContext::Boot.as_str(), "Boot");
        assert_eq!(
            InvocationContext::MigrationTarget.as_str(),
            "MigrationTarget"
        );
    }
}
