//! GPU health: NVML XID events and device probes turned into a per-device health
//! picture, which feeds the kubelet's DRA health stream (through
//! [`crate::node_driver`]) and device taints in the ResourceSlice
//! ([`topodra_driver::health::device_taints`]).
//!
//! Data flow: a dedicated thread blocks in NVML's event wait ([`source`], [`nvml`])
//! and forwards XIDs and probe results to an async task ([`monitor`]) that applies
//! the library's [`topodra_driver::health::Tracker`] and publishes a
//! [`topodra_driver::health::HealthState`] through a `watch` channel. Every consumer
//! reads that channel; none of them talks to NVML.

pub(crate) mod monitor;
pub(crate) mod nvml;
pub(crate) mod source;

#[cfg(test)]
mod tests;
