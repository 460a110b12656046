//! Everything the controller knows, updated from watch events, and what it should
//! write because of it. No I/O here: the run loop feeds events in and carries the
//! planned writes out, so this is tested with plain objects.

mod tracker;
mod watched;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::classes::OurClasses;
use crate::nrt::{self, NrtOptions};
use crate::pending;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use kube::api::{DynamicObject, PartialObjectMeta};
use kube::runtime::watcher::Event;
use serde_json::Value;
use topodra_model::capacity::{ClaimKey, Cluster, CpuPools, Finding};
use topodra_model::slice::attributes::NUMA_NODE;

use tracker::{Trackers, feed};
pub(crate) use watched::Kind;

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
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Input::Slice(_) => Kind::Slices,
            Input::CpuSlice(_) => Kind::CpuSlices,
            Input::Claim(_) => Kind::Claims,
            Input::TaintRule(_) => Kind::TaintRules,
            Input::Class(_) => Kind::Classes,
            Input::Node(_) => Kind::Nodes,
            Input::Pod(_) => Kind::Pods,
            Input::Nrt(_) => Kind::Nrts,
        }
    }
}

/// A write the controller should make.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Write {
    /// Server-side apply of a node's NodeResourceTopology (what a whole-fleet pass
    /// would write; the reconciler takes one node's [`NrtPlan`] at a time).
    #[cfg(test)]
    ApplyNrt { node: String, object: Value },
    #[cfg(test)]
    DeleteNrt { node: String },
    /// An Event on a waiting pod.
    PodEvent {
        namespace: String,
        name: String,
        uid: String,
        message: String,
    },
}

/// What a node's NodeResourceTopology needs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum NrtPlan {
    /// Server-side apply of this object.
    Apply(Value),
    /// The node's GPUs are gone: the object goes.
    Delete,
    /// The server holds what the model says.
    UpToDate,
    /// No object, and none wanted.
    Nothing,
}

/// What one watch event changed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "whether a write pass is due follows from it, and its findings are reported"]
pub(crate) struct Applied {
    /// The capacity model changed: its metrics and every explanation may differ.
    pub(crate) model: bool,
    /// Something a write pass acts on changed: a node to look at again, a waiting
    /// pod's explanation, or a watch that finished its initial state.
    pub(crate) pass_due: bool,
    /// Slice content the model did not take, seen with this event. An event can
    /// bring one without changing the model: the slice that completes a pool split
    /// across two nodes changes no node.
    pub(crate) findings: Vec<Finding>,
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
    trackers: Trackers,
    /// Nodes whose NodeResourceTopology may need a write, and since when each waits.
    dirty_nodes: BTreeSet<String>,
    dirty_since: HashMap<String, Instant>,
    /// Nodes to hand to the reconciler (see [`State::take_triggers`]).
    triggers: Vec<String>,
    /// Something a waiting pod's explanation depends on changed.
    pods_dirty: bool,
    /// The capacity model changed during the event being applied.
    model_changed: bool,
    explained: HashMap<String, Explained>,
    /// Per node, the CPU driver's NUMA ids that are not among the node's own (its
    /// slices announce those): left out of its NodeResourceTopology zones.
    ignored_cpu_numa: BTreeMap<String, BTreeSet<u32>>,
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
            trackers: Trackers::new(),
            dirty_nodes: BTreeSet::new(),
            dirty_since: HashMap::new(),
            triggers: Vec::new(),
            pods_dirty: false,
            model_changed: false,
            explained: HashMap::new(),
            ignored_cpu_numa: BTreeMap::new(),
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

    /// The watched resources, of `watched`, that have not delivered their initial
    /// state yet.
    pub(crate) fn unsynced(&self, watched: &BTreeSet<Kind>) -> Vec<Kind> {
        watched
            .iter()
            .copied()
            .filter(|k| !self.trackers.synced(*k))
            .collect()
    }

    pub(crate) fn pending_pods(&self) -> usize {
        self.explained.len()
    }

    /// Takes one watch event in.
    pub(crate) fn apply(&mut self, input: Input) -> Applied {
        let kind = input.kind();
        let nodes_before = self.dirty_nodes.len();
        let pods_before = self.pods_dirty;
        let synced_before = self.trackers.synced(kind);
        self.model_changed = false;
        match input {
            Input::Slice(e) => feed::<watched::Slices>(self, e),
            Input::CpuSlice(e) => feed::<watched::CpuSlices>(self, e),
            Input::Claim(e) => feed::<watched::Claims>(self, e),
            Input::TaintRule(e) => feed::<watched::TaintRules>(self, e),
            Input::Class(e) => feed::<watched::Classes>(self, e),
            Input::Node(e) => feed::<watched::Nodes>(self, e),
            Input::Pod(e) => feed::<watched::Pods>(self, e),
            Input::Nrt(e) => feed::<watched::Nrts>(self, e),
        }
        let model = self.model_changed;
        self.pods_dirty |= model;
        Applied {
            model,
            pass_due: model
                || self.dirty_nodes.len() != nodes_before
                || (self.pods_dirty && !pods_before)
                || self.trackers.synced(kind) != synced_before,
            findings: self.cluster.take_findings(),
        }
    }

    /// Nodes whose model changed: their objects may need a write.
    fn touched(&mut self, nodes: BTreeSet<String>) {
        self.model_changed |= !nodes.is_empty();
        for node in nodes {
            self.node_dirty(node);
        }
    }

    /// The node's object may need a write: a node that was clean asks for a look.
    fn node_dirty(&mut self, node: String) {
        if self.dirty_nodes.insert(node.clone()) {
            self.dirty_since
                .entry(node.clone())
                .or_insert_with(Instant::now);
            self.triggers.push(node);
        }
    }

    /// The DeviceClasses changed: which are ours, and the CPU driver's, follows anew.
    fn classes_changed(&mut self) {
        self.ours = OurClasses::from_classes(
            self.classes.values(),
            self.cluster.driver(),
            &self.extra_classes,
        );
        self.cpu_classes = OurClasses::from_classes(self.classes.values(), self.cpus.driver(), &[]);
        self.pods_dirty = true;
    }

    /// Every node with GPUs or an object of ours, for a new leader's first pass.
    pub(crate) fn mark_all_dirty(&mut self) {
        let mut nodes: BTreeSet<String> = self.cluster.nodes().map(|s| s.node.clone()).collect();
        nodes.extend(self.nrts.keys().cloned());
        for node in nodes {
            self.node_dirty(node.clone());
            // Already waiting, perhaps since before this replica led: looked at anew.
            self.triggers.push(node);
        }
        self.pods_dirty = true;
        self.explained.clear();
    }

    pub(crate) fn pods_dirty(&self) -> bool {
        self.pods_dirty
    }

    /// What a node's NodeResourceTopology needs now, without taking it: the
    /// reconciler asks first, so that an object already up to date costs neither a
    /// turn of the write budget nor the node's write interval.
    pub(crate) fn nrt_plan(&mut self, node: &str, opts: &NrtOptions) -> NrtPlan {
        let uid = self.node_uids.get(node);
        let mut cpus = self.cpus.numa(node);
        // Another driver's NUMA ids count only where the node has them: a dra.cpu
        // slice with ids 896-1023 would otherwise give a 2-NUMA node 130 zones.
        let summary = self.cluster.node(node);
        let foreign: BTreeSet<u32> = cpus
            .keys()
            .copied()
            .filter(|id| summary.is_some_and(|s| !s.has_numa_node(*id)))
            .collect();
        cpus.retain(|id, _| !foreign.contains(id));
        if foreign.is_empty() {
            self.ignored_cpu_numa.remove(node);
        } else if self.ignored_cpu_numa.get(node) != Some(&foreign) {
            tracing::warn!(
                node,
                ignored = %topodra_model::IdList::from_iter(foreign.iter().copied()),
                "the CPU driver publishes NUMA nodes this node's slices do not have; left out of its zones"
            );
            self.ignored_cpu_numa.insert(node.to_owned(), foreign);
        }
        let want = uid
            .zip(summary)
            .and_then(|(uid, s)| nrt::desired(s, &cpus, uid, opts));
        match (want, self.nrts.get(node)) {
            (Some(want), Some(have)) if nrt::up_to_date(have, &want) => NrtPlan::UpToDate,
            (Some(object), _) => NrtPlan::Apply(object),
            (None, Some(_)) => NrtPlan::Delete,
            (None, None) => NrtPlan::Nothing,
        }
    }

    /// The node's plan, taken: the node is clean again until its next change, and
    /// the answer says since when it waited for this write.
    pub(crate) fn take_nrt_plan(
        &mut self,
        node: &str,
        opts: &NrtOptions,
    ) -> (NrtPlan, Option<Instant>) {
        let plan = self.nrt_plan(node, opts);
        (plan, self.settled(node))
    }

    /// The node's object needs nothing more: it is clean until its next change.
    /// Returns since when it waited.
    pub(crate) fn settled(&mut self, node: &str) -> Option<Instant> {
        self.dirty_nodes.remove(node);
        self.dirty_since.remove(node)
    }

    /// A write the reconciler could not make: the node waits for it again, from the
    /// time it first waited.
    pub(crate) fn write_failed(&mut self, node: &str, since: Option<Instant>) {
        self.dirty_nodes.insert(node.to_owned());
        if let Some(since) = since {
            self.dirty_since.entry(node.to_owned()).or_insert(since);
        }
    }

    /// The nodes to reconcile since the last call: each node that began to wait for a
    /// look, and each node that became known (a reconcile asked for before its Node
    /// arrived found nothing to reconcile).
    pub(crate) fn take_triggers(&mut self) -> Vec<String> {
        let mut nodes = std::mem::take(&mut self.triggers);
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    /// How many nodes wait for a look at their object.
    pub(crate) fn nodes_waiting(&self) -> usize {
        self.dirty_nodes.len()
    }

    /// The writes for every node that waits, each plan taken: what a pass over the
    /// whole fleet would write. Tests read the plans through it.
    #[cfg(test)]
    pub(crate) fn plan_nrt(&mut self, opts: &NrtOptions, skipped: &mut u64) -> Vec<Write> {
        let nodes: Vec<String> = self.dirty_nodes.iter().cloned().collect();
        let mut writes = Vec::new();
        for node in nodes {
            match self.take_nrt_plan(&node, opts).0 {
                NrtPlan::UpToDate => *skipped = skipped.saturating_add(1),
                NrtPlan::Apply(object) => writes.push(Write::ApplyNrt { node, object }),
                NrtPlan::Delete => writes.push(Write::DeleteNrt { node }),
                NrtPlan::Nothing => {}
            }
        }
        self.triggers.clear();
        writes
    }

    /// The CPU driver's NUMA ids left out of zones, over all nodes.
    pub(crate) fn ignored_cpu_numa_nodes(&self) -> usize {
        self.ignored_cpu_numa.values().map(BTreeSet::len).sum()
    }

    /// Events for waiting pods whose explanation changed, at most one per pod per
    /// `min_interval`. Pods that no longer wait are forgotten.
    pub(crate) fn plan_events(&mut self, now: Instant, min_interval: Duration) -> Vec<Write> {
        self.pods_dirty = false;
        let mut writes = Vec::new();
        let mut waiting: HashSet<String> = HashSet::new();
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
            waiting.insert(uid.clone());
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
        self.explained.retain(|uid, _| waiting.contains(uid));
        writes
    }
}

#[cfg(test)]
mod tests;
