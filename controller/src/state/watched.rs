//! The resources the controller watches, each behind one trait: how its objects are
//! keyed, what taking one in or dropping one does to the [`State`], and which ones a
//! relist did not bring back.

use std::fmt;
use std::hash::Hash;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use kube::api::{DynamicObject, PartialObjectMeta};
use topodra_model::capacity::ClaimKey;

use super::tracker::Tracker;
use super::{PodKey, State};

/// One watched resource. Metrics, logs and readiness name it by [`Kind::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    /// Our driver's ResourceSlices (selected by `spec.driver`).
    Slices,
    /// The CPU driver's ResourceSlices (a watch of its own, by `spec.driver`).
    CpuSlices,
    Claims,
    TaintRules,
    Classes,
    Nodes,
    /// Pods no node has taken yet.
    Pods,
    /// Our NodeResourceTopology objects (by label).
    Nrts,
}

impl Kind {
    /// The resource's name in metrics labels, logs and the readiness answer.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Slices => "resourceslices",
            Kind::CpuSlices => "resourceslices-cpu",
            Kind::Claims => "resourceclaims",
            Kind::TaintRules => "devicetaintrules",
            Kind::Classes => "deviceclasses",
            Kind::Nodes => "nodes",
            Kind::Pods => "pods",
            Kind::Nrts => "noderesourcetopologies",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the state does with the objects of one watched resource.
pub(super) trait Watched {
    type Object;
    type Key: Hash + Eq + Clone;

    /// The object's key; `None` for an object without one (never kept).
    fn key(object: &Self::Object) -> Option<Self::Key>;
    /// Takes in a new or changed object, under its key.
    fn apply(state: &mut State, key: Self::Key, object: Self::Object);
    /// Drops an object that is gone.
    fn delete(state: &mut State, key: Self::Key);
    /// After every event: what the resource's objects together decide (the classes
    /// that make claims ours, say). Nothing by default.
    fn reset(_state: &mut State) {}
    /// The resource's tracker in the state.
    fn tracker(state: &mut State) -> &mut Tracker<Self::Key>;
}

fn name_of<K: kube::Resource>(o: &K) -> Option<String> {
    o.meta().name.clone()
}

pub(super) struct Slices;

impl Watched for Slices {
    type Object = ResourceSlice;
    type Key = String;

    fn key(o: &ResourceSlice) -> Option<String> {
        name_of(o)
    }
    fn apply(state: &mut State, _name: String, o: ResourceSlice) {
        let touched = state.cluster.apply_slice(&o);
        state.touched(touched);
    }
    fn delete(state: &mut State, name: String) {
        let touched = state.cluster.delete_slice(&name);
        state.touched(touched);
    }
    fn tracker(state: &mut State) -> &mut Tracker<String> {
        &mut state.trackers.slices
    }
}

pub(super) struct CpuSlices;

impl Watched for CpuSlices {
    type Object = ResourceSlice;
    type Key = String;

    fn key(o: &ResourceSlice) -> Option<String> {
        name_of(o)
    }
    fn apply(state: &mut State, _name: String, o: ResourceSlice) {
        let touched = state.cpus.apply_slice(&o);
        state.touched(touched);
    }
    fn delete(state: &mut State, name: String) {
        let touched = state.cpus.delete_slice(&name);
        state.touched(touched);
    }
    fn tracker(state: &mut State) -> &mut Tracker<String> {
        &mut state.trackers.cpu_slices
    }
}

pub(super) struct Claims;

impl Watched for Claims {
    type Object = ResourceClaim;
    type Key = ClaimKey;

    fn key(c: &ResourceClaim) -> Option<ClaimKey> {
        Some(ClaimKey::of(c))
    }
    fn apply(state: &mut State, key: ClaimKey, c: ResourceClaim) {
        let allocated = c.status.as_ref().is_some_and(|s| s.allocation.is_some());
        let mut touched = state.cluster.apply_claim(&c);
        touched.extend(state.cpus.apply_claim(&c));
        if allocated {
            state.pods_dirty |= state.waiting_claims.remove(&key).is_some();
        } else {
            state.waiting_claims.insert(key, c);
            state.pods_dirty = true;
        }
        state.touched(touched);
    }
    fn delete(state: &mut State, key: ClaimKey) {
        state.pods_dirty |= state.waiting_claims.remove(&key).is_some();
        let mut touched = state.cluster.delete_claim(&key);
        touched.extend(state.cpus.delete_claim(&key));
        state.touched(touched);
    }
    fn tracker(state: &mut State) -> &mut Tracker<ClaimKey> {
        &mut state.trackers.claims
    }
}

pub(super) struct TaintRules;

impl Watched for TaintRules {
    type Object = DeviceTaintRule;
    type Key = String;

    fn key(o: &DeviceTaintRule) -> Option<String> {
        name_of(o)
    }
    fn apply(state: &mut State, _name: String, o: DeviceTaintRule) {
        let touched = state.cluster.apply_taint_rule(&o);
        state.touched(touched);
    }
    fn delete(state: &mut State, name: String) {
        let touched = state.cluster.delete_taint_rule(&name);
        state.touched(touched);
    }
    fn tracker(state: &mut State) -> &mut Tracker<String> {
        &mut state.trackers.taint_rules
    }
}

pub(super) struct Classes;

impl Watched for Classes {
    type Object = DeviceClass;
    type Key = String;

    fn key(o: &DeviceClass) -> Option<String> {
        name_of(o)
    }
    fn apply(state: &mut State, name: String, c: DeviceClass) {
        state.classes.insert(name, c);
    }
    fn delete(state: &mut State, name: String) {
        state.classes.remove(&name);
    }
    /// Which classes are ours (and the CPU driver's) follows from all of them.
    fn reset(state: &mut State) {
        state.classes_changed();
    }
    fn tracker(state: &mut State) -> &mut Tracker<String> {
        &mut state.trackers.classes
    }
}

pub(super) struct Nodes;

impl Watched for Nodes {
    type Object = PartialObjectMeta<Node>;
    type Key = String;

    fn key(o: &PartialObjectMeta<Node>) -> Option<String> {
        name_of(o)
    }
    fn apply(state: &mut State, name: String, n: PartialObjectMeta<Node>) {
        let Some(uid) = n.metadata.uid else {
            return;
        };
        if state.node_uids.insert(name.clone(), uid.clone()) != Some(uid) {
            // A look asked for before the Node arrived found no Node to reconcile:
            // a node already waiting is asked for again.
            if state.dirty_nodes.contains(&name) {
                state.triggers.push(name);
            } else {
                state.node_dirty(name);
            }
        }
    }
    fn delete(state: &mut State, name: String) {
        // The garbage collector deletes the node's object with it (its owner); no
        // look is due, and none can be made without the Node.
        state.node_uids.remove(&name);
        state.dirty_nodes.remove(&name);
        state.dirty_since.remove(&name);
    }
    fn tracker(state: &mut State) -> &mut Tracker<String> {
        &mut state.trackers.nodes
    }
}

pub(super) struct Pods;

impl Watched for Pods {
    type Object = Pod;
    type Key = PodKey;

    fn key(p: &Pod) -> Option<PodKey> {
        Some((p.metadata.namespace.clone()?, p.metadata.name.clone()?))
    }
    fn apply(state: &mut State, key: PodKey, p: Pod) {
        state.pods.insert(key, p);
        state.pods_dirty = true;
    }
    fn delete(state: &mut State, key: PodKey) {
        state.pods.remove(&key);
        state.pods_dirty = true;
    }
    fn tracker(state: &mut State) -> &mut Tracker<PodKey> {
        &mut state.trackers.pods
    }
}

pub(super) struct Nrts;

impl Watched for Nrts {
    type Object = DynamicObject;
    type Key = String;

    fn key(o: &DynamicObject) -> Option<String> {
        name_of(o)
    }
    fn apply(state: &mut State, name: String, o: DynamicObject) {
        let Ok(value) = serde_json::to_value(&o) else {
            return;
        };
        // Our own writes come back here; the plan compares and finds nothing to do.
        // A change by someone else is undone.
        state.nrts.insert(name.clone(), value);
        state.node_dirty(name);
    }
    fn delete(state: &mut State, name: String) {
        state.nrts.remove(&name);
        state.node_dirty(name);
    }
    fn tracker(state: &mut State) -> &mut Tracker<String> {
        &mut state.trackers.nrts
    }
}
