//! What a shared device offers and what one share of it takes (KEP-5075 consumable
//! capacity): each capacity's value and request policy as the slice publishes them,
//! and the scheduler's rule for what a request consumes.
//!
//! The model has to charge a share as the scheduler does, or it would call a GPU
//! full that still takes a share (or the reverse): a request is rounded up to the
//! policy's grid, a capacity the request does not name takes the policy's default
//! (the whole value without a policy), and a request the policy cannot meet takes
//! nothing from that device because it cannot go there at all.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::DeviceCapacity;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// One consumable capacity of a shared device: its value, and how requests consume it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Capacity {
    pub(crate) value: u64,
    policy: Option<Policy>,
}

/// A capacity's request policy, as numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Policy {
    default: Option<u64>,
    min: Option<u64>,
    step: Option<u64>,
    max: Option<u64>,
    /// Valid values, ascending; empty when the policy has a range instead.
    values: Vec<u64>,
}

impl Capacity {
    /// The capacity as the slice publishes it; `None` when its value cannot be read,
    /// so nothing is promised that the device may not have.
    pub(crate) fn of(c: &DeviceCapacity) -> Option<Self> {
        let value = amount(&c.value)?;
        let policy = c.request_policy.as_ref().map(|p| {
            let range = p.valid_range.as_ref();
            let mut values: Vec<u64> = p.valid_values.iter().flatten().filter_map(amount).collect();
            values.sort_unstable();
            Policy {
                default: p.default.as_ref().and_then(amount),
                min: range.and_then(|r| amount(&r.min)),
                step: range.and_then(|r| r.step.as_ref()).and_then(amount),
                max: range.and_then(|r| r.max.as_ref()).and_then(amount),
                values,
            }
        });
        Some(Self { value, policy })
    }

    /// What one request consumes of this capacity: `requested` rounded up to the
    /// policy, or the policy's default when the request names no amount (the whole
    /// value without a policy). `None` when the policy refuses the amount (above its
    /// maximum or every valid value): such a request cannot have this device.
    pub(crate) fn charge(&self, requested: Option<u64>) -> Option<u64> {
        let Some(p) = &self.policy else {
            return Some(requested.unwrap_or(self.value));
        };
        let Some(want) = requested else {
            return Some(p.default.unwrap_or(self.value));
        };
        if !p.values.is_empty() {
            return p.values.iter().copied().find(|v| *v >= want);
        }
        let mut v = want;
        if let Some(min) = p.min {
            v = v.max(min);
            if let Some(step) = p.step.filter(|s| *s > 0) {
                let above = v.checked_sub(min)?;
                let steps = above.div_ceil(step);
                v = steps.checked_mul(step)?.checked_add(min)?;
            }
        }
        match p.max {
            Some(max) if v > max => None,
            _ => Some(v),
        }
    }
}

/// The consumable capacities of a device by name, without the driver's domain
/// (`memory` for `gpu.topodra.dev/memory`): a claim may name them either way.
pub(crate) fn capacities(
    capacity: Option<&BTreeMap<String, DeviceCapacity>>,
    driver: &str,
) -> BTreeMap<String, Capacity> {
    capacity
        .into_iter()
        .flatten()
        .filter_map(|(name, c)| Some((local_name(name, driver).to_owned(), Capacity::of(c)?)))
        .collect()
}

/// A capacity name without the driver's own domain.
pub(crate) fn local_name<'a>(name: &'a str, driver: &str) -> &'a str {
    name.strip_prefix(driver)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(name)
}

/// A quantity as a whole number, rounded up (`20Gi`, `1.5G`, `500m`, `2e9`); `None`
/// for a negative or unreadable one. Larger than `u64::MAX` reads as `u64::MAX`.
pub fn amount(q: &Quantity) -> Option<u64> {
    let s = q.0.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    // Digits beyond what u128 holds are not a quantity anyone publishes.
    let digits = format!("{whole}{fraction}");
    if digits.len() > 36 {
        return None;
    }
    let mantissa: u128 = digits.parse().ok()?;
    // value = mantissa * multiplier / divisor
    let mut divisor: u128 = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
    let mut multiplier: u128 = 1;
    match suffix {
        "" => {}
        "m" => divisor = divisor.checked_mul(1000)?,
        "k" => multiplier = 1_000,
        "M" => multiplier = 1_000_000,
        "G" => multiplier = 1_000_000_000,
        "T" => multiplier = 1_000_000_000_000,
        "P" => multiplier = 1_000_000_000_000_000,
        "E" => multiplier = 1_000_000_000_000_000_000,
        "Ki" => multiplier = 1 << 10,
        "Mi" => multiplier = 1 << 20,
        "Gi" => multiplier = 1 << 30,
        "Ti" => multiplier = 1 << 40,
        "Pi" => multiplier = 1 << 50,
        "Ei" => multiplier = 1 << 60,
        e => {
            let exp: i32 = e.strip_prefix(['e', 'E'])?.parse().ok()?;
            let scale = 10u128.checked_pow(exp.unsigned_abs().min(38))?;
            if exp >= 0 {
                multiplier = scale;
            } else {
                divisor = divisor.checked_mul(scale)?;
            }
        }
    }
    let Some(scaled) = mantissa.checked_mul(multiplier) else {
        return Some(u64::MAX);
    };
    Some(u64::try_from(scaled.div_ceil(divisor)).unwrap_or(u64::MAX))
}

/// An amount as people read it: bytes (a capacity named `memory`) with the largest
/// binary suffix that keeps it exact (`20Gi`, `81559Mi`), anything else as a number.
pub fn amount_text(capacity: &str, value: u64) -> String {
    capacity
        .ends_with("memory")
        .then(|| crate::slice::quantity::exact_binary(value))
        .flatten()
        .unwrap_or_else(|| value.to_string())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{CapacityRequestPolicy, CapacityRequestPolicyRange};

    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_owned())
    }

    const GI: u64 = 1 << 30;

    #[test]
    fn quantities_read_as_whole_numbers_rounded_up() {
        assert_eq!(amount(&q("20Gi")), Some(20 * GI));
        assert_eq!(amount(&q("81559Mi")), Some(81559 << 20));
        assert_eq!(amount(&q("1.5Gi")), Some(3 * GI / 2));
        assert_eq!(amount(&q("2G")), Some(2_000_000_000));
        assert_eq!(amount(&q("100")), Some(100));
        assert_eq!(amount(&q("500m")), Some(1));
        assert_eq!(amount(&q("2e3")), Some(2000));
        assert_eq!(amount(&q("15e-1")), Some(2));
        assert_eq!(amount(&q("+7")), Some(7));
        assert_eq!(amount(&q("99999Ei")), Some(u64::MAX));
        for bad in ["", "-1", "Gi", "1.2.3", "20GB", "x", "1e", "."] {
            assert_eq!(amount(&q(bad)), None, "{bad:?}");
        }
    }

    #[test]
    fn amounts_print_in_binary_units_for_memory_only() {
        assert_eq!(amount_text("memory", 20 * GI), "20Gi");
        assert_eq!(amount_text("memory", 81559 << 20), "81559Mi");
        assert_eq!(amount_text("memory", 1000), "1000");
        assert_eq!(amount_text("compute", 2048), "2048");
    }

    /// The time-sliced device's memory: whole GiB from 1Gi, 19Gi by default.
    fn memory() -> Capacity {
        Capacity::of(&DeviceCapacity {
            value: q("81559Mi"),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(q("19Gi")),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: q("1Gi"),
                    step: Some(q("1Gi")),
                    max: None,
                }),
                valid_values: None,
            }),
        })
        .unwrap()
    }

    #[test]
    fn a_request_is_rounded_up_to_the_policys_grid() {
        let m = memory();
        assert_eq!(m.charge(Some(20 * GI)), Some(20 * GI));
        assert_eq!(m.charge(Some(20 * GI + 1)), Some(21 * GI));
        assert_eq!(m.charge(Some(1)), Some(GI));
        assert_eq!(m.charge(None), Some(19 * GI));
    }

    #[test]
    fn a_policy_bounds_and_valid_values_refuse_what_they_cannot_give() {
        let bounded = Capacity::of(&DeviceCapacity {
            value: q("100"),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(q("10")),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: q("10"),
                    step: Some(q("10")),
                    max: Some(q("50")),
                }),
                valid_values: None,
            }),
        })
        .unwrap();
        assert_eq!(bounded.charge(Some(41)), Some(50));
        assert_eq!(bounded.charge(Some(51)), None);
        let listed = Capacity::of(&DeviceCapacity {
            value: q("100"),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(q("25")),
                valid_range: None,
                valid_values: Some(vec![q("50"), q("25")]),
            }),
        })
        .unwrap();
        assert_eq!(listed.charge(Some(30)), Some(50));
        assert_eq!(listed.charge(Some(60)), None);
        assert_eq!(listed.charge(None), Some(25));
        let free = Capacity::of(&DeviceCapacity {
            value: q("100"),
            request_policy: None,
        })
        .unwrap();
        assert_eq!(free.charge(Some(30)), Some(30));
        assert_eq!(free.charge(None), Some(100), "no policy: the whole value");
    }

    #[test]
    fn capacity_names_lose_the_drivers_domain_only() {
        assert_eq!(
            local_name("gpu.topodra.dev/memory", "gpu.topodra.dev"),
            "memory"
        );
        assert_eq!(local_name("memory", "gpu.topodra.dev"), "memory");
        assert_eq!(local_name("dra.cpu/cpu", "gpu.topodra.dev"), "dra.cpu/cpu");
    }
}
