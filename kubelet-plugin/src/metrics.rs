//! Prometheus metrics of the plugin, and the HTTP endpoint that serves them together
//! with liveness and readiness.
//!
//! The endpoint is reachable from the pod network, so it must not be something a
//! client can exhaust: every connection gets `header_read_timeout` to send its request
//! headers (idle keep-alive connections too), and at most `max_connections` are served
//! at once; connections beyond that are closed as soon as they are accepted.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::Semaphore;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    operation: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiLabels {
    verb: String,
    resource: String,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms to ~16 s: a prepare is a GET plus two fsyncs, normally milliseconds.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The plugin's metrics; cheap to share.
pub(crate) struct Metrics {
    registry: Registry,
    prepare_seconds: Family<OutcomeLabels, Histogram>,
    unprepare_seconds: Family<OutcomeLabels, Histogram>,
    errors: Family<ErrorLabels, Counter>,
    prepared_devices: Gauge,
    devices: Gauge,
    api_requests: Family<ApiLabels, Counter>,
    http_connections_rejected: Counter,
    /// Last totals taken from the API request counter, to turn its snapshots into
    /// increments of monotonic counters.
    api_seen: Mutex<BTreeMap<(String, String), u64>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("topodra");
        let prepare_seconds = Family::<OutcomeLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let unprepare_seconds = Family::<OutcomeLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        let prepared_devices = Gauge::default();
        let devices = Gauge::default();
        let api_requests = Family::<ApiLabels, Counter>::default();
        let http_connections_rejected = Counter::default();
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
        registry.register(
            "api_requests",
            "Requests to the Kubernetes API server by verb and resource",
            api_requests.clone(),
        );
        registry.register(
            "http_connections_rejected",
            "Connections to this endpoint closed unserved because --http-max-connections were open",
            http_connections_rejected.clone(),
        );
        Self {
            registry,
            prepare_seconds,
            unprepare_seconds,
            errors,
            prepared_devices,
            devices,
            api_requests,
            http_connections_rejected,
            api_seen: Mutex::default(),
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

    /// Folds a snapshot of cumulative API request totals into the counters.
    pub(crate) fn record_api_totals(&self, totals: &BTreeMap<(String, String), u64>) {
        let mut seen = self.api_seen.lock().unwrap_or_else(|e| e.into_inner());
        for ((verb, resource), total) in totals {
            let before = seen
                .insert((verb.clone(), resource.clone()), *total)
                .unwrap_or(0);
            if *total > before {
                self.api_requests
                    .get_or_create(&ApiLabels {
                        verb: verb.clone(),
                        resource: resource.clone(),
                    })
                    .inc_by(*total - before);
            }
        }
    }

    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

pub(crate) type Check =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// What the HTTP endpoint serves: metrics, and checks for liveness and readiness.
#[derive(Clone)]
pub(crate) struct Endpoints {
    pub(crate) metrics: Arc<Metrics>,
    /// Called before each scrape to pull in numbers kept elsewhere.
    pub(crate) before_scrape: Arc<dyn Fn(&Metrics) + Send + Sync>,
    pub(crate) live: Check,
    pub(crate) ready: Check,
}

async fn handle(
    endpoints: Endpoints,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r
    };
    Ok(match req.uri().path() {
        "/metrics" => {
            (endpoints.before_scrape)(&endpoints.metrics);
            let mut r = reply(StatusCode::OK, endpoints.metrics.encode());
            if let Ok(v) = "application/openmetrics-text; version=1.0.0; charset=utf-8".parse() {
                r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
            }
            r
        }
        "/healthz" | "/livez" => match (endpoints.live)().await {
            Ok(()) => reply(StatusCode::OK, "ok\n".into()),
            Err(e) => reply(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
        },
        "/readyz" => match (endpoints.ready)().await {
            Ok(()) => reply(StatusCode::OK, "ok\n".into()),
            Err(e) => reply(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
        },
        _ => reply(StatusCode::NOT_FOUND, "not found\n".into()),
    })
}

/// What one client may hold of the endpoint.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HttpLimits {
    /// Time to send a request's headers, counted from the connection's start or the
    /// end of its previous response.
    pub(crate) header_read_timeout: Duration,
    /// Connections served at once.
    pub(crate) max_connections: usize,
}

/// Probe and scrape requests have a few hundred bytes of headers; hyper's default
/// buffer (about 400 KiB) would let each open connection hold that much memory.
const MAX_REQUEST_BUFFER: usize = 16 * 1024;

/// Serves the endpoints on `listener` until `shutdown` resolves.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    endpoints: Endpoints,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send,
) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, header_read_timeout = ?limits.header_read_timeout, max_connections = limits.max_connections, "serving /metrics, /healthz and /readyz");
    }
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics endpoint accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                // Closing at once rather than queueing: a waiting connection would
                // still hold a socket, and the client learns immediately.
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    endpoints.metrics.http_connections_rejected.inc();
                    tracing::debug!(%peer, "metrics endpoint at its connection limit; closed a connection");
                    drop(stream);
                    continue;
                };
                let endpoints = endpoints.clone();
                tokio::spawn(async move {
                    let _slot = slot;
                    let service = hyper::service::service_fn(move |req| handle(endpoints.clone(), req));
                    let served = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(limits.header_read_timeout)
                        .max_buf_size(MAX_REQUEST_BUFFER)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                    if let Err(e) = served {
                        tracing::debug!(%peer, error = %e, "metrics connection ended");
                    }
                });
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn encodes_latency_errors_and_api_totals() {
        let m = Metrics::new();
        m.observe_prepare(Duration::from_millis(3), "ok");
        m.observe_prepare(Duration::from_millis(3), "config");
        m.set_prepared_devices(8);
        let mut totals = BTreeMap::from([(("get".to_owned(), "nodes".to_owned()), 1)]);
        m.record_api_totals(&totals);
        totals.insert(("get".into(), "nodes".into()), 3);
        m.record_api_totals(&totals);
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
