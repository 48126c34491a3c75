//! The domain as virt-handler sees it: the subset of KubeVirt's `api.Domain`
//! (`pkg/virt-launcher/virtwrap/api/schema.go`, v1.9.0) that qlauncher fills, with the same JSON
//! field names.
//!
//! virt-handler decodes this JSON from `GetDomain` answers and from every `HandleDomainEvent`
//! notification, and derives the VMI phase, interfaces, guest OS info and grace-period handling from
//! it. KubeVirt's Go structs carry no `json` tags, so most keys are the Go field names (`Spec`,
//! `Status`, `Interfaces`, `Mac`), except the embedded Kubernetes `ObjectMeta` (`name`, `uid`,
//! `deletionTimestamp`). Fields qlauncher never fills are left out; Go's decoder ignores the
//! absence.
//!
//! The spec is the converter's: [`ApiDomainSpec::set_converted`] takes the `api.DomainSpec` JSON
//! that `compat/libvirt-xml` renders from the same model it writes as libvirt XML (memory, OS, CPU,
//! features, sysinfo, clock, every device); the fields the launcher updates live (interfaces,
//! disks, channels, metadata) are typed, the rest is kept as the renderer wrote it (`rest`).
//!
//! Here: the domain and its spec; [`devices`] has the device types, [`metadata`] the
//! `<metadata><kubevirt>` records (grace period, memory dump, migration), [`status`] the status
//! and event types (all re-exported here).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::time::SystemTime;

pub mod devices;
pub mod identity;
pub mod metadata;
pub mod status;

pub use devices::*;
pub use metadata::*;
pub use status::*;

/// KubeVirt's `api.Domain`: metadata, the domain spec and the live status.
///
/// JSON shape: `{"ObjectMeta": {...}, "Spec": {...}, "Status": {...}}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApiDomain {
    /// Kubernetes object metadata: the VMI's name, namespace and UID, and the deletion timestamp
    /// that marks the final notification.
    #[serde(rename = "ObjectMeta", default)]
    pub object_meta: ObjectMeta,
    /// What the domain is made of (libvirt's domain XML in KubeVirt, the launch plan here).
    #[serde(rename = "Spec", default)]
    pub spec: ApiDomainSpec,
    /// Run state, its reason, and guest-agent data.
    #[serde(rename = "Status", default)]
    pub status: DomainStatus,
}

impl ApiDomain {
    /// A domain for the VMI `namespace/name`: metadata filled, spec name `<namespace>_<name>` (the
    /// libvirt domain name KubeVirt uses, `util.DomainFromNamespaceName`), metadata UID `vmi_uid`,
    /// status `NoState` with no reason.
    pub fn for_vmi(namespace: &str, name: &str, vmi_uid: &str) -> ApiDomain {
        ApiDomain {
            object_meta: ObjectMeta {
                name: name.to_owned(),
                namespace: namespace.to_owned(),
                uid: vmi_uid.to_owned(),
                ..ObjectMeta::default()
            },
            spec: ApiDomainSpec {
                name: format!("{namespace}_{name}"),
                metadata: Metadata {
                    kubevirt: KubeVirtMetadata {
                        uid: vmi_uid.to_owned(),
                        grace_period: None,
                        memory_dump: None,
                        migration: None,
                        backup: None,
                    },
                },
                ..ApiDomainSpec::default()
            },
            status: DomainStatus::default(),
        }
    }

    /// Sets the run state and its reason (KubeVirt's `Domain.SetState`).
    pub fn set_state(&mut self, state: LifeCycle, reason: StateChangeReason) {
        self.status.status = state;
        self.status.reason = reason;
    }

    /// Turns this domain into KubeVirt's "final delete notification": state `NoState`, reason
    /// `NonExistent`, and `ObjectMeta.deletionTimestamp` set to `now` (RFC 3339, seconds, UTC).
    ///
    /// virt-handler treats a domain with a deletion timestamp as gone
    /// (`pkg/virt-handler/controller.go`, `getDomainFromCache`) and virt-launcher waits for this
    /// event before exiting (`cmd/virt-launcher/virt-launcher.go`, `waitForFinalNotify`).
    pub fn mark_deleted(&mut self, now: SystemTime) {
        self.set_state(LifeCycle::NoState, StateChangeReason::NonExistent);
        self.object_meta.deletion_timestamp = Some(kubernetes_time(now));
    }
}

/// Formats a time the way Kubernetes' `metav1.Time` does in JSON: RFC 3339 in UTC with whole
/// seconds, e.g. `2026-11-30T00:30:22Z`.
pub fn kubernetes_time(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

/// The part of Kubernetes' `metav1.ObjectMeta` a domain carries.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// The VMI's name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The VMI's namespace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The VMI's UID.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// Always `null` on the wire, as for KubeVirt's domains (kept for the identical shape).
    #[serde(rename = "creationTimestamp", default)]
    pub creation_timestamp: Option<String>,
    /// Set (RFC 3339, UTC, seconds) only on the final notification after the domain is gone.
    #[serde(
        rename = "deletionTimestamp",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub deletion_timestamp: Option<String>,
}

/// The part of KubeVirt's `api.DomainSpec` qlauncher fills. Keys are the Go field names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApiDomainSpec {
    /// Domain type: `kvm`, or `qemu` under software emulation.
    #[serde(rename = "Type", default)]
    pub domain_type: String,
    /// Domain name, `<namespace>_<vmi name>`.
    #[serde(rename = "Name", default)]
    pub name: String,
    /// Firmware UUID (also QEMU's `-uuid`), lower-case hyphenated.
    #[serde(rename = "UUID", default)]
    pub uuid: String,
    /// Devices virt-handler looks at.
    #[serde(rename = "Devices", default)]
    pub devices: Devices,
    /// KubeVirt's own metadata block.
    #[serde(rename = "Metadata", default)]
    pub metadata: Metadata,
    /// The other fields of the converted spec (`Memory`, `CurrentMemory`, `OS`, `CPU`, `VCPU`,
    /// `Features`, `SysInfo`, `Clock`, ...), Go field names as keys.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl ApiDomainSpec {
    /// Replaces this spec with `converted` (an `api.DomainSpec` JSON object, from
    /// `qlauncher_libvirt_xml::to_api_spec`), keeping the name, the metadata and what the launcher
    /// tracks live: the interfaces' MACs when the converted ones have none, and the channels'
    /// connection state.
    ///
    /// # Errors
    /// The decoding error when `converted` does not have the shape of `api.DomainSpec` (nothing
    /// is changed then).
    pub fn set_converted(
        &mut self,
        converted: Map<String, Value>,
    ) -> Result<(), serde_json::Error> {
        let mut next: ApiDomainSpec = serde_json::from_value(Value::Object(converted))?;
        next.name = std::mem::take(&mut self.name);
        next.metadata = std::mem::take(&mut self.metadata);
        if next.uuid.is_empty() {
            next.uuid = std::mem::take(&mut self.uuid);
        }
        for iface in &mut next.devices.interfaces {
            if iface.mac.is_none() {
                iface.mac = self
                    .devices
                    .interfaces
                    .iter()
                    .find(|old| old.alias.is_some() && old.alias == iface.alias)
                    .and_then(|old| old.mac.clone());
            }
        }
        for channel in &mut next.devices.channels {
            if let Some(old) = self
                .devices
                .channels
                .iter()
                .find(|old| old.target.name == channel.target.name)
            {
                channel.target.state = old.target.state.clone();
            }
        }
        // The machine type QEMU resolved stays (the converter writes the alias, `q35`).
        if let Some(machine) = self.machine().filter(|m| !m.is_empty()) {
            let machine = machine.to_owned();
            next.set_machine(&machine);
        }
        *self = next;
        Ok(())
    }

    /// `OS.Type.Machine`, when set.
    pub fn machine(&self) -> Option<&str> {
        self.rest.get("OS")?.get("Type")?.get("Machine")?.as_str()
    }

    /// Sets `OS.Type.Machine` (creating `OS.Type` when missing). True when it changed.
    pub fn set_machine(&mut self, machine: &str) -> bool {
        if self.machine() == Some(machine) {
            return false;
        }
        let os = self
            .rest
            .entry("OS")
            .or_insert_with(|| Value::Object(Map::new()));
        if !os.is_object() {
            *os = Value::Object(Map::new());
        }
        let os_type = os
            .as_object_mut()
            .map(|o| o.entry("Type").or_insert_with(|| Value::Object(Map::new())));
        if let Some(t) = os_type {
            if !t.is_object() {
                *t = Value::Object(Map::new());
            }
            if let Some(t) = t.as_object_mut() {
                t.insert("Machine".into(), Value::String(machine.to_owned()));
            }
        }
        true
    }

    /// Marks the first `enabled` vCPUs of `VCPUs` enabled and the others not (libvirt's live
    /// `<vcpus>` after `setvcpus`); the list itself (every vCPU up to maxSockets, hotpluggable
    /// flags) stays. True when it changed; a domain without the list (no CPU hotplug) is left.
    pub fn set_vcpus_enabled(&mut self, enabled: u32) -> bool {
        let Some(list) = self
            .rest
            .get_mut("VCPUs")
            .and_then(|v| v.get_mut("VCPU"))
            .and_then(Value::as_array_mut)
        else {
            return false;
        };
        let mut changed = false;
        for vcpu in list.iter_mut() {
            let Some(id) = vcpu.get("ID").and_then(Value::as_u64) else {
                continue;
            };
            let want = Value::String(if id < u64::from(enabled) { "yes" } else { "no" }.into());
            if vcpu.get("Enabled") != Some(&want) {
                if let Some(o) = vcpu.as_object_mut() {
                    o.insert("Enabled".into(), want);
                    changed = true;
                }
            }
        }
        changed
    }

    /// Whether the channel named `name` (the guest agent's is `org.qemu.guest_agent.0`) is
    /// `connected`: the guest opened its end, as QEMU's last `VSERPORT_CHANGE` (or
    /// `query-chardev`'s `frontend-open`) said. False when there is no such channel.
    pub fn channel_connected(&self, name: &str) -> bool {
        self.devices.channels.iter().any(|c| {
            c.target.name == name && c.target.state.as_deref() == Some(channel_state(true))
        })
    }

    /// Sets the `state` (`connected` / `disconnected`) of the channel named `name` (the guest
    /// agent's is `org.qemu.guest_agent.0`), as libvirt reports it. True when it changed.
    pub fn set_channel_state(&mut self, name: &str, state: &str) -> bool {
        let mut changed = false;
        for channel in &mut self.devices.channels {
            if channel.target.name == name && channel.target.state.as_deref() != Some(state) {
                channel.target.state = Some(state.to_owned());
                changed = true;
            }
        }
        changed
    }

    /// Sets the state of channel `index` (QEMU's `channelN` / `charchannelN`) to libvirt's word
    /// for it ([`channel_state`]). True when it changed.
    pub fn set_channel_open(&mut self, index: usize, open: bool) -> bool {
        let Some(channel) = self.devices.channels.get_mut(index) else {
            return false;
        };
        let state = channel_state(open);
        if channel.target.state.as_deref() == Some(state) {
            return false;
        }
        channel.target.state = Some(state.to_owned());
        true
    }
}

/// libvirt's channel state words: `connected`, `disconnected`.
pub fn channel_state(open: bool) -> &'static str {
    if open {
        "connected"
    } else {
        "disconnected"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn running_domain_serializes_with_kubevirt_field_names() {
        let mut domain = ApiDomain::for_vmi("default", "testvmi", "1234-uid");
        domain.spec.uuid = "5e8f1b6c-6f3a-4c1e-9d0b-2f1f6f0e8a11".into();
        domain.spec.domain_type = "kvm".into();
        domain.spec.devices.interfaces.push(Interface {
            interface_type: "ethernet".into(),
            mac: Some(Mac {
                mac: "02:00:00:00:00:01".into(),
            }),
            alias: Some(Alias::user_defined("default")),
            ..Default::default()
        });
        domain.set_state(LifeCycle::Running, StateChangeReason::Unknown);
        domain.status.interfaces.push(InterfaceStatus {
            mac: "02:00:00:00:00:01".into(),
            ip: "10.0.2.2".into(),
            ips: vec!["10.0.2.2".into()],
            interface_name: "eth0".into(),
        });
        let json = serde_json::to_value(&domain).unwrap();
        let expected = serde_json::json!({
            "ObjectMeta": {"name": "testvmi", "namespace": "default", "uid": "1234-uid",
                           "creationTimestamp": null},
            "Spec": {
                "Type": "kvm", "Name": "default_testvmi",
                "UUID": "5e8f1b6c-6f3a-4c1e-9d0b-2f1f6f0e8a11",
                "Devices": {
                    "Interfaces": [{"Type": "ethernet", "MAC": {"MAC": "02:00:00:00:00:01"},
                                    "Alias": {"Name": "default", "UserDefined": true}}],
                    "Disks": []
                },
                "Metadata": {"KubeVirt": {"UID": "1234-uid"}}
            },
            "Status": {
                "Status": "Running", "Reason": "Unknown",
                "Interfaces": [{"Mac": "02:00:00:00:00:01", "Ip": "10.0.2.2", "IPs": ["10.0.2.2"],
                                "InterfaceName": "eth0"}],
                "OSInfo": {"Name": "", "KernelRelease": "", "Version": "", "PrettyName": "",
                           "VersionId": "", "KernelVersion": "", "Machine": "", "Id": ""},
                "FSFreezeStatus": {"Status": ""},
                "GuestPanicInfo": null,
                "PanicCount": 0
            }
        });
        assert_eq!(json, expected);
        let back: ApiDomain = serde_json::from_value(json).unwrap();
        assert_eq!(back, domain);
    }

    #[test]
    fn final_delete_marks_nonexistent_with_deletion_timestamp() {
        let mut domain = ApiDomain::for_vmi("ns", "vm", "u");
        domain.set_state(LifeCycle::Shutoff, StateChangeReason::Shutdown);
        domain.mark_deleted(UNIX_EPOCH + Duration::from_secs(1_796_000_000));
        let json = serde_json::to_value(&domain).unwrap();
        assert_eq!(json["Status"]["Status"], "NoState");
        assert_eq!(json["Status"]["Reason"], "NonExistent");
        assert_eq!(
            json["ObjectMeta"]["deletionTimestamp"],
            "2026-11-30T00:53:20Z"
        );
    }

    #[test]
    fn reasons_and_states_use_kubevirt_strings() {
        let pairs = [
            (
                serde_json::to_value(StateChangeReason::IoError).unwrap(),
                "IOError",
            ),
            (serde_json::to_value(StateChangeReason::Unset).unwrap(), ""),
            (
                serde_json::to_value(StateChangeReason::StartingUp).unwrap(),
                "StartingUp",
            ),
            (
                serde_json::to_value(LifeCycle::PmSuspended).unwrap(),
                "PMSuspended",
            ),
            (
                serde_json::to_value(LifeCycle::ShuttingDown).unwrap(),
                "ShuttingDown",
            ),
        ];
        for (value, wire) in pairs {
            assert_eq!(value, serde_json::Value::String(wire.into()));
        }
    }
}

#[cfg(test)]
mod converted_tests {
    use super::*;

    #[test]
    fn converted_spec_keeps_name_metadata_machine_and_channel_state() {
        let mut domain = ApiDomain::for_vmi("default", "vm", "uid-1");
        domain.spec.set_machine("pc-q35-7.2");
        domain.spec.devices.channels.push(Channel {
            target: ChannelTarget {
                name: "org.qemu.guest_agent.0".into(),
                state: Some("connected".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        let converted = serde_json::json!({
            "Type": "qemu", "Name": "default_vm", "UUID": "u",
            "OS": {"Type": {"Machine": "q35", "Arch": "x86_64", "OS": "hvm"}},
            "Memory": {"Unit": "b", "Value": 268435456},
            "Devices": {
                "Disks": [{"Device": "disk", "Type": "file",
                           "Target": {"Bus": "virtio", "Device": "vda"},
                           "Alias": {"Name": "rootdisk", "UserDefined": true},
                           "Driver": {"Name": "qemu", "Type": "qcow2"}}],
                "Channels": [{"Type": "unix",
                              "Target": {"Name": "org.qemu.guest_agent.0", "Type": "virtio"}}],
                "Controllers": [{"Type": "usb", "Index": "0", "Model": "none"}]
            }
        });
        let serde_json::Value::Object(map) = converted.clone() else {
            unreachable!()
        };
        domain.spec.set_converted(map).unwrap();
        assert_eq!(domain.spec.domain_type, "qemu");
        assert_eq!(domain.spec.metadata.kubevirt.uid, "uid-1");
        assert_eq!(domain.spec.machine(), Some("pc-q35-7.2"));
        assert_eq!(
            domain.spec.devices.channels[0].target.state.as_deref(),
            Some("connected")
        );
        // Everything converted is in the JSON virt-handler decodes.
        let json = serde_json::to_value(&domain.spec).unwrap();
        assert_eq!(json["Devices"]["Disks"][0]["Driver"]["Type"], "qcow2");
        assert_eq!(json["Devices"]["Controllers"][0]["Index"], "0");
        assert_eq!(json["Memory"]["Value"], 268435456);
        assert_eq!(
            json["Devices"]["Channels"][0]["Target"]["State"],
            "connected"
        );
    }
}
