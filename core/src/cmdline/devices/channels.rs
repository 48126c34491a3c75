//! virtio-serial channels (`converter/compute/channels.go`): the guest agent port
//! `org.qemu.guest_agent.0` (always; chardev `charchannel0` on
//! `<private>/<uid>/org.qemu.guest_agent.0`, where qlauncher's agent client connects), and the
//! downward metrics port `org.github.vhostmd.1` on
//! `<private>/downwardmetrics-channel/downwardmetrics.sock` when `devices.downwardMetrics`.
//!
//! Reads: `ctx.paths.private_dir`.

use super::super::context::ConverterContext;
use super::super::error::ConvertError;
use super::super::plan::{Backend, DeviceClass, DomainPlan, Placement};
use super::super::qemu::{ChardevSocket, Device, DeviceVirtserialport, SocketAddr};
use super::{planned, vmi_uid};
use crate::vmi::Vmi;

/// Adds the guest agent (and downward metrics) channels.
pub struct ChannelsConfigurator;

impl super::super::convert::Configurator for ChannelsConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let private = &ctx.paths.private_dir;
        let mut ports = vec![(
            format!("{private}/{}/org.qemu.guest_agent.0", vmi_uid(vmi)?),
            "org.qemu.guest_agent.0",
        )];
        if vmi.spec.domain.devices.downward_metrics.is_some() {
            ports.push((
                format!("{private}/downwardmetrics-channel/downwardmetrics.sock"),
                "org.github.vhostmd.1",
            ));
        }
        for (n, (path, name)) in ports.into_iter().enumerate() {
            let chardev = format!("charchannel{n}");
            plan.devices.push(planned(
                DeviceClass::Channel,
                None,
                Backend::Chardev(ChardevSocket {
                    id: chardev.clone(),
                    addr: SocketAddr::Path(path),
                    server: true,
                    logfile: None,
                }),
                Device::Virtserialport(DeviceVirtserialport {
                    driver: "virtserialport",
                    bus: "virtio-serial0.0".into(),
                    nr: n as u32 + 1,
                    chardev,
                    id: format!("channel{n}"),
                    name: name.into(),
                }),
                Placement::NonPci,
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::testutil::configure;
    use serde_json::json;

    /// (chardev id, socket path, port name, port number) per channel.
    fn channels(plan: &DomainPlan) -> Vec<(String, String, String, u32)> {
        plan.devices
            .iter()
            .map(|d| match (&d.backend, &d.device) {
                (Backend::Chardev(c), Device::Virtserialport(p)) => {
                    assert_eq!(
                        (d.class, p.bus.as_str()),
                        (DeviceClass::Channel, "virtio-serial0.0")
                    );
                    let SocketAddr::Path(path) = &c.addr else {
                        panic!("channel on a non-path socket")
                    };
                    (c.id.clone(), path.clone(), p.name.clone(), p.nr)
                }
                other => panic!("not a channel: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn channels_table() {
        let agent = |private: &str| {
            (
                "charchannel0".to_string(),
                format!("{private}/uid1/org.qemu.guest_agent.0"),
                "org.qemu.guest_agent.0".to_string(),
                1,
            )
        };
        let mut moved = ConverterContext::default();
        moved.paths.private_dir = "/r/p".into();
        let cases = [
            (
                json!({}),
                ConverterContext::default(),
                vec![agent("/var/run/kubevirt-private")],
            ),
            (json!({}), moved, vec![agent("/r/p")]),
            (
                json!({"devices": {"downwardMetrics": {}}}),
                ConverterContext::default(),
                vec![
                    agent("/var/run/kubevirt-private"),
                    (
                        "charchannel1".to_string(),
                        "/var/run/kubevirt-private/downwardmetrics-channel/downwardmetrics.sock"
                            .to_string(),
                        "org.github.vhostmd.1".to_string(),
                        2,
                    ),
                ],
            ),
        ];
        for (domain, ctx, want) in cases {
            let plan = configure(&ChannelsConfigurator, domain.clone(), &ctx).unwrap();
            assert_eq!(channels(&plan), want, "{domain}");
        }
    }
}
