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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::testutil::{configure, drivers};
    use serde_json::json;

    #[test]
    fn balloon_table() {
        let quiet = ConverterContext {
            cluster: crate::cmdline::context::ClusterFlags {
                free_page_reporting: false,
                balloon_stats_period: 0,
                ..Default::default()
            },
            ..Default::default()
        };
        // (domain fragment, context) -> (driver, free page reporting, stats period)
        let cases = [
            (
                json!({}),
                ConverterContext::default(),
                Some(("virtio-balloon-pci-non-transitional", Some(true))),
                Some(10),
            ),
            (
                json!({}),
                quiet,
                Some(("virtio-balloon-pci-non-transitional", Some(false))),
                None,
            ),
            (
                json!({"cpu": {"dedicatedCpuPlacement": true}}),
                ConverterContext::default(),
                Some(("virtio-balloon-pci-non-transitional", Some(false))),
                Some(10),
            ),
            (
                json!({"devices": {"useVirtioTransitional": true}}),
                ConverterContext::default(),
                Some(("virtio-balloon-pci-transitional", Some(true))),
                Some(10),
            ),
            (
                json!({"devices": {"autoattachMemBalloon": false}}),
                ConverterContext::default(),
                None,
                None,
            ),
        ];
        for (domain, ctx, want, period) in cases {
            let plan = configure(&BalloonConfigurator, domain.clone(), &ctx).unwrap();
            let got = plan.devices.first().map(|d| match &d.device {
                Device::VirtioBalloon(b) => (b.driver, b.free_page_reporting),
                other => panic!("not a balloon: {other:?}"),
            });
            assert_eq!(got, want, "{domain}");
            assert_eq!(plan.balloon_stats_period, period, "{domain}");
            if want.is_some() {
                assert_eq!(drivers(&plan)[0].1, "balloon0");
            }
        }
    }
}
