//! The pod network: the binding of each VMI interface on the pod network (masquerade or bridge),
//! set up in the launcher's own network namespace ([`crate::net::apply()`]), and the DHCP servers.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::cmdline::FieldPath;
use crate::net::{self, Binding, NetConfig, NetPlan, Port, Protocol};
use crate::storage;
use crate::sync::error::SyncError;
use crate::sys::mac::MacAddr;
use crate::vmi::Vmi;

/// The network setup of each VMI interface bound to the pod network (masquerade or bridge).
pub(crate) fn net_configs(
    vmi: &Vmi,
    runtime_uid: u32,
) -> Result<Vec<(String, NetConfig)>, SyncError> {
    let mut out = Vec::new();
    let hostname = storage::cloud_init::vmi_hostname(
        vmi.metadata.name.as_deref().unwrap_or_default(),
        vmi.spec.hostname.as_deref(),
    );
    for (index, iface) in vmi
        .spec
        .domain
        .devices
        .interfaces
        .iter()
        .flatten()
        .enumerate()
    {
        let Some(network) = vmi.network(&iface.name) else {
            continue;
        };
        if network.multus.is_some() {
            // Secondary networks: [`super::secondary`].
            continue;
        }
        if network.pod.is_none() {
            warn!(interface = %iface.name, "only pod and Multus networks are set up; interface skipped");
            continue;
        }
        let binding = if iface.masquerade.is_some() {
            Binding::Masquerade
        } else if iface.bridge.is_some() {
            Binding::Bridge
        } else {
            warn!(interface = %iface.name, "binding not supported; interface skipped");
            continue;
        };
        let field = FieldPath::new("spec.domain.devices.interfaces").index(index);
        let mut ports = Vec::new();
        for (i, p) in iface.ports.iter().flatten().enumerate() {
            let port_field = field.key("ports").index(i);
            let protocol =
                Protocol::parse(p.protocol.as_deref().unwrap_or("")).ok_or_else(|| {
                    SyncError::invalid_field(port_field.key("protocol"), "not TCP or UDP")
                })?;
            let port = u16::try_from(p.port).map_err(|_| {
                SyncError::invalid_field(port_field.key("port"), "not a port number")
            })?;
            ports.push(Port { protocol, port });
        }
        let mac = match iface.mac_address.as_deref() {
            Some(m) => Some(m.parse::<MacAddr>().map(|m| m.0).map_err(|_| {
                SyncError::invalid_field(
                    field.key("macAddress"),
                    format!("{m:?} is not a MAC address"),
                )
            })?),
            None => None,
        };
        out.push((
            iface.name.clone(),
            NetConfig {
                binding,
                pod_iface: "eth0".into(),
                ports,
                mac,
                runtime_uid,
                hostname: hostname.clone(),
                subdomain: vmi.spec.subdomain.clone(),
                istio: net::config::istio_proxy_injection(vmi),
                // KubeVirt skips forwarding libvirt's migration ports unless the VMI migrates
                // over Unix sockets (`pkg/network/setup/netconf.go`, `newMasqueradeAdapter`).
                legacy_migration_ports: vmi
                    .status
                    .as_ref()
                    .and_then(|s| s.migration_transport.as_deref())
                    != Some("Unix"),
                ..NetConfig::default()
            },
        ));
        // Only the primary pod interface exists in a pod without Multus.
        break;
    }
    Ok(out)
}

/// Sets up the binding `cfg` of the pod interface in this (the pod's) network namespace and
/// starts its DHCP servers until `stop` turns true; returns the applied plan.
pub(crate) async fn setup_network(
    resolv_conf: &Path,
    cfg: &NetConfig,
    stop: watch::Receiver<bool>,
) -> Result<NetPlan, SyncError> {
    let (handle, conn) = net::apply::connect().await.map_err(SyncError::Net)?;
    let facts = net::discover(&handle, &cfg.pod_iface, resolv_conf).await;
    conn.abort();
    let facts = facts.map_err(SyncError::Net)?;
    let plan = net::plan(cfg, &facts).map_err(SyncError::Net)?;
    net::apply(&plan).await.map_err(SyncError::Net)?;
    serve_dhcp(&plan, stop)?;
    info!(iface = %cfg.pod_iface, tap = %plan.tap, "pod network ready");
    Ok(plan)
}

/// Reads the pod interface of `cfg` and plans its binding (nothing is changed).
pub(crate) async fn plan_binding(
    cfg: &NetConfig,
    resolv_conf: &Path,
) -> Result<NetPlan, SyncError> {
    let (handle, conn) = net::apply::connect().await.map_err(SyncError::Net)?;
    let facts = net::discover(&handle, &cfg.pod_iface, resolv_conf).await;
    conn.abort();
    let facts = facts.map_err(SyncError::Net)?;
    net::plan(cfg, &facts).map_err(SyncError::Net)
}

/// Starts the DHCPv4/DHCPv6 servers `plan` asks for, until `stop` turns true (KubeVirt starts
/// one per masquerade or bridge interface, `pkg/network/dhcp`).
pub fn serve_dhcp(plan: &NetPlan, stop: watch::Receiver<bool>) -> Result<(), SyncError> {
    async fn stopped(mut rx: watch::Receiver<bool>) {
        let _ = rx.wait_for(|s| *s).await;
    }
    if let Some(v4) = plan.dhcp_v4.clone() {
        let sock = net::dhcp::v4::bind(&v4.iface).map_err(SyncError::Net)?;
        let server = Arc::new(net::dhcp::v4::DhcpV4Server::new(v4).map_err(SyncError::Net)?);
        let stats = Arc::new(net::dhcp::DhcpStats::default());
        tokio::spawn(net::dhcp::v4::serve(
            sock,
            server,
            stats,
            stopped(stop.clone()),
        ));
    }
    if let Some(v6) = plan.dhcp_v6.clone() {
        let sock = net::dhcp::v6::bind(&v6.iface).map_err(SyncError::Net)?;
        let stats = Arc::new(net::dhcp::DhcpStats::default());
        tokio::spawn(net::dhcp::v6::serve(
            sock,
            Arc::new(v6),
            stats,
            stopped(stop),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(status: serde_json::Value) -> Vmi {
        let vmi = serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm", "namespace": "default"},
            "spec": {
                "domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {}}]}},
                "networks": [{"name": "default", "pod": {}}]
            },
            "status": status
        });
        Vmi::from_json_or_yaml(&vmi.to_string()).unwrap()
    }

    #[test]
    fn migration_ports_are_skipped_unless_the_vmi_migrates_over_unix_sockets() {
        let legacy = |status| {
            net_configs(&vmi(status), 107).unwrap()[0]
                .1
                .legacy_migration_ports
        };
        assert!(legacy(serde_json::json!({})));
        assert!(!legacy(serde_json::json!({"migrationTransport": "Unix"})));
    }
}
