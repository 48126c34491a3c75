//! A device's identity in the `api.Domain`: where it sits (`Address`), what it is called
//! (`Alias`) and how the guest sees it (`Target`), as types. libvirt's live XML keeps these from
//! the moment a device is created (a hotplug adds a device and changes no other), so a
//! re-converted spec takes them from the spec it replaces (`domain_spec::carry_identity`).
//!
//! The device lists of [`super::Devices`] are typed only in part (`rest` holds the others as
//! KubeVirt's JSON), so the identity is read from and written into a device's JSON object
//! ([`DeviceIdentity::of`], [`DeviceIdentity::write_into`]); no other field is touched, and a
//! field the types do not know is kept as it was.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::Alias;

/// `api.Address` (`pkg/virt-launcher/virtwrap/api/schema.go`, v1.9.0): libvirt's `<address>`,
/// every attribute as the text libvirt writes (`0x0000`, `0x0b`, `0x0`, ...). A field absent in
/// the JSON stays absent; one present but empty stays empty, so the JSON round-trips.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Address {
    /// `pci`, `drive`, `virtio-serial`, `usb`, `ccw`, ...
    #[serde(rename = "Type", default, skip_serializing_if = "Option::is_none")]
    pub address_type: Option<String>,
    /// PCI domain.
    #[serde(rename = "Domain", default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// PCI bus (libvirt's controller index) or a drive's bus.
    #[serde(rename = "Bus", default, skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    /// PCI slot.
    #[serde(rename = "Slot", default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    /// PCI function.
    #[serde(rename = "Function", default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// A drive's or serial port's controller.
    #[serde(
        rename = "Controller",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub controller: Option<String>,
    /// A drive's target.
    #[serde(rename = "Target", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// A drive's unit.
    #[serde(rename = "Unit", default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// A mediated device's UUID.
    #[serde(rename = "UUID", default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// A CCW or USB device number.
    #[serde(rename = "Device", default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// CCW channel subsystem.
    #[serde(rename = "CSSID", default, skip_serializing_if = "Option::is_none")]
    pub cssid: Option<String>,
    /// CCW subchannel set.
    #[serde(rename = "SSID", default, skip_serializing_if = "Option::is_none")]
    pub ssid: Option<String>,
    /// CCW device number.
    #[serde(rename = "DevNo", default, skip_serializing_if = "Option::is_none")]
    pub devno: Option<String>,
}

impl Address {
    /// A PCI address on libvirt's controller `bus` (the `N` of root port `pci.N`, 0 on
    /// `pcie.0`) at `slot` and `function`, as libvirt writes it (`0x0000`, `0x0b`, `0x00`,
    /// `0x0`).
    pub fn pci(bus: u32, slot: u32, function: u32) -> Address {
        Address {
            address_type: Some("pci".into()),
            domain: Some("0x0000".into()),
            bus: Some(format!("0x{bus:02x}")),
            slot: Some(format!("0x{slot:02x}")),
            function: Some(format!("0x{function:x}")),
            ..Address::default()
        }
    }

    /// True for a PCI address.
    pub fn is_pci(&self) -> bool {
        self.address_type.as_deref() == Some("pci")
    }
}

/// A device's `Target`: the union of KubeVirt's target types (`api.DiskTarget` `Bus`/`Device`,
/// `api.InterfaceTarget` `Device`/`Managed`, `api.ChannelTarget` `Name`/`Type`/`Address`/
/// `Port`/`State`, `api.SerialTarget` and `api.ConsoleTarget` `Type`/`Port`); any other field is
/// kept in `rest`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceTarget {
    /// A disk's bus.
    #[serde(rename = "Bus", default, skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    /// A disk's guest name (`vda`) or an interface's tap.
    #[serde(rename = "Device", default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// A channel's name (`org.qemu.guest_agent.0`).
    #[serde(rename = "Name", default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A channel's or console's type.
    #[serde(rename = "Type", default, skip_serializing_if = "Option::is_none")]
    pub target_type: Option<String>,
    /// A serial port's or console's port.
    #[serde(rename = "Port", default, skip_serializing_if = "Option::is_none")]
    pub port: Option<Value>,
    /// The other fields (`Managed`, a channel's `State`, a disk's `Tray`, ...).
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// What names and places a device ([`Address`], [`Alias`], [`DeviceTarget`]), each `None` when
/// the device has none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceIdentity {
    /// Where it sits.
    #[serde(rename = "Address", default, skip_serializing_if = "Option::is_none")]
    pub address: Option<Address>,
    /// Its name.
    #[serde(rename = "Alias", default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<Alias>,
    /// How the guest sees it.
    #[serde(rename = "Target", default, skip_serializing_if = "Option::is_none")]
    pub target: Option<DeviceTarget>,
}

impl DeviceIdentity {
    /// The identity of the device `device` (a JSON object of KubeVirt's device types); a field
    /// of another shape than the type's is read as absent.
    pub fn of(device: &Value) -> DeviceIdentity {
        let field = |name: &str| device.get(name).cloned();
        DeviceIdentity {
            address: field("Address").and_then(|v| serde_json::from_value(v).ok()),
            alias: field("Alias").and_then(|v| serde_json::from_value(v).ok()),
            target: field("Target").and_then(|v| serde_json::from_value(v).ok()),
        }
    }

    /// Writes this identity into the device `device`: each part this identity has replaces the
    /// device's; the parts it lacks and every other field are left as they are. A device that
    /// is not a JSON object is left alone.
    pub fn write_into(&self, device: &mut Value) {
        let Value::Object(map) = device else {
            return;
        };
        let mut put = |name: &str, v: Option<Value>| {
            if let Some(v) = v {
                map.insert(name.to_owned(), v);
            }
        };
        put("Address", self.address.as_ref().and_then(to_json));
        put("Alias", self.alias.as_ref().and_then(to_json));
        put("Target", self.target.as_ref().and_then(to_json));
    }

    /// QEMU's id of the device ([`Alias::qemu_id`]), when it has an alias.
    pub fn qemu_id(&self) -> Option<String> {
        self.alias.as_ref().map(Alias::qemu_id)
    }
}

fn to_json<T: Serialize>(v: &T) -> Option<Value> {
    serde_json::to_value(v).ok()
}

/// How a device is recognised in its list across a re-conversion: by its alias, else by its
/// `Type` and its rank among the alias-less devices of that type before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKey {
    /// A device with an alias.
    Alias(Alias),
    /// The `rank`-th alias-less device of `kind`.
    Rank {
        /// The device's `Type`.
        kind: String,
        /// Its rank among the alias-less devices of that type (from 0).
        rank: usize,
    },
}

impl DeviceKey {
    /// The keys of the devices of one list, in order.
    pub fn of_list(devices: &[Value]) -> Vec<DeviceKey> {
        let mut ranks: std::collections::BTreeMap<String, usize> = Default::default();
        devices
            .iter()
            .map(|d| match DeviceIdentity::of(d).alias {
                Some(alias) => DeviceKey::Alias(alias),
                None => {
                    let kind = d.get("Type").and_then(Value::as_str).unwrap_or("");
                    let rank = ranks.entry(kind.to_owned()).or_default();
                    *rank += 1;
                    DeviceKey::Rank {
                        kind: kind.to_owned(),
                        rank: *rank - 1,
                    }
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_identity_round_trips_and_only_it_is_written() {
        let disk = json!({
            "Device": "disk",
            "Target": {"Bus": "virtio", "Device": "vda", "Tray": "open"},
            "Alias": {"Name": "root", "UserDefined": true},
            "Address": {"Type": "pci", "Domain": "0x0000", "Bus": "0x07", "Slot": "0x00",
                "Function": "0x0", "Controller": ""},
            "Driver": {"Cache": "none"}
        });
        let id = DeviceIdentity::of(&disk);
        assert_eq!(id.qemu_id().as_deref(), Some("ua-root"));
        assert!(id.address.as_ref().unwrap().is_pci());
        let mut other = json!({"Device": "disk", "Driver": {"Cache": "unsafe"},
            "Target": {"Bus": "virtio", "Device": "vdb"}});
        id.write_into(&mut other);
        assert_eq!(other["Address"], disk["Address"]);
        assert_eq!(other["Target"], disk["Target"]);
        assert_eq!(other["Alias"], disk["Alias"]);
        assert_eq!(other["Driver"]["Cache"], "unsafe");
        // No identity: nothing written.
        let mut bare = json!({"Type": "tablet"});
        DeviceIdentity::of(&json!({})).write_into(&mut bare);
        assert_eq!(bare, json!({"Type": "tablet"}));
        // A part of another shape reads as absent.
        let odd = DeviceIdentity::of(&json!({"Address": "pci", "Alias": 3}));
        assert_eq!(odd, DeviceIdentity::default());
    }

    #[test]
    fn pci_addresses_as_libvirt_writes_them() {
        let a = serde_json::to_value(Address::pci(11, 0, 0)).unwrap();
        assert_eq!(
            a,
            json!({"Type": "pci", "Domain": "0x0000", "Bus": "0x0b", "Slot": "0x00", "Function": "0x0"})
        );
    }

    #[test]
    fn keys_are_aliases_or_ranks_per_type() {
        let list = [
            json!({"Type": "tablet"}),
            json!({"Type": "tablet", "Alias": {"Name": "ua-x"}}),
            json!({"Type": "tablet"}),
            json!({"Type": "keyboard"}),
        ];
        let keys = DeviceKey::of_list(&list);
        assert_eq!(
            keys[0],
            DeviceKey::Rank {
                kind: "tablet".into(),
                rank: 0
            }
        );
        assert!(matches!(&keys[1], DeviceKey::Alias(a) if a.name == "ua-x"));
        assert_eq!(
            keys[2],
            DeviceKey::Rank {
                kind: "tablet".into(),
                rank: 1
            }
        );
        assert_eq!(
            keys[3],
            DeviceKey::Rank {
                kind: "keyboard".into(),
                rank: 0
            }
        );
    }
}
