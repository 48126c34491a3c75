//! Typed QMP commands behind KubeVirt's cmd API RPCs: screenshot, memory dump, dirty rate, SEV and
//! VFIO host-device hotplug (QEMU `qapi/ui.json`, `qapi/dump.json`, `qapi/migration.json`,
//! `qapi/misc-target.json`, `qapi/qdev.json`; argument and member names as QEMU spells them, checked
//! against `query-qmp-schema` of QEMU 7.2).
//!
//! Each command is a struct whose serde form is the `arguments` object; [`QmpCommand`] names it and
//! types its `return`. JSON appears only in [`run`], at the client's edge.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::client::QmpClient;
use super::QmpError;

/// A QMP command: its name, its arguments (the struct itself) and its `return` type.
pub trait QmpCommand: Serialize {
    /// The `execute` name.
    const NAME: &'static str;
    /// What `return` decodes into.
    type Return: DeserializeOwned;
}

/// Runs `command` within `timeout` and decodes its `return`.
///
/// # Errors
/// As [`QmpClient::execute_timeout`]; [`QmpError::Reply`] when `return` does not decode.
pub async fn run<C: QmpCommand>(
    client: &QmpClient,
    command: &C,
    timeout: Duration,
) -> Result<C::Return, QmpError> {
    let arguments = serde_json::to_value(command).map_err(|e| QmpError::Reply {
        command: C::NAME.to_string(),
        reason: format!("cannot encode the arguments: {e}"),
    })?;
    let arguments = match arguments {
        serde_json::Value::Object(m) if m.is_empty() => None,
        serde_json::Value::Null => None,
        other => Some(other),
    };
    let value = client.execute_timeout(C::NAME, arguments, timeout).await?;
    serde_json::from_value(value).map_err(|e| QmpError::Reply {
        command: C::NAME.to_string(),
        reason: e.to_string(),
    })
}

/// An empty `return` (`{}`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Empty {}

/// Image format of `screendump` (QEMU >= 7.1; older QEMU writes PPM only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
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
    pub format: Option<ImageFormat>,
}

impl QmpCommand for Screendump {
    const NAME: &'static str = "screendump";
    type Return = Empty;
}

/// `stop`: pauses the vCPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stop {}

impl QmpCommand for Stop {
    const NAME: &'static str = "stop";
    type Return = Empty;
}

/// `cont`: resumes the vCPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Cont {}

impl QmpCommand for Cont {
    const NAME: &'static str = "cont";
    type Return = Empty;
}

/// `query-status`: whether the vCPUs run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueryStatus {}

/// `query-status`'s `return`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StatusInfo {
    /// Whether the vCPUs run.
    pub running: bool,
    /// QEMU's run state (`running`, `paused`, ...).
    pub status: String,
}

impl QmpCommand for QueryStatus {
    const NAME: &'static str = "query-status";
    type Return = StatusInfo;
}

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

impl QmpCommand for DumpGuestMemory {
    const NAME: &'static str = "dump-guest-memory";
    type Return = Empty;
}

/// `query-dump`: progress of the running or last dump.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueryDump {}

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

impl QmpCommand for QueryDump {
    const NAME: &'static str = "query-dump";
    type Return = DumpStatus;
}

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

impl QmpCommand for CalcDirtyRate {
    const NAME: &'static str = "calc-dirty-rate";
    type Return = Empty;
}

/// `query-dirty-rate`: the last measurement.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueryDirtyRate {}

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

impl QmpCommand for QueryDirtyRate {
    const NAME: &'static str = "query-dirty-rate";
    type Return = DirtyRateInfo;
}

/// `query-sev-capabilities`: the platform's SEV certificates.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QuerySevCapabilities {}

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

impl QmpCommand for QuerySevCapabilities {
    const NAME: &'static str = "query-sev-capabilities";
    type Return = SevCapability;
}

/// `query-sev`: the guest's SEV state.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QuerySev {}

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

impl QmpCommand for QuerySev {
    const NAME: &'static str = "query-sev";
    type Return = SevInfo;
}

/// `query-sev-launch-measure`: the launch measurement of a paused SEV guest.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QuerySevLaunchMeasure {}

/// `query-sev-launch-measure`'s `return`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SevLaunchMeasureInfo {
    /// The measurement, base64.
    pub data: String,
}

impl QmpCommand for QuerySevLaunchMeasure {
    const NAME: &'static str = "query-sev-launch-measure";
    type Return = SevLaunchMeasureInfo;
}

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

impl QmpCommand for SevInjectLaunchSecret {
    const NAME: &'static str = "sev-inject-launch-secret";
    type Return = Empty;
}

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

impl QmpCommand for VfioPciAdd {
    const NAME: &'static str = "device_add";
    type Return = Empty;
}

#[cfg(test)]
mod tests {
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
            format: Some(ImageFormat::Png),
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
