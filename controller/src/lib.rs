//! topodra's cluster side, as a library behind two thin binaries.
//!
//! - `topodra-controller` is [`Args::parse_and_run`]: it watches our ResourceSlices,
//!   every ResourceClaim, DeviceTaintRules, DeviceClasses, Nodes (metadata only) and
//!   unscheduled Pods, keeps the capacity model of `topodra_model::capacity` current
//!   from them (`state`), and, while it holds the leader Lease (`leader`), writes
//!   what the old stack's node agents did: per-NUMA NodeResourceTopology objects,
//!   reconciled per node within a fleet-wide write budget (`reconcile`, `budget`),
//!   and Events that explain pods waiting for GPUs (`writer`). Metrics come from every
//!   replica (`metrics`).
//! - `kubectl-topodra` is [`kubectl::parse_and_run`]: the same model, read on demand.
//!
//! What both share:
//!
//! - [`classes`]: which DeviceClasses hand out our GPUs, and so which claims are ours.
//! - [`pending`]: why a pod waits for GPUs: its claims' demands, judged against the
//!   capacity model.
//! - [`nrt`]: NodeResourceTopology objects (one per node, one zone per NUMA node) for
//!   schedulers and platforms that read that CRD.

#![forbid(unsafe_code)]
// Numbers from the API server (capacities, requests, counts) reach sums here as in
// the model crate: checked or saturating only, so that no object can panic the
// controller or wrap a published figure.
#![deny(clippy::arithmetic_side_effects)]
#![cfg_attr(test, allow(clippy::arithmetic_side_effects))]

mod args;
mod budget;
pub mod classes;
pub mod kubectl;
mod leader;
mod metrics;
pub mod nrt;
pub mod pending;
mod reconcile;
mod run;
mod state;
mod writer;

pub use args::Args;

#[cfg(test)]
mod fixtures;
