//! Checks of a [`NetConfig`] before it is planned: each rejected value names its field.

use crate::net::config::NetConfig;
use crate::net::NetError;

/// Tap queues KubeVirt allows at most.
pub const MAX_QUEUES: u32 = 256;

/// Rejects a configuration the plan cannot carry. Errors: [`NetError::InvalidConfig`] with the
/// field path (`pod_iface`, `vm_cidr_v4`, `ports[2].port`, `queues`, `mac`,
/// `dhcp_options.private_options[0].option`, `hostname`).
pub(super) fn validate(cfg: &NetConfig) -> Result<(), NetError> {
    let name = &cfg.pod_iface;
    if name.is_empty()
        || name.len() > 15
        || name.contains(['/', ' ', ':'])
        || name == "."
        || name == ".."
    {
        return Err(NetError::invalid(
            "pod_iface",
            format!("{name:?} is not a valid interface name"),
        ));
    }
    if cfg.vm_cidr_v4.prefix_len() > 30 {
        return Err(NetError::invalid(
            "vm_cidr_v4",
            format!("{} leaves fewer than 2 host addresses", cfg.vm_cidr_v4),
        ));
    }
    if cfg.vm_cidr_v6.prefix_len() > 126 {
        return Err(NetError::invalid(
            "vm_cidr_v6",
            format!("{} leaves fewer than 2 host addresses", cfg.vm_cidr_v6),
        ));
    }
    for (i, p) in cfg.ports.iter().enumerate() {
        if p.port == 0 {
            return Err(NetError::invalid(
                format!("ports[{i}].port"),
                "port 0 is not allowed",
            ));
        }
    }
    if cfg.queues == 0 || cfg.queues > MAX_QUEUES {
        return Err(NetError::invalid(
            "queues",
            format!("{} is outside 1..={MAX_QUEUES}", cfg.queues),
        ));
    }
    if let Some(mac) = cfg.mac {
        if mac[0] & 1 == 1 || mac == [0; 6] {
            return Err(NetError::invalid(
                "mac",
                "a multicast or zero MAC cannot be a NIC address",
            ));
        }
    }
    for (i, (code, _)) in cfg.dhcp_options.private_options.iter().enumerate() {
        if !(224..=254).contains(code) {
            return Err(NetError::invalid(
                format!("dhcp_options.private_options[{i}].option"),
                format!("{code} is outside the private range 224..=254"),
            ));
        }
    }
    if cfg.hostname.len() > 63 {
        return Err(NetError::invalid("hostname", "longer than 63 characters"));
    }
    Ok(())
}
