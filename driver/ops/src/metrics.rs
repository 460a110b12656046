//! The Prometheus registry every topodra binary starts from: its own prefix, the count
//! of API requests it sent ([`RequestCounter`], as `<prefix>_api_requests_total`), the
//! connections its HTTP endpoint turned away ([`crate::http::HttpLimits`]), and
//! `<prefix>_build_info`. Each binary registers its own metrics on top.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry as PromRegistry;

use crate::requests::RequestCounter;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    revision: &'static str,
}

/// A binary's metrics registry with the metrics all binaries share.
pub struct Registry {
    registry: PromRegistry,
    connections_rejected: Counter,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

impl Registry {
    /// A registry whose metric names start with `prefix`, holding `requests`.
    pub fn new(prefix: &str, requests: &RequestCounter) -> Self {
        let mut registry = PromRegistry::with_prefix(prefix);
        let connections_rejected = Counter::default();
        registry.register(
            "http_connections_rejected",
            "Connections to this endpoint closed unserved because --http-max-connections were open",
            connections_rejected.clone(),
        );
        registry.register_collector(Box::new(requests.clone()));
        // A constant series whose labels tell the dashboards and alerts which build
        // runs where, during a rollout for instance.
        let build = Family::<BuildLabels, Gauge>::default();
        registry.register(
            "build_info",
            "Always 1; the labels say which build runs (the version and commit of --version)",
            build.clone(),
        );
        build
            .get_or_create(&BuildLabels {
                version: crate::version::VERSION,
                revision: crate::version::REVISION,
            })
            .set(1);
        Self {
            registry,
            connections_rejected,
        }
    }

    /// Where the binary registers its own metrics.
    pub fn registry_mut(&mut self) -> &mut PromRegistry {
        &mut self.registry
    }

    /// Counts a connection the HTTP endpoint closed unserved (its `rejected` hook).
    pub fn connection_rejected(&self) {
        self.connections_rejected.inc();
    }

    /// The text exposition format, for `/metrics`.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_metrics_carry_the_prefix() {
        let requests = RequestCounter::new();
        let r = Registry::new("topodra_test", &requests);
        r.connection_rejected();
        let text = r.encode();
        assert!(
            text.contains("topodra_test_http_connections_rejected_total 1"),
            "{text}"
        );
        let build = format!(
            "topodra_test_build_info{{version=\"{}\",revision=\"{}\"}} 1",
            crate::version::VERSION,
            crate::version::REVISION
        );
        assert!(text.contains(&build), "{text}");
    }
}
