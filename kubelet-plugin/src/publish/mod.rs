//! Publishing this node's pool as ResourceSlices.
//!
//! The API server is a shared resource that thousands of nodes talk to, so the
//! publisher is frugal by construction:
//!
//! - one GET of the Node at startup (its UID makes the Node own the slices, so they are
//!   garbage-collected with it), retried with capped, jittered backoff;
//! - one streaming watch of our slices (WatchList: `sendInitialEvents=true`, no LIST
//!   call), resumed from the last resourceVersion when it ends;
//! - writes only when the observed slices differ from the desired ones, in the fields
//!   we set, after a short quiet period so a burst of health changes is one write;
//! - server-side apply with one field manager, and a delete only for a slice the pool
//!   no longer has.
//!
//! `topodra_ops::requests` counts every request the client sends, for metrics.

mod compare;
mod publisher;
mod state;
mod timing;

#[cfg(test)]
mod mock;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::DeviceTaint;
use topodra_driver::Inventory;
use topodra_driver::slice::NumaNodeFormat;

pub(crate) use publisher::Publisher;
#[cfg(test)]
use topodra_ops::requests::RequestCounter;

/// What the pool should contain: the health code sends a new value when a GPU goes
/// bad or recovers, discovery when the inventory changes.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct DesiredPool {
    pub(crate) inventory: Arc<Inventory>,
    /// Taints by device name (`gpu-3`).
    pub(crate) device_taints: BTreeMap<String, Vec<DeviceTaint>>,
}

impl DesiredPool {
    pub(crate) fn new(inventory: impl Into<Arc<Inventory>>) -> Self {
        Self {
            inventory: inventory.into(),
            device_taints: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct PublisherConfig {
    pub(crate) driver_name: String,
    pub(crate) node_name: String,
    pub(crate) numa_node_format: NumaNodeFormat,
    /// Fewer devices per slice than the API allows (tests, and operators who want
    /// smaller objects).
    pub(crate) max_devices_per_slice: Option<usize>,
    /// Quiet period after a change before writing.
    pub(crate) debounce: Duration,
    /// Longest a change waits while changes keep coming.
    pub(crate) max_debounce: Duration,
    /// Retry delays after a failed request: doubling from the first to the cap.
    pub(crate) retry_initial: Duration,
    pub(crate) retry_max: Duration,
}

impl PublisherConfig {
    pub(crate) fn new(driver_name: impl Into<String>, node_name: impl Into<String>) -> Self {
        Self {
            driver_name: driver_name.into(),
            node_name: node_name.into(),
            numa_node_format: NumaNodeFormat::Int,
            max_devices_per_slice: None,
            debounce: Duration::from_millis(500),
            max_debounce: Duration::from_secs(5),
            retry_initial: Duration::from_millis(500),
            retry_max: Duration::from_secs(60),
        }
    }

    /// Server-side apply field manager: per driver, so two drivers built from this
    /// code on one cluster never take each other's fields.
    pub(crate) fn field_manager(&self) -> String {
        format!("{}-kubelet-plugin", self.driver_name)
    }
}

/// How publishing stands, for readiness and liveness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PublishStatus {
    /// Before the first reconcile: fetching the Node, or waiting for the watch's
    /// initial events.
    Starting,
    /// The last reconcile found, or made, the slices as desired.
    InSync { generation: i64 },
    /// The last attempt failed; retried with backoff (or, when the desired pool itself
    /// is invalid, when it changes).
    Failing {
        consecutive_failures: u32,
        error: String,
    },
}

impl PublishStatus {
    pub(crate) fn is_in_sync(&self) -> bool {
        matches!(self, Self::InSync { .. })
    }
}
