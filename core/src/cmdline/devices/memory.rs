//! Guest memory (`converter/compute/memory.go`, `converter.go:1067-1104`): `-m size=<KiB>k`, a
//! `memory-backend-ram` named `pc.ram`; with `maxGuest` above the guest size, `slots=0,maxmem=`
//! and a single NUMA cell (libvirt adds one for maxMemory; a direct launcher must do it itself);
//! with hugepages, a `memory-backend-memfd` with `hugetlb` and the page size, preallocated, and a
//! NUMA cell `0-<maxcpus-1>` (KubeVirt's memfd rule; `kubevirt.io/memfd: "false"` is rejected);
//! with virtiofs filesystems, a shared `memory-backend-memfd` and the same NUMA cell.
//!
//! Reads: nothing from the context.

use super::super::context::ConverterContext;
use super::super::error::{ConvertError, FieldPath};
use super::super::plan::{DomainPlan, MemoryPlan, NumaCell};
use super::super::qemu::ObjectMemoryBackend;
use super::{annotation, guest_memory, topology};
use crate::vmi::Vmi;

/// Sets `memory` and `large_memory`.
pub struct MemoryConfigurator;

const GIB: u64 = 1024 * 1024 * 1024;

impl super::super::convert::Configurator for MemoryConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        _ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let base = FieldPath::new("spec.domain.memory");
        // QEMU takes KiB; round up like libvirt's KiB conversion.
        let size = guest_memory(vmi)?.div_ceil(1024) * 1024;
        plan.large_memory = size > 2 * GIB;
        let mem = vmi.spec.domain.memory.clone().unwrap_or_default();
        let maxmem = match &mem.max_guest {
            Some(q) => {
                let max = q
                    .to_bytes()
                    .map_err(|e| ConvertError::invalid(base.key("maxGuest"), e.to_string()))?
                    .div_ceil(1024)
                    * 1024;
                if max < size {
                    return Err(ConvertError::invalid(
                        base.key("maxGuest"),
                        "maxGuest is smaller than the guest memory",
                    ));
                }
                (max > size).then_some(max)
            }
            None => None,
        };
        let hugepage = match mem.hugepages.as_ref() {
            Some(h) => {
                let p = base.key("hugepages").key("pageSize");
                let bytes = match h.page_size.as_deref() {
                    Some("2Mi") => 2 * 1024 * 1024,
                    Some("1Gi") => GIB,
                    other => {
                        return Err(ConvertError::unsupported(
                            p,
                            format!("hugepage size {other:?} (2Mi or 1Gi)"),
                        ))
                    }
                };
                if annotation(vmi, "kubevirt.io/memfd") == Some("false") {
                    return Err(ConvertError::unsupported(
                        FieldPath::new("metadata.annotations"),
                        "kubevirt.io/memfd: \"false\" (file-backed hugepages)",
                    ));
                }
                if size % bytes != 0 {
                    return Err(ConvertError::invalid(
                        base.key("guest"),
                        "guest memory is not a multiple of the hugepage size",
                    ));
                }
                Some(bytes)
            }
            None => None,
        };
        // vhost-user (virtiofs) needs guest RAM a second process can map: KubeVirt then asks
        // for `<access mode="shared"/>`, a memfd source and a NUMA cell.
        let shared = super::filesystems::has_virtiofs(vmi);
        let numa = hugepage.is_some() || maxmem.is_some() || shared;
        let id = if numa { "ram-node0" } else { "pc.ram" };
        let backend = match hugepage {
            None if shared => ObjectMemoryBackend {
                qom_type: "memory-backend-memfd",
                id: id.into(),
                size,
                hugetlb: None,
                hugetlbsize: None,
                share: Some(true),
                prealloc: None,
            },
            Some(page) => ObjectMemoryBackend {
                qom_type: "memory-backend-memfd",
                id: id.into(),
                size,
                hugetlb: Some(true),
                hugetlbsize: Some(page),
                share: Some(true),
                prealloc: Some(true),
            },
            None => ObjectMemoryBackend {
                qom_type: "memory-backend-ram",
                id: id.into(),
                size,
                hugetlb: None,
                hugetlbsize: None,
                share: None,
                prealloc: None,
            },
        };
        let numa = if numa {
            let (s, c, t) = topology(vmi)?;
            let max_sockets = vmi
                .spec
                .domain
                .cpu
                .as_ref()
                .and_then(|c| c.max_sockets)
                .unwrap_or(0)
                .max(s);
            let maxcpus = max_sockets * c * t;
            Some(NumaCell {
                cpus: if maxcpus > 1 {
                    format!("0-{}", maxcpus - 1)
                } else {
                    "0".into()
                },
                memdev: id.into(),
            })
        } else {
            plan.machine.memory_backend = Some(id.into());
            None
        };
        plan.memory = MemoryPlan {
            size,
            maxmem,
            backend: Some(backend),
            numa,
        };
        Ok(())
    }
}
