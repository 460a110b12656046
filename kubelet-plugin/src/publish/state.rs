//! What the watch shows of our slices, what we last wrote, and what to write next.
//!
//! Pure state, no I/O: the publisher feeds it watch events and write results, and asks
//! it for a [`Decision`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::runtime::watcher;
use serde_json::Value;
use tokio::time::Instant;
use topodra_driver::slice::SliceError;

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

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    pub(crate) generation: i64,
    /// All slices of the pool: a new generation has to be on every one of them.
    pub(crate) apply: Vec<ResourceSlice>,
    /// Slices of ours that the pool no longer has (the slice count shrank), deleted
    /// after the applies so the pool is complete at every moment.
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
    /// Our slices by name, as the watch shows them.
    slices: BTreeMap<String, ResourceSlice>,
    /// A (re)list in progress: the initial events gathered so far.
    relist: Option<BTreeMap<String, ResourceSlice>>,
    synced: bool,
    written: BTreeMap<String, Written>,
    /// The highest generation we wrote, so a generation is never reused for other
    /// content, even when the slices that carried it are gone.
    last_generation: Option<i64>,
}

impl PoolState {
    pub(crate) fn new(driver: impl Into<String>, node: impl Into<String>) -> Self {
        Self {
            driver: driver.into(),
            node: node.into(),
            slices: BTreeMap::new(),
            relist: None,
            synced: false,
            written: BTreeMap::new(),
            last_generation: None,
        }
    }

    /// True once the watch's initial events are complete and no relist is running:
    /// before that, the current generation is unknown and nothing may be written.
    pub(crate) fn is_synced(&self) -> bool {
        self.synced && self.relist.is_none()
    }

    /// Takes a watch event; true when what we observe may have changed.
    pub(crate) fn on_event(&mut self, event: watcher::Event<ResourceSlice>) -> bool {
        match event {
            watcher::Event::Init => {
                self.relist = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(s) => {
                let ours = self.is_ours(&s);
                if let (Some(relist), true) = (self.relist.as_mut(), ours)
                    && let Some(name) = s.metadata.name.clone()
                {
                    relist.insert(name, s);
                }
                false
            }
            watcher::Event::InitDone => {
                if let Some(relist) = self.relist.take() {
                    self.slices = relist;
                }
                self.synced = true;
                // A full list is at least as new as any write we made before it.
                for w in self.written.values_mut() {
                    w.echo_pending = false;
                }
                true
            }
            watcher::Event::Apply(s) => {
                let Some(name) = s.metadata.name.clone() else {
                    return false;
                };
                if !self.is_ours(&s) {
                    return self.slices.remove(&name).is_some();
                }
                if let Some(w) = self.written.get_mut(&name)
                    && w.response.metadata.resource_version == s.metadata.resource_version
                {
                    w.echo_pending = false;
                }
                self.slices.insert(name, s);
                true
            }
            watcher::Event::Delete(s) => {
                let Some(name) = s.metadata.name.as_deref() else {
                    return false;
                };
                self.slices.remove(name).is_some()
            }
        }
    }

    /// Records a successful apply.
    pub(crate) fn applied(
        &mut self,
        desired: &ResourceSlice,
        response: ResourceSlice,
        now: Instant,
    ) {
        let Some(name) = desired.metadata.name.clone() else {
            return;
        };
        // An apply that changed nothing keeps the resourceVersion and sends no event.
        let echo_pending = self.slices.get(&name).map(|s| &s.metadata.resource_version)
            != Some(&response.metadata.resource_version);
        self.last_generation = self.last_generation.max(Some(desired.spec.pool.generation));
        self.written.insert(
            name,
            Written {
                desired: shape(desired),
                response,
                echo_pending,
                at: now,
            },
        );
    }

    /// Records a successful delete (or one that found the slice already gone).
    pub(crate) fn deleted(&mut self, name: &str) {
        self.slices.remove(name);
        self.written.remove(name);
    }

    /// Compares the desired pool, as built for a given generation by `build`, with
    /// what is observed.
    ///
    /// The pool keeps its generation while nothing differs; any difference (content,
    /// a slice missing, one too many) moves every slice to one generation above both
    /// the highest observed and the highest we ever wrote.
    pub(crate) fn decide(
        &self,
        build: impl Fn(i64) -> Result<Vec<ResourceSlice>, SliceError>,
        now: Instant,
    ) -> Result<Decision, SliceError> {
        let effective = self.effective(now);
        let observed_max = effective.values().map(|s| s.spec.pool.generation).max();
        let high = observed_max.max(self.last_generation);

        if let Some(generation) = high {
            let desired = build(generation)?;
            let names: BTreeSet<&str> = desired
                .iter()
                .filter_map(|s| s.metadata.name.as_deref())
                .collect();
            let same_names = names.len() == effective.len()
                && effective.keys().all(|n| names.contains(n.as_str()));
            if same_names && desired.iter().all(|d| self.matches(d, &effective)) {
                return Ok(Decision::InSync { generation });
            }
        }

        let generation = high.map_or(1, |g| g.saturating_add(1));
        let apply = build(generation)?;
        let names: BTreeSet<&str> = apply
            .iter()
            .filter_map(|s| s.metadata.name.as_deref())
            .collect();
        let delete = effective
            .iter()
            .filter(|(n, _)| !names.contains(n.as_str()))
            .map(|(_, s)| (*s).clone())
            .collect();
        Ok(Decision::Write(Plan {
            generation,
            apply,
            delete,
        }))
    }

    /// Our slices as best known: the watch's view, except where a write of ours is
    /// newer than what the watch has shown so far.
    fn effective(&self, now: Instant) -> BTreeMap<&String, &ResourceSlice> {
        let mut out: BTreeMap<&String, &ResourceSlice> = self.slices.iter().collect();
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use topodra_driver::Inventory;
    use topodra_driver::slice::{SliceOptions, build_slices};

    fn builder(devices: usize) -> impl Fn(i64) -> Result<Vec<ResourceSlice>, SliceError> {
        move |generation| {
            let mut inv = Inventory::default();
            for i in 0..devices {
                let mut g =
                    topodra_driver::Gpu::at(format!("0000:{:02x}:00.0", i + 1).parse().unwrap());
                g.minor = Some(i as u32);
                inv.gpus.push(g);
            }
            let opts = SliceOptions {
                pool_generation: generation,
                max_devices_per_slice: Some(2),
                ..SliceOptions::new("n")
            };
            build_slices(&inv, &opts)
        }
    }

    fn stored(mut s: ResourceSlice, rv: u32) -> ResourceSlice {
        s.metadata.resource_version = Some(rv.to_string());
        s.metadata.uid = Some(format!("uid-{}", s.metadata.name.as_deref().unwrap()));
        s
    }

    fn synced_with(slices: Vec<ResourceSlice>) -> PoolState {
        let mut st = PoolState::new("gpu.topodra.dev", "n");
        st.on_event(watcher::Event::Init);
        for (i, s) in slices.into_iter().enumerate() {
            st.on_event(watcher::Event::InitApply(stored(s, i as u32 + 1)));
        }
        assert!(!st.is_synced());
        assert!(st.on_event(watcher::Event::InitDone));
        assert!(st.is_synced());
        st
    }

    #[test]
    fn nothing_observed_starts_at_generation_one() {
        let st = synced_with(vec![]);
        let Decision::Write(plan) = st.decide(builder(3), Instant::now()).unwrap() else {
            panic!("expected a write");
        };
        assert_eq!(plan.generation, 1);
        assert_eq!(plan.apply.len(), 2);
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn an_identical_pool_keeps_its_generation() {
        let st = synced_with(builder(3)(7).unwrap());
        assert_eq!(
            st.decide(builder(3), Instant::now()).unwrap(),
            Decision::InSync { generation: 7 }
        );
    }

    #[test]
    fn a_shrunk_pool_bumps_and_deletes_the_extra_slice() {
        let st = synced_with(builder(5)(7).unwrap());
        let Decision::Write(plan) = st.decide(builder(3), Instant::now()).unwrap() else {
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
        let mut st = synced_with(builder(1)(4).unwrap());
        let Decision::Write(plan) = st.decide(builder(2), now).unwrap() else {
            panic!("expected a write");
        };
        assert_eq!(plan.generation, 5);
        let response = stored(plan.apply[0].clone(), 10);
        st.applied(&plan.apply[0], response.clone(), now);
        // Before the echo arrives, the response stands in for it.
        assert_eq!(
            st.decide(builder(2), now).unwrap(),
            Decision::InSync { generation: 5 }
        );
        st.on_event(watcher::Event::Apply(response.clone()));
        // The kubelet wipes the pool: it comes back one generation higher.
        st.on_event(watcher::Event::Delete(response));
        let Decision::Write(plan) = st.decide(builder(2), now).unwrap() else {
            panic!("expected a write");
        };
        assert_eq!(plan.generation, 6);
    }

    #[test]
    fn stale_events_do_not_override_a_pending_write() {
        let now = Instant::now();
        let old = builder(1)(1).unwrap();
        let mut st = synced_with(old.clone());
        let Decision::Write(plan) = st.decide(builder(2), now).unwrap() else {
            panic!("expected a write");
        };
        st.applied(&plan.apply[0], stored(plan.apply[0].clone(), 20), now);
        // An event from before our write arrives late.
        st.on_event(watcher::Event::Apply(stored(old[0].clone(), 15)));
        assert_eq!(
            st.decide(builder(2), now).unwrap(),
            Decision::InSync { generation: 2 }
        );
        // Without the echo, the watch is believed again after the grace period.
        let later = now + ECHO_GRACE;
        assert!(matches!(
            st.decide(builder(2), later).unwrap(),
            Decision::Write(_)
        ));
    }

    #[test]
    fn a_server_normalization_does_not_cause_a_write_loop() {
        let now = Instant::now();
        let mut st = synced_with(vec![]);
        let Decision::Write(plan) = st.decide(builder(1), now).unwrap() else {
            panic!("expected a write");
        };
        let mut response = stored(plan.apply[0].clone(), 3);
        response.spec.pool.name = "normalized".to_owned();
        st.applied(&plan.apply[0], response.clone(), now);
        st.on_event(watcher::Event::Apply(response.clone()));
        assert_eq!(
            st.decide(builder(1), now).unwrap(),
            Decision::InSync { generation: 1 }
        );
        // Someone else changing it afterwards is a difference again.
        response.spec.pool.name = "edited".to_owned();
        response.metadata.resource_version = Some("4".to_owned());
        st.on_event(watcher::Event::Apply(response));
        assert!(matches!(
            st.decide(builder(1), now).unwrap(),
            Decision::Write(_)
        ));
    }

    #[test]
    fn other_drivers_and_nodes_are_not_ours() {
        let mut foreign = builder(1)(9).unwrap().remove(0);
        foreign.spec.driver = "other.example.com".to_owned();
        foreign.metadata.name = Some("foreign".to_owned());
        let st = synced_with(vec![foreign]);
        let Decision::Write(plan) = st.decide(builder(1), Instant::now()).unwrap() else {
            panic!("expected a write");
        };
        assert_eq!(plan.generation, 1);
        assert!(plan.delete.is_empty());
    }
}
