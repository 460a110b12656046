//! What the model keeps of one published device.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CounterSet, Device, DeviceAttribute, DeviceTaint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::Level;
use super::consumable::{self, Capacity};
use super::values::{self, InvalidValue};
use crate::slice::attributes::{PARENT_UUID, PROFILE, TYPE, TYPE_GPU, TYPE_MIG, UUID};

pub(crate) use crate::slice::sharing::{SHARING, TYPE_SHARED};

/// Counter values by counter set, then counter: what a pool's shared counters hold,
/// or what one device consumes from them (KEP-4815 partitionable devices).
pub(crate) type Counters = BTreeMap<String, BTreeMap<String, u128>>;

/// Whole GPUs are what the figures count; MIG devices are counted apart, since one
/// is a slice of a GPU and never part of an aligned set of GPUs; shared devices
/// (a GPU offered to many claims at once) have figures of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum DeviceKind {
    Gpu,
    Mig,
    Shared,
    Other,
}

/// What a shared device offers its shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ShareOffer {
    /// How it is shared: the `sharing` attribute (`TimeSlicing`, `MPS`); empty when
    /// the device does not say.
    pub(crate) mode: String,
    /// Its consumable capacities (`memory`, `compute`), by name without the
    /// driver's domain.
    pub(crate) capacities: BTreeMap<String, Capacity>,
}

/// One device of a slice, reduced to what placement depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceRecord {
    pub(crate) name: String,
    pub(crate) kind: DeviceKind,
    /// The group key at each level (index = position in [`Level::ALL`]); `None` when
    /// the device does not carry the attribute, so no constraint on it can match.
    pub(crate) groups: [Option<String>; 5],
    /// A taint that keeps new claims off (NoSchedule or NoExecute) in the slice.
    pub(crate) tainted: bool,
    /// The MIG profile of a MIG device (`1g.10gb`).
    pub(crate) profile: Option<String>,
    /// The GPU's UUID (a GPU) or its parent's (a MIG device): which whole GPU a MIG
    /// device is part of.
    pub(crate) gpu_uuid: Option<String>,
    /// The shared counters the device consumes; empty for a device that consumes
    /// none. A counter value that is not a whole number is left out.
    pub(crate) consumes: Counters,
    /// A shared device's mode and capacities; `None` for any other device.
    pub(crate) share: Option<ShareOffer>,
}

impl DeviceRecord {
    /// The record of one device, and the topology values of it that were not taken
    /// (see [`values`]).
    pub(crate) fn from_device(dev: &Device, driver: &str) -> (Self, Vec<InvalidValue>) {
        let attrs = dev.attributes.as_ref();
        let get = |name: &str| -> Option<&DeviceAttribute> {
            let attrs = attrs?;
            attrs
                .get(name)
                .or_else(|| attrs.get(&format!("{driver}/{name}")))
        };
        let kind = match get(TYPE).and_then(|a| a.string.as_deref()) {
            Some(TYPE_GPU) => DeviceKind::Gpu,
            Some(TYPE_MIG) => DeviceKind::Mig,
            Some(TYPE_SHARED) => DeviceKind::Shared,
            _ => DeviceKind::Other,
        };
        let mut invalid = Vec::new();
        let groups = Level::ALL.map(|l| {
            values::group_key(l, get(l.attribute())).unwrap_or_else(|e| {
                invalid.push(e);
                None
            })
        });
        let text = |name: &str| get(name).and_then(|a| a.string.clone());
        let gpu_uuid = match kind {
            DeviceKind::Mig => text(PARENT_UUID),
            _ => text(UUID),
        };
        let mut consumes = Counters::new();
        for c in dev.consumes_counters.iter().flatten() {
            let set = consumes.entry(c.counter_set.clone()).or_default();
            for (name, counter) in &c.counters {
                if let Some(v) = counter_value(&counter.value) {
                    let e = set.entry(name.clone()).or_default();
                    *e = e.saturating_add(v);
                }
            }
        }
        let record = Self {
            name: dev.name.clone(),
            kind,
            groups,
            tainted: dev
                .taints
                .as_deref()
                .is_some_and(|t| t.iter().any(keeps_off)),
            profile: (kind == DeviceKind::Mig).then(|| text(PROFILE)).flatten(),
            gpu_uuid,
            consumes,
            share: (kind == DeviceKind::Shared).then(|| ShareOffer {
                mode: text(SHARING).unwrap_or_default(),
                capacities: consumable::capacities(dev.capacity.as_ref(), driver),
            }),
        };
        (record, invalid)
    }

    /// Whether what the device consumes fits in `left`. A counter set or counter the
    /// pool does not have is not there to take from: the scheduler refuses such a
    /// device, and so does this.
    pub(crate) fn fits(&self, left: &Counters) -> bool {
        self.consumes.iter().all(|(set, counters)| {
            counters.iter().all(|(name, v)| {
                left.get(set)
                    .and_then(|s| s.get(name))
                    .is_some_and(|have| have >= v)
            })
        })
    }

    pub(crate) fn group(&self, level: Level) -> Option<&str> {
        self.groups[level_index(level)].as_deref()
    }
}

/// Takes what `consumes` uses out of `left`, down to zero.
pub(crate) fn take(left: &mut Counters, consumes: &Counters) {
    for (set, counters) in consumes {
        if let Some(have) = left.get_mut(set) {
            for (name, v) in counters {
                if let Some(h) = have.get_mut(name) {
                    *h = h.saturating_sub(*v);
                }
            }
        }
    }
}

/// The counter sets of a slice, by name. Values that are not whole non-negative
/// numbers are left out, so a device consuming them fits nowhere.
pub(crate) fn counter_sets(sets: &[CounterSet]) -> Counters {
    sets.iter()
        .map(|s| {
            let counters = s
                .counters
                .iter()
                .filter_map(|(n, c)| Some((n.clone(), counter_value(&c.value)?)))
                .collect();
            (s.name.clone(), counters)
        })
        .collect()
}

/// A counter's value as a whole number: plain digits, or with a binary or decimal
/// suffix (`80Gi`, `2k`), as our plugin and other drivers write them.
fn counter_value(q: &Quantity) -> Option<u128> {
    let s = q.0.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    let n: u128 = digits.parse().ok()?;
    let factor: u128 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        _ => return None,
    };
    n.checked_mul(factor)
}

pub(super) fn level_index(level: Level) -> usize {
    Level::ALL.iter().position(|l| *l == level).unwrap_or(0)
}

/// NoSchedule and NoExecute keep new allocations off a device; the `None` effect
/// only informs.
pub(super) fn keeps_off(t: &DeviceTaint) -> bool {
    matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
}

/// What the model takes from a slice's devices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct SliceDevices {
    pub(super) records: BTreeMap<String, DeviceRecord>,
    /// Names that more than one device of the slice carries. The API server refuses
    /// such a slice, so only a broken or hostile writer gets one past it.
    pub(super) duplicates: Vec<String>,
    /// Topology values not taken, by device name.
    pub(super) invalid: Vec<(String, InvalidValue)>,
}

/// The devices of a slice, by name.
pub(super) fn records(devices: &[Device], driver: &str) -> SliceDevices {
    let mut out = SliceDevices::default();
    for d in devices {
        let (record, invalid) = DeviceRecord::from_device(d, driver);
        out.invalid
            .extend(invalid.into_iter().map(|v| (d.name.clone(), v)));
        if out.records.insert(d.name.clone(), record).is_some() && !out.duplicates.contains(&d.name)
        {
            out.duplicates.push(d.name.clone());
        }
    }
    out
}

/// What a model that keeps one driver's node-bound slices makes of `slice`: its name
/// and node; `Err(name)` for a slice it must forget (another driver's, or bound to
/// no node); `None` for a slice without a name.
pub(super) fn node_slice(
    slice: &k8s_openapi::api::resource::v1::ResourceSlice,
    driver: &str,
) -> Option<Result<(String, String), String>> {
    let name = slice.metadata.name.clone()?;
    let spec = &slice.spec;
    match spec.node_name.clone().filter(|n| !n.is_empty()) {
        Some(node) if spec.driver == driver => Some(Ok((name, node))),
        _ => Some(Err(name)),
    }
}
