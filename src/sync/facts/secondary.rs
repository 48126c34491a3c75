//! Secondary interfaces: the VMI's interfaces on Multus networks, as KubeVirt names and hot-plugs
//! them (`pkg/virt-launcher/virtwrap/network`, `pkg/network/namescheme`, v1.9.0). Which are
//! attached to the pod, their pod interface and binding, and the VMI as the converter sees it.

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};

use crate::cmdline::FieldPath;
use crate::net::{Binding, NetConfig};
use crate::sync::error::SyncError;
use crate::sys::mac::MacAddr;
use crate::vmi::Vmi;

/// The `infoSource` token virt-handler sets when Multus reports the interface in the pod.
pub const MULTUS_STATUS: &str = "multus-status";

/// KubeVirt's pod interface name for a secondary network: `pod` + the first 11 hex digits of the
/// SHA-256 of the network name (`namescheme.GenerateHashedInterfaceName`); `blue` gives
/// `pod16477688c0e`.
pub fn hashed_pod_iface(network: &str) -> String {
    let digest = Sha256::digest(network.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("pod{}", &hex[..11])
}

/// One Multus interface of the VMI that is not `absent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecondaryIface {
    /// The interface (and network) name.
    pub name: String,
    /// Multus reported it attached to the pod: it may be plugged.
    pub ready: bool,
    /// The binding setup (bridge binding on its pod interface).
    pub cfg: NetConfig,
}

/// The Multus interfaces of `vmi` (not `absent`), in spec order. Errors name the interface when
/// its binding cannot be hot-plugged (KubeVirt hot-plugs the bridge binding only) or its MAC is bad.
pub fn secondary_ifaces(vmi: &Vmi, runtime_uid: u32) -> Result<Vec<SecondaryIface>, SyncError> {
    let mut out = Vec::new();
    let hostname = crate::storage::cloud_init::vmi_hostname(
        vmi.metadata.name.as_deref().unwrap_or_default(),
        vmi.spec.hostname.as_deref(),
    );
    let statuses = vmi.status.as_ref().and_then(|s| s.interfaces.as_ref());
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
        if network.multus.is_none() || iface.state.as_deref() == Some("absent") {
            continue;
        }
        // An SR-IOV VF is a host device, not a tap: planned with VFIO from the device plugin's
        // variables (`cmdline/devices/hostdevs.rs`), or plugged by `HotplugHostDevices`.
        if iface.sriov.is_some() {
            continue;
        }
        let field = FieldPath::new("spec.domain.devices.interfaces").index(index);
        if iface.bridge.is_none() {
            return Err(SyncError::Unsupported(format!(
                "{field} ({}): only the bridge binding is supported on a Multus network",
                iface.name
            )));
        }
        let status = statuses
            .into_iter()
            .flatten()
            .find(|s| s.name.as_deref() == Some(iface.name.as_str()));
        let ready = status
            .and_then(|s| s.info_source.as_deref())
            .is_some_and(|src| src.split(',').any(|t| t.trim() == MULTUS_STATUS));
        let pod_iface = status
            .and_then(|s| s.pod_interface_name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| hashed_pod_iface(&network.name));
        let mac = match iface.mac_address.as_deref().filter(|m| !m.is_empty()) {
            Some(m) => Some(m.parse::<MacAddr>().map(|m| m.0).map_err(|_| {
                SyncError::invalid_field(
                    field.key("macAddress"),
                    format!("{m:?} is not a MAC address"),
                )
            })?),
            None => None,
        };
        out.push(SecondaryIface {
            name: iface.name.clone(),
            ready,
            cfg: NetConfig {
                binding: Binding::Bridge,
                pod_iface,
                mac,
                runtime_uid,
                hostname: hostname.clone(),
                subdomain: vmi.spec.subdomain.clone(),
                iface_index: u8::try_from(index).unwrap_or(u8::MAX),
                ..NetConfig::default()
            },
        });
    }
    Ok(out)
}

/// `vmi` as the converter should see it: Multus interfaces not yet attached to the pod are
/// `absent` (left out of the domain until virt-handler reports them).
pub fn convert_view(vmi: &Vmi, secondary: &[SecondaryIface]) -> Vmi {
    let pending: BTreeSet<&str> = secondary
        .iter()
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let mut view = vmi.clone();
    if pending.is_empty() {
        return view;
    }
    for iface in view.spec.domain.devices.interfaces.iter_mut().flatten() {
        if pending.contains(iface.name.as_str()) {
            iface.state = Some("absent".into());
        }
    }
    view
}

/// The part of the VMI status that decides NIC hotplug (compared between syncs with the spec):
/// `(name, podInterfaceName, infoSource)` of the interfaces Multus reports.
pub fn status_key(vmi: &Vmi) -> Vec<(String, String, String)> {
    vmi.status
        .as_ref()
        .and_then(|s| s.interfaces.as_ref())
        .into_iter()
        .flatten()
        .filter(|s| {
            s.info_source
                .as_deref()
                .is_some_and(|src| src.contains(MULTUS_STATUS))
        })
        .map(|s| {
            (
                s.name.clone().unwrap_or_default(),
                s.pod_interface_name.clone().unwrap_or_default(),
                s.info_source.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(json: serde_json::Value) -> Vmi {
        serde_json::from_value(json).unwrap()
    }

    fn blue(status: serde_json::Value) -> Vmi {
        vmi(serde_json::json!({
            "metadata": {"name": "demo.x", "namespace": "ns"},
            "spec": {
                "domain": {"devices": {"interfaces": [
                    {"name": "default", "masquerade": {}},
                    {"name": "blue", "bridge": {}, "macAddress": "02:00:00:00:00:0B"}
                ]}},
                "networks": [
                    {"name": "default", "pod": {}},
                    {"name": "blue", "multus": {"networkName": "ns/blue-net"}}
                ]
            },
            "status": status
        }))
    }

    #[test]
    fn hashed_names_match_kubevirt() {
        assert_eq!(hashed_pod_iface("blue"), "pod16477688c0e");
        assert_eq!(hashed_pod_iface("default"), "pod37a8eec1ce1");
    }

    #[test]
    fn multus_interfaces_are_ready_once_multus_reports_them() {
        let v = blue(serde_json::json!({}));
        let s = secondary_ifaces(&v, 107).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(
            (s[0].name.as_str(), s[0].ready, s[0].cfg.pod_iface.as_str()),
            ("blue", false, "pod16477688c0e")
        );
        assert_eq!(s[0].cfg.binding, Binding::Bridge);
        assert_eq!(s[0].cfg.mac, Some([2, 0, 0, 0, 0, 0x0b]));
        assert_eq!(s[0].cfg.hostname, "demo");
        assert_eq!(s[0].cfg.iface_index, 1);
        let view = convert_view(&v, &s);
        let states: Vec<Option<&str>> = view
            .spec
            .domain
            .devices
            .interfaces
            .iter()
            .flatten()
            .map(|i| i.state.as_deref())
            .collect();
        assert_eq!(states, vec![None, Some("absent")]);
        assert!(status_key(&v).is_empty());

        let v = blue(serde_json::json!({"interfaces": [
            {"name": "blue", "podInterfaceName": "net1", "infoSource": "domain, multus-status"}
        ]}));
        let s = secondary_ifaces(&v, 107).unwrap();
        assert_eq!((s[0].ready, s[0].cfg.pod_iface.as_str()), (true, "net1"));
        assert_eq!(convert_view(&v, &s), v);
        assert_eq!(
            status_key(&v),
            vec![(
                "blue".to_string(),
                "net1".to_string(),
                "domain, multus-status".to_string()
            )]
        );
    }

    #[test]
    fn absent_and_non_bridge_multus_interfaces() {
        let mut v = blue(serde_json::json!({}));
        let ifaces = v.spec.domain.devices.interfaces.as_mut().unwrap();
        ifaces[1].state = Some("absent".into());
        assert!(secondary_ifaces(&v, 0).unwrap().is_empty());
        let ifaces = v.spec.domain.devices.interfaces.as_mut().unwrap();
        ifaces[1].state = None;
        ifaces[1].bridge = None;
        ifaces[1].sriov = Some(Default::default());
        assert!(
            secondary_ifaces(&v, 0).unwrap().is_empty(),
            "SR-IOV: no tap"
        );
        let ifaces = v.spec.domain.devices.interfaces.as_mut().unwrap();
        ifaces[1].sriov = None;
        ifaces[1].masquerade = Some(Default::default());
        let e = secondary_ifaces(&v, 0).unwrap_err().to_string();
        assert_eq!(
            e,
            "not supported by qlauncher: spec.domain.devices.interfaces[1] (blue): only the \
             bridge binding is supported on a Multus network"
        );
    }
}
