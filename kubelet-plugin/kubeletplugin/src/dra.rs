//! NodePrepareResources and NodeUnprepareResources, for DRA v1 and v1beta1.
//!
//! Each claim of a call is answered on its own: it is read, prepared and timed in a
//! task of its own, and its error goes into its own entry of the response. The call
//! itself only fails when the request cannot be answered at all.
//!
//! How many claims are worked on at once is bounded per call and across calls
//! ([`ClaimConcurrency`]): each prepare is a GET to the API server and a blocking
//! task, and one call may carry any number of claims. Claims over the bound wait
//! their turn; every claim of a call is answered.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;
use tokio::task::{Id, JoinSet};
use tonic::{Request, Response, Status};
use topodra_proto::dra::{v1, v1beta1};

use crate::claims::{ClaimReader, check_claim_ref};
use crate::driver::{ClaimRef, Driver};
use crate::metrics::ClaimMetrics;

/// How many claims are worked on at once: at most `per_call` of one call, and at most
/// as many as `overall` has permits across all calls.
#[derive(Debug, Clone)]
pub struct ClaimConcurrency {
    per_call: usize,
    overall: Arc<Semaphore>,
}

impl ClaimConcurrency {
    /// Zero is taken as one: a bound of zero would answer nothing.
    pub fn new(per_call: usize, overall: usize) -> Self {
        Self {
            per_call: per_call.max(1),
            overall: Arc::new(Semaphore::new(overall.max(1))),
        }
    }

    /// Runs `work` for every claim of one call, each in a task of its own, within the
    /// bounds, and collects one answer per claim UID. A task that panics is answered
    /// with `failed`, so no claim goes without an answer.
    async fn run<T, W, F>(
        &self,
        claims: Vec<v1::Claim>,
        mut work: W,
        failed: fn(String) -> T,
    ) -> HashMap<String, T>
    where
        T: Send + 'static,
        W: FnMut(v1::Claim) -> F,
        F: Future<Output = T> + Send + 'static,
    {
        let mut out = HashMap::with_capacity(claims.len());
        let mut tasks = JoinSet::new();
        let mut uids: HashMap<Id, String> = HashMap::new();
        for claim in claims {
            if tasks.len() >= self.per_call {
                join_one(&mut tasks, &mut uids, &mut out, failed).await;
            }
            // Waiting for the permit here, before spawning, keeps the claims that wait
            // as plain data instead of as parked tasks. The semaphore is fair (FIFO),
            // so a call with many claims does not starve the calls that come after it.
            // (It is never closed, so `ok()` never drops the bound.)
            let permit = self.overall.clone().acquire_owned().await.ok();
            let uid = claim.uid.clone();
            let job = work(claim);
            let handle = tasks.spawn(async move {
                let answer = job.await;
                drop(permit);
                answer
            });
            uids.insert(handle.id(), uid);
        }
        while !tasks.is_empty() {
            join_one(&mut tasks, &mut uids, &mut out, failed).await;
        }
        out
    }
}

/// The DRA v1 service; [`DraServiceV1beta1`] serves v1beta1 with it.
#[derive(Clone)]
pub struct DraService {
    driver: Arc<dyn Driver>,
    claims: Arc<dyn ClaimReader>,
    metrics: Arc<ClaimMetrics>,
    concurrency: ClaimConcurrency,
}

impl std::fmt::Debug for DraService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraService")
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl DraService {
    pub fn new(
        driver: Arc<dyn Driver>,
        claims: Arc<dyn ClaimReader>,
        metrics: Arc<ClaimMetrics>,
        concurrency: ClaimConcurrency,
    ) -> Self {
        Self {
            driver,
            claims,
            metrics,
            concurrency,
        }
    }

    fn update_prepared_devices(&self) {
        if let Some(n) = self.driver.prepared_devices() {
            self.metrics.set_prepared_devices(n);
        }
    }

    async fn prepare_one(&self, claim: v1::Claim) -> v1::NodePrepareResourceResponse {
        let started = Instant::now();
        let result = async {
            check_claim_ref(&claim.namespace, &claim.name).map_err(|e| ("invalid_claim", e))?;
            let object = self
                .claims
                .get(&claim.namespace, &claim.name)
                .await
                .map_err(|e| ("read", e.to_string()))?;
            let claim_ref = ClaimRef {
                uid: claim.uid.clone(),
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
            };
            let driver = self.driver.clone();
            tokio::task::spawn_blocking(move || driver.prepare(&claim_ref, &object))
                .await
                .map_err(|e| ("internal", format!("prepare task failed: {e}")))?
                .map_err(|e| (e.kind, e.message))
        }
        .await;
        let outcome = result.as_ref().map_or_else(|(kind, _)| *kind, |_| "ok");
        self.metrics.observe_prepare(started.elapsed(), outcome);
        self.update_prepared_devices();
        match result {
            Ok(devices) => {
                tracing::info!(claim = ?claim.uid, namespace = ?claim.namespace, name = ?claim.name, devices = devices.len(), "prepared");
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
                // Debug formatting quotes and escapes: the claim reference comes from the
                // kubelet unchecked, and the error can quote the claim's opaque config,
                // which must not start a new line or colour a terminal in the logs.
                tracing::warn!(claim = ?claim.uid, namespace = ?claim.namespace, name = ?claim.name, kind, ?error, "prepare failed");
                v1::NodePrepareResourceResponse {
                    devices: Vec::new(),
                    error,
                }
            }
        }
    }

    async fn unprepare_one(&self, claim: v1::Claim) -> v1::NodeUnprepareResourceResponse {
        let started = Instant::now();
        let driver = self.driver.clone();
        let claim_ref = ClaimRef {
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
        };
        let result = tokio::task::spawn_blocking(move || driver.unprepare(&claim_ref))
            .await
            .map_err(|e| ("internal", format!("unprepare task failed: {e}")))
            .and_then(|r| r.map_err(|e| (e.kind, e.message)));
        let outcome = result.as_ref().map_or_else(|(kind, _)| *kind, |_| "ok");
        self.metrics.observe_unprepare(started.elapsed(), outcome);
        self.update_prepared_devices();
        let error = match result {
            Ok(()) => {
                tracing::info!(claim = ?claim.uid, namespace = ?claim.namespace, name = ?claim.name, "unprepared");
                String::new()
            }
            Err((kind, error)) => {
                tracing::warn!(claim = ?claim.uid, kind, ?error, "unprepare failed");
                error
            }
        };
        v1::NodeUnprepareResourceResponse { error }
    }

    /// Prepares every claim of one call; one answer per claim UID.
    pub async fn prepare(
        &self,
        claims: Vec<v1::Claim>,
    ) -> HashMap<String, v1::NodePrepareResourceResponse> {
        let work = |claim| {
            let this = self.clone();
            async move { this.prepare_one(claim).await }
        };
        let failed = |error| v1::NodePrepareResourceResponse {
            devices: Vec::new(),
            error,
        };
        self.concurrency.run(claims, work, failed).await
    }

    /// Unprepares every claim of one call; one answer per claim UID.
    pub async fn unprepare(
        &self,
        claims: Vec<v1::Claim>,
    ) -> HashMap<String, v1::NodeUnprepareResourceResponse> {
        let work = |claim| {
            let this = self.clone();
            async move { this.unprepare_one(claim).await }
        };
        let failed = |error| v1::NodeUnprepareResourceResponse { error };
        self.concurrency.run(claims, work, failed).await
    }
}

/// Waits for one claim task and files its answer under the claim's UID.
async fn join_one<T: 'static>(
    tasks: &mut JoinSet<T>,
    uids: &mut HashMap<Id, String>,
    out: &mut HashMap<String, T>,
    failed: fn(String) -> T,
) {
    match tasks.join_next_with_id().await {
        Some(Ok((id, answer))) => {
            if let Some(uid) = uids.remove(&id) {
                out.insert(uid, answer);
            }
        }
        // The kubelet retries a claim whose answer is an error.
        Some(Err(e)) => {
            let uid = uids.remove(&e.id());
            tracing::error!(claim = ?uid, error = %e, "claim task panicked");
            if let Some(uid) = uid {
                out.insert(uid, failed(format!("internal error: {e}")));
            }
        }
        None => {}
    }
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
#[derive(Debug, Clone)]
pub struct DraServiceV1beta1(pub DraService);

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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    fn claims(prefix: &str, n: usize) -> Vec<v1::Claim> {
        (0..n)
            .map(|i| v1::Claim {
                namespace: "team-a".into(),
                uid: format!("{prefix}{i}"),
                name: format!("claim-{prefix}{i}"),
            })
            .collect()
    }

    /// Counts how many jobs run at once, and the most that ever did.
    #[derive(Default)]
    struct Gauge {
        now: AtomicUsize,
        peak: AtomicUsize,
    }

    /// A job that holds its place for a few milliseconds and answers its claim's name.
    fn counted(gauge: &Arc<Gauge>) -> impl FnMut(v1::Claim) -> BoxedJob + use<> {
        let gauge = gauge.clone();
        move |claim| {
            let gauge = gauge.clone();
            Box::pin(async move {
                let now = gauge.now.fetch_add(1, Ordering::SeqCst) + 1;
                gauge.peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                gauge.now.fetch_sub(1, Ordering::SeqCst);
                claim.name
            })
        }
    }

    type BoxedJob = std::pin::Pin<Box<dyn Future<Output = String> + Send>>;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn one_call_runs_at_most_per_call_claims_and_answers_all() {
        let limits = ClaimConcurrency::new(3, 100);
        let gauge = Arc::new(Gauge::default());
        let out = limits.run(claims("c", 50), counted(&gauge), |e| e).await;
        assert_eq!(out.len(), 50);
        assert_eq!(out["c7"], "claim-c7");
        assert_eq!(gauge.peak.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn calls_together_run_at_most_overall_claims() {
        let limits = ClaimConcurrency::new(4, 6);
        let gauge = Arc::new(Gauge::default());
        let (a, b) = tokio::join!(
            limits.run(claims("a", 30), counted(&gauge), |e| e),
            limits.run(claims("b", 30), counted(&gauge), |e| e),
        );
        assert_eq!((a.len(), b.len()), (30, 30));
        let peak = gauge.peak.load(Ordering::SeqCst);
        assert!(peak > 4 && peak <= 6, "peak {peak}");
    }

    #[tokio::test]
    async fn a_claim_whose_task_panics_is_still_answered() {
        let limits = ClaimConcurrency::new(2, 2);
        let work = |claim: v1::Claim| async move {
            assert_ne!(claim.uid, "c1", "a bug in one claim's preparation");
            claim.name
        };
        let out = limits.run(claims("c", 3), work, |e| e).await;
        assert_eq!(out.len(), 3);
        assert_eq!(out["c0"], "claim-c0");
        assert!(out["c1"].starts_with("internal error"), "{}", out["c1"]);
    }

    #[test]
    fn a_bound_of_zero_is_one() {
        let limits = ClaimConcurrency::new(0, 0);
        assert_eq!(limits.per_call, 1);
        assert_eq!(limits.overall.available_permits(), 1);
    }
}
