//! Validation of a (defaulted) VMI: the checks whose failure would make a broken domain.
//!
//! Rules follow KubeVirt v1.9.0's validating webhook
//! (`pkg/virt-api/webhooks/validating-webhook/admitters/vmi-create-admitter.go`,
//! `pkg/storage/admitters/disks.go`, `pkg/network/admitter/*.go`, `pkg/defaults/hyperv.go`),
//! plus the launcher-side safety rules of qlauncher (absolute image paths without `..`).
//! Every error names the JSON path of the field and the reason; all errors are collected.

mod compute;
mod devices;
mod network;
mod storage;
mod syntax;
mod top;

use std::collections::BTreeMap;
use std::fmt;

use super::*;

pub use syntax::{
    check_disk_serial, disk_serial_limit, is_dns_label, is_dns_subdomain, is_mac_address,
    is_pci_address,
};

/// One validation failure: the JSON path of the field (`spec.domain.devices.disks[1].disk.bus`)
/// and why it is rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the offending field.
    pub path: String,
    /// Why the value is rejected.
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

impl std::error::Error for FieldError {}

/// Disk buses KubeVirt accepts (`pkg/storage/admitters/disks.go`).
pub const DISK_BUSES: [&str; 4] = ["virtio", "scsi", "sata", "usb"];
/// NIC models KubeVirt accepts (`pkg/network/admitter/netiface.go`).
pub const INTERFACE_MODELS: [&str; 7] = [
    "e1000", "e1000e", "igb", "ne2k_pci", "pcnet", "rtl8139", "virtio",
];
/// Smallest memory request KubeVirt accepts, 1M.
pub const MIN_MEMORY_BYTES: u64 = 1_000_000;
/// Maximum disk serial length (`maxStrLen` in KubeVirt's admitters).
pub const MAX_SERIAL_LEN: usize = 256;

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn add(&mut self, path: impl Into<String>, reason: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            reason: reason.into(),
        });
    }
}

/// Records `owner`'s boot order, rejecting 0 and an order another disk or interface already has.
fn check_boot_order(
    e: &mut Errors,
    boot: &mut BTreeMap<u32, String>,
    order: Option<u32>,
    owner: &str,
) {
    let Some(order) = order else { return };
    if order < 1 {
        e.add(format!("{owner}.bootOrder"), "must be greater than 0");
        return;
    }
    if let Some(other) = boot.get(&order) {
        e.add(
            format!("{owner}.bootOrder"),
            format!("boot order {order} is already used by {other}"),
        );
    } else {
        boot.insert(order, owner.to_string());
    }
}

impl Vmi {
    /// Checks a VMI (normally after [`Vmi::apply_defaults`]) and returns every problem found.
    ///
    /// Errors: one [`FieldError`] per failed rule, in document order.
    pub fn validate(&self) -> Result<(), Vec<FieldError>> {
        let mut e = Errors::default();
        top::validate_metadata(self, &mut e);
        let spec = &self.spec;
        top::validate_spec_top(spec, &mut e);
        top::validate_resources(spec, &mut e);
        compute::validate_cpu(spec, &mut e);
        compute::validate_memory(spec, &mut e);
        compute::validate_firmware(spec, &mut e);
        compute::validate_features(spec, &mut e);
        compute::validate_clock(spec, &mut e);
        let mut boot_orders: BTreeMap<u32, String> = BTreeMap::new();
        storage::validate_disks(spec, &mut e, &mut boot_orders);
        storage::validate_volumes(spec, &mut e);
        network::validate_interfaces(spec, &mut e, &mut boot_orders);
        network::validate_networks(spec, &mut e);
        devices::validate_other_devices(spec, &mut e);
        if e.0.is_empty() {
            Ok(())
        } else {
            Err(e.0)
        }
    }

    /// What virt-api's webhooks hand on: KubeVirt's defaults for this VMI
    /// ([`DefaultsConfig::for_vmi`], then [`Vmi::apply_defaults`]), then [`Vmi::validate`].
    /// The launcher admits every VMI it is sent this way (`qlauncher::sync::admit`), as does
    /// `qlauncher convert`.
    ///
    /// Errors: every [`FieldError`] of [`Vmi::validate`]; the defaults are applied either way.
    pub fn admit(&mut self) -> Result<(), Vec<FieldError>> {
        let cfg = DefaultsConfig::for_vmi(self);
        self.apply_defaults(&cfg);
        self.validate()
    }
}
