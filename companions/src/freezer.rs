//! `virt-freezer`: the Velero backup hooks KubeVirt puts on every launcher pod
//! (`cmd/virt-freezer/virt-freezer.go`, v1.9.0; annotations from
//! `pkg/storage/pod/annotations/generator.go`: `/usr/bin/virt-freezer --freeze|--unfreeze --name
//! <vmi> --namespace <ns>`, run by Velero's exec in `compute`, a non-zero exit fails the hook).
//!
//! - Flags: `--freeze`, `--unfreeze`, `--name`, `--namespace`, `--unfreezeTimeoutSeconds`
//!   (default 300). An unknown flag or a bad value exits 2, `-h` exits 0; neither `--freeze` nor
//!   `--unfreeze`, or an empty name or namespace, exits 1. With both, it freezes.
//! - Talks to [`SOCKET`] (fixed, as KubeVirt's: `/run`, reached in the image through
//!   `/var/run -> ../run`); not connecting or no cmd version 1: exit 1.
//! - `GetGuestInfo` failing (an in-band failure too): exit 1; no `guestAgentVersion`: "no guest
//!   agent", exit 0. `GetDomain` failing: exit 1; no domain, or not `Running`: exit 0.
//! - `FreezeVirtualMachine` (the VMI as Go marshals one with only its name and namespace, and the
//!   unfreeze timeout): failing exits 1, after an `UnfreezeVirtualMachine` when the error says the
//!   guest agent is not available. `UnfreezeVirtualMachine`: failing exits 1. Success: exit 0.

use crate::cmd_client::{runtime, LauncherClient};
use crate::flags::{self, Flag, Kind};
use crate::log;
use serde_json::{json, Value};
use std::path::Path;

/// The log component name (`log.InitializeLogging("freezer")`).
pub const COMPONENT: &str = "freezer";
/// The launcher's cmd socket, fixed in virt-freezer.
pub const SOCKET: &str = "/run/kubevirt/sockets/launcher-sock";
/// The error text that makes a failed freeze send an unfreeze (`gaNotAvailableError`).
pub const GA_NOT_AVAILABLE: &str = "Guest agent not available for now";

/// virt-freezer's flags.
pub const FLAGS: [Flag; 5] = [
    Flag {
        name: "freeze",
        kind: Kind::Bool,
        default: "false",
        usage: "Freeze VM",
    },
    Flag {
        name: "unfreeze",
        kind: Kind::Bool,
        default: "false",
        usage: "Unfreeze VM",
    },
    Flag {
        name: "name",
        kind: Kind::String,
        default: "",
        usage: "Name of the VirtualMachineInstance",
    },
    Flag {
        name: "namespace",
        kind: Kind::String,
        default: "",
        usage: "Namespace of the VirtualMachineInstance",
    },
    Flag {
        name: "unfreezeTimeoutSeconds",
        kind: Kind::Int32,
        default: "300",
        usage: "Timeout in seconds to automatically unfreeze the VirtualMachineInstance",
    },
];

/// The VMI JSON virt-freezer sends: Go's `json.Marshal` of a `VirtualMachineInstance` holding
/// only name and namespace (the fields without `omitempty` appear empty).
pub fn vmi_json(name: &str, namespace: &str) -> Vec<u8> {
    json!({
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": null},
        "spec": {"domain": {"resources": {}, "devices": {}}},
        "status": {"guestOSInfo": {}, "runtimeUser": 0}
    })
    .to_string()
    .into_bytes()
}

/// `value[key]` as Go's `encoding/json` finds a struct field: the exact key, else a key equal to
/// it ignoring case (KubeVirt's `api.Domain` has no JSON tags: it reads `Status` and `status`).
pub fn go_field<'a>(value: &'a Value, key: &str) -> &'a Value {
    static NULL: Value = Value::Null;
    let Some(object) = value.as_object() else {
        return &NULL;
    };
    object
        .get(key)
        .or_else(|| {
            object
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v)
        })
        .unwrap_or(&NULL)
}

/// The program; returns the exit code.
pub fn main() -> i32 {
    let parsed = flags::parse_or_exit("virt-freezer", &FLAGS, false);
    let (freeze, unfreeze) = (parsed.bool("freeze"), parsed.bool("unfreeze"));
    let (name, namespace) = (parsed.string("name"), parsed.string("namespace"));
    if !freeze && !unfreeze {
        log::error(
            COMPONENT,
            "Failed to parse flags",
            Some("either --freeze or --unfreeze must be set"),
        );
        return 1;
    }
    if name.is_empty() || namespace.is_empty() {
        log::error(
            COMPONENT,
            "Failed to parse flags",
            Some("both --name and --namespace must be provided"),
        );
        return 1;
    }
    let unfreeze_timeout = parsed.int32("unfreezeTimeoutSeconds", 300);
    let runtime = match runtime() {
        Ok(r) => r,
        Err(e) => {
            log::error(COMPONENT, "Failed to connect launcher", Some(&e));
            return 1;
        }
    };
    runtime.block_on(async move {
        let mut client = match LauncherClient::connect(Path::new(SOCKET)).await {
            Ok(c) => c,
            Err(e) => {
                log::error(COMPONENT, "Failed to connect launcher", Some(&e));
                return 1;
            }
        };
        match run(&mut client, freeze, &name, &namespace, unfreeze_timeout).await {
            Ok(()) => 0,
            Err(()) => 1,
        }
    })
}

async fn run(
    client: &mut LauncherClient,
    freeze: bool,
    name: &str,
    namespace: &str,
    unfreeze_timeout: i32,
) -> Result<(), ()> {
    let info = client.guest_info().await.map_err(|e| {
        log::error(COMPONENT, "Failed to get guest info", Some(&e));
    })?;
    let version = go_field(&info, "guestAgentVersion").as_str().unwrap_or("");
    if version.is_empty() {
        log::info(COMPONENT, "No guest agent, exiting");
        return Ok(());
    }
    log::info(COMPONENT, &format!("Guest agent version is {version}"));
    let domain = client.domain().await.map_err(|e| {
        log::error(COMPONENT, "Failed to get domain", Some(&e));
    })?;
    let running = domain
        .as_ref()
        .map(|d| go_field(go_field(d, "Status"), "Status") == "Running")
        .unwrap_or(false);
    if !running {
        log::info(
            COMPONENT,
            "VM domain not running, no need to freeze/unfreeze",
        );
        return Ok(());
    }
    let vmi = vmi_json(name, namespace);
    if freeze {
        if let Err(e) = client.freeze(&vmi, unfreeze_timeout).await {
            if e.contains(GA_NOT_AVAILABLE) {
                let _ = client.unfreeze(&vmi).await;
                let os = go_field(go_field(&info, "os"), "name")
                    .as_str()
                    .unwrap_or("")
                    .to_lowercase();
                let hint = if os.contains("windows") {
                    "Freezing VMI failed, please make sure guest agent and VSS are running and try again"
                } else {
                    "Freezing VMI failed, please make sure guest agent is running and try again"
                };
                log::error(COMPONENT, hint, Some(&e));
            } else {
                log::error(COMPONENT, "Freezing VMI failed", Some(&e));
            }
            return Err(());
        }
    } else if let Err(e) = client.unfreeze(&vmi).await {
        log::error(COMPONENT, "Unfreezing VMI failed", Some(&e));
        return Err(());
    }
    log::info(COMPONENT, "Operation completed successfully");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn fields_match_as_go_matches_them() {
        let d = serde_json::json!({"Status": {"status": "Running"}, "status": 1});
        assert_eq!(super::go_field(&d, "status"), 1);
        assert_eq!(
            super::go_field(super::go_field(&d, "Status"), "Status"),
            "Running"
        );
        assert!(super::go_field(&d, "none").is_null());
    }

    #[test]
    fn vmi_json_is_gos_marshalling_of_name_and_namespace() {
        let v: serde_json::Value = serde_json::from_slice(&super::vmi_json("vm", "ns")).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"metadata": {"name": "vm", "namespace": "ns", "creationTimestamp": null},
                "spec": {"domain": {"resources": {}, "devices": {}}},
                "status": {"guestOSInfo": {}, "runtimeUser": 0}})
        );
    }
}
