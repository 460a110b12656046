//! How serving ends: a signal from the kubelet's side (the pod is deleted), or
//! another instance asking for the node state.

use crate::ownership::Ownership;

/// Why serving ended.
pub(crate) enum Stop {
    /// SIGTERM or SIGINT: the pod is being deleted.
    Terminate,
    /// Another instance (the new pod of a rolling update) asked for the node state.
    Handover(String),
    /// Serving read-only, this instance took ownership of a usable state directory:
    /// it serves again from the state.
    StateUsable(Ownership),
}

/// Waits for SIGTERM or SIGINT; never returns when neither can be listened for.
pub(crate) async fn signal() {
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
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
}
