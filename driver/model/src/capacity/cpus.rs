//! CPUs another driver publishes, per node and NUMA node: what a claim that couples
//! our GPUs with CPUs (one `matchAttribute` over both) can find free.
//!
//! The reference is the CPU DRA driver (`dra-driver-cpu`, driver name `dra.cpu`). In
//! its default grouped mode it publishes one device per NUMA node with the node's
//! CPUs as consumable capacity `<driver>/cpu`, which a claim consumes with
//! `capacity.requests`; in individual mode one device per CPU, which a claim takes
//! with `count`. Both are read here: a device's CPUs are its `<driver>/cpu` capacity,
//! or 1 when it has no capacity at all. A device's NUMA node is the first int of the
//! NUMA attribute names given (the standard `resource.kubernetes.io/numaNode` and the
//! aliases the driver publishes, `dra.net/numaNode` for v0.2.0).
//!
//! Slices are taken as the latest generation of each pool, without waiting for the
//! pool to be complete: this side only adds figures to messages and zones, it never
//! decides an allocation.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::ClaimKey;
use super::values::MAX_NUMA_NODE;

/// CPUs of one NUMA node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuCounts {
    pub total: u64,
    /// Taken by allocated claims.
    pub allocated: u64,
    /// Published as grouped devices (CPUs as capacity), where a request without a
    /// capacity request takes the whole device: all of the node's CPUs.
    pub grouped: bool,
}

impl CpuCounts {
    pub fn free(&self) -> u64 {
        self.total.saturating_sub(self.allocated)
    }
}

/// A pool's devices: name → (NUMA node, CPUs, grouped).
type PoolDevices<'a> = BTreeMap<&'a str, (u32, u64, bool)>;

#[derive(Clone, Debug)]
struct CpuSlice {
    node: String,
    pool: String,
    generation: i64,
    /// Device name → (NUMA node, CPUs, grouped).
    devices: BTreeMap<String, (u32, u64, bool)>,
}

/// The CPU driver's devices and the claims on them.
#[derive(Clone, Debug)]
pub struct CpuPools {
    driver: String,
    capacity_name: String,
    numa_attributes: Vec<String>,
    slices: HashMap<String, CpuSlice>,
    /// Per claim: (pool, device, CPUs) of its results for the CPU driver.
    claims: HashMap<ClaimKey, Vec<(String, String, u64)>>,
}

impl CpuPools {
    /// The CPUs of `driver` (`dra.cpu`), whose NUMA node is published under one of
    /// `numa_attributes`.
    pub fn new(driver: impl Into<String>, numa_attributes: Vec<String>) -> Self {
        let driver = driver.into();
        Self {
            capacity_name: format!("{driver}/cpu"),
            driver,
            numa_attributes,
            slices: HashMap::new(),
            claims: HashMap::new(),
        }
    }

    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// The capacity a claim requests CPUs by: `dra.cpu/cpu`.
    pub fn capacity_name(&self) -> &str {
        &self.capacity_name
    }

    /// A slice was added or changed; returns the nodes whose figures may have
    /// changed. Other drivers' slices and slices of no node are dropped.
    pub fn apply_slice(&mut self, slice: &ResourceSlice) -> BTreeSet<String> {
        let (name, node) = match super::device::node_slice(slice, &self.driver) {
            None => return BTreeSet::new(),
            Some(Err(name)) => return self.delete_slice(&name),
            Some(Ok(found)) => found,
        };
        let spec = &slice.spec;
        let devices = spec
            .devices
            .iter()
            .flatten()
            .filter_map(|d| {
                let numa = self.numa_node(d.attributes.as_ref()?)?;
                let (cpus, grouped) = match &d.capacity {
                    Some(c) if !c.is_empty() => (whole(&c.get(&self.capacity_name)?.value)?, true),
                    _ => (1, false),
                };
                Some((d.name.clone(), (numa, cpus, grouped)))
            })
            .collect();
        let facts = CpuSlice {
            node: node.clone(),
            pool: spec.pool.name.clone(),
            generation: spec.pool.generation,
            devices,
        };
        let mut touched = BTreeSet::from([node]);
        if let Some(old) = self.slices.insert(name, facts) {
            touched.insert(old.node);
        }
        touched
    }

    pub fn delete_slice(&mut self, name: &str) -> BTreeSet<String> {
        self.slices
            .remove(name)
            .map(|s| BTreeSet::from([s.node]))
            .unwrap_or_default()
    }

    /// A claim was added or changed: its results for the CPU driver replace what was
    /// known of it. Returns the nodes it touches.
    pub fn apply_claim(&mut self, claim: &ResourceClaim) -> BTreeSet<String> {
        let key = ClaimKey::of(claim);
        let results: Vec<(String, String, u64)> = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .into_iter()
            .flatten()
            .filter(|r| r.driver == self.driver)
            .map(|r| {
                let consumed = r
                    .consumed_capacity
                    .as_ref()
                    .and_then(|c| c.get(&self.capacity_name))
                    .and_then(whole);
                (r.pool.clone(), r.device.clone(), consumed.unwrap_or(1))
            })
            .collect();
        let mut touched = self.nodes_of(self.claims.get(&key));
        if results.is_empty() {
            self.claims.remove(&key);
        } else {
            touched.extend(self.nodes_of(Some(&results)));
            self.claims.insert(key, results);
        }
        touched
    }

    pub fn delete_claim(&mut self, key: &ClaimKey) -> BTreeSet<String> {
        let old = self.claims.remove(key);
        self.nodes_of(old.as_ref())
    }

    /// A node's CPUs by NUMA node; empty when the CPU driver publishes none there.
    pub fn numa(&self, node: &str) -> BTreeMap<u32, CpuCounts> {
        let mut out: BTreeMap<u32, CpuCounts> = BTreeMap::new();
        // Pool → (generation, its devices), from the pool's newest generation only.
        let mut pools: BTreeMap<&str, (i64, PoolDevices<'_>)> = BTreeMap::new();
        for s in self.slices.values().filter(|s| s.node == node) {
            let entry = pools
                .entry(s.pool.as_str())
                .or_insert((s.generation, BTreeMap::new()));
            if s.generation > entry.0 {
                *entry = (s.generation, BTreeMap::new());
            }
            if s.generation == entry.0 {
                entry
                    .1
                    .extend(s.devices.iter().map(|(d, v)| (d.as_str(), *v)));
            }
        }
        for (_, devices) in pools.values() {
            for (numa, cpus, grouped) in devices.values() {
                // Saturating: a slice may publish any capacity up to 2^64-1 (the API
                // server takes it), and a sum of two such must neither panic nor wrap.
                let c = out.entry(*numa).or_default();
                c.total = c.total.saturating_add(*cpus);
                c.grouped |= grouped;
            }
        }
        for results in self.claims.values() {
            for (pool, device, cpus) in results {
                let Some((_, devices)) = pools.get(pool.as_str()) else {
                    continue;
                };
                if let Some((numa, _, _)) = devices.get(device.as_str()) {
                    let c = out.entry(*numa).or_default();
                    c.allocated = c.allocated.saturating_add(*cpus);
                }
            }
        }
        out
    }

    fn numa_node(
        &self,
        attributes: &BTreeMap<String, k8s_openapi::api::resource::v1::DeviceAttribute>,
    ) -> Option<u32> {
        self.numa_attributes
            .iter()
            .find_map(|n| attributes.get(n)?.int)
            .filter(|n| (0..=MAX_NUMA_NODE).contains(n))
            .and_then(|n| u32::try_from(n).ok())
    }

    fn nodes_of(&self, results: Option<&Vec<(String, String, u64)>>) -> BTreeSet<String> {
        let pools: BTreeSet<&str> = results
            .into_iter()
            .flatten()
            .map(|(p, _, _)| p.as_str())
            .collect();
        self.slices
            .values()
            .filter(|s| pools.contains(s.pool.as_str()))
            .map(|s| s.node.clone())
            .collect()
    }
}

/// A whole, non-negative number of CPUs: `32`, or `32000m`.
pub(crate) fn whole(q: &Quantity) -> Option<u64> {
    let s = q.0.trim();
    if let Some(milli) = s.strip_suffix('m') {
        let m: u64 = milli.parse().ok()?;
        return m.is_multiple_of(1000).then_some(m / 1000);
    }
    s.parse().ok()
}

/// Slices of the CPU driver, for the tests of this module and of the mixed demands.
#[cfg(test)]
pub(crate) mod fixtures {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use serde_json::json;

    /// A slice as dra-driver-cpu v0.2.0 publishes it in grouped mode (one device per
    /// NUMA node, `dra.cpu/cpu` capacity, `dra.net/numaNode`).
    pub(crate) fn grouped(node: &str, generation: i64, cpus: &[u64]) -> ResourceSlice {
        let devices: Vec<_> = cpus
            .iter()
            .enumerate()
            .map(|(i, n)| {
                json!({
                    "name": format!("cpudevnuma{i:03}"),
                    "attributes": {
                        "dra.cpu/numaNodeID": {"int": i},
                        "dra.net/numaNode": {"int": i},
                    },
                    "capacity": {"dra.cpu/cpu": {"value": n.to_string()}},
                    "allowMultipleAllocations": true,
                })
            })
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-dra.cpu-x")},
            "spec": {"driver": "dra.cpu", "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": devices}
        }))
        .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::fixtures::grouped;
    use super::*;

    const NUMA: &str = "dra.net/numaNode";

    fn pools() -> CpuPools {
        CpuPools::new(
            "dra.cpu",
            vec!["resource.kubernetes.io/numaNode".into(), NUMA.into()],
        )
    }

    fn claim(name: &str, node: &str, numa: u32, cpus: &str) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [
                {"request": "cpus", "driver": "dra.cpu", "pool": node,
                 "device": format!("cpudevnuma{numa:03}"),
                 "consumedCapacity": {"dra.cpu/cpu": cpus}},
                {"request": "gpus", "driver": "gpu.topodra.dev", "pool": node, "device": "gpu-0"}
            ]}}}
        }))
        .unwrap()
    }

    #[test]
    fn grouped_devices_count_their_capacity_and_claims_their_consumption() {
        let mut p = pools();
        assert_eq!(
            p.apply_slice(&grouped("node-a", 1, &[56, 56])),
            BTreeSet::from(["node-a".to_owned()])
        );
        p.apply_claim(&claim("c1", "node-a", 1, "32"));
        p.apply_claim(&claim("c2", "node-a", 1, "12000m"));
        let n = p.numa("node-a");
        assert_eq!(
            n[&0],
            CpuCounts {
                total: 56,
                allocated: 0,
                grouped: true,
            }
        );
        assert_eq!(
            n[&1],
            CpuCounts {
                total: 56,
                allocated: 44,
                grouped: true,
            }
        );
        assert_eq!(n[&1].free(), 12);
        p.delete_claim(&ClaimKey {
            namespace: "default".into(),
            name: "c1".into(),
        });
        assert_eq!(p.numa("node-a")[&1].free(), 44);
        assert!(p.numa("node-b").is_empty());
    }

    /// A slice of `(numa node, cpus)` grouped devices named `cpudev<i>`.
    fn slice_of(node: &str, devices: &[(u32, u64)]) -> ResourceSlice {
        let devices: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(i, (numa, cpus))| {
                json!({"name": format!("cpudev{i}"), "attributes": {NUMA: {"int": numa}},
                       "capacity": {"dra.cpu/cpu": {"value": cpus.to_string()}}})
            })
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-cpus")},
            "spec": {"driver": "dra.cpu", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}
        }))
        .unwrap()
    }

    fn consuming(name: &str, node: &str, device: usize, cpus: u64) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [
                {"request": "cpus", "driver": "dra.cpu", "pool": node,
                 "device": format!("cpudev{device}"),
                 "consumedCapacity": {"dra.cpu/cpu": cpus.to_string()}}
            ]}}}
        }))
        .unwrap()
    }

    /// The attack as found: two devices on one NUMA node with 2^64-1 CPUs each, and
    /// two claims consuming that much, once panicked the controller at every start
    /// ("attempt to add with overflow") and wrapped in a release build.
    #[test]
    fn capacities_at_the_top_of_the_range_saturate() {
        let mut p = pools();
        p.apply_slice(&slice_of("node-a", &[(0, u64::MAX), (0, u64::MAX), (1, 8)]));
        p.apply_claim(&consuming("c1", "node-a", 0, u64::MAX));
        p.apply_claim(&consuming("c2", "node-a", 1, u64::MAX));
        let n = p.numa("node-a");
        assert_eq!(
            (n[&0].total, n[&0].allocated, n[&0].free()),
            (u64::MAX, u64::MAX, 0)
        );
        assert_eq!((n[&1].total, n[&1].free()), (8, 8));
    }

    proptest::proptest! {
        /// Over the whole u64 range: per NUMA node the total is the saturating sum of
        /// its devices' CPUs, the allocation that of its claims' consumption, and free
        /// never exceeds the total.
        #[test]
        fn any_capacities_and_consumptions_sum_without_overflow(
            devices in proptest::collection::vec((0u32..3, proptest::num::u64::ANY), 1..6),
            claims in proptest::collection::vec((0usize..6, proptest::num::u64::ANY), 0..6),
        ) {
            let mut p = pools();
            p.apply_slice(&slice_of("node-a", &devices));
            for (i, (device, cpus)) in claims.iter().enumerate() {
                p.apply_claim(&consuming(&format!("c{i}"), "node-a", *device, *cpus));
            }
            let n = p.numa("node-a");
            for (numa, counts) in &n {
                let total = devices
                    .iter()
                    .filter(|(d, _)| d == numa)
                    .fold(0u64, |s, (_, c)| s.saturating_add(*c));
                let allocated = claims
                    .iter()
                    .filter(|(d, _)| devices.get(*d).is_some_and(|(m, _)| m == numa))
                    .fold(0u64, |s, (_, c)| s.saturating_add(*c));
                proptest::prop_assert_eq!(counts.total, total);
                proptest::prop_assert_eq!(counts.allocated, allocated);
                proptest::prop_assert!(counts.free() <= counts.total);
            }
        }
    }

    #[test]
    fn individual_devices_are_one_cpu_each() {
        let mut p = pools();
        let slice: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": "s"},
            "spec": {"driver": "dra.cpu", "nodeName": "node-a",
                     "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                     "devices": [
                        {"name": "cpudev000", "attributes": {NUMA: {"int": 0}}},
                        {"name": "cpudev001", "attributes": {NUMA: {"int": 0}}},
                        {"name": "cpudev002", "attributes": {NUMA: {"int": 1}}},
                        {"name": "nonuma", "attributes": {}}
                     ]}
        }))
        .unwrap();
        p.apply_slice(&slice);
        let n = p.numa("node-a");
        assert_eq!((n[&0].total, n[&1].total, n.len()), (2, 1, 2));
        assert!(!n[&0].grouped);
    }

    #[test]
    fn other_drivers_old_generations_and_odd_values_are_left_out() {
        let mut p = pools();
        let mut other = grouped("node-a", 1, &[8]);
        other.spec.driver = "gpu.topodra.dev".into();
        assert!(p.apply_slice(&other).is_empty());
        p.apply_slice(&grouped("node-a", 2, &[56, 56]));
        let mut stale = grouped("node-a", 1, &[4]);
        stale.metadata.name = Some("stale".into());
        p.apply_slice(&stale);
        assert_eq!(p.numa("node-a")[&0].total, 56);
        let mut odd = grouped("node-b", 1, &[8]);
        odd.spec.devices.as_mut().unwrap()[0]
            .capacity
            .as_mut()
            .unwrap()
            .get_mut("dra.cpu/cpu")
            .unwrap()
            .value = Quantity("1500m".into());
        p.apply_slice(&odd);
        assert!(p.numa("node-b").is_empty());
        assert_eq!(whole(&Quantity("-1".into())), None);
    }
}
