//! How the cluster keeps its pools and node summaries in step as objects come and
//! go: what an allocation releases, which pools a taint rule touches, and when a
//! pool's slices are taken as a node's GPUs.

use std::collections::BTreeSet;

use super::super::device::DeviceKind;
use super::super::shared::ShareFacts;
use super::*;

impl Cluster {
    /// Takes one allocation result off its device's holders.
    pub(super) fn release(&mut self, held: &Held) {
        let key = (held.pool.clone(), held.device.clone());
        if let Some(h) = self.allocated.get_mut(&key) {
            h.results = h.results.saturating_sub(1);
            for (name, v) in &held.consumed {
                if let Some(sum) = h.consumed.get_mut(name) {
                    *sum = sum.saturating_sub(u128::from(*v));
                }
            }
            if h.results == 0 {
                self.allocated.remove(&key);
            }
        }
    }

    pub(super) fn rule_pools(&self, sel: &RuleSelector) -> BTreeSet<String> {
        match &sel.pool {
            Some(p) => BTreeSet::from([p.clone()]),
            None => self.pools.keys().cloned().collect(),
        }
    }

    /// Recomputes the devices of pools whose slices changed. A pool that is not
    /// complete (fewer slices of its newest generation than it says it has) keeps its
    /// last complete devices, as the scheduler does; a pool with no slice left goes.
    pub(super) fn refresh_pools(
        &mut self,
        pools: impl IntoIterator<Item = String>,
    ) -> BTreeSet<String> {
        let mut changed = BTreeSet::new();
        for pool in pools {
            let names = self.pool_slices.get(&pool);
            let facts: Vec<&SliceFacts> = names
                .into_iter()
                .flatten()
                .filter_map(|n| self.slices.get(n))
                .collect();
            if facts.is_empty() {
                self.skipped.remove(&pool);
                if let Some(old) = self.pools.remove(&pool) {
                    changed.extend(self.remove_summary_if_unused(&old.node));
                }
                continue;
            }
            let newest = facts.iter().map(|f| f.generation).max().unwrap_or_default();
            let current: Vec<&&SliceFacts> =
                facts.iter().filter(|f| f.generation == newest).collect();
            let complete = current
                .iter()
                .all(|f| usize::try_from(f.slice_count).is_ok_and(|n| n == current.len()));
            if !complete {
                continue;
            }
            if let Some(problem) = pool_problem(&current) {
                if self.skipped.get(&pool) != Some(&problem) {
                    self.findings.push(Finding::PoolSkipped {
                        pool: pool.clone(),
                        problem: problem.clone(),
                    });
                }
                self.skipped.insert(pool.clone(), problem);
                // Its last complete devices go too: the scheduler does not allocate
                // from an invalid pool, so neither node has them now.
                if let Some(old) = self.pools.remove(&pool) {
                    changed.extend(self.remove_summary_if_unused(&old.node));
                }
                continue;
            }
            self.skipped.remove(&pool);
            let node = current[0].node.clone();
            let devices = current.iter().flat_map(|f| f.devices.clone()).collect();
            let numa_nodes = union(current.iter().map(|f| f.numa_nodes.as_ref()));
            let counters = current.iter().flat_map(|f| f.counters.clone()).collect();
            let old = self.pools.insert(
                pool.clone(),
                PoolView {
                    node: node.clone(),
                    devices,
                    counters,
                    numa_nodes,
                },
            );
            if let Some(old) = old.filter(|o| o.node != node) {
                changed.extend(self.remove_summary_if_unused(&old.node));
            }
            changed.extend(self.resummarize([pool]));
        }
        changed
    }

    pub(super) fn remove_summary_if_unused(&mut self, node: &str) -> Option<String> {
        if self.pools.values().any(|p| p.node == node) {
            return self.summarize(node).then(|| node.to_owned());
        }
        self.summaries.remove(node).map(|_| node.to_owned())
    }

    pub(super) fn resummarize(
        &mut self,
        pools: impl IntoIterator<Item = String>,
    ) -> BTreeSet<String> {
        let nodes: BTreeSet<String> = pools
            .into_iter()
            .filter_map(|p| self.pools.get(&p).map(|v| v.node.clone()))
            .collect();
        nodes.into_iter().filter(|n| self.summarize(n)).collect()
    }

    /// Recomputes one node's summary from all its pools; true when it changed.
    pub(super) fn summarize(&mut self, node: &str) -> bool {
        let pools: Vec<PoolStates<'_>> = self
            .pools
            .iter()
            .filter(|(_, v)| v.node == node)
            .map(|(pool, v)| {
                let (left, shared) = self.counters_left(pool, v);
                let states = v
                    .devices
                    .values()
                    .map(|d| (d, self.state(pool, d, &left, &shared)))
                    .collect();
                PoolStates { pool, states, left }
            })
            .collect();
        let partitions = partitions(&pools);
        let shared = pools.iter().flat_map(|p| {
            p.states
                .iter()
                .filter(|(d, _)| d.kind == DeviceKind::Shared)
                .map(|(d, state)| ShareFacts {
                    device: d,
                    state: *state,
                    tainted: self.is_tainted(p.pool, d),
                    holders: self.allocated.get(&(p.pool.to_owned(), d.name.clone())),
                })
        });
        let devices = pools.iter().flat_map(|p| p.states.iter().copied());
        let numa_nodes = union(
            self.pools
                .values()
                .filter(|v| v.node == node)
                .map(|v| v.numa_nodes.as_ref()),
        );
        let summary = NodeSummary::build(node, devices)
            .with_numa_nodes(numa_nodes)
            .with_partitions(partitions)
            .with_shared(shared);
        if self.summaries.get(node) == Some(&summary) {
            return false;
        }
        self.summaries.insert(node.to_owned(), summary);
        true
    }

    /// A device's state, `left` being its pool's counters that allocated devices
    /// have not consumed, and `shared` the counter sets that allocated shared
    /// devices consume (a GPU blocked by them is held by shares, not carved).
    pub(super) fn state(
        &self,
        pool: &str,
        dev: &DeviceRecord,
        left: &Counters,
        shared: &BTreeSet<&str>,
    ) -> State {
        if self.is_allocated(pool, dev) {
            State::Allocated
        } else if self.is_tainted(pool, dev) {
            State::Unhealthy
        } else if !dev.fits(left) {
            let by_shares = dev.kind == DeviceKind::Gpu
                && dev.consumes.keys().any(|set| shared.contains(set.as_str()));
            if by_shares {
                State::Shared
            } else {
                State::Blocked
            }
        } else {
            State::Free
        }
    }

    fn is_allocated(&self, pool: &str, dev: &DeviceRecord) -> bool {
        self.allocated
            .contains_key(&(pool.to_owned(), dev.name.clone()))
    }

    fn is_tainted(&self, pool: &str, dev: &DeviceRecord) -> bool {
        dev.tainted
            || self
                .rules
                .values()
                .any(|r| r.matches(&self.driver, pool, &dev.name))
    }

    /// The pool's shared counters less what its allocated devices consume, and the
    /// counter sets allocated shared devices consume. A shared device is charged its
    /// counters once however many shares it holds, as the scheduler charges it.
    fn counters_left<'a>(&self, pool: &str, view: &'a PoolView) -> (Counters, BTreeSet<&'a str>) {
        let mut left = view.counters.clone();
        let mut shared = BTreeSet::new();
        for d in view.devices.values() {
            if !d.consumes.is_empty() && self.is_allocated(pool, d) {
                device::take(&mut left, &d.consumes);
                if d.kind == DeviceKind::Shared {
                    shared.extend(d.consumes.keys().map(String::as_str));
                }
            }
        }
        (left, shared)
    }
}

/// Per MIG profile and NUMA node, how many more MIG devices of the profile the
/// node could hand out now: each free static MIG device counts one, and on each
/// GPU with partitions as many of the profile's free placements as fit together
/// in what is left of its counters (first fit by name: the placements of one
/// profile are of one size and aligned to it, so two overlap only where they are
/// the same span, and any order takes as many). `pools`: each pool's devices with
/// their states, and its counters left.
fn partitions(pools: &[PoolStates<'_>]) -> Vec<PartitionFacts> {
    let mut out = Vec::new();
    for PoolStates { states, left, .. } in pools {
        // One profile at a time, each starting from what the allocations left.
        let mut by_profile: BTreeMap<&str, Vec<(&DeviceRecord, State)>> = BTreeMap::new();
        for (d, state) in states {
            if let Some(p) = d.profile.as_deref() {
                by_profile.entry(p).or_default().push((d, *state));
            }
        }
        for (profile, devs) in by_profile {
            let mut room = left.clone();
            for (d, state) in devs {
                // Neither allocated nor tainted, and room for it beside the
                // others taken so far.
                let usable = matches!(state, State::Free | State::Blocked) && d.fits(&room);
                if usable {
                    device::take(&mut room, &d.consumes);
                }
                out.push(PartitionFacts {
                    profile: profile.to_owned(),
                    numa: d.group(super::Level::NumaNode).map(str::to_owned),
                    gpu_uuid: d.gpu_uuid.clone(),
                    available: usable,
                    allocated: state == State::Allocated,
                });
            }
        }
    }
    out
}

/// One pool of a node in the summary's pass: each device with its state, and the
/// counters its allocated devices left.
struct PoolStates<'a> {
    pool: &'a str,
    states: Vec<(&'a DeviceRecord, State)>,
    left: Counters,
}

/// One MIG device or partition, for the per-profile figures: its profile, NUMA
/// node, parent GPU, and whether it is one of those the node could still hand out.
#[derive(Clone, Debug)]
pub(crate) struct PartitionFacts {
    pub(crate) profile: String,
    pub(crate) numa: Option<String>,
    pub(crate) gpu_uuid: Option<String>,
    pub(crate) available: bool,
    pub(crate) allocated: bool,
}

/// Why the slices of a complete pool generation cannot be taken as one node's GPUs.
pub(super) fn pool_problem(current: &[&&SliceFacts]) -> Option<PoolProblem> {
    let nodes: BTreeSet<&str> = current.iter().map(|f| f.node.as_str()).collect();
    if nodes.len() > 1 {
        return Some(PoolProblem::NodesDiffer {
            nodes: nodes.into_iter().map(str::to_owned).collect(),
        });
    }
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut duplicates: BTreeSet<&str> = BTreeSet::new();
    for f in current {
        duplicates.extend(f.duplicates.iter().map(String::as_str));
        for name in f.devices.keys() {
            if !seen.insert(name) {
                duplicates.insert(name);
            }
        }
    }
    (!duplicates.is_empty()).then(|| PoolProblem::DuplicateDevices {
        devices: duplicates.into_iter().map(str::to_owned).collect(),
    })
}

/// The NUMA node ids announced by any of `sets`; `None` when none announces any.
fn union<'a>(sets: impl Iterator<Item = Option<&'a BTreeSet<u32>>>) -> Option<BTreeSet<u32>> {
    sets.flatten().fold(None, |all, s| {
        let mut all = all.unwrap_or_default();
        all.extend(s);
        Some(all)
    })
}
