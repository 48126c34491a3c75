//! What the running QEMU tells of the domain, written into the `api.Domain` as libvirt writes it
//! into its live XML (`manager.go`'s `GetDomainSpecWithRuntimeInfo`, v1.9.0): where QEMU put the
//! devices a hotplug added ([`report_hotplug`], over the re-converted spec of
//! [`crate::sync::domain_spec`]), the machine type it resolved and the channels' connection state
//! ([`live_facts`]).

use serde_json::{json, Value};

use crate::cmdline::{ConverterContext, DomainPlan};
use crate::qmp::client::QmpClient;
use crate::qmp::commands::{QomGet, QueryChardev};
use crate::sync::domain::ApiDomain;
use crate::sync::domain_spec::{added_pci_devices, apply_converted, set_device_address};
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

/// Where QEMU has the PCI device `id`, as an `api.Address` (`Bus` is libvirt's controller index:
/// the `N` of root port `pci.N`, 0 on `pcie.0`). `None` when QEMU does not answer (unplugged
/// meanwhile, or not a PCI device).
pub(crate) async fn qemu_pci_address(client: &QmpClient, id: &str) -> Option<Value> {
    let path = format!("/machine/peripheral/{id}");
    let get = |property: &'static str| QomGet {
        path: path.clone(),
        property: property.into(),
    };
    let bus = client.run(&get("parent_bus")).await.ok()?;
    let devfn = client.run(&get("addr")).await.ok()?;
    pci_address(bus.as_str()?, &devfn)
}

/// The `api.Address` of a device on QOM bus `parent_bus` (`/machine/peripheral/pci.5/pci.5`,
/// `/machine/q35/pcie.0`) at `addr` (QEMU 7.2 answers the devfn as a number: 34 is slot 4
/// function 2; a `04.2` string is read too).
fn pci_address(parent_bus: &str, addr: &Value) -> Option<Value> {
    let bus = parent_bus.rsplit('/').next()?;
    let bus: u32 = match bus.strip_prefix("pci.") {
        Some(n) => n.parse().ok()?,
        None if bus.starts_with("pcie.") => 0,
        None => return None,
    };
    let devfn = match addr {
        Value::Number(n) => u32::try_from(n.as_u64()?).ok()?,
        Value::String(s) => {
            let (slot, function) = s.split_once('.').unwrap_or((s, "0"));
            u32::from_str_radix(slot, 16).ok()? << 3 | u32::from_str_radix(function, 16).ok()?
        }
        _ => return None,
    };
    Some(json!({
        "Type": "pci",
        "Domain": "0x0000",
        "Bus": format!("0x{bus:02x}"),
        "Slot": format!("0x{:02x}", devfn >> 3),
        "Function": format!("0x{:x}", devfn & 7),
    }))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_buses_and_devfns_become_libvirt_addresses() {
        let address = |bus: &str, slot: &str, function: &str| {
            Some(
                json!({"Type": "pci", "Domain": "0x0000", "Bus": bus, "Slot": slot, "Function": function}),
            )
        };
        assert_eq!(
            pci_address("/machine/peripheral/pci.5/pci.5", &json!(0)),
            address("0x05", "0x00", "0x0")
        );
        assert_eq!(
            pci_address("/machine/q35/pcie.0", &json!(34)),
            address("0x00", "0x04", "0x2")
        );
        assert_eq!(
            pci_address("/machine/peripheral/pci.12/pci.12", &json!("00.0")),
            address("0x0c", "0x00", "0x0")
        );
        assert_eq!(
            pci_address("/machine/peripheral/scsi0/scsi0.0", &json!(0)),
            None
        );
    }
}
