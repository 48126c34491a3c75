//! What the hooks made of a domain's first definition, kept so that a migration can carry it.

use serde::{Deserialize, Serialize};

use super::{diff_answer, HookEdit, Refusal};

/// The domain XML the first hook got at a domain's first definition ([`super::kubevirt_input`])
/// and the last hook's answer: the hooked domain, as libvirt holds it after KubeVirt's
/// `SetDomainSpecStrWithHooks` and migrates it to the target in the migratable XML
/// (`pkg/virt-launcher/virtwrap/live-migration-source.go`, v1.9.0).
///
/// A migration target takes the source's edits from it ([`Self::edits`]): their difference
/// goes through the same checks as a sidecar's answer, so a peer can send nothing that a hook
/// could not. Each text is at most [`super::MAX_ANSWER_BYTES`] long.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookedDomain {
    /// The domain XML the first hook got.
    pub sent: String,
    /// The last hook's answer.
    pub answered: String,
}

impl HookedDomain {
    /// The typed edits that turn `sent` into `answered` ([`diff_answer`]): the net effect of the
    /// whole hook chain.
    ///
    /// # Errors
    /// The [`Refusal`] of a difference no hook may make (a peer sent what no sidecar could have
    /// answered).
    pub fn edits(&self) -> Result<Vec<HookEdit>, Refusal> {
        diff_answer(&self.sent, &self.answered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SENT: &str = "<domain type=\"kvm\">\n\t<name>ns_vm</name>\n\t<devices>\n\t\t<disk device=\"disk\" type=\"file\">\n\t\t\t<driver cache=\"none\" name=\"qemu\"></driver>\n\t\t\t<alias name=\"ua-root\"></alias>\n\t\t</disk>\n\t</devices>\n</domain>";

    #[test]
    fn the_net_edit_of_the_chain() {
        let hooked = HookedDomain {
            sent: SENT.into(),
            answered: SENT.replace("cache=\"none\"", "cache=\"unsafe\""),
        };
        let edits = hooked.edits().unwrap();
        assert_eq!(
            edits,
            vec![HookEdit::Disk {
                alias: "ua-root".into(),
                edit: super::super::DiskEdit::Cache(super::super::CacheMode::Unsafe)
            }]
        );
        let same = HookedDomain {
            sent: SENT.into(),
            answered: SENT.into(),
        };
        assert!(same.edits().unwrap().is_empty());
    }

    #[test]
    fn a_difference_no_hook_may_make_is_refused() {
        let hooked = HookedDomain {
            sent: SENT.into(),
            answered: SENT.replace("ns_vm", "other"),
        };
        let refusal = hooked.edits().unwrap_err();
        assert!(refusal.path.contains("name"), "{refusal:?}");
        let json = serde_json::to_string(&hooked).unwrap();
        let back: HookedDomain = serde_json::from_str(&json).unwrap();
        assert_eq!(back, hooked);
        assert!(
            serde_json::from_str::<HookedDomain>(r#"{"sent":"","answered":"","x":1}"#).is_err()
        );
    }
}
