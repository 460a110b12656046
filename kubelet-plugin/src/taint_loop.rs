//! Device taints from health: each change of the health picture becomes the pool's
//! taints, which the publisher writes into the ResourceSlices.

use std::sync::Arc;

use tokio::sync::watch;

use crate::health::model::HealthState;
use crate::health::taints::{TaintEffect, device_taints};
use crate::publish::DesiredPool;

/// Turns each health change into the pool's taints; the publisher writes them.
pub(crate) async fn follow_health(
    mut health: watch::Receiver<HealthState>,
    desired: watch::Sender<DesiredPool>,
    inventory: Arc<topodra_driver::Inventory>,
    effect: TaintEffect,
) {
    loop {
        let taints = device_taints(
            &health.borrow_and_update(),
            std::time::SystemTime::now(),
            effect,
        );
        desired.send_if_modified(|pool| {
            if pool.device_taints == taints {
                return false;
            }
            *pool = DesiredPool {
                inventory: inventory.clone(),
                device_taints: taints,
            };
            true
        });
        if health.changed().await.is_err() {
            return;
        }
    }
}

/// `NoExecute` evicts the pods using an unhealthy GPU; `NoSchedule` only keeps new
/// ones away.
pub(crate) fn effect(evict_unhealthy: bool) -> TaintEffect {
    if evict_unhealthy {
        TaintEffect::NoExecute
    } else {
        TaintEffect::NoSchedule
    }
}
