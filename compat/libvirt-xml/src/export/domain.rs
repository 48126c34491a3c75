//! Memory backing, `<os>` (firmware, boot, kernel), `<sysinfo>` (SMBIOS) and `<clock>`.

use super::*;

pub(super) fn memory_backing(plan: &DomainPlan) -> Option<MemoryBacking> {
    let b = plan.memory.backend.as_ref()?;
    let mb = MemoryBacking {
        hugepages: (b.hugetlb == Some(true)).then(Empty::default),
        source: (b.qom_type == "memory-backend-memfd").then(|| TypeAttr {
            type_: "memfd".into(),
        }),
        access: (b.share == Some(true)).then(|| ModeAttr {
            mode: "shared".into(),
        }),
    };
    (mb != MemoryBacking::default()).then_some(mb)
}

pub(super) fn os(vmi: &Vmi, plan: &DomainPlan) -> Os {
    let (loader, nvram) = match &plan.firmware {
        // ROM firmware only comes with SEV-SNP/TDX, which the export refuses earlier.
        FirmwarePlan::Bios | FirmwarePlan::Rom(_) => (None, None),
        FirmwarePlan::Efi {
            blockdevs,
            secure,
            vars_template,
            vars,
        } => {
            let code = blockdevs
                .iter()
                .find_map(|b| match b {
                    Blockdev::Protocol(p) if p.node_name.contains("pflash0") => {
                        Some(p.filename.clone())
                    }
                    _ => None,
                })
                .unwrap_or_default();
            (
                Some(Loader {
                    readonly: "yes".into(),
                    secure: yes_no(*secure),
                    type_: "pflash".into(),
                    path: code,
                }),
                Some(Nvram {
                    template: vars_template.clone(),
                    path: vars.clone(),
                }),
            )
        }
    };
    let use_serial = vmi
        .spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.bootloader.as_ref())
        .and_then(|b| b.bios.as_ref())
        .and_then(|b| b.use_serial)
        == Some(true);
    let kb = plan.kernel_boot.clone().unwrap_or_default();
    Os {
        type_: OsType {
            arch: "x86_64".into(),
            machine: plan.machine.machine_type.clone(),
            value: "hvm".into(),
        },
        loader,
        nvram,
        bootmenu: plan.boot_menu.then(|| BootMenu {
            enable: "yes".into(),
            timeout: 10000,
        }),
        smbios: Some(ModeAttr {
            mode: "sysinfo".into(),
        }),
        bios: use_serial.then(|| Bios {
            useserial: "yes".into(),
        }),
        kernel: kb.kernel,
        initrd: kb.initrd,
        cmdline: kb.append,
    }
}

pub(super) fn sysinfo(plan: &DomainPlan) -> SysInfo {
    let table = |t: u8| plan.smbios.iter().find(|s| s.table == t);
    let field = |t: u8, k: &str| {
        table(t)
            .and_then(|s| s.fields.iter().find(|(n, _)| *n == k))
            .map(|(_, v)| v.clone())
    };
    // KubeVirt's order: uuid, serial (if set), manufacturer, family, product, sku, version.
    let mut system = vec![Entry {
        name: "uuid".into(),
        value: plan.uuid.clone(),
    }];
    if let Some(serial) = field(1, "serial") {
        system.push(Entry {
            name: "serial".into(),
            value: serial,
        });
    }
    for k in ["manufacturer", "family", "product", "sku", "version"] {
        system.push(Entry {
            name: k.into(),
            value: field(1, k).unwrap_or_default(),
        });
    }
    let entries = |t: u8| {
        table(t).map(|s| Entries {
            entry: s
                .fields
                .iter()
                .filter(|(k, _)| *k != "type")
                .map(|(k, v)| Entry {
                    name: (*k).into(),
                    value: v.clone(),
                })
                .collect(),
        })
    };
    let oem: Vec<String> = table(11)
        .map(|s| s.fields.iter().map(|(_, v)| v.clone()).collect())
        .unwrap_or_default();
    SysInfo {
        type_: "smbios".into(),
        system: Entries { entry: system },
        // KubeVirt also writes empty <bios/>, <baseBoard/> and <chassis/>, which libvirt's schema
        // rejects (and libvirt ignores); they are left out so the export validates (the hook
        // input adds them back: `crate::hooks::kubevirt_exact`).
        bios: entries(0).filter(|c| !c.entry.is_empty()),
        base_board: entries(2).filter(|c| !c.entry.is_empty()),
        chassis: entries(3).filter(|c| !c.entry.is_empty()),
        oem_strings: (!oem.is_empty()).then_some(OemStrings { entry: oem }),
    }
}

/// `<clock>` from the plan's clock (KubeVirt's `convert_v1_Clock_To_api_Clock` form: `utc` with
/// an `adjustment` of seconds or `reset`, or `timezone`; the timers with `present`), so a hook's
/// clock edits ([`crate::hooks::ClockEdit`]) show; none when KubeVirt writes none.
pub(super) fn clock(plan: &DomainPlan) -> Option<Clock> {
    use qlauncher_core::cmdline::plan::ClockOffset;
    let c = &plan.clock;
    if !c.listed {
        return None;
    }
    let timer = c
        .timers
        .iter()
        .map(|t| Timer {
            name: t.name.name().into(),
            tickpolicy: t.tick_policy.map(|p| p.name().into()),
            present: t.present.map(yes_no),
            track: t.track.map(|k| k.name().into()),
        })
        .collect();
    let (offset, adjustment, timezone) = match &c.offset {
        ClockOffset::Timezone(tz) => ("timezone", None, Some(tz.clone())),
        ClockOffset::Utc { adjustment } => (
            "utc",
            Some(
                adjustment
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "reset".into()),
            ),
            None,
        ),
        ClockOffset::Localtime => ("localtime", None, None),
    };
    Some(Clock {
        offset: offset.into(),
        adjustment,
        basis: None,
        timezone,
        timer,
    })
}
