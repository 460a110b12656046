//! The plugin's HTTP endpoint (`/metrics`, `/healthz`, `/readyz`), up from before
//! the instance owns the node state until the process exits.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use topodra_ops::http::{Endpoints, HttpLimits};

use crate::args::ServeArgs;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;

/// The /metrics, /healthz and /readyz endpoint, served until [`HttpEndpoint::stop`].
pub(crate) struct HttpEndpoint {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl HttpEndpoint {
    pub(crate) async fn start(
        args: &ServeArgs,
        metrics: &Arc<Metrics>,
        lifecycle: &Lifecycle,
    ) -> Result<Self> {
        let addr = args.http.addr();
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the HTTP endpoint to {addr}"))?;
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
        let limits = HttpLimits {
            header_read_timeout: Duration::from_secs(args.http.http_header_read_timeout_seconds),
            write_timeout: Duration::from_secs(args.http.http_write_timeout_seconds),
            max_connections: args.http.http_max_connections as usize,
            max_requests_per_connection: args.http.http_max_requests_per_connection as usize,
        };
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(topodra_ops::http::serve(
            listener,
            endpoints,
            limits,
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            },
        ));
        Ok(Self { stop, task })
    }

    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(1), self.task).await;
    }
}
