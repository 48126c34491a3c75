//! VEP-190 plugins, the launcher's side (KubeVirt v1.9.0 `pkg/virt-launcher/virtwrap/plugins`,
//! feature gate `Plugins`): virt-handler sends the cluster's `Plugin` objects as JSON in the
//! SyncVirtualMachine options (`VirtualMachineOptions.pluginsJson`, cmd proto field 10; read by
//! KubeVirt's `setPluginsFromOptions`, `virtwrap/cmd-server/server.go`), and each plugin's domain
//! hooks change the domain after the hook sidecars', plugins in name order, hooks in declaration
//! order. The gate is virt-handler's business: the launcher acts whenever the list is non-empty,
//! as KubeVirt's does.
//!
//! This module has the decoding ([`decode`], types named after KubeVirt's `kubevirt.io/api/plugin/
//! v1alpha1` Go types; only what the domain hooks need is kept, the rest of a `Plugin` is
//! accepted and dropped); [`cel`] evaluates the CEL conditions and mutations and [`pipeline`]
//! runs the hooks (KubeVirt's `ApplyDomainHooks`), called by the define seam
//! (`sync/define.rs`) at a first start (`Boot`) and a migration target's preparation
//! (`MigrationTarget`).

pub mod cel;
pub mod pipeline;

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// Where plugin sidecars put their sockets, one directory per plugin (KubeVirt's
/// `pluginSocketBaseDir`): a domain hook's `socketPath` must be under
/// `/var/run/kubevirt-plugin/<plugin name>/`.
pub const PLUGIN_DIR: &str = "/var/run/kubevirt-plugin";
/// How long a sidecar hook waits for its socket to appear (KubeVirt's `sidecarReadinessTimeout`).
pub const SOCKET_WAIT: Duration = Duration::from_secs(30);
/// How often the socket wait looks again (KubeVirt polls every 500 ms).
pub const SOCKET_POLL: Duration = Duration::from_millis(500);
/// How long the connection to a plugin socket may take (KubeVirt's `sidecarDialTimeoutSeconds`).
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of `MutateDomain` when the hook sets no `timeout` (KubeVirt's
/// `defaultSidecarCallTimeout`).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A Go string field: absent or `null` is empty, as Go's `encoding/json` leaves it.
fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

/// A Go slice field: absent or `null` is empty.
fn list<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// A `metav1.Duration` (Go's `time.Duration` text, `"30s"`, `"1m30s"`), absent or `null` none.
fn go_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let Some(s) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    humantime::parse_duration(&s)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("duration {s:?}: {e}")))
}

/// KubeVirt's `pluginv1alpha1.Plugin`: a cluster-scoped extension object; the launcher reads its
/// name and its spec's domain hooks.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Plugin {
    /// `metadata` (`metav1.ObjectMeta`): the name orders the plugins and names the socket
    /// directory.
    #[serde(default)]
    pub metadata: PluginMeta,
    /// `spec`.
    #[serde(default)]
    pub spec: PluginSpec,
}

impl Plugin {
    /// `metadata.name`.
    pub fn name(&self) -> &str {
        &self.metadata.name
    }
}

/// The part of `metav1.ObjectMeta` the launcher reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct PluginMeta {
    /// `name`.
    #[serde(default, deserialize_with = "text")]
    pub name: String,
}

/// KubeVirt's `PluginSpec`, the domain part (`nodeHooks` and the admission references are
/// virt-handler's and the API server's, not the launcher's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginSpec {
    /// `condition`: a CEL expression; when set and false, no hook of the plugin runs.
    #[serde(default, deserialize_with = "text")]
    pub condition: String,
    /// `failureStrategy`: the default of the hooks that set none.
    #[serde(default)]
    pub failure_strategy: Option<FailureStrategy>,
    /// `domainHooks`, in declaration order.
    #[serde(default, deserialize_with = "list")]
    pub domain_hooks: Vec<DomainHook>,
}

/// KubeVirt's `FailureStrategy`: what a failing hook does to the definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum FailureStrategy {
    /// `Fail`: the definition (and so the sync) fails, naming the plugin. The default.
    Fail,
    /// `Ignore`: the hook is logged and skipped; the domain stays as it was before it.
    Ignore,
}

/// KubeVirt's `DomainHook`: one change of the domain, by CEL or by a sidecar (the API server
/// admits exactly one of the two; a hook with neither is skipped, as KubeVirt's pipeline does).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DomainHook {
    /// `cel` (`CELDomainHook`).
    #[serde(default)]
    pub cel: Option<CelDomainHook>,
    /// `sidecar` (`SidecarDomainHook`).
    #[serde(default)]
    pub sidecar: Option<SidecarDomainHook>,
    /// `condition`: a CEL expression; when set and false, this hook does not run.
    #[serde(default, deserialize_with = "text")]
    pub condition: String,
    /// `failureStrategy`: overrides the plugin's.
    #[serde(default)]
    pub failure_strategy: Option<FailureStrategy>,
    /// `timeout` (`metav1.Duration`): the sidecar call's deadline, [`CALL_TIMEOUT`] when unset.
    #[serde(default, deserialize_with = "go_duration")]
    pub timeout: Option<Duration>,
}

impl DomainHook {
    /// The hook's strategy: its own, else the plugin's, else `Fail` (KubeVirt's `cmp.Or`).
    pub fn strategy(&self, plugin: &PluginSpec) -> FailureStrategy {
        self.failure_strategy
            .or(plugin.failure_strategy)
            .unwrap_or(FailureStrategy::Fail)
    }
}

/// KubeVirt's `CELDomainHook`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CelDomainHook {
    /// `expression`: a CEL expression whose value is the (partial) domain to merge in.
    #[serde(deserialize_with = "text")]
    pub expression: String,
}

/// KubeVirt's `SidecarDomainHook`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SidecarDomainHook {
    /// `socketPath`: the sidecar's `DomainHookService` socket, under
    /// `/var/run/kubevirt-plugin/<plugin>/` ([`PLUGIN_DIR`]).
    #[serde(deserialize_with = "text")]
    pub socket_path: String,
}

/// Decodes `pluginsJson` as KubeVirt's `setPluginsFromOptions` does: empty bytes are no plugins,
/// anything else must be a JSON array of `Plugin` objects.
///
/// # Errors
/// The JSON error, for bytes that are not such an array (KubeVirt fails the sync with
/// "failed to deserialize plugins from options").
pub fn decode(plugins_json: &[u8]) -> Result<Vec<Plugin>, serde_json::Error> {
    if plugins_json.is_empty() {
        return Ok(Vec::new());
    }
    Option::<Vec<Plugin>>::deserialize(&mut serde_json::Deserializer::from_slice(plugins_json))
        .map(Option::unwrap_or_default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_null_are_no_plugins() {
        assert!(decode(b"").unwrap().is_empty());
        assert!(decode(b"null").unwrap().is_empty());
        assert!(decode(b"[]").unwrap().is_empty());
        assert!(decode(b"{}").is_err());
        assert!(decode(b"[").is_err());
    }

    /// A `Plugin` as virt-handler marshals it (Go's `encoding/json` of `pluginv1alpha1.Plugin`,
    /// with the parts the launcher drops).
    #[test]
    fn decodes_kubevirts_plugin_json() {
        let json = br#"[{
            "kind": "Plugin", "apiVersion": "plugin.kubevirt.io/v1alpha1",
            "metadata": {"name": "smbios-serial", "uid": "u", "creationTimestamp": null},
            "spec": {
                "condition": "vmi.Namespace == \"default\"",
                "failureStrategy": "Ignore",
                "domainHooks": [
                    {"cel": {"expression": "Domain{Title: \"t\"}"}},
                    {"sidecar": {"socketPath": "/var/run/kubevirt-plugin/smbios-serial/hook.sock"},
                     "condition": "true", "failureStrategy": "Fail", "timeout": "1m30s"}
                ],
                "nodeHooks": [{"socket": "/x", "permittedHooks": ["PreVMStart"]}],
                "mutatingAdmissionPolicies": [{"name": "p"}]
            },
            "status": {}
        }]"#;
        let plugins = decode(json).unwrap();
        assert_eq!(plugins.len(), 1);
        let p = &plugins[0];
        assert_eq!(p.name(), "smbios-serial");
        assert_eq!(p.spec.condition, r#"vmi.Namespace == "default""#);
        assert_eq!(p.spec.failure_strategy, Some(FailureStrategy::Ignore));
        let [cel, sidecar] = p.spec.domain_hooks.as_slice() else {
            panic!("two hooks: {:?}", p.spec.domain_hooks);
        };
        assert_eq!(
            cel.cel.as_ref().map(|c| c.expression.as_str()),
            Some(r#"Domain{Title: "t"}"#)
        );
        assert_eq!(cel.strategy(&p.spec), FailureStrategy::Ignore);
        assert_eq!(cel.timeout, None);
        assert_eq!(
            sidecar.sidecar.as_ref().map(|s| s.socket_path.as_str()),
            Some("/var/run/kubevirt-plugin/smbios-serial/hook.sock")
        );
        assert_eq!(sidecar.strategy(&p.spec), FailureStrategy::Fail);
        assert_eq!(sidecar.timeout, Some(Duration::from_secs(90)));
    }

    #[test]
    fn defaults_and_bad_fields() {
        let plugins =
            decode(br#"[{"metadata":{"name":"a"},"spec":{"domainHooks":null}}]"#).unwrap();
        assert!(plugins[0].spec.domain_hooks.is_empty());
        let hook = DomainHook::default();
        assert_eq!(hook.strategy(&plugins[0].spec), FailureStrategy::Fail);
        // An unknown strategy or a duration Go would not parse is an error, not a default.
        assert!(decode(br#"[{"spec":{"failureStrategy":"Retry"}}]"#).is_err());
        assert!(decode(br#"[{"spec":{"domainHooks":[{"timeout":"soon"}]}}]"#).is_err());
    }
}
