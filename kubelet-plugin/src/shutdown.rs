//! How serving ends: a signal from the kubelet's side (the pod is deleted,
//! `topodra_ops::signal::terminated`), another instance asking for the node state,
//! or, while serving read-only, a change in what this instance can do.

use crate::node_state::Retaken;

/// Why serving ended.
pub(crate) enum Stop {
    /// SIGTERM or SIGINT: the pod is being deleted.
    Terminate,
    /// Another instance (the new pod of a rolling update) asked for the node state.
    Handover(String),
    /// Serving read-only with the lock, everything it needs works again: it serves
    /// from the state.
    Usable,
    /// Serving read-only without the lock, it took the lock, or found another
    /// instance holding it.
    Retaken(Retaken),
}
