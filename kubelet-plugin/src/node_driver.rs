//! topodra as a [`dra_kubeletplugin::Driver`]: the prepare state machine behind the
//! kubelet's calls, and the health monitor's picture behind the health stream.

use std::sync::Arc;

use dra_kubeletplugin::health::{DeviceHealth, HealthStatus, NodeHealth};
use dra_kubeletplugin::{ClaimError, ClaimRef, Driver, PreparedDevice};
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::watch;
use topodra_node::prepare::Preparer;

use topodra_model::checkpoint::{ClaimIdentity, PreparedGpu};
use topodra_model::health::{HealthState, Status};

use crate::metrics::Metrics;

#[derive(Debug)]
pub(crate) struct NodeDriver {
    preparer: Arc<Preparer>,
    health: watch::Receiver<NodeHealth>,
    metrics: Arc<Metrics>,
}

impl NodeDriver {
    /// Serves `preparer`, and health as `health` reports it until its sender is
    /// dropped (which ends the kubelet's health streams); keeps the prepared GPUs of
    /// `metrics` current.
    pub(crate) fn new(
        preparer: Arc<Preparer>,
        health: watch::Receiver<HealthState>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let shares = preparer.shared_devices();
        Self {
            preparer,
            health: forward_health(health, shares),
            metrics,
        }
    }
}

// The crossing between the helper's types (the kubelet's side) and the node crate's
// (the checkpoint's side): one function a concept, here only. Neither crate knows the
// other, so these cannot be `From` impls (the orphan rule).

fn claim_error(e: &topodra_node::prepare::ClaimError) -> ClaimError {
    ClaimError::new(e.kind().as_str(), e.to_string())
}

fn claim_identity(claim: &ClaimRef) -> ClaimIdentity {
    ClaimIdentity {
        uid: claim.uid.clone(),
        namespace: claim.namespace.clone(),
        name: claim.name.clone(),
    }
}

fn prepared_device(gpu: PreparedGpu) -> PreparedDevice {
    PreparedDevice {
        requests: gpu.requests,
        pool: gpu.pool,
        device: gpu.device,
        cdi_device_ids: gpu.cdi_device_ids,
        share_id: gpu.share_id,
    }
}

impl Driver for NodeDriver {
    fn prepare(
        &self,
        claim: &ClaimRef,
        object: &ResourceClaim,
    ) -> Result<Vec<PreparedDevice>, ClaimError> {
        let result = self.preparer.prepare(&claim_identity(claim), object);
        // A failed prepare may have rolled back a record too: taken in either way.
        self.metrics.set_prepared_from(&self.preparer);
        let gpus = result.map_err(|e| claim_error(&e))?;
        Ok(gpus.into_iter().map(prepared_device).collect())
    }

    fn unprepare(&self, claim: &ClaimRef) -> Result<(), ClaimError> {
        let result = self.preparer.unprepare(&claim.uid);
        self.metrics.set_prepared_from(&self.preparer);
        result.map_err(|e| claim_error(&e))
    }

    // No `prepared_devices`: prepare and unprepare above set that gauge themselves,
    // from the same copy of the checkpoint as the NUMA series, so the helper leaves
    // it alone rather than read the checkpoint again and write it a second time.

    fn health(&self) -> Option<watch::Receiver<NodeHealth>> {
        Some(self.health.clone())
    }
}

/// The health stream's picture: every device the monitor watches, and each shared
/// device as what it runs on (`shares`: shared device, the devices whose health is
/// its own, nearest first), so every claim holding a share of a GPU or partition
/// that went bad is told, not only a claim of the GPU. The first of them that is
/// not healthy decides, else the first the monitor knows.
fn node_health(state: &HealthState, shares: &[(String, Vec<String>)]) -> NodeHealth {
    let mirrored = shares
        .iter()
        .filter(|(share, _)| !state.devices.contains_key(share))
        .filter_map(|(share, sources)| {
            let known: Vec<_> = sources
                .iter()
                .filter_map(|s| state.devices.get(s))
                .collect();
            known
                .iter()
                .find(|h| h.status != Status::Healthy)
                .or(known.first())
                .map(|h| (share, *h))
        });
    let devices = state
        .devices
        .iter()
        .chain(mirrored)
        .map(|(name, h)| {
            let status = match h.status {
                Status::Healthy => HealthStatus::Healthy,
                Status::Unhealthy => HealthStatus::Unhealthy,
                Status::Unknown => HealthStatus::Unknown,
            };
            let health = DeviceHealth {
                status,
                since: h.since,
                message: h.reason.clone(),
            };
            (name.clone(), health)
        })
        .collect();
    NodeHealth { devices }
}

/// The monitor's picture in the plugin crate's terms, for as long as the monitor
/// runs: when it stops, the forwarded channel closes too.
fn forward_health(
    mut rx: watch::Receiver<HealthState>,
    shares: Vec<(String, Vec<String>)>,
) -> watch::Receiver<NodeHealth> {
    let (tx, out) = watch::channel(node_health(&rx.borrow_and_update(), &shares));
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            // Every change is passed on, even one that looks the same here: the
            // health streams send the list on each, as they did reading the monitor.
            tx.send_replace(node_health(&rx.borrow_and_update(), &shares));
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use topodra_model::health::{Cause, Verdict};

    #[test]
    fn a_partitions_share_follows_the_partition_and_the_gpus_other_shares_do_not() {
        let verdict = |status, reason: &str| Verdict {
            status,
            since: SystemTime::UNIX_EPOCH,
            reason: reason.to_owned(),
            cause: None,
        };
        let state = HealthState {
            devices: [
                ("gpu-0".to_owned(), verdict(Status::Healthy, "")),
                (
                    "gpu-0-mig-3g-40gb-4".to_owned(),
                    verdict(Status::Unhealthy, "XID 31 on this instance"),
                ),
            ]
            .into(),
        };
        let shares = [
            ("gpu-0-ts".to_owned(), vec!["gpu-0".to_owned()]),
            (
                "gpu-0-mig-3g-40gb-4-mps".to_owned(),
                vec!["gpu-0-mig-3g-40gb-4".to_owned(), "gpu-0".to_owned()],
            ),
            (
                "gpu-0-mig-3g-40gb-0-mps".to_owned(),
                vec!["gpu-0-mig-3g-40gb-0".to_owned(), "gpu-0".to_owned()],
            ),
        ];
        let h = node_health(&state, &shares);
        assert_eq!(
            h.devices["gpu-0-mig-3g-40gb-4-mps"].status,
            HealthStatus::Unhealthy
        );
        assert_eq!(h.devices["gpu-0-ts"].status, HealthStatus::Healthy);
        // A partition the monitor knows nothing of is as healthy as its GPU.
        assert_eq!(
            h.devices["gpu-0-mig-3g-40gb-0-mps"].status,
            HealthStatus::Healthy
        );
    }

    #[tokio::test]
    async fn the_monitors_picture_reaches_the_plugin_until_the_monitor_stops() {
        let since = SystemTime::UNIX_EPOCH + Duration::from_secs(7);
        let healthy = Verdict {
            status: Status::Healthy,
            since,
            reason: String::new(),
            cause: None,
        };
        let (tx, rx) = watch::channel(HealthState {
            devices: [("gpu-0".to_owned(), healthy)].into(),
        });
        let shares = vec![
            ("gpu-0-ts".to_owned(), vec!["gpu-0".to_owned()]),
            (
                "gpu-0-mig-3g-40gb-4-mps".to_owned(),
                vec!["gpu-0-mig-3g-40gb-4".to_owned(), "gpu-0".to_owned()],
            ),
        ];
        let mut out = forward_health(rx, shares);
        assert_eq!(
            out.borrow_and_update().devices["gpu-0"].status,
            HealthStatus::Healthy
        );
        tx.send_modify(|s| {
            let d = s.devices.get_mut("gpu-0").unwrap();
            d.status = Status::Unhealthy;
            d.reason = "XID 79".to_owned();
            d.cause = Some(Cause::Xid(79));
        });
        out.changed().await.unwrap();
        let expected = DeviceHealth {
            status: HealthStatus::Unhealthy,
            since,
            message: "XID 79".to_owned(),
        };
        let now = out.borrow_and_update().clone();
        assert_eq!(now.devices["gpu-0"], expected);
        // A share of the GPU, or of a partition of it, is as unhealthy as its GPU.
        assert_eq!(now.devices["gpu-0-ts"], expected);
        assert_eq!(now.devices["gpu-0-mig-3g-40gb-4-mps"], expected);
        drop(tx);
        assert!(out.changed().await.is_err());
    }
}
