//! Configurators, one file per device family (KubeVirt's `converter/compute/` layout), plus the
//! pure helpers several of them share (vCPU count, accelerator, virtio model names).

pub mod balloon;
pub mod channels;
pub mod clock;
pub mod console;
pub mod controllers;
pub mod cpu;
pub mod disks;
pub mod filesystems;
pub mod firmware;
pub mod graphics;
pub mod hostdevs;
pub mod inputs;
pub mod interfaces;
pub mod iothreads;
pub mod launch_security;
pub mod machine;
pub mod memory;
pub mod metadata;
pub mod rng;
pub mod sound;
pub mod sysinfo;
pub mod tpm;
pub mod unsupported;
pub mod vsock;
pub mod watchdog;

use super::context::{Arch, ConverterContext};
use super::error::{ConvertError, FieldPath};
use super::names::check_name;
use super::plan::Accel;
use crate::vmi::Vmi;

/// `spec.domain.devices` path.
pub(crate) fn devices_path() -> FieldPath {
    FieldPath::new("spec.domain.devices")
}

/// Rejects architectures other than amd64 (no silent fallback).
pub(crate) fn require_amd64(ctx: &ConverterContext) -> Result<(), ConvertError> {
    match ctx.arch {
        Arch::Amd64 => Ok(()),
        Arch::Arm64 | Arch::S390x => Err(ConvertError::unsupported(
            FieldPath::new("spec.architecture"),
            format!("architecture {:?}", ctx.arch),
        )),
    }
}

/// The accelerator: KVM when usable, TCG when not and `--allow-emulation` is given, else an error
/// (`converter/kvm/configurator.go`).
pub fn accel(ctx: &ConverterContext) -> Result<Accel, ConvertError> {
    if ctx.kvm {
        Ok(Accel::Kvm)
    } else if ctx.allow_emulation {
        Ok(Accel::Tcg)
    } else {
        Err(ConvertError::NoKvm {
            path: FieldPath::new("spec.domain"),
        })
    }
}

/// vCPU topology `(sockets, cores, threads)` (`vcpu.GetCPUTopology`): from `domain.cpu`; when all
/// are zero, sockets = CPU limit, else request, rounded up, else 1.
pub fn topology(vmi: &Vmi) -> Result<(u32, u32, u32), ConvertError> {
    let cpu = vmi.spec.domain.cpu.as_ref();
    let (s, c, t) = (
        cpu.and_then(|c| c.sockets).unwrap_or(0),
        cpu.and_then(|c| c.cores).unwrap_or(0),
        cpu.and_then(|c| c.threads).unwrap_or(0),
    );
    if s == 0 && c == 0 && t == 0 {
        let res = &vmi.spec.domain.resources;
        let q = res.limit("cpu").or_else(|| res.request("cpu"));
        let sockets = match q {
            Some(q) => {
                let m = q.to_millis().map_err(|e| {
                    ConvertError::invalid(
                        FieldPath::new("spec.domain.resources")
                            .key("limits")
                            .key("cpu"),
                        e.to_string(),
                    )
                })?;
                (m.div_ceil(1000)).max(1) as u32
            }
            None => 1,
        };
        return Ok((sockets, 1, 1));
    }
    Ok((s.max(1), c.max(1), t.max(1)))
}

/// vCPUs at boot = sockets x cores x threads.
pub fn vcpus(vmi: &Vmi) -> Result<u32, ConvertError> {
    let (s, c, t) = topology(vmi)?;
    s.checked_mul(c)
        .and_then(|x| x.checked_mul(t))
        .filter(|n| *n <= 1024)
        .ok_or_else(|| {
            ConvertError::invalid(FieldPath::new("spec.domain.cpu"), "more than 1024 vCPUs")
        })
}

/// The virtio model suffix: `-non-transitional` unless `useVirtioTransitional`
/// (`virtio/transitional-model.go`).
pub(crate) fn virtio_driver(
    vmi: &Vmi,
    non_transitional: &'static str,
    transitional: &'static str,
) -> &'static str {
    if vmi.spec.domain.devices.use_virtio_transitional == Some(true) {
        transitional
    } else {
        non_transitional
    }
}

/// The VMI's UID as a path component (`/var/run/kubevirt-private/<uid>/virt-serial0`).
pub(crate) fn vmi_uid(vmi: &Vmi) -> Result<&str, ConvertError> {
    let path = FieldPath::new("metadata.uid");
    let uid =
        vmi.metadata.uid.as_deref().ok_or_else(|| {
            ConvertError::missing(path.clone(), "the VMI UID (socket paths use it)")
        })?;
    check_name(&path, uid)?;
    Ok(uid)
}

/// The VMI's name.
pub(crate) fn vmi_name(vmi: &Vmi) -> Result<&str, ConvertError> {
    let path = FieldPath::new("metadata.name");
    let name = vmi
        .metadata
        .name
        .as_deref()
        .ok_or_else(|| ConvertError::missing(path.clone(), "the VMI name"))?;
    check_name(&path, name)?;
    Ok(name)
}

/// The VMI's namespace (`default` when absent, as kubectl does).
pub(crate) fn vmi_namespace(vmi: &Vmi) -> Result<&str, ConvertError> {
    let path = FieldPath::new("metadata.namespace");
    let ns = vmi.metadata.namespace.as_deref().unwrap_or("default");
    check_name(&path, ns)?;
    Ok(ns)
}

/// An annotation value.
pub(crate) fn annotation<'a>(vmi: &'a Vmi, key: &str) -> Option<&'a str> {
    vmi.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(|s| s.as_str())
}

/// Guest memory in bytes: `memory.guest`, else requests.memory, else limits.memory.
pub fn guest_memory(vmi: &Vmi) -> Result<u64, ConvertError> {
    let d = &vmi.spec.domain;
    let (q, path) = if let Some(q) = d.memory.as_ref().and_then(|m| m.guest.as_ref()) {
        (q, FieldPath::new("spec.domain.memory.guest"))
    } else if let Some(q) = d.resources.request("memory") {
        (q, FieldPath::new("spec.domain.resources.requests.memory"))
    } else if let Some(q) = d.resources.limit("memory") {
        (q, FieldPath::new("spec.domain.resources.limits.memory"))
    } else {
        return Err(ConvertError::missing(
            FieldPath::new("spec.domain.memory.guest"),
            "guest memory (memory.guest or resources.requests.memory)",
        ));
    };
    let bytes = q
        .to_bytes()
        .map_err(|e| ConvertError::invalid(path.clone(), e.to_string()))?;
    if bytes < 1024 * 1024 {
        return Err(ConvertError::invalid(path, "less than 1Mi of guest memory"));
    }
    Ok(bytes)
}

/// A non-hot-pluggable planned device.
pub(crate) fn planned(
    class: super::plan::DeviceClass,
    name: Option<&str>,
    backend: super::plan::Backend,
    device: super::qemu::Device,
    placement: super::plan::Placement,
) -> super::plan::PlannedDevice {
    super::plan::PlannedDevice {
        class,
        name: name.map(str::to_string),
        backend,
        device,
        placement,
        address: None,
        hotpluggable: false,
        target: None,
        iommu_platform: false,
    }
}
