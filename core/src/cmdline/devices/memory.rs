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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::testutil::{configure, error_path};
    use serde_json::json;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn memory_table() {
        // (domain fragment) -> (size, maxmem, backend type, backend id, hugetlbsize, share,
        // NUMA cell cpus, machine memory-backend)
        type Want = (
            u64,
            Option<u64>,
            &'static str,
            &'static str,
            Option<u64>,
            Option<bool>,
            Option<&'static str>,
            Option<&'static str>,
        );
        let cases: [(serde_json::Value, Want); 5] = [
            (
                json!({}),
                (
                    256 * MIB,
                    None,
                    "memory-backend-ram",
                    "pc.ram",
                    None,
                    None,
                    None,
                    Some("pc.ram"),
                ),
            ),
            (
                json!({"memory": {"guest": "3Gi"}}),
                (
                    3 * GIB,
                    None,
                    "memory-backend-ram",
                    "pc.ram",
                    None,
                    None,
                    None,
                    Some("pc.ram"),
                ),
            ),
            (
                json!({"memory": {"guest": "1Gi", "maxGuest": "4Gi"}, "cpu": {"sockets": 2, "maxSockets": 4}}),
                (
                    GIB,
                    Some(4 * GIB),
                    "memory-backend-ram",
                    "ram-node0",
                    None,
                    None,
                    Some("0-3"),
                    None,
                ),
            ),
            (
                json!({"memory": {"guest": "1Gi", "hugepages": {"pageSize": "2Mi"}}}),
                (
                    GIB,
                    None,
                    "memory-backend-memfd",
                    "ram-node0",
                    Some(2 * MIB),
                    Some(true),
                    Some("0"),
                    None,
                ),
            ),
            (
                json!({"devices": {"filesystems": [{"name": "fs", "virtiofs": {}}]}}),
                (
                    256 * MIB,
                    None,
                    "memory-backend-memfd",
                    "ram-node0",
                    None,
                    Some(true),
                    Some("0"),
                    None,
                ),
            ),
        ];
        for (domain, (size, maxmem, qom, id, huge, share, cpus, machine_backend)) in cases {
            let plan = configure(
                &MemoryConfigurator,
                domain.clone(),
                &ConverterContext::default(),
            )
            .unwrap();
            let m = &plan.memory;
            let b = m.backend.as_ref().unwrap();
            assert_eq!((m.size, m.maxmem), (size, maxmem), "{domain}");
            assert_eq!(
                (b.qom_type, b.id.as_str(), b.size),
                (qom, id, size),
                "{domain}"
            );
            assert_eq!((b.hugetlbsize, b.share), (huge, share), "{domain}");
            assert_eq!(b.prealloc, huge.map(|_| true), "{domain}");
            assert_eq!(m.numa.as_ref().map(|n| n.cpus.as_str()), cpus, "{domain}");
            assert_eq!(
                plan.machine.memory_backend.as_deref(),
                machine_backend,
                "{domain}"
            );
            assert_eq!(plan.large_memory, size > 2 * GIB, "{domain}");
        }
    }

    #[test]
    fn bad_memory_names_the_field() {
        let cases = [
            (
                json!({"memory": {"guest": "1Gi", "maxGuest": "512Mi"}}),
                "spec.domain.memory.maxGuest",
            ),
            (
                json!({"memory": {"guest": "1Gi", "hugepages": {"pageSize": "4Ki"}}}),
                "spec.domain.memory.hugepages.pageSize",
            ),
            (
                json!({"memory": {"guest": "3Mi", "hugepages": {"pageSize": "2Mi"}}}),
                "spec.domain.memory.guest",
            ),
            (json!({"memory": {}}), "spec.domain.memory.guest"),
        ];
        for (domain, path) in cases {
            assert_eq!(
                error_path(configure(
                    &MemoryConfigurator,
                    domain.clone(),
                    &ConverterContext::default()
                )),
                path,
                "{domain}"
            );
        }
    }
}
