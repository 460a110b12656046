//! topodra on a GPU node: everything that touches the machine, on top of the model
//! in `topodra-model`.
//!
//! This crate holds no gRPC server and talks to no API server: the kubelet plugin
//! (`topodra-kubelet-plugin`) wires it to the kubelet and the API. The public
//! modules:
//!
//! - [`discovery`]: finds the GPUs (NVML) and their topology (hwloc, or sysfs as a
//!   fallback) and joins them into an [`Inventory`](topodra_model::Inventory).
//! - [`cdi`]: the driver's files on the node and the CDI specs a container runtime
//!   reads for a prepared claim.
//! - [`checkpoint`]: the checkpoint file: atomic saves, and loads that quarantine
//!   what they cannot trust.
//! - [`prepare`]: the prepare/unprepare state machine behind the kubelet's DRA calls
//!   ([`prepare::Preparer`]), on top of [`cdi`] and [`checkpoint`].
//! - [`dynamic_mig`]: makes and removes the MIG instances of prepared partitions.
//! - [`sharing`]: the GPU settings a shared device's prepare changes and undoes.
//! - [`monitor`]: the NVML health monitor: XID events and device probes, judged by
//!   the model's health policy.

pub mod cdi;
pub mod checkpoint;
pub mod discovery;
pub mod dynamic_mig;
pub mod monitor;
pub mod prepare;
pub mod sharing;
