//! virtiofs filesystems (`converter/storage/virtiofs.go`): each `devices.filesystems[]` entry
//! (backed by the volume of the same name, served by a virtiofsd container) becomes what libvirt
//! renders for KubeVirt's `<filesystem type="mount"><driver type="virtiofs" queue="1024"/>
//! <source socket="/var/run/kubevirt/virtiofs-containers/<name>.sock"/><target dir="<name>"/>`:
//! a client socket chardev `chr-vu-fs<N>` and a `vhost-user-fs-pci` `fs<N>` with
//! `queue-size=1024` and the name as mount tag, on its own root port. vhost-user needs shared
//! guest memory: the memory configurator switches to a shared memfd backend with a NUMA cell
//! (KubeVirt's `<access mode="shared"/>` + memfd rule).
//!
//! Whether virtiofsd's socket exists is a context fact (`ctx.virtiofs_ready`); a missing one is
//! listed in `plan.hardware`, so the launcher reports it before QEMU fails to connect.
//!
//! Reads: `ctx.paths.virtiofs`, `ctx.virtiofs_ready`.

use super::super::context::ConverterContext;
use super::super::error::ConvertError;
use super::super::names::check_name;
use super::super::plan::{Backend, DeviceClass, DomainPlan, HardwareNeed, Placement};
use super::super::qemu::{ChardevSocket, Device, DeviceVhostUserFs, SocketAddr};
use super::{devices_path, planned};
use crate::vmi::Vmi;

/// Adds one `vhost-user-fs-pci` per virtiofs filesystem.
pub struct FilesystemsConfigurator;

/// QEMU's limit on a virtiofs mount tag (`vhost-user-fs`: "tag may not be longer than 36").
const MAX_TAG: usize = 36;

/// True when the VMI has virtiofs filesystems (they need shared guest memory).
pub fn has_virtiofs(vmi: &Vmi) -> bool {
    vmi.spec
        .domain
        .devices
        .filesystems
        .as_ref()
        .is_some_and(|f| !f.is_empty())
}

impl super::super::convert::Configurator for FilesystemsConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let volumes = vmi.spec.volumes.as_deref().unwrap_or_default();
        let fss = vmi
            .spec
            .domain
            .devices
            .filesystems
            .as_deref()
            .unwrap_or_default();
        for (i, fs) in fss.iter().enumerate() {
            let p = devices_path().key("filesystems").index(i);
            check_name(&p.key("name"), &fs.name)?;
            if fs.name.len() > MAX_TAG {
                return Err(ConvertError::invalid(
                    p.key("name"),
                    format!("a virtiofs mount tag is at most {MAX_TAG} characters"),
                ));
            }
            if fs.virtiofs.is_none() {
                return Err(ConvertError::missing(
                    p.key("virtiofs"),
                    "the filesystem type (virtiofs)",
                ));
            }
            if !volumes.iter().any(|v| v.name == fs.name) {
                return Err(ConvertError::missing(
                    p.key("name"),
                    format!("no volume named {:?}", fs.name),
                ));
            }
            if fss[..i].iter().any(|o| o.name == fs.name) {
                return Err(ConvertError::invalid(
                    p.key("name"),
                    "duplicate filesystem name",
                ));
            }
            let id = format!("fs{i}");
            let socket = format!("{}/{}.sock", ctx.paths.virtiofs, fs.name);
            plan.hardware.push(HardwareNeed {
                path: p.clone(),
                id: id.clone(),
                what: format!("the virtiofsd socket {socket}"),
                missing: (!ctx.virtiofs_ready.contains(&fs.name))
                    .then(|| "the virtiofs container has not created it".to_string()),
            });
            let chardev = ChardevSocket {
                id: format!("chr-vu-{id}"),
                addr: SocketAddr::Path(socket),
                server: false,
                logfile: None,
            };
            plan.devices.push(planned(
                DeviceClass::Filesystem,
                Some(&fs.name),
                Backend::Chardev(chardev.clone()),
                Device::VhostUserFs(DeviceVhostUserFs {
                    driver: "vhost-user-fs-pci",
                    id,
                    chardev: chardev.id,
                    queue_size: 1024,
                    tag: fs.name.clone(),
                }),
                Placement::RootPort,
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::convert;
    use crate::cmdline::plan::MissingHardware;
    use crate::cmdline::FieldPath;
    use serde_json::json;

    fn vmi(name: &str) -> Vmi {
        serde_json::from_value(json!({
            "metadata": {"name": "t", "namespace": "ns", "uid": "uid1"},
            "spec": {
                "domain": {"devices": {"filesystems": [{"name": name, "virtiofs": {}}]},
                    "memory": {"guest": "256Mi"}},
                "volumes": [{"name": name, "persistentVolumeClaim": {"claimName": "c"}}]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_missing_virtiofsd_socket_is_reported_with_the_filesystem_path() {
        let plan = convert(&vmi("share"), &ConverterContext::default()).unwrap();
        assert_eq!(
            plan.missing_hardware(),
            vec![MissingHardware {
                path: FieldPath::new("spec.domain.devices.filesystems[0]"),
                id: "fs0".into(),
                reason: "the virtiofsd socket /var/run/kubevirt/virtiofs-containers/share.sock: \
                         the virtiofs container has not created it"
                    .into(),
            }]
        );
        let mut ctx = ConverterContext::default();
        ctx.virtiofs_ready.insert("share".into());
        let plan = convert(&vmi("share"), &ctx).unwrap();
        assert_eq!(plan.missing_hardware(), vec![]);
        // vhost-user needs the guest RAM shared.
        let backend = plan.memory.backend.as_ref().unwrap();
        assert_eq!(
            (backend.qom_type, backend.share),
            ("memory-backend-memfd", Some(true))
        );
    }

    #[test]
    fn a_tag_longer_than_qemu_accepts_is_rejected() {
        let e = convert(&vmi(&"a".repeat(37)), &ConverterContext::default()).unwrap_err();
        assert_eq!(e.path().as_str(), "spec.domain.devices.filesystems[0].name");
    }
}
