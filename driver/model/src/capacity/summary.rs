//! Per-node figures: counts per topology group, largest aligned free set, stranding.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::Level;
use super::device::{DeviceKind, DeviceRecord};
use super::shared::SharedGroup;

/// GPUs by state. Every GPU is in exactly one of allocated, unhealthy, blocked and
/// free, so `total = allocated + unhealthy + blocked + free`; an allocated GPU that is
/// also tainted counts as allocated (it is in use; the taint shows on the device
/// itself).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub total: u32,
    pub allocated: u32,
    /// Tainted (NoSchedule or NoExecute, by the plugin's health checks or a
    /// DeviceTaintRule) and not allocated: no new claim gets it.
    pub unhealthy: u32,
    /// Not allocated itself, but the shared counters it consumes are in use by
    /// allocated devices it overlaps: a whole GPU with partitions allocated (carved)
    /// or shares allocated (see `shared`), a partition overlapping an allocated one
    /// or inside an allocated GPU. Only with dynamic MIG or sharing; left out of JSON
    /// when zero.
    #[serde(skip_serializing_if = "is_zero")]
    pub blocked: u32,
    /// Of `blocked`, GPUs blocked by shares: one of their shared devices (time-sliced,
    /// MPS) holds shares, so the GPU is no claim's whole. Left out of JSON when zero.
    #[serde(skip_serializing_if = "is_zero")]
    pub shared: u32,
    pub free: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Counts {
    // Counts are of devices the model holds, far below u32::MAX; saturating all the
    // same, so that no sum in the model can panic (the crate denies unchecked
    // arithmetic).
    fn add(&mut self, state: State) {
        self.total = self.total.saturating_add(1);
        let n = match state {
            State::Allocated => &mut self.allocated,
            State::Unhealthy => &mut self.unhealthy,
            State::Blocked => &mut self.blocked,
            State::Shared => {
                self.shared = self.shared.saturating_add(1);
                &mut self.blocked
            }
            State::Free => &mut self.free,
        };
        *n = n.saturating_add(1);
    }

    /// Blocked GPUs that shares do not hold: carved into partitions (dynamic MIG).
    pub fn carved(&self) -> u32 {
        self.blocked.saturating_sub(self.shared)
    }

    pub(super) fn merge(&mut self, other: &Counts) {
        self.total = self.total.saturating_add(other.total);
        self.allocated = self.allocated.saturating_add(other.allocated);
        self.unhealthy = self.unhealthy.saturating_add(other.unhealthy);
        self.blocked = self.blocked.saturating_add(other.blocked);
        self.shared = self.shared.saturating_add(other.shared);
        self.free = self.free.saturating_add(other.free);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    Allocated,
    Unhealthy,
    Blocked,
    /// A whole GPU blocked by the shares one of its shared devices holds: counted
    /// as blocked, and apart as shared.
    Shared,
    Free,
}

/// One MIG profile on one NUMA node of a node: how many devices of it the node can
/// still hand out, and what the GPUs that offer it are doing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfileGroup {
    pub profile: String,
    /// The NUMA node; `None` when the devices carry none.
    pub numa_node: Option<String>,
    /// Devices of the profile that can be allocated now, together: free static MIG
    /// devices, and per GPU as many free placements as fit side by side.
    pub available: u32,
    /// Devices of the profile allocated.
    pub allocated: u32,
    /// GPUs that offer the profile.
    pub gpus: u32,
    /// Of those, GPUs with partitions allocated (their whole device blocked).
    pub carved: u32,
    /// Of those, GPUs allocated whole.
    pub whole_allocated: u32,
}

/// The GPUs of one node that share a value of one attribute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Group {
    pub key: String,
    #[serde(flatten)]
    pub counts: Counts,
}

/// One node's figures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummary {
    pub node: String,
    /// Whole GPUs.
    pub gpus: Counts,
    /// MIG devices, counted apart: a MIG device is part of a GPU and never joins an
    /// aligned set of GPUs.
    pub mig_devices: Counts,
    /// Whole GPUs grouped at each level, groups sorted by key (numerically when the
    /// keys are numbers). A GPU without the attribute is in no group of that level.
    pub levels: BTreeMap<Level, Vec<Group>>,
    /// The node's NUMA node ids as its slices announce them (the plugin's hwloc
    /// view); `None` from a plugin that does not announce them. Bounds which NUMA
    /// ids of other drivers count for the node.
    #[serde(skip)]
    pub numa_nodes: Option<BTreeSet<u32>>,
    /// MIG profiles by NUMA node (profile, then NUMA node in key order); empty on a
    /// node without MIG devices.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub profiles: Vec<ProfileGroup>,
    /// Shared GPUs by sharing mode and NUMA node (mode, then NUMA node in key order);
    /// empty on a node without shared devices.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shared: Vec<SharedGroup>,
    /// Each whole GPU's state by UUID, for the per-profile and per-mode figures.
    #[serde(skip)]
    pub(super) gpu_states: BTreeMap<String, State>,
}

impl NodeSummary {
    pub(super) fn build<'a>(
        node: &str,
        devices: impl IntoIterator<Item = (&'a DeviceRecord, State)>,
    ) -> Self {
        let mut gpus = Counts::default();
        let mut mig_devices = Counts::default();
        let mut gpu_states = BTreeMap::new();
        let mut levels: BTreeMap<Level, BTreeMap<GroupKey, Counts>> = BTreeMap::new();
        for (dev, state) in devices {
            match dev.kind {
                DeviceKind::Gpu => {
                    gpus.add(state);
                    if let Some(u) = &dev.gpu_uuid {
                        gpu_states.insert(u.clone(), state);
                    }
                }
                DeviceKind::Mig => {
                    mig_devices.add(state);
                    continue;
                }
                DeviceKind::Shared | DeviceKind::Other => continue,
            }
            for level in Level::ALL {
                if let Some(key) = dev.group(level) {
                    levels
                        .entry(level)
                        .or_default()
                        .entry(GroupKey::new(key))
                        .or_default()
                        .add(state);
                }
            }
        }
        let levels = levels
            .into_iter()
            .map(|(level, groups)| {
                let groups = groups
                    .into_iter()
                    .map(|(k, counts)| Group {
                        key: k.text,
                        counts,
                    })
                    .collect();
                (level, groups)
            })
            .collect();
        Self {
            node: node.to_owned(),
            gpus,
            mig_devices,
            levels,
            numa_nodes: None,
            profiles: Vec::new(),
            shared: Vec::new(),
            gpu_states,
        }
    }

    /// Adds the per-profile figures from every MIG device of the node.
    pub(super) fn with_partitions(
        mut self,
        facts: impl IntoIterator<Item = super::cluster::PartitionFacts>,
    ) -> Self {
        #[derive(Default)]
        struct Acc {
            available: u32,
            allocated: u32,
            gpus: BTreeSet<String>,
        }
        let mut acc: BTreeMap<(String, Option<GroupKey>), Acc> = BTreeMap::new();
        for f in facts {
            let a = acc
                .entry((f.profile, f.numa.as_deref().map(GroupKey::new)))
                .or_default();
            if f.available {
                a.available = a.available.saturating_add(1);
            }
            if f.allocated {
                a.allocated = a.allocated.saturating_add(1);
            }
            a.gpus.extend(f.gpu_uuid);
        }
        self.profiles = acc
            .into_iter()
            .map(|((profile, numa), a)| {
                let state = |want: State| {
                    let n = a
                        .gpus
                        .iter()
                        .filter(|u| self.gpu_states.get(*u) == Some(&want))
                        .count();
                    u32::try_from(n).unwrap_or(u32::MAX)
                };
                ProfileGroup {
                    profile,
                    numa_node: numa.map(|k| k.text),
                    available: a.available,
                    allocated: a.allocated,
                    gpus: u32::try_from(a.gpus.len()).unwrap_or(u32::MAX),
                    carved: state(State::Blocked),
                    whole_allocated: state(State::Allocated),
                }
            })
            .collect();
        self
    }

    /// The figures of one MIG profile, by NUMA node.
    pub fn profile(&self, profile: &str) -> impl Iterator<Item = &ProfileGroup> {
        self.profiles.iter().filter(move |g| g.profile == profile)
    }

    pub(super) fn with_numa_nodes(mut self, numa_nodes: Option<BTreeSet<u32>>) -> Self {
        self.numa_nodes = numa_nodes;
        self
    }

    /// Whether another driver's NUMA node id can be one of this node's: among the
    /// announced ids, or any id a kernel can have where none are announced.
    pub fn has_numa_node(&self, id: u32) -> bool {
        self.numa_nodes
            .as_ref()
            .map_or(i64::from(id) <= super::values::MAX_NUMA_NODE, |s| {
                s.contains(&id)
            })
    }

    /// The groups of one level; empty when no GPU of the node carries its attribute.
    pub fn groups(&self, level: Level) -> &[Group] {
        self.levels.get(&level).map_or(&[], Vec::as_slice)
    }

    /// The group with the most free GPUs at this level (the first such group on a tie).
    pub fn largest_aligned(&self, level: Level) -> Option<&Group> {
        self.groups(level)
            .iter()
            .filter(|g| g.counts.free > 0)
            .fold(None, |best: Option<&Group>, g| match best {
                Some(b) if b.counts.free >= g.counts.free => Some(b),
                _ => Some(g),
            })
    }

    /// Free GPUs in the largest set aligned at `level`, or on the node when `None`.
    pub fn largest_free(&self, level: Option<Level>) -> u32 {
        match level {
            None => self.gpus.free,
            Some(l) => self.largest_aligned(l).map_or(0, |g| g.counts.free),
        }
    }

    /// Whether `count` free GPUs aligned at `level` (anywhere on the node when `None`)
    /// exist now.
    pub(crate) fn fits(&self, count: u32, level: Option<Level>) -> bool {
        self.largest_free(level) >= count
    }

    /// Free GPUs that cannot join an aligned set of `size` at `level`: those in groups
    /// with fewer than `size` free, and those without the attribute at all.
    pub fn stranded(&self, size: u32, level: Level) -> u32 {
        let usable: u32 = self
            .groups(level)
            .iter()
            .map(|g| g.counts.free)
            .filter(|free| *free >= size)
            .fold(0, u32::saturating_add);
        self.gpus.free.saturating_sub(usable)
    }
}

/// Sorts "2" before "10" and numbers before other text.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct GroupKey {
    textual: bool,
    number: Option<i64>,
    pub(super) text: String,
}

impl GroupKey {
    pub(super) fn new(key: &str) -> Self {
        let number = key.parse().ok();
        Self {
            textual: number.is_none(),
            number,
            text: key.to_owned(),
        }
    }
}
