//! Domain name and UUID (`converter/metadata/configurator.go`, `api/schema.go:1530`):
//! `-name guest=<namespace>_<name>`, `-uuid` = `spec.domain.firmware.uuid`, and the QMP monitor.
//!
//! Reads: `ctx.monitor`.

use super::super::context::{ConverterContext, MonitorSocket};
use super::super::error::{ConvertError, FieldPath};
use super::super::plan::DomainPlan;
use super::super::qemu::{ChardevSocket, SocketAddr};
use super::{vmi_name, vmi_namespace};
use crate::vmi::Vmi;

/// KubeVirt's namespace for VM firmware UUIDs (`pkg/virt-controller/watch/vm/firmware.go`).
const FIRMWARE_UUID_NAMESPACE: uuid::Uuid = uuid::uuid!("6a1a24a1-4061-4607-8bf4-a3963d0c5895");

/// Names the domain, sets its UUID and adds the QMP monitor chardev.
pub struct MetadataConfigurator;

impl super::super::convert::Configurator for MetadataConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let name = vmi_name(vmi)?;
        let ns = vmi_namespace(vmi)?;
        plan.name = format!("{ns}_{name}");
        let path = FieldPath::new("spec.domain.firmware.uuid");
        plan.uuid = match vmi
            .spec
            .domain
            .firmware
            .as_ref()
            .and_then(|f| f.uuid.as_ref())
        {
            Some(u) => uuid::Uuid::parse_str(u)
                .map_err(|e| ConvertError::invalid(path, e.to_string()))?
                .hyphenated()
                .to_string(),
            // virt-controller's rule for VMs: a name-based UUID, so the same VM keeps it.
            None => uuid::Uuid::new_v5(&FIRMWARE_UUID_NAMESPACE, name.as_bytes()).to_string(),
        };
        plan.monitor = Some(ChardevSocket {
            id: "charmonitor".into(),
            addr: match &ctx.monitor {
                MonitorSocket::Fd(fd) => SocketAddr::Fd(*fd),
                MonitorSocket::Path(p) => SocketAddr::Path(p.clone()),
            },
            server: true,
            logfile: None,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::testutil::{configure, error_path};
    use serde_json::json;

    #[test]
    fn metadata_table() {
        let path = ConverterContext {
            monitor: MonitorSocket::Path("/r/qmp.sock".into()),
            ..Default::default()
        };
        let fd = ConverterContext {
            monitor: MonitorSocket::Fd(3),
            ..Default::default()
        };
        let named = uuid::Uuid::new_v5(&FIRMWARE_UUID_NAMESPACE, b"t").to_string();
        // (domain fragment, context) -> (name, uuid, monitor address)
        let cases = [
            (
                json!({}),
                path,
                ("ns_t", named, SocketAddr::Path("/r/qmp.sock".into())),
            ),
            (
                json!({"firmware": {"uuid": "5D307CA9-B3EF-428C-8861-06E72D69F223"}}),
                fd,
                (
                    "ns_t",
                    "5d307ca9-b3ef-428c-8861-06e72d69f223".to_string(),
                    SocketAddr::Fd(3),
                ),
            ),
        ];
        for (domain, ctx, (name, uuid, addr)) in cases {
            let plan = configure(&MetadataConfigurator, domain.clone(), &ctx).unwrap();
            assert_eq!(
                (plan.name.as_str(), plan.uuid.clone()),
                (name, uuid),
                "{domain}"
            );
            let m = plan.monitor.unwrap();
            assert_eq!(
                (m.id.as_str(), m.addr, m.server),
                ("charmonitor", addr, true),
                "{domain}"
            );
        }
        let r = configure(
            &MetadataConfigurator,
            json!({"firmware": {"uuid": "not-a-uuid"}}),
            &ConverterContext::default(),
        );
        assert_eq!(error_path(r), "spec.domain.firmware.uuid");
    }
}
