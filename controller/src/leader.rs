//! Leader election on a `coordination.k8s.io` Lease, so that of the two replicas one
//! writes and the other keeps a warm model to take over at once.

use std::time::Duration;

use anyhow::{Context, Result};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// Leadership as it changes, and what to call at shutdown.
#[derive(Debug)]
pub(crate) struct Leadership {
    pub(crate) is_leader: watch::Receiver<bool>,
    task: Option<JoinHandle<kube_lease_manager::Result<LeaseManager>>>,
    /// The sender of a sole leader's channel, held so the channel stays open.
    _sole: Option<watch::Sender<bool>>,
}

/// How the Lease is held.
#[derive(Debug, Clone)]
pub(crate) struct LeaseConfig {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) identity: String,
    /// How long a holder that stopped renewing keeps the Lease.
    pub(crate) duration_seconds: u64,
    /// How long before expiry the holder renews.
    pub(crate) grace_seconds: u64,
}

impl Leadership {
    /// Always the leader: one replica, or a test.
    pub(crate) fn sole() -> Self {
        let (tx, is_leader) = watch::channel(true);
        Self {
            is_leader,
            task: None,
            _sole: Some(tx),
        }
    }

    /// Competes for the Lease in the background from now on.
    pub(crate) async fn elect(client: kube::Client, config: &LeaseConfig) -> Result<Self> {
        let manager = LeaseManagerBuilder::new(client, &config.name)
            .with_namespace(&config.namespace)
            .with_identity(&config.identity)
            .with_duration(config.duration_seconds)
            .with_grace(config.grace_seconds)
            .with_field_manager(format!("topodra-controller-{}", config.identity))
            .build()
            .await
            .with_context(|| {
                format!(
                    "setting up the leader Lease {}/{}",
                    config.namespace, config.name
                )
            })?;
        let (is_leader, task) = manager.watch().await;
        info!(lease = %config.name, identity = %config.identity, "competing for leadership");
        Ok(Self {
            is_leader,
            task: Some(task),
            _sole: None,
        })
    }

    /// Gives the Lease up, so the standby takes over now rather than after it expires.
    pub(crate) async fn release(self) {
        let Some(task) = self.task else { return };
        drop(self.is_leader);
        match tokio::time::timeout(Duration::from_secs(10), task).await {
            Ok(Ok(Ok(manager))) => match manager.release().await {
                Ok(()) => info!("released the leader Lease"),
                Err(e) => {
                    warn!(error = %e, "could not release the leader Lease; the standby takes over when it expires")
                }
            },
            Ok(Ok(Err(e))) => warn!(error = %e, "leader election ended with an error"),
            Ok(Err(e)) => warn!(error = %e, "leader election task failed"),
            Err(_) => warn!("leader election did not stop in time; the Lease expires on its own"),
        }
    }
}
