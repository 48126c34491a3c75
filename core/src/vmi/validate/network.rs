//! Rules for interfaces and networks (`pkg/network/admitter/*.go`).

use std::collections::BTreeMap;

use super::syntax::*;
use super::*;

pub(super) fn validate_interfaces(
    spec: &VmiSpec,
    e: &mut Errors,
    boot: &mut BTreeMap<u32, String>,
) {
    let networks = spec.networks.as_deref().unwrap_or(&[]);
    let ifaces = spec.domain.devices.interfaces.as_deref().unwrap_or(&[]);
    for (i, iface) in ifaces.iter().enumerate() {
        let p = format!("spec.domain.devices.interfaces[{i}]");
        if let Some(j) = ifaces[..i].iter().position(|o| o.name == iface.name) {
            e.add(
                format!("{p}.name"),
                format!("duplicates the name of spec.domain.devices.interfaces[{j}]"),
            );
        }
        let net = networks.iter().find(|n| n.name == iface.name);
        if iface.name.is_empty()
            || !iface
                .name
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        {
            e.add(
                format!("{p}.name"),
                "may only contain letters, digits, '-' and '_'",
            );
        } else if net.is_none() {
            e.add(
                format!("{p}.name"),
                format!("no network named '{}'", iface.name),
            );
        }
        let set = iface.bindings();
        if set.len() > 1 {
            e.add(
                p.clone(),
                format!(
                    "must have exactly one binding method (found {})",
                    set.join(", ")
                ),
            );
        } else if set.is_empty() {
            e.add(p.clone(), "must have a binding method");
        }
        for deprecated in ["slirp", "macvtap", "passt"] {
            if set.contains(&deprecated) {
                e.add(
                    format!("{p}.{deprecated}"),
                    format!("the {deprecated} binding is discontinued"),
                );
            }
        }
        if let Some(net) = net {
            if iface.masquerade.is_some() && net.pod.is_none() {
                e.add(
                    format!("{p}.masquerade"),
                    "masquerade is only possible on the pod network",
                );
            }
            if iface.passt_binding.is_some() && net.pod.is_none() {
                e.add(
                    format!("{p}.passtBinding"),
                    "passt is only possible on the pod network",
                );
            }
        }
        if let Some(b) = &iface.binding {
            if b.name.is_empty() {
                e.add(format!("{p}.binding.name"), "is required");
            }
        }
        if !one_of(&iface.model, &INTERFACE_MODELS) {
            e.add(
                format!("{p}.model"),
                format!("must be one of {}", INTERFACE_MODELS.join(", ")),
            );
        }
        if let Some(mac) = &iface.mac_address {
            if !is_mac_address(mac) {
                e.add(
                    format!("{p}.macAddress"),
                    format!("{mac:?} is not a valid MAC address (aa:bb:cc:dd:ee:ff)"),
                );
            }
        }
        if let Some(pci) = &iface.pci_address {
            if !is_pci_address(pci) {
                e.add(
                    format!("{p}.pciAddress"),
                    format!("malformed PCI address {pci:?}"),
                );
            }
        }
        check_boot_order(e, boot, iface.boot_order, &p);
        let ports = iface.ports.as_deref().unwrap_or(&[]);
        for (j, port) in ports.iter().enumerate() {
            let pp = format!("{p}.ports[{j}]");
            if port.port == 0 {
                e.add(format!("{pp}.port"), "is required");
            } else if !(1..=65535).contains(&port.port) {
                e.add(format!("{pp}.port"), "must be in range 0 < x < 65536");
            }
            if !one_of(&port.protocol, &["TCP", "UDP"]) {
                e.add(format!("{pp}.protocol"), "must be one of TCP, UDP");
            }
            if let Some(name) = &port.name {
                if ports[..j].iter().any(|o| o.name.as_ref() == Some(name)) {
                    e.add(
                        format!("{pp}.name"),
                        format!("duplicate port name {name:?}"),
                    );
                }
            }
        }
        if iface.port_ranges.is_some() && iface.ports.is_some() {
            e.add(
                format!("{p}.portRanges"),
                "cannot be set together with ports",
            );
        }
        for (j, r) in iface.port_ranges.iter().flatten().enumerate() {
            let rp = format!("{p}.portRanges[{j}]");
            if !(1..=65535).contains(&r.start) {
                e.add(format!("{rp}.start"), "must be in range 0 < x < 65536");
            }
            if !(1..=65535).contains(&r.end) {
                e.add(format!("{rp}.end"), "must be in range 0 < x < 65536");
            } else if r.start > r.end {
                e.add(format!("{rp}.start"), "must be less than or equal to end");
            }
        }
        if let Some(dhcp) = &iface.dhcp_options {
            for (j, o) in dhcp.private_options.iter().flatten().enumerate() {
                if !(224..=254).contains(&o.option) {
                    e.add(
                        format!("{p}.dhcpOptions.privateOptions[{j}].option"),
                        "must be in range 224..=254",
                    );
                }
            }
        }
        if !one_of(&iface.state, &["up", "down", "absent"]) {
            e.add(format!("{p}.state"), "must be one of up, down, absent");
        }
        if iface.acpi_index.is_some_and(|a| !(0..=16383).contains(&a)) {
            e.add(format!("{p}.acpiIndex"), "must be in range 0..=16383");
        }
    }
}

pub(super) fn validate_networks(spec: &VmiSpec, e: &mut Errors) {
    let networks = spec.networks.as_deref().unwrap_or(&[]);
    let ifaces = spec.domain.devices.interfaces.as_deref().unwrap_or(&[]);
    let mut pod_seen = None;
    for (i, net) in networks.iter().enumerate() {
        let p = format!("spec.networks[{i}]");
        if let Some(j) = networks[..i].iter().position(|o| o.name == net.name) {
            e.add(
                format!("{p}.name"),
                format!("duplicates the name of spec.networks[{j}]"),
            );
        } else if !ifaces.iter().any(|f| f.name == net.name) {
            e.add(
                format!("{p}.name"),
                format!("no interface named '{}'", net.name),
            );
        }
        let sources = [
            net.pod.is_some(),
            net.multus.is_some(),
            net.resource_claim.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if sources != 1 {
            e.add(
                p.clone(),
                "must have exactly one source (pod, multus or resourceClaim)",
            );
        }
        if net.pod.is_some() {
            if let Some(j) = pod_seen {
                e.add(
                    format!("{p}.pod"),
                    format!("only one pod network is allowed (also spec.networks[{j}])"),
                );
            }
            pod_seen = Some(i);
        }
        if let Some(m) = &net.multus {
            if m.network_name.is_empty() {
                e.add(format!("{p}.multus.networkName"), "is required");
            }
        }
    }
}
