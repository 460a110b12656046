//! Prometheus metrics of the DRA services, registered into the plugin's registry so
//! they carry its prefix (`<prefix>_prepare_duration_seconds`, ...).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

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

/// Latency and errors per claim, and the devices prepared claims hold.
#[derive(Debug, Clone)]
pub struct ClaimMetrics {
    prepare_seconds: Family<OutcomeLabels, Histogram>,
    unprepare_seconds: Family<OutcomeLabels, Histogram>,
    errors: Family<ErrorLabels, Counter>,
    prepared_devices: Gauge,
}

impl Default for ClaimMetrics {
    /// Metrics that no registry exports.
    fn default() -> Self {
        Self {
            prepare_seconds: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            unprepare_seconds: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            errors: Family::default(),
            prepared_devices: Gauge::default(),
        }
    }
}

impl ClaimMetrics {
    /// Registers `prepare_duration_seconds`, `unprepare_duration_seconds`,
    /// `claim_errors` and `prepared_devices` into `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "prepare_duration_seconds",
            "NodePrepareResources latency per claim, including the claim GET",
            m.prepare_seconds.clone(),
        );
        registry.register(
            "unprepare_duration_seconds",
            "NodeUnprepareResources latency per claim",
            m.unprepare_seconds.clone(),
        );
        registry.register(
            "claim_errors",
            "Failed prepares and unprepares by kind",
            m.errors.clone(),
        );
        registry.register(
            "prepared_devices",
            "Devices held by prepared claims",
            m.prepared_devices.clone(),
        );
        m
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

    /// One prepare took `elapsed`; `outcome` is `ok` or the error's kind.
    pub fn observe_prepare(&self, elapsed: Duration, outcome: &str) {
        self.observe(&self.prepare_seconds, "prepare", elapsed, outcome);
    }

    /// One unprepare took `elapsed`; `outcome` is `ok` or the error's kind.
    pub fn observe_unprepare(&self, elapsed: Duration, outcome: &str) {
        self.observe(&self.unprepare_seconds, "unprepare", elapsed, outcome);
    }

    pub fn set_prepared_devices(&self, n: usize) {
        self.prepared_devices
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_registry_prefix() {
        let mut registry = Registry::with_prefix("example");
        let m = ClaimMetrics::register(&mut registry);
        m.observe_unprepare(Duration::from_millis(3), "io");
        m.set_prepared_devices(2);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap_or_default();
        assert!(
            text.contains("example_unprepare_duration_seconds_count{outcome=\"error\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("example_claim_errors_total{operation=\"unprepare\",kind=\"io\"} 1"),
            "{text}"
        );
        assert!(text.contains("example_prepared_devices 2"), "{text}");
    }
}
