//! vsock (`converter/compute/vsock.go`): when `status.VSOCKCID` is set,
//! `vhost-vsock-pci-non-transitional` `vsock0` with that guest CID (always non-transitional) and
//! the pre-opened `/dev/vhost-vsock` fd when the context has one.
//!
//! Reads: `ctx.vsock_fd`.

use super::super::context::ConverterContext;
use super::super::error::{ConvertError, FieldPath};
use super::super::plan::{Backend, DeviceClass, DomainPlan, Placement};
use super::super::qemu::{Device, DeviceVhostVsock};
use super::planned;
use crate::vmi::Vmi;

/// Adds the vsock device.
pub struct VsockConfigurator;

impl super::super::convert::Configurator for VsockConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let Some(cid) = vmi.status.as_ref().and_then(|s| s.vsock_cid) else {
            return Ok(());
        };
        if cid < 3 {
            return Err(ConvertError::invalid(
                FieldPath::new("status.VSOCKCID"),
                "guest CIDs start at 3",
            ));
        }
        plan.devices.push(planned(
            DeviceClass::Vsock,
            None,
            Backend::None,
            Device::VhostVsock(DeviceVhostVsock {
                driver: "vhost-vsock-pci-non-transitional",
                id: "vsock0".into(),
                guest_cid: cid,
                vhostfd: ctx.vsock_fd.map(|f| f.to_string()),
            }),
            Placement::RootPort,
        ));
        Ok(())
    }
}
