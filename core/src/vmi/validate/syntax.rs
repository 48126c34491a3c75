//! Syntax predicates the rules share: DNS-1123 names, MAC and PCI addresses, base64, safe
//! absolute paths and enumerated string values.

/// Whether `s` is a DNS-1123 label: lowercase alphanumerics and `-`, starting and ending
/// alphanumeric, at most 63 characters.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `s` is a DNS-1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
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
