//! What the controller has seen of each watched resource, so that a relist can tell
//! which objects went while the watch was away, and readiness which watches have
//! delivered their initial state.

use std::collections::HashSet;
use std::hash::Hash;

use kube::runtime::watcher::Event;
use topodra_model::capacity::ClaimKey;

use super::watched::{Kind, Watched};
use super::{PodKey, State};

/// Which objects of one resource the controller has, so that a watch that starts
/// over (a relist after its resource version expired) can tell which ones went while
/// it was away: those it knew and did not see again.
#[derive(Debug)]
pub(super) struct Tracker<K> {
    known: HashSet<K>,
    relisting: Option<HashSet<K>>,
    synced: bool,
}

impl<K: Hash + Eq + Clone> Tracker<K> {
    pub(super) fn new() -> Self {
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

/// Feeds one watch event of `W` into the state, keeping its tracker current.
pub(super) fn feed<W: Watched>(state: &mut State, event: Event<W::Object>) {
    match event {
        Event::Apply(o) | Event::InitApply(o) => {
            if let Some(k) = W::key(&o) {
                W::tracker(state).seen(k.clone());
                W::apply(state, k, o);
            }
        }
        Event::Delete(o) => {
            if let Some(k) = W::key(&o) {
                W::tracker(state).gone(&k);
                W::delete(state, k);
            }
        }
        Event::Init => W::tracker(state).init(),
        Event::InitDone => {
            for k in W::tracker(state).init_done() {
                W::delete(state, k);
            }
        }
    }
    W::reset(state);
}

/// Every resource's tracker.
#[derive(Debug)]
pub(super) struct Trackers {
    pub(super) slices: Tracker<String>,
    pub(super) cpu_slices: Tracker<String>,
    pub(super) claims: Tracker<ClaimKey>,
    pub(super) taint_rules: Tracker<String>,
    pub(super) classes: Tracker<String>,
    pub(super) nodes: Tracker<String>,
    pub(super) pods: Tracker<PodKey>,
    pub(super) nrts: Tracker<String>,
}

impl Trackers {
    pub(super) fn new() -> Self {
        Self {
            slices: Tracker::new(),
            cpu_slices: Tracker::new(),
            claims: Tracker::new(),
            taint_rules: Tracker::new(),
            classes: Tracker::new(),
            nodes: Tracker::new(),
            pods: Tracker::new(),
            nrts: Tracker::new(),
        }
    }

    /// Whether the watch of `kind` has delivered its initial state.
    pub(super) fn synced(&self, kind: Kind) -> bool {
        match kind {
            Kind::Slices => self.slices.synced,
            Kind::CpuSlices => self.cpu_slices.synced,
            Kind::Claims => self.claims.synced,
            Kind::TaintRules => self.taint_rules.synced,
            Kind::Classes => self.classes.synced,
            Kind::Nodes => self.nodes.synced,
            Kind::Pods => self.pods.synced,
            Kind::Nrts => self.nrts.synced,
        }
    }
}
