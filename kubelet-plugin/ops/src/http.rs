//! The HTTP endpoint of a topodra binary: `/metrics`, `/healthz` (also `/livez`) and
//! `/readyz`.
//!
//! The endpoint is reachable from the pod network, so it must not be something a
//! client can exhaust: every connection gets `header_read_timeout` to send its request
//! headers (idle keep-alive connections too), and at most `max_connections` are served
//! at once; connections beyond that are closed as soon as they are accepted.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

/// A liveness or readiness check: `Err` carries the reason the probe prints.
pub type Check =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// A check that always passes.
pub fn always_ok() -> Check {
    Arc::new(|| Box::pin(async { Ok(()) }))
}

/// What the endpoint serves.
#[derive(Clone)]
pub struct Endpoints {
    /// The metrics in the OpenMetrics text format, encoded at each scrape.
    pub metrics: Arc<dyn Fn() -> String + Send + Sync>,
    pub live: Check,
    pub ready: Check,
    /// Called for each connection closed at the connection limit, to count them.
    pub rejected: Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoints").finish_non_exhaustive()
    }
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
            let mut r = reply(StatusCode::OK, (endpoints.metrics)());
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
pub struct HttpLimits {
    /// Time to send a request's headers, counted from the connection's start or the
    /// end of its previous response.
    pub header_read_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

/// Probe and scrape requests have a few hundred bytes of headers; hyper's default
/// buffer (about 400 KiB) would let each open connection hold that much memory.
const MAX_REQUEST_BUFFER: usize = 16 * 1024;

/// Serves the endpoints on `listener` until `shutdown` resolves.
pub async fn serve(
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
                    (endpoints.rejected)();
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
