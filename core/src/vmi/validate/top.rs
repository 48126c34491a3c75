//! Rules for the metadata, the top-level spec fields and the resource requests and limits
//! (`vmi-create-admitter.go`).

use super::syntax::*;
use super::*;

pub(super) fn validate_metadata(vmi: &Vmi, e: &mut Errors) {
    match (&vmi.metadata.name, &vmi.metadata.generate_name) {
        (Some(name), _) if !is_dns_label(name) => e.add("metadata.name", DNS_LABEL_REASON),
        (None, None) => e.add("metadata.name", "is required"),
        _ => {}
    }
    // The namespace names a directory (cloud-init data, KubeVirt's getDomainBasePath): Kubernetes
    // guarantees a DNS-1123 label, and the launcher checks it again so `..` cannot escape.
    if let Some(ns) = vmi.metadata.namespace.as_deref() {
        if !ns.is_empty() && !is_dns_label(ns) {
            e.add("metadata.namespace", DNS_LABEL_REASON);
        }
    }
    if let Some(kind) = &vmi.kind {
        if kind != "VirtualMachineInstance" {
            e.add(
                "kind",
                format!("must be VirtualMachineInstance, not {kind}"),
            );
        }
    }
}

pub(super) fn validate_spec_top(spec: &VmiSpec, e: &mut Errors) {
    if let Some(arch) = &spec.architecture {
        if !["amd64", "arm64", "s390x", ""].contains(&arch.as_str()) {
            e.add(
                "spec.architecture",
                format!("unsupported architecture: {arch}"),
            );
        }
    }
    if let Some(h) = &spec.hostname {
        if !is_dns_label(h) {
            e.add("spec.hostname", DNS_LABEL_REASON);
        }
    }
    if let Some(s) = &spec.subdomain {
        if !is_dns_subdomain(s) {
            e.add("spec.subdomain", "must be a DNS-1123 subdomain");
        }
    }
    if spec.termination_grace_period_seconds.is_some_and(|t| t < 0) {
        e.add(
            "spec.terminationGracePeriodSeconds",
            "must be greater than or equal to 0",
        );
    }
    if !one_of(&spec.start_strategy, &["Paused"]) {
        e.add("spec.startStrategy", "must be Paused if set");
    }
    if !one_of(
        &spec.eviction_strategy,
        &["None", "LiveMigrate", "LiveMigrateIfPossible", "External"],
    ) {
        e.add(
            "spec.evictionStrategy",
            "must be one of None, LiveMigrate, LiveMigrateIfPossible, External",
        );
    }
    if !one_of(
        &spec.domain.io_threads_policy,
        &["shared", "auto", "supplementalPool"],
    ) {
        e.add(
            "spec.domain.ioThreadsPolicy",
            "must be one of shared, auto, supplementalPool",
        );
    }
    if spec.domain.io_threads_policy.as_deref() == Some("supplementalPool")
        && spec
            .domain
            .io_threads
            .as_ref()
            .and_then(|t| t.supplemental_pool_thread_count)
            .unwrap_or(0)
            == 0
    {
        e.add(
            "spec.domain.ioThreads.supplementalPoolThreadCount",
            "must be set and positive for the supplementalPool policy",
        );
    }
    if !one_of(&spec.domain.reboot_policy, &["Reboot", "Terminate"]) {
        e.add(
            "spec.domain.rebootPolicy",
            "must be one of Reboot, Terminate",
        );
    }
}

pub(super) fn validate_resources(spec: &VmiSpec, e: &mut Errors) {
    let res = &spec.domain.resources;
    for (kind, map) in [("requests", &res.requests), ("limits", &res.limits)] {
        for (name, q) in map.iter().flatten() {
            if let Err(err) = q.to_millis() {
                e.add(
                    format!("spec.domain.resources.{kind}.{name}"),
                    err.to_string(),
                );
            }
        }
    }
    let bytes = |q: Option<&Quantity>| q.and_then(|q| q.to_bytes().ok());
    let millis = |q: Option<&Quantity>| q.and_then(|q| q.to_millis().ok());
    if let Some(req) = bytes(res.request("memory")) {
        if req > 0 && req < MIN_MEMORY_BYTES {
            e.add(
                "spec.domain.resources.requests.memory",
                "must be greater than or equal to 1M",
            );
        }
        if let Some(lim) = bytes(res.limit("memory")) {
            if req > lim {
                e.add(
                    "spec.domain.resources.requests.memory",
                    "must be less than or equal to limits.memory",
                );
            }
        }
    }
    if let (Some(req), Some(lim)) = (millis(res.request("cpu")), millis(res.limit("cpu"))) {
        if req > lim {
            e.add(
                "spec.domain.resources.requests.cpu",
                "must be less than or equal to limits.cpu",
            );
        }
    }
}
