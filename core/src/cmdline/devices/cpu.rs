//! CPU model, features and topology (`converter/compute/cpu.go`, `vcpu/vcpu.go`,
//! `hypervisor_features.go`).
//!
//! * `host-model` and `host-passthrough` become `-cpu host,migratable=on` under KVM (libvirt
//!   expands host-model to a named model from its capability probe; QEMU's `host` with
//!   `migratable=on` is the probe-free equivalent) and `-cpu max` under TCG.
//! * A named model is passed through, with `mpx=off` on amd64 unless the user listed `mpx`.
//! * Features: `require`/`force`/`optional` -> `on`, `disable`/`forbid` -> `off`.
//! * Hyper-V enlightenments become `hv-*` flags, `features.kvm.hidden` `kvm=off`,
//!   `pvspinlock` `kvm-pv-unhalt`, timers `kvmclock`/`hv-time`.
//! * CPU hotplug (`maxSockets`): `-smp <boot vCPUs>,maxcpus=<maxSockets*cores*threads>`.
//!
//! Reads: `ctx.kvm`, `ctx.allow_emulation`.

use super::super::context::ConverterContext;
use super::super::error::{ConvertError, FieldPath};
use super::super::names::check_token;
use super::super::plan::{Accel, CpuFlag, CpuPlan, DomainPlan, SmpPlan};
use super::{accel, topology};
use crate::vmi::{FeatureState, Vmi};

/// Sets `cpu` and `smp`.
pub struct CpuConfigurator;

fn flag(name: &str, on: bool) -> CpuFlag {
    CpuFlag {
        name: name.into(),
        value: if on { "on" } else { "off" }.into(),
    }
}

fn enabled(s: &Option<FeatureState>) -> Option<bool> {
    s.as_ref().map(|s| s.enabled.unwrap_or(true))
}

impl super::super::convert::Configurator for CpuConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let base = FieldPath::new("spec.domain.cpu");
        let cpu = vmi.spec.domain.cpu.clone().unwrap_or_default();
        let acc = accel(ctx)?;
        let model = cpu.model.as_deref().unwrap_or("host-model");
        let mut flags = Vec::new();
        let model = match (model, acc) {
            ("host-model" | "host-passthrough", Accel::Kvm) => {
                flags.push(flag("migratable", true));
                "host".to_string()
            }
            ("host-model" | "host-passthrough", Accel::Tcg) => "max".to_string(),
            (named, _) => {
                check_token(&base.key("model"), named)?;
                named.to_string()
            }
        };
        let named = model != "host" && model != "max";
        let features: &[crate::vmi::CpuFeature] = cpu.features.as_deref().unwrap_or_default();
        for (i, f) in features.iter().enumerate() {
            let p = base.key("features").index(i);
            check_token(&p.key("name"), &f.name)?;
            let on = match f.policy.as_deref().unwrap_or("require") {
                "require" | "force" | "optional" => true,
                "disable" | "forbid" => false,
                other => {
                    return Err(ConvertError::unsupported(
                        p.key("policy"),
                        format!("policy {other:?}"),
                    ))
                }
            };
            flags.push(flag(&f.name, on));
        }
        if named && !features.iter().any(|f| f.name == "mpx") {
            flags.push(flag("mpx", false));
        }

        // Hyper-V and KVM features.
        let fpath = FieldPath::new("spec.domain.features");
        if let Some(feat) = vmi.spec.domain.features.as_ref() {
            if enabled(&feat.hyperv_passthrough) == Some(true) {
                flags.push(flag("hv-passthrough", true));
            }
            if let Some(h) = feat.hyperv.as_ref() {
                let hp = fpath.key("hyperv");
                if acc == Accel::Tcg {
                    return Err(ConvertError::unsupported(
                        hp,
                        "Hyper-V enlightenments without KVM",
                    ));
                }
                let simple: [(&Option<FeatureState>, &str); 9] = [
                    (&h.relaxed, "hv-relaxed"),
                    (&h.vapic, "hv-vapic"),
                    (&h.vpindex, "hv-vpindex"),
                    (&h.runtime, "hv-runtime"),
                    (&h.synic, "hv-synic"),
                    (&h.reset, "hv-reset"),
                    (&h.frequencies, "hv-frequencies"),
                    (&h.reenlightenment, "hv-reenlightenment"),
                    (&h.ipi, "hv-ipi"),
                ];
                for (s, name) in simple {
                    if enabled(s) == Some(true) {
                        flags.push(flag(name, true));
                    }
                }
                if let Some(s) = &h.spinlocks {
                    if s.enabled.unwrap_or(true) {
                        let retries = s.retries.unwrap_or(4096);
                        if retries < 4095 {
                            return Err(ConvertError::invalid(
                                hp.key("spinlocks").key("spinlocks"),
                                "retries must be at least 4095",
                            ));
                        }
                        flags.push(CpuFlag {
                            name: "hv-spinlocks".into(),
                            value: format!("0x{retries:x}"),
                        });
                    }
                }
                if let Some(t) = &h.synictimer {
                    if t.enabled.unwrap_or(true) {
                        flags.push(flag("hv-stimer", true));
                        if enabled(&t.direct) == Some(true) {
                            flags.push(flag("hv-stimer-direct", true));
                        }
                    }
                }
                if let Some(v) = &h.vendorid {
                    if v.enabled.unwrap_or(true) {
                        let vp = hp.key("vendorid").key("vendorid");
                        let id = v.vendorid.as_deref().unwrap_or_default();
                        if id.is_empty()
                            || id.len() > 12
                            || !id.bytes().all(|b| b.is_ascii_alphanumeric())
                        {
                            return Err(ConvertError::invalid(
                                vp,
                                "vendor id must be 1 to 12 letters or digits",
                            ));
                        }
                        flags.push(CpuFlag {
                            name: "hv-vendor-id".into(),
                            value: id.into(),
                        });
                    }
                }
                if let Some(t) = &h.tlbflush {
                    if t.enabled.unwrap_or(true) {
                        flags.push(flag("hv-tlbflush", true));
                        if enabled(&t.direct) == Some(true) {
                            flags.push(flag("hv-tlbflush-direct", true));
                        }
                        if enabled(&t.extended) == Some(true) {
                            flags.push(flag("hv-tlbflush-ext", true));
                        }
                    }
                }
                if enabled(&h.evmcs) == Some(true) {
                    flags.push(flag("hv-evmcs", true));
                }
            }
            if feat.kvm.as_ref().and_then(|k| k.hidden) == Some(true) {
                flags.push(flag("kvm", false));
            }
            if let Some(on) = enabled(&feat.pvspinlock) {
                flags.push(flag("kvm-pv-unhalt", on));
            }
        }
        if let Some(t) = vmi
            .spec
            .domain
            .clock
            .as_ref()
            .and_then(|c| c.timer.as_ref())
        {
            if let Some(k) = &t.kvm {
                flags.push(flag("kvmclock", k.enabled.unwrap_or(true)));
            }
            if let Some(h) = &t.hyperv {
                flags.push(flag("hv-time", h.enabled.unwrap_or(true)));
            }
        }
        plan.cpu = CpuPlan { model, flags };

        let (sockets, cores, threads) = topology(vmi)?;
        let cpus = sockets * cores * threads;
        let max_sockets = cpu.max_sockets.unwrap_or(0);
        let (smp_sockets, maxcpus) = if max_sockets > sockets {
            let max = max_sockets
                .checked_mul(cores * threads)
                .filter(|m| *m <= 1024)
                .ok_or_else(|| {
                    ConvertError::invalid(base.key("maxSockets"), "more than 1024 vCPUs")
                })?;
            (max_sockets, max)
        } else if max_sockets != 0 && max_sockets < sockets {
            return Err(ConvertError::invalid(
                base.key("maxSockets"),
                "maxSockets is smaller than sockets",
            ));
        } else {
            (sockets, cpus)
        };
        plan.smp = SmpPlan {
            cpus,
            maxcpus,
            sockets: smp_sockets,
            cores,
            threads,
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::convert::Configurator;
    use crate::cmdline::testutil::vmi_with;
    use serde_json::json;

    fn run(domain: serde_json::Value, ctx: &ConverterContext) -> Result<DomainPlan, ConvertError> {
        let mut plan = DomainPlan::default();
        CpuConfigurator.configure(&vmi_with(domain), ctx, &mut plan)?;
        Ok(plan)
    }

    #[test]
    fn host_model_is_host_under_kvm_and_max_under_tcg() {
        let kvm = run(json!({}), &ConverterContext::default()).unwrap();
        assert_eq!(
            kvm.cpu,
            CpuPlan {
                model: "host".into(),
                flags: vec![flag("migratable", true)]
            }
        );
        let tcg_ctx = ConverterContext {
            kvm: false,
            allow_emulation: true,
            ..Default::default()
        };
        let tcg = run(json!({}), &tcg_ctx).unwrap();
        assert_eq!(tcg.cpu.model, "max");
    }

    #[test]
    fn named_model_gets_mpx_off_and_feature_policies() {
        let plan = run(
            json!({"cpu": {"model": "Skylake-Server", "features": [
                {"name": "vmx"}, {"name": "svm", "policy": "forbid"}]}}),
            &ConverterContext::default(),
        )
        .unwrap();
        assert_eq!(
            plan.cpu.flags,
            vec![flag("vmx", true), flag("svm", false), flag("mpx", false)]
        );
    }

    #[test]
    fn topology_and_hotplug_maxcpus() {
        let plan = run(
            json!({"cpu": {"sockets": 2, "cores": 2, "threads": 1, "maxSockets": 6}}),
            &ConverterContext::default(),
        )
        .unwrap();
        assert_eq!(
            plan.smp,
            SmpPlan {
                cpus: 4,
                maxcpus: 12,
                sockets: 6,
                cores: 2,
                threads: 1
            }
        );
        let plan = run(
            json!({"resources": {"limits": {"cpu": "2500m"}}}),
            &ConverterContext::default(),
        )
        .unwrap();
        assert_eq!(plan.smp.cpus, 3, "CPU limit rounded up to sockets");
    }

    #[test]
    fn bad_feature_names_are_rejected_with_path() {
        let e = run(
            json!({"cpu": {"model": "qemu64", "features": [{"name": "vmx,kvm=off"}]}}),
            &ConverterContext::default(),
        )
        .unwrap_err();
        assert_eq!(e.path().as_str(), "spec.domain.cpu.features[0].name");
    }
}
