//! What the running QEMU tells of the domain, written into the `api.Domain` as libvirt writes it
//! into its live XML (`manager.go`'s `GetDomainSpecWithRuntimeInfo`, v1.9.0): where QEMU put the
//! devices a hotplug added ([`report_hotplug`], over the re-converted spec of
//! [`crate::sync::domain_spec`]), the machine type it resolved and the channels' connection state
//! ([`live_facts`]).

use serde_json::Value;

use crate::cmdline::{ConverterContext, DomainPlan};
use crate::qmp::client::QmpClient;
use crate::qmp::commands::{QomGet, QueryChardev};
use crate::sync::domain::ApiDomain;
use crate::sync::domain_spec::{
    added_pci_devices, apply_converted, qemu_pci_address, set_device_address,
};
use crate::sync::error::SyncError;
use crate::sync::state::Shared;
use crate::vmi::Vmi;

/// Reports the domain after a hotplug: the spec re-converted from `plan` ([`apply_converted`]:
/// the devices that ran keep their identity), the added PCI devices at the address QEMU gave
/// them; MODIFIED is notified when the spec changed.
///
/// # Errors
/// As [`apply_converted`] (the domain is left as it was).
pub(crate) async fn report_hotplug(
    shared: &Shared,
    client: &QmpClient,
    vmi: &Vmi,
    ctx: &ConverterContext,
    plan: &DomainPlan,
) -> Result<(), SyncError> {
    let added = {
        let domain = shared.domain.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = domain.as_ref() else {
            return Ok(());
        };
        let mut probe = d.clone();
        apply_converted(&mut probe, vmi, ctx, plan)?;
        added_pci_devices(&d.spec, &probe.spec)
    };
    let mut placed = Vec::new();
    for id in added {
        if let Some(address) = qemu_pci_address(client, &id).await {
            placed.push((id, address));
        }
    }
    let mut failed = None;
    shared.update_domain(|d| {
        let before = d.spec.clone();
        if let Err(e) = apply_converted(d, vmi, ctx, plan) {
            failed = Some(e);
            return false;
        }
        for (id, address) in &placed {
            set_device_address(&mut d.spec, id, address);
        }
        d.spec != before
    });
    failed.map_or(Ok(()), Err)
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

/// Writes `facts` into `domain`: `OS.Type.Machine` and `Devices.Channels[N].Target.State`. True
/// when something changed.
pub(crate) fn apply_live_facts(domain: &mut ApiDomain, facts: &LiveFacts) -> bool {
    let mut changed = false;
    if let Some(machine) = &facts.machine {
        changed |= domain.spec.set_machine(machine);
    }
    for &(index, open) in &facts.channels_open {
        changed |= domain.spec.set_channel_open(index, open);
    }
    changed
}
