//! The end of a process's work: SIGTERM (the pod is being deleted) or SIGINT.

/// Resolves on SIGTERM or SIGINT, logging which; never resolves when neither can be
/// listened for (logged as an error), so a caller keeps serving.
pub async fn terminated() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
    }
}
