//! The plugin's HTTP endpoint (`/metrics`, `/healthz`, `/readyz`), up from before
//! the instance owns the node state until the process exits.

use std::sync::Arc;

use anyhow::Result;
use topodra_ops::endpoint::Endpoint;
use topodra_ops::http::Endpoints;

use crate::args::ServeArgs;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;

/// Starts the endpoint: metrics from `metrics`, liveness and readiness from
/// `lifecycle`, with the flags of `args`.
pub(crate) async fn start(
    args: &ServeArgs,
    metrics: &Arc<Metrics>,
    lifecycle: &Lifecycle,
) -> Result<Endpoint> {
    let endpoints = Endpoints {
        metrics: {
            let metrics = metrics.clone();
            Arc::new(move || metrics.encode())
        },
        live: lifecycle.live_check(),
        ready: lifecycle.ready_check(),
        rejected: {
            let metrics = metrics.clone();
            Arc::new(move || metrics.connection_rejected())
        },
    };
    Ok(Endpoint::start(&args.http, endpoints).await?)
}
