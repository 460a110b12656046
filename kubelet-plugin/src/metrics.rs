//! Prometheus metrics of the plugin; `topodra_ops::http` serves them. The DRA
//! services' own (`topodra_prepare_duration_seconds`, ...) come from
//! [`ClaimMetrics`], registered here under the same prefix.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::SystemTime;

use dra_kubeletplugin::metrics::ClaimMetrics;
use dra_kubeletplugin::publish::PublishStatus;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use topodra_model::AllocatableDevice;
use topodra_model::health::{HealthState, Status};
use topodra_node::prepare::Preparer;
use topodra_ops::metrics::Registry;
use topodra_ops::requests::RequestCounter;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NumaLabels {
    numa_node: String,
    state: &'static str,
}

/// The states of `topodra_numa_devices`, each GPU in exactly one.
const NUMA_STATES: [&str; 3] = ["free", "prepared", "unhealthy"];

/// What `topodra_numa_devices` is computed from, kept so that each of its three
/// sources (the inventory, the prepared claims, the health picture) can change alone.
#[derive(Debug, Default)]
struct NumaPicture {
    /// Each published GPU: its NUMA node label and the devices it publishes (itself,
    /// or its MIG devices).
    gpus: Vec<(String, Vec<String>)>,
    prepared: std::collections::BTreeSet<String>,
    unhealthy: std::collections::BTreeSet<String>,
    /// Every NUMA node the family has series for.
    nodes_seen: std::collections::BTreeSet<String>,
}

impl NumaPicture {
    /// GPUs by NUMA node and state. A GPU counts once, by its worst state: unhealthy
    /// if any of its devices is (a MIG device shares its parent's fate), else
    /// prepared if any claim holds it or one of its MIG devices, else free.
    fn counts(&self) -> BTreeMap<(String, &'static str), i64> {
        let mut out = BTreeMap::new();
        for (numa, devices) in &self.gpus {
            let state = if devices.iter().any(|d| self.unhealthy.contains(d)) {
                "unhealthy"
            } else if devices.iter().any(|d| self.prepared.contains(d)) {
                "prepared"
            } else {
                "free"
            };
            *out.entry((numa.clone(), state)).or_insert(0) += 1;
        }
        out
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct XidLabels {
    xid: String,
    /// `true` when the health policy made the device unhealthy for it.
    fatal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NvmlErrorLabels {
    operation: String,
}

/// The plugin's metrics; cheap to share.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    claims: Arc<ClaimMetrics>,
    devices: Gauge,
    numa: Family<NumaLabels, Gauge>,
    numa_picture: std::sync::Mutex<NumaPicture>,
    read_only: Gauge,
    health: Family<StateLabels, Gauge>,
    unhealthy: Family<CauseLabels, Gauge>,
    /// Every cause the family has a series for.
    causes_seen: std::sync::Mutex<std::collections::BTreeSet<String>>,
    publish_failures: Counter,
    publish_in_sync: Gauge,
    last_publish: Gauge<f64, AtomicU64>,
    xids: Family<XidLabels, Counter>,
    nvml_errors: Family<NvmlErrorLabels, Counter>,
    event_gpus: Gauge,
}

impl Metrics {
    /// The metrics, with `requests` exported as `topodra_api_requests_total`.
    pub(crate) fn new(requests: &RequestCounter) -> Self {
        let mut base = Registry::new("topodra", requests);
        let registry = base.registry_mut();
        let claims = Arc::new(ClaimMetrics::register(registry));
        let devices = Gauge::default();
        registry.register("devices", "GPUs published by this node", devices.clone());
        let numa = Family::<NumaLabels, Gauge>::default();
        registry.register(
            "numa_devices",
            "Published GPUs by NUMA node (none: the GPU has none) and state: free, prepared (held by a prepared claim), unhealthy. \
             Counted by physical GPU: a GPU split into MIG devices or shared by several claims is one GPU, prepared if any claim holds it or one of its MIG devices",
            numa.clone(),
        );
        let read_only = Gauge::default();
        registry.register(
            "state_read_only",
            "1 while the plugin serves read-only because it cannot use its state directory (no claim can be prepared)",
            read_only.clone(),
        );
        let health = Family::<StateLabels, Gauge>::default();
        registry.register(
            "device_health",
            "Published devices by health: healthy, unhealthy (tainted), unknown (NVML gave no answer yet)",
            health.clone(),
        );
        let unhealthy = Family::<CauseLabels, Gauge>::default();
        registry.register(
            "unhealthy_devices",
            "Unhealthy devices by cause: xid-<n> (the critical XID that made it unhealthy) or lost",
            unhealthy.clone(),
        );
        let publish_failures = Counter::default();
        registry.register(
            "publish_failures",
            "ResourceSlice reconciles that failed (each retried with backoff), including an invalid pool",
            publish_failures.clone(),
        );
        let publish_in_sync = Gauge::default();
        registry.register(
            "publish_in_sync",
            "1 while the last reconcile left the ResourceSlices as desired",
            publish_in_sync.clone(),
        );
        let last_publish = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "last_publish_success_timestamp_seconds",
            "Unix time of the last reconcile that found or made the ResourceSlices as desired; 0 before the first",
            last_publish.clone(),
        );
        let xids = Family::<XidLabels, Counter>::default();
        registry.register(
            "xid_events",
            "XIDs the health monitor received, by XID and whether the policy counts it as a GPU failure",
            xids.clone(),
        );
        let nvml_errors = Family::<NvmlErrorLabels, Counter>::default();
        registry.register(
            "nvml_errors",
            "Failed NVML calls of the health monitor: open (NVML could not be loaded or initialised), event_wait",
            nvml_errors.clone(),
        );
        let event_gpus = Gauge::default();
        registry.register(
            "health_event_gpus",
            "GPUs whose NVML events (XIDs, double-bit ECC) the health monitor receives; the others it only probes",
            event_gpus.clone(),
        );
        Self {
            registry: base,
            claims,
            devices,
            numa,
            numa_picture: std::sync::Mutex::default(),
            read_only,
            health,
            unhealthy,
            causes_seen: std::sync::Mutex::default(),
            publish_failures,
            publish_in_sync,
            last_publish,
            xids,
            nvml_errors,
            event_gpus,
        }
    }

    /// Counts what the health monitor saw.
    pub(crate) fn observe_health(&self, seen: topodra_node::monitor::Observed) {
        use topodra_node::monitor::Observed;
        match seen {
            Observed::Xid { xid, fatal } => {
                self.xids
                    .get_or_create(&XidLabels {
                        xid: xid.to_string(),
                        fatal: fatal.to_string(),
                    })
                    .inc();
            }
            Observed::NvmlOpenFailed | Observed::NvmlWaitFailed => {
                let operation = if seen == Observed::NvmlOpenFailed {
                    "open"
                } else {
                    "event_wait"
                };
                self.nvml_errors
                    .get_or_create(&NvmlErrorLabels {
                        operation: operation.to_owned(),
                    })
                    .inc();
            }
            Observed::EventGpus(n) => {
                self.event_gpus.set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
    }

    /// Takes in the health monitor's picture: counts by state and by cause, every
    /// state and cause seen before kept at 0 so a series does not vanish.
    pub(crate) fn set_health(&self, state: &HealthState) {
        let mut by_state: BTreeMap<&str, i64> =
            [("healthy", 0), ("unhealthy", 0), ("unknown", 0)].into();
        let mut by_cause: BTreeMap<String, i64> = BTreeMap::new();
        for h in state.devices.values() {
            let key = match h.status {
                Status::Healthy => "healthy",
                Status::Unhealthy => "unhealthy",
                Status::Unknown => "unknown",
            };
            *by_state.entry(key).or_default() += 1;
            if let Some(cause) = &h.cause {
                *by_cause.entry(cause.label()).or_default() += 1;
            }
        }
        self.update_numa(|p| {
            p.unhealthy = state
                .devices
                .iter()
                .filter(|(_, h)| h.status == Status::Unhealthy)
                .map(|(name, _)| name.clone())
                .collect();
        });
        for (state, n) in by_state {
            self.health
                .get_or_create(&StateLabels {
                    state: state.to_owned(),
                })
                .set(n);
        }
        // Causes no device has any more go to 0 rather than vanish from the family.
        let mut seen = self
            .causes_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.extend(by_cause.keys().cloned());
        for cause in seen.iter() {
            let n = by_cause.get(cause).copied().unwrap_or(0);
            self.unhealthy
                .get_or_create(&CauseLabels {
                    cause: cause.clone(),
                })
                .set(n);
        }
    }

    /// Takes in a publisher status change; `previous` is the one before it.
    pub(crate) fn set_publish(&self, previous: &PublishStatus, now: &PublishStatus) {
        match now {
            PublishStatus::InSync { .. } => {
                self.publish_in_sync.set(1);
                let t = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                self.last_publish.set(t);
            }
            PublishStatus::Failing {
                consecutive_failures,
                ..
            } => {
                self.publish_in_sync.set(0);
                // Statuses are watched, so two quick failures may arrive as one: the
                // streak's count says how many there were.
                let before = match previous {
                    PublishStatus::Failing {
                        consecutive_failures: b,
                        ..
                    } if b <= consecutive_failures => *b,
                    _ => 0,
                };
                self.publish_failures
                    .inc_by(u64::from(consecutive_failures - before));
            }
            PublishStatus::Starting => {
                self.publish_in_sync.set(0);
            }
        }
    }

    /// What the DRA services record, for them and for prepares outside them.
    pub(crate) fn claims(&self) -> &Arc<ClaimMetrics> {
        &self.claims
    }

    /// Takes in the devices this node publishes (whole GPUs and MIG devices).
    pub(crate) fn set_devices(&self, devices: &[AllocatableDevice]) {
        self.devices
            .set(i64::try_from(devices.len()).unwrap_or(i64::MAX));
        let mut gpus: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
        for d in devices {
            let numa = d
                .gpu
                .numa_node
                .map_or_else(|| "none".to_owned(), |n| n.to_string());
            gpus.entry(d.gpu.device_name())
                .or_insert_with(|| (numa, Vec::new()))
                .1
                .push(d.name());
        }
        self.update_numa(|p| p.gpus = gpus.into_values().collect());
    }

    /// Takes in what `preparer` holds now, for `topodra_prepared_devices` and the
    /// prepared GPUs of `topodra_numa_devices`: both from one copy of the checkpoint,
    /// preparing claims included, so the two agree.
    pub(crate) fn set_prepared_from(&self, preparer: &Preparer) {
        let devices: Vec<String> = preparer
            .checkpoint()
            .claims
            .into_values()
            .flat_map(|c| c.devices.into_iter().map(|d| d.device))
            .collect();
        self.claims.set_prepared_devices(devices.len());
        self.set_prepared(devices);
    }

    /// Takes in the devices prepared claims hold.
    pub(crate) fn set_prepared(&self, devices: impl IntoIterator<Item = String>) {
        let prepared = devices.into_iter().collect();
        self.update_numa(|p| p.prepared = prepared);
    }

    /// Changes one source of `topodra_numa_devices` and sets every series from the
    /// result, under one lock so that concurrent updates cannot interleave: every
    /// state of every NUMA node seen gets a value, 0 included, so none vanishes.
    fn update_numa(&self, change: impl FnOnce(&mut NumaPicture)) {
        let mut p = self
            .numa_picture
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        change(&mut p);
        let counts = p.counts();
        let nodes: Vec<String> = p.gpus.iter().map(|(n, _)| n.clone()).collect();
        p.nodes_seen.extend(nodes);
        for numa_node in &p.nodes_seen {
            for state in NUMA_STATES {
                let n = counts
                    .get(&(numa_node.clone(), state))
                    .copied()
                    .unwrap_or(0);
                self.numa
                    .get_or_create(&NumaLabels {
                        numa_node: numa_node.clone(),
                        state,
                    })
                    .set(n);
            }
        }
    }

    pub(crate) fn set_read_only(&self, read_only: bool) {
        self.read_only.set(i64::from(read_only));
    }

    /// Counts a connection the HTTP endpoint closed at its connection limit.
    pub(crate) fn connection_rejected(&self) {
        self.registry.connection_rejected();
    }

    pub(crate) fn encode(&self) -> String {
        self.registry.encode()
    }
}

#[cfg(test)]
mod tests;
