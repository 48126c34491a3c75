//! The cloud-init data a `PreCloudInitIso` hook gets and answers, in KubeVirt's JSON (v1.9.0
//! `pkg/cloud-init/cloud-init.go` `CloudInitData`, which has no JSON tags, so the keys are Go's
//! field names; the metadata structs have tags), and KubeVirt's reading of the answer
//! (`pkg/hooks/manager.go`, `preCloudInitIsoDataToJSON` and `preCloudInitIsoValidateResult`).
//! Pure: the launcher maps its own cloud-init model to and from these types, and the answer
//! passes its ISO limits and checks again before anything is written.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

use super::{CloudInitAnswer, HookError, PRE_CLOUD_INIT_ISO};

/// Where the guest finds the data (KubeVirt's `DataSourceType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DataSource {
    /// `noCloud`.
    #[serde(rename = "noCloud")]
    NoCloud,
    /// `configDrive`.
    #[serde(rename = "configDrive")]
    ConfigDrive,
}

/// A Go string field: absent or `null` is empty, as Go's `encoding/json` leaves it.
fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

/// NoCloud `meta-data` (KubeVirt's `NoCloudMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoCloudMetadata {
    /// `instance-type`.
    #[serde(
        rename = "instance-type",
        default,
        deserialize_with = "text",
        skip_serializing_if = "String::is_empty"
    )]
    pub instance_type: String,
    /// `instance-id`.
    #[serde(rename = "instance-id", default, deserialize_with = "text")]
    pub instance_id: String,
    /// `local-hostname`.
    #[serde(
        rename = "local-hostname",
        default,
        deserialize_with = "text",
        skip_serializing_if = "String::is_empty"
    )]
    pub local_hostname: String,
    /// `public-keys`: key name to key (Go marshals a map with sorted keys).
    #[serde(
        rename = "public-keys",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub public_keys: BTreeMap<String, String>,
}

/// ConfigDrive `meta_data.json` (KubeVirt's `ConfigDriveMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigDriveMetadata {
    /// `instance_type`.
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "String::is_empty"
    )]
    pub instance_type: String,
    /// `instance_id`.
    #[serde(default, deserialize_with = "text")]
    pub instance_id: String,
    /// `local_hostname`.
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "String::is_empty"
    )]
    pub local_hostname: String,
    /// `hostname`.
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "String::is_empty"
    )]
    pub hostname: String,
    /// `uuid`.
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "String::is_empty"
    )]
    pub uuid: String,
    /// `devices` (KubeVirt's `DeviceData` list, kept as JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<serde_json::Value>>,
    /// `public_keys`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub public_keys: BTreeMap<String, String>,
}

/// KubeVirt's `cloudinit.CloudInitData`, the hook's `cloudInitData` (field order kept).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CloudInitData {
    /// `DataSource`.
    #[serde(rename = "DataSource")]
    pub data_source: DataSource,
    /// `NoCloudMetaData` (`null` for ConfigDrive).
    #[serde(rename = "NoCloudMetaData", default)]
    pub no_cloud_meta_data: Option<NoCloudMetadata>,
    /// `ConfigDriveMetaData` (`null` for NoCloud).
    #[serde(rename = "ConfigDriveMetaData", default)]
    pub config_drive_meta_data: Option<ConfigDriveMetadata>,
    /// `UserData`, decoded text.
    #[serde(rename = "UserData", default, deserialize_with = "text")]
    pub user_data: String,
    /// `NetworkData`, decoded text.
    #[serde(rename = "NetworkData", default, deserialize_with = "text")]
    pub network_data: String,
    /// `DevicesData` (`null` when the hook runs: device metadata comes after the definition).
    #[serde(rename = "DevicesData", default)]
    pub devices_data: Option<Vec<serde_json::Value>>,
    /// `VolumeName`.
    #[serde(rename = "VolumeName", default, deserialize_with = "text")]
    pub volume_name: String,
}

/// The older form of the same data (`v1.CloudInitNoCloudSource` with only `userData` and
/// `networkData`; both omitted when empty), sent as `cloudInitNoCloudSource` for ConfigDrive too.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoCloudSource {
    /// `userData`.
    #[serde(
        rename = "userData",
        default,
        deserialize_with = "text",
        skip_serializing_if = "String::is_empty"
    )]
    pub user_data: String,
    /// `networkData`.
    #[serde(
        rename = "networkData",
        default,
        deserialize_with = "text",
        skip_serializing_if = "String::is_empty"
    )]
    pub network_data: String,
}

impl CloudInitData {
    /// KubeVirt's `IsValidCloudInitData`: user data and one of the metadata objects.
    pub fn is_valid(&self) -> bool {
        !self.user_data.is_empty()
            && (self.no_cloud_meta_data.is_some() || self.config_drive_meta_data.is_some())
    }

    /// The two JSON payloads of `PreCloudInitIso`, `(cloudInitNoCloudSource, cloudInitData)`, for
    /// [`super::Sidecars::pre_cloud_init_iso`].
    ///
    /// # Errors
    /// None in practice (serde_json on plain data); kept as a `Result` for the serializer.
    pub fn hook_payloads(&self) -> Result<(Vec<u8>, Vec<u8>), serde_json::Error> {
        let legacy = NoCloudSource {
            user_data: self.user_data.clone(),
            network_data: self.network_data.clone(),
        };
        Ok((serde_json::to_vec(&legacy)?, serde_json::to_vec(self)?))
    }

    /// Reads a hook's answer as KubeVirt does (`preCloudInitIsoValidateResult`): its
    /// `cloudInitData` when that is valid ([`Self::is_valid`]); otherwise the older
    /// `cloudInitNoCloudSource`'s user and network data with `data_source` and no metadata.
    /// Unknown keys are ignored, absent or `null` strings are empty, as Go's decoder does.
    ///
    /// # Errors
    /// [`HookError::Call`] naming the sidecar when the JSON that decides cannot be read.
    pub fn from_answer(
        data_source: DataSource,
        answer: &CloudInitAnswer,
    ) -> Result<CloudInitData, HookError> {
        let bad = |what: &str, e: serde_json::Error| HookError::Call {
            hook_point: PRE_CLOUD_INIT_ISO,
            socket: answer.socket.clone(),
            reason: format!("the answered {what} is not readable: {e}"),
        };
        let data: Option<CloudInitData> =
            serde_json::from_slice(&answer.cloud_init_data).map_err(|e| bad("cloudInitData", e))?;
        if let Some(d) = data.filter(CloudInitData::is_valid) {
            return Ok(d);
        }
        let legacy: Option<NoCloudSource> =
            serde_json::from_slice(&answer.cloud_init_no_cloud_source)
                .map_err(|e| bad("cloudInitNoCloudSource", e))?;
        let legacy = legacy.unwrap_or_default();
        Ok(CloudInitData {
            data_source,
            no_cloud_meta_data: None,
            config_drive_meta_data: None,
            user_data: legacy.user_data,
            network_data: legacy.network_data,
            devices_data: None,
            volume_name: String::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_cloud() -> CloudInitData {
        CloudInitData {
            data_source: DataSource::NoCloud,
            no_cloud_meta_data: Some(NoCloudMetadata {
                instance_id: "vm1.ns1".into(),
                local_hostname: "vm1".into(),
                ..Default::default()
            }),
            config_drive_meta_data: None,
            user_data: "#cloud-config\npassword: x\n".into(),
            network_data: String::new(),
            devices_data: None,
            volume_name: "cloudinitdisk".into(),
        }
    }

    fn answer(no_cloud: &str, data: &str) -> CloudInitAnswer {
        CloudInitAnswer {
            socket: "/var/run/kubevirt-hooks/hook-sidecar-0/s.sock".into(),
            cloud_init_no_cloud_source: no_cloud.as_bytes().to_vec(),
            cloud_init_data: data.as_bytes().to_vec(),
        }
    }

    /// The bytes KubeVirt's `json.Marshal` writes for this data (Go field names in struct order,
    /// the metadata's tags, `null` pointers, omitted empty strings in the legacy form): both
    /// strings are what a small Go program printed for the same values with KubeVirt v1.9.0's
    /// `cloudinit.CloudInitData` and `v1.CloudInitNoCloudSource`. (Go also escapes `<`, `>`
    /// and `&` as `\u003c`..; serde_json does not: the same JSON value, other bytes.)
    #[test]
    fn payloads_are_kubevirts_json() {
        let (legacy, data) = no_cloud().hook_payloads().unwrap();
        assert_eq!(
            String::from_utf8(legacy).unwrap(),
            r##"{"userData":"#cloud-config\npassword: x\n"}"##
        );
        assert_eq!(
            String::from_utf8(data).unwrap(),
            r##"{"DataSource":"noCloud","NoCloudMetaData":{"instance-id":"vm1.ns1","local-hostname":"vm1"},"ConfigDriveMetaData":null,"UserData":"#cloud-config\npassword: x\n","NetworkData":"","DevicesData":null,"VolumeName":"cloudinitdisk"}"##
        );
    }

    /// KubeVirt's cloudinit example hook: `UserData` set to `#cloud-config\n`, the rest kept.
    #[test]
    fn a_valid_answer_is_taken_as_it_is() {
        let mut want = no_cloud();
        want.user_data = "#cloud-config\n".into();
        let (_, data) = want.hook_payloads().unwrap();
        let got = CloudInitData::from_answer(
            DataSource::NoCloud,
            &answer("", std::str::from_utf8(&data).unwrap()),
        )
        .unwrap();
        assert_eq!(got, want);
    }

    /// The shim answers only `cloudInitData`; an older sidecar only the legacy form, which then
    /// wins with the original data source and no metadata (KubeVirt's fallback).
    #[test]
    fn an_invalid_answer_falls_back_to_the_legacy_form() {
        let got = CloudInitData::from_answer(
            DataSource::ConfigDrive,
            &answer(r#"{"userData":"u","networkData":null,"extra":1}"#, ""),
        );
        // Empty cloudInitData is not JSON: an error naming the sidecar, as Go's Unmarshal fails.
        let err = got.unwrap_err().to_string();
        assert!(err.contains("hook-sidecar-0/s.sock"), "{err}");
        assert!(err.contains("cloudInitData"), "{err}");

        let got = CloudInitData::from_answer(
            DataSource::ConfigDrive,
            &answer(
                r#"{"userData":"u","networkData":null,"extra":1}"#,
                r#"{"UserData":"","NoCloudMetaData":null,"DataSource":"noCloud"}"#,
            ),
        )
        .unwrap();
        assert_eq!(got.data_source, DataSource::ConfigDrive);
        assert_eq!(got.user_data, "u");
        assert_eq!(got.network_data, "");
        assert!(got.no_cloud_meta_data.is_none() && got.config_drive_meta_data.is_none());

        // `null` decodes to nothing, as in Go: empty data.
        let got = CloudInitData::from_answer(DataSource::NoCloud, &answer("null", "null")).unwrap();
        assert_eq!(got.user_data, "");
    }

    #[test]
    fn hostile_answers_are_errors_not_panics() {
        for (legacy, data) in [
            ("{", "{"),
            ("[]", "[]"),
            (
                "1",
                r#"{"DataSource":"floppy","UserData":"x","NoCloudMetaData":{}}"#,
            ),
            (r#"{"userData":7}"#, "null"),
        ] {
            let r = CloudInitData::from_answer(DataSource::NoCloud, &answer(legacy, data));
            assert!(r.is_err(), "{legacy} / {data}: {r:?}");
        }
    }
}
