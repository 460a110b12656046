//! Dynamic MIG as partitionable devices (KEP-4815): a GPU's MIG geometry as one
//! counter set, the whole GPU and each possible (profile, placement) as devices
//! that consume from it.
//!
//! The scheduler admits a set of devices only while the counters they consume
//! fit, so it never hands out a GPU and a partition of it, or two partitions
//! whose memory slices overlap, and it picks the profile and placement itself;
//! the plugin then creates the instance at prepare.
//!
//! The counters, per GPU:
//! - `memory-slice-<i>`, value 1, for each memory slice. A placement consumes the
//!   slices it covers, so overlapping placements exclude each other by position,
//!   as NVML's placement rules do.
//! - Of `compute-slices`, `multiprocessors`, `copy-engines`, `decoders`,
//!   `encoders`, `jpeg-engines`, `ofa-engines` and `memory`, only those that can
//!   refuse a combination the memory slices allow, with the GPU's total; a
//!   partition consumes its profile's count. On an H100 that is the one OFA
//!   engine, which keeps `+me` instances to one per GPU.
//! - `instances-<profile>`, for a profile whose instance count neither the
//!   memory slices nor an engine counter enforce.
//!
//! The totals are those of the profile that spans the whole GPU (the `7g` one):
//! NVML reports profiles, not the GPU's engine counts. A counter left out would
//! change no answer of the scheduler and would cost bytes on every partition, of
//! which a GPU has about twenty-five, stored by the API server and sent to every
//! watcher.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceAttribute, DeviceCounterConsumption, DeviceTaint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::attributes::{self, partition_attributes};
use super::{SliceOptions, quantity};
use crate::inventory::{Gpu, MigPlacement, MigProfile, Offer};

/// Which GPUs publish their MIG partitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DynamicMig {
    /// None: GPUs are offered whole, or as the MIG devices an operator made.
    #[default]
    Off,
    /// Every GPU whose MIG profiles NVML reported.
    All,
}

pub(crate) const MEMORY_SLICE_PREFIX: &str = "memory-slice-";
pub(crate) const COMPUTE_SLICES: &str = "compute-slices";
pub(crate) const MULTIPROCESSORS: &str = "multiprocessors";
pub(crate) const COPY_ENGINES: &str = "copy-engines";
pub(crate) const DECODERS: &str = "decoders";
pub(crate) const ENCODERS: &str = "encoders";
pub(crate) const JPEG_ENGINES: &str = "jpeg-engines";
pub(crate) const OFA_ENGINES: &str = "ofa-engines";
pub(crate) const MEMORY: &str = "memory";
pub(crate) const INSTANCES_PREFIX: &str = "instances-";

/// One GPU's counter set and what each of its devices consumes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Geometry {
    pub(crate) counter_set: CounterSet,
    /// What the whole GPU consumes: all of it.
    pub(crate) whole: DeviceCounterConsumption,
    /// The profile spanning the whole GPU (`7g`) and its one placement: the
    /// instance a claim for the whole GPU gets, since a GPU in MIG mode runs
    /// CUDA only inside instances.
    pub(crate) whole_instance: (MigProfile, MigPlacement),
    /// Every possible partition, in publishing order; none that overlaps
    /// someone else's instance.
    pub(crate) partitions: Vec<Partition>,
    /// Whether the whole GPU is published: not while someone else's instance
    /// holds part of it.
    pub(crate) whole_free: bool,
    /// Instances someone else made (not the plugin for a claim): their slices are
    /// taken out of the counter set for good, and they are offered as they are.
    pub(crate) foreign: Vec<crate::inventory::MigDevice>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Partition {
    pub(crate) profile: MigProfile,
    pub(crate) placement: MigPlacement,
    pub(crate) consumes: DeviceCounterConsumption,
}

/// Whether this GPU publishes partitions under these options, and its geometry.
///
/// Not for a GPU waiting for a MIG mode change (it is offered as nothing until the
/// reset). A GPU holding MIG devices publishes partitions around them when NVML
/// said where each sits: the instances the plugin made for claims
/// (`opts.own_mig_instances`) are allocated partitions; any other instance is
/// someone else's, whose slices the counter set leaves out. If NVML did not say
/// where an instance sits, the GPU is offered as its MIG devices, as without
/// dynamic MIG: the counters could not keep partitions off it.
pub(crate) fn geometry_of(gpu: &Gpu, opts: &SliceOptions) -> Option<Geometry> {
    if opts.dynamic_mig == DynamicMig::Off || gpu.offer() == Offer::MigChangePending {
        return None;
    }
    let uuid = gpu.uuid.clone().unwrap_or_default();
    let foreign: Vec<&crate::inventory::MigDevice> = gpu
        .mig_devices
        .iter()
        .filter(|m| {
            m.placement.is_none_or(|pl| {
                !opts
                    .own_mig_instances
                    .contains(&(uuid.clone(), pl.start, pl.size))
            })
        })
        .collect();
    if foreign.iter().any(|m| m.placement.is_none()) {
        return None;
    }
    geometry_with(gpu, &foreign)
}

/// [`geometry_with`] no instance on the GPU.
#[cfg(test)]
pub(crate) fn geometry(gpu: &Gpu) -> Option<Geometry> {
    geometry_with(gpu, &[])
}

/// The counter set of a GPU and its partitions, around `foreign` instances (each
/// with its placement); `None` when NVML gave no profile that can be published,
/// so a GPU without MIG never gets an empty counter set.
fn geometry_with(gpu: &Gpu, foreign: &[&crate::inventory::MigDevice]) -> Option<Geometry> {
    let full = gpu
        .mig_profiles
        .iter()
        .filter(|p| !p.placements.is_empty())
        .max_by_key(|p| (p.slice_count, p.memory_mib))?;
    // The whole-GPU profile's placement spans every memory slice.
    let memory_slices = full
        .placements
        .iter()
        .map(|pl| pl.start.saturating_add(pl.size))
        .max()
        .unwrap_or(0);
    let profiles: Vec<&MigProfile> = gpu
        .mig_profiles
        .iter()
        .filter(|p| match unpublishable(p, full, memory_slices) {
            None => true,
            Some(why) => {
                tracing::warn!(
                    gpu = %gpu.device_name(),
                    profile = %p.name,
                    reason = why,
                    "MIG profile not published"
                );
                false
            }
        })
        .collect();
    if profiles.is_empty() {
        return None;
    }
    let counts = Counts::binding(full, &profiles, memory_slices);
    let name = counter_set_name(gpu);

    let mut partitions: Vec<Partition> = profiles
        .iter()
        .flat_map(|p| {
            p.placements.iter().map(|&placement| Partition {
                profile: (*p).clone(),
                placement,
                consumes: DeviceCounterConsumption {
                    counter_set: name.clone(),
                    counters: counts.of(p, placement),
                    ..Default::default()
                },
            })
        })
        .collect();
    // Small profiles first, each at its highest placement first: a one-slice claim
    // then takes the end of a GPU, which keeps the start, where the big profiles
    // are placed, free for them.
    partitions.sort_by_key(|p| {
        (
            p.profile.slice_count,
            p.profile.memory_mib,
            p.profile.name.clone(),
            std::cmp::Reverse(p.placement.start),
        )
    });
    let taken: Vec<(Option<&MigProfile>, MigPlacement)> = foreign
        .iter()
        .filter_map(|m| {
            let profile = gpu.mig_profiles.iter().find(|p| Some(p.id) == m.profile_id);
            Some((profile, m.placement?))
        })
        .collect();
    partitions.retain(|p| !taken.iter().any(|(_, pl)| overlap(*pl, p.placement)));
    let counters = counts.totals(memory_slices);
    let available = counts.available(memory_slices, &taken);
    let whole_placement = full
        .placements
        .iter()
        .copied()
        .max_by_key(|pl| pl.size)
        .unwrap_or(MigPlacement {
            start: 0,
            size: memory_slices,
        });
    Some(Geometry {
        whole_instance: (full.clone(), whole_placement),
        whole: DeviceCounterConsumption {
            counter_set: name.clone(),
            counters: counters.clone(),
            ..Default::default()
        },
        counter_set: CounterSet {
            name,
            counters: available,
        },
        partitions,
        whole_free: taken.is_empty(),
        foreign: foreign.iter().map(|m| (*m).clone()).collect(),
    })
}

/// The counters of one GPU beyond its memory slices: only those that can refuse
/// a combination of partitions the memory slices allow. A counter that never can
/// changes no answer of the scheduler and only adds bytes to every partition
/// (on an H100 that leaves the OFA engine, which keeps `+me` instances to one).
struct Counts {
    /// Name, the GPU's total, and what a profile needs of it.
    engines: Vec<(&'static str, u64)>,
    /// `instances-<profile>` counters, for a profile whose instance count nothing
    /// else enforces: name, profile name, instance count.
    instances: Vec<(String, String, u64)>,
}

impl Counts {
    fn binding(full: &MigProfile, profiles: &[&MigProfile], memory_slices: u32) -> Self {
        let engines: Vec<(&'static str, u64)> = raw_counts(full)
            .into_iter()
            .filter(|&(name, total)| {
                most_placed(profiles, memory_slices, |p| amount_of(p, name)) > total
            })
            .collect();
        let instances = profiles
            .iter()
            .filter(|p| {
                let limit = u64::from(p.instance_count);
                let placed = most_placed(profiles, memory_slices, |q| u64::from(q.name == p.name));
                // An engine counter already enforces it when the GPU's total
                // holds no more than `limit` of this profile.
                let enforced = engines.iter().any(|&(name, total)| {
                    let need = amount_of(p, name);
                    total.checked_div(need).is_some_and(|most| most <= limit)
                });
                placed > limit && !enforced
            })
            .filter_map(|p| {
                let label = profile_label(&p.name)?;
                Some((
                    format!("{INSTANCES_PREFIX}{label}"),
                    p.name.clone(),
                    u64::from(p.instance_count),
                ))
            })
            .collect();
        Self { engines, instances }
    }

    /// The counter set: every memory slice, and the counters that can bind.
    fn totals(&self, memory_slices: u32) -> BTreeMap<String, Counter> {
        let mut out: BTreeMap<String, Counter> = (0..memory_slices)
            .map(|i| (memory_slice(i), count(1)))
            .collect();
        out.extend(
            self.engines
                .iter()
                .map(|&(name, n)| (name.to_owned(), counter(name, n))),
        );
        out.extend(
            self.instances
                .iter()
                .map(|(name, _, n)| (name.clone(), count(*n))),
        );
        out
    }

    /// The counter set around instances someone else made: their memory slices
    /// at 0, and the engines and instance counts they use taken off the totals
    /// (of an instance whose profile NVML did not list, only the slices).
    fn available(
        &self,
        memory_slices: u32,
        taken: &[(Option<&MigProfile>, MigPlacement)],
    ) -> BTreeMap<String, Counter> {
        let covered = |i: u32| {
            taken
                .iter()
                .any(|(_, pl)| pl.start <= i && i < pl.start.saturating_add(pl.size))
        };
        let mut out: BTreeMap<String, Counter> = (0..memory_slices)
            .map(|i| (memory_slice(i), count(u64::from(!covered(i)))))
            .collect();
        let profiles = || taken.iter().filter_map(|(p, _)| *p);
        for &(name, total) in &self.engines {
            let used: u64 = profiles().map(|p| amount_of(p, name)).sum();
            out.insert(name.to_owned(), counter(name, total.saturating_sub(used)));
        }
        for (name, profile, n) in &self.instances {
            let used = profiles().filter(|p| p.name == *profile).count() as u64;
            out.insert(name.clone(), count(n.saturating_sub(used)));
        }
        out
    }

    /// What one partition consumes.
    fn of(&self, p: &MigProfile, placement: MigPlacement) -> BTreeMap<String, Counter> {
        let mut out: BTreeMap<String, Counter> = (placement.start
            ..placement.start.saturating_add(placement.size))
            .map(|i| (memory_slice(i), count(1)))
            .collect();
        for &(name, _) in &self.engines {
            let need = amount_of(p, name);
            if need > 0 {
                out.insert(name.to_owned(), counter(name, need));
            }
        }
        for (name, profile, _) in &self.instances {
            if *profile == p.name {
                out.insert(name.clone(), count(1));
            }
        }
        out
    }
}

fn overlap(a: MigPlacement, b: MigPlacement) -> bool {
    a.start < b.start.saturating_add(b.size) && b.start < a.start.saturating_add(a.size)
}

/// The most of something that partitions on non-overlapping placements can add
/// up to: weighted interval scheduling over the memory slices, from the last
/// slice back.
fn most_placed(
    profiles: &[&MigProfile],
    memory_slices: u32,
    weight: impl Fn(&MigProfile) -> u64,
) -> u64 {
    let n = usize::try_from(memory_slices).unwrap_or(0);
    let mut best = vec![0u64; n.saturating_add(1)];
    for i in (0..n).rev() {
        let mut b = best.get(i.saturating_add(1)).copied().unwrap_or(0);
        for p in profiles {
            for pl in p.placements.iter().filter(|pl| pl.start as usize == i) {
                let end = i.saturating_add(pl.size as usize);
                if let Some(rest) = best.get(end) {
                    b = b.max(weight(p).saturating_add(*rest));
                }
            }
        }
        if let Some(slot) = best.get_mut(i) {
            *slot = b;
        }
    }
    best.first().copied().unwrap_or(0)
}

fn amount_of(p: &MigProfile, name: &str) -> u64 {
    raw_counts(p)
        .into_iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| v)
}

fn counter(name: &str, n: u64) -> Counter {
    match name {
        MEMORY => Counter {
            value: quantity::bytes(n),
        },
        _ => count(n),
    }
}

/// The counter set of a GPU is named as its whole device, `gpu-<minor>`.
pub(crate) fn counter_set_name(gpu: &Gpu) -> String {
    gpu.device_name()
}

fn memory_slice(i: u32) -> String {
    format!("{MEMORY_SLICE_PREFIX}{i}")
}

/// A profile's counts (memory in bytes), the zero ones left out.
fn raw_counts(p: &MigProfile) -> Vec<(&'static str, u64)> {
    [
        (COMPUTE_SLICES, u64::from(p.slice_count)),
        (MULTIPROCESSORS, u64::from(p.multiprocessors)),
        (COPY_ENGINES, u64::from(p.copy_engines)),
        (DECODERS, u64::from(p.decoders)),
        (ENCODERS, u64::from(p.encoders)),
        (JPEG_ENGINES, u64::from(p.jpeg_engines)),
        (OFA_ENGINES, u64::from(p.ofa_engines)),
        (MEMORY, p.memory_mib.saturating_mul(1 << 20)),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .collect()
}

fn count(n: u64) -> Counter {
    Counter {
        value: Quantity(n.to_string()),
    }
}

/// Why a profile cannot be published against the whole-GPU profile's counts, if
/// it cannot: a partition that asks for more than the GPU has could never be
/// allocated, and one whose name makes no device name would be refused with the
/// whole slice.
fn unpublishable(p: &MigProfile, full: &MigProfile, memory_slices: u32) -> Option<&'static str> {
    if profile_label(&p.name).is_none() {
        return Some("its name makes no valid device name");
    }
    let totals: BTreeMap<&str, u64> = raw_counts(full).into_iter().collect();
    let over = raw_counts(p)
        .into_iter()
        .any(|(name, n)| totals.get(name).is_none_or(|t| n > *t));
    if over {
        return Some("it needs more of an engine or of memory than the whole-GPU profile has");
    }
    if p.placements
        .iter()
        .any(|pl| pl.size == 0 || pl.start.saturating_add(pl.size) > memory_slices)
    {
        return Some("a placement lies outside the GPU's memory slices");
    }
    None
}

/// `1g.10gb+me` as a DNS label part, `1g-10gb-me`; `None` when nothing is left
/// or a character has no spelling.
pub(crate) fn profile_label(name: &str) -> Option<String> {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            'a'..='z' | '0'..='9' => out.push(c),
            'A'..='Z' => out.push(c.to_ascii_lowercase()),
            '.' | '+' | '-' | '_' => out.push('-'),
            _ => return None,
        }
    }
    let trimmed = out.trim_matches('-');
    (!trimmed.is_empty() && !trimmed.contains("--")).then(|| trimmed.to_owned())
}

/// A device dynamic MIG publishes, with the instance prepare makes for it.
#[derive(Debug, Clone, PartialEq)]
pub struct DynamicDevice {
    /// Its name in the slice: `gpu-<minor>`, or `gpu-<minor>-mig-<profile>-<start>`.
    pub name: String,
    pub gpu: Gpu,
    pub profile: MigProfile,
    pub placement: MigPlacement,
}

/// Every device the slices publish for GPUs with dynamic MIG under `opts`: each
/// such GPU whole (as its full-size instance) and each of its partitions. The
/// kubelet plugin prepares these by making their instances.
pub fn dynamic_devices(
    inv: &crate::inventory::Inventory,
    opts: &SliceOptions,
) -> Vec<DynamicDevice> {
    let mut out = Vec::new();
    for gpu in &inv.gpus {
        let Some(g) = geometry_of(gpu, opts) else {
            continue;
        };
        if g.whole_free {
            let (profile, placement) = g.whole_instance.clone();
            out.push(DynamicDevice {
                name: gpu.device_name(),
                gpu: gpu.clone(),
                profile,
                placement,
            });
        }
        out.extend(g.partitions.iter().map(|p| DynamicDevice {
            name: partition_name(gpu, p),
            gpu: gpu.clone(),
            profile: p.profile.clone(),
            placement: p.placement,
        }));
    }
    out
}

/// `gpu-<minor>-mig-<profile>-<start>`.
pub(crate) fn partition_name(gpu: &Gpu, p: &Partition) -> String {
    format!(
        "{}-mig-{}-{}",
        gpu.device_name(),
        profile_label(&p.profile.name).unwrap_or_default(),
        p.placement.start
    )
}

/// The device name of the partition of `gpu` whose GPU-instance profile id is
/// `profile_id`, at memory slice `start`: how the health monitor names the device
/// of an instance NVML reported an error for. `None` for a profile the GPU does
/// not have.
pub fn partition_device_name(gpu: &Gpu, profile_id: u32, start: u32) -> Option<String> {
    let profile = gpu.mig_profiles.iter().find(|p| p.id == profile_id)?;
    Some(format!(
        "{}-mig-{}-{}",
        gpu.device_name(),
        profile_label(&profile.name)?,
        start
    ))
}

/// The device of one partition: its GPU's `shared` attributes
/// ([`attributes::partition_shared_attributes`]), the profile, what it consumes.
pub(crate) fn partition_device(
    gpu: &Gpu,
    p: &Partition,
    shared: &BTreeMap<String, DeviceAttribute>,
    opts: &SliceOptions,
) -> Device {
    let attributes = partition_attributes(gpu, shared, &p.profile.name);
    let capacity = attributes::partition_capacity(&p.profile);
    let name = partition_name(gpu, p);
    // A partition is part of its GPU: what taints the GPU (an XID, a lost GPU)
    // taints every partition of it, beside any taint of the partition's own.
    let mut taints: Vec<DeviceTaint> = Vec::new();
    for t in [name.clone(), gpu.device_name()]
        .iter()
        .filter_map(|n| opts.device_taints.get(n))
        .flatten()
    {
        if !taints
            .iter()
            .any(|have| have.key == t.key && have.effect == t.effect)
        {
            taints.push(t.clone());
        }
    }
    Device {
        taints: (!taints.is_empty()).then_some(taints),
        name,
        attributes: (!attributes.is_empty()).then_some(attributes),
        capacity: (!capacity.is_empty()).then_some(capacity),
        consumes_counters: Some(vec![p.consumes.clone()]),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
