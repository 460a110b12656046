//! Group commit of checkpoint saves.
//!
//! Every prepare waits for one synced save of its started record (two fsyncs). Saved
//! one after another, eight prepares arriving together would wait for eight saves in
//! a row; here, the changes that arrive while a save is running are applied to the
//! checkpoint in memory and carried together by the next save, so they wait for at
//! most two. A caller returns only once a save that holds its change has reached
//! disk, so what a caller was told is on disk as before.
//!
//! Changes are decided against the checkpoint in memory, pending changes included:
//! a prepare that wants a GPU another claim's pending prepare holds is refused, as if
//! that prepare were saved already. When a save fails, every change it carried is
//! undone in memory and each of its callers gets the error; a change is undone by
//! putting back the one record it touched, which is only sound because changes of
//! one claim never overlap (its device locks serialize them).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use crate::checkpoint::{CheckpointError, CheckpointStore};
use topodra_model::checkpoint::{Checkpoint, ClaimRecord};

/// Writes a checkpoint to disk, durably.
type Save = Box<dyn Fn(&Checkpoint) -> Result<(), CheckpointError> + Send + Sync>;

/// How a save ended, shared by the callers whose changes it carried.
type Outcome = Arc<OnceLock<Result<(), Arc<str>>>>;

/// The changes waiting for the next save.
struct Batch {
    outcome: Outcome,
    /// For each change, in order, the claim it touched and its record before.
    undo: Vec<(String, Option<ClaimRecord>)>,
}

struct Inner {
    /// The last save plus the changes waiting for the next one, and the completions
    /// made in memory only.
    current: Checkpoint,
    /// The batch the next save carries; `None` when nothing is waiting.
    open: Option<Batch>,
    /// A save is running (with the lock released).
    saving: bool,
    /// Memory holds changes made in memory only that no save has carried yet.
    unsaved: bool,
}

pub(super) struct Committer {
    save: Save,
    inner: Mutex<Inner>,
    /// Signalled when a save ends.
    saved: Condvar,
}

impl Committer {
    pub(super) fn new(store: CheckpointStore, checkpoint: Checkpoint) -> Self {
        Self::with_save(Box::new(move |cp| store.save(cp)), checkpoint)
    }

    fn with_save(save: Save, checkpoint: Checkpoint) -> Self {
        Self {
            save,
            inner: Mutex::new(Inner {
                current: checkpoint,
                open: None,
                saving: false,
                unsaved: false,
            }),
            saved: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Changes are applied to a copy and swapped in whole, and a failed save is
        // undone before the lock is released, so a panic cannot leave a half change.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the checkpoint in memory.
    pub(super) fn read<R>(&self, f: impl FnOnce(&Checkpoint) -> R) -> R {
        f(&self.lock().current)
    }

    /// Changes the checkpoint in memory only; `unsaved` says the next save should
    /// carry it (a completion), rather than that disk must never see it.
    pub(super) fn in_memory<R>(&self, unsaved: bool, f: impl FnOnce(&mut Checkpoint) -> R) -> R {
        let mut inner = self.lock();
        inner.unsaved |= unsaved;
        f(&mut inner.current)
    }

    /// Whether memory holds changes made in memory only that no save has carried.
    pub(super) fn has_unsaved(&self) -> bool {
        self.lock().unsaved
    }

    /// Applies `change`, which touches at most the record of `uid`, and returns once
    /// a save that holds it has reached disk. A refused change saves nothing; a
    /// failed save leaves memory as if the change had not been made.
    pub(super) fn update<T, E: From<CheckpointError>>(
        &self,
        uid: Option<&str>,
        change: impl FnOnce(&mut Checkpoint) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut inner = self.lock();
        let before = uid.map(|u| (u.to_owned(), inner.current.get(u).cloned()));
        let mut next = inner.current.clone();
        let out = change(&mut next)?;
        inner.current = next;
        let batch = inner.open.get_or_insert_with(|| Batch {
            outcome: Outcome::default(),
            undo: Vec::new(),
        });
        batch.undo.extend(before);
        let outcome = batch.outcome.clone();
        loop {
            if let Some(result) = outcome.get() {
                return match result {
                    Ok(()) => Ok(out),
                    Err(why) => Err(CheckpointError::SavedWithOthers(why.to_string()).into()),
                };
            }
            if !inner.saving {
                // No save is running, so the open batch is still ours: save it.
                return self.save_open(inner).map(|()| out).map_err(Into::into);
            }
            inner = self.saved.wait(inner).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Saves the open batch with the lock released, then tells its callers.
    fn save_open(&self, mut inner: MutexGuard<'_, Inner>) -> Result<(), CheckpointError> {
        let Some(batch) = inner.open.take() else {
            return Ok(());
        };
        let snapshot = inner.current.clone();
        let carried_unsaved = std::mem::take(&mut inner.unsaved);
        inner.saving = true;
        drop(inner);
        let result = (self.save)(&snapshot);
        let mut inner = self.lock();
        inner.saving = false;
        if result.is_err() {
            for (uid, record) in batch.undo.into_iter().rev() {
                match record {
                    Some(record) => inner.current.insert(record),
                    None => inner.current.remove(&uid),
                };
            }
            inner.unsaved |= carried_unsaved;
        }
        let shared = match &result {
            Ok(()) => Ok(()),
            Err(e) => Err(Arc::from(e.to_string())),
        };
        // Only the leader sets it; a second set cannot happen.
        let _ = batch.outcome.set(shared);
        self.saved.notify_all();
        result
    }
}

#[cfg(test)]
mod tests;
