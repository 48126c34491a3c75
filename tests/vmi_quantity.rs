//! Kubernetes quantities: exact evaluation into bytes and millicores.

use proptest::prelude::*;
use qlauncher::vmi::{Quantity, VmiError};

fn bytes(s: &str) -> u64 {
    Quantity::new(s).to_bytes().unwrap()
}

fn millis(s: &str) -> u64 {
    Quantity::new(s).to_millis().unwrap()
}

#[test]
fn binary_and_decimal_suffixes() {
    assert_eq!(bytes("1024M"), 1_024_000_000);
    assert_eq!(bytes("1Gi"), 1 << 30);
    assert_eq!(bytes("1.5Gi"), 1_610_612_736);
    assert_eq!(bytes("128Mi"), 134_217_728);
    assert_eq!(bytes("2"), 2);
    assert_eq!(bytes("1e3"), 1000);
    assert_eq!(bytes("1E6"), 1_000_000);
    assert_eq!(bytes("2k"), 2000);
    assert_eq!(bytes("3Ki"), 3072);
    assert_eq!(bytes("1Ti"), 1 << 40);
    assert_eq!(bytes("1Pi"), 1 << 50);
    assert_eq!(bytes("1Ei"), 1 << 60);
    assert_eq!(bytes("1P"), 1_000_000_000_000_000);
    assert_eq!(bytes("+5"), 5);
    assert_eq!(bytes(".5Ki"), 512);
    assert_eq!(bytes("0"), 0);
}

#[test]
fn millicores() {
    assert_eq!(millis("500m"), 500);
    assert_eq!(millis("2"), 2000);
    assert_eq!(millis("0.1"), 100);
    assert_eq!(millis("1.5"), 1500);
    assert_eq!(millis("100u"), 1); // rounds up like MilliValue()
    assert_eq!(millis("1e-3"), 1);
    assert_eq!(millis("250000n"), 1);
}

#[test]
fn rounding_up_to_whole_units() {
    assert_eq!(bytes("500m"), 1);
    assert_eq!(bytes("2500m"), 3);
    assert_eq!(bytes("0.1"), 1);
    assert_eq!(bytes("1n"), 1);
    assert!(!Quantity::new("1.5").is_integer().unwrap());
    assert!(Quantity::new("1.5Ki").is_integer().unwrap());
}

fn reason(s: &str) -> &'static str {
    match Quantity::new(s).to_bytes() {
        Err(VmiError::InvalidQuantity { reason, quantity }) => {
            assert_eq!(quantity, s);
            reason
        }
        other => panic!("{s:?}: expected an error, got {other:?}"),
    }
}

#[test]
fn garbage_is_rejected_with_a_reason() {
    assert_eq!(reason(""), "empty quantity");
    assert_eq!(reason("-1Gi"), "negative quantity");
    assert_eq!(reason("1GB"), "unknown suffix");
    assert_eq!(reason("1 Gi"), "unknown suffix");
    assert_eq!(reason("Gi"), "missing number");
    assert_eq!(reason("."), "missing number");
    assert_eq!(reason("1.2.3"), "more than one decimal point");
    assert_eq!(reason("1e"), "unknown suffix");
    assert_eq!(reason("1e+"), "unknown suffix");
    assert_eq!(reason("1e999"), "exponent out of range");
    assert_eq!(reason("20Ei"), "value does not fit in 64 bits");
    assert_eq!(
        reason("123456789012345678901234567890123456789012345"),
        "too many digits"
    );
    assert_eq!(
        Quantity::new("1x").to_bytes().unwrap_err().to_string(),
        "invalid quantity \"1x\": unknown suffix"
    );
}

#[test]
fn numbers_deserialize_as_quantities() {
    let q: Quantity = serde_json::from_str("2").unwrap();
    assert_eq!(q, Quantity::new("2"));
    let q: Quantity = serde_json::from_str("0.5").unwrap();
    assert_eq!(q.to_millis().unwrap(), 500);
    assert_eq!(
        serde_json::to_string(&Quantity::new("1Gi")).unwrap(),
        "\"1Gi\""
    );
}

const BINARY: [(&str, u32); 6] = [
    ("Ki", 10),
    ("Mi", 20),
    ("Gi", 30),
    ("Ti", 40),
    ("Pi", 50),
    ("Ei", 60),
];
const DECIMAL: [(&str, u32); 6] = [
    ("k", 3),
    ("M", 6),
    ("G", 9),
    ("T", 12),
    ("P", 15),
    ("E", 18),
];

proptest! {
    #[test]
    fn binary_suffix_is_a_power_of_1024(n in 0u64..1024, i in 0usize..6) {
        let (suffix, shift) = BINARY[i];
        let expected = u128::from(n) << shift;
        let got = Quantity::new(format!("{n}{suffix}")).to_bytes();
        match u64::try_from(expected) {
            Ok(v) => prop_assert_eq!(got.unwrap(), v),
            Err(_) => prop_assert!(got.is_err()),
        }
    }

    #[test]
    fn decimal_suffix_equals_exponent(n in 0u64..1000, i in 0usize..6) {
        let (suffix, exp) = DECIMAL[i];
        let a = Quantity::new(format!("{n}{suffix}")).to_bytes();
        let b = Quantity::new(format!("{n}e{exp}")).to_bytes();
        prop_assert_eq!(a.ok(), b.ok());
        if let Some(v) = n.checked_mul(10u64.pow(exp)) {
            prop_assert_eq!(Quantity::new(format!("{n}{suffix}")).to_bytes().unwrap(), v);
        }
    }

    #[test]
    fn plain_integers_are_themselves(n in any::<u64>()) {
        prop_assert_eq!(Quantity::new(n.to_string()).to_bytes().unwrap(), n);
    }

    #[test]
    fn millis_are_exact_for_milli_quantities(m in 0u64..10_000_000) {
        prop_assert_eq!(Quantity::new(format!("{m}m")).to_millis().unwrap(), m);
        prop_assert_eq!(Quantity::new(format!("{m}m")).to_bytes().unwrap(), m.div_ceil(1000));
    }

    #[test]
    fn decimal_fraction_matches_integer_math(int in 0u64..100_000, frac in 0u64..1000) {
        // "<int>.<frac3>" in millis is int*1000 + frac exactly.
        let s = format!("{int}.{frac:03}");
        prop_assert_eq!(Quantity::new(s).to_millis().unwrap(), int * 1000 + frac);
    }

    #[test]
    fn arbitrary_text_never_panics(s in ".{0,24}") {
        let _ = Quantity::new(s.clone()).to_bytes();
        let _ = Quantity::new(s).to_millis();
    }

    #[test]
    fn negative_is_always_rejected(n in 1u64..1_000_000, i in 0usize..6) {
        let s = format!("-{n}{}", BINARY[i].0);
        prop_assert!(Quantity::new(s).to_bytes().is_err());
    }
}
