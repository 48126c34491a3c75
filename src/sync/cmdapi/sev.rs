//! SEV attestation: `GetSEVInfo`, `GetLaunchMeasurement`, `InjectLaunchSecret` (`manager.go`
//! `GetSEVInfo`, `GetLaunchMeasurement`, `InjectLaunchSecret`, v1.9.0; libvirt's
//! `virNodeGetSEVInfo`, `virDomainGetLaunchSecurityInfo`, `virDomainSetLaunchSecurityState`).
//!
//! QMP underneath: `query-sev-capabilities` → `{"pdh", "certChain"}`; `query-sev-launch-measure`
//! and `query-sev` → `{"measurement", "apiMajor", "apiMinor", "buildID", "policy", "loaderSHA"}`
//! (the SHA-256, hex, of the SEV OVMF code file); `sev-inject-launch-secret {packet-header,
//! secret}` with no `gpa`.
//!
//! `GetSEVInfo` is a node query in KubeVirt (`virNodeGetSEVInfo`): it needs no domain, and the
//! attestation flow calls it while the VMI is still Scheduled, before QEMU runs. libvirt answers
//! from the capabilities of its QEMU probe; without a domain we run the same kind of probe
//! ([`probe_platform_info`]: a throw-away `qemu -machine none -accel kvm` asked
//! `query-sev-capabilities`). A node without SEV (no `/dev/sev`, or QEMU refusing) gets libvirt's
//! refusal as KubeVirt formats it, [`NO_SEV_GUEST`].

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::CmdApiError;
use crate::cmdline::qemu::KeyVal;
use crate::qmp::client::QmpClient;
use crate::qmp::commands::{
    QuerySev, QuerySevCapabilities, QuerySevLaunchMeasure, SevInjectLaunchSecret,
};

/// The SEV device node (KubeVirt's `devices.kubevirt.io/sev` resource).
pub const SEV_DEVICE: &str = "/dev/sev";

/// The SEV OVMF code file's name in KubeVirt's OVMF directory (`EFICode(false, SEV)`).
pub const SEV_OVMF_CODE: &str = "OVMF_CODE.cc.fd";

/// The options message of a bad `InjectLaunchSecret` request (KubeVirt's).
pub const BAD_SECRET_OPTIONS: &str = "No valid secret options present in command server request";

/// `GetSEVInfo`'s message on a node whose QEMU cannot run SEV guests: libvirt's
/// `VIR_ERR_OPERATION_UNSUPPORTED` (84) from the QEMU driver (`VIR_FROM_QEMU`, 10) in
/// `qemuNodeGetSEVInfo`, as KubeVirt's `getErrorMessage` formats a libvirt error
/// (`cmd-server/server.go`, `virtwrap/errors/errors.go` `FormatLibvirtError`). The text is what
/// libvirt answers here (`virsh nodesevinfo` on this machine, no SEV).
pub const NO_SEV_GUEST: &str = "LibvirtError(Code=84, Domain=10, Message='Operation not supported: QEMU does not support SEV guest')";

const QMP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the probe QEMU may take to open its QMP socket (virt-handler gives `GetSEVInfo` 5 s).
const PROBE_START_TIMEOUT: Duration = Duration::from_secs(4);

/// `v1.SEVPlatformInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SevPlatformInfo {
    /// Platform Diffie-Hellman key, base64.
    pub pdh: String,
    /// Certificate chain, base64.
    #[serde(rename = "certChain")]
    pub cert_chain: String,
}

/// `v1.SEVMeasurementInfo` (all members omitted when empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SevMeasurementInfo {
    /// The launch measurement, base64.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub measurement: String,
    /// Firmware API major version.
    #[serde(rename = "apiMajor", skip_serializing_if = "is_zero")]
    pub api_major: u32,
    /// Firmware API minor version.
    #[serde(rename = "apiMinor", skip_serializing_if = "is_zero")]
    pub api_minor: u32,
    /// Firmware build id.
    #[serde(rename = "buildID", skip_serializing_if = "is_zero")]
    pub build_id: u32,
    /// Guest policy.
    #[serde(skip_serializing_if = "is_zero")]
    pub policy: u32,
    /// SHA-256 (hex) of the SEV OVMF code file.
    #[serde(rename = "loaderSHA", skip_serializing_if = "String::is_empty")]
    pub loader_sha: String,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// `v1.SEVSecretOptions`, the JSON of `InjectLaunchSecret`'s options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct SevSecretOptions {
    /// Packet header, base64.
    #[serde(default)]
    pub header: String,
    /// Secret, base64.
    #[serde(default)]
    pub secret: String,
}

/// Refuses when the node has no SEV device at `device`.
///
/// # Errors
/// [`CmdApiError::Refused`] naming the missing device.
pub fn check_device(device: &Path) -> Result<(), CmdApiError> {
    if device.exists() {
        Ok(())
    } else {
        Err(CmdApiError::Refused(format!(
            "SEV is not available on this node: {} is absent",
            device.display()
        )))
    }
}

/// `GetSEVInfo`'s JSON.
///
/// # Errors
/// [`CmdApiError::Qmp`] when QEMU refuses (`SEV is not enabled in KVM`).
pub async fn platform_info(client: &QmpClient) -> Result<Vec<u8>, CmdApiError> {
    let caps = client
        .run_timeout(&QuerySevCapabilities, QMP_TIMEOUT)
        .await?;
    let info = SevPlatformInfo {
        pdh: caps.pdh,
        cert_chain: caps.cert_chain,
    };
    Ok(serde_json::to_vec(&info).unwrap_or_default())
}

/// `GetSEVInfo`'s JSON without a domain: starts `qemu` as a capability probe (`-machine none
/// -accel kvm -nodefaults -display none`, QMP on `socket`, as libvirt probes its QEMU), asks
/// [`platform_info`], and kills it. `socket` must be a path of a directory the launcher owns; it
/// is removed afterwards.
///
/// # Errors
/// [`CmdApiError::Io`] when QEMU cannot be started, [`CmdApiError::Refused`] when it exits or
/// does not open its socket in time, [`CmdApiError::Qmp`] when it refuses (`SEV is not enabled
/// in KVM`, `KVM not enabled`).
pub async fn probe_platform_info(qemu: &Path, socket: &Path) -> Result<Vec<u8>, CmdApiError> {
    let _ = std::fs::remove_file(socket);
    let qmp = KeyVal::with_head(&["unix:", &socket.display().to_string()].concat())
        .on_off("server", true)
        .on_off("wait", false)
        .finish();
    let mut child = tokio::process::Command::new(qemu)
        .args([
            "-machine",
            "none",
            "-accel",
            "kvm",
            "-nodefaults",
            "-display",
            "none",
            "-qmp",
        ])
        .arg(qmp)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| CmdApiError::Io {
            what: format!("start the SEV capability probe {}", qemu.display()),
            source,
        })?;
    let answer = async {
        let deadline = tokio::time::Instant::now() + PROBE_START_TIMEOUT;
        let client = loop {
            if let Ok(c) = QmpClient::connect(socket, QMP_TIMEOUT).await {
                break c;
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(CmdApiError::Refused(format!(
                    "the SEV capability probe QEMU exited: {status}"
                )));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(CmdApiError::Refused(
                    "the SEV capability probe QEMU did not open its QMP socket".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        platform_info(&client).await
    }
    .await;
    let _ = child.kill().await;
    let _ = std::fs::remove_file(socket);
    answer
}

/// `InjectLaunchSecret`'s answer on a domain without SEV: libvirt's `VIR_ERR_OPERATION_UNSUPPORTED`
/// (84) from the QEMU driver (10) in `qemuDomainSetLaunchSecurityState` (a domain whose
/// `<launchSecurity>` is not `sev`, SEV-SNP and TDX included), as KubeVirt's `getErrorMessage`
/// formats a libvirt error (`cmd-server/server.go`, `virtwrap/errors/errors.go`).
pub const SECRET_NEEDS_SEV: &str = "LibvirtError(Code=84, Domain=10, Message='Operation not supported: setting a launch secret is only supported in SEV-enabled domains')";

/// The SHA-256 (hex) of the SEV OVMF code file `loader`, read whole, as KubeVirt's
/// `GetLaunchMeasurement` hashes `EFICode(false, SEV)` (`manager.go`).
///
/// # Errors
/// [`CmdApiError::Refused`] with Go's `os.Open` text (`open <path>: no such file or
/// directory`), which KubeVirt answers when the file cannot be read.
pub fn loader_sha(loader: &Path) -> Result<String, CmdApiError> {
    let bytes = std::fs::read(loader).map_err(|e| {
        let errno = e
            .raw_os_error()
            .map(|n| nix::errno::Errno::from_raw(n).desc().to_string())
            .unwrap_or_else(|| e.to_string());
        // Go's syscall.Errno texts are strerror's, lower-cased at the start.
        let mut chars = errno.chars();
        let errno = chars
            .next()
            .map(|c| c.to_lowercase().chain(chars).collect::<String>())
            .unwrap_or_default();
        CmdApiError::Refused(format!("open {}: {errno}", loader.display()))
    })?;
    Ok(sha2::Sha256::digest(&bytes)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect())
}

/// `GetLaunchMeasurement`'s JSON. On an SEV domain (`sev: true`) QEMU's launch measurement
/// and SEV state (`query-sev-launch-measure`, `query-sev`) as libvirt's
/// `virDomainGetLaunchSecurityInfo` reports them; on any other domain libvirt reports no
/// parameters, and the answer has only the loader's hash. Either way the loader's SHA-256
/// ([`loader_sha`] of `loader`, the SEV OVMF code file), as KubeVirt's `GetLaunchMeasurement`.
///
/// # Errors
/// [`CmdApiError::Qmp`] when QEMU refuses (not paused at launch), [`CmdApiError::Refused`]
/// when the loader cannot be read (as KubeVirt fails then).
pub async fn launch_measurement(
    client: &QmpClient,
    sev: bool,
    loader: &Path,
) -> Result<Vec<u8>, CmdApiError> {
    let mut info = SevMeasurementInfo::default();
    if sev {
        let measure = client
            .run_timeout(&QuerySevLaunchMeasure, QMP_TIMEOUT)
            .await?;
        let state = client.run_timeout(&QuerySev, QMP_TIMEOUT).await?;
        info = SevMeasurementInfo {
            measurement: measure.data,
            api_major: state.api_major,
            api_minor: state.api_minor,
            build_id: state.build_id,
            policy: state.policy,
            loader_sha: String::new(),
        };
    }
    info.loader_sha = loader_sha(loader)?;
    Ok(serde_json::to_vec(&info).unwrap_or_default())
}

/// Decodes and checks `InjectLaunchSecret`'s options JSON.
///
/// # Errors
/// [`CmdApiError::Refused`] with KubeVirt's texts: [`BAD_SECRET_OPTIONS`], `Header is required`,
/// `Secret is required`.
pub fn secret_options(json: &[u8]) -> Result<SevSecretOptions, CmdApiError> {
    let o: SevSecretOptions = serde_json::from_slice(json)
        .map_err(|_| CmdApiError::Refused(BAD_SECRET_OPTIONS.into()))?;
    if o.header.is_empty() {
        return Err(CmdApiError::Refused("Header is required".into()));
    }
    if o.secret.is_empty() {
        return Err(CmdApiError::Refused("Secret is required".into()));
    }
    Ok(o)
}

/// `InjectLaunchSecret`.
///
/// # Errors
/// [`CmdApiError::Qmp`] when QEMU refuses.
pub async fn inject_secret(
    client: &QmpClient,
    options: &SevSecretOptions,
) -> Result<(), CmdApiError> {
    let cmd = SevInjectLaunchSecret {
        packet_header: options.header.clone(),
        secret: options.secret.clone(),
    };
    client.run_timeout(&cmd, QMP_TIMEOUT).await.map(drop)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_options_follow_kubevirt_checks() {
        assert_eq!(
            secret_options(b"x").unwrap_err().to_string(),
            BAD_SECRET_OPTIONS
        );
        assert_eq!(
            secret_options(br#"{"secret":"s"}"#)
                .unwrap_err()
                .to_string(),
            "Header is required"
        );
        assert_eq!(
            secret_options(br#"{"header":"h"}"#)
                .unwrap_err()
                .to_string(),
            "Secret is required"
        );
        assert_eq!(
            secret_options(br#"{"header":"h","secret":"s"}"#).unwrap(),
            SevSecretOptions {
                header: "h".into(),
                secret: "s".into()
            }
        );
    }

    #[test]
    fn loader_hash_or_kubevirt_open_error() {
        let dir = tempfile::tempdir().unwrap();
        let loader = dir.path().join(SEV_OVMF_CODE);
        assert_eq!(
            loader_sha(&loader).unwrap_err().to_string(),
            format!("open {}: no such file or directory", loader.display())
        );
        std::fs::write(&loader, b"abc").unwrap();
        assert_eq!(
            loader_sha(&loader).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn measurement_json_omits_empty_members() {
        let m = SevMeasurementInfo {
            measurement: "bWVhcw==".into(),
            api_major: 1,
            ..SevMeasurementInfo::default()
        };
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"measurement":"bWVhcw==","apiMajor":1}"#
        );
    }
}
