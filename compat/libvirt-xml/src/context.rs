//! The pod facts a VMI is converted with for export and comparison: the launch path's placeholder
//! facts (QMP on inherited fd 3, taps on fds 10, 11, ..., MTU 1500), adjusted by a
//! `NAME.facts.json` beside the manifest (the format of [`FactsFile`], the converter's fixtures'),
//! plus a placeholder MAC for every interface that has none.

use qlauncher_core::cmdline::context::{ConverterContext, QemuVersion, TapSource};
use qlauncher_core::cmdline::FactsFile;
use qlauncher_core::vmi::{DefaultsConfig, Vmi};

/// Builds the context for `vmi` from `facts` ([`FactsFile::context`]); `qemu` overrides the
/// facts' QEMU version. An interface with no MAC in the VMI or the facts gets
/// `02:00:00:00:00:NN`, NN the number of tap queues up to and including it: at launch the pod
/// interface's MAC is always known (KubeVirt's network phase 2 writes it into the domain), and
/// the XML carries one.
pub fn context(vmi: &Vmi, facts: &FactsFile, qemu: Option<QemuVersion>) -> ConverterContext {
    let mut ctx = facts.context(vmi);
    if let Some(v) = qemu {
        ctx.qemu = v;
    }
    for iface in vmi
        .spec
        .domain
        .devices
        .interfaces
        .as_deref()
        .unwrap_or_default()
    {
        let Some(f) = ctx.interfaces.get_mut(&iface.name) else {
            continue;
        };
        if f.mac.is_some() || iface.mac_address.is_some() {
            continue;
        }
        if let TapSource::Fds { fds, .. } = &f.tap {
            let queues_so_far = fds.last().map_or(0, |last| last + 1 - 10);
            f.mac = Some(format!("02:00:00:00:00:{:02x}", queues_so_far % 256));
        }
    }
    ctx
}

/// Applies what virt-api's webhook does before the converter sees a VMI: KubeVirt's defaults
/// (`qlauncher_core::vmi::defaults`), with [`DefaultsConfig::for_manifest`]: a VMI without a
/// firmware UUID gets the one KubeVirt derives for a VM named `vm_name` (stable output), as the
/// converter's fixture tests do.
pub fn apply_webhook_defaults(vmi: &mut Vmi, vm_name: &str) {
    let cfg = DefaultsConfig::for_manifest(vmi, vm_name);
    vmi.apply_defaults(&cfg);
}
