//! cloud-init NoCloud (`cidata`) and ConfigDrive (`config-2`) ISOs.
//!
//! Mirrors KubeVirt v1.9.0 `pkg/cloud-init/cloud-init.go`:
//! - user and network data come from the plain field, else the base64 field; a secret reference
//!   replaces both with the file `userdata` (or `userData`) / `networkdata` (or `networkData`) of
//!   `/var/run/kubevirt-private/secret/<volume>/`, and is an error only when every referenced file
//!   is unreadable (`resolveNoCloudSecrets`);
//! - at least one of user or network data is required; inline and base64 data are limited to
//!   2048 bytes each (virt-api's `cloudInitUserMaxLen`/`cloudInitNetworkMaxLen`, enforced here
//!   because qlauncher may be given a VMI that never went through virt-api);
//! - NoCloud writes `user-data`, `meta-data` (JSON `{"instance-type"?, "instance-id": <firmware
//!   uuid>, "local-hostname": <hostname>, "public-keys"?}`) and `network-config` when there is
//!   network data; ConfigDrive writes `openstack/latest/{user_data, meta_data.json,
//!   network_data.json}` with `{"instance_type"?, "instance_id": "<name>.<namespace>",
//!   "hostname", "uuid", "devices"?, "public_keys"?}`; files are mode 0600;
//! - SSH public keys of access credentials come from every file of
//!   `/var/run/kubevirt-private/secret/<secret>-access-cred/` (names not starting with `..`), in
//!   name order, keyed `"0"`, `"1"`, ...;
//! - the ISO is `<ephemeral>/cloud-init-data/<namespace>/<vmi>/noCloud.iso` or `configdrive.iso`.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde::{Deserialize, Serialize};

use super::iso::{write_iso, IsoEntry};
use super::{paths, validate_volume_name, Owner, StorageError};

/// Limit of inline or base64 user data, in bytes (virt-api `cloudInitUserMaxLen`).
pub const USER_DATA_MAX: u64 = 2048;
/// Limit of inline or base64 network data, in bytes (virt-api `cloudInitNetworkMaxLen`).
pub const NETWORK_DATA_MAX: u64 = 2048;
/// Limit of data read from a secret file, in bytes: the Kubernetes Secret size limit (1 MiB).
pub const SECRET_DATA_MAX: u64 = 1 << 20;
/// Mode of the files inside the ISO (KubeVirt writes them with 0600 before imaging).
const DATA_FILE_MODE: u32 = 0o600;
/// Mode of the directories inside the ISO (`MkdirAllWithNosec`: 0750).
const DATA_DIR_MODE: u32 = 0o750;

/// `cloudInitNoCloud` or `cloudInitConfigDrive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CloudInitKind {
    /// NoCloud: label `cidata`, `noCloud.iso`.
    NoCloud,
    /// ConfigDrive: label `config-2`, `configdrive.iso`.
    ConfigDrive,
}

impl CloudInitKind {
    /// The ISO volume label.
    pub fn label(self) -> &'static str {
        match self {
            CloudInitKind::NoCloud => "cidata",
            CloudInitKind::ConfigDrive => "config-2",
        }
    }

    /// The ISO file name.
    pub fn iso_name(self) -> &'static str {
        match self {
            CloudInitKind::NoCloud => "noCloud.iso",
            CloudInitKind::ConfigDrive => "configdrive.iso",
        }
    }

    /// The VMI field name, for errors.
    fn field(self) -> &'static str {
        match self {
            CloudInitKind::NoCloud => "cloudInitNoCloud",
            CloudInitKind::ConfigDrive => "cloudInitConfigDrive",
        }
    }
}

/// One cloud-init volume (`spec.volumes[]` with `cloudInitNoCloud` or `cloudInitConfigDrive`).
/// Only the first such volume of a VMI is used (KubeVirt `ReadCloudInitVolumeDataSource`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CloudInitSpec {
    /// Volume name.
    pub volume: String,
    /// NoCloud or ConfigDrive; `None` is NoCloud.
    pub kind: Option<CloudInitKind>,
    /// `userData`.
    pub user_data: Option<String>,
    /// `userDataBase64`.
    pub user_data_base64: Option<String>,
    /// `userDataSecretRef.name` (the secret is mounted at `<secret_dir>/<volume>/`).
    pub user_data_secret_ref: Option<String>,
    /// `networkData`.
    pub network_data: Option<String>,
    /// `networkDataBase64`.
    pub network_data_base64: Option<String>,
    /// `networkDataSecretRef.name`.
    pub network_data_secret_ref: Option<String>,
}

/// What the meta-data needs from the VMI.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VmiIdentity {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `spec.hostname`, if set.
    pub hostname: Option<String>,
    /// `spec.domain.firmware.uuid`; a random UUID is used when absent, as KubeVirt does.
    pub firmware_uuid: Option<String>,
    /// The (cluster) instancetype annotation, if any.
    pub instance_type: Option<String>,
    /// Secret names of `spec.accessCredentials[].sshPublicKey` whose propagation method matches
    /// the cloud-init kind (noCloud / configDrive).
    pub ssh_key_secrets: Vec<String>,
    /// ConfigDrive device metadata (NICs and host devices with tags), if any.
    pub devices: Option<Vec<DeviceData>>,
}

/// One entry of ConfigDrive `devices` (KubeVirt `DeviceData`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceData {
    /// `nic` or `hostdev`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `pci`...
    pub bus: String,
    /// Guest address, e.g. `0000:01:00.0`.
    pub address: String,
    /// MAC address (NICs).
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub mac: String,
    /// Serial (disks).
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub serial: String,
    /// NUMA node.
    #[serde(rename = "numaNode", skip_serializing_if = "is_zero", default)]
    pub numa_node: u32,
    /// CPUs aligned with the device.
    #[serde(rename = "alignedCPUs", skip_serializing_if = "Vec::is_empty", default)]
    pub aligned_cpus: Vec<u32>,
    /// Device role tags (`null` when none, as Go marshals a nil slice).
    pub tags: Option<Vec<String>>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// NoCloud `meta-data` (KubeVirt `NoCloudMetadata`, field order kept).
#[derive(Serialize)]
struct NoCloudMetadata<'a> {
    #[serde(rename = "instance-type", skip_serializing_if = "str::is_empty")]
    instance_type: &'a str,
    #[serde(rename = "instance-id")]
    instance_id: &'a str,
    #[serde(rename = "local-hostname", skip_serializing_if = "str::is_empty")]
    local_hostname: &'a str,
    #[serde(rename = "public-keys", skip_serializing_if = "BTreeMap::is_empty")]
    public_keys: &'a BTreeMap<String, String>,
}

/// ConfigDrive `meta_data.json` (KubeVirt `ConfigDriveMetadata`, field order kept).
#[derive(Serialize)]
struct ConfigDriveMetadata<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    instance_type: &'a str,
    instance_id: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    local_hostname: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    hostname: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    uuid: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    devices: Option<&'a Vec<DeviceData>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    public_keys: &'a BTreeMap<String, String>,
}

/// Resolved cloud-init content, ready to be imaged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudInitData {
    /// Volume name.
    pub volume: String,
    /// NoCloud or ConfigDrive.
    pub kind: CloudInitKind,
    /// `user-data` / `user_data` bytes (possibly empty).
    pub user_data: Vec<u8>,
    /// `network-config` / `network_data.json` bytes; the file is omitted when empty.
    pub network_data: Vec<u8>,
    /// `meta-data` / `meta_data.json` bytes (JSON).
    pub meta_data: Vec<u8>,
}

/// KubeVirt's `dns.SanitizeHostname`: `spec.hostname` if set, else the VMI name up to its first
/// dot, cut to 63 bytes.
pub fn vmi_hostname(name: &str, spec_hostname: Option<&str>) -> String {
    if let Some(h) = spec_hostname.filter(|h| !h.is_empty()) {
        return h.to_string();
    }
    let first = name.split('.').next().unwrap_or("");
    let mut end = first.len().min(63);
    while !first.is_char_boundary(end) {
        end -= 1;
    }
    first[..end].to_string()
}

impl CloudInitData {
    /// Resolves `spec` for `vmi`, reading secret references and access-credential keys under
    /// `secret_dir` (normally [`paths::SECRET_SOURCE_DIR`]).
    ///
    /// # Errors
    /// [`StorageError::InvalidVolumeName`], [`StorageError::InvalidCloudInit`] (two sources for
    /// one field, or no data at all), [`StorageError::InvalidBase64`],
    /// [`StorageError::DataTooLarge`], [`StorageError::ReadSource`].
    pub fn resolve(
        spec: &CloudInitSpec,
        vmi: &VmiIdentity,
        secret_dir: &Path,
    ) -> Result<CloudInitData, StorageError> {
        validate_volume_name(&spec.volume)?;
        let kind = spec.kind.unwrap_or(CloudInitKind::NoCloud);
        let volume = spec.volume.as_str();
        let field = kind.field();
        let invalid = |reason: String| StorageError::InvalidCloudInit {
            volume: volume.to_string(),
            reason,
        };
        let non_empty = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
        for (what, sources) in [
            (
                "userdata",
                [
                    non_empty(&spec.user_data),
                    non_empty(&spec.user_data_base64),
                    non_empty(&spec.user_data_secret_ref),
                ],
            ),
            (
                "networkdata",
                [
                    non_empty(&spec.network_data),
                    non_empty(&spec.network_data_base64),
                    non_empty(&spec.network_data_secret_ref),
                ],
            ),
        ] {
            if sources.iter().filter(|s| **s).count() > 1 {
                return Err(invalid(format!(
                    "{field} must have only one {what} source set"
                )));
            }
        }

        // Secret references, read first; they replace the inline fields (KubeVirt
        // resolveNoCloudSecrets / resolveConfigDriveSecrets).
        let secret_base = secret_dir.join(volume);
        let mut secret_user = None;
        let mut secret_network = None;
        let mut failures = Vec::new();
        if non_empty(&spec.user_data_secret_ref) {
            match read_first(volume, &secret_base, &["userdata", "userData"]) {
                Ok(data) => secret_user = Some(data),
                Err(e) => failures.push(e),
            }
        }
        if non_empty(&spec.network_data_secret_ref) {
            match read_first(volume, &secret_base, &["networkdata", "networkData"]) {
                Ok(data) => secret_network = Some(data),
                Err(e) => failures.push(e),
            }
        }
        let referenced = usize::from(non_empty(&spec.user_data_secret_ref))
            + usize::from(non_empty(&spec.network_data_secret_ref));
        if referenced > 0 && failures.len() == referenced {
            return Err(failures.remove(0));
        }

        let user_data = match secret_user.filter(|d| !d.is_empty()) {
            Some(data) => data,
            None => inline_or_base64(
                volume,
                field,
                "userData",
                &spec.user_data,
                &spec.user_data_base64,
                USER_DATA_MAX,
            )?,
        };
        let network_data = match secret_network.filter(|d| !d.is_empty()) {
            Some(data) => data,
            None => inline_or_base64(
                volume,
                field,
                "networkData",
                &spec.network_data,
                &spec.network_data_base64,
                NETWORK_DATA_MAX,
            )?,
        };
        if user_data.is_empty() && network_data.is_empty() {
            return Err(invalid(
                "userDataBase64, userData, networkDataBase64 or networkData is required for a \
                 cloud-init data source"
                    .into(),
            ));
        }

        let keys = read_ssh_keys(volume, secret_dir, &vmi.ssh_key_secrets)?;
        let hostname = vmi_hostname(&vmi.name, vmi.hostname.as_deref());
        let uuid = vmi
            .firmware_uuid
            .clone()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let instance_type = vmi.instance_type.as_deref().unwrap_or("");
        let meta = match kind {
            CloudInitKind::NoCloud => go_json(&NoCloudMetadata {
                instance_type,
                instance_id: &uuid,
                local_hostname: &hostname,
                public_keys: &keys,
            }),
            CloudInitKind::ConfigDrive => go_json(&ConfigDriveMetadata {
                instance_type,
                instance_id: format!("{}.{}", vmi.name, vmi.namespace),
                local_hostname: "",
                hostname: &hostname,
                uuid: &uuid,
                devices: vmi.devices.as_ref(),
                public_keys: &keys,
            }),
        };
        Ok(CloudInitData {
            volume: volume.to_string(),
            kind,
            user_data,
            network_data,
            meta_data: meta.into_bytes(),
        })
    }

    /// The files of the ISO, as KubeVirt lays them out, with Rock Ridge owner `owner`.
    pub fn entries(&self, owner: Owner) -> Vec<IsoEntry> {
        let file =
            |name: &str, data: &[u8]| IsoEntry::file(name, data.to_vec(), DATA_FILE_MODE, owner);
        let (user, meta, network) = match self.kind {
            CloudInitKind::NoCloud => ("user-data", "meta-data", "network-config"),
            CloudInitKind::ConfigDrive => ("user_data", "meta_data.json", "network_data.json"),
        };
        let mut files = vec![file(user, &self.user_data), file(meta, &self.meta_data)];
        if !self.network_data.is_empty() {
            files.push(file(network, &self.network_data));
        }
        match self.kind {
            CloudInitKind::NoCloud => files,
            CloudInitKind::ConfigDrive => vec![IsoEntry::dir(
                "openstack",
                vec![IsoEntry::dir("latest", files, DATA_DIR_MODE, owner)],
                DATA_DIR_MODE,
                owner,
            )],
        }
    }
}

/// `<ephemeral_dir>/cloud-init-data/<namespace>/<vmi>/<noCloud.iso|configdrive.iso>`.
///
/// # Errors
/// [`StorageError::InvalidVolumeName`] when the namespace or VMI name is not one path component.
pub fn cloud_init_iso_path(
    ephemeral_dir: &Path,
    vmi: &VmiIdentity,
    kind: CloudInitKind,
) -> Result<PathBuf, StorageError> {
    validate_volume_name(&vmi.namespace)?;
    validate_volume_name(&vmi.name)?;
    Ok(paths::cloud_init_dir(ephemeral_dir, &vmi.namespace, &vmi.name).join(kind.iso_name()))
}

/// Writes the cloud-init ISO for `data` at `iso` (see [`cloud_init_iso_path`]), owned by
/// `owner` (also the Rock Ridge owner of its files; `None`: root), replacing an older image.
///
/// # Errors
/// [`StorageError::NoSpace`] or [`StorageError::CreateIso`]; nothing is left behind.
pub fn write_cloud_init_iso(
    data: &CloudInitData,
    iso: &Path,
    owner: Option<Owner>,
) -> Result<(), StorageError> {
    let rr_owner = owner.unwrap_or(Owner { uid: 0, gid: 0 });
    write_iso(
        &data.volume,
        iso,
        data.kind.label(),
        data.entries(rr_owner),
        owner,
    )
}

fn inline_or_base64(
    volume: &str,
    field: &str,
    name: &str,
    inline: &Option<String>,
    base64_field: &Option<String>,
    limit: u64,
) -> Result<Vec<u8>, StorageError> {
    let too_large = |field_name: String, size: usize| StorageError::DataTooLarge {
        volume: volume.to_string(),
        field: field_name,
        size: size as u64,
        limit,
    };
    if let Some(text) = inline.as_deref().filter(|s| !s.is_empty()) {
        if text.len() as u64 > limit {
            return Err(too_large(format!("{field}.{name}"), text.len()));
        }
        return Ok(text.as_bytes().to_vec());
    }
    if let Some(encoded) = base64_field.as_deref().filter(|s| !s.is_empty()) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|source| StorageError::InvalidBase64 {
                volume: volume.to_string(),
                field: format!("{field}.{name}Base64"),
                source,
            })?;
        if decoded.len() as u64 > limit {
            return Err(too_large(format!("{field}.{name}Base64"), decoded.len()));
        }
        return Ok(decoded);
    }
    Ok(Vec::new())
}

/// Reads the first of `names` that can be read in `dir`, up to [`SECRET_DATA_MAX`] bytes.
fn read_first(volume: &str, dir: &Path, names: &[&str]) -> Result<Vec<u8>, StorageError> {
    let mut last = None;
    for name in names {
        match read_capped(volume, &dir.join(name), SECRET_DATA_MAX) {
            Ok(data) => return Ok(data),
            Err(e @ StorageError::DataTooLarge { .. }) => return Err(e),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| StorageError::ReadSource {
        volume: volume.to_string(),
        path: dir.to_path_buf(),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    }))
}

/// Reads a whole file, refusing more than `limit` bytes.
pub(crate) fn read_capped(volume: &str, path: &Path, limit: u64) -> Result<Vec<u8>, StorageError> {
    let read_err = |source| StorageError::ReadSource {
        volume: volume.to_string(),
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut data = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut data)
        .map_err(read_err)?;
    if data.len() as u64 > limit {
        let size = std::fs::metadata(path)
            .map(|m| m.len())
            .unwrap_or(data.len() as u64);
        return Err(StorageError::DataTooLarge {
            volume: volume.to_string(),
            field: path.display().to_string(),
            size,
            limit,
        });
    }
    Ok(data)
}

/// KubeVirt `resolveSSHPublicKeys`: every non-empty file (not a directory, name not starting with
/// `..`) of `<secret_dir>/<secret>-access-cred/`, secrets in the given order, files in name
/// order, keyed by a running index.
fn read_ssh_keys(
    volume: &str,
    secret_dir: &Path,
    secrets: &[String],
) -> Result<BTreeMap<String, String>, StorageError> {
    let mut keys = BTreeMap::new();
    let mut count = 0usize;
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        validate_volume_name(secret)?;
        let dir = secret_dir.join(format!("{secret}-access-cred"));
        let read_err = |source| StorageError::ReadSource {
            volume: volume.to_string(),
            path: dir.clone(),
            source,
        };
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(read_err)? {
            let entry = entry.map_err(read_err)?;
            let is_dir = entry.file_type().map_err(read_err)?.is_dir();
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_dir || name.starts_with("..") {
                continue;
            }
            names.push(name);
        }
        names.sort();
        for name in names {
            let data = read_capped(volume, &dir.join(&name), SECRET_DATA_MAX)?;
            if data.is_empty() {
                continue;
            }
            keys.insert(
                count.to_string(),
                String::from_utf8_lossy(&data).into_owned(),
            );
            count += 1;
        }
    }
    Ok(keys)
}

/// JSON as Go's `encoding/json` writes it: compact, with `<`, `>`, `&`, U+2028 and U+2029
/// escaped. (These characters only occur inside strings, so replacing them is safe.)
fn go_json<T: Serialize>(value: &T) -> String {
    let plain = serde_json::to_string(value).unwrap_or_else(|_| "{}".into());
    let mut out = String::with_capacity(plain.len());
    for c in plain.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi() -> VmiIdentity {
        VmiIdentity {
            name: "testvmi.example".into(),
            namespace: "default".into(),
            firmware_uuid: Some("5d307ca9-b3ef-428c-8861-06e72d69f223".into()),
            ..VmiIdentity::default()
        }
    }

    fn nocloud(user: &str) -> CloudInitSpec {
        CloudInitSpec {
            volume: "cloudinitdisk".into(),
            user_data: Some(user.into()),
            ..CloudInitSpec::default()
        }
    }

    #[test]
    fn nocloud_meta_data_is_kubevirt_json() {
        let data = CloudInitData::resolve(
            &nocloud("#cloud-config\n"),
            &vmi(),
            Path::new("/nonexistent"),
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(data.meta_data).unwrap(),
            r#"{"instance-id":"5d307ca9-b3ef-428c-8861-06e72d69f223","local-hostname":"testvmi"}"#
        );
        assert_eq!(data.user_data, b"#cloud-config\n");
        assert!(data.network_data.is_empty());
    }

    #[test]
    fn config_drive_meta_data_is_kubevirt_json() {
        let mut spec = nocloud("x");
        spec.kind = Some(CloudInitKind::ConfigDrive);
        let mut identity = vmi();
        identity.instance_type = Some("u1.small".into());
        identity.hostname = Some("h<1>".into());
        let data = CloudInitData::resolve(&spec, &identity, Path::new("/nonexistent")).unwrap();
        assert_eq!(
            String::from_utf8(data.meta_data).unwrap(),
            r#"{"instance_type":"u1.small","instance_id":"testvmi.example.default","hostname":"h\u003c1\u003e","uuid":"5d307ca9-b3ef-428c-8861-06e72d69f223"}"#
        );
    }

    #[test]
    fn base64_data_is_decoded_and_checked() {
        let spec = CloudInitSpec {
            volume: "c".into(),
            user_data_base64: Some("I2Nsb3VkLWNvbmZpZwo=".into()),
            network_data_base64: Some("not base64!".into()),
            ..CloudInitSpec::default()
        };
        let err = CloudInitData::resolve(&spec, &vmi(), Path::new("/nonexistent")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "volume c: cloudInitNoCloud.networkDataBase64 is not valid base64"
        );
    }

    #[test]
    fn user_data_over_the_limit_is_rejected() {
        let err = CloudInitData::resolve(&nocloud(&"a".repeat(2049)), &vmi(), Path::new("/x"))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "volume cloudinitdisk: cloudInitNoCloud.userData is 2049 bytes, over the 2048 byte limit"
        );
        assert!(
            CloudInitData::resolve(&nocloud(&"a".repeat(2048)), &vmi(), Path::new("/x")).is_ok()
        );
    }

    #[test]
    fn no_data_and_two_sources_are_rejected() {
        let empty = CloudInitSpec {
            volume: "c".into(),
            ..CloudInitSpec::default()
        };
        assert!(matches!(
            CloudInitData::resolve(&empty, &vmi(), Path::new("/x")),
            Err(StorageError::InvalidCloudInit { .. })
        ));
        let mut two = nocloud("a");
        two.user_data_base64 = Some("YQ==".into());
        assert!(matches!(
            CloudInitData::resolve(&two, &vmi(), Path::new("/x")),
            Err(StorageError::InvalidCloudInit { .. })
        ));
    }

    #[test]
    fn hostname_follows_sanitize_hostname() {
        assert_eq!(vmi_hostname("a.b.c", None), "a");
        assert_eq!(vmi_hostname(&"x".repeat(70), None), "x".repeat(63));
        assert_eq!(vmi_hostname("a.b", Some("given")), "given");
        assert_eq!(vmi_hostname("a.b", Some("")), "a");
    }
}
