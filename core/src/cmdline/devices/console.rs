//! Serial console (`converter/compute/console.go`): unless `autoattachSerialConsole: false`, a
//! unix socket chardev `charserial0` at `<private>/<uid>/virt-serial0` (QEMU listens), logging to
//! `virt-serial0-log` when the serial console log is on (VMI `logSerialConsole`, else the
//! cluster default), and `isa-serial` `serial0` (ttyS0).
//!
//! Reads: `ctx.paths.private_dir`, `ctx.cluster.serial_console_log`.

use super::super::context::ConverterContext;
use super::super::error::ConvertError;
use super::super::plan::{Backend, DeviceClass, DomainPlan, Placement};
use super::super::qemu::{ChardevSocket, Device, DeviceIsaSerial, SocketAddr};
use super::{planned, vmi_uid};
use crate::vmi::Vmi;

/// Adds the serial console.
pub struct ConsoleConfigurator;

impl super::super::convert::Configurator for ConsoleConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let devs = &vmi.spec.domain.devices;
        if devs.autoattach_serial_console == Some(false) {
            return Ok(());
        }
        let dir = format!("{}/{}", ctx.paths.private_dir, vmi_uid(vmi)?);
        let log = devs
            .log_serial_console
            .unwrap_or(ctx.cluster.serial_console_log);
        let chardev = ChardevSocket {
            id: "charserial0".into(),
            addr: SocketAddr::Path(format!("{dir}/virt-serial0")),
            server: true,
            logfile: log.then(|| format!("{dir}/virt-serial0-log")),
        };
        plan.devices.push(planned(
            DeviceClass::Serial,
            None,
            Backend::Chardev(chardev),
            Device::IsaSerial(DeviceIsaSerial {
                driver: "isa-serial",
                chardev: "charserial0".into(),
                id: "serial0".into(),
                index: 0,
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
    fn console_table() {
        let dir = "/var/run/kubevirt-private/uid1";
        let no_log = ConverterContext {
            cluster: crate::cmdline::context::ClusterFlags {
                serial_console_log: false,
                ..Default::default()
            },
            ..Default::default()
        };
        // (devices fragment, context) -> the serial chardev's (socket, log file)
        let cases = [
            (
                json!({}),
                ConverterContext::default(),
                Some((
                    format!("{dir}/virt-serial0"),
                    Some(format!("{dir}/virt-serial0-log")),
                )),
            ),
            (
                json!({}),
                no_log.clone(),
                Some((format!("{dir}/virt-serial0"), None)),
            ),
            (
                json!({"logSerialConsole": true}),
                no_log,
                Some((
                    format!("{dir}/virt-serial0"),
                    Some(format!("{dir}/virt-serial0-log")),
                )),
            ),
            (
                json!({"logSerialConsole": false}),
                ConverterContext::default(),
                Some((format!("{dir}/virt-serial0"), None)),
            ),
            (
                json!({"autoattachSerialConsole": false}),
                ConverterContext::default(),
                None,
            ),
        ];
        for (devices, ctx, want) in cases {
            let plan =
                configure(&ConsoleConfigurator, json!({ "devices": devices }), &ctx).unwrap();
            let got = plan.devices.first().map(|d| match (&d.backend, &d.device) {
                (Backend::Chardev(c), Device::IsaSerial(s)) => {
                    assert_eq!(
                        (c.id.as_str(), s.chardev.as_str(), s.id.as_str()),
                        ("charserial0", "charserial0", "serial0")
                    );
                    let SocketAddr::Path(p) = &c.addr else {
                        panic!("serial on a non-path socket")
                    };
                    (p.clone(), c.logfile.clone())
                }
                other => panic!("not a serial console: {other:?}"),
            });
            assert_eq!(got, want, "{devices}");
        }
    }
}
