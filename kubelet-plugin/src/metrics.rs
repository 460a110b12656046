//! Prometheus metrics of the plugin; `topodra_ops::http` serves them.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use topodra_ops::metrics::Registry;
use topodra_ops::requests::RequestCounter;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    operation: String,
    kind: String,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms to ~16 s: a prepare is a GET plus two fsyncs, normally milliseconds.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The plugin's metrics; cheap to share.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    prepare_seconds: Family<OutcomeLabels, Histogram>,
    unprepare_seconds: Family<OutcomeLabels, Histogram>,
    errors: Family<ErrorLabels, Counter>,
    prepared_devices: Gauge,
    devices: Gauge,
}

impl Metrics {
    /// The metrics, with `requests` exported as `topodra_api_requests_total`.
    pub(crate) fn new(requests: &RequestCounter) -> Self {
        let mut base = Registry::new("topodra", requests);
        let registry = base.registry_mut();
        let prepare_seconds = Family::<OutcomeLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let unprepare_seconds = Family::<OutcomeLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        let prepared_devices = Gauge::default();
        let devices = Gauge::default();
        registry.register(
            "prepare_duration_seconds",
            "NodePrepareResources latency per claim, including the claim GET",
            prepare_seconds.clone(),
        );
        registry.register(
            "unprepare_duration_seconds",
            "NodeUnprepareResources latency per claim",
            unprepare_seconds.clone(),
        );
        registry.register(
            "claim_errors",
            "Failed prepares and unprepares by kind",
            errors.clone(),
        );
        registry.register(
            "prepared_devices",
            "Devices held by prepared claims",
            prepared_devices.clone(),
        );
        registry.register("devices", "GPUs published by this node", devices.clone());
        Self {
            registry: base,
            prepare_seconds,
            unprepare_seconds,
            errors,
            prepared_devices,
            devices,
        }
    }

    fn observe(
        &self,
        family: &Family<OutcomeLabels, Histogram>,
        operation: &str,
        elapsed: Duration,
        outcome: &str,
    ) {
        family
            .get_or_create(&OutcomeLabels {
                outcome: if outcome == "ok" { "ok" } else { "error" }.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
        if outcome != "ok" {
            self.errors
                .get_or_create(&ErrorLabels {
                    operation: operation.to_owned(),
                    kind: outcome.to_owned(),
                })
                .inc();
        }
    }

    pub(crate) fn observe_prepare(&self, elapsed: Duration, outcome: &str) {
        self.observe(&self.prepare_seconds, "prepare", elapsed, outcome);
    }

    pub(crate) fn observe_unprepare(&self, elapsed: Duration, outcome: &str) {
        self.observe(&self.unprepare_seconds, "unprepare", elapsed, outcome);
    }

    pub(crate) fn set_prepared_devices(&self, n: usize) {
        self.prepared_devices
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(crate) fn set_devices(&self, n: usize) {
        self.devices.set(i64::try_from(n).unwrap_or(i64::MAX));
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
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn encodes_latency_errors_and_api_totals() {
        let requests = RequestCounter::new();
        let m = Metrics::new(&requests);
        m.observe_prepare(Duration::from_millis(3), "ok");
        m.observe_prepare(Duration::from_millis(3), "config");
        m.set_prepared_devices(8);
        let nodes = http::Request::get("/api/v1/nodes/n").body(()).unwrap();
        for _ in 0..3 {
            requests.record_request(&nodes);
        }
        let text = m.encode();
        assert!(
            text.contains("topodra_prepare_duration_seconds_count{outcome=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("topodra_claim_errors_total{operation=\"prepare\",kind=\"config\"} 1"),
            "{text}"
        );
        assert!(text.contains("topodra_prepared_devices 8"), "{text}");
        assert!(
            text.contains("topodra_api_requests_total{verb=\"get\",resource=\"nodes\"} 3"),
            "{text}"
        );
    }
}
