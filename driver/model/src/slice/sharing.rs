//! Shared GPUs as devices (KEP-5075 consumable capacity on KEP-4815 counters): next
//! to each GPU's exclusive device, a time-sliced device and an MPS device that many
//! claims share.
//!
//! The sharing mode is a device, so the scheduler decides it, never a late surprise
//! at prepare:
//! - the GPU gets a counter set, and the exclusive device and each shared one
//!   consume all of it: the scheduler hands out one of them, never two, so a GPU is
//!   never time-sliced and under MPS at once;
//! - a shared device allows multiple allocations and carries the GPU's memory as a
//!   consumable capacity, so each claim gets a share of it (`memory`, with a request
//!   policy) and the scheduler sums the shares; an MPS device also carries
//!   `compute`, the percentage of the GPU's SMs a share may use. The 1.37.2 allocator
//!   charges an allow-multiple device's counters once for all its shares (pinned by
//!   `tests/e2e/shared_counters_test.go`), so a second share fits where the first
//!   one's counters are already charged.
//!
//! The time-slice interval is a setting of the whole GPU, so two claims could fight
//! over it. It is a node policy instead ([`TimeSlicing::interval`]), published as the
//! device's `timeSliceInterval` attribute: a claim that needs an interval selects
//! devices that have it, and every share of one GPU runs at the same interval.
//!
//! Not for GPUs in MIG mode (CUDA runs only inside their instances) nor for GPUs
//! under dynamic MIG, which publish their partitions instead.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{SliceOptions, attributes, quantity};
use crate::config::v1alpha1::TimeSliceInterval;
use crate::inventory::{Gpu, Inventory, Offer};

/// Value of the `type` attribute of a shared device. Not `gpu`: a class or selector
/// written for whole GPUs (`type == "gpu"`) must never hand a claim a share.
pub(crate) const TYPE_SHARED: &str = "shared";
/// Attribute naming how a shared device is shared.
pub(crate) const SHARING: &str = "sharing";
/// Attribute with the time-slice interval of a time-sliced device.
pub(crate) const TIME_SLICE_INTERVAL: &str = "timeSliceInterval";
/// The one counter of a GPU's counter set when nothing else needs one (no dynamic
/// MIG): each of the GPU's devices takes it whole.
pub(crate) const GPU_COUNTER: &str = "gpu";

/// Memory shares are whole GiB: fine enough for any workload, coarse enough that a
/// claim's share is a number people read at a glance.
pub const MEMORY_STEP: u64 = 1 << 30;

/// The capacity name of an MPS device's share of the SMs, in percent.
pub(crate) const COMPUTE: &str = "compute";

/// Which ways of sharing this node's GPUs are published.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sharing {
    /// Time-sliced devices, when on.
    pub time_slicing: Option<TimeSlicing>,
    /// MPS devices, when on.
    pub mps: Option<Mps>,
    /// MIG profiles whose dynamic MIG partitions get shared devices too (each
    /// partition a device per mode on), by profile name (`3g.40gb`). Empty: only
    /// whole GPUs are shared. Each adds devices to every slice, so it is the
    /// operator's choice.
    pub mig_profiles: Vec<String>,
}

impl Sharing {
    /// Whether any shared device is published.
    pub fn is_on(&self) -> bool {
        self.time_slicing.is_some() || self.mps.is_some()
    }
}

/// The node's MPS policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mps {
    /// How many shares a GPU holds when claims ask for no amount: a share without
    /// a request takes `memory / replicas` (whole GiB) and `100 / replicas` percent
    /// of the SMs (the device plugin's MPS `replicas`).
    pub replicas: u32,
}

impl Default for Mps {
    fn default() -> Self {
        Self { replicas: 4 }
    }
}

/// The node's time-slicing policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeSlicing {
    /// What every time-sliced GPU of the node runs at while shared.
    pub interval: TimeSliceInterval,
    /// How many shares a GPU holds when no claim asks for an amount of memory: a
    /// share without a memory request takes `memory / replicas`, rounded down to
    /// whole GiB (the device plugin's `replicas`, so its pods port unchanged).
    pub replicas: u32,
}

impl Default for TimeSlicing {
    fn default() -> Self {
        Self {
            interval: TimeSliceInterval::Default,
            replicas: 4,
        }
    }
}

/// How a shared device is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SharingMode {
    /// The GPU's own time-slicing between the contexts of all its shares.
    TimeSlicing,
    /// One MPS server runs every share's work at once, each within its memory
    /// and SM limits.
    Mps,
}

impl SharingMode {
    /// As the `sharing` attribute and the config's strategy spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TimeSlicing => "TimeSlicing",
            Self::Mps => "MPS",
        }
    }

    /// The suffix of the device name: `gpu-<minor>-ts`.
    fn suffix(self) -> &'static str {
        match self {
            Self::TimeSlicing => "ts",
            Self::Mps => "mps",
        }
    }
}

/// A shared device as the kubelet plugin prepares it.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedDevice {
    /// Its name in the slice, `gpu-<minor>-ts`, or for a MIG partition
    /// `<partition>-ts` (`gpu-<minor>-mig-<profile>-<start>-ts`).
    pub name: String,
    /// The GPU, or for a partition its parent GPU.
    pub gpu: Gpu,
    /// For a share of a dynamic MIG partition: the partition's device name, its
    /// profile and placement, whose instance the first share's prepare makes.
    pub mig: Option<SharedPartition>,
    pub mode: SharingMode,
    /// The interval its shares run at (time-sliced devices; Default for MPS).
    pub interval: TimeSliceInterval,
}

/// The shared devices of GPU `gpu` under `opts`: none where the GPU cannot be
/// shared (in MIG mode, under dynamic MIG, memory unknown) or sharing is off.
pub(crate) fn shared_of(gpu: &Gpu, opts: &SliceOptions) -> Vec<SharedDevice> {
    if !opts.sharing.is_on() || !shareable(gpu, opts) {
        return Vec::new();
    }
    let device = |mode: SharingMode, interval| SharedDevice {
        name: format!("{}-{}", gpu.device_name(), mode.suffix()),
        gpu: gpu.clone(),
        mig: None,
        mode,
        interval,
    };
    let mut out = Vec::new();
    if let Some(ts) = opts.sharing.time_slicing {
        out.push(device(SharingMode::TimeSlicing, ts.interval));
    }
    if opts.sharing.mps.is_some() {
        out.push(device(SharingMode::Mps, TimeSliceInterval::Default));
    }
    out
}

/// A dynamic MIG partition that shared devices run on.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedPartition {
    /// The partition's own device name.
    pub device: String,
    pub profile: crate::inventory::MigProfile,
    pub placement: crate::inventory::MigPlacement,
}

/// Every shared device the slices publish under `opts`, for the plugin's prepare:
/// the whole GPUs' and the dynamic MIG partitions'.
pub fn shared_devices(inv: &Inventory, opts: &SliceOptions) -> Vec<SharedDevice> {
    let mut out: Vec<SharedDevice> = inv.gpus.iter().flat_map(|g| shared_of(g, opts)).collect();
    for gpu in &inv.gpus {
        if let Some(g) = super::partitions::geometry_of(gpu, opts) {
            out.extend(
                g.partitions
                    .iter()
                    .flat_map(|p| partition_shares(gpu, p, opts)),
            );
        }
    }
    out
}

/// The shared devices of one dynamic MIG partition: one per mode on, when its
/// profile is among [`Sharing::mig_profiles`]. A MIG instance time-slices its own
/// processes at the driver's interval (the node's interval is set on whole GPUs
/// only) and runs MPS without a compute mode change (MIG-enabled GPUs refuse
/// EXCLUSIVE_PROCESS).
pub(crate) fn partition_shares(
    gpu: &Gpu,
    p: &super::partitions::Partition,
    opts: &SliceOptions,
) -> Vec<SharedDevice> {
    if !opts.sharing.mig_profiles.contains(&p.profile.name) {
        return Vec::new();
    }
    let device = super::partitions::partition_name(gpu, p);
    let share = |mode: SharingMode| SharedDevice {
        name: format!("{device}-{}", mode.suffix()),
        gpu: gpu.clone(),
        mig: Some(SharedPartition {
            device: device.clone(),
            profile: p.profile.clone(),
            placement: p.placement,
        }),
        mode,
        interval: TimeSliceInterval::Default,
    };
    let mut out = Vec::new();
    if opts.sharing.time_slicing.is_some() {
        out.push(share(SharingMode::TimeSlicing));
    }
    if opts.sharing.mps.is_some() {
        out.push(share(SharingMode::Mps));
    }
    out
}

/// Whether `gpu` can be shared: offered whole, not under dynamic MIG (whose
/// partitions use the counter set), and with enough memory for two shares.
fn shareable(gpu: &Gpu, opts: &SliceOptions) -> bool {
    gpu.offer() == Offer::Whole
        && super::partitions::geometry_of(gpu, opts).is_none()
        && gpu
            .memory_bytes
            .is_some_and(|m| m >= MEMORY_STEP.saturating_mul(2))
}

/// The counter set a shareable GPU gets when dynamic MIG gives it none, and what
/// each of its devices consumes of it: the whole set.
pub(crate) fn counter_set(gpu: &Gpu) -> (CounterSet, DeviceCounterConsumption) {
    let name = super::partitions::counter_set_name(gpu);
    let counters = BTreeMap::from([(
        GPU_COUNTER.to_owned(),
        Counter {
            value: Quantity("1".to_owned()),
        },
    )]);
    (
        CounterSet {
            name: name.clone(),
            counters: counters.clone(),
        },
        DeviceCounterConsumption {
            counter_set: name,
            counters,
            ..Default::default()
        },
    )
}

/// One shared device in the slice: its GPU's attributes (topology included, so
/// `matchAttribute` aligns shares as it aligns GPUs) with `type: shared`, the
/// mode and interval, and the GPU's memory as a consumable capacity.
pub(crate) fn shared_device(
    d: &SharedDevice,
    inv: &Inventory,
    opts: &SliceOptions,
    consumes: DeviceCounterConsumption,
) -> Device {
    let mut attrs = match &d.mig {
        None => attributes::device_attributes(&d.gpu, inv, opts),
        Some(m) => {
            let shared = attributes::partition_shared_attributes(&d.gpu, inv, opts);
            attributes::partition_attributes(&d.gpu, &shared, &m.profile.name)
        }
    };
    let string = |v: &str| DeviceAttribute {
        string: Some(v.to_owned()),
        ..Default::default()
    };
    attrs.insert(attributes::TYPE.to_owned(), string(TYPE_SHARED));
    attrs.insert(SHARING.to_owned(), string(d.mode.as_str()));
    let replicas = match d.mode {
        SharingMode::TimeSlicing => {
            attrs.insert(
                TIME_SLICE_INTERVAL.to_owned(),
                string(interval_name(d.interval)),
            );
            opts.sharing.time_slicing.map_or(1, |t| t.replicas)
        }
        SharingMode::Mps => opts.sharing.mps.map_or(1, |m| m.replicas),
    };
    let memory = match &d.mig {
        None => d.gpu.memory_bytes,
        Some(m) => Some(m.profile.memory_mib.saturating_mul(1 << 20)),
    };
    let mut capacity = memory
        .filter(|&m| m >= MEMORY_STEP.saturating_mul(2))
        .map(|m| (attributes::MEMORY.to_owned(), memory_capacity(m, replicas)))
        .into_iter()
        .collect::<BTreeMap<_, _>>();
    if d.mode == SharingMode::Mps {
        capacity.insert(COMPUTE.to_owned(), compute_capacity(replicas));
    }
    // A share of a GPU is a share of all of it: an XID or a lost GPU taints each,
    // as does one named for the partition it runs on.
    let partition = d.mig.as_ref().map(|m| m.device.clone());
    let taints = opts
        .device_taints
        .get(&d.name)
        .into_iter()
        .chain(opts.device_taints.get(&d.gpu.device_name()))
        .chain(partition.and_then(|p| opts.device_taints.get(&p)))
        .flatten()
        .fold(Vec::new(), |mut out: Vec<_>, t| {
            if !out
                .iter()
                .any(|have: &k8s_openapi::api::resource::v1::DeviceTaint| {
                    have.key == t.key && have.effect == t.effect
                })
            {
                out.push(t.clone());
            }
            out
        });
    Device {
        name: d.name.clone(),
        attributes: Some(attrs),
        capacity: (!capacity.is_empty()).then_some(capacity),
        allow_multiple_allocations: Some(true),
        consumes_counters: Some(vec![consumes]),
        taints: (!taints.is_empty()).then_some(taints),
        ..Default::default()
    }
}

/// The GPU's memory as a consumable capacity: shares of whole GiB, at least one
/// GiB, and `memory / replicas` (rounded down to GiB) when a claim names no amount.
/// The API requires `min + step <= value` and a default on the grid from `min`;
/// [`shareable`] keeps `memory` at two steps or more.
pub(crate) fn memory_capacity(memory: u64, replicas: u32) -> DeviceCapacity {
    let per_replica = memory.checked_div(u64::from(replicas)).unwrap_or(memory);
    let default = (per_replica / MEMORY_STEP)
        .max(1)
        .saturating_mul(MEMORY_STEP);
    DeviceCapacity {
        value: quantity::bytes(memory),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(quantity::bytes(default)),
            valid_range: Some(CapacityRequestPolicyRange {
                min: quantity::bytes(MEMORY_STEP),
                step: Some(quantity::bytes(MEMORY_STEP)),
                max: None,
            }),
            valid_values: None,
        }),
    }
}

/// An MPS device's SMs as a consumable capacity, in percent: shares of whole
/// percents from 1, `100 / replicas` when a claim names no amount. MPS takes the
/// percentage as `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`.
pub(crate) fn compute_capacity(replicas: u32) -> DeviceCapacity {
    let default = 100u32.checked_div(replicas).unwrap_or(100).clamp(1, 100);
    let percent = |n: u32| Quantity(n.to_string());
    DeviceCapacity {
        value: percent(100),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(percent(default)),
            valid_range: Some(CapacityRequestPolicyRange {
                min: percent(1),
                step: Some(percent(1)),
                max: None,
            }),
            valid_values: None,
        }),
    }
}

/// The interval as the config and the attribute spell it.
pub fn interval_name(i: TimeSliceInterval) -> &'static str {
    match i {
        TimeSliceInterval::Default => "Default",
        TimeSliceInterval::Short => "Short",
        TimeSliceInterval::Medium => "Medium",
        TimeSliceInterval::Long => "Long",
    }
}

#[cfg(test)]
mod tests;
