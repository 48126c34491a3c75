//! SMBIOS (`converter/compute/sysinfo.go`): type 1 with the firmware UUID, serial, and the
//! cluster's manufacturer/family/product/SKU/version; type 3 from `domain.chassis`. Empty values
//! are left out, as libvirt does. Values go through the escaping key=value writer.
//!
//! Reads: `ctx.cluster.smbios_*`. Runs after `MetadataConfigurator` (reads `plan.uuid`).

use super::super::context::ConverterContext;
use super::super::error::{ConvertError, FieldPath};
use super::super::names::check_text;
use super::super::plan::{DomainPlan, SmbiosTable};
use crate::vmi::Vmi;

/// Adds `-smbios` tables.
pub struct SysInfoConfigurator;

fn push(
    fields: &mut Vec<(&'static str, String)>,
    path: &FieldPath,
    key: &'static str,
    v: Option<&str>,
) -> Result<(), ConvertError> {
    if let Some(v) = v.filter(|v| !v.is_empty()) {
        check_text(path, v, 256)?;
        fields.push((key, v.to_string()));
    }
    Ok(())
}

impl super::super::convert::Configurator for SysInfoConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let c = &ctx.cluster;
        let cp = FieldPath::new("cluster.smbios");
        let mut f = Vec::new();
        push(
            &mut f,
            &cp.key("manufacturer"),
            "manufacturer",
            Some(&c.smbios_manufacturer),
        )?;
        push(
            &mut f,
            &cp.key("product"),
            "product",
            Some(&c.smbios_product),
        )?;
        push(
            &mut f,
            &cp.key("version"),
            "version",
            Some(&c.smbios_version),
        )?;
        let serial = vmi
            .spec
            .domain
            .firmware
            .as_ref()
            .and_then(|f| f.serial.as_deref());
        push(
            &mut f,
            &FieldPath::new("spec.domain.firmware.serial"),
            "serial",
            serial,
        )?;
        f.push(("uuid", plan.uuid.clone()));
        push(&mut f, &cp.key("sku"), "sku", Some(&c.smbios_sku))?;
        push(&mut f, &cp.key("family"), "family", Some(&c.smbios_family))?;
        plan.smbios.push(SmbiosTable {
            table: 1,
            fields: f,
        });

        if let Some(ch) = &vmi.spec.domain.chassis {
            let p = FieldPath::new("spec.domain.chassis");
            let mut f = Vec::new();
            push(
                &mut f,
                &p.key("manufacturer"),
                "manufacturer",
                ch.manufacturer.as_deref(),
            )?;
            push(&mut f, &p.key("version"), "version", ch.version.as_deref())?;
            push(&mut f, &p.key("serial"), "serial", ch.serial.as_deref())?;
            push(&mut f, &p.key("asset"), "asset", ch.asset.as_deref())?;
            push(&mut f, &p.key("sku"), "sku", ch.sku.as_deref())?;
            if !f.is_empty() {
                plan.smbios.push(SmbiosTable {
                    table: 3,
                    fields: f,
                });
            }
        }
        Ok(())
    }
}
