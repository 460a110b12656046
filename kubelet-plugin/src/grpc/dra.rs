//! NodePrepareResources and NodeUnprepareResources, for DRA v1 and v1beta1.
//!
//! Each claim of a call is answered on its own: it is read, prepared and timed in a
//! task of its own, and its error goes into its own entry of the response. The call
//! itself only fails when the request cannot be answered at all.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinSet;
use tonic::{Request, Response, Status};
use topodra_driver::checkpoint::ClaimRef;
use topodra_driver::prepare::Preparer;
use topodra_proto::dra::{v1, v1beta1};

use super::claims::ClaimReader;
use crate::metrics::Metrics;

#[derive(Clone)]
pub(crate) struct DraService {
    preparer: Arc<Preparer>,
    claims: Arc<dyn ClaimReader>,
    metrics: Arc<Metrics>,
}

impl DraService {
    pub(crate) fn new(
        preparer: Arc<Preparer>,
        claims: Arc<dyn ClaimReader>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            preparer,
            claims,
            metrics,
        }
    }

    async fn prepare_one(&self, claim: v1::Claim) -> (String, v1::NodePrepareResourceResponse) {
        let started = Instant::now();
        let result = async {
            let object = self
                .claims
                .get(&claim.namespace, &claim.name)
                .await
                .map_err(|e| ("read", e))?;
            let claim_ref = ClaimRef {
                uid: claim.uid.clone(),
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
            };
            let preparer = self.preparer.clone();
            tokio::task::spawn_blocking(move || {
                preparer.prepare(&claim_ref, &object).map_err(Box::new)
            })
            .await
            .map_err(|e| ("internal", format!("prepare task failed: {e}")))?
            .map_err(|e| (e.kind(), e.to_string()))
        }
        .await;
        let outcome = result.as_ref().map_or_else(|(kind, _)| *kind, |_| "ok");
        self.metrics.observe_prepare(started.elapsed(), outcome);
        self.metrics
            .set_prepared_devices(self.preparer.prepared_devices());
        let response = match result {
            Ok(devices) => {
                tracing::info!(claim = %claim.uid, namespace = %claim.namespace, name = %claim.name, devices = devices.len(), "prepared");
                v1::NodePrepareResourceResponse {
                    devices: devices
                        .into_iter()
                        .map(|d| v1::Device {
                            request_names: d.requests,
                            pool_name: d.pool,
                            device_name: d.device,
                            cdi_device_ids: d.cdi_device_ids,
                            share_id: d.share_id,
                        })
                        .collect(),
                    error: String::new(),
                }
            }
            Err((kind, error)) => {
                tracing::warn!(claim = %claim.uid, namespace = %claim.namespace, name = %claim.name, kind, %error, "prepare failed");
                v1::NodePrepareResourceResponse {
                    devices: Vec::new(),
                    error,
                }
            }
        };
        (claim.uid, response)
    }

    async fn unprepare_one(&self, claim: v1::Claim) -> (String, v1::NodeUnprepareResourceResponse) {
        let started = Instant::now();
        let preparer = self.preparer.clone();
        let uid = claim.uid.clone();
        let result =
            tokio::task::spawn_blocking(move || preparer.unprepare(&uid).map_err(Box::new))
                .await
                .map_err(|e| ("internal", format!("unprepare task failed: {e}")))
                .and_then(|r| r.map_err(|e| (e.kind(), e.to_string())));
        let outcome = result.as_ref().map_or_else(|(kind, _)| *kind, |_| "ok");
        self.metrics.observe_unprepare(started.elapsed(), outcome);
        self.metrics
            .set_prepared_devices(self.preparer.prepared_devices());
        let error = match result {
            Ok(()) => {
                tracing::info!(claim = %claim.uid, namespace = %claim.namespace, name = %claim.name, "unprepared");
                String::new()
            }
            Err((kind, error)) => {
                tracing::warn!(claim = %claim.uid, kind, %error, "unprepare failed");
                error
            }
        };
        (claim.uid, v1::NodeUnprepareResourceResponse { error })
    }

    pub(crate) async fn prepare(
        &self,
        claims: Vec<v1::Claim>,
    ) -> HashMap<String, v1::NodePrepareResourceResponse> {
        let mut tasks = JoinSet::new();
        for claim in claims {
            let this = self.clone();
            tasks.spawn(async move { this.prepare_one(claim).await });
        }
        collect(tasks).await
    }

    pub(crate) async fn unprepare(
        &self,
        claims: Vec<v1::Claim>,
    ) -> HashMap<String, v1::NodeUnprepareResourceResponse> {
        let mut tasks = JoinSet::new();
        for claim in claims {
            let this = self.clone();
            tasks.spawn(async move { this.unprepare_one(claim).await });
        }
        collect(tasks).await
    }
}

async fn collect<T: 'static>(mut tasks: JoinSet<(String, T)>) -> HashMap<String, T> {
    let mut out = HashMap::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((uid, response)) => {
                out.insert(uid, response);
            }
            // A panicking claim task loses only its own answer; the kubelet retries it.
            Err(e) => tracing::error!(error = %e, "claim task panicked"),
        }
    }
    out
}

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let claims = self.prepare(request.into_inner().claims).await;
        Ok(Response::new(v1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let claims = self.unprepare(request.into_inner().claims).await;
        Ok(Response::new(v1::NodeUnprepareResourcesResponse { claims }))
    }
}

/// v1beta1 carries the same messages without `share_id`; it is served by converting
/// to v1 and back, so both versions run the same code.
#[derive(Clone)]
pub(crate) struct DraServiceV1beta1(pub(crate) DraService);

fn claims_to_v1(claims: Vec<v1beta1::Claim>) -> Vec<v1::Claim> {
    claims
        .into_iter()
        .map(|c| v1::Claim {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        })
        .collect()
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for DraServiceV1beta1 {
    async fn node_prepare_resources(
        &self,
        request: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let claims = self
            .0
            .prepare(claims_to_v1(request.into_inner().claims))
            .await;
        let claims = claims
            .into_iter()
            .map(|(uid, r)| {
                let devices = r
                    .devices
                    .into_iter()
                    .map(|d| v1beta1::Device {
                        request_names: d.request_names,
                        pool_name: d.pool_name,
                        device_name: d.device_name,
                        cdi_device_ids: d.cdi_device_ids,
                    })
                    .collect();
                (
                    uid,
                    v1beta1::NodePrepareResourceResponse {
                        devices,
                        error: r.error,
                    },
                )
            })
            .collect();
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let claims = self
            .0
            .unprepare(claims_to_v1(request.into_inner().claims))
            .await;
        let claims = claims
            .into_iter()
            .map(|(uid, r)| {
                (
                    uid,
                    v1beta1::NodeUnprepareResourceResponse { error: r.error },
                )
            })
            .collect();
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}
