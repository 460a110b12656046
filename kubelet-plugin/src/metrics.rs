//! Prometheus metrics of the plugin; `topodra_ops::http` serves them. The DRA
//! services' own (`topodra_prepare_duration_seconds`, ...) come from
//! [`ClaimMetrics`], registered here under the same prefix.

use std::sync::Arc;

use dra_kubeletplugin::metrics::ClaimMetrics;
use prometheus_client::metrics::gauge::Gauge;
use topodra_ops::metrics::Registry;
use topodra_ops::requests::RequestCounter;

/// The plugin's metrics; cheap to share.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    claims: Arc<ClaimMetrics>,
    devices: Gauge,
    read_only: Gauge,
}

impl Metrics {
    /// The metrics, with `requests` exported as `topodra_api_requests_total`.
    pub(crate) fn new(requests: &RequestCounter) -> Self {
        let mut base = Registry::new("topodra", requests);
        let registry = base.registry_mut();
        let claims = Arc::new(ClaimMetrics::register(registry));
        let devices = Gauge::default();
        registry.register("devices", "GPUs published by this node", devices.clone());
        let read_only = Gauge::default();
        registry.register(
            "state_read_only",
            "1 while the plugin serves read-only because it cannot use its state directory (no claim can be prepared)",
            read_only.clone(),
        );
        Self {
            registry: base,
            claims,
            devices,
            read_only,
        }
    }

    /// What the DRA services record, for them and for prepares outside them.
    pub(crate) fn claims(&self) -> &Arc<ClaimMetrics> {
        &self.claims
    }

    pub(crate) fn set_devices(&self, n: usize) {
        self.devices.set(i64::try_from(n).unwrap_or(i64::MAX));
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
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn encodes_latency_errors_and_api_totals() {
        let requests = RequestCounter::new();
        let m = Metrics::new(&requests);
        m.claims().observe_prepare(Duration::from_millis(3), "ok");
        m.claims()
            .observe_prepare(Duration::from_millis(3), "config");
        m.claims().set_prepared_devices(8);
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
