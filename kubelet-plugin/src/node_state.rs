//! Whether this instance serves from the node's state or read-only.
//!
//! An instance serves from the state when it owns the state directory and can write
//! everything it writes at start and at prepare ([`Needs`]): the lock, the
//! checkpoint (a probe file stands for it) and the `nvidia-cdi-hook` the specs name.
//! When it cannot (read-only, full, the lock file or the hook's path taken by a
//! directory, ...) it does not exit: its container would only restart into the same
//! error, and the kubelet could not even unprepare the claims of pods that go away.
//! It serves read-only instead (`Preparer::start_read_only`), says so in an Event
//! and a metric, and tries again every `--state-retry-seconds`.
//!
//! Two rules keep a rolling update from going back and forth, the new pod taking
//! the state, failing and dropping it, the old one taking it back, and again at the
//! new pod's next try:
//!
//! - an instance asks a live owner to hand over only when its needs are met; until
//!   then it waits, live and not ready, and the owner keeps serving;
//! - an instance that took the lock keeps it while it serves read-only, and hands
//!   over when asked, like any owner (only an instance that can use the state asks).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dra_kubeletplugin::ownership::{self, Ownership, OwnershipError, Timing};

use crate::cdi_hook::{self, HookSetup};

/// Who this instance is to the node's state.
pub(crate) enum Owner {
    /// Holds the lock, and its needs are met.
    Owned(Ownership),
    /// Serving read-only, for `reason`; with the lock when it could take it.
    ReadOnly {
        reason: String,
        lock: Option<Ownership>,
    },
}

impl Owner {
    pub(crate) fn into_lock(self) -> Option<Ownership> {
        match self {
            Owner::Owned(lock) => Some(lock),
            Owner::ReadOnly { lock, .. } => lock,
        }
    }
}

/// What must work, beyond the lock, before an instance serves from the state.
pub(crate) trait Needs: Sync {
    /// The state directory can be written and its state read.
    fn state(&self) -> Result<(), String>;
    /// Everything else the instance writes (the hook), in place.
    fn others(&self) -> impl Future<Output = Result<(), String>> + Send;
}

/// Every problem `needs` has, in one line.
pub(crate) async fn check(needs: &impl Needs) -> Result<(), String> {
    let problems: Vec<String> = [needs.others().await.err(), needs.state().err()]
        .into_iter()
        .flatten()
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// The plugin's needs: its state directory, and the hook its specs name.
pub(crate) struct StartNeeds {
    dir: PathBuf,
    hook: HookSetup,
    /// Once the hook is in place it stays the file the specs name; only a hook
    /// that was not is checked (installed) again.
    hook_ready: AtomicBool,
}

impl StartNeeds {
    pub(crate) fn new(dir: PathBuf, hook: HookSetup, hook_ready: bool) -> Self {
        Self {
            dir,
            hook,
            hook_ready: AtomicBool::new(hook_ready),
        }
    }
}

impl Needs for StartNeeds {
    fn state(&self) -> Result<(), String> {
        ownership::probe_writable(&self.dir, &[topodra_node::checkpoint::CHECKPOINT_FILE])
            .map_err(|e| e.to_string())
    }

    async fn others(&self) -> Result<(), String> {
        if self.hook_ready.load(Ordering::SeqCst) {
            return Ok(());
        }
        let setup = self.hook.clone();
        match tokio::task::spawn_blocking(move || cdi_hook::prepare(&setup)).await {
            Ok(Ok(hook)) => {
                hook.log_ready();
                self.hook_ready.store(true, Ordering::SeqCst);
                Ok(())
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(format!("checking nvidia-cdi-hook: {e}")),
        }
    }
}

/// Why an instance waits without asking the owner for the node state.
pub(crate) struct NotAsking<'a> {
    /// The owner, as its lock file names it.
    pub(crate) owner: &'a str,
    pub(crate) reason: &'a str,
}

/// Takes ownership of `dir`. A live owner is asked to hand over only while
/// `needs` are met; until they are, this waits, telling `waiting` the owner and
/// the reason whenever the reason changes (and `None` when it asks after all), and
/// tries again every `retry`.
pub(crate) async fn take(
    dir: &Path,
    name: &str,
    timing: Timing,
    retry: Duration,
    needs: &impl Needs,
    waiting: &(dyn Fn(Option<NotAsking<'_>>) + Sync),
) -> Owner {
    let mut told: Option<String> = None;
    loop {
        match ownership::try_acquire(dir, name) {
            Err(e) => return without_lock(&e, needs).await,
            Ok(Some(lock)) => return with_lock(lock, needs).await,
            Ok(None) => {}
        }
        match check(needs).await {
            Ok(()) => {
                if told.is_some() {
                    waiting(None);
                }
                return match ownership::acquire(dir, name, timing).await {
                    Ok(lock) => with_lock(lock, needs).await,
                    Err(e) => without_lock(&e, needs).await,
                };
            }
            Err(reason) => {
                if told.as_ref() != Some(&reason) {
                    let owner = ownership::named_owner(dir)
                        .unwrap_or_else(|| "another instance".to_owned());
                    tracing::warn!(
                        owner,
                        reason,
                        "another instance owns the node state; not asking for it while this instance cannot use it"
                    );
                    waiting(Some(NotAsking {
                        owner: &owner,
                        reason: &reason,
                    }));
                    told = Some(reason);
                }
                tokio::time::sleep(retry).await;
            }
        }
    }
}

/// With the lock held: owned when `needs` are met, read-only (keeping the lock)
/// when not.
pub(crate) async fn with_lock(lock: Ownership, needs: &impl Needs) -> Owner {
    match check(needs).await {
        Ok(()) => Owner::Owned(lock),
        Err(reason) => Owner::ReadOnly {
            reason,
            lock: Some(lock),
        },
    }
}

async fn without_lock(e: &OwnershipError, needs: &impl Needs) -> Owner {
    let mut reason = format!("taking ownership of the node state: {e}");
    if let Err(other) = needs.others().await {
        reason = format!("{reason}; {other}");
    }
    Owner::ReadOnly { reason, lock: None }
}

/// Resolves once `needs` are met again, trying every `retry`: for an instance that
/// serves read-only with the lock.
pub(crate) async fn usable_again(retry: Duration, needs: &impl Needs) {
    loop {
        tokio::time::sleep(retry).await;
        match check(needs).await {
            Ok(()) => return,
            Err(reason) => tracing::info!(reason, "the node state is still unusable"),
        }
    }
}

/// What an instance serving read-only without the lock finds when it tries again.
pub(crate) enum Retaken {
    /// It took the lock: owned, or read-only with the lock.
    Owner(Owner),
    /// Another instance holds the lock now; it serves the node.
    OwnedElsewhere,
}

/// Tries the lock every `retry` until it can be taken or another instance holds
/// it: for an instance that serves read-only without the lock. Never asks.
pub(crate) async fn retake(dir: &Path, name: &str, retry: Duration, needs: &impl Needs) -> Retaken {
    loop {
        tokio::time::sleep(retry).await;
        match ownership::try_acquire(dir, name) {
            Ok(Some(lock)) => return Retaken::Owner(with_lock(lock, needs).await),
            Ok(None) => return Retaken::OwnedElsewhere,
            Err(e) => tracing::info!(error = %e, "the node state directory is still unusable"),
        }
    }
}

#[cfg(test)]
mod tests;
