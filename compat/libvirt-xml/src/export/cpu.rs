//! `<features>` (ACPI, SMM, Hyper-V, KVM), `<cpu>` (mode, topology, NUMA) and `<vcpus>`.

use super::*;

pub(super) fn state(s: &Option<qlauncher_core::vmi::domain::FeatureState>) -> Option<State> {
    s.as_ref().map(|f| State {
        state: on_off(f.enabled != Some(false)),
    })
}

pub(super) fn domain_features(
    f: &qlauncher_core::vmi::domain::Features,
    plan: &DomainPlan,
) -> Features {
    let hyperv = if f
        .hyperv_passthrough
        .as_ref()
        .is_some_and(|p| p.enabled != Some(false))
    {
        Some(HyperV {
            mode: Some("passthrough".into()),
            ..Default::default()
        })
    } else {
        f.hyperv.as_ref().map(|h| HyperV {
            mode: None,
            relaxed: state(&h.relaxed),
            vapic: state(&h.vapic),
            spinlocks: h.spinlocks.as_ref().map(|s| Spinlocks {
                state: on_off(s.enabled != Some(false)),
                retries: s.retries.or(Some(4096)),
            }),
            vpindex: state(&h.vpindex),
            runtime: state(&h.runtime),
            synic: state(&h.synic),
            stimer: h.synictimer.as_ref().map(|s| Stimer {
                state: on_off(s.enabled != Some(false)),
                direct: state(&s.direct),
            }),
            reset: state(&h.reset),
            vendor_id: h.vendorid.as_ref().map(|v| VendorId {
                state: on_off(v.enabled != Some(false)),
                value: v.vendorid.clone(),
            }),
            frequencies: state(&h.frequencies),
            reenlightenment: state(&h.reenlightenment),
            tlbflush: h.tlbflush.as_ref().map(|t| TlbFlush {
                state: on_off(t.enabled != Some(false)),
                direct: state(&t.direct),
                extended: state(&t.extended),
            }),
            ipi: state(&h.ipi),
            evmcs: state(&h.evmcs),
        })
    };
    let mut hyperv = hyperv;
    // What the plan's CPU flags say over what the VMI says: a hook's `kvm=off` and `hv-*`
    // edits ([`crate::hooks::FeatureEdit`]) show in the export.
    let flag_on = |name: &str, value: &str| {
        plan.cpu
            .flags
            .iter()
            .any(|f| f.name == name && f.value == value)
    };
    let passthrough = hyperv.as_ref().is_some_and(|h| h.mode.is_some());
    if !passthrough {
        for (element, flag) in crate::hooks::HYPERV {
            let on = flag_on(flag, "on");
            let h = match (&mut hyperv, on) {
                (Some(h), _) => h,
                (None, true) => hyperv.insert(HyperV::default()),
                (None, false) => continue,
            };
            let slot = match element {
                "relaxed" => &mut h.relaxed,
                "vapic" => &mut h.vapic,
                "vpindex" => &mut h.vpindex,
                "runtime" => &mut h.runtime,
                "synic" => &mut h.synic,
                "reset" => &mut h.reset,
                "frequencies" => &mut h.frequencies,
                "reenlightenment" => &mut h.reenlightenment,
                _ => &mut h.ipi,
            };
            match (on, slot.is_some()) {
                (true, _) => *slot = Some(State { state: "on".into() }),
                (false, true) => {
                    *slot = Some(State {
                        state: "off".into(),
                    })
                }
                (false, false) => {}
            }
        }
    }
    if !passthrough {
        hyperv_values(&mut hyperv, plan);
    }
    let hidden = flag_on("kvm", "off");
    let kvm = match f.kvm.as_ref() {
        Some(_) => Some(Kvm {
            hidden: State {
                state: on_off(hidden),
            },
        }),
        None => hidden.then(|| Kvm {
            hidden: State { state: "on".into() },
        }),
    };
    Features {
        acpi: plan.machine.acpi.then(Empty::default),
        apic: f
            .apic
            .as_ref()
            .filter(|a| a.enabled != Some(false))
            .map(|_| Empty::default()),
        hyperv,
        smm: (plan.machine.smm == Some(true)).then(Empty::default),
        kvm,
        pvspinlock: state(&f.pvspinlock),
        pmu: plan
            .cpu
            .libvirt
            .as_ref()
            .filter(|_| plan.cpu.host_model)
            .and_then(|l| l.pmu)
            .map(|on| State { state: on_off(on) }),
        vmport: plan.machine.vmport_off.then(|| State {
            state: "off".into(),
        }),
    }
}

pub(super) fn cpu(vmi: &Vmi, plan: &DomainPlan) -> Cpu {
    let c = vmi.spec.domain.cpu.clone().unwrap_or_default();
    let model = c.model.clone().unwrap_or_default();
    let listed = c.features.clone().unwrap_or_default();
    let mut feature: Vec<CpuFeature> = listed
        .iter()
        .map(|f| CpuFeature {
            name: f.name.clone(),
            policy: f.policy.clone().unwrap_or_else(|| "require".into()),
        })
        .collect();
    let mut running = None;
    let (mode, model) = match model.as_str() {
        "" | "host-model" => match plan.cpu.libvirt.as_ref().filter(|_| plan.cpu.host_model) {
            // The running CPU in libvirt's terms (a migration to a stock target): libvirt's own
            // live XML of a host-model domain, its features replacing the VMI's (already in it).
            Some(l) => {
                feature = l
                    .features
                    .iter()
                    .map(|(name, on)| CpuFeature {
                        name: name.clone(),
                        policy: if *on { "require" } else { "disable" }.into(),
                    })
                    .collect();
                running = Some(l);
                ("custom", Some(l.model.clone()))
            }
            None => ("host-model", None),
        },
        "host-passthrough" => ("host-passthrough", None),
        named => {
            if !listed.iter().any(|f| f.name == "mpx") {
                feature.push(CpuFeature {
                    name: "mpx".into(),
                    policy: "disable".into(),
                });
            }
            ("custom", Some(named.to_string()))
        }
    };
    Cpu {
        mode: mode.into(),
        match_: running.map(|_| "exact".into()),
        check: running.map(|_| "full".into()),
        model: model.map(|name| CpuModelName {
            fallback: running.map(|_| "forbid".into()),
            name,
        }),
        vendor: running.and_then(|l| l.vendor.clone()),
        topology: Topology {
            sockets: plan.smp.sockets,
            cores: plan.smp.cores,
            threads: plan.smp.threads,
        },
        maxphysaddr: running.and_then(|l| l.phys_bits).map(|bits| MaxPhysAddr {
            mode: "emulate".into(),
            bits,
        }),
        feature,
        // The single cell the plan has for memfd/hugepages (as KubeVirt writes it) and for
        // memory hotplug (libvirt needs one for <maxMemory>; KubeVirt leaves it to libvirt).
        numa: plan.memory.numa.as_ref().map(|n| Numa {
            cell: vec![NumaCell {
                id: 0,
                cpus: n.cpus.clone(),
                memory: plan.memory.size,
                unit: "b".into(),
            }],
        }),
    }
}

pub(super) fn vcpus(plan: &DomainPlan) -> Option<Vcpus> {
    let s = plan.smp;
    if s.maxcpus <= s.cpus {
        return None;
    }
    let per_socket = s.cores.saturating_mul(s.threads);
    Some(Vcpus {
        vcpu: (0..s.maxcpus)
            .map(|id| VcpuState {
                id,
                enabled: yes_no(id < s.cpus),
                hotpluggable: yes_no(id >= per_socket),
            })
            .collect(),
    })
}

/// The Hyper-V enlightenments with values or sub-features as the plan's `-cpu` flags have them
/// (a hook's [`crate::hooks::FeatureEdit`]s show): `hv-spinlocks=0x<retries>`, `hv-stimer`
/// (+`hv-stimer-direct`), `hv-vendor-id=<value>`, `hv-tlbflush` (+`hv-tlbflush-direct`,
/// `hv-tlbflush-ext`). A flag that is not there turns a listed element's state off (its other
/// attributes and, under an off element, its children stay as the VMI has them: libvirt reads
/// them only when on).
fn hyperv_values(hyperv: &mut Option<HyperV>, plan: &DomainPlan) {
    let flag = |name: &str| {
        plan.cpu
            .flags
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.value.as_str())
    };
    let on = |name: &str| flag(name) == Some("on");
    let off = || "off".to_string();
    let sub = |slot: &mut Option<State>, is_on: bool| match (is_on, slot.is_some()) {
        (true, _) => *slot = Some(State { state: "on".into() }),
        (false, true) => *slot = Some(State { state: off() }),
        (false, false) => {}
    };
    let retries = flag("hv-spinlocks")
        .and_then(|v| v.strip_prefix("0x"))
        .and_then(|h| u32::from_str_radix(h, 16).ok());
    let wanted =
        retries.is_some() || on("hv-stimer") || flag("hv-vendor-id").is_some() || on("hv-tlbflush");
    let h = match hyperv {
        Some(h) => h,
        None if wanted => hyperv.insert(HyperV::default()),
        None => return,
    };
    match (retries, &mut h.spinlocks) {
        (Some(r), s) => {
            *s = Some(Spinlocks {
                state: "on".into(),
                retries: Some(r),
            })
        }
        (None, Some(s)) => s.state = off(),
        (None, None) => {}
    }
    match (on("hv-stimer"), &mut h.stimer) {
        (true, s) => {
            let mut direct = s.as_ref().and_then(|s| s.direct.clone());
            sub(&mut direct, on("hv-stimer-direct"));
            *s = Some(Stimer {
                state: "on".into(),
                direct,
            });
        }
        (false, Some(s)) => s.state = off(),
        (false, None) => {}
    }
    match (flag("hv-vendor-id"), &mut h.vendor_id) {
        (Some(v), s) => {
            *s = Some(VendorId {
                state: "on".into(),
                value: Some(v.to_string()),
            })
        }
        (None, Some(s)) => s.state = off(),
        (None, None) => {}
    }
    match (on("hv-tlbflush"), &mut h.tlbflush) {
        (true, t) => {
            let (mut direct, mut extended) = t
                .as_ref()
                .map(|t| (t.direct.clone(), t.extended.clone()))
                .unwrap_or_default();
            sub(&mut direct, on("hv-tlbflush-direct"));
            sub(&mut extended, on("hv-tlbflush-ext"));
            *t = Some(TlbFlush {
                state: "on".into(),
                direct,
                extended,
            });
        }
        (false, Some(t)) => t.state = off(),
        (false, None) => {}
    }
}
