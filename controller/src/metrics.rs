//! The controller's Prometheus metrics. Cardinality is bounded: no label carries a
//! node, pod or claim name; per-node figures are in the NodeResourceTopology objects
//! and `kubectl topodra nodes`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use topodra_model::capacity::{Cluster, Finding, Level, SET_SIZES};
use topodra_ops::metrics::Registry;
use topodra_ops::requests::RequestCounter;

use crate::state::Kind;
use sharing::SharingMetrics;

mod sharing;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FitLabels {
    size: u32,
    /// `node` (anywhere on the node) or an alignment level (`numaNode`, ...).
    level: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LevelLabels {
    /// The attribute's level: `numaNode`, `socket`, ...
    level: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    /// `nodes_differ`, `duplicate_devices`.
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    /// `apply`, `delete`, `event`.
    operation: &'static str,
    outcome: &'static str,
}

/// Everything the controller exports; cheap to share.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    gpus: Family<StateLabels, Gauge>,
    nodes: Gauge,
    nodes_fitting: Family<FitLabels, Gauge>,
    stranded: Family<FitLabels, Gauge>,
    leader: Gauge,
    pending_pods: Gauge,
    watch_events: Family<ResourceLabels, Counter>,
    watch_errors: Family<ResourceLabels, Counter>,
    objects_pruned: Family<ResourceLabels, Counter>,
    objects_undecodable: Family<ResourceLabels, Counter>,
    cpu_numa_ignored: Gauge,
    writes: Family<WriteLabels, Counter>,
    writes_skipped: Counter,
    nrt_write_lag: Histogram,
    nrt_nodes_waiting: Gauge,
    invalid_values: Family<LevelLabels, Counter>,
    pool_skips: Family<ReasonLabels, Counter>,
    skipped_pools: Gauge,
    sharing: SharingMetrics,
}

impl Metrics {
    pub(crate) fn new(requests: &RequestCounter) -> Self {
        // `topodra_controller_api_requests_total{verb, resource, code}` comes with the base.
        let mut m = Self {
            registry: Registry::new("topodra_controller", requests),
            gpus: Family::default(),
            nodes: Gauge::default(),
            nodes_fitting: Family::default(),
            stranded: Family::default(),
            leader: Gauge::default(),
            pending_pods: Gauge::default(),
            watch_events: Family::default(),
            watch_errors: Family::default(),
            objects_pruned: Family::default(),
            objects_undecodable: Family::default(),
            cpu_numa_ignored: Gauge::default(),
            writes: Family::default(),
            writes_skipped: Counter::default(),
            // 1 s to about 68 min: the budget's worst case for a few thousand nodes.
            nrt_write_lag: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
            nrt_nodes_waiting: Gauge::default(),
            invalid_values: Family::default(),
            pool_skips: Family::default(),
            skipped_pools: Gauge::default(),
            sharing: SharingMetrics::default(),
        };
        let registry = m.registry.registry_mut();
        registry.register(
            "gpus",
            "Whole GPUs of the cluster by state (total, allocated, unhealthy, carved, shared, free; carved: partitions of it allocated, dynamic MIG; shared: shares of it allocated)",
            m.gpus.clone(),
        );
        registry.register(
            "nodes",
            "Nodes with a complete pool of our GPUs",
            m.nodes.clone(),
        );
        registry.register(
            "nodes_fitting",
            "Nodes that can take a set of `size` free GPUs now, aligned at `level` (node: anywhere on the node)",
            m.nodes_fitting.clone(),
        );
        registry.register(
            "stranded_gpus",
            "Free GPUs that cannot join an aligned set of `size` at `level`",
            m.stranded.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease and writes",
            m.leader.clone(),
        );
        registry.register(
            "pending_pods",
            "Unschedulable pods waiting on our GPUs",
            m.pending_pods.clone(),
        );
        registry.register(
            "watch_events",
            "Watch events received, by resource",
            m.watch_events.clone(),
        );
        registry.register(
            "watch_errors",
            "Watch errors (the watch resumes with backoff), by resource",
            m.watch_errors.clone(),
        );
        registry.register(
            "objects_pruned",
            "Watched objects nested deeper than the decoder keeps, taken without their deepest values, by resource",
            m.objects_pruned.clone(),
        );
        registry.register(
            "cpu_numa_nodes_ignored",
            "NUMA node ids the CPU driver publishes that the node's own slices do not announce, left out of NodeResourceTopology zones",
            m.cpu_numa_ignored.clone(),
        );
        registry.register(
            "objects_undecodable",
            "Watched objects that could not be decoded and were left out of the model, by resource",
            m.objects_undecodable.clone(),
        );
        registry.register(
            "writes",
            "Writes to the API server by operation and outcome",
            m.writes.clone(),
        );
        registry.register(
            "writes_skipped",
            "NodeResourceTopology writes skipped because the object already held the content",
            m.writes_skipped.clone(),
        );
        registry.register(
            "nrt_write_lag_seconds",
            "Seconds from the first change a node's NodeResourceTopology did not show to the write that showed it (debounce, the node's write interval and the fleet's write budget)",
            m.nrt_write_lag.clone(),
        );
        registry.register(
            "nrt_nodes_waiting",
            "Nodes whose NodeResourceTopology waits for a write",
            m.nrt_nodes_waiting.clone(),
        );
        registry.register(
            "invalid_slice_values",
            "Topology values in ResourceSlices that no plugin of ours publishes, ignored (the device counts as not carrying the attribute), by level; counted once per slice version that brings one",
            m.invalid_values.clone(),
        );
        registry.register(
            "pool_skips",
            "Times a complete ResourceSlice pool was left out of the model (none of its devices count), by reason (nodes_differ, duplicate_devices)",
            m.pool_skips.clone(),
        );
        registry.register(
            "skipped_pools",
            "Complete ResourceSlice pools left out of the model now",
            m.skipped_pools.clone(),
        );
        m.sharing.register(registry);
        m
    }

    /// The NodeResourceTopology write pacing this controller runs with, as an info
    /// series: what bounds an object's staleness (docs/controller.md) is on the
    /// dashboard beside the lag it produced, and a benchmark reads the settings its
    /// run had from the process itself rather than from the defaults in the source.
    pub(crate) fn with_nrt_pacing(
        mut self,
        write_delay: std::time::Duration,
        node_interval: std::time::Duration,
        writes_per_second: f64,
    ) -> Self {
        self.registry.registry_mut().register(
            "nrt_pacing",
            "NodeResourceTopology write pacing: write delay and per-node interval in seconds, fleet-wide writes a second",
            Info::new(vec![
                ("write_delay_seconds", write_delay.as_secs_f64().to_string()),
                ("node_interval_seconds", node_interval.as_secs_f64().to_string()),
                ("writes_per_second", writes_per_second.to_string()),
            ]),
        );
        self
    }

    /// Counts what the model did not take from a slice.
    pub(crate) fn finding(&self, finding: &Finding) {
        match finding {
            Finding::InvalidValue { value, .. } => {
                let level = value.level.as_str();
                self.invalid_values
                    .get_or_create(&LevelLabels { level })
                    .inc();
            }
            Finding::PoolSkipped { problem, .. } => {
                let reason = problem.reason();
                self.pool_skips
                    .get_or_create(&ReasonLabels { reason })
                    .inc();
            }
        }
    }

    /// Sets the capacity gauges from the model.
    pub(crate) fn observe_cluster(&self, cluster: &Cluster) {
        let t = cluster.totals();
        for (state, n) in [
            ("total", t.total),
            ("allocated", t.allocated),
            ("unhealthy", t.unhealthy),
            ("carved", t.carved()),
            ("shared", t.shared),
            ("free", t.free),
        ] {
            self.gpus
                .get_or_create(&StateLabels { state })
                .set(i64::from(n));
        }
        self.sharing.observe(cluster);
        self.nodes.set(cluster.nodes().count() as i64);
        self.skipped_pools
            .set(cluster.skipped_pools().count() as i64);
        let levels = std::iter::once(None).chain(Level::ALL.map(Some));
        for level in levels {
            let name = level.map_or("node", Level::as_str);
            for size in SET_SIZES {
                let n = cluster.nodes_fitting(size, level);
                self.nodes_fitting
                    .get_or_create(&FitLabels { size, level: name })
                    .set(n as i64);
            }
            if let Some(level) = level {
                for (size, n) in cluster.stranded(level) {
                    self.stranded
                        .get_or_create(&FitLabels { size, level: name })
                        .set(i64::from(n));
                }
            }
        }
    }

    pub(crate) fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    pub(crate) fn set_pending_pods(&self, n: usize) {
        self.pending_pods.set(n as i64);
    }

    pub(crate) fn watch_event(&self, kind: Kind) {
        self.watch_events
            .get_or_create(&ResourceLabels {
                resource: kind.as_str(),
            })
            .inc();
    }

    pub(crate) fn set_cpu_numa_ignored(&self, n: usize) {
        self.cpu_numa_ignored
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(crate) fn object_pruned(&self, kind: Kind) {
        self.objects_pruned
            .get_or_create(&ResourceLabels {
                resource: kind.as_str(),
            })
            .inc();
    }

    pub(crate) fn object_undecodable(&self, kind: Kind) {
        self.objects_undecodable
            .get_or_create(&ResourceLabels {
                resource: kind.as_str(),
            })
            .inc();
    }

    pub(crate) fn watch_error(&self, kind: Kind) {
        self.watch_errors
            .get_or_create(&ResourceLabels {
                resource: kind.as_str(),
            })
            .inc();
    }

    pub(crate) fn write(&self, operation: &'static str, ok: bool) {
        let outcome = if ok { "ok" } else { "error" };
        self.writes
            .get_or_create(&WriteLabels { operation, outcome })
            .inc();
    }

    pub(crate) fn write_skipped(&self) {
        self.writes_skipped.inc();
    }

    /// A node's object was written `lag` after the first change it did not show.
    pub(crate) fn observe_nrt_write_lag(&self, lag: std::time::Duration) {
        self.nrt_write_lag.observe(lag.as_secs_f64());
    }

    pub(crate) fn set_nrt_nodes_waiting(&self, n: usize) {
        self.nrt_nodes_waiting
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(crate) fn connection_rejected(&self) {
        self.registry.connection_rejected();
    }

    pub(crate) fn encode(&self) -> String {
        self.registry.encode()
    }
}

#[cfg(test)]
mod tests {
    use topodra_model::capacity::{InvalidValue, PoolProblem};

    use super::*;

    /// Shared GPUs per mode, only while some node publishes them: a cluster without
    /// sharing has no such series, and they go when sharing does.
    #[test]
    fn shared_gpus_have_series_per_mode_while_published() {
        let m = Metrics::new(&RequestCounter::new());
        m.observe_cluster(&crate::kubectl::fixtures::time_sliced_dgx());
        let text = m.encode();
        for line in [
            "topodra_controller_gpus{state=\"shared\"} 3",
            "topodra_controller_gpus{state=\"carved\"} 0",
            "topodra_controller_gpus{state=\"free\"} 3",
            "topodra_controller_shared_gpus{sharing=\"TimeSlicing\",state=\"total\"} 8",
            "topodra_controller_shared_gpus{sharing=\"TimeSlicing\",state=\"usable\"} 6",
            "topodra_controller_shared_gpus{sharing=\"TimeSlicing\",state=\"in_use\"} 3",
            "topodra_controller_shares{sharing=\"TimeSlicing\"} 4",
            // 140Gi held by shares; 81559Mi left on gpu-2, gpu-3 and gpu-4.
            "topodra_controller_shared_memory_bytes{sharing=\"TimeSlicing\",state=\"allocated\"} 150323855360",
            "topodra_controller_shared_memory_bytes{sharing=\"TimeSlicing\",state=\"largest_free\"} 85520809984",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        assert!(
            !text.contains("topodra_controller_shared_compute{"),
            "{text}"
        );
        m.observe_cluster(&Cluster::new("gpu.topodra.dev"));
        let text = m.encode();
        assert!(!text.contains("sharing=\""), "{text}");
        assert!(text.contains("topodra_controller_gpus{state=\"shared\"} 0"));
    }

    #[test]
    fn the_write_pacing_is_an_info_series() {
        let m = Metrics::new(&RequestCounter::new()).with_nrt_pacing(
            std::time::Duration::from_millis(10_000),
            std::time::Duration::from_secs(60),
            0.5,
        );
        let text = m.encode();
        let line = "topodra_controller_nrt_pacing_info{write_delay_seconds=\"10\",node_interval_seconds=\"60\",writes_per_second=\"0.5\"} 1";
        assert!(text.contains(line), "{line} not in\n{text}");
    }

    #[test]
    fn findings_are_counted_by_level_and_reason() {
        let m = Metrics::new(&RequestCounter::new());
        m.finding(&Finding::InvalidValue {
            slice: "s".into(),
            device: "d".into(),
            value: InvalidValue {
                level: Level::NumaNode,
                value: "int -1".into(),
            },
        });
        m.finding(&Finding::PoolSkipped {
            pool: "p".into(),
            problem: PoolProblem::NodesDiffer {
                nodes: vec!["a".into(), "b".into()],
            },
        });
        m.observe_cluster(&Cluster::new("gpu.topodra.dev"));
        let text = m.encode();
        for line in [
            "topodra_controller_invalid_slice_values_total{level=\"numaNode\"} 1",
            "topodra_controller_pool_skips_total{reason=\"nodes_differ\"} 1",
            "topodra_controller_skipped_pools 0",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }
}
