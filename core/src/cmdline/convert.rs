//! The ordered configurator list and `convert()`.
//!
//! Order (KubeVirt's `converter.go:993-1060`, regrouped): metadata (with the QMP monitor),
//! machine, CPU, memory, launch security, firmware, SMBIOS, clock, IOThreads, controllers, disks,
//! filesystems, interfaces, console, channels, inputs, graphics, sound, watchdog, host devices,
//! balloon, rng, TPM, vsock, then `unsupported` (the fields qlauncher rejects, each with its
//! path). Configurators read the VMI and the context
//! only; where two need the same derived value (vCPU count, IOThread assignment, accelerator)
//! they call the same pure helper in `devices/`, so the order matters only for the device order
//! inside a class. Then the launch-security pass (`passes/launch_security.rs`) puts virtio
//! devices behind the IOMMU for SEV guests, and the PCI pass (`passes/pci.rs`) orders and
//! addresses devices.

use super::devices;
use super::passes;
use super::{ConvertError, ConverterContext, DomainPlan};
use crate::vmi::Vmi;

/// A device family's converter: adds what the VMI asks for to the plan.
pub trait Configurator: Sync {
    /// Adds this family's parts to `plan`. Errors name the VMI field.
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError>;
}

/// Every configurator, in order.
pub static CONFIGURATORS: &[&dyn Configurator] = &[
    &devices::metadata::MetadataConfigurator,
    &devices::machine::MachineConfigurator,
    &devices::cpu::CpuConfigurator,
    &devices::memory::MemoryConfigurator,
    &devices::launch_security::LaunchSecurityConfigurator,
    &devices::firmware::FirmwareConfigurator,
    &devices::sysinfo::SysInfoConfigurator,
    &devices::clock::ClockConfigurator,
    &devices::iothreads::IoThreadsConfigurator,
    &devices::controllers::ControllersConfigurator,
    &devices::disks::DisksConfigurator,
    &devices::filesystems::FilesystemsConfigurator,
    &devices::interfaces::InterfacesConfigurator,
    &devices::console::ConsoleConfigurator,
    &devices::channels::ChannelsConfigurator,
    &devices::inputs::InputsConfigurator,
    &devices::graphics::GraphicsConfigurator,
    &devices::sound::SoundConfigurator,
    &devices::watchdog::WatchdogConfigurator,
    &devices::hostdevs::HostDevicesConfigurator,
    &devices::balloon::BalloonConfigurator,
    &devices::rng::RngConfigurator,
    &devices::tpm::TpmConfigurator,
    &devices::vsock::VsockConfigurator,
    &devices::unsupported::UnsupportedConfigurator,
];

/// Converts a (defaulted) VMI into a `DomainPlan`: runs every configurator (first error wins),
/// then the PCI pass. Pure: the same input gives the same plan.
pub fn convert(vmi: &Vmi, ctx: &ConverterContext) -> Result<DomainPlan, ConvertError> {
    let mut plan = DomainPlan {
        qemu: ctx.qemu,
        ..Default::default()
    };
    for c in CONFIGURATORS {
        c.configure(vmi, ctx, &mut plan)?;
    }
    passes::launch_security::apply(&mut plan);
    passes::pci::assign(&mut plan)?;
    Ok(plan)
}
