//! Device taints from health: each change of the health picture becomes the pool's
//! taints, which the publisher writes into the ResourceSlices.

use std::collections::BTreeMap;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use topodra_model::health::{HealthState, TaintEffect, device_taints};

use crate::pool::PoolBuilder;
use dra_kubeletplugin::publish::DesiredPool;

/// Starts [`follow_health`] from a pool without taints, and returns the channel of
/// the pool the publisher keeps.
pub(crate) fn spawn(
    health: watch::Receiver<HealthState>,
    pool: PoolBuilder,
    evict_unhealthy: bool,
) -> (JoinHandle<()>, watch::Receiver<DesiredPool>) {
    let (desired_tx, desired_rx) = watch::channel(pool.build(BTreeMap::new()));
    let task = tokio::spawn(follow_health(
        health,
        desired_tx,
        pool,
        effect(evict_unhealthy),
    ));
    (task, desired_rx)
}

/// Turns each health change into the pool's taints; the publisher writes them.
async fn follow_health(
    mut health: watch::Receiver<HealthState>,
    desired: watch::Sender<DesiredPool>,
    pool: PoolBuilder,
    effect: TaintEffect,
) {
    // The taints the pool in `desired` was built with: at first, none.
    let mut built = BTreeMap::new();
    loop {
        let taints = device_taints(
            &health.borrow_and_update(),
            std::time::SystemTime::now(),
            effect,
        );
        if taints != built {
            desired.send_replace(pool.build(taints.clone()));
            built = taints;
        }
        if health.changed().await.is_err() {
            return;
        }
    }
}

/// `NoExecute` evicts the pods using an unhealthy GPU; `NoSchedule` only keeps new
/// ones away.
fn effect(evict_unhealthy: bool) -> TaintEffect {
    if evict_unhealthy {
        TaintEffect::NoExecute
    } else {
        TaintEffect::NoSchedule
    }
}
