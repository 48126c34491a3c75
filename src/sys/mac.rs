//! MAC addresses: [`MacAddr`], parsed as the VMI spec writes them and printed as QEMU and
//! KubeVirt's `api.Domain` do (`aa:bb:cc:dd:ee:ff`).

use std::fmt;
use std::str::FromStr;

/// A 48-bit MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

/// A string that is not six hex octets separated by `:` or `-`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a MAC address")]
pub struct BadMac(pub String);

impl FromStr for MacAddr {
    type Err = BadMac;

    /// Parses `aa:bb:cc:dd:ee:ff` or `aa-bb-cc-dd-ee-ff`, any case.
    fn from_str(s: &str) -> Result<MacAddr, BadMac> {
        let bad = || BadMac(s.to_string());
        let parts: Vec<&str> = s.split([':', '-']).collect();
        if parts.len() != 6 {
            return Err(bad());
        }
        let mut mac = [0u8; 6];
        for (b, p) in mac.iter_mut().zip(parts) {
            *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        Ok(MacAddr(mac))
    }
}

impl fmt::Display for MacAddr {
    /// `aa:bb:cc:dd:ee:ff`, lower case.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(octets: [u8; 6]) -> MacAddr {
        MacAddr(octets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_and_format() {
        let cases = [
            ("02:00:00:AB:cd:01", Some([2, 0, 0, 0xab, 0xcd, 1])),
            ("02-00-00-ab-cd-01", Some([2, 0, 0, 0xab, 0xcd, 1])),
            ("02:00:00:ab:cd", None),
            ("zz:00:00:ab:cd:01", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<MacAddr>().ok().map(|m| m.0), want, "{text}");
        }
        assert_eq!(
            MacAddr([2, 0, 0, 0xab, 0xcd, 1]).to_string(),
            "02:00:00:ab:cd:01"
        );
    }
}
