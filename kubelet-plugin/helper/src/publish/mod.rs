//! Publishing a node's pool as ResourceSlices: the counterpart of Go's
//! `k8s.io/dynamic-resource-allocation/resourceslice` controller, for one node-local
//! pool.
//!
//! The driver builds the slices (device attributes, capacities, per-device taints,
//! how devices are split into slices) and hands them over as a [`DesiredPool`]; the
//! [`Publisher`] only compares and writes. It sets what only it knows: the pool
//! generation, and the Node as the slices' owner.
//!
//! The API server is a shared resource that thousands of nodes talk to, so the
//! publisher is frugal by construction:
//!
//! - one GET of the Node at startup (its UID makes the Node own the slices, so they are
//!   garbage-collected with it), retried with capped, jittered backoff;
//! - one streaming watch of our slices (WatchList: `sendInitialEvents=true`, no LIST
//!   call), resumed from the last resourceVersion when it ends, kept in a
//!   `kube::runtime::reflector` store;
//! - writes only when the observed slices differ from the desired ones, in the fields
//!   we set, after a short quiet period so a burst of changes is one write;
//! - server-side apply with one field manager, a create only for a slice the pool
//!   did not have, and a delete only for a slice the pool no longer has.
//!
//! Slices get their names from the API server (`generateName` `<node>-<driver>-`),
//! and the publisher finds its own by field selector (this node, this driver), not
//! by name: with fixed names, any identity that may create a slice could create one
//! under a name of another node's pool, and that node's publisher would write to it
//! for ever (`spec.pool.name` is immutable) and never become ready.
//!
//! The publisher sends its requests through the `kube::Client` it is given, so a
//! caller that counts API requests layers the client before handing it over.

mod compare;
mod publisher;
mod state;
mod timing;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;

pub use publisher::Publisher;

/// What the pool should contain, as the driver built it. The driver sends a new value
/// when it changes (a device goes bad or recovers, the inventory changes).
#[derive(Debug, Clone, PartialEq)]
pub enum DesiredPool {
    /// Every slice of the pool, complete but for `spec.pool.generation`,
    /// `metadata.ownerReferences` and the name, which the publisher sets (a name
    /// the driver gives is not used). Each must have the driver and node name of the
    /// [`PublisherConfig`].
    Slices(Arc<[ResourceSlice]>),
    /// The driver could not build a valid pool: nothing is written until it can, and
    /// the status says why.
    Invalid(String),
}

impl DesiredPool {
    pub fn new(slices: impl Into<Arc<[ResourceSlice]>>) -> Self {
        Self::Slices(slices.into())
    }
}

/// Where to publish, and how patiently.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PublisherConfig {
    pub driver_name: String,
    pub node_name: String,
    /// Quiet period after a change before writing.
    pub debounce: Duration,
    /// Longest a change waits while changes keep coming.
    pub max_debounce: Duration,
    /// Retry delays after a failed request: doubling from the first to the cap.
    pub retry_initial: Duration,
    pub retry_max: Duration,
    /// Name a pool of several slices so that its slices sort by name in the order
    /// the driver gave them: each slice's `generateName` carries its index
    /// (`<node>-<driver>-<index>-`), and an existing slice is reused only for the
    /// index its name carries. The scheduler's allocator walks a pool's slices
    /// sorted by name and takes the first device that fits, so without this a pool
    /// of several slices is walked in the order of the server's random suffixes.
    /// A pool of one slice keeps whatever name it has.
    pub ordered_slice_names: bool,
}

impl PublisherConfig {
    pub fn new(driver_name: impl Into<String>, node_name: impl Into<String>) -> Self {
        Self {
            driver_name: driver_name.into(),
            node_name: node_name.into(),
            debounce: Duration::from_millis(500),
            max_debounce: Duration::from_secs(5),
            retry_initial: Duration::from_millis(500),
            retry_max: Duration::from_secs(60),
            ordered_slice_names: false,
        }
    }

    /// Server-side apply field manager: per driver, so two drivers built from this
    /// code on one cluster never take each other's fields.
    pub fn field_manager(&self) -> String {
        format!("{}-kubelet-plugin", self.driver_name)
    }
}

/// How publishing stands, for readiness and liveness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishStatus {
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
    pub fn is_in_sync(&self) -> bool {
        matches!(self, Self::InSync { .. })
    }
}
