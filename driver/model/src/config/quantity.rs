//! Kubernetes quantities, as far as a memory limit needs them.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A memory size written as a Kubernetes quantity (`"1Gi"`, `"512M"`, `"2e9"`).
///
/// The grammar is apimachinery's `resource.Quantity`, so what an operator writes in a
/// Pod's memory limit is accepted here too. On top of that, the value must be positive:
/// a zero or negative memory limit cannot be meant. Fractions of a byte round up, as
/// `Quantity.Value()` does. The original text is kept so that a config round-trips
/// unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryQuantity {
    text: String,
    bytes: u64,
}

impl MemoryQuantity {
    /// The value in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The text as written.
    #[cfg(test)]
    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for MemoryQuantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Why a string is not a usable memory quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {input:?}: {reason}")]
pub struct QuantityError {
    input: String,
    reason: &'static str,
}

const SYNTAX: &str = "expected a number with an optional suffix \
    (Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E, or an exponent such as e9), e.g. \"8Gi\"";

impl FromStr for MemoryQuantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fail = |reason| QuantityError {
            input: s.to_owned(),
            reason,
        };
        let parsed = parse(s).ok_or_else(|| fail(SYNTAX))?;
        if parsed.negative {
            return Err(fail("a memory limit cannot be negative"));
        }
        let bytes = parsed
            .ceil_bytes()
            .ok_or_else(|| fail("too large: the limit must fit in 64 bits of bytes"))?;
        if bytes == 0 {
            return Err(fail("a memory limit must be greater than zero"));
        }
        Ok(Self {
            text: s.to_owned(),
            bytes,
        })
    }
}

/// A quantity as written: `(int_digits.frac_digits) * 2^bin_exp * 10^dec_exp`.
struct Parsed<'a> {
    negative: bool,
    int_digits: &'a str,
    frac_digits: &'a str,
    bin_exp: u32,
    dec_exp: i32,
}

impl Parsed<'_> {
    fn ceil_bytes(&self) -> Option<u64> {
        // Leading zeros carry no value but would overflow the u128 below on inputs
        // like "000…0001", which Kubernetes accepts.
        let int = self.int_digits.trim_start_matches('0');
        let frac = self.frac_digits.trim_end_matches('0');
        let mut mantissa: u128 = 0;
        for d in int.bytes().chain(frac.bytes()) {
            mantissa = mantissa
                .checked_mul(10)?
                .checked_add(u128::from(d.checked_sub(b'0')?))?;
        }
        if mantissa == 0 {
            return Some(0);
        }
        let dec_exp = self.dec_exp.checked_sub(i32::try_from(frac.len()).ok()?)?;
        let mut num = mantissa.checked_mul(1u128.checked_shl(self.bin_exp)?)?;
        let mut den: u128 = 1;
        if dec_exp >= 0 {
            num = num.checked_mul(10u128.checked_pow(dec_exp.unsigned_abs())?)?;
        } else {
            // A very negative exponent means a fraction of a byte, which rounds up to 1;
            // capping it keeps the power representable without changing that result.
            den = 10u128.pow(dec_exp.unsigned_abs().min(38));
        }
        u64::try_from(num.div_ceil(den)).ok()
    }
}

/// apimachinery's grammar:
/// `[+-] (digits | digits. | .digits | digits.digits) (binarySI | decimalSI | (e|E)[+-]digits)`.
fn parse(s: &str) -> Option<Parsed<'_>> {
    let (negative, rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let number_len = rest
        .bytes()
        .position(|b| !(b.is_ascii_digit() || b == b'.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_len);
    let (int_digits, frac_digits) = number.split_once('.').unwrap_or((number, ""));
    if int_digits.is_empty() && frac_digits.is_empty() || frac_digits.contains('.') {
        return None;
    }
    let (bin_exp, dec_exp) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        _ => (0, parse_exponent(suffix)?),
    };
    Some(Parsed {
        negative,
        int_digits,
        frac_digits,
        bin_exp,
        dec_exp,
    })
}

fn parse_exponent(suffix: &str) -> Option<i32> {
    let digits = suffix.strip_prefix(['e', 'E'])?;
    let (negative, digits) = match digits.as_bytes().first()? {
        b'-' => (true, &digits[1..]),
        b'+' => (false, &digits[1..]),
        _ => (false, digits),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Beyond a few hundred the value is zero or overflows either way; saturating keeps
    // the arithmetic simple without changing the outcome.
    let magnitude = digits.parse::<i32>().unwrap_or(i32::MAX).min(1000);
    Some(if negative {
        magnitude.saturating_neg()
    } else {
        magnitude
    })
}

impl Serialize for MemoryQuantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for MemoryQuantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct QuantityVisitor;

        impl Visitor<'_> for QuantityVisitor {
            type Value = MemoryQuantity;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                // Kubernetes also takes bare numbers, but a quoted string is what
                // `kubectl` and every example show, and the only form that is
                // unambiguous in YAML.
                f.write_str("a quantity string such as \"8Gi\"")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<MemoryQuantity, E> {
                v.parse().map_err(E::custom)
            }
        }

        deserializer.deserialize_str(QuantityVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &str) -> u64 {
        s.parse::<MemoryQuantity>().unwrap().bytes()
    }

    #[test]
    fn suffixes() {
        assert_eq!(bytes("1"), 1);
        assert_eq!(bytes("1Ki"), 1024);
        assert_eq!(bytes("8Gi"), 8 << 30);
        assert_eq!(bytes("1Ei"), 1 << 60);
        assert_eq!(bytes("1k"), 1000);
        assert_eq!(bytes("512M"), 512_000_000);
        assert_eq!(bytes("2G"), 2_000_000_000);
        assert_eq!(bytes("1E"), 1_000_000_000_000_000_000);
        assert_eq!(bytes("2e9"), 2_000_000_000);
        assert_eq!(bytes("2E+3"), 2000);
        assert_eq!(bytes("+5"), 5);
    }

    #[test]
    fn fractions_round_up() {
        assert_eq!(bytes("1.5Gi"), 3 << 29);
        assert_eq!(bytes("0.5Ki"), 512);
        assert_eq!(bytes(".5k"), 500);
        assert_eq!(bytes("3."), 3);
        assert_eq!(bytes("1500m"), 2);
        assert_eq!(bytes("1e-3"), 1);
        assert_eq!(bytes("1e-900"), 1);
        assert_eq!(bytes("0001.000Ki"), 1024);
    }

    #[test]
    fn rejects_bad_syntax() {
        for bad in [
            "", "Gi", "1GiB", "1 Gi", " 1Gi", "1gi", "1.2.3", ".", "1e", "1e+", "1ee3", "1Ki5",
            "0x10", "1_000", "one",
        ] {
            let err = bad.parse::<MemoryQuantity>().unwrap_err().to_string();
            assert!(err.contains("expected a number"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn rejects_unusable_values() {
        for (bad, why) in [
            ("0", "greater than zero"),
            ("0Gi", "greater than zero"),
            ("-1Gi", "negative"),
            ("16Ei", "too large"),
            ("1e20", "too large"),
            ("1e2147483647", "too large"),
            ("99999999999999999999999999999999999999999", "too large"),
        ] {
            let err = bad.parse::<MemoryQuantity>().unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }

    #[test]
    fn keeps_text() {
        let q: MemoryQuantity = "1.50Gi".parse().unwrap();
        assert_eq!(q.as_str(), "1.50Gi");
        assert_eq!(serde_json::to_value(&q).unwrap(), "1.50Gi");
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,40}") {
            let _ = s.parse::<MemoryQuantity>();
        }

        #[test]
        fn integers_are_exact(n in 1u64..u64::MAX) {
            proptest::prop_assert_eq!(bytes(&n.to_string()), n);
        }
    }
}
