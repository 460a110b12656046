//! The shared-GPU gauges: per sharing mode, the GPUs offered for sharing, the shares
//! allocated, and their memory (and compute, where the devices publish it).
//!
//! The `sharing` label is a value from the slices. Only plain words become labels,
//! at most [`MAX_SHARING_MODES`] of them, and a mode's series go when no node
//! publishes it any more: a cluster without sharing has none of them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use topodra_model::capacity::{CapacityFigures, Cluster};

/// How many sharing modes get series: a slice writer must not grow the
/// controller's series without bound.
const MAX_SHARING_MODES: usize = 8;

/// The states of a shared GPU count.
const GPU_STATES: [&str; 3] = ["total", "usable", "in_use"];

/// The states of a shared capacity's gauges.
const CAPACITY_STATES: [&str; 4] = ["total", "allocated", "free", "largest_free"];

/// A figure of shared GPUs of one sharing mode (`TimeSlicing`, `MPS`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SharedLabels {
    sharing: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SharingLabels {
    sharing: String,
}

#[derive(Debug, Default)]
pub(super) struct SharingMetrics {
    gpus: Family<SharedLabels, Gauge>,
    shares: Family<SharingLabels, Gauge>,
    memory: Family<SharedLabels, Gauge>,
    compute: Family<SharedLabels, Gauge>,
    /// The modes exported at the last observation, so the series of a mode that is
    /// gone (sharing turned off everywhere) go with it.
    modes: Mutex<BTreeSet<String>>,
}

impl SharingMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "shared_gpus",
            "GPUs offered for sharing, by sharing mode and state (total; usable: can take another share now; in_use: hold shares)",
            self.gpus.clone(),
        );
        registry.register(
            "shares",
            "Shares of shared GPUs allocated, by sharing mode",
            self.shares.clone(),
        );
        registry.register(
            "shared_memory_bytes",
            "Memory of shared GPUs, by sharing mode and state (total; allocated: consumed by shares; free: left on usable GPUs; largest_free: the most left on one GPU, the largest share that fits now)",
            self.memory.clone(),
        );
        registry.register(
            "shared_compute",
            "Compute of shared GPUs in percent of a GPU, by sharing mode and state (as shared_memory_bytes), for modes whose devices publish a compute capacity",
            self.compute.clone(),
        );
    }

    /// Sets the gauges from the model, and drops the series of modes no longer
    /// published.
    pub(super) fn observe(&self, cluster: &Cluster) {
        let totals = totals(cluster);
        let mut modes = self.modes.lock().unwrap_or_else(PoisonError::into_inner);
        for gone in modes.iter().filter(|m| !totals.contains_key(*m)) {
            let labels = |state| SharedLabels {
                sharing: gone.clone(),
                state,
            };
            for state in GPU_STATES {
                self.gpus.remove(&labels(state));
            }
            for state in CAPACITY_STATES {
                self.memory.remove(&labels(state));
                self.compute.remove(&labels(state));
            }
            self.shares.remove(&SharingLabels {
                sharing: gone.clone(),
            });
        }
        for (mode, t) in &totals {
            let labels = |state| SharedLabels {
                sharing: mode.clone(),
                state,
            };
            for (state, n) in GPU_STATES.into_iter().zip([t.gpus, t.usable, t.in_use]) {
                self.gpus.get_or_create(&labels(state)).set(i64::from(n));
            }
            self.shares
                .get_or_create(&SharingLabels {
                    sharing: mode.clone(),
                })
                .set(i64::from(t.shares));
            for (capacity, family) in [("memory", &self.memory), ("compute", &self.compute)] {
                let Some(f) = t.capacity.get(capacity) else {
                    continue;
                };
                let values = [f.total, f.allocated, f.free, f.largest_free];
                for (state, v) in CAPACITY_STATES.into_iter().zip(values) {
                    family
                        .get_or_create(&labels(state))
                        .set(i64::try_from(v).unwrap_or(i64::MAX));
                }
            }
        }
        *modes = totals.into_keys().collect();
    }
}

/// A `sharing` value that becomes a label: a short word, as the plugin writes them.
fn is_mode_label(mode: &str) -> bool {
    (1..=32).contains(&mode.len()) && mode.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// The cluster's shared GPUs of one mode: the per-NUMA-node figures summed, the
/// largest free the largest of any GPU.
#[derive(Debug, Default)]
struct ModeTotals {
    gpus: u32,
    usable: u32,
    in_use: u32,
    shares: u32,
    capacity: BTreeMap<String, CapacityFigures>,
}

fn totals(cluster: &Cluster) -> BTreeMap<String, ModeTotals> {
    let mut out: BTreeMap<String, ModeTotals> = BTreeMap::new();
    for g in cluster.nodes().flat_map(|s| s.shared.iter()) {
        if !is_mode_label(&g.sharing)
            || (out.len() >= MAX_SHARING_MODES && !out.contains_key(&g.sharing))
        {
            continue;
        }
        let t = out.entry(g.sharing.clone()).or_default();
        t.gpus = t.gpus.saturating_add(g.gpus);
        t.usable = t.usable.saturating_add(g.usable);
        t.in_use = t.in_use.saturating_add(g.in_use);
        t.shares = t.shares.saturating_add(g.shares);
        for (name, f) in &g.capacity {
            t.capacity.entry(name.clone()).or_default().merge(f);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_words_become_labels() {
        assert!(is_mode_label("TimeSlicing"));
        assert!(is_mode_label("MPS"));
        for bad in ["", "Time Slicing", "a\"b", &"x".repeat(33)] {
            assert!(!is_mode_label(bad), "{bad:?}");
        }
    }
}
