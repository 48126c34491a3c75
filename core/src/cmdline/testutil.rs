//! Test helpers: VMIs from JSON snippets, in the spirit of KubeVirt's `libvmi` builders.

use crate::vmi::Vmi;
use serde_json::{json, Value};

/// A minimal valid VMI (name, namespace, uid, 256Mi) with `domain` merged into `spec.domain`.
pub fn vmi_with(domain: Value) -> Vmi {
    let mut v = json!({
        "metadata": {"name": "t", "namespace": "ns", "uid": "uid1"},
        "spec": {"domain": {"memory": {"guest": "256Mi"}}}
    });
    if let (Some(d), Value::Object(extra)) = (v.pointer_mut("/spec/domain"), domain) {
        for (k, val) in extra {
            d[k] = val;
        }
    }
    serde_json::from_value(v).expect("test VMI")
}

/// Runs one configurator on an empty plan for `vmi_with(domain)` under `ctx`: the table tests
/// beside each configurator (KubeVirt's `compute/x_test.go`) call it with a VMI fragment.
pub fn configure(
    c: &dyn crate::cmdline::convert::Configurator,
    domain: Value,
    ctx: &crate::cmdline::ConverterContext,
) -> Result<crate::cmdline::DomainPlan, crate::cmdline::ConvertError> {
    let mut plan = crate::cmdline::DomainPlan::default();
    c.configure(&vmi_with(domain), ctx, &mut plan)?;
    Ok(plan)
}

/// The field path of `configure`'s error (panics when it succeeded).
pub fn error_path(r: Result<crate::cmdline::DomainPlan, crate::cmdline::ConvertError>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.path().as_str().to_string(),
    }
}

/// The planned devices as (QEMU driver, id), in plan order.
pub fn drivers(plan: &crate::cmdline::DomainPlan) -> Vec<(&'static str, String)> {
    plan.devices
        .iter()
        .map(|d| (d.device.driver(), d.device.id().to_string()))
        .collect()
}
