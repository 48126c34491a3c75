//! Syntax predicates the rules share: DNS-1123 names, MAC and PCI addresses, base64, safe
//! absolute paths and enumerated string values.

/// Whether `s` is a DNS-1123 label: lowercase alphanumerics and `-`, starting and ending
/// alphanumeric, at most 63 characters.
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && is_label_syntax(s)
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, any length.
fn is_label_syntax(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `s` is a DNS-1123 subdomain as Kubernetes checks it (`IsDNS1123Subdomain`, the rule
/// for object names such as a VMI's): at most 253 characters of dot-separated parts, each
/// lowercase alphanumerics and `-` starting and ending alphanumeric. Kubernetes' pattern does
/// not bound a part to 63 characters, so `a` followed by 99 more letters is a valid VMI name.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label_syntax)
}

pub(super) const DNS_SUBDOMAIN_REASON: &str = "must be a DNS-1123 subdomain (lowercase alphanumerics, '-' and '.', each dot-separated part starting and ending alphanumeric, at most 253 characters)";

/// The disk serial rule of KubeVirt's admitter (`pkg/storage/admitters/disks.go`
/// `validateSerialNumValue`, `validateSerialNumLength`): `[A-Za-z0-9_.+-]`, at most 256
/// characters (`maxStrLen`), and at most what the bus's QEMU device takes
/// ([`disk_serial_limit`]): KubeVirt passes the serial through libvirt unchanged, so a longer one
/// stops the VM at start on QEMU 9.1 and later. Validation, the converter and `run` all apply this
/// function, so a serial `validate` accepts is never refused later.
///
/// `bus` is the disk's bus as the VMI names it (`virtio`, `sata`, `scsi`, `usb`; empty when
/// unknown, which sets no bus limit).
///
/// Errors: the reason, for the field `...disks[i].serial`.
pub fn check_disk_serial(serial: &str, bus: &str) -> Result<(), String> {
    if !serial
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || b"_.+-".contains(&c))
    {
        return Err("must be made up of the characters [A-Za-z0-9_.+-]".into());
    }
    let len = serial.chars().count();
    if len > super::MAX_SERIAL_LEN {
        return Err(format!(
            "must be at most {} characters long",
            super::MAX_SERIAL_LEN
        ));
    }
    if let Some((limit, device)) = disk_serial_limit(bus) {
        if len > limit {
            return Err(format!(
                "is {len} characters long; a disk on bus {bus} takes at most {limit} ({device})"
            ));
        }
    }
    Ok(())
}

/// The longest serial the QEMU device of a disk on `bus` accepts, with that device's name, or
/// `None` when the device takes any serial KubeVirt's admitter lets through.
///
/// * `scsi`: 36 characters. `scsi-hd` and `scsi-cd` refuse a longer serial at realize since
///   QEMU 9.1 ("The serial number can't be longer than 36 characters", `hw/scsi/scsi-disk.c`
///   `MAX_SERIAL_LEN`); QEMU 7.2 to 9.0 cut it to 36 silently in the guest's VPD page 0x80.
///   libvirt (so KubeVirt) and qlauncher set `device_id` to the serial, so scsi-disk's second
///   limit (20 characters for a serial that is also the default `device_id`) does not apply.
/// * `usb`: 20 characters. `usb-storage` hands its serial to the `scsi-hd` it creates inside
///   (`hw/usb/dev-storage-classic.c`, `scsi_bus_legacy_add_drive`), without a `device_id`, so
///   that device's `MAX_SERIAL_LEN_FOR_DEVID` (20) applies since QEMU 9.1.
/// * `virtio` and `sata`: none. virtio-blk keeps the whole value (the guest reads its first
///   20 bytes), as libvirt passes it; `ide-hd`/`ide-cd` cut it to the 20 bytes of ATA IDENTIFY.
pub fn disk_serial_limit(bus: &str) -> Option<(usize, &'static str)> {
    match bus {
        "scsi" => Some((36, "QEMU's scsi-hd and scsi-cd")),
        "usb" => Some((20, "QEMU's usb-storage")),
        _ => None,
    }
}

pub(super) const DNS_LABEL_REASON: &str = "must be a DNS-1123 label (lowercase alphanumerics and '-', starting and ending alphanumeric, at most 63 characters)";

/// Whether `s` is a unicast-or-multicast 6-byte MAC written as `aa:bb:cc:dd:ee:ff` or
/// `aa-bb-cc-dd-ee-ff` (the forms Go's `net.ParseMAC` accepts for 48-bit addresses).
pub fn is_mac_address(s: &str) -> bool {
    let sep = if s.contains(':') { ':' } else { '-' };
    let parts: Vec<&str> = s.split(sep).collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|c| c.is_ascii_hexdigit()))
}

/// Whether `s` is a PCI address `dddd:bb:ss.f` (hex domain, bus, slot < 0x20, function < 8).
pub fn is_pci_address(s: &str) -> bool {
    let hex = |p: &str, len: usize| p.len() == len && p.bytes().all(|c| c.is_ascii_hexdigit());
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 3 || !hex(parts[0], 4) || !hex(parts[1], 2) {
        return false;
    }
    let Some((slot, func)) = parts[2].split_once('.') else {
        return false;
    };
    hex(slot, 2)
        && hex(func, 1)
        && u8::from_str_radix(slot, 16).is_ok_and(|v| v < 0x20)
        && u8::from_str_radix(func, 16).is_ok_and(|v| v < 8)
}

pub(super) fn is_base64(s: &str) -> bool {
    let b = s.as_bytes();
    if !b.len().is_multiple_of(4) {
        return false;
    }
    let pad = b.iter().rev().take_while(|c| **c == b'=').count();
    pad <= 2
        && b[..b.len() - pad]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/')
}

/// An absolute path without `..` components, NUL or empty components' tricks.
pub(super) fn is_safe_abs_path(p: &str) -> bool {
    p.starts_with('/') && !p.contains('\0') && !p.split('/').any(|c| c == "..")
}

pub(super) fn one_of(v: &Option<String>, allowed: &[&str]) -> bool {
    v.as_deref().is_none_or(|x| allowed.contains(&x))
}
