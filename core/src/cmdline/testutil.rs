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
