//! The parts of topodra's cluster side that the controller and `kubectl topodra`
//! share: which device classes and claims are ours, and why a pod waits for GPUs
//! ([`pending`]), on top of the capacity model in `topodra_driver::capacity`.

pub mod classes;
pub mod nrt;
pub mod pending;

#[cfg(test)]
mod fixtures;
// The shared test fixtures name this crate the way the binaries do.
#[cfg(test)]
extern crate self as topodra_controller;
