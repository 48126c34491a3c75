//! Kubernetes resource quantities (`k8s.io/apimachinery/pkg/api/resource.Quantity`).
//!
//! A quantity is `<sign><digits>[.<digits>]<suffix>` where the suffix is a binary SI suffix
//! (`Ki Mi Gi Ti Pi Ei`, powers of 1024), a decimal SI suffix (`n u m "" k M G T P E`) or a decimal
//! exponent (`e3`, `E-2`). [`Quantity`] keeps the text as written so a VMI round-trips unchanged;
//! [`Quantity::to_bytes`] and [`Quantity::to_millis`] evaluate it exactly with integer arithmetic
//! and round up like `Quantity.Value()` / `Quantity.MilliValue()` do.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::VmiError;

/// A Kubernetes quantity as written in the manifest, e.g. `"1Gi"`, `"500m"`, `"2"`.
///
/// Deserialises from a string or a JSON/YAML number (the API server accepts both) and always
/// serialises as a string.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Quantity(pub String);

impl Quantity {
    /// Wraps a quantity string without checking it.
    pub fn new(s: impl Into<String>) -> Self {
        Quantity(s.into())
    }

    /// The text as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The value in base units (bytes for memory, cores for CPU), rounded up to an integer.
    ///
    /// Errors: [`VmiError::InvalidQuantity`] for text that is not a quantity, a negative value, or
    /// a value above `u64::MAX`.
    pub fn to_bytes(&self) -> Result<u64, VmiError> {
        self.scaled(1)
    }

    /// The value in thousandths of the base unit (millicores for CPU), rounded up.
    ///
    /// Errors: as [`Quantity::to_bytes`].
    pub fn to_millis(&self) -> Result<u64, VmiError> {
        self.scaled(1000)
    }

    /// Whether the quantity is an exact integer of base units (`"1.5"` and `"500m"` are not).
    ///
    /// Errors: as [`Quantity::to_bytes`].
    pub fn is_integer(&self) -> Result<bool, VmiError> {
        let p = parse(&self.0)?;
        Ok(p.eval(1)?.1)
    }

    fn scaled(&self, scale: u128) -> Result<u64, VmiError> {
        let p = parse(&self.0)?;
        let (v, _) = p.eval(scale)?;
        u64::try_from(v).map_err(|_| invalid(&self.0, "value does not fit in 64 bits"))
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Quantity {
    fn from(s: &str) -> Self {
        Quantity(s.to_string())
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity string or number")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

fn invalid(q: &str, reason: &'static str) -> VmiError {
    VmiError::InvalidQuantity {
        quantity: q.to_string(),
        reason,
    }
}

/// A parsed non-negative quantity: `digits / 10^frac_digits * 2^bin_exp * 10^dec_exp`.
struct Parsed<'a> {
    text: &'a str,
    digits: u128,
    frac_digits: u32,
    bin_exp: u32,
    dec_exp: i32,
}

impl Parsed<'_> {
    /// `ceil(value * scale)` and whether the result was exact.
    fn eval(&self, scale: u128) -> Result<(u128, bool), VmiError> {
        let too_large = || invalid(self.text, "value is too large");
        let mut num = self
            .digits
            .checked_mul(scale)
            .ok_or_else(too_large)?
            .checked_mul(2u128.checked_pow(self.bin_exp).ok_or_else(too_large)?)
            .ok_or_else(too_large)?;
        let mut den_exp = i64::from(self.frac_digits) - i64::from(self.dec_exp);
        if num == 0 {
            return Ok((0, true));
        }
        if den_exp < 0 {
            let up = u32::try_from(-den_exp).map_err(|_| too_large())?;
            num = num
                .checked_mul(10u128.checked_pow(up).ok_or_else(too_large)?)
                .ok_or_else(too_large)?;
            den_exp = 0;
        }
        let den_exp = u32::try_from(den_exp).map_err(|_| too_large())?;
        // A denominator beyond u128 makes any representable numerator round up to 1.
        let Some(den) = 10u128.checked_pow(den_exp) else {
            return Ok((1, false));
        };
        let q = num / den;
        let exact = num.is_multiple_of(den);
        Ok((if exact { q } else { q + 1 }, exact))
    }
}

fn parse(text: &str) -> Result<Parsed<'_>, VmiError> {
    if text.is_empty() {
        return Err(invalid(text, "empty quantity"));
    }
    let mut rest = text;
    if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    } else if rest.starts_with('-') {
        return Err(invalid(text, "negative quantity"));
    }
    let num_len = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(num_len);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if frac_part.contains('.') {
        return Err(invalid(text, "more than one decimal point"));
    }
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(invalid(text, "missing number"));
    }
    let mut digits: u128 = 0;
    for c in int_part.bytes().chain(frac_part.bytes()) {
        digits = digits
            .checked_mul(10)
            .and_then(|d| d.checked_add(u128::from(c - b'0')))
            .ok_or_else(|| invalid(text, "too many digits"))?;
    }
    let frac_digits =
        u32::try_from(frac_part.len()).map_err(|_| invalid(text, "too many digits"))?;
    let (bin_exp, dec_exp) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        s if s.starts_with(['e', 'E']) => {
            let e = &s[1..];
            let body = e.strip_prefix(['+', '-']).unwrap_or(e);
            if body.is_empty() || !body.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid(text, "unknown suffix"));
            }
            let v: i32 = e
                .parse()
                .map_err(|_| invalid(text, "exponent out of range"))?;
            if !(-100..=100).contains(&v) {
                return Err(invalid(text, "exponent out of range"));
            }
            (0, v)
        }
        _ => return Err(invalid(text, "unknown suffix")),
    };
    Ok(Parsed {
        text,
        digits,
        frac_digits,
        bin_exp,
        dec_exp,
    })
}

/// Whether `text` is a well-formed non-negative quantity.
pub fn is_valid(text: &str) -> bool {
    parse(text).is_ok()
}
