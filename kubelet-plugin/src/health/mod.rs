//! GPU health: NVML XID events and device probes turned into a per-device health
//! picture, which feeds the kubelet's DRA health stream (through [`crate::node_driver`]) and device taints
//! in the ResourceSlice ([`taints`]).
//!
//! Data flow: a dedicated thread blocks in NVML's event wait ([`source`], [`nvml`])
//! and forwards XIDs and probe results to an async task ([`monitor`]) that applies
//! the [`policy`] and publishes a [`model::HealthState`] through a `watch` channel. Every
//! consumer reads that channel; none of them talks to NVML.

pub(crate) mod model;
pub(crate) mod monitor;
pub(crate) mod nvml;
pub(crate) mod policy;
pub(crate) mod source;
pub(crate) mod taints;
pub(crate) mod xid;

#[cfg(test)]
mod nvml_tests;
