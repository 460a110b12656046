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
    /// [`crate::publish::PublisherConfig::ordered_slice_names`].
    ordered: bool,
}

/// The API server cuts a `generateName` to 58 characters before it adds five
/// random ones (`names.SimpleNameGenerator`: 63 less 5).
const MAX_GENERATE_NAME: usize = 58;
/// The characters the API server's random suffix adds.
const SUFFIX_LEN: usize = 5;

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
            ordered: false,
        }
    }

    pub(crate) fn with_ordered_names(mut self, ordered: bool) -> Self {
        self.ordered = ordered;
        self
    }

    /// The `generateName` of the slice at `index` of a pool of `count` slices when
    /// names keep the order: `<node>-<driver>-<index>-`, the index zero-padded so
    /// names sort as numbers. Where that is longer than the server keeps, the index
    /// goes first, since a cut would take it off the end.
    fn ordered_prefix(&self, index: usize, count: usize) -> String {
        let width = count.saturating_sub(1).to_string().len().max(2);
        let index = format!("{index:0width$}");
        let full = format!("{}-{}-{index}-", self.node, self.driver);
        if full.len() <= MAX_GENERATE_NAME {
            return full;
        }
        let mut p = format!("{index}-{}-{}", self.node, self.driver);
        p.truncate(MAX_GENERATE_NAME.saturating_sub(1));
        let mut p = p.trim_end_matches(['-', '.']).to_owned();
        p.push('-');
        p
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
        let prefixes: Option<Vec<String>> = (self.ordered && desired.len() > 1).then(|| {
            (0..desired.len())
                .map(|i| self.ordered_prefix(i, desired.len()))
                .collect()
        });
        let names = assign(desired, &effective, prefixes.as_deref());
        let named: Vec<ResourceSlice> = desired
            .iter()
            .zip(&names)
            .enumerate()
            .map(|(i, (s, name))| {
                let prefix = prefixes.as_ref().and_then(|p| p.get(i)).cloned();
                self.named(s, name.clone(), prefix)
            })
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

    /// `slice` under `name`, or to be named by the server after this node and driver
    /// (and, for ordered names, its index: `prefix`).
    fn named(
        &self,
        slice: &ResourceSlice,
        name: Option<String>,
        prefix: Option<String>,
    ) -> ResourceSlice {
        let mut s = slice.clone();
        s.metadata.generate_name = match name {
            Some(_) => None,
            None => Some(prefix.unwrap_or_else(|| format!("{}-{}-", self.node, self.driver))),
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
///
/// With `prefixes` (ordered names), desired slice `i` only takes a slice named
/// `prefixes[i]` and a server suffix, so the names keep sorting in pool order.
fn assign(
    desired: &[ResourceSlice],
    observed: &BTreeMap<&String, &ResourceSlice>,
    prefixes: Option<&[String]>,
) -> Vec<Option<String>> {
    // A slice holds devices or shared counters, never both, and an apply that
    // turns one kind into the other is refused: the server keeps the field the
    // apply leaves out ("only one of `sharedCounters` or `devices` is allowed").
    // So a slice is only reused for a slice of its own kind; a pool whose counter
    // slice moves to another index (dynamic MIG with more or fewer partitions)
    // creates the new one and deletes the old.
    let counters = |s: &ResourceSlice| {
        s.spec
            .shared_counters
            .as_ref()
            .is_some_and(|c| !c.is_empty())
    };
    let kinds: BTreeMap<&str, bool> = observed
        .iter()
        .map(|(n, s)| (n.as_str(), counters(s)))
        .collect();
    let fits = |i: usize, name: &str| {
        let same_kind = kinds.get(name).copied() == desired.get(i).map(counters);
        same_kind
            && match prefixes.and_then(|p| p.get(i)) {
                None => prefixes.is_none(),
                Some(p) => {
                    name.starts_with(p.as_str()) && name.len() == p.len().saturating_add(SUFFIX_LEN)
                }
            }
    };
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
        if let Some(at) = free
            .iter()
            .position(|(name, have)| have == want && fits(i, name))
        {
            out[i] = Some(free.remove(at).0.clone());
        }
    }
    for (i, want) in wanted.iter().enumerate() {
        if out[i].is_some() {
            continue;
        }
        // max_by_key keeps the last of equals; the first (by name) is wanted.
        let best = free
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, (name, _))| fits(i, name))
            .max_by_key(|(_, (_, have))| have.intersection(want).count())
            .map(|(at, _)| at);
        if let Some(at) = best {
            out[i] = Some(free.remove(at).0.clone());
        }
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
mod tests;
