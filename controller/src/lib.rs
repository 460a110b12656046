//! The parts of topodra's cluster side that the controller and `kubectl topodra`
//! share, on top of the capacity model in `topodra_driver::capacity`:
//!
//! - [`classes`]: which DeviceClasses hand out our GPUs, and so which claims are ours.
//! - [`pending`]: why a pod waits for GPUs: its claims' demands, judged against the
//!   capacity model.
//! - [`nrt`]: NodeResourceTopology objects (one per node, one zone per NUMA node) for
//!   schedulers and platforms that read that CRD.

pub mod classes;
pub mod nrt;
pub mod pending;

#[cfg(test)]
mod fixtures;
// The shared test fixtures name this crate the way the binaries do.
#[cfg(test)]
extern crate self as topodra_controller;
