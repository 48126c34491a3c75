//! TPM (`converter/compute/tpm.go`): with `devices.tpm` (not `enabled: false`), a swtpm socket
//! chardev `chrtpm` (QEMU connects; `sync` starts swtpm), `-tpmdev emulator,id=tpm-tpm0`, and
//! `tpm-tis` (`tpm-crb` when `persistent`).
//!
//! Reads: `ctx.swtpm_socket` (default `<private>/<uid>/swtpm.sock`).

use super::super::context::ConverterContext;
use super::super::error::ConvertError;
use super::super::plan::{Backend, DeviceClass, DomainPlan, Placement};
use super::super::qemu::{ChardevSocket, Device, DeviceTpm, SocketAddr};
use super::{planned, vmi_uid};
use crate::vmi::Vmi;

/// Adds the TPM.
pub struct TpmConfigurator;

impl super::super::convert::Configurator for TpmConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let Some(t) = vmi.spec.domain.devices.tpm.as_ref() else {
            return Ok(());
        };
        if t.enabled == Some(false) {
            return Ok(());
        }
        let socket = match &ctx.swtpm_socket {
            Some(s) => s.clone(),
            None => format!("{}/{}/swtpm.sock", ctx.paths.private_dir, vmi_uid(vmi)?),
        };
        plan.devices.push(planned(
            DeviceClass::Tpm,
            None,
            Backend::Tpm {
                chardev: ChardevSocket {
                    id: "chrtpm".into(),
                    addr: SocketAddr::Path(socket),
                    server: false,
                    logfile: None,
                },
                tpmdev_id: "tpm-tpm0".into(),
            },
            Device::Tpm(DeviceTpm {
                driver: if t.persistent == Some(true) {
                    "tpm-crb"
                } else {
                    "tpm-tis"
                },
                tpmdev: "tpm-tpm0".into(),
                id: "tpm0".into(),
            }),
            Placement::NonPci,
        ));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::testutil::configure;
    use serde_json::json;

    #[test]
    fn tpm_table() {
        let swtpm = ConverterContext {
            swtpm_socket: Some("/run/swtpm.sock".into()),
            ..Default::default()
        };
        // (tpm fragment, context) -> (driver, swtpm socket)
        let cases = [
            (json!(null), ConverterContext::default(), None),
            (json!({"enabled": false}), ConverterContext::default(), None),
            (
                json!({}),
                ConverterContext::default(),
                Some(("tpm-tis", "/var/run/kubevirt-private/uid1/swtpm.sock")),
            ),
            (
                json!({"persistent": true}),
                swtpm,
                Some(("tpm-crb", "/run/swtpm.sock")),
            ),
        ];
        for (tpm, ctx, want) in cases {
            let plan = configure(&TpmConfigurator, json!({"devices": {"tpm": tpm}}), &ctx).unwrap();
            let got = plan.devices.first().map(|d| match (&d.backend, &d.device) {
                (Backend::Tpm { chardev, tpmdev_id }, Device::Tpm(t)) => {
                    assert_eq!(
                        (tpmdev_id.as_str(), t.tpmdev.as_str()),
                        ("tpm-tpm0", "tpm-tpm0")
                    );
                    assert!(!chardev.server);
                    let SocketAddr::Path(p) = &chardev.addr else {
                        panic!("swtpm on a non-path socket")
                    };
                    (t.driver, p.clone())
                }
                other => panic!("not a TPM: {other:?}"),
            });
            assert_eq!(got, want.map(|(d, p)| (d, p.to_string())), "{tpm}");
        }
    }
}
