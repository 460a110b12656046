//! Shared GPUs by sharing mode and NUMA node: how many can take another share, how
//! many shares they hold, and what is left of their memory (and compute, where the
//! devices publish it), in all and on the one GPU with the most, since a share
//! never spans two GPUs.
//!
//! Nothing here names a mode: a shared device is `type: shared`, its mode is its
//! `sharing` attribute and its capacities are whatever it publishes, so time-sliced
//! and MPS devices are counted by one path.

use std::collections::BTreeMap;

use serde::Serialize;

use super::Level;
use super::cluster::Holders;
use super::consumable::Capacity;
use super::demand::ShareWant;
use super::device::DeviceRecord;
use super::summary::{GroupKey, NodeSummary, State};

/// One sharing mode on one NUMA node of a node. Every device is in exactly one of
/// usable, unhealthy, whole-allocated and blocked: `gpus` is their sum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SharedGroup {
    /// The devices' `sharing` attribute: `TimeSlicing`, `MPS`.
    pub sharing: String,
    /// The NUMA node; `None` when the devices carry none.
    pub numa_node: Option<String>,
    /// Shared devices of the mode: one per GPU that offers it.
    pub gpus: u32,
    /// Devices that can take another share now: not tainted, and their GPU neither
    /// allocated whole nor carved (its counters are free, or it holds shares already).
    pub usable: u32,
    /// Devices tainted NoSchedule or NoExecute: no new share goes there.
    pub unhealthy: u32,
    /// Devices whose GPU is allocated whole.
    pub whole_allocated: u32,
    /// Devices whose GPU something else holds: partitions, or shares of another mode.
    pub blocked: u32,
    /// Devices holding at least one share.
    pub in_use: u32,
    /// Shares allocated.
    pub shares: u32,
    /// Each consumable capacity of the devices (`memory`; `compute` where published).
    pub capacity: BTreeMap<String, CapacityFigures>,
    /// What each usable device has left, to fit shares against.
    #[serde(skip)]
    pub(crate) rooms: Vec<Room>,
}

/// One capacity of a group's shared devices, in its own unit (bytes for memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityFigures {
    /// Of every device of the group.
    pub total: u64,
    /// Consumed by the shares allocated.
    pub allocated: u64,
    /// Left on the usable devices: what new shares can still take there together.
    pub free: u64,
    /// The most left on one usable device: the largest share that fits there.
    pub largest_free: u64,
}

impl CapacityFigures {
    /// Adds another group's figures: sums, and the larger of the two largest.
    pub fn merge(&mut self, other: &CapacityFigures) {
        self.total = self.total.saturating_add(other.total);
        self.allocated = self.allocated.saturating_add(other.allocated);
        self.free = self.free.saturating_add(other.free);
        self.largest_free = self.largest_free.max(other.largest_free);
    }
}

/// What one usable shared device has left of each capacity, with the policy that
/// says what a share consumes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Room {
    capacities: BTreeMap<String, (Capacity, u64)>,
}

impl Room {
    /// How many shares of `want` this device can still take. A capacity the share
    /// names that the device does not publish keeps it off (the scheduler's
    /// capacity filter), and so does an amount its policy refuses.
    pub(crate) fn takes(&self, want: &ShareWant) -> u32 {
        if want
            .capacity
            .keys()
            .any(|n| !self.capacities.contains_key(n))
        {
            return 0;
        }
        let mut n = u64::MAX;
        for (name, (capacity, free)) in &self.capacities {
            let Some(charge) = capacity.charge(want.capacity.get(name).copied()) else {
                return 0;
            };
            if let Some(fit) = free.checked_div(charge) {
                n = n.min(fit);
            }
        }
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Whether one share of `want` fits this device as far as `capacity` goes
    /// (the others not considered).
    pub(crate) fn fits_one(&self, want: &ShareWant, capacity: &str) -> bool {
        let Some((c, free)) = self.capacities.get(capacity) else {
            return !want.capacity.contains_key(capacity);
        };
        c.charge(want.capacity.get(capacity).copied())
            .is_some_and(|charge| charge <= *free)
    }

    /// What is left of one capacity.
    pub(crate) fn free(&self, capacity: &str) -> Option<u64> {
        self.capacities.get(capacity).map(|(_, free)| *free)
    }
}

impl SharedGroup {
    /// Whether the group is of the mode a share asks for (any, when it names none).
    pub fn serves(&self, want: &ShareWant) -> bool {
        want.sharing.as_deref().is_none_or(|m| m == self.sharing)
    }

    /// How many shares of `want` the group's devices can take together (several may
    /// go to one GPU).
    pub fn takes(&self, want: &ShareWant) -> u32 {
        if !self.serves(want) {
            return 0;
        }
        self.rooms
            .iter()
            .map(|r| r.takes(want))
            .fold(0, u32::saturating_add)
    }

    /// The most left of `capacity` on one usable device of the group.
    pub(crate) fn largest_free(&self, capacity: &str) -> u64 {
        self.rooms
            .iter()
            .filter_map(|r| r.free(capacity))
            .max()
            .unwrap_or(0)
    }
}

/// One shared device of a node, for the per-mode figures: its record, its state in
/// the summary's pass, whether it is tainted, and the claims holding shares of it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShareFacts<'a> {
    pub(crate) device: &'a DeviceRecord,
    pub(crate) state: State,
    pub(crate) tainted: bool,
    pub(crate) holders: Option<&'a Holders>,
}

impl NodeSummary {
    /// Adds the per-mode figures from every shared device of the node. A device
    /// without a NUMA node is counted in a group of its own (`numa_node: None`).
    pub(super) fn with_shared<'a>(
        mut self,
        facts: impl IntoIterator<Item = ShareFacts<'a>>,
    ) -> Self {
        let mut groups: BTreeMap<(String, Option<GroupKey>), SharedGroup> = BTreeMap::new();
        for f in facts {
            let Some(offer) = &f.device.share else {
                continue;
            };
            let numa = f.device.group(Level::NumaNode);
            let g = groups
                .entry((offer.mode.clone(), numa.map(GroupKey::new)))
                .or_insert_with(|| SharedGroup {
                    sharing: offer.mode.clone(),
                    numa_node: numa.map(str::to_owned),
                    gpus: 0,
                    usable: 0,
                    unhealthy: 0,
                    whole_allocated: 0,
                    blocked: 0,
                    in_use: 0,
                    shares: 0,
                    capacity: BTreeMap::new(),
                    rooms: Vec::new(),
                });
            let shares = f.holders.map_or(0, |h| h.results);
            g.gpus = g.gpus.saturating_add(1);
            g.shares = g.shares.saturating_add(shares);
            if shares > 0 {
                g.in_use = g.in_use.saturating_add(1);
            }
            let gpu = f
                .device
                .gpu_uuid
                .as_ref()
                .and_then(|u| self.gpu_states.get(u));
            let usable = !f.tainted && matches!(f.state, State::Allocated | State::Free);
            let n = if f.tainted {
                &mut g.unhealthy
            } else if usable {
                &mut g.usable
            } else if gpu == Some(&State::Allocated) {
                &mut g.whole_allocated
            } else {
                &mut g.blocked
            };
            *n = n.saturating_add(1);
            let mut room = BTreeMap::new();
            for (name, capacity) in &offer.capacities {
                let consumed = f
                    .holders
                    .and_then(|h| h.consumed.get(name))
                    .map_or(0, |c| u64::try_from(*c).unwrap_or(u64::MAX));
                let left = capacity.value.saturating_sub(consumed);
                let figures = g.capacity.entry(name.clone()).or_default();
                figures.total = figures.total.saturating_add(capacity.value);
                figures.allocated = figures.allocated.saturating_add(consumed);
                if usable {
                    figures.free = figures.free.saturating_add(left);
                    figures.largest_free = figures.largest_free.max(left);
                    room.insert(name.clone(), (capacity.clone(), left));
                }
            }
            if usable {
                g.rooms.push(Room { capacities: room });
            }
        }
        self.shared = groups.into_values().collect();
        self
    }

    /// The shared groups of one mode (every mode when `None`), by NUMA node.
    pub fn shared_groups<'a>(
        &'a self,
        sharing: Option<&'a str>,
    ) -> impl Iterator<Item = &'a SharedGroup> + 'a {
        self.shared
            .iter()
            .filter(move |g| sharing.is_none_or(|m| m == g.sharing))
    }
}
