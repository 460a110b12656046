//! What sharing a GPU changes on the node, and undoes: the time-slice interval
//! ([`TimeSlicer`]). The scheduler has already decided the mode (it is a device,
//! see `topodra_model::slice::sharing`); prepare only brings the GPU's settings in
//! line with it.

mod timeslice;

pub use timeslice::{SharingError, TimeSlicer};
