//! Unprepares claims the API server no longer has.
//!
//! The kubelet unprepares a claim when its pod goes away. If it cannot (its own
//! state was lost, the node was down when the pod was deleted), the record stays in
//! the checkpoint and keeps its GPUs from every other claim for good. So every
//! `interval` this loop looks up each prepared claim by namespace and name (a GET
//! per claim, never a list); one that is gone, or that is now a different object
//! (another UID), and still so a `grace` period later, is unprepared here, and the
//! caller records an Event.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use topodra_model::checkpoint::{ClaimRecord, ClaimState};
use topodra_node::prepare::Preparer;

use dra_kubeletplugin::claims::{ApiClaims, BoxFuture, check_claim_ref};
use k8s_openapi::api::resource::v1::ResourceClaim;

/// Finds a claim's current UID; `Ok(None)` when it does not exist.
pub(crate) trait ClaimLookup: Send + Sync {
    fn uid_of<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, String>>;
}

impl ClaimLookup for ApiClaims {
    fn uid_of<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, String>> {
        Box::pin(async move {
            check_claim_ref(namespace, name)?;
            let api = kube::Api::<ResourceClaim>::namespaced(self.client().clone(), namespace);
            match tokio::time::timeout(self.policy().attempt_timeout, api.get_opt(name)).await {
                Ok(Ok(claim)) => Ok(claim.map(|c| c.metadata.uid.unwrap_or_default())),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!(
                    "no answer within {:?}",
                    self.policy().attempt_timeout
                )),
            }
        })
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct ReconcileConfig {
    pub(crate) interval: Duration,
    pub(crate) grace: Duration,
}

/// Runs until `shutdown`; calls `unprepared` with each record it removed.
pub(crate) async fn run(
    preparer: Arc<Preparer>,
    lookup: Arc<dyn ClaimLookup>,
    config: ReconcileConfig,
    unprepared: impl Fn(&ClaimRecord, &str) + Send + Sync,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    // First seen missing, per claim UID.
    let mut missing: BTreeMap<String, Instant> = BTreeMap::new();
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(config.interval) => {}
        }
        let records: Vec<ClaimRecord> = preparer
            .checkpoint()
            .claims
            .into_values()
            .filter(|r| r.state != ClaimState::PrepareStarted)
            .collect();
        missing.retain(|uid, _| records.iter().any(|r| &r.uid == uid));
        for record in records {
            let why = match lookup.uid_of(&record.namespace, &record.name).await {
                Ok(None) => "the claim no longer exists".to_owned(),
                Ok(Some(uid)) if uid != record.uid => {
                    format!("the claim is now another object (UID {uid})")
                }
                Ok(Some(_)) => {
                    missing.remove(&record.uid);
                    continue;
                }
                Err(e) => {
                    // Unknown is not gone: try again next round.
                    tracing::debug!(claim = ?record.uid, error = %e, "cannot look up a prepared claim");
                    continue;
                }
            };
            let since = *missing
                .entry(record.uid.clone())
                .or_insert_with(Instant::now);
            if since.elapsed() < config.grace {
                continue;
            }
            match preparer.unprepare(&record.uid) {
                Ok(()) => {
                    missing.remove(&record.uid);
                    tracing::warn!(claim = ?record.uid, namespace = ?record.namespace, name = ?record.name, why, "unprepared a claim the API server no longer has");
                    unprepared(&record, &why);
                }
                Err(e) => {
                    tracing::warn!(claim = ?record.uid, error = %e, "cannot unprepare a stale claim");
                }
            }
        }
    }
}
