//! How serving ends: a signal from the kubelet's side (the pod is deleted,
//! `topodra_ops::signal::terminated`), or another instance asking for the node state.

use dra_kubeletplugin::ownership::Ownership;

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
