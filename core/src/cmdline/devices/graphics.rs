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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::testutil::{configure, error_path};
    use serde_json::json;

    #[test]
    fn graphics_table() {
        let no_bochs = ConverterContext {
            cluster: crate::cmdline::context::ClusterFlags {
                bochs_for_efi: false,
                ..Default::default()
            },
            ..Default::default()
        };
        let efi = json!({"firmware": {"bootloader": {"efi": {}}}});
        // (domain fragment, context) -> (driver, vgamem_mb, vgamem, max_outputs)
        let cases = [
            (
                json!({}),
                ConverterContext::default(),
                ("VGA", Some(16), None, None),
            ),
            (
                efi.clone(),
                ConverterContext::default(),
                ("bochs-display", None, Some(16 << 20), None),
            ),
            (efi, no_bochs, ("VGA", Some(16), None, None)),
            (
                json!({"devices": {"video": {"type": "virtio"}}}),
                ConverterContext::default(),
                ("virtio-vga", None, None, Some(1)),
            ),
        ];
        for (domain, ctx, (driver, mb, bytes, outputs)) in cases {
            let plan = configure(&GraphicsConfigurator, domain.clone(), &ctx).unwrap();
            assert_eq!(
                plan.vnc.as_deref(),
                Some("/var/run/kubevirt-private/uid1/virt-vnc")
            );
            assert!(plan.audiodev);
            let [d] = &plan.devices[..] else {
                panic!("{domain}: one video device, got {:?}", plan.devices)
            };
            assert_eq!(
                (d.class, d.placement),
                (DeviceClass::Video, Placement::RootComplex(1))
            );
            let Device::Video(v) = &d.device else {
                panic!("{domain}: not a video device")
            };
            assert_eq!(
                (v.driver, v.vgamem_mb, v.vgamem, v.max_outputs),
                (driver, mb, bytes, outputs),
                "{domain}"
            );
            assert_eq!(v.id, "video0");
        }
    }

    #[test]
    fn no_autoattach_means_no_graphics_and_unknown_video_is_rejected() {
        let plan = configure(
            &GraphicsConfigurator,
            json!({"devices": {"autoattachGraphicsDevice": false}}),
            &ConverterContext::default(),
        )
        .unwrap();
        assert_eq!(plan, DomainPlan::default());
        assert_eq!(
            error_path(configure(
                &GraphicsConfigurator,
                json!({"devices": {"video": {"type": "cirrus"}}}),
                &ConverterContext::default()
            )),
            "spec.domain.devices.video.type"
        );
    }
}
