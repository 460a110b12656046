//! Everything the controller knows, updated from watch events, and what it should
//! write because of it. No I/O here: the run loop feeds events in and carries the
//! planned writes out, so this is tested with plain objects.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::Hash;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use kube::Resource;
use kube::api::{DynamicObject, PartialObjectMeta};
use kube::runtime::watcher::Event;
use serde_json::Value;
use topodra_controller::classes::OurClasses;
use topodra_controller::nrt::{self, NrtOptions};
use topodra_controller::pending;
use topodra_driver::capacity::{ClaimKey, Cluster, CpuPools};
use topodra_driver::slice::attributes::NUMA_NODE;

/// One watch event of one of the resources the controller watches. Events are
/// consumed one at a time, straight off the stream, so their size matters little.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Input {
    Slice(Event<ResourceSlice>),
    /// Slices of the CPU driver (a watch of its own, by `spec.driver`).
    CpuSlice(Event<ResourceSlice>),
    Claim(Event<ResourceClaim>),
    TaintRule(Event<DeviceTaintRule>),
    Class(Event<DeviceClass>),
    Node(Event<PartialObjectMeta<Node>>),
    Pod(Event<Pod>),
    Nrt(Event<DynamicObject>),
}

impl Input {
    pub(crate) fn resource(&self) -> &'static str {
        match self {
            Input::Slice(_) => "resourceslices",
            Input::CpuSlice(_) => CPU_SLICES,
            Input::Claim(_) => "resourceclaims",
            Input::TaintRule(_) => "devicetaintrules",
            Input::Class(_) => "deviceclasses",
            Input::Node(_) => "nodes",
            Input::Pod(_) => "pods",
            Input::Nrt(_) => "noderesourcetopologies",
        }
    }
}

/// The watch of the CPU driver's ResourceSlices, as metrics and logs name it.
pub(crate) const CPU_SLICES: &str = "resourceslices-cpu";

/// A write the controller should make.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Write {
    /// Server-side apply of a node's NodeResourceTopology.
    ApplyNrt {
        node: String,
        object: Value,
    },
    DeleteNrt {
        node: String,
    },
    /// An Event on a waiting pod.
    PodEvent {
        namespace: String,
        name: String,
        uid: String,
        message: String,
    },
}

/// Which objects of one resource the controller has, so that a watch that starts
/// over (a relist after its resource version expired) can tell which ones went while
/// it was away: those it knew and did not see again.
#[derive(Debug)]
struct Tracker<K> {
    known: HashSet<K>,
    relisting: Option<HashSet<K>>,
    synced: bool,
}

impl<K: Hash + Eq + Clone> Tracker<K> {
    fn new() -> Self {
        Self {
            known: HashSet::new(),
            relisting: None,
            synced: false,
        }
    }

    fn init(&mut self) {
        self.relisting = Some(HashSet::new());
    }

    fn seen(&mut self, key: K) {
        if let Some(r) = &mut self.relisting {
            r.insert(key.clone());
        }
        self.known.insert(key);
    }

    fn gone(&mut self, key: &K) {
        self.known.remove(key);
    }

    /// The keys that the relist did not bring back.
    fn init_done(&mut self) -> Vec<K> {
        self.synced = true;
        let Some(seen) = self.relisting.take() else {
            return Vec::new();
        };
        let stale: Vec<K> = self
            .known
            .iter()
            .filter(|k| !seen.contains(k))
            .cloned()
            .collect();
        for k in &stale {
            self.known.remove(k);
        }
        stale
    }
}

type PodKey = (String, String);

/// The last Event sent for a waiting pod.
#[derive(Debug, Clone)]
struct Explained {
    message: String,
    at: Instant,
}

/// What the controller knows and what it has decided to write.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) cluster: Cluster,
    /// The CPU driver's CPUs, for claims that couple them with our GPUs.
    cpus: CpuPools,
    cpu_classes: OurClasses,
    /// Attribute names that align on the NUMA node: the standard one and aliases.
    numa_names: Vec<String>,
    extra_classes: Vec<String>,
    classes: HashMap<String, DeviceClass>,
    ours: OurClasses,
    node_uids: HashMap<String, String>,
    pods: HashMap<PodKey, Pod>,
    /// Claims not allocated yet: all a waiting pod's demand can come from.
    waiting_claims: HashMap<ClaimKey, ResourceClaim>,
    nrts: HashMap<String, Value>,
    slices_seen: Tracker<String>,
    cpu_slices_seen: Tracker<String>,
    claims_seen: Tracker<ClaimKey>,
    rules_seen: Tracker<String>,
    classes_seen: Tracker<String>,
    nodes_seen: Tracker<String>,
    pods_seen: Tracker<PodKey>,
    nrts_seen: Tracker<String>,
    /// Nodes whose NodeResourceTopology may need a write.
    dirty_nodes: BTreeSet<String>,
    /// Something a waiting pod's explanation depends on changed.
    pods_dirty: bool,
    explained: HashMap<String, Explained>,
}

impl State {
    pub(crate) fn new(driver: &str, extra_classes: Vec<String>) -> Self {
        Self {
            cluster: Cluster::new(driver),
            cpus: CpuPools::new(String::new(), vec![NUMA_NODE.to_owned()]),
            cpu_classes: OurClasses::default(),
            numa_names: vec![NUMA_NODE.to_owned()],
            ours: OurClasses::from_classes([], driver, &extra_classes),
            extra_classes,
            classes: HashMap::new(),
            node_uids: HashMap::new(),
            pods: HashMap::new(),
            waiting_claims: HashMap::new(),
            nrts: HashMap::new(),
            slices_seen: Tracker::new(),
            cpu_slices_seen: Tracker::new(),
            claims_seen: Tracker::new(),
            rules_seen: Tracker::new(),
            classes_seen: Tracker::new(),
            nodes_seen: Tracker::new(),
            pods_seen: Tracker::new(),
            nrts_seen: Tracker::new(),
            dirty_nodes: BTreeSet::new(),
            pods_dirty: false,
            explained: HashMap::new(),
        }
    }

    /// Takes in the CPU driver `driver` (`dra.cpu`) beside ours, and the other names
    /// for the NUMA node that our plugins publish (`dra.net/numaNode`).
    pub(crate) fn with_cpu_driver(mut self, driver: &str, numa_aliases: &[String]) -> Self {
        self.numa_names = std::iter::once(NUMA_NODE.to_owned())
            .chain(numa_aliases.iter().cloned())
            .collect();
        self.cpus = CpuPools::new(driver, self.numa_names.clone());
        self.cpu_classes = OurClasses::from_classes(self.classes.values(), driver, &[]);
        self
    }

    /// Whether every watch has delivered its initial state; `optional` names the
    /// resources that may not be served (not waited for).
    pub(crate) fn unsynced(&self, watched: &BTreeSet<&'static str>) -> Vec<&'static str> {
        let all = [
            ("resourceslices", self.slices_seen.synced),
            (CPU_SLICES, self.cpu_slices_seen.synced),
            ("resourceclaims", self.claims_seen.synced),
            ("devicetaintrules", self.rules_seen.synced),
            ("deviceclasses", self.classes_seen.synced),
            ("nodes", self.nodes_seen.synced),
            ("pods", self.pods_seen.synced),
            ("noderesourcetopologies", self.nrts_seen.synced),
        ];
        all.into_iter()
            .filter(|(r, synced)| watched.contains(r) && !synced)
            .map(|(r, _)| r)
            .collect()
    }

    pub(crate) fn pending_pods(&self) -> usize {
        self.explained.len()
    }

    /// Takes one watch event in. Returns whether the capacity model changed.
    pub(crate) fn apply(&mut self, input: Input) -> bool {
        let before = self.dirty_nodes.len();
        let mut model_changed = false;
        match input {
            Input::Slice(e) => model_changed |= self.apply_named(e, &SLICES),
            Input::CpuSlice(e) => {
                for change in changes(e, &mut self.cpu_slices_seen, |o: &ResourceSlice| {
                    o.metadata.name.clone()
                }) {
                    let touched = match change {
                        Change::Apply(o) => self.cpus.apply_slice(&o),
                        Change::Delete(name) => self.cpus.delete_slice(&name),
                    };
                    model_changed |= !touched.is_empty();
                    self.dirty_nodes.extend(touched);
                }
            }
            Input::Claim(e) => {
                let key = |c: &ResourceClaim| Some(ClaimKey::of(c));
                for change in changes(e, &mut self.claims_seen, key) {
                    let touched = match change {
                        Change::Apply(c) => {
                            let key = ClaimKey::of(&c);
                            let allocated =
                                c.status.as_ref().is_some_and(|s| s.allocation.is_some());
                            let mut touched = self.cluster.apply_claim(&c);
                            touched.extend(self.cpus.apply_claim(&c));
                            if allocated {
                                self.pods_dirty |= self.waiting_claims.remove(&key).is_some();
                            } else {
                                self.waiting_claims.insert(key, c);
                                self.pods_dirty = true;
                            }
                            touched
                        }
                        Change::Delete(key) => {
                            self.pods_dirty |= self.waiting_claims.remove(&key).is_some();
                            let mut touched = self.cluster.delete_claim(&key);
                            touched.extend(self.cpus.delete_claim(&key));
                            touched
                        }
                    };
                    model_changed |= !touched.is_empty();
                    self.dirty_nodes.extend(touched);
                }
            }
            Input::TaintRule(e) => model_changed |= self.apply_named(e, &TAINT_RULES),
            Input::Class(e) => {
                for change in changes(e, &mut self.classes_seen, |c: &DeviceClass| {
                    c.metadata.name.clone()
                }) {
                    match change {
                        Change::Apply(c) => {
                            if let Some(name) = c.metadata.name.clone() {
                                self.classes.insert(name, c);
                            }
                        }
                        Change::Delete(name) => {
                            self.classes.remove(&name);
                        }
                    }
                }
                self.ours = OurClasses::from_classes(
                    self.classes.values(),
                    self.cluster.driver(),
                    &self.extra_classes,
                );
                self.cpu_classes =
                    OurClasses::from_classes(self.classes.values(), self.cpus.driver(), &[]);
                self.pods_dirty = true;
            }
            Input::Node(e) => {
                for change in changes(e, &mut self.nodes_seen, |n: &PartialObjectMeta<Node>| {
                    n.metadata.name.clone()
                }) {
                    match change {
                        Change::Apply(n) => {
                            let (Some(name), Some(uid)) = (n.metadata.name, n.metadata.uid) else {
                                continue;
                            };
                            if self.node_uids.insert(name.clone(), uid.clone()) != Some(uid) {
                                self.dirty_nodes.insert(name);
                            }
                        }
                        Change::Delete(name) => {
                            self.node_uids.remove(&name);
                            self.dirty_nodes.insert(name);
                        }
                    }
                }
            }
            Input::Pod(e) => {
                let key = |p: &Pod| Some((p.metadata.namespace.clone()?, p.metadata.name.clone()?));
                for change in changes(e, &mut self.pods_seen, key) {
                    match change {
                        Change::Apply(p) => {
                            if let Some(k) = key(&p) {
                                self.pods.insert(k, p);
                            }
                        }
                        Change::Delete(k) => {
                            self.pods.remove(&k);
                        }
                    }
                }
                self.pods_dirty = true;
            }
            Input::Nrt(e) => {
                for change in changes(e, &mut self.nrts_seen, |o: &DynamicObject| {
                    o.metadata.name.clone()
                }) {
                    match change {
                        Change::Apply(o) => {
                            let Some(name) = o.metadata.name.clone() else {
                                continue;
                            };
                            let Ok(value) = serde_json::to_value(&o) else {
                                continue;
                            };
                            // Our own writes come back here; the plan compares and
                            // finds nothing to do. A change by someone else is undone.
                            self.dirty_nodes.insert(name.clone());
                            self.nrts.insert(name, value);
                        }
                        Change::Delete(name) => {
                            self.nrts.remove(&name);
                            self.dirty_nodes.insert(name);
                        }
                    }
                }
            }
        }
        self.pods_dirty |= model_changed;
        model_changed || self.dirty_nodes.len() != before
    }

    /// Takes in one watch event of an object the capacity model keeps by name.
    /// Returns whether the model changed.
    fn apply_named<K: Resource>(&mut self, event: Event<K>, named: &Named<K>) -> bool {
        let changes = changes(event, (named.seen)(self), |o: &K| o.meta().name.clone());
        let mut changed = false;
        for change in changes {
            let touched = match change {
                Change::Apply(o) => (named.apply)(&mut self.cluster, &o),
                Change::Delete(name) => (named.delete)(&mut self.cluster, &name),
            };
            changed |= !touched.is_empty();
            self.dirty_nodes.extend(touched);
        }
        changed
    }

    /// Every node with GPUs or an object of ours, for a new leader's first pass.
    pub(crate) fn mark_all_dirty(&mut self) {
        let nodes: Vec<String> = self.cluster.nodes().map(|s| s.node.clone()).collect();
        self.dirty_nodes.extend(nodes);
        self.dirty_nodes.extend(self.nrts.keys().cloned());
        self.pods_dirty = true;
        self.explained.clear();
    }

    pub(crate) fn has_dirty_nodes(&self) -> bool {
        !self.dirty_nodes.is_empty()
    }

    pub(crate) fn pods_dirty(&self) -> bool {
        self.pods_dirty
    }

    /// The NodeResourceTopology writes for the nodes that changed: an apply where
    /// the object differs from what the server holds, a delete where the node or its
    /// GPUs are gone. Objects already up to date are counted in `skipped`.
    pub(crate) fn plan_nrt(&mut self, opts: &NrtOptions, skipped: &mut u64) -> Vec<Write> {
        let mut writes = Vec::new();
        for node in std::mem::take(&mut self.dirty_nodes) {
            let uid = self.node_uids.get(&node);
            let cpus = self.cpus.numa(&node);
            let want =
                uid.and_then(|uid| nrt::desired(self.cluster.node(&node)?, &cpus, uid, opts));
            match (want, self.nrts.get(&node)) {
                (Some(want), Some(have)) if nrt::up_to_date(have, &want) => *skipped += 1,
                (Some(object), _) => writes.push(Write::ApplyNrt { node, object }),
                (None, Some(_)) => writes.push(Write::DeleteNrt { node }),
                (None, None) => {}
            }
        }
        writes
    }

    /// Events for waiting pods whose explanation changed, at most one per pod per
    /// `min_interval`. Pods that no longer wait are forgotten.
    pub(crate) fn plan_events(&mut self, now: Instant, min_interval: Duration) -> Vec<Write> {
        self.pods_dirty = false;
        let mut writes = Vec::new();
        let mut waiting: BTreeMap<String, ()> = BTreeMap::new();
        for ((namespace, name), pod) in &self.pods {
            if !pending::is_unschedulable(pod) {
                continue;
            }
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            let claim = |claim_name: &str| {
                let key = ClaimKey {
                    namespace: namespace.clone(),
                    name: claim_name.to_owned(),
                };
                self.waiting_claims.get(&key).cloned()
            };
            let cpus = pending::CpuSide {
                pools: &self.cpus,
                classes: &self.cpu_classes,
                numa_names: &self.numa_names,
            };
            let Some(verdict) = pending::verdict(&self.cluster, &cpus, pod, claim, &self.ours)
            else {
                continue;
            };
            waiting.insert(uid.clone(), ());
            let last = self.explained.get(&uid);
            let changed = last.is_none_or(|l| l.message != verdict.message);
            let due = last.is_none_or(|l| now.duration_since(l.at) >= min_interval);
            if changed && due {
                self.explained.insert(
                    uid.clone(),
                    Explained {
                        message: verdict.message.clone(),
                        at: now,
                    },
                );
                writes.push(Write::PodEvent {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    uid,
                    message: verdict.message,
                });
            } else if changed {
                // Not due yet: look again later.
                self.pods_dirty = true;
            }
        }
        self.explained.retain(|uid, _| waiting.contains_key(uid));
        writes
    }
}

/// An object to take in, or the key of one to drop.
enum Change<K, Key> {
    Apply(K),
    Delete(Key),
}

/// How the capacity model takes in and drops the objects it keeps by name.
struct Named<K> {
    seen: fn(&mut State) -> &mut Tracker<String>,
    apply: fn(&mut Cluster, &K) -> BTreeSet<String>,
    delete: fn(&mut Cluster, &str) -> BTreeSet<String>,
}

const SLICES: Named<ResourceSlice> = Named {
    seen: |s| &mut s.slices_seen,
    apply: Cluster::apply_slice,
    delete: Cluster::delete_slice,
};

const TAINT_RULES: Named<DeviceTaintRule> = Named {
    seen: |s| &mut s.rules_seen,
    apply: Cluster::apply_taint_rule,
    delete: Cluster::delete_taint_rule,
};

/// The model changes one watch event stands for, keeping `seen` current.
fn changes<K, Key: Hash + Eq + Clone>(
    event: Event<K>,
    seen: &mut Tracker<Key>,
    key: impl Fn(&K) -> Option<Key>,
) -> Vec<Change<K, Key>> {
    match event {
        Event::Apply(o) | Event::InitApply(o) => match key(&o) {
            Some(k) => {
                seen.seen(k);
                vec![Change::Apply(o)]
            }
            None => Vec::new(),
        },
        Event::Delete(o) => match key(&o) {
            Some(k) => {
                seen.gone(&k);
                vec![Change::Delete(k)]
            }
            None => Vec::new(),
        },
        Event::Init => {
            seen.init();
            Vec::new()
        }
        Event::InitDone => seen.init_done().into_iter().map(Change::Delete).collect(),
    }
}

#[cfg(test)]
mod tests;
