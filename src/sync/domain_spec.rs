//! The `api.Domain` spec of a started domain: the converter's model rendered as KubeVirt's JSON
//! (`qlauncher_libvirt_xml::to_api_spec`, the same model the libvirt XML export writes), KubeVirt's
//! grace-period metadata, and the live facts libvirt would add to the domain XML it reports: the
//! resolved machine type and the channels' connection state (`cmd/virt-launcher`,
//! `manager.go`'s `GetDomainSpecWithRuntimeInfo`, v1.9.0).

use serde_json::Value;
use tracing::warn;

use crate::cmdline::{ConverterContext, DomainPlan};
use crate::qmp::client::QmpClient;
use crate::qmp::commands::{QomGet, QueryChardev};
use crate::sync::domain::{ApiDomain, GracePeriodMetadata};
use crate::vmi::Vmi;

/// KubeVirt's grace period when the VMI sets none (`v1.DefaultGracePeriodSeconds`).
pub const DEFAULT_GRACE_PERIOD_SECONDS: i64 = 30;

/// Replaces `domain`'s spec with the converter's for `vmi` (the VMI the plan was converted from)
/// and sets the grace-period metadata. A plan the exporter cannot write (host hardware it does
/// not model) keeps the spec as it was, with a warning.
pub(crate) fn apply_converted(
    domain: &mut ApiDomain,
    vmi: &Vmi,
    ctx: &ConverterContext,
    plan: &DomainPlan,
) {
    let converted = qlauncher_libvirt_xml::export(vmi, ctx, plan)
        .and_then(|d| qlauncher_libvirt_xml::to_api_spec(&d));
    match converted {
        Ok(api) => {
            if let Err(e) = domain.spec.set_converted(api.spec) {
                warn!(error = %e, "the converted domain spec does not decode as api.DomainSpec");
            }
        }
        Err(e) => warn!(
            error = &e as &dyn std::error::Error,
            "cannot render the domain spec; reporting a partial domain"
        ),
    }
    if domain.spec.domain_type.is_empty() {
        domain.spec.domain_type = if ctx.kvm { "kvm" } else { "qemu" }.into();
    }
    // libvirt reports the current memory next to the memory (`<currentMemory>`).
    if !domain.spec.rest.contains_key("CurrentMemory") {
        if let Some(memory) = domain.spec.rest.get("Memory").cloned() {
            domain.spec.rest.insert("CurrentMemory".into(), memory);
        }
    }
    let seconds = vmi
        .spec
        .termination_grace_period_seconds
        .unwrap_or(DEFAULT_GRACE_PERIOD_SECONDS);
    let grace = domain
        .spec
        .metadata
        .kubevirt
        .grace_period
        .get_or_insert_with(GracePeriodMetadata::default);
    grace.deletion_grace_period_seconds = seconds;
}

/// What libvirt knows of a running QEMU and writes into the live domain XML.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct LiveFacts {
    /// The machine type QEMU resolved the alias to (`pc-q35-7.2` for `q35`).
    pub(crate) machine: Option<String>,
    /// Whether the guest has each virtio-serial channel open, by channel index (`charchannelN`).
    pub(crate) channels_open: Vec<(usize, bool)>,
}

/// Reads the resolved machine type (`qom-get /machine type`: `pc-q35-7.2-machine`) and the
/// channels' state (`query-chardev`: `frontend-open` of `charchannelN`). Missing answers leave
/// the fact out.
pub(crate) async fn live_facts(client: &QmpClient) -> LiveFacts {
    let mut facts = LiveFacts::default();
    let machine = client
        .run(&QomGet {
            path: "/machine".into(),
            property: "type".into(),
        })
        .await;
    if let Ok(Value::String(t)) = machine {
        facts.machine = Some(t.strip_suffix("-machine").unwrap_or(&t).to_owned());
    }
    if let Ok(chardevs) = client.run(&QueryChardev).await {
        for c in chardevs {
            if let Some(n) = c
                .label
                .strip_prefix("charchannel")
                .and_then(|n| n.parse().ok())
            {
                facts.channels_open.push((n, c.frontend_open));
            }
        }
    }
    facts
}

/// libvirt's channel state words.
pub(crate) fn channel_state(open: bool) -> &'static str {
    if open {
        "connected"
    } else {
        "disconnected"
    }
}

/// Writes `facts` into `domain`: `OS.Type.Machine` and `Devices.Channels[N].Target.State`. True
/// when something changed.
pub(crate) fn apply_live_facts(domain: &mut ApiDomain, facts: &LiveFacts) -> bool {
    let mut changed = false;
    if let Some(machine) = &facts.machine {
        changed |= domain.spec.set_machine(machine);
    }
    for &(index, open) in &facts.channels_open {
        changed |= set_channel_open(domain, index, open);
    }
    changed
}

/// Sets the state of channel `index` (QEMU's `channelN` / `charchannelN`). True when it changed.
pub(crate) fn set_channel_open(domain: &mut ApiDomain, index: usize, open: bool) -> bool {
    let Some(channel) = domain.spec.devices.channels.get_mut(index) else {
        return false;
    };
    let state = channel_state(open);
    if channel.target.state.as_deref() == Some(state) {
        return false;
    }
    channel.target.state = Some(state.to_owned());
    true
}
