//! How the cluster keeps its pools and node summaries in step as objects come and
//! go: what an allocation releases, which pools a taint rule touches, and when a
//! pool's slices are taken as a node's GPUs.

use std::collections::BTreeSet;

use super::*;

impl Cluster {
    pub(super) fn release(&mut self, pool: &str, dev: &str) {
        let key = (pool.to_owned(), dev.to_owned());
        if let Some(n) = self.allocated.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
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
            let old = self.pools.insert(
                pool.clone(),
                PoolView {
                    node: node.clone(),
                    devices,
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
        let devices = self
            .pools
            .iter()
            .filter(|(_, v)| v.node == node)
            .flat_map(|(pool, v)| v.devices.values().map(move |d| (pool, d)))
            .map(|(pool, d)| (d, self.state(pool, d)));
        let numa_nodes = union(
            self.pools
                .values()
                .filter(|v| v.node == node)
                .map(|v| v.numa_nodes.as_ref()),
        );
        let summary = NodeSummary::build(node, devices).with_numa_nodes(numa_nodes);
        if self.summaries.get(node) == Some(&summary) {
            return false;
        }
        self.summaries.insert(node.to_owned(), summary);
        true
    }

    pub(super) fn state(&self, pool: &str, dev: &DeviceRecord) -> State {
        if self
            .allocated
            .contains_key(&(pool.to_owned(), dev.name.clone()))
        {
            State::Allocated
        } else if dev.tainted
            || self
                .rules
                .values()
                .any(|r| r.matches(&self.driver, pool, &dev.name))
        {
            State::Unhealthy
        } else {
            State::Free
        }
    }
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
