//! IOThreads (`iothreads/iothreads.go`, `converter.go:948-965`).
//!
//! IOThreads exist when `ioThreadsPolicy` is set or a disk has `dedicatedIOThread: true`.
//! `shared`: pool of 1; `auto`: pool of 2 x vCPUs; `supplementalPool`: N threads all given to every
//! virtio disk (QEMU takes one `iothread` per virtio-blk device here, so the disk gets the
//! first; `iothread-vq-mapping` needs QEMU 9.0). Dedicated disks get ids after the pool; others
//! round-robin. Only virtio disks get an IOThread.
//!
//! Reads: nothing from the context.

use super::super::context::ConverterContext;
use super::super::error::{ConvertError, FieldPath};
use super::super::plan::DomainPlan;
use super::super::qemu::{Object, ObjectIothread};
use super::{devices_path, vcpus};
use crate::vmi::Vmi;

/// Adds `iothread<N>` objects.
pub struct IoThreadsConfigurator;

/// Per-disk IOThread ids (index = disk index, `None` = no IOThread) and the thread count.
pub fn assignment(vmi: &Vmi) -> Result<(u32, Vec<Option<u32>>), ConvertError> {
    let disks: &[crate::vmi::Disk] = vmi.spec.domain.devices.disks.as_deref().unwrap_or_default();
    let is_virtio =
        |d: &crate::vmi::Disk| d.disk.as_ref().and_then(|t| t.bus.as_deref()) == Some("virtio");
    let policy = vmi.spec.domain.io_threads_policy.as_deref();
    let any_dedicated = disks.iter().any(|d| d.dedicated_io_thread == Some(true));
    if policy.is_none() && !any_dedicated {
        return Ok((0, vec![None; disks.len()]));
    }
    let pp = FieldPath::new("spec.domain.ioThreadsPolicy");
    let limit = match policy {
        None | Some("shared") => 1,
        Some("auto") => 2 * vcpus(vmi)?,
        Some("supplementalPool") => vmi
            .spec
            .domain
            .io_threads
            .as_ref()
            .and_then(|t| t.supplemental_pool_thread_count)
            .filter(|n| *n > 0 && *n <= 256)
            .ok_or_else(|| {
                ConvertError::invalid(
                    FieldPath::new("spec.domain.ioThreads.supplementalPoolThreadCount"),
                    "supplementalPool needs a thread count between 1 and 256",
                )
            })?,
        Some(o) => return Err(ConvertError::unsupported(pp, format!("policy {o:?}"))),
    };
    let _ = devices_path();
    let dedicated = disks
        .iter()
        .filter(|d| d.dedicated_io_thread == Some(true))
        .count() as u32;
    let shared_disks = disks.len() as u32 - dedicated;
    let mut auto = if policy == Some("supplementalPool") {
        limit
    } else {
        shared_disks.min(limit).max(1)
    };
    if policy != Some("supplementalPool") && auto + dedicated > limit {
        auto = limit.saturating_sub(dedicated).max(1);
    }
    let mut next_dedicated = auto + 1;
    let mut rr = 0;
    let mut out = Vec::with_capacity(disks.len());
    for d in disks {
        if d.dedicated_io_thread == Some(true) {
            out.push(is_virtio(d).then_some(next_dedicated));
            next_dedicated += 1;
        } else if is_virtio(d) {
            out.push(Some(rr % auto + 1));
            rr += 1;
        } else {
            out.push(None);
        }
    }
    Ok((auto + dedicated, out))
}

impl super::super::convert::Configurator for IoThreadsConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        _ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let (count, _) = assignment(vmi)?;
        for i in 1..=count {
            plan.objects.push(Object::Iothread(ObjectIothread {
                qom_type: "iothread",
                id: format!("iothread{i}"),
            }));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::testutil::vmi_with;
    use serde_json::json;

    #[test]
    fn iothreads_table() {
        let disks = json!([
            {"name": "a", "disk": {"bus": "virtio"}},
            {"name": "b", "disk": {"bus": "virtio"}, "dedicatedIOThread": true},
            {"name": "c", "disk": {"bus": "sata"}},
            {"name": "d", "disk": {"bus": "virtio"}}
        ]);
        // (domain fragment) -> (thread count, per-disk thread); a dedicated disk alone makes
        // the others share one pool thread, as the `shared` policy
        let cases = [
            (
                json!({"devices": {"disks": disks}}),
                (2, vec![Some(1), Some(2), None, Some(1)]),
            ),
            (
                json!({"ioThreadsPolicy": "shared", "devices": {"disks": disks}}),
                (2, vec![Some(1), Some(2), None, Some(1)]),
            ),
            (
                json!({"ioThreadsPolicy": "auto", "cpu": {"cores": 2}, "devices": {"disks": disks}}),
                (4, vec![Some(1), Some(4), None, Some(2)]),
            ),
            (json!({}), (0, vec![])),
        ];
        for (domain, want) in cases {
            assert_eq!(
                assignment(&vmi_with(domain.clone())).unwrap(),
                want,
                "{domain}"
            );
        }
    }
}
