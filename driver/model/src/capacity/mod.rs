//! The cluster capacity model: what every node's GPUs are doing, by topology.
//!
//! The controller and `kubectl topodra` feed it the ResourceSlices of our driver,
//! the ResourceClaims and the DeviceTaintRules they read from the API server, and ask
//! it, per node and per NUMA node, socket, PCIe root, PCIe switch and NVLink domain:
//! how many GPUs there are, how many are allocated, unhealthy or free, the largest
//! free set that one `matchAttribute` constraint could still take, and how many free
//! GPUs are stranded (cannot join an aligned set of 2, 4 or 8); and per sharing mode
//! and NUMA node, what shared GPUs can still give shares (memory, compute). It also
//! explains, in those terms, why a claim cannot be allocated.
//!
//! Pure: no API client, no clock. [`Cluster`] is updated one object at a time and
//! recomputes only the nodes an object touches, so a watch event costs the size of
//! one node, not of the cluster.
//!
//! Slices are input from anyone allowed to write them: topology values outside what
//! our plugin publishes are ignored, and pools that cannot be one node's GPUs are
//! skipped ([`Cluster::take_findings`] says which).

mod cluster;
mod consumable;
mod cpus;
mod demand;
mod device;
mod explain;
mod level;
mod mig;
mod mixed;
mod problems;
mod shared;
mod shares;
mod summary;
mod values;

pub use cluster::{ClaimKey, Cluster};
pub use consumable::{amount, amount_text};
pub use cpus::{CpuCounts, CpuPools};
pub use demand::{ClassKind, Demand, MigWant, ShareWant, mode_words};
pub use explain::{Candidate, Explanation, explain};
pub use level::{Level, LevelError};
pub use mixed::{CpuDemand, explain_mixed};
pub use problems::{Finding, PoolProblem};
pub use shared::{CapacityFigures, SharedGroup};
pub use summary::{Counts, Group, NodeSummary, ProfileGroup};
pub use values::{InvalidValue, MAX_KEY_LEN, MAX_NUMA_NODE, MAX_SOCKET};

/// The aligned set sizes that metrics, fragmentation figures and `kubectl topodra`
/// report: the claim sizes of an 8-GPU node.
pub const SET_SIZES: [u32; 4] = [1, 2, 4, 8];

#[cfg(test)]
mod tests;
