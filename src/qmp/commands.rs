//! Typed QMP commands: one struct per command the launcher sends, serialised as the command's
//! `arguments`, each naming its reply type (QEMU's `qapi/*.json` schema, QEMU 7.2 to 10.1).
//! JSON exists only at the client's edge ([`QmpClient::run`]).
//!
//! A command without arguments is a unit struct (sent without `arguments`). Commands whose reply
//! is `{}` answer [`Empty`]. The hotplug commands and their replies are in
//! [`devices`], the push backup's transaction in [`backup`], the statistics queries in [`stats`], the CPU model expansion in [`cpu`], a
//! capability probe's queries in [`caps`].
//! `qom-get` of an arbitrary property
//! answers a [`serde_json::Value`] (the value's type depends on the property).

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
        impl $crate::qmp::commands::Command for $ty {
            type Reply = $reply;
            fn name(&self) -> &str {
                $name
            }
            fn arguments(&self) -> Result<Option<serde_json::Value>, serde_json::Error> {
                match serde_json::to_value(self)? {
                    serde_json::Value::Null => Ok(None),
                    v => Ok(Some(v)),
                }
            }
        }
    };
}
pub(crate) use command;

mod backup;
mod caps;
mod cpu;
mod devices;
mod stats;
pub use backup::*;
pub use caps::*;
pub use cpu::*;
pub use devices::*;
pub use stats::*;

/// `cont`: resume the guest's vCPUs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Cont;
command!(Cont, "cont", Empty);

/// `quit`: end QEMU.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Quit;
command!(Quit, "quit", Empty);

/// `system_powerdown`: presses the ACPI power button.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SystemPowerdown;
command!(SystemPowerdown, "system_powerdown", Empty);

/// `system_reset`: hard reset of the machine.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SystemReset;
command!(SystemReset, "system_reset", Empty);

/// `set-action`: what QEMU does on guest shutdown, reboot, panic and watchdog expiry (QEMU
/// >= 6.0, `qapi/run-state.json`); unset members keep QEMU's setting.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SetAction {
    /// `poweroff` or `pause`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown: Option<String>,
    /// `reset` or `shutdown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reboot: Option<String>,
    /// `none`, `pause`, `shutdown` or `exit-failure`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub panic: Option<String>,
    /// `reset`, `shutdown`, `poweroff`, `pause`, `debug`, `none` or `inject-nmi`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<String>,
}
command!(SetAction, "set-action", Empty);

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

/// One block node of `query-named-block-nodes` (`BlockDeviceInfo`, the fields the launcher
/// reads).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NamedBlockNode {
    /// The node name, e.g. `libvirt-1-format`.
    #[serde(rename = "node-name", default)]
    pub node_name: String,
    /// The driver (`qcow2`, `raw`, `file`, ...).
    #[serde(default)]
    pub drv: String,
    /// The node's file name (a qcow2 node over a file: that file's path).
    #[serde(default)]
    pub file: String,
    /// The node's dirty bitmaps (absent: none).
    #[serde(rename = "dirty-bitmaps", default)]
    pub dirty_bitmaps: Vec<BlockDirtyInfo>,
    /// The image's size facts.
    #[serde(default)]
    pub image: Option<NodeImageInfo>,
}

/// `ImageInfo` of a node, the size the launcher reads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NodeImageInfo {
    /// Guest-visible size in bytes.
    #[serde(rename = "virtual-size", default)]
    pub virtual_size: u64,
}

/// `BlockDirtyInfo`: one dirty bitmap of a node.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BlockDirtyInfo {
    /// The bitmap's name.
    #[serde(default)]
    pub name: String,
    /// Bytes per bit.
    #[serde(default)]
    pub granularity: u32,
    /// Dirty bytes.
    #[serde(default)]
    pub count: u64,
    /// Recording writes (false when disabled, or inconsistent).
    #[serde(default)]
    pub recording: bool,
    /// Stored in the qcow2.
    #[serde(default)]
    pub persistent: bool,
    /// Loaded from a qcow2 that was not closed cleanly (`in-use`): unusable, can only be
    /// removed (QEMU `qapi/block-core.json`).
    #[serde(default)]
    pub inconsistent: bool,
    /// In use by a job (a backup's or a merge's).
    #[serde(default)]
    pub busy: bool,
}

/// `object-del`.
#[derive(Debug, Clone, Serialize)]
pub struct ObjectDel {
    /// The object id.
    pub id: String,
}
command!(ObjectDel, "object-del", Empty);

// Commands behind KubeVirt's cmd API RPCs: screenshot, memory dump, dirty rate, SEV and VFIO
// host-device hotplug (QEMU `qapi/ui.json`, `qapi/dump.json`, `qapi/migration.json`,
// `qapi/misc-target.json`, `qapi/qdev.json`; checked against `query-qmp-schema` of QEMU 7.2).

/// Image format of `screendump` (QEMU >= 7.1; older QEMU writes PPM only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScreendumpFormat {
    /// Portable pixmap (P6).
    Ppm,
    /// PNG.
    Png,
}

/// `screendump`: writes the console of screen 0 (no `device`/`head`, as libvirt for screen 0) to a
/// file QEMU opens itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Screendump {
    /// Output path (QEMU creates or truncates it).
    pub filename: String,
    /// Image format; `None` means PPM (and is the only form QEMU < 7.1 accepts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<ScreendumpFormat>,
}

command!(Screendump, "screendump", Empty);

/// `stop`: pauses the vCPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stop;

command!(Stop, "stop", Empty);

/// `query-status`: whether the vCPUs run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueryStatus;

/// `query-status`'s `return`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StatusInfo {
    /// Whether the vCPUs run.
    pub running: bool,
    /// QEMU's run state (`running`, `paused`, ...).
    pub status: String,
}

command!(QueryStatus, "query-status", StatusInfo);

/// Core file format of `dump-guest-memory`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DumpFormat {
    /// ELF vmcore (what libvirt's `VIR_DOMAIN_CORE_DUMP_FORMAT_RAW` means).
    Elf,
}

/// `dump-guest-memory`, as libvirt's memory-only core dump issues it: no paging, to a file
/// descriptor passed with `getfd` (`protocol: "fd:<name>"`), detached; completion is the
/// `DUMP_COMPLETED` event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DumpGuestMemory {
    /// Walk the guest page tables (libvirt: false).
    pub paging: bool,
    /// `fd:<name>` or `file:<path>`.
    pub protocol: String,
    /// Return at once and report completion with `DUMP_COMPLETED`.
    pub detach: bool,
    /// Core format.
    pub format: DumpFormat,
}

command!(DumpGuestMemory, "dump-guest-memory", Empty);

/// `query-dump`: progress of the running or last dump.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueryDump;

/// `query-dump`'s `return` (`DumpQueryResult`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DumpStatus {
    /// `none`, `active`, `completed` or `failed`.
    pub status: String,
    /// Bytes written.
    pub completed: u64,
    /// Bytes to write.
    pub total: u64,
}

command!(QueryDump, "query-dump", DumpStatus);

/// `calc-dirty-rate`: starts a dirty-page-rate measurement of `calc-time` seconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CalcDirtyRate {
    /// Measurement length in seconds (KubeVirt: 1).
    #[serde(rename = "calc-time")]
    pub calc_time: i64,
    /// `page-sampling` (KubeVirt's mode), `dirty-bitmap` or `dirty-ring`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

command!(CalcDirtyRate, "calc-dirty-rate", Empty);

/// `query-dirty-rate`: the last measurement.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueryDirtyRate;

/// `query-dirty-rate`'s `return` (`DirtyRateInfo`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DirtyRateInfo {
    /// `unstarted`, `measuring` or `measured`.
    pub status: String,
    /// Dirty rate in MB/s, present once measured.
    #[serde(rename = "dirty-rate", default)]
    pub dirty_rate: Option<i64>,
    /// Start of the measurement (QEMU's clock, seconds).
    #[serde(rename = "start-time", default)]
    pub start_time: i64,
    /// Measurement length in seconds.
    #[serde(rename = "calc-time", default)]
    pub calc_time: i64,
}

command!(QueryDirtyRate, "query-dirty-rate", DirtyRateInfo);

/// `query-sev-capabilities`: the platform's SEV certificates.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QuerySevCapabilities;

/// `query-sev-capabilities`'s `return` (`SevCapability`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SevCapability {
    /// Platform Diffie-Hellman key, base64.
    pub pdh: String,
    /// Certificate chain, base64.
    #[serde(rename = "cert-chain")]
    pub cert_chain: String,
    /// CPU0 id, base64 (QEMU >= 6.1).
    #[serde(rename = "cpu0-id", default)]
    pub cpu0_id: String,
    /// C-bit position in page table entries.
    pub cbitpos: i64,
    /// Physical address bits lost with SEV.
    #[serde(rename = "reduced-phys-bits")]
    pub reduced_phys_bits: i64,
}

command!(
    QuerySevCapabilities,
    "query-sev-capabilities",
    SevCapability
);

/// `query-sev`: the guest's SEV state.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QuerySev;

/// `query-sev`'s `return` (`SevInfo`; the members libvirt reads).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SevInfo {
    /// Whether SEV is enabled for the guest.
    pub enabled: bool,
    /// Firmware API major version.
    #[serde(rename = "api-major")]
    pub api_major: u32,
    /// Firmware API minor version.
    #[serde(rename = "api-minor")]
    pub api_minor: u32,
    /// Firmware build id.
    #[serde(rename = "build-id")]
    pub build_id: u32,
    /// Guest policy (SEV).
    #[serde(default)]
    pub policy: u32,
    /// Launch state (`launch-secret`, `running`, ...).
    #[serde(default)]
    pub state: String,
}

command!(QuerySev, "query-sev", SevInfo);

/// `query-sev-launch-measure`: the launch measurement of a paused SEV guest.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QuerySevLaunchMeasure;

/// `query-sev-launch-measure`'s `return`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SevLaunchMeasureInfo {
    /// The measurement, base64.
    pub data: String,
}

command!(
    QuerySevLaunchMeasure,
    "query-sev-launch-measure",
    SevLaunchMeasureInfo
);

/// `sev-inject-launch-secret`, without `gpa` (QEMU finds the secret area in OVMF), as libvirt
/// issues it for KubeVirt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SevInjectLaunchSecret {
    /// Launch secret packet header, base64.
    #[serde(rename = "packet-header")]
    pub packet_header: String,
    /// Launch secret, base64.
    pub secret: String,
}

command!(SevInjectLaunchSecret, "sev-inject-launch-secret", Empty);

/// `device_add` of a `vfio-pci` host device on a root port, as libvirt attaches a
/// `<hostdev type='pci' managed='no'>`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VfioPciAdd {
    /// Always `vfio-pci`.
    pub driver: &'static str,
    /// Host PCI address (`0000:65:00.2`).
    pub host: String,
    /// Device id (`ua-sriov-<iface>`).
    pub id: String,
    /// The root port's id.
    pub bus: String,
    /// Slot on the root port (`0x0`).
    pub addr: String,
    /// Boot order, when the interface has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootindex: Option<u32>,
}

command!(VfioPciAdd, "device_add", Empty);

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

    /// Runs `command` within `timeout` (for commands that may take longer than the default, such
    /// as `screendump` of a large console) and decodes its reply. Errors: as [`QmpClient::run`].
    pub async fn run_timeout<C: Command>(
        &self,
        command: &C,
        timeout: std::time::Duration,
    ) -> Result<C::Reply, QmpError> {
        let bad = |e: serde_json::Error| QmpError::Reply {
            command: command.name().to_string(),
            reason: e.to_string(),
        };
        let arguments = command.arguments().map_err(bad)?;
        let reply = self
            .execute_timeout(command.name(), arguments, timeout)
            .await?;
        serde_json::from_value(reply).map_err(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A command as it goes on the wire: its name and arguments.
    pub(super) type Wire = (String, Option<Value>);

    /// `c` on the wire (the unit tests of `commands` and its submodules compare these).
    pub(super) fn wire<C: Command>(c: &C) -> Wire {
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

#[cfg(test)]
mod cmdapi_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_use_qemu_member_names() {
        let dump = DumpGuestMemory {
            paging: false,
            protocol: "fd:memdump".into(),
            detach: true,
            format: DumpFormat::Elf,
        };
        assert_eq!(
            serde_json::to_value(dump).unwrap(),
            json!({"paging": false, "protocol": "fd:memdump", "detach": true, "format": "elf"})
        );
        let shot = Screendump {
            filename: "/tmp/s.png".into(),
            format: Some(ScreendumpFormat::Png),
        };
        assert_eq!(
            serde_json::to_value(shot).unwrap(),
            json!({"filename": "/tmp/s.png", "format": "png"})
        );
        let calc = CalcDirtyRate {
            calc_time: 1,
            mode: Some("page-sampling".into()),
        };
        assert_eq!(
            serde_json::to_value(calc).unwrap(),
            json!({"calc-time": 1, "mode": "page-sampling"})
        );
        let secret = SevInjectLaunchSecret {
            packet_header: "aGVhZA==".into(),
            secret: "c2VjcmV0".into(),
        };
        assert_eq!(
            serde_json::to_value(secret).unwrap(),
            json!({"packet-header": "aGVhZA==", "secret": "c2VjcmV0"})
        );
        let dev = VfioPciAdd {
            driver: "vfio-pci",
            host: "0000:65:00.2".into(),
            id: "ua-sriov-sriov1".into(),
            bus: "pci.5".into(),
            addr: "0x0".into(),
            bootindex: None,
        };
        assert_eq!(
            serde_json::to_value(dev).unwrap(),
            json!({"driver": "vfio-pci", "host": "0000:65:00.2", "id": "ua-sriov-sriov1",
                   "bus": "pci.5", "addr": "0x0"})
        );
    }

    #[test]
    fn returns_decode() {
        let r: DirtyRateInfo = serde_json::from_value(json!({"status": "measured",
            "dirty-rate": 12, "start-time": 5, "calc-time": 1, "sample-pages": 512,
            "mode": "page-sampling"}))
        .unwrap();
        assert_eq!(r.dirty_rate, Some(12));
        let r: DirtyRateInfo = serde_json::from_value(json!({"status": "unstarted",
            "start-time": 0, "calc-time": 0, "sample-pages": 0, "mode": "page-sampling"}))
        .unwrap();
        assert_eq!(r.dirty_rate, None);
    }
}
