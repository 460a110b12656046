//! One lock per device, so claims on disjoint GPUs prepare in parallel and claims
//! that overlap wait for each other instead of for the whole node.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Debug, Default)]
pub(super) struct DeviceLocks {
    locks: BTreeMap<String, Arc<Mutex<()>>>,
}

/// Held locks of one claim's devices; released on drop.
pub(super) struct Held<'a> {
    _guards: Vec<MutexGuard<'a, ()>>,
}

impl DeviceLocks {
    pub(super) fn new(devices: impl IntoIterator<Item = String>) -> Self {
        Self {
            locks: devices.into_iter().map(|d| (d, Arc::default())).collect(),
        }
    }

    /// Locks `devices` in name order, which is the same for every caller, so two
    /// claims sharing devices cannot deadlock. Unknown names are skipped: the caller
    /// has already rejected them, or is unpreparing a device that is gone.
    pub(super) fn lock<'a>(&'a self, devices: &[String]) -> Held<'a> {
        let mut names: Vec<&String> = devices.iter().collect();
        names.sort();
        names.dedup();
        let guards = names
            .into_iter()
            .filter_map(|d| self.locks.get(d))
            // A poisoned lock only means another prepare panicked while holding it;
            // the device state lives in the checkpoint, not behind the lock.
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
            .collect();
        Held { _guards: guards }
    }
}
