//! Whether this instance serves from the node's state or read-only.
//!
//! An instance that cannot take ownership of its state directory (read-only, full
//! with no lock file yet, the lock file replaced by a directory, ...) does not exit:
//! its container would only restart into the same error, and the kubelet could not
//! even unprepare the claims of pods that go away. It serves read-only instead
//! (`Preparer::start_read_only`), says so in an Event and a metric, and tries again
//! every `--state-retry-seconds` until the directory can be owned and written.

use std::path::Path;
use std::time::Duration;

use dra_kubeletplugin::ownership::{self, Ownership, Timing};

/// Who this instance is to the node's state.
pub(crate) enum Owner {
    Owned(Ownership),
    /// Serving read-only, for this reason.
    ReadOnly(String),
}

impl Owner {
    /// Takes ownership of `dir` (asking a live owner to hand over), or says why it
    /// cannot be used.
    pub(crate) async fn take(dir: &Path, name: &str, timing: Timing) -> Self {
        match usable(dir, name, timing).await {
            Ok(owned) => Self::Owned(owned),
            Err(reason) => Self::ReadOnly(reason),
        }
    }
}

async fn usable(dir: &Path, name: &str, timing: Timing) -> Result<Ownership, String> {
    let owned = ownership::acquire(dir, name, timing)
        .await
        .map_err(|e| format!("taking ownership of the node state: {e}"))?;
    ownership::probe_writable(dir, &[topodra_node::checkpoint::CHECKPOINT_FILE])
        .map_err(|e| e.to_string())?;
    Ok(owned)
}

/// Resolves once the state directory can be owned and written again; tries every
/// `retry`.
pub(crate) async fn usable_again(
    dir: &Path,
    name: &str,
    timing: Timing,
    retry: Duration,
) -> Ownership {
    loop {
        tokio::time::sleep(retry).await;
        match usable(dir, name, timing).await {
            Ok(owned) => return owned,
            Err(reason) => tracing::info!(reason, "the node state directory is still unusable"),
        }
    }
}
