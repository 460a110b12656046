//! topodra-controller: the cluster side of topodra.
//!
//! It watches our ResourceSlices, every ResourceClaim, DeviceTaintRules,
//! DeviceClasses, Nodes (metadata only) and unscheduled Pods, keeps the capacity
//! model of `topodra_model::capacity` current from them, and, while it holds the
//! leader Lease, publishes what the old stack's node agents did: per-NUMA
//! NodeResourceTopology objects, plus Events that explain pods waiting for GPUs.
//! Metrics come from every replica. All of it is the library's; see
//! [`topodra_controller::Args`].

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    topodra_controller::Args::parse_and_run()
}
