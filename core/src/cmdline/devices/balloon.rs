//! Memory balloon (`converter/compute/balloon.go`): always, unless `autoattachMemBalloon: false`;
//! `virtio-balloon-pci-non-transitional` `balloon0`, free page reporting unless the cluster
//! disables it, the VMI is high-performance (dedicated CPUs, realtime, hugepages) or annotated
//! `kubevirt.io/free-page-reporting-disabled: "true"`; the stats period is set over QMP after
//! start (libvirt's `qom-set guest-stats-polling-interval`).
//!
//! Reads: `ctx.cluster.free_page_reporting`, `ctx.cluster.balloon_stats_period`.

use super::super::context::ConverterContext;
use super::super::error::ConvertError;
use super::super::plan::{Backend, DeviceClass, DomainPlan, Placement};
use super::super::qemu::{Device, DeviceVirtioBalloon};
use super::{annotation, planned, virtio_driver};
use crate::vmi::Vmi;

/// Adds the balloon.
pub struct BalloonConfigurator;

impl super::super::convert::Configurator for BalloonConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        if vmi.spec.domain.devices.autoattach_mem_balloon == Some(false) {
            return Ok(());
        }
        let d = &vmi.spec.domain;
        let cpu = d.cpu.clone().unwrap_or_default();
        let high_perf = cpu.dedicated_cpu_placement == Some(true)
            || cpu.realtime.is_some()
            || d.memory.as_ref().is_some_and(|m| m.hugepages.is_some());
        let fpr = ctx.cluster.free_page_reporting
            && !high_perf
            && annotation(vmi, "kubevirt.io/free-page-reporting-disabled") != Some("true");
        plan.devices.push(planned(
            DeviceClass::Balloon,
            None,
            Backend::None,
            Device::VirtioBalloon(DeviceVirtioBalloon {
                driver: virtio_driver(
                    vmi,
                    "virtio-balloon-pci-non-transitional",
                    "virtio-balloon-pci-transitional",
                ),
                id: "balloon0".into(),
                free_page_reporting: Some(fpr),
            }),
            Placement::RootPort,
        ));
        plan.balloon_stats_period =
            (ctx.cluster.balloon_stats_period > 0).then_some(ctx.cluster.balloon_stats_period);
        Ok(())
    }
}
