//! MAC addresses as the VMI spec writes them (`aa:bb:cc:dd:ee:ff`, or `-` separated).

/// Parses `aa:bb:cc:dd:ee:ff` (or `aa-bb-...`, any case); `None` unless six hex octets.
pub(crate) fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (b, p) in mac.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    Some(mac)
}

/// `aa:bb:cc:dd:ee:ff`.
pub(crate) fn format_mac(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_and_format() {
        assert_eq!(
            parse_mac("02:00:00:AB:cd:01"),
            Some([2, 0, 0, 0xab, 0xcd, 1])
        );
        assert_eq!(parse_mac("02:00:00:ab:cd"), None);
        assert_eq!(parse_mac("zz:00:00:ab:cd:01"), None);
        assert_eq!(format_mac([2, 0, 0, 0xab, 0xcd, 1]), "02:00:00:ab:cd:01");
    }
}
