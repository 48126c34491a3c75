//! The node-labeller files from what the probe and the host gave, as libvirt writes them
//! (`virsh capabilities`, `virsh domcapabilities`, `virsh hypervisor-cpu-baseline --features`),
//! limited to what KubeVirt v1.9.0's virt-handler reads (`cmd/virt-handler/virt-handler.go`,
//! `pkg/virt-handler/node-labeller/`), and always in a shape virt-handler accepts:
//!
//! - `capabilities.xml`: root `<capabilities>`, a `<host><cpu>` (with the TSC `<counter>` when
//!   known), `<host><topology><cells>` with at least one cell, and one `<guest>` whose machines are
//!   `query-machines`' names and aliases;
//! - `virsh_domcapabilities.xml`: a `host-model` mode that always has a `<model>` and a
//!   `<vendor>` (from QEMU's host CPU, else the host's own CPUID, else `qemu64` and the CPUID
//!   vendor), and the `custom` models QEMU has that libvirt's `cpu_map` names;
//! - `supported_features.xml`: never empty.
//!
//! No name goes into a file that is not a valid label name part ([`is_label_name`]): one bad label
//! key makes the API server reject virt-handler's whole label patch.

use std::path::Path;

use super::cpu_map::CpuMap;
use super::host::{format_list, Cell, TscCounter};
use super::probe::QemuProbe;
use super::x86::{self, CpuDef, QemuModel, HOST_ONLY_FEATURES};
use super::xml::Element;

/// Whether `s` may follow a label prefix (`cpu-model.node.kubevirt.io/<s>`) or be a label value:
/// 1 to 63 characters, alphanumeric at both ends, `[-A-Za-z0-9_.]` between (apimachinery's
/// `IsQualifiedName` name part).
pub fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_alphanumeric();
    !b.is_empty()
        && b.len() <= 63
        && b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Everything the files are made of.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// The virt type the files describe (`kvm`, `qemu`).
    pub virttype: &'a str,
    /// The QEMU binary, as the launcher runs it.
    pub emulator: &'a Path,
    /// The probe of that QEMU.
    pub probe: &'a QemuProbe,
    /// libvirt's CPU map, when it could be loaded.
    pub map: Option<&'a CpuMap>,
    /// The TSC counter, when the host has one.
    pub tsc: Option<TscCounter>,
    /// The NUMA cells (at least one).
    pub cells: &'a [Cell],
    /// `(max_guests, max_es_guests)` for SEV from the host's CPUID.
    pub sev_guests: (u32, u32),
    /// The host's own CPU data, for a host-model when QEMU's host CPU is missing or cannot be
    /// decoded.
    pub host_cpu: Option<super::cpu_map::CpuData>,
    /// The host's CPUID vendor string (`AuthenticAMD`), for the last-resort host-model.
    pub host_vendor: &'a str,
}

/// The file contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files {
    /// `capabilities.xml`.
    pub capabilities: String,
    /// `virsh_domcapabilities.xml`.
    pub domcapabilities: String,
    /// `supported_features.xml`.
    pub supported_features: String,
}

/// Where the host-model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// QEMU's expansion of `host` / `max`, decoded.
    Qemu,
    /// The host's CPUID, decoded.
    HostCpuid,
    /// Nothing could be decoded: `qemu64` and the CPUID vendor.
    LastResort,
}

/// Renders the three files. Warnings name what was left out.
pub fn render(inputs: &Inputs<'_>, warnings: &mut Vec<String>) -> Files {
    let (host_model, source) = host_model(inputs, warnings);
    let supported = supported_features(inputs, &host_model, source, warnings);
    Files {
        capabilities: capabilities(inputs, warnings).render(),
        domcapabilities: domcapabilities(inputs, &host_model, warnings).render(),
        supported_features: Element {
            attrs: vec![
                ("mode".into(), "custom".into()),
                ("match".into(), "exact".into()),
            ],
            ..cpu_element(&supported)
        }
        .render(),
    }
}

fn host_model(inputs: &Inputs<'_>, warnings: &mut Vec<String>) -> (CpuDef, Source) {
    let models = inputs.probe.cpu_models.as_deref();
    let mut decoded = None;
    if let Some(map) = inputs.map {
        if let Some(props) = &inputs.probe.host_cpu {
            match x86::data_from_props(map, props.iter().map(|(n, v)| (n.as_str(), v)))
                .and_then(|d| x86::decode(map, &d, models, None))
            {
                Ok(cpu) => decoded = Some((cpu, Source::Qemu)),
                Err(e) => warnings.push(format!(
                    "QEMU's host CPU cannot be decoded ({e}); host-model from the host's CPUID"
                )),
            }
        }
        if decoded.is_none() {
            if let Some(data) = &inputs.host_cpu {
                if inputs.probe.host_cpu.is_none() {
                    warnings.push("no host CPU from QEMU: host-model from the host's CPUID".into());
                }
                match x86::decode(map, data, models, None) {
                    Ok(mut cpu) => {
                        cpu.features
                            .retain(|(n, _)| !HOST_ONLY_FEATURES.contains(&n.as_str()));
                        decoded = Some((cpu, Source::HostCpuid));
                    }
                    Err(e) => warnings.push(format!("the host's CPUID cannot be decoded: {e}")),
                }
            }
        }
    }
    if let Some((cpu, source)) = decoded {
        let vendor_ok = cpu.vendor.as_deref().is_some_and(is_label_name);
        if is_label_name(&cpu.model) && vendor_ok {
            return (cpu, source);
        }
        warnings.push(format!(
            "host-model {:?} (vendor {:?}) is not a valid label name",
            cpu.model, cpu.vendor
        ));
    }
    let vendor = inputs
        .map
        .and_then(|m| {
            m.vendors
                .iter()
                .find(|v| Some(v.data.clone()) == super::cpu_map::vendor_data(inputs.host_vendor))
        })
        .map(|v| v.name.clone())
        .unwrap_or_else(|| builtin_vendor(inputs.host_vendor).to_owned());
    warnings.push(format!(
        "no host-model could be decoded; writing qemu64 from vendor {vendor} so that virt-handler \
         starts"
    ));
    (
        CpuDef {
            model: "qemu64".into(),
            vendor: Some(vendor),
            features: Vec::new(),
        },
        Source::LastResort,
    )
}

/// libvirt's vendor names for the CPUID vendor strings (`cpu_map/x86_vendors.xml`), for when the
/// map is missing; `unknown` otherwise.
fn builtin_vendor(string: &str) -> &'static str {
    match string {
        "GenuineIntel" => "Intel",
        "AuthenticAMD" => "AMD",
        "HygonGenuine" => "Hygon",
        _ => "unknown",
    }
}

/// `virsh hypervisor-cpu-baseline --features` of the host-model: libvirt's baseline (limited to
/// the features QEMU's expansion names) with every feature of the model listed.
fn supported_features(
    inputs: &Inputs<'_>,
    host_model: &CpuDef,
    source: Source,
    warnings: &mut Vec<String>,
) -> CpuDef {
    let none = || CpuDef {
        model: host_model.model.clone(),
        vendor: host_model.vendor.clone(),
        features: Vec::new(),
    };
    let Some(map) = inputs.map else {
        return none();
    };
    if source == Source::LastResort {
        return none();
    }
    let qemu_features: Option<Vec<String>> = inputs.probe.host_cpu.as_ref().map(|props| {
        props
            .iter()
            .map(|(n, _)| x86::libvirt_name(n).to_owned())
            .collect()
    });
    let models = inputs.probe.cpu_models.as_deref();
    match x86::baseline(map, host_model, models, qemu_features.as_deref())
        .and_then(|b| x86::expand_features(map, &b))
    {
        Ok(mut cpu) => {
            cpu.features.sort_by(|a, b| a.0.cmp(&b.0));
            warn_invalid(
                "supported features",
                cpu.features.iter().map(|(n, _)| n.as_str()),
                warnings,
            );
            cpu
        }
        Err(e) => {
            warnings.push(format!(
                "no supported features: the baseline of {} failed: {e}",
                host_model.model
            ));
            none()
        }
    }
}

/// `<cpu>` with `<model fallback='forbid'>`, `<vendor>` and the features whose names are valid
/// labels (others dropped with a warning by the caller's filter).
fn cpu_element(cpu: &CpuDef) -> Element {
    let mut el = Element::new("cpu").child(
        Element::new("model")
            .attr("fallback", "forbid")
            .text(&cpu.model),
    );
    if let Some(v) = &cpu.vendor {
        el = el.child(Element::new("vendor").text(v));
    }
    el.children(
        cpu.features
            .iter()
            .filter(|(n, _)| is_label_name(n))
            .map(|(n, p)| {
                Element::new("feature")
                    .attr("policy", p.as_str())
                    .attr("name", n)
            }),
    )
}

fn warn_invalid<'a>(what: &str, names: impl IntoIterator<Item = &'a str>, w: &mut Vec<String>) {
    let bad: Vec<&str> = names.into_iter().filter(|n| !is_label_name(n)).collect();
    if !bad.is_empty() {
        w.push(format!(
            "{what} left out, not valid label names: {}",
            bad.join(", ")
        ));
    }
}

fn domcapabilities(inputs: &Inputs<'_>, host_model: &CpuDef, w: &mut Vec<String>) -> Element {
    let probe = inputs.probe;
    let machine = probe
        .machines
        .as_ref()
        .and_then(|ms| ms.iter().find(|m| m.alias.as_deref() == Some("q35")))
        .map_or("q35".to_owned(), |m| m.name.clone());
    let domain = if inputs.virttype == "kvm" && probe.kvm {
        "kvm"
    } else {
        "qemu"
    };
    warn_invalid(
        "host-model features",
        host_model.features.iter().map(|(n, _)| n.as_str()),
        w,
    );
    let host_mode = cpu_element(host_model);
    let host_mode = Element {
        name: "mode".into(),
        attrs: vec![
            ("name".into(), "host-model".into()),
            ("supported".into(), "yes".into()),
        ],
        ..host_mode
    };
    let custom = custom_models(inputs, w);
    let mut features = Element::new("features").child(sev_element(inputs));
    features = features.child(launch_security(inputs));
    Element::new("domainCapabilities")
        .child(Element::new("path").text(inputs.emulator.display().to_string()))
        .child(Element::new("domain").text(domain))
        .child(Element::new("machine").text(machine))
        .child(Element::new("arch").text("x86_64"))
        .child(
            Element::new("cpu")
                .child(
                    Element::new("mode")
                        .attr("name", "host-passthrough")
                        .attr("supported", if domain == "kvm" { "yes" } else { "no" }),
                )
                .child(
                    Element::new("mode")
                        .attr("name", "maximum")
                        .attr("supported", "yes"),
                )
                .child(host_mode)
                .child(
                    Element::new("mode")
                        .attr("name", "custom")
                        .attr("supported", "yes")
                        .children(custom),
                ),
        )
        .child(features)
}

/// QEMU's models that libvirt's `cpu_map` names, `host` left out, in QEMU's order
/// (`virQEMUCapsFillDomainCPUCaps`).
fn custom_models(inputs: &Inputs<'_>, w: &mut Vec<String>) -> Vec<Element> {
    let (Some(map), Some(models)) = (inputs.map, inputs.probe.cpu_models.as_ref()) else {
        return Vec::new();
    };
    let listed: Vec<&QemuModel> = models
        .iter()
        .filter(|m| m.name != "host" && map.model(&m.name).is_some())
        .collect();
    warn_invalid("CPU models", listed.iter().map(|m| m.name.as_str()), w);
    listed
        .into_iter()
        .filter(|m| is_label_name(&m.name))
        .map(|m| {
            let mut el = Element::new("model")
                .attr("usable", m.usable.as_str())
                .attr("vendor", map.model_vendor(&m.name).unwrap_or("unknown"));
            if m.deprecated {
                el = el.attr("deprecated", "yes");
            }
            el.text(&m.name)
        })
        .collect()
}

fn sev_element(inputs: &Inputs<'_>) -> Element {
    let Some(sev) = &inputs.probe.sev else {
        return Element::new("sev").attr("supported", "no");
    };
    let (max, max_es) = inputs.sev_guests;
    let mut el = Element::new("sev")
        .attr("supported", "yes")
        .child(Element::new("cbitpos").text(sev.cbitpos.to_string()))
        .child(Element::new("reducedPhysBits").text(sev.reduced_phys_bits.to_string()))
        .child(Element::new("maxGuests").text(max.to_string()))
        .child(Element::new("maxESGuests").text(max_es.to_string()));
    if let Some(id) = &sev.cpu0_id {
        el = el.child(Element::new("cpu0Id").text(id));
    }
    el
}

/// libvirt 11's `<launchSecurity>`: the `sectype` values QEMU can run (`sev`, and `sev-snp` when
/// QEMU has `sev-snp-guest` too).
fn launch_security(inputs: &Inputs<'_>) -> Element {
    let probe = inputs.probe;
    if probe.sev.is_none() {
        return Element::new("launchSecurity").attr("supported", "no");
    }
    let mut values = vec![Element::new("value").text("sev")];
    if probe
        .types
        .as_ref()
        .is_some_and(|t| t.iter().any(|n| n == "sev-snp-guest"))
    {
        values.push(Element::new("value").text("sev-snp"));
    }
    Element::new("launchSecurity")
        .attr("supported", "yes")
        .child(
            Element::new("enum")
                .attr("name", "sectype")
                .children(values),
        )
}

fn capabilities(inputs: &Inputs<'_>, w: &mut Vec<String>) -> Element {
    let mut cpu = Element::new("cpu").child(Element::new("arch").text("x86_64"));
    if let Some(t) = inputs.tsc {
        cpu = cpu.child(
            Element::new("counter")
                .attr("name", "tsc")
                .attr("frequency", t.frequency.to_string())
                .attr("scaling", if t.scaling { "yes" } else { "no" }),
        );
    }
    let cells = Element::new("cells")
        .attr("num", inputs.cells.len().to_string())
        .children(inputs.cells.iter().map(cell_element));
    let host = Element::new("host")
        .child(cpu)
        .child(Element::new("topology").child(cells));
    let mut arch = Element::new("arch")
        .attr("name", "x86_64")
        .child(Element::new("wordsize").text("64"))
        .child(Element::new("emulator").text(inputs.emulator.display().to_string()));
    arch = arch.children(machines(inputs, w));
    arch = arch.child(Element::new("domain").attr("type", "qemu"));
    if inputs.probe.kvm {
        arch = arch.child(Element::new("domain").attr("type", "kvm"));
    }
    let guest = Element::new("guest")
        .child(Element::new("os_type").text("hvm"))
        .child(arch);
    Element::new("capabilities").child(host).child(guest)
}

/// `query-machines` as libvirt lists it (`virQEMUCapsGetMachineTypesCaps`): an aliased machine
/// under its alias with `canonical=`, then the canonical names that have no entry of their own.
fn machines(inputs: &Inputs<'_>, w: &mut Vec<String>) -> Vec<Element> {
    let Some(list) = &inputs.probe.machines else {
        return Vec::new();
    };
    let mut names: Vec<(&str, Option<&str>, &crate::qmp::commands::MachineInfo)> = list
        .iter()
        .map(|m| match &m.alias {
            Some(a) => (a.as_str(), Some(m.name.as_str()), m),
            None => (m.name.as_str(), None, m),
        })
        .collect();
    let missing: Vec<_> = names
        .iter()
        .filter_map(|(_, canonical, m)| {
            let c = (*canonical)?;
            (!names.iter().any(|(n, _, _)| *n == c)).then_some((c, None, *m))
        })
        .collect();
    names.extend(missing);
    warn_invalid("machine types", names.iter().map(|(n, _, _)| *n), w);
    names
        .into_iter()
        .filter(|(n, c, _)| is_label_name(n) && c.is_none_or(is_label_name))
        .map(|(name, canonical, m)| {
            let mut el = Element::new("machine");
            if let Some(c) = canonical {
                el = el.attr("canonical", c);
            }
            el = el.attr("maxCpus", m.cpu_max.to_string());
            if m.deprecated {
                el = el.attr("deprecated", "yes");
            }
            el.text(name)
        })
        .collect()
}

fn cell_element(c: &Cell) -> Element {
    let mut el = Element::new("cell")
        .attr("id", c.id.to_string())
        .child(
            Element::new("memory")
                .attr("unit", "KiB")
                .text(c.memory_kib.to_string()),
        )
        .children(c.pages.iter().map(|(size, count)| {
            Element::new("pages")
                .attr("unit", "KiB")
                .attr("size", size.to_string())
                .text(count.to_string())
        }));
    if !c.distances.is_empty() {
        el = el.child(
            Element::new("distances").children(c.distances.iter().map(|(id, v)| {
                Element::new("sibling")
                    .attr("id", id.to_string())
                    .attr("value", v.to_string())
            })),
        );
    }
    el.child(
        Element::new("cpus")
            .attr("num", c.cpus.len().to_string())
            .children(c.cpus.iter().map(|cpu| {
                Element::new("cpu")
                    .attr("id", cpu.id.to_string())
                    .attr("socket_id", cpu.socket_id.to_string())
                    .attr("die_id", cpu.die_id.to_string())
                    .attr("core_id", cpu.core_id.to_string())
                    .attr("siblings", format_list(&cpu.siblings))
            })),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_names_follow_apimachinery() {
        for ok in [
            "EPYC",
            "pc-q35-7.2",
            "Skylake-Client-noTSX-IBRS",
            "sse4.1",
            "a",
            "tsc_adjust",
        ] {
            assert!(is_label_name(ok), "{ok}");
        }
        let long = "a".repeat(64);
        for bad in ["", "has space", "-x", "x-", ".x", "a/b", "ä", long.as_str()] {
            assert!(!is_label_name(bad), "{bad}");
        }
    }
}
