//! The publishing loop: the only part of publishing that talks to the API server.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::state::{Decision, PoolState};
use super::timing::Debounce;
use super::{DesiredPool, PublishStatus, PublisherConfig};
use topodra_ops::backoff::Backoff;

/// Keeps this node's ResourceSlices equal to the desired pool.
pub struct Publisher {
    client: Client,
    config: PublisherConfig,
    desired: watch::Receiver<DesiredPool>,
    status: watch::Sender<PublishStatus>,
}

impl std::fmt::Debug for Publisher {
    // kube::Client has no Debug.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("config", &self.config)
            .field("status", &*self.status.borrow())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
enum ReconcileError {
    /// Deterministic: retrying the same pool cannot help, a new one may.
    #[error("the desired pool is invalid: {0}")]
    Invalid(String),
    #[error("{op} ResourceSlice {name}: {source}")]
    Api {
        op: &'static str,
        name: String,
        source: kube::Error,
    },
}

impl Publisher {
    /// A publisher that writes through `client` (with whatever layers the caller
    /// added, such as request counting) the pools it receives on `desired`.
    pub fn new(
        client: Client,
        config: PublisherConfig,
        desired: watch::Receiver<DesiredPool>,
    ) -> Self {
        let (status, _) = watch::channel(PublishStatus::Starting);
        Self {
            client,
            config,
            desired,
            status,
        }
    }

    /// Follows the outcome of every reconcile.
    pub fn status(&self) -> watch::Receiver<PublishStatus> {
        self.status.subscribe()
    }

    /// Publishes until `shutdown` completes. Never fails: API errors are retried with
    /// backoff and reported through [`Self::status`], because the plugin must keep
    /// serving the claims it prepared whatever the API server does.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = pin!(shutdown);
        let node_uid = tokio::select! {
            uid = self.node_uid() => uid,
            () = &mut shutdown => return,
        };

        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let selector = format!(
            "spec.nodeName={},spec.driver={}",
            self.config.node_name, self.config.driver_name
        );
        // Streaming list: the initial state arrives as watch events ending in a
        // bookmark, with no LIST; kube resumes the watch from the last
        // resourceVersion when the server ends it, and only a 410 Gone starts over.
        let config = watcher::Config::default()
            .fields(&selector)
            .streaming_lists();
        let mut events = pin!(watcher(api.clone(), config).default_backoff());

        let mut state = PoolState::new(&self.config.driver_name, &self.config.node_name)
            .with_ordered_names(self.config.ordered_slice_names);
        let mut debounce = Debounce::new(self.config.debounce, self.config.max_debounce);
        let mut backoff = Backoff::new(self.config.retry_initial, self.config.retry_max);
        let mut retry_at: Option<Instant> = None;
        let mut desired_open = true;

        loop {
            let deadline = state
                .is_synced()
                .then(|| debounce.deadline())
                .flatten()
                .map(|d| retry_at.map_or(d, |r| d.max(r)));
            tokio::select! {
                () = &mut shutdown => return,
                event = events.next() => match event {
                    Some(Ok(event)) => {
                        if state.on_event(&event) {
                            debounce.poke(Instant::now());
                        }
                    }
                    Some(Err(e)) => warn!(error = %e, "watching ResourceSlices failed; resuming"),
                    // kube's watcher never ends on its own.
                    None => return,
                },
                changed = self.desired.changed(), if desired_open => match changed {
                    Ok(()) => debounce.poke(Instant::now()),
                    // The last pool stays published; nothing more will change it.
                    Err(_) => desired_open = false,
                },
                () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)),
                    if deadline.is_some() =>
                {
                    debounce.clear();
                    let desired = self.desired.borrow_and_update().clone();
                    let result = tokio::select! {
                        r = reconcile(&api, &self.config, &node_uid, &desired, &mut state) => r,
                        () = &mut shutdown => return,
                    };
                    match result {
                        Ok(generation) => {
                            backoff.reset();
                            retry_at = None;
                            self.status.send_replace(PublishStatus::InSync { generation });
                        }
                        Err(e) => {
                            let failures = backoff.attempts() + 1;
                            if matches!(e, ReconcileError::Invalid(_)) {
                                warn!(error = %e, "not publishing: waiting for a valid pool");
                            } else {
                                let delay = backoff.next_delay();
                                warn!(error = %e, attempt = failures, retry_in = ?delay,
                                    "publishing ResourceSlices failed");
                                let now = Instant::now();
                                retry_at = Some(now + delay);
                                debounce.poke(now);
                            }
                            self.status.send_replace(PublishStatus::Failing {
                                consecutive_failures: failures,
                                error: e.to_string(),
                            });
                        }
                    }
                }
            }
        }
    }

    /// The Node's UID, read once; retried until the API server answers.
    async fn node_uid(&self) -> String {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut backoff = Backoff::new(self.config.retry_initial, self.config.retry_max);
        loop {
            let error = match nodes.get(&self.config.node_name).await {
                Ok(node) => match node.metadata.uid {
                    Some(uid) if !uid.is_empty() => return uid,
                    _ => "the Node has no uid".to_owned(),
                },
                Err(e) => e.to_string(),
            };
            let delay = backoff.next_delay();
            warn!(node = %self.config.node_name, attempt = backoff.attempts(), retry_in = ?delay,
                %error, "reading the Node failed");
            self.status.send_replace(PublishStatus::Failing {
                consecutive_failures: backoff.attempts(),
                error: format!("reading Node {}: {error}", self.config.node_name),
            });
            tokio::time::sleep(delay).await;
        }
    }
}

/// One pass: compare, then write what differs. Returns the pool generation now
/// published.
async fn reconcile(
    api: &Api<ResourceSlice>,
    config: &PublisherConfig,
    node_uid: &str,
    desired: &DesiredPool,
    state: &mut PoolState,
) -> Result<i64, ReconcileError> {
    let desired = match desired {
        DesiredPool::Slices(slices) => {
            check_ours(slices, config).map_err(ReconcileError::Invalid)?;
            owned_by_node(slices, &config.node_name, node_uid)
        }
        DesiredPool::Invalid(reason) => return Err(ReconcileError::Invalid(reason.clone())),
    };
    let plan = match state.decide(&desired, Instant::now()) {
        Decision::InSync { generation } => {
            debug!(generation, "ResourceSlices are up to date");
            return Ok(generation);
        }
        Decision::Write(plan) => plan,
    };

    let params = PatchParams::apply(&config.field_manager()).force();
    let create = PostParams {
        dry_run: false,
        field_manager: Some(config.field_manager()),
    };
    for slice in &plan.create {
        let prefix = slice.metadata.generate_name.clone().unwrap_or_default();
        let response = api
            .create(&create, slice)
            .await
            .map_err(|source| ReconcileError::Api {
                op: "creating",
                name: format!("{prefix}*"),
                source,
            })?;
        state.applied(slice, response, Instant::now());
    }
    for slice in &plan.apply {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let response = api
            .patch(&name, &params, &Patch::Apply(slice))
            .await
            .map_err(|source| ReconcileError::Api {
                op: "applying",
                name: name.clone(),
                source,
            })?;
        state.applied(slice, response, Instant::now());
    }
    for slice in &plan.delete {
        let name = slice.metadata.name.clone().unwrap_or_default();
        // The uid precondition keeps us from deleting a slice re-created meanwhile.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: slice.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => state.deleted(slice),
            Err(kube::Error::Api(status)) if status.is_not_found() => state.deleted(slice),
            Err(source) => {
                return Err(ReconcileError::Api {
                    op: "deleting",
                    name,
                    source,
                });
            }
        }
    }
    info!(
        generation = plan.generation,
        created = plan.create.len(),
        applied = plan.apply.len(),
        deleted = plan.delete.len(),
        "published ResourceSlices"
    );
    Ok(plan.generation)
}

/// Every slice must be of our driver and node: the watch sees no others, so
/// publishing one would be a write loop.
fn check_ours(slices: &[ResourceSlice], config: &PublisherConfig) -> Result<(), String> {
    for (i, s) in slices.iter().enumerate() {
        if s.spec.driver != config.driver_name
            || s.spec.node_name.as_deref() != Some(config.node_name.as_str())
        {
            return Err(format!(
                "ResourceSlice #{i} is for driver {:?} on node {:?}, not {:?} on {:?}",
                s.spec.driver, s.spec.node_name, config.driver_name, config.node_name
            ));
        }
    }
    Ok(())
}

/// The slices, owned by the Node: garbage-collected with it.
pub(super) fn owned_by_node(
    slices: &Arc<[ResourceSlice]>,
    node: &str,
    uid: &str,
) -> Vec<ResourceSlice> {
    let owner = OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Node".to_owned(),
        name: node.to_owned(),
        uid: uid.to_owned(),
        // The Node's lifetime bounds the slices'. blockOwnerDeletion stays unset: it
        // would need RBAC on nodes/finalizers for no benefit, since nothing waits on a
        // Node's foreground deletion.
        controller: Some(true),
        block_owner_deletion: None,
    };
    slices
        .iter()
        .map(|s| {
            let mut s = s.clone();
            s.metadata.owner_references = Some(vec![owner.clone()]);
            s
        })
        .collect()
}
