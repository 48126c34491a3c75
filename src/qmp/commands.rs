//! Typed QMP commands: one struct per command the launcher sends, serialised as the command's
//! `arguments`, each naming its reply type (QEMU's `qapi/*.json` schema, QEMU 7.2 to 10.1).
//! JSON exists only at the client's edge ([`QmpClient::run`]).
//!
//! A command without arguments is a unit struct (sent without `arguments`). Commands whose reply
//! is `{}` answer [`Empty`]. Replies that the stats and vCPU code read field by field (and test
//! against recorded replies) are still [`serde_json::Value`]; they are marked so below.

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::qmp::client::QmpClient;
use crate::qmp::QmpError;

/// A QMP command: its name, its arguments and the type of its `return` value.
pub trait Command {
    /// The `return` value's type.
    type Reply: DeserializeOwned;
    /// The command name (`execute`).
    fn name(&self) -> &str;
    /// The `arguments` object, or `None` for a command that takes none.
    fn arguments(&self) -> Result<Option<Value>, serde_json::Error>;
}

/// The reply of a command that returns `{}` (its content is ignored).
pub type Empty = IgnoredAny;

/// Declares `$ty` a command named `$name` replying `$reply`, its fields its arguments.
macro_rules! command {
    ($ty:ty, $name:literal, $reply:ty) => {
        impl Command for $ty {
            type Reply = $reply;
            fn name(&self) -> &str {
                $name
            }
            fn arguments(&self) -> Result<Option<Value>, serde_json::Error> {
                match serde_json::to_value(self)? {
                    Value::Null => Ok(None),
                    v => Ok(Some(v)),
                }
            }
        }
    };
}

/// `cont`: resume the guest's vCPUs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Cont;
command!(Cont, "cont", Empty);

/// `quit`: end QEMU.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Quit;
command!(Quit, "quit", Empty);

/// `query-version`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueryVersion;
command!(QueryVersion, "query-version", VersionInfo);

/// The reply of `query-version`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VersionInfo {
    /// QEMU's version.
    pub qemu: VersionTriple,
    /// Distribution package version (may be empty).
    #[serde(default)]
    pub package: String,
}

/// `major.minor.micro`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct VersionTriple {
    /// Major version.
    pub major: u64,
    /// Minor version.
    pub minor: u64,
    /// Micro version.
    pub micro: u64,
}

/// `query-uuid`: the domain's UUID (`-uuid`).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueryUuid;
command!(QueryUuid, "query-uuid", UuidInfo);

/// The reply of `query-uuid`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct UuidInfo {
    /// The UUID, `00000000-0000-0000-0000-000000000000` when none was set.
    #[serde(rename = "UUID")]
    pub uuid: String,
}

/// `qom-list`: the properties (children included) of the QOM object at `path`.
#[derive(Debug, Clone, Serialize)]
pub struct QomList {
    /// QOM path, e.g. `/machine/peripheral`.
    pub path: String,
}
command!(QomList, "qom-list", Vec<ObjectPropertyInfo>);

/// One entry of a `qom-list` reply.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ObjectPropertyInfo {
    /// Property (or child) name; under `/machine/peripheral`, a device id.
    pub name: String,
    /// Property type, e.g. `child<virtio-blk-pci>`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// `qom-get` of one property.
#[derive(Debug, Clone, Serialize)]
pub struct QomGet {
    /// QOM path.
    pub path: String,
    /// Property name.
    pub property: String,
}
command!(QomGet, "qom-get", Value);

/// `query-named-block-nodes`: every block node.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueryNamedBlockNodes;
command!(
    QueryNamedBlockNodes,
    "query-named-block-nodes",
    Vec<NamedBlockNode>
);

/// One block node of `query-named-block-nodes` (the fields the launcher reads).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NamedBlockNode {
    /// The node name, e.g. `libvirt-1-format`.
    #[serde(rename = "node-name", default)]
    pub node_name: String,
}

/// `query-cpus-fast` (reply read by the stats collection).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueryCpusFast;
command!(QueryCpusFast, "query-cpus-fast", Value);

/// `query-blockstats` (reply read by the stats collection).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueryBlockstats;
command!(QueryBlockstats, "query-blockstats", Value);

/// `query-block` (reply read by the stats collection and the disk resize).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueryBlock;
command!(QueryBlock, "query-block", Value);

/// `query-balloon` (reply read by the stats collection).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueryBalloon;
command!(QueryBalloon, "query-balloon", Value);

/// `query-hotpluggable-cpus` (reply read by the vCPU hotplug).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueryHotpluggableCpus;
command!(QueryHotpluggableCpus, "query-hotpluggable-cpus", Value);

/// `device_add` of a vCPU into a slot of `query-hotpluggable-cpus`.
#[derive(Debug, Clone, Serialize)]
pub struct CpuDeviceAdd {
    /// The slot's CPU type, e.g. `max-x86_64-cpu`.
    pub driver: String,
    /// The device id, `vcpu<index>`.
    pub id: String,
    /// The slot's properties (`socket-id`, `core-id`, `thread-id`, `node-id`, ...).
    #[serde(flatten)]
    pub props: Map<String, Value>,
}
command!(CpuDeviceAdd, "device_add", Empty);

/// `object-del`.
#[derive(Debug, Clone, Serialize)]
pub struct ObjectDel {
    /// The object id.
    pub id: String,
}
command!(ObjectDel, "object-del", Empty);

/// A command a plan made (the converter's start-up steps, the memory plan's steps): its name and
/// arguments object as planned.
#[derive(Debug, Clone)]
pub struct Planned<'a> {
    /// Command name.
    pub execute: &'a str,
    /// Arguments object.
    pub arguments: &'a Value,
}

impl Command for Planned<'_> {
    type Reply = Empty;
    fn name(&self) -> &str {
        self.execute
    }
    fn arguments(&self) -> Result<Option<Value>, serde_json::Error> {
        Ok(Some(self.arguments.clone()))
    }
}

impl QmpClient {
    /// Runs `command` with the default timeout and decodes its reply. Errors: those of
    /// [`QmpClient::execute`], and [`QmpError::Reply`] when the arguments do not encode or the
    /// reply does not decode as `C::Reply`.
    pub async fn run<C: Command>(&self, command: &C) -> Result<C::Reply, QmpError> {
        let bad = |e: serde_json::Error| QmpError::Reply {
            command: command.name().to_string(),
            reason: e.to_string(),
        };
        let arguments = command.arguments().map_err(bad)?;
        let reply = self.execute(command.name(), arguments).await?;
        serde_json::from_value(reply).map_err(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    type Wire = (String, Option<Value>);

    fn wire<C: Command>(c: &C) -> Wire {
        (c.name().to_string(), c.arguments().unwrap())
    }

    #[test]
    fn commands_encode_as_qemu_schema_arguments() {
        let cases: Vec<(Wire, (&str, Option<Value>))> = vec![
            (wire(&Cont), ("cont", None)),
            (wire(&Quit), ("quit", None)),
            (wire(&QueryVersion), ("query-version", None)),
            (
                wire(&QomList {
                    path: "/machine/peripheral".into(),
                }),
                ("qom-list", Some(json!({"path": "/machine/peripheral"}))),
            ),
            (
                wire(&QomGet {
                    path: "/machine/peripheral/balloon0".into(),
                    property: "guest-stats".into(),
                }),
                (
                    "qom-get",
                    Some(
                        json!({"path": "/machine/peripheral/balloon0", "property": "guest-stats"}),
                    ),
                ),
            ),
            (
                wire(&CpuDeviceAdd {
                    driver: "max-x86_64-cpu".into(),
                    id: "vcpu1".into(),
                    props: json!({"socket-id": 1, "core-id": 0})
                        .as_object()
                        .unwrap()
                        .clone(),
                }),
                (
                    "device_add",
                    Some(
                        json!({"driver": "max-x86_64-cpu", "id": "vcpu1", "socket-id": 1, "core-id": 0}),
                    ),
                ),
            ),
            (
                wire(&ObjectDel {
                    id: "memvirtiomem0".into(),
                }),
                ("object-del", Some(json!({"id": "memvirtiomem0"}))),
            ),
        ];
        for (got, (name, args)) in cases {
            assert_eq!(got, (name.to_string(), args));
        }
    }

    #[test]
    fn replies_decode() {
        let v: VersionInfo = serde_json::from_value(
            json!({"qemu": {"major": 7, "minor": 2, "micro": 19}, "package": "Debian 1:7.2"}),
        )
        .unwrap();
        assert_eq!((v.qemu.major, v.qemu.minor, v.qemu.micro), (7, 2, 19));
        let u: UuidInfo =
            serde_json::from_value(json!({"UUID": "5d2b3a1e-0000-4000-8000-000000000001"}))
                .unwrap();
        assert_eq!(u.uuid, "5d2b3a1e-0000-4000-8000-000000000001");
        let l: Vec<ObjectPropertyInfo> = serde_json::from_value(
            json!([{"name": "type", "type": "string"}, {"name": "ua-disk0", "type": "child<virtio-blk-pci>"}]),
        )
        .unwrap();
        assert_eq!(l[1].name, "ua-disk0");
        let n: Vec<NamedBlockNode> = serde_json::from_value(
            json!([{"node-name": "libvirt-2-format", "drv": "qcow2"}, {"drv": "file"}]),
        )
        .unwrap();
        assert_eq!(n[0].node_name, "libvirt-2-format");
        let _: Empty = serde_json::from_value(json!({})).unwrap();
    }
}
