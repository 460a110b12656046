//! What the watch shows of our slices, what we last wrote, and what to write next.
//!
//! Pure state, no I/O: the publisher feeds it watch events and write results, and asks
//! it for a [`Decision`]. The observed side is a `kube::runtime::reflector` store: the
//! watch's events go through its writer, which also swaps in a relist's result only
//! once the relist is complete.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::watcher;
use serde_json::Value;
use tokio::time::Instant;

use super::compare::{covers, project, shape};

/// How long the apply response stands in for a watch event that has not arrived. The
/// watch delivers our own writes in order, so this only bounds the damage of a lost
/// event, after which the watch is believed again.
const ECHO_GRACE: Duration = Duration::from_secs(30);

/// The outcome of comparing the desired pool with the observed one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    /// Every desired slice is there as we would write it, and nothing else of ours.
    InSync {
        generation: i64,
    },
    Write(Plan),
}

/// What to write. Every slice of the pool is in `apply` or `create`: a new
/// generation has to be on every one of them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    pub(crate) generation: i64,
    /// Slices that reuse one of ours, under its name.
    pub(crate) apply: Vec<ResourceSlice>,
    /// Slices with no counterpart yet: no name, `generateName` set, for the API
    /// server to name.
    pub(crate) create: Vec<ResourceSlice>,
    /// Slices of ours that the pool no longer has (the slice count shrank, or one
    /// too many exists), deleted after the writes so the pool is complete at every
    /// moment.
    pub(crate) delete: Vec<ResourceSlice>,
}

#[derive(Debug)]
struct Written {
    /// The desired object as we applied it.
    desired: Value,
    /// The server's rendition of it.
    response: ResourceSlice,
    /// Until the watch shows this write, the response is newer than the watch.
    echo_pending: bool,
    at: Instant,
}

#[derive(Debug)]
pub(crate) struct PoolState {
    driver: String,
    node: String,
    /// The watch's events go in here...
    writer: Writer<ResourceSlice>,
    /// ...and the slices, as the watch shows them, come out here: ours and, until
    /// filtered out on reading, any that the field selector let through.
    observed: Store<ResourceSlice>,
    /// The initial events are complete and no relist is running.
    synced: bool,
    written: BTreeMap<String, Written>,
    /// The highest generation we wrote, so a generation is never reused for other
    /// content, even when the slices that carried it are gone.
    last_generation: Option<i64>,
}

impl PoolState {
    pub(crate) fn new(driver: impl Into<String>, node: impl Into<String>) -> Self {
        let writer = Writer::default();
        Self {
            driver: driver.into(),
            node: node.into(),
            observed: writer.as_reader(),
            writer,
            synced: false,
            written: BTreeMap::new(),
            last_generation: None,
        }
    }

    /// True once the watch's initial events are complete and no relist is running:
    /// before that, the current generation is unknown and nothing may be written.
    pub(crate) fn is_synced(&self) -> bool {
        self.synced
    }

    /// Takes a watch event; true when what we observe may have changed.
    pub(crate) fn on_event(&mut self, event: &watcher::Event<ResourceSlice>) -> bool {
        let changed = match event {
            watcher::Event::Init => {
                // The store keeps the last complete view until the relist is done.
                self.synced = false;
                false
            }
            watcher::Event::InitApply(_) => false,
            watcher::Event::InitDone => {
                self.synced = true;
                // A full list is at least as new as any write we made before it.
                for w in self.written.values_mut() {
                    w.echo_pending = false;
                }
                true
            }
            watcher::Event::Apply(s) => {
                let Some(name) = s.metadata.name.as_deref() else {
                    return false;
                };
                if !self.is_ours(s) {
                    self.observed_ours(name).is_some()
                } else {
                    if let Some(w) = self.written.get_mut(name)
                        && w.response.metadata.resource_version == s.metadata.resource_version
                    {
                        w.echo_pending = false;
                    }
                    true
                }
            }
            watcher::Event::Delete(s) => s
                .metadata
                .name
                .as_deref()
                .is_some_and(|name| self.observed_ours(name).is_some()),
        };
        self.writer.apply_watcher_event(event);
        changed
    }

    /// Records a successful apply or create: `desired` as written (for a create,
    /// before the server named it).
    pub(crate) fn applied(
        &mut self,
        desired: &ResourceSlice,
        response: ResourceSlice,
        now: Instant,
    ) {
        let Some(name) = response.metadata.name.clone() else {
            return;
        };
        let mut desired = desired.clone();
        desired.metadata.name = Some(name.clone());
        desired.metadata.generate_name = None;
        // An apply that changed nothing keeps the resourceVersion and sends no event.
        let echo_pending = self
            .observed_ours(&name)
            .map(|s| s.metadata.resource_version.clone())
            != Some(response.metadata.resource_version.clone());
        self.last_generation = self.last_generation.max(Some(desired.spec.pool.generation));
        self.written.insert(
            name,
            Written {
                desired: shape(&desired),
                response,
                echo_pending,
                at: now,
            },
        );
    }

    /// Records a successful delete (or one that found the slice already gone).
    pub(crate) fn deleted(&mut self, slice: &ResourceSlice) {
        self.writer
            .apply_watcher_event(&watcher::Event::Delete(slice.clone()));
        if let Some(name) = slice.metadata.name.as_deref() {
            self.written.remove(name);
        }
    }

    /// Compares the desired pool (its slices at any generation, names ignored) with
    /// what is observed.
    ///
    /// Our slices are those the watch shows (this node, this driver), whatever their
    /// names: each desired slice reuses one of them ([`assign`]), and those left over
    /// are deleted. The names are the API server's (`generateName`), so no one can
    /// take a name before us and make us write to their object.
    ///
    /// The pool keeps its generation while nothing differs; any difference (content,
    /// a slice missing, one too many) moves every slice to one generation above both
    /// the highest observed and the highest we ever wrote.
    pub(crate) fn decide(&self, desired: &[ResourceSlice], now: Instant) -> Decision {
        let observed = self.observed_by_name();
        let effective = self.effective(&observed, now);
        let observed_max = effective.values().map(|s| s.spec.pool.generation).max();
        let high = observed_max.max(self.last_generation);
        let names = assign(desired, &effective);
        let named: Vec<ResourceSlice> = desired
            .iter()
            .zip(&names)
            .map(|(s, name)| self.named(s, name.clone()))
            .collect();

        if let Some(generation) = high
            && names.iter().all(Option::is_some)
            && effective.len() == desired.len()
            && at_generation(&named, generation)
                .iter()
                .all(|d| self.matches(d, &effective))
        {
            return Decision::InSync { generation };
        }

        let generation = high.map_or(1, |g| g.saturating_add(1));
        let kept: BTreeSet<&str> = names.iter().flatten().map(String::as_str).collect();
        let delete = effective
            .iter()
            .filter(|(n, _)| !kept.contains(n.as_str()))
            .map(|(_, s)| (*s).clone())
            .collect();
        let (apply, create) = at_generation(&named, generation)
            .into_iter()
            .partition(|s| s.metadata.name.is_some());
        Decision::Write(Plan {
            generation,
            apply,
            create,
            delete,
        })
    }

    /// `slice` under `name`, or to be named by the server after this node and driver.
    fn named(&self, slice: &ResourceSlice, name: Option<String>) -> ResourceSlice {
        let mut s = slice.clone();
        s.metadata.generate_name = match name {
            Some(_) => None,
            None => Some(format!("{}-{}-", self.node, self.driver)),
        };
        s.metadata.name = name;
        s
    }

    /// Our slices in the store, by name.
    fn observed_by_name(&self) -> BTreeMap<String, Arc<ResourceSlice>> {
        self.observed
            .state_filter(|s| self.is_ours(s))
            .into_iter()
            .filter_map(|s| Some((s.metadata.name.clone()?, s)))
            .collect()
    }

    /// The slice of that name in the store, if it is ours.
    fn observed_ours(&self, name: &str) -> Option<Arc<ResourceSlice>> {
        self.observed
            .get(&ObjectRef::new(name))
            .filter(|s| self.is_ours(s))
    }

    /// Our slices as best known: the watch's view, except where a write of ours is
    /// newer than what the watch has shown so far.
    fn effective<'a>(
        &'a self,
        observed: &'a BTreeMap<String, Arc<ResourceSlice>>,
        now: Instant,
    ) -> BTreeMap<&'a String, &'a ResourceSlice> {
        let mut out: BTreeMap<&String, &ResourceSlice> =
            observed.iter().map(|(n, s)| (n, &**s)).collect();
        for (name, w) in &self.written {
            if w.echo_pending && now.duration_since(w.at) < ECHO_GRACE {
                out.insert(name, &w.response);
            }
        }
        out
    }

    fn matches(
        &self,
        desired: &ResourceSlice,
        effective: &BTreeMap<&String, &ResourceSlice>,
    ) -> bool {
        let Some(name) = desired.metadata.name.as_ref() else {
            return false;
        };
        let Some(observed) = effective.get(name) else {
            return false;
        };
        let (want, have) = (shape(desired), shape(*observed));
        if covers(&have, &want) {
            return true;
        }
        // The server may spell a field differently from us (a quantity it
        // canonicalizes). If what it returned for this very object is still there
        // unchanged, rewriting would only get the same answer again: without this, a
        // normalization we did not foresee would be a write loop.
        self.written.get(name).is_some_and(|w| {
            w.desired == want && project(&have, &want) == project(&shape(&w.response), &want)
        })
    }

    fn is_ours(&self, s: &ResourceSlice) -> bool {
        s.spec.driver == self.driver && s.spec.node_name.as_deref() == Some(self.node.as_str())
    }
}

/// Which of our slices each desired slice is written to: the one holding the same
/// devices, else the one sharing most devices with it, else any left; `None` when
/// none is left (it is created). Reusing slices keeps writes to one per changed
/// slice; matching by devices keeps each device in the object it was in, so a
/// reader never sees a device move between slices for nothing.
fn assign(
    desired: &[ResourceSlice],
    observed: &BTreeMap<&String, &ResourceSlice>,
) -> Vec<Option<String>> {
    let devices = |s: &ResourceSlice| -> BTreeSet<String> {
        s.spec
            .devices
            .iter()
            .flatten()
            .map(|d| d.name.clone())
            .collect()
    };
    let mut free: Vec<(&String, BTreeSet<String>)> =
        observed.iter().map(|(n, s)| (*n, devices(s))).collect();
    let wanted: Vec<BTreeSet<String>> = desired.iter().map(devices).collect();
    let mut out: Vec<Option<String>> = vec![None; desired.len()];
    for (i, want) in wanted.iter().enumerate() {
        if let Some(at) = free.iter().position(|(_, have)| have == want) {
            out[i] = Some(free.remove(at).0.clone());
        }
    }
    for (i, want) in wanted.iter().enumerate() {
        if out[i].is_some() || free.is_empty() {
            continue;
        }
        // max_by_key keeps the last of equals; the first (by name) is wanted.
        let at = free
            .iter()
            .enumerate()
            .rev()
            .max_by_key(|(_, (_, have))| have.intersection(want).count())
            .map_or(0, |(at, _)| at);
        out[i] = Some(free.remove(at).0.clone());
    }
    out
}

/// The slices with the pool generation set.
fn at_generation(slices: &[ResourceSlice], generation: i64) -> Vec<ResourceSlice> {
    slices
        .iter()
        .map(|s| {
            let mut s = s.clone();
            s.spec.pool.generation = generation;
            s
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::tests::pool_slices;

    /// The pool of `devices` devices on node `n`, two per slice.
    fn pool(devices: u32) -> Vec<ResourceSlice> {
        pool_slices("n", devices, Some(2), &BTreeMap::new())
    }

    fn at(devices: u32, generation: i64) -> Vec<ResourceSlice> {
        at_generation(&pool(devices), generation)
    }

    fn stored(mut s: ResourceSlice, rv: u32) -> ResourceSlice {
        s.metadata.resource_version = Some(rv.to_string());
        s.metadata.uid = Some(format!("uid-{}", s.metadata.name.as_deref().unwrap()));
        s
    }

    fn synced_with(slices: Vec<ResourceSlice>) -> PoolState {
        let mut st = PoolState::new("gpu.topodra.dev", "n");
        st.on_event(&watcher::Event::Init);
        for (i, s) in slices.into_iter().enumerate() {
            st.on_event(&watcher::Event::InitApply(stored(s, i as u32 + 1)));
        }
        assert!(!st.is_synced());
        assert!(st.on_event(&watcher::Event::InitDone));
        assert!(st.is_synced());
        st
    }

    #[test]
    fn nothing_observed_starts_at_generation_one() {
        let st = synced_with(vec![]);
        let Decision::Write(plan) = st.decide(&pool(3), Instant::now()) else {
            panic!("expected a write");
        };
        assert_eq!(plan.generation, 1);
        assert!(plan.apply.is_empty());
        assert_eq!(plan.create.len(), 2);
        for s in &plan.create {
            assert_eq!(s.metadata.name, None);
            assert_eq!(
                s.metadata.generate_name.as_deref(),
                Some("n-gpu.topodra.dev-")
            );
        }
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn an_identical_pool_keeps_its_generation() {
        let st = synced_with(at(3, 7));
        assert_eq!(
            st.decide(&pool(3), Instant::now()),
            Decision::InSync { generation: 7 }
        );
    }

    #[test]
    fn a_shrunk_pool_bumps_and_deletes_the_extra_slice() {
        let st = synced_with(at(5, 7));
        let Decision::Write(plan) = st.decide(&pool(3), Instant::now()) else {
            panic!("expected a write");
        };
        assert_eq!(plan.generation, 8);
        assert_eq!(plan.apply.len(), 2);
        assert!(plan.apply.iter().all(|s| s.spec.pool.generation == 8));
        let deleted: Vec<_> = plan
            .delete
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(deleted, ["n-gpu.topodra.dev-2"]);
    }

    #[test]
    fn generations_never_go_back_after_a_wipe() {
        let now = Instant::now();
        let mut st = synced_with(at(1, 4));
        let Decision::Write(plan) = st.decide(&pool(2), now) else {
            panic!("expected a write");
        };
        assert_eq!(plan.generation, 5);
        let response = stored(plan.apply[0].clone(), 10);
        st.applied(&plan.apply[0], response.clone(), now);
        // Before the echo arrives, the response stands in for it.
        assert_eq!(st.decide(&pool(2), now), Decision::InSync { generation: 5 });
        st.on_event(&watcher::Event::Apply(response.clone()));
        // The kubelet wipes the pool: it comes back one generation higher.
        st.on_event(&watcher::Event::Delete(response));
        let Decision::Write(plan) = st.decide(&pool(2), now) else {
            panic!("expected a write");
        };
        assert_eq!(plan.generation, 6);
    }

    #[test]
    fn stale_events_do_not_override_a_pending_write() {
        let now = Instant::now();
        let old = at(1, 1);
        let mut st = synced_with(old.clone());
        let Decision::Write(plan) = st.decide(&pool(2), now) else {
            panic!("expected a write");
        };
        st.applied(&plan.apply[0], stored(plan.apply[0].clone(), 20), now);
        // An event from before our write arrives late.
        st.on_event(&watcher::Event::Apply(stored(old[0].clone(), 15)));
        assert_eq!(st.decide(&pool(2), now), Decision::InSync { generation: 2 });
        // Without the echo, the watch is believed again after the grace period.
        let later = now + ECHO_GRACE;
        assert!(matches!(st.decide(&pool(2), later), Decision::Write(_)));
    }

    #[test]
    fn a_server_normalization_does_not_cause_a_write_loop() {
        let now = Instant::now();
        let mut st = synced_with(vec![]);
        let Decision::Write(plan) = st.decide(&pool(1), now) else {
            panic!("expected a write");
        };
        // The server names the slice it creates.
        let mut response = plan.create[0].clone();
        response.metadata.name = Some("n-gpu.topodra.dev-bcdfg".to_owned());
        let mut response = stored(response, 3);
        response.spec.pool.name = "normalized".to_owned();
        st.applied(&plan.create[0], response.clone(), now);
        st.on_event(&watcher::Event::Apply(response.clone()));
        assert_eq!(st.decide(&pool(1), now), Decision::InSync { generation: 1 });
        // Someone else changing it afterwards is a difference again.
        response.spec.pool.name = "edited".to_owned();
        response.metadata.resource_version = Some("4".to_owned());
        st.on_event(&watcher::Event::Apply(response));
        assert!(matches!(st.decide(&pool(1), now), Decision::Write(_)));
    }

    #[test]
    fn slices_are_matched_by_devices_whatever_their_names() {
        let now = Instant::now();
        // Two of ours, under names the server made, listed in the other order.
        let mut observed = at(4, 3);
        observed[0].metadata.name = Some("n-gpu.topodra.dev-zzzzz".to_owned());
        observed[1].metadata.name = Some("n-gpu.topodra.dev-bbbbb".to_owned());
        let st = synced_with(observed);
        assert_eq!(st.decide(&pool(4), now), Decision::InSync { generation: 3 });

        // gpu-3 is gone: the new generation goes on both slices, each under its name.
        let Decision::Write(plan) = st.decide(&pool(3), now) else {
            panic!("expected a write");
        };
        let names: Vec<_> = plan
            .apply
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(
            names,
            ["n-gpu.topodra.dev-zzzzz", "n-gpu.topodra.dev-bbbbb"]
        );
        assert!(plan.create.is_empty() && plan.delete.is_empty());
        // A pool that grew by a slice creates one and keeps the others.
        let Decision::Write(plan) = st.decide(&pool(6), now) else {
            panic!("expected a write");
        };
        assert_eq!(
            (plan.apply.len(), plan.create.len(), plan.delete.len()),
            (2, 1, 0)
        );
    }

    #[test]
    fn other_drivers_and_nodes_are_not_ours() {
        let mut foreign = at(1, 9).remove(0);
        foreign.spec.driver = "other.example.com".to_owned();
        foreign.metadata.name = Some("foreign".to_owned());
        let st = synced_with(vec![foreign]);
        let Decision::Write(plan) = st.decide(&pool(1), Instant::now()) else {
            panic!("expected a write");
        };
        assert_eq!(plan.generation, 1);
        assert!(plan.delete.is_empty());
    }
}
