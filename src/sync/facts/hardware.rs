//! Host hardware facts: VFIO devices the device plugins assigned and virtiofsd sockets.

use std::collections::BTreeMap;
use std::path::Path;

use crate::cmdline::ConverterContext;
use crate::vmi::Vmi;

/// Host hardware facts: VFIO devices from the device plugins' `PCI_RESOURCE_*` variables, and
/// the virtiofsd sockets that exist. SEV and TDX are not probed (yet), so such VMIs are refused.
pub(crate) fn add_hardware_facts(vmi: &Vmi, ctx: &mut ConverterContext) {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    ctx.host_devices = crate::cmdline::context::host_devices_from_env(vmi, &env);
    for fs in vmi
        .spec
        .domain
        .devices
        .filesystems
        .as_deref()
        .unwrap_or_default()
    {
        if Path::new(&ctx.paths.virtiofs)
            .join(format!("{}.sock", fs.name))
            .exists()
        {
            ctx.virtiofs_ready.insert(fs.name.clone());
        }
    }
}
