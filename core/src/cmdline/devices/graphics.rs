//! Graphics (`converter/compute/graphics.go`): unless `autoattachGraphicsDevice: false`, VNC on
//! the unix socket `<private>/<uid>/virt-vnc` (with an `-audiodev none`, as libvirt), and a video
//! adapter: the user's `video.type` (`vga`, `bochs`, `virtio`), else `bochs-display` for EFI
//! guests when the cluster says so, else `VGA` with 16 MiB (KubeVirt's vram 16384 KiB). As
//! libvirt renders KubeVirt's `<model heads="1">`: the primary video sits at `pcie.0` slot 1
//! (libvirt reserves 00:01.0 for it on q35), and `virtio` becomes the VGA-compatible
//! `virtio-vga` (libvirt's choice for a primary virtio video) with `max_outputs=1`.
//!
//! Reads: `ctx.paths.private_dir`, `ctx.cluster.bochs_for_efi`.

use super::super::context::ConverterContext;
use super::super::error::{ConvertError, FieldPath};
use super::super::plan::{Backend, DeviceClass, DomainPlan, Placement};
use super::super::qemu::{Device, DeviceVideo};
use super::{planned, vmi_uid};
use crate::vmi::Vmi;

/// Adds VNC and the video adapter.
pub struct GraphicsConfigurator;

impl super::super::convert::Configurator for GraphicsConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let devs = &vmi.spec.domain.devices;
        if devs.autoattach_graphics_device == Some(false) {
            return Ok(());
        }
        plan.vnc = Some(format!(
            "{}/{}/virt-vnc",
            ctx.paths.private_dir,
            vmi_uid(vmi)?
        ));
        plan.audiodev = true;
        let efi = vmi
            .spec
            .domain
            .firmware
            .as_ref()
            .and_then(|f| f.bootloader.as_ref())
            .is_some_and(|b| b.efi.is_some());
        let kind = match devs.video.as_ref().and_then(|v| v.r#type.as_deref()) {
            Some(t) => t.to_string(),
            None if efi && ctx.cluster.bochs_for_efi => "bochs".into(),
            None => "vga".into(),
        };
        let (driver, vgamem_mb, vgamem, max_outputs) = match kind.as_str() {
            "vga" => ("VGA", Some(16), None, None),
            "bochs" => ("bochs-display", None, Some(16 * 1024 * 1024), None),
            "virtio" => ("virtio-vga", None, None, Some(1)),
            o => {
                return Err(ConvertError::unsupported(
                    FieldPath::new("spec.domain.devices.video.type"),
                    format!("video type {o:?}"),
                ))
            }
        };
        plan.devices.push(planned(
            DeviceClass::Video,
            None,
            Backend::None,
            Device::Video(DeviceVideo {
                driver,
                id: "video0".into(),
                vgamem_mb,
                vgamem,
                max_outputs,
            }),
            Placement::RootComplex(1),
        ));
        Ok(())
    }
}
