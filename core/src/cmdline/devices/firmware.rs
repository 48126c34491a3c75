//! Firmware (`converter/compute/os.go`, `efi/efi.go`, `manager.go:1208-1245`):
//! SeaBIOS by default (`useSerial` -> `-machine graphics=off`, libvirt's rendering of
//! `<bios useserial="yes"/>`); EFI as two pflash blockdevs (code read-only, per-VM vars copied
//! from the template by `storage`), secure boot (default when `efi: {}`) adding `smm=on` and
//! `-global driver=cfi.pflash01,property=secure,value=on`; kernel boot from the kernel-boot
//! container (`-kernel`, `-initrd`, `-append`). Confidential guests need EFI and boot their own
//! OVMF builds (KubeVirt's `efi.go`): SEV/SEV-ES the `OVMF_CODE.cc.fd` code (no secure boot),
//! SEV-SNP `OVMF.amdsev.fd` and TDX `OVMF.inteltdx[.secboot].fd` as a stateless ROM (`-bios`,
//! libvirt's `<loader type="rom">`).
//!
//! Reads: `ctx.efi`, `ctx.paths.nvram`, `ctx.paths.container_disks`.

use super::super::context::ConverterContext;
use super::super::error::{ConvertError, FieldPath};
use super::super::names::{check_name_len, check_text};
use super::super::plan::{DomainPlan, FirmwarePlan, GlobalProp, KernelBootPlan};
use super::super::qemu::{
    BackingNode, Blockdev, BlockdevFormat, BlockdevProtocol, FormatDriver, ProtocolDriver,
};
use super::vmi_name;
use crate::vmi::Vmi;

/// Sets `firmware`, `kernel_boot`, EFI machine options and globals.
pub struct FirmwareConfigurator;

/// The file name of a path inside the kernel-boot container image, checked to be a plain name.
fn basename(path: &FieldPath, p: &str) -> Result<String, ConvertError> {
    let base = p.rsplit('/').next().unwrap_or_default();
    check_name_len(path, base, 255)?;
    Ok(base.to_string())
}

impl super::super::convert::Configurator for FirmwareConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let base = FieldPath::new("spec.domain.firmware");
        let fw = vmi.spec.domain.firmware.clone().unwrap_or_default();
        let boot = fw.bootloader.clone().unwrap_or_default();
        if boot.bios.is_some() && boot.efi.is_some() {
            return Err(ConvertError::invalid(
                base.key("bootloader"),
                "bios and efi are mutually exclusive",
            ));
        }
        // Confidential guests boot their own OVMF builds (`efi.go DetectEFIEnvironment`):
        // SEV the `.cc` code with the plain vars template, SEV-SNP and TDX a stateless ROM.
        let ls = vmi.spec.domain.launch_security.as_ref();
        let cc = ls.map(|l| (l.sev.is_some(), l.snp.is_some(), l.tdx.is_some()));
        if let (Some((sev, snp, tdx)), Some(efi)) = (cc, &boot.efi) {
            let secure = efi.secure_boot.unwrap_or(true);
            if secure && (sev || snp) {
                return Err(ConvertError::invalid(
                    base.key("bootloader").key("efi").key("secureBoot"),
                    "SEV and SEV-SNP guests cannot use secure boot",
                ));
            }
            if snp || tdx {
                plan.firmware = FirmwarePlan::Rom(if snp {
                    ctx.efi.snp_rom.clone()
                } else if secure {
                    ctx.efi.tdx_secure_rom.clone()
                } else {
                    ctx.efi.tdx_rom.clone()
                });
                return kernel_boot(&fw, ctx, &base, plan);
            }
        } else if cc.is_some() {
            return Err(ConvertError::invalid(
                base.key("bootloader"),
                "confidential guests (launchSecurity) need an EFI bootloader",
            ));
        }
        if let Some(efi) = &boot.efi {
            let secure = efi.secure_boot.unwrap_or(true);
            let sev = cc.is_some_and(|(sev, _, _)| sev);
            let (code, template) = if secure {
                (&ctx.efi.secure_code, &ctx.efi.secure_vars)
            } else if sev {
                (&ctx.efi.sev_code, &ctx.efi.vars)
            } else {
                (&ctx.efi.code, &ctx.efi.vars)
            };
            let name = vmi_name(vmi)?;
            // `<name>_VARS.fd` is one path component (KubeVirt's and libvirt's name too).
            if name.len() + "_VARS.fd".len() > 255 {
                return Err(ConvertError::invalid(
                    FieldPath::new("metadata.name"),
                    "with an EFI bootloader the NVRAM file <name>_VARS.fd must fit in 255 bytes, so the name may have at most 247 characters",
                ));
            }
            let vars = format!("{}/{}_VARS.fd", ctx.paths.nvram, name);
            let blockdevs = vec![
                Blockdev::Protocol(BlockdevProtocol {
                    driver: ProtocolDriver::File,
                    filename: code.clone(),
                    node_name: "libvirt-pflash0-storage".into(),
                    aio: None,
                    cache: None,
                    auto_read_only: true,
                    discard: Some("unmap"),
                }),
                Blockdev::Format(BlockdevFormat {
                    detect_zeroes: None,
                    node_name: "libvirt-pflash0-format".into(),
                    read_only: true,
                    discard: None,
                    cache: None,
                    driver: FormatDriver::Raw,
                    file: "libvirt-pflash0-storage".into(),
                    data_file: None,
                    backing: BackingNode::Absent,
                }),
                Blockdev::Protocol(BlockdevProtocol {
                    driver: ProtocolDriver::File,
                    filename: vars.clone(),
                    node_name: "libvirt-pflash1-storage".into(),
                    aio: None,
                    cache: None,
                    auto_read_only: true,
                    discard: Some("unmap"),
                }),
            ];
            plan.machine.pflash0 = Some("libvirt-pflash0-format".into());
            plan.machine.pflash1 = Some("libvirt-pflash1-storage".into());
            if secure {
                if plan.machine.smm == Some(false) {
                    return Err(ConvertError::invalid(
                        FieldPath::new("spec.domain.features.smm"),
                        "secure boot needs SMM",
                    ));
                }
                plan.machine.smm = Some(true);
                plan.globals.push(GlobalProp {
                    driver: "cfi.pflash01",
                    property: "secure",
                    value: "on".into(),
                });
            }
            plan.firmware = FirmwarePlan::Efi {
                blockdevs,
                secure,
                vars_template: template.clone(),
                vars,
            };
        } else {
            plan.firmware = FirmwarePlan::Bios;
            plan.machine.graphics_off = boot
                .bios
                .as_ref()
                .and_then(|b| b.use_serial)
                .unwrap_or(false);
        }

        kernel_boot(&fw, ctx, &base, plan)
    }
}

/// Direct kernel boot from the kernel-boot container (`-kernel`, `-initrd`, `-append`).
fn kernel_boot(
    fw: &crate::vmi::Firmware,
    ctx: &ConverterContext,
    base: &FieldPath,
    plan: &mut DomainPlan,
) -> Result<(), ConvertError> {
    {
        if let Some(kb) = &fw.kernel_boot {
            let kp = base.key("kernelBoot");
            let mut plan_kb = KernelBootPlan::default();
            let dir = format!("{}/kernel-boot", ctx.paths.container_disks);
            if let Some(c) = &kb.container {
                let cp = kp.key("container");
                if let Some(k) = c.kernel_path.as_deref() {
                    plan_kb.kernel = Some(format!("{dir}/{}", basename(&cp.key("kernelPath"), k)?));
                }
                if let Some(i) = c.initrd_path.as_deref() {
                    plan_kb.initrd = Some(format!("{dir}/{}", basename(&cp.key("initrdPath"), i)?));
                }
            }
            if let Some(args) = kb.kernel_args.as_deref() {
                let ap = kp.key("kernelArgs");
                check_text(&ap, args, 4096)?;
                if plan_kb.kernel.is_none() {
                    return Err(ConvertError::invalid(
                        ap,
                        "kernel arguments need a kernel (kernelBoot.container.kernelPath)",
                    ));
                }
                plan_kb.append = Some(args.to_string());
            }
            if plan_kb.initrd.is_some() && plan_kb.kernel.is_none() {
                return Err(ConvertError::invalid(
                    kp.key("container").key("kernelPath"),
                    "an initrd needs a kernel",
                ));
            }
            if plan_kb != KernelBootPlan::default() {
                plan.kernel_boot = Some(plan_kb);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::convert::Configurator;
    use crate::cmdline::testutil::{configure, error_path};
    use serde_json::json;

    /// The firmware as (kind, code or ROM, vars template, secure), with the plan's SMM and
    /// pflash machine options.
    fn summary(plan: &DomainPlan) -> (&'static str, String, String, bool) {
        match &plan.firmware {
            FirmwarePlan::Bios => ("bios", String::new(), String::new(), false),
            FirmwarePlan::Rom(r) => ("rom", r.clone(), String::new(), false),
            FirmwarePlan::Efi {
                blockdevs,
                secure,
                vars_template,
                vars,
            } => {
                assert_eq!(
                    vars,
                    "/var/run/kubevirt-private/libvirt/qemu/nvram/t_VARS.fd"
                );
                let Blockdev::Protocol(code) = &blockdevs[0] else {
                    panic!("pflash0 storage first")
                };
                assert_eq!(
                    (
                        plan.machine.pflash0.as_deref(),
                        plan.machine.pflash1.as_deref()
                    ),
                    (
                        Some("libvirt-pflash0-format"),
                        Some("libvirt-pflash1-storage")
                    )
                );
                ("efi", code.filename.clone(), vars_template.clone(), *secure)
            }
        }
    }

    #[test]
    fn firmware_table() {
        let ovmf = |f: &str| format!("/usr/share/OVMF/{f}");
        let s = |v: &str| v.to_string();
        // (domain fragment) -> (kind, code or ROM, vars template, secure, smm, graphics=off)
        let cases = [
            (json!({}), ("bios", s(""), s(""), false, None, false)),
            (
                json!({"firmware": {"bootloader": {"bios": {"useSerial": true}}}}),
                ("bios", s(""), s(""), false, None, true),
            ),
            (
                json!({"firmware": {"bootloader": {"efi": {}}}}),
                (
                    "efi",
                    ovmf("OVMF_CODE.secboot.fd"),
                    ovmf("OVMF_VARS.secboot.fd"),
                    true,
                    Some(true),
                    false,
                ),
            ),
            (
                json!({"firmware": {"bootloader": {"efi": {"secureBoot": false}}}}),
                (
                    "efi",
                    ovmf("OVMF_CODE.fd"),
                    ovmf("OVMF_VARS.fd"),
                    false,
                    None,
                    false,
                ),
            ),
            (
                json!({"firmware": {"bootloader": {"efi": {"secureBoot": false}}}, "launchSecurity": {"sev": {}}}),
                (
                    "efi",
                    ovmf("OVMF_CODE.cc.fd"),
                    ovmf("OVMF_VARS.fd"),
                    false,
                    None,
                    false,
                ),
            ),
            (
                json!({"firmware": {"bootloader": {"efi": {"secureBoot": false}}}, "launchSecurity": {"snp": {}}}),
                ("rom", ovmf("OVMF.amdsev.fd"), s(""), false, None, false),
            ),
            (
                json!({"firmware": {"bootloader": {"efi": {}}}, "launchSecurity": {"tdx": {}}}),
                (
                    "rom",
                    ovmf("OVMF.inteltdx.secboot.fd"),
                    s(""),
                    false,
                    None,
                    false,
                ),
            ),
        ];
        for (domain, (kind, code, template, secure, smm, graphics_off)) in cases {
            let plan = configure(
                &FirmwareConfigurator,
                domain.clone(),
                &ConverterContext::default(),
            )
            .unwrap();
            assert_eq!(summary(&plan), (kind, code, template, secure), "{domain}");
            assert_eq!(plan.machine.smm, smm, "{domain}");
            assert_eq!(plan.machine.graphics_off, graphics_off, "{domain}");
            let secure_global = plan.globals.iter().any(|g| g.driver == "cfi.pflash01");
            assert_eq!(secure_global, secure, "{domain}");
            assert_eq!(plan.kernel_boot, None, "{domain}");
        }
    }

    #[test]
    fn kernel_boot_takes_file_names_from_the_container() {
        let plan = configure(
            &FirmwareConfigurator,
            json!({"firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0", "container": {
                "image": "k", "kernelPath": "/boot/vmlinuz", "initrdPath": "/boot/initrd.img"}}}}),
            &ConverterContext::default(),
        )
        .unwrap();
        let dir = "/var/run/kubevirt/container-disks/kernel-boot";
        assert_eq!(
            plan.kernel_boot,
            Some(KernelBootPlan {
                kernel: Some(format!("{dir}/vmlinuz")),
                initrd: Some(format!("{dir}/initrd.img")),
                append: Some("console=ttyS0".into()),
            })
        );
    }

    #[test]
    fn bad_firmware_names_the_field() {
        let cases = [
            (
                json!({"firmware": {"bootloader": {"bios": {}, "efi": {}}}}),
                "spec.domain.firmware.bootloader",
            ),
            (
                json!({"launchSecurity": {"sev": {}}}),
                "spec.domain.firmware.bootloader",
            ),
            (
                json!({"firmware": {"bootloader": {"efi": {}}}, "launchSecurity": {"sev": {}}}),
                "spec.domain.firmware.bootloader.efi.secureBoot",
            ),
            (
                json!({"firmware": {"bootloader": {"efi": {}}}, "features": {"smm": {"enabled": false}}}),
                "spec.domain.features.smm",
            ),
            (
                json!({"firmware": {"kernelBoot": {"kernelArgs": "x", "container": {"image": "k"}}}}),
                "spec.domain.firmware.kernelBoot.kernelArgs",
            ),
            (
                json!({"firmware": {"kernelBoot": {"container": {"image": "k", "initrdPath": "/i"}}}}),
                "spec.domain.firmware.kernelBoot.container.kernelPath",
            ),
        ];
        for (domain, path) in cases {
            let mut plan = DomainPlan::default();
            // SMM is set by the machine configurator, which runs first.
            if domain.pointer("/features/smm/enabled") == Some(&json!(false)) {
                plan.machine.smm = Some(false);
            }
            let vmi = crate::cmdline::testutil::vmi_with(domain.clone());
            let r = FirmwareConfigurator
                .configure(&vmi, &ConverterContext::default(), &mut plan)
                .map(|_| plan);
            assert_eq!(error_path(r), path, "{domain}");
        }
    }
}
