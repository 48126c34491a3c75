//! The launch-security pass: for SEV and SEV-SNP guests (`plan.launch_security` is a
//! `sev-guest` or `sev-snp-guest`), every virtio PCI device KubeVirt marks `iommu="on"` (virtio
//! disks, NICs, the virtio-scsi and virtio-serial controllers, balloon, rng) gets
//! `iommu_platform=on`, so the guest's bounce buffers in shared memory work, and NICs lose their
//! option ROM (`romfile=""`, KubeVirt's `<rom enabled="no"/>` under launch security). TDX and
//! plain guests are left alone (KubeVirt sets `iommu` for SEV and s390x PV only).
//!
//! Reads `launch_security`, `devices[].device`; writes `devices[].iommu_platform` and NIC
//! `romfile`.

use crate::cmdline::plan::DomainPlan;
use crate::cmdline::qemu::Device;

/// Runs the pass.
pub fn apply(plan: &mut DomainPlan) {
    let sev = plan
        .launch_security
        .as_ref()
        .is_some_and(|o| o.qom_type.starts_with("sev"));
    if !sev {
        return;
    }
    for d in plan.devices.iter_mut() {
        let virtio = match &d.device {
            Device::VirtioBlk(_)
            | Device::VirtioScsi(_)
            | Device::VirtioBalloon(_)
            | Device::VirtioRng(_) => true,
            Device::Nic(n) => n.driver.starts_with("virtio-net"),
            Device::Simple(s) => s.driver.starts_with("virtio-serial"),
            _ => false,
        };
        d.iommu_platform = virtio;
        if let Device::Nic(n) = &mut d.device {
            n.romfile = Some(String::new());
        }
    }
}
