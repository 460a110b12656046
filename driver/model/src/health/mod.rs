//! GPU health decisions: which XIDs matter (`xid`), how events and probes turn
//! into a per-device verdict (`policy`), and the device taints that verdict calls
//! for (`taints`).
//!
//! Pure logic over facts and an injected clock. Whoever talks to NVML (the kubelet
//! plugin's monitor) feeds [`Probe`]s and [`XidEvent`]s in and publishes the
//! resulting [`HealthState`].

mod event;
mod model;
mod policy;
mod taints;
mod xid;

pub use event::{EventDevice, InstanceScope, Probe, ScopePlacement, XidEvent};
pub use model::{Cause, DeviceRef, HealthState, Status, Verdict};
pub use policy::{HealthPolicy, Tracker};
pub use taints::{TaintEffect, UNHEALTHY_TAINT_KEY, device_taints};
pub use xid::UNKNOWN_XID;
