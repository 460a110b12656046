//! The cluster state, updated one API object at a time.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::resource::v1::{DeviceTaintRule, ResourceClaim, ResourceSlice};

use super::consumable;
use super::device::{self, Counters, DeviceRecord, SliceDevices};
use super::problems::{Finding, PoolProblem};
use super::summary::{Counts, NodeSummary, State};
use super::values::InvalidValue;
use super::{Level, SET_SIZES};

mod pools;
pub(super) use pools::PartitionFacts;

/// A claim by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimKey {
    pub namespace: String,
    pub name: String,
}

impl ClaimKey {
    pub fn of(claim: &ResourceClaim) -> Self {
        Self {
            namespace: claim.metadata.namespace.clone().unwrap_or_default(),
            name: claim.metadata.name.clone().unwrap_or_default(),
        }
    }
}

/// One device a claim's allocation holds, and what the result says it consumes of
/// the device's capacities (a share of a shared device: `consumedCapacity`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Held {
    pool: String,
    device: String,
    /// By capacity name without the driver's domain. A value the model cannot read
    /// counts as all there is: the device is not promised to anyone else.
    consumed: BTreeMap<String, u64>,
}

/// The claims holding one device: how many allocation results name it, and the
/// capacities they consume together (summed wide, so no number of shares wraps).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Holders {
    pub(super) results: u32,
    pub(super) consumed: BTreeMap<String, u128>,
}

/// What the model keeps of a slice until its pool is complete.
#[derive(Clone, Debug)]
struct SliceFacts {
    pool: String,
    node: String,
    generation: i64,
    slice_count: i64,
    devices: BTreeMap<String, DeviceRecord>,
    /// Device names the slice carries more than once.
    duplicates: Vec<String>,
    /// Topology values not taken, by device name.
    invalid: Vec<(String, InvalidValue)>,
    /// The node's NUMA node ids, as the slice announces them.
    numa_nodes: Option<BTreeSet<u32>>,
    /// The slice's shared counters (partitionable devices).
    counters: Counters,
}

/// The devices of a complete pool: one node's GPUs as the scheduler sees them.
#[derive(Clone, Debug, Default)]
struct PoolView {
    node: String,
    devices: BTreeMap<String, DeviceRecord>,
    /// The pool's shared counters, from all its slices.
    counters: Counters,
    /// The node's NUMA node ids its slices announce; `None` when none does.
    numa_nodes: Option<BTreeSet<u32>>,
}

/// A DeviceTaintRule's selector, for the rules whose taint keeps claims off.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RuleSelector {
    driver: Option<String>,
    pool: Option<String>,
    device: Option<String>,
}

impl RuleSelector {
    fn matches(&self, driver: &str, pool: &str, device: &str) -> bool {
        self.driver.as_deref().is_none_or(|d| d == driver)
            && self.pool.as_deref().is_none_or(|p| p == pool)
            && self.device.as_deref().is_none_or(|d| d == device)
    }
}

/// Every node's GPUs, their allocations and taints, and the figures derived from them.
///
/// Each `apply_*` and `delete_*` returns the nodes whose [`NodeSummary`] changed, so
/// a caller publishes per node and only what changed.
#[derive(Clone, Debug)]
pub struct Cluster {
    driver: String,
    slices: HashMap<String, SliceFacts>,
    /// Slice names by pool, to find a pool's slices without a scan.
    pool_slices: HashMap<String, BTreeSet<String>>,
    pools: BTreeMap<String, PoolView>,
    claims: HashMap<ClaimKey, Vec<Held>>,
    /// (pool, device) → the claims that hold it (more than one only for devices
    /// that allow multiple allocations, or in a transient inconsistency).
    allocated: HashMap<(String, String), Holders>,
    rules: HashMap<String, RuleSelector>,
    summaries: BTreeMap<String, NodeSummary>,
    /// Complete pools left out, and why.
    skipped: BTreeMap<String, PoolProblem>,
    /// Reported since the caller last took them.
    findings: Vec<Finding>,
}

impl Cluster {
    pub fn new(driver: impl Into<String>) -> Self {
        Self {
            driver: driver.into(),
            slices: HashMap::new(),
            pool_slices: HashMap::new(),
            pools: BTreeMap::new(),
            claims: HashMap::new(),
            allocated: HashMap::new(),
            rules: HashMap::new(),
            summaries: BTreeMap::new(),
            skipped: BTreeMap::new(),
            findings: Vec::new(),
        }
    }

    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// A slice was added or changed. Slices of other drivers, and slices not bound
    /// to one node, are ignored.
    pub fn apply_slice(&mut self, slice: &ResourceSlice) -> BTreeSet<String> {
        let (name, node) = match device::node_slice(slice, &self.driver) {
            None => return BTreeSet::new(),
            Some(Err(name)) => return self.delete_slice(&name),
            Some(Ok(found)) => found,
        };
        let spec = &slice.spec;
        let SliceDevices {
            records,
            duplicates,
            invalid,
        } = device::records(spec.devices.as_deref().unwrap_or_default(), &self.driver);
        // Reported once: an unchanged slice comes back with every relist.
        let known = self.slices.get(&name).map(|o| o.invalid.as_slice());
        for (device, value) in &invalid {
            if !known.is_some_and(|k| k.iter().any(|(d, v)| d == device && v == value)) {
                self.findings.push(Finding::InvalidValue {
                    slice: name.clone(),
                    device: device.clone(),
                    value: value.clone(),
                });
            }
        }
        let facts = SliceFacts {
            pool: spec.pool.name.clone(),
            node,
            generation: spec.pool.generation,
            slice_count: spec.pool.resource_slice_count,
            devices: records,
            duplicates,
            invalid,
            numa_nodes: slice
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::slice::NUMA_NODES_ANNOTATION))
                .and_then(|v| super::values::numa_node_set(v)),
            counters: device::counter_sets(spec.shared_counters.as_deref().unwrap_or_default()),
        };
        let mut pools = BTreeSet::from([facts.pool.clone()]);
        if let Some(old) = self.slices.get(&name) {
            pools.insert(old.pool.clone());
            if let Some(set) = self.pool_slices.get_mut(&old.pool) {
                set.remove(&name);
            }
        }
        self.pool_slices
            .entry(facts.pool.clone())
            .or_default()
            .insert(name.clone());
        self.slices.insert(name, facts);
        self.refresh_pools(pools)
    }

    pub fn delete_slice(&mut self, name: &str) -> BTreeSet<String> {
        let Some(old) = self.slices.remove(name) else {
            return BTreeSet::new();
        };
        if let Some(set) = self.pool_slices.get_mut(&old.pool) {
            set.remove(name);
            if set.is_empty() {
                self.pool_slices.remove(&old.pool);
            }
        }
        self.refresh_pools([old.pool])
    }

    /// A claim was added or changed: its allocation results for our driver replace
    /// what the model had for it.
    pub fn apply_claim(&mut self, claim: &ResourceClaim) -> BTreeSet<String> {
        let key = ClaimKey::of(claim);
        let driver = self.driver.as_str();
        let results: Vec<Held> = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .map(|d| {
                d.results
                    .iter()
                    .flatten()
                    .filter(|r| r.driver == driver)
                    .map(|r| Held {
                        pool: r.pool.clone(),
                        device: r.device.clone(),
                        consumed: r
                            .consumed_capacity
                            .iter()
                            .flatten()
                            .map(|(name, q)| {
                                let v = consumable::amount(q).unwrap_or(u64::MAX);
                                (consumable::local_name(name, driver).to_owned(), v)
                            })
                            .collect(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut pools: BTreeSet<String> = results.iter().map(|h| h.pool.clone()).collect();
        if let Some(old) = self.claims.remove(&key) {
            if old == results {
                self.claims.insert(key, old);
                return BTreeSet::new();
            }
            for h in &old {
                self.release(h);
                pools.insert(h.pool.clone());
            }
        }
        for h in &results {
            let holders = self
                .allocated
                .entry((h.pool.clone(), h.device.clone()))
                .or_default();
            holders.results = holders.results.saturating_add(1);
            for (name, v) in &h.consumed {
                let sum = holders.consumed.entry(name.clone()).or_default();
                *sum = sum.saturating_add(u128::from(*v));
            }
        }
        if !results.is_empty() {
            self.claims.insert(key, results);
        }
        self.resummarize(pools)
    }

    pub fn delete_claim(&mut self, key: &ClaimKey) -> BTreeSet<String> {
        let Some(old) = self.claims.remove(key) else {
            return BTreeSet::new();
        };
        let mut pools = BTreeSet::new();
        for h in &old {
            self.release(h);
            pools.insert(h.pool.clone());
        }
        self.resummarize(pools)
    }

    /// A DeviceTaintRule was added or changed. Only rules whose taint keeps claims
    /// off (NoSchedule, NoExecute) and that can select our devices count.
    pub fn apply_taint_rule(&mut self, rule: &DeviceTaintRule) -> BTreeSet<String> {
        let Some(name) = rule.metadata.name.clone() else {
            return BTreeSet::new();
        };
        let sel = rule.spec.device_selector.as_ref();
        let selector = RuleSelector {
            driver: sel.and_then(|s| s.driver.clone()),
            pool: sel.and_then(|s| s.pool.clone()),
            device: sel.and_then(|s| s.device.clone()),
        };
        let relevant = device::keeps_off(&rule.spec.taint)
            && selector.driver.as_deref().is_none_or(|d| d == self.driver);
        let new = relevant.then_some(selector);
        let old = self.rules.remove(&name);
        if old == new {
            if let Some(s) = old {
                self.rules.insert(name, s);
            }
            return BTreeSet::new();
        }
        let mut pools = BTreeSet::new();
        for s in old.iter().chain(new.iter()) {
            pools.extend(self.rule_pools(s));
        }
        if let Some(s) = new {
            self.rules.insert(name, s);
        }
        self.resummarize(pools)
    }

    pub fn delete_taint_rule(&mut self, name: &str) -> BTreeSet<String> {
        match self.rules.remove(name) {
            Some(old) => {
                let pools = self.rule_pools(&old);
                self.resummarize(pools)
            }
            None => BTreeSet::new(),
        }
    }

    /// What the model did not take from the slices since the last call: values it
    /// ignored, pools it skipped. The controller takes them after every event.
    pub fn take_findings(&mut self) -> Vec<Finding> {
        std::mem::take(&mut self.findings)
    }

    /// The complete pools left out of the model now, and why.
    pub fn skipped_pools(&self) -> impl Iterator<Item = (&str, &PoolProblem)> {
        self.skipped.iter().map(|(p, why)| (p.as_str(), why))
    }

    /// The figures of one node, once its pool has been complete.
    pub fn node(&self, node: &str) -> Option<&NodeSummary> {
        self.summaries.get(node)
    }

    /// Every node's figures, by node name.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeSummary> {
        self.summaries.values()
    }

    /// Whole GPUs of the cluster.
    pub fn totals(&self) -> Counts {
        let mut c = Counts::default();
        for s in self.summaries.values() {
            c.merge(&s.gpus);
        }
        c
    }

    /// How many nodes can take `count` free GPUs aligned at `level` (anywhere on the
    /// node when `None`) now.
    pub fn nodes_fitting(&self, count: u32, level: Option<Level>) -> usize {
        self.summaries
            .values()
            .filter(|s| s.fits(count, level))
            .count()
    }

    /// Free GPUs of the cluster that cannot join an aligned set of each size of
    /// [`SET_SIZES`] beyond 1, at `level`.
    pub fn stranded(&self, level: Level) -> BTreeMap<u32, u32> {
        SET_SIZES
            .into_iter()
            .filter(|k| *k > 1)
            .map(|k| {
                (
                    k,
                    self.summaries.values().map(|s| s.stranded(k, level)).sum(),
                )
            })
            .collect()
    }
}
