//! What sharing a GPU changes on the node, and undoes: the time-slice interval
//! ([`TimeSlicer`]), and for MPS the compute mode and the control daemon
//! ([`MpsControl`]). The scheduler has already decided the mode (it is a device,
//! see `topodra_model::slice::sharing`); prepare only brings the GPU's settings in
//! line with it.

mod error;
mod host;
mod mps;
mod process;
mod timeslice;

pub use error::SharingError;
pub use host::{DAEMON_CGROUP, HostNamespaces};
pub use mps::{EXCLUSIVE_PROCESS, MpsControl, MpsDirs};
pub use timeslice::TimeSlicer;
