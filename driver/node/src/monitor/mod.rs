//! The NVML health monitor: XID events and device probes turned into a per-device
//! health picture, judged by the model's policy ([`topodra_model::health`]), which
//! the kubelet plugin feeds to the kubelet's DRA health stream and to device taints
//! in its ResourceSlices ([`topodra_model::health::device_taints`]).
//!
//! Data flow: a dedicated thread blocks in NVML's event wait ([`source`], [`nvml`])
//! and forwards XIDs and probe results to an async task ([`HealthMonitor`]) that applies
//! the model's [`topodra_model::health::Tracker`] and publishes a
//! [`topodra_model::health::HealthState`] through a `watch` channel. Every consumer
//! reads that channel; none of them talks to NVML.

pub mod nvml;
pub mod source;
mod task;

pub use task::{HealthMonitor, MonitorConfig, Observed, Observer};

#[cfg(test)]
mod tests;
