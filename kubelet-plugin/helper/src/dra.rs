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

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::{Id, JoinError, JoinSet};
use tonic::{Request, Response, Status};
use topodra_proto::dra::{v1, v1beta1};

use crate::claims::{ClaimReader, check_claim_ref};
use crate::driver::{ClaimError, ClaimRef, Driver};
use crate::metrics::ClaimMetrics;

mod concurrency;
mod v1beta1_service;

pub use concurrency::{ClaimConcurrency, DEFAULT_CALL_DEADLINE};
pub use v1beta1_service::DraServiceV1beta1;

/// Why one claim of a call failed: what the `claim_errors` metric counts it as, and
/// the message the kubelet shows for it.
#[derive(Debug)]
enum Failure {
    /// The kubelet named the claim with a namespace or name the API would refuse.
    InvalidClaim(String),
    /// Reading the claim from the API server failed (retries included).
    Read(String),
    /// The driver's task did not finish (it panicked or was cancelled).
    Internal(String),
    /// The driver refused the claim; its kind is the driver's.
    Driver(ClaimError),
}

impl Failure {
    fn kind(&self) -> &'static str {
        match self {
            Failure::InvalidClaim(_) => "invalid_claim",
            Failure::Read(_) => "read",
            Failure::Internal(_) => "internal",
            Failure::Driver(e) => e.kind,
        }
    }

    fn into_message(self) -> String {
        match self {
            Failure::InvalidClaim(m) | Failure::Read(m) | Failure::Internal(m) => m,
            Failure::Driver(e) => e.message,
        }
    }
}

/// The claim as the kubelet names it in a v1 call: the one place the wire's claim
/// becomes the driver's.
impl From<&v1::Claim> for ClaimRef {
    fn from(claim: &v1::Claim) -> Self {
        Self {
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
        }
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
            check_claim_ref(&claim.namespace, &claim.name).map_err(Failure::InvalidClaim)?;
            let object = self
                .claims
                .get(&claim.namespace, &claim.name)
                .await
                .map_err(|e| Failure::Read(e.to_string()))?;
            let claim_ref = ClaimRef::from(&claim);
            let driver = self.driver.clone();
            tokio::task::spawn_blocking(move || driver.prepare(&claim_ref, &object))
                .await
                .map_err(|e| Failure::Internal(format!("prepare task failed: {e}")))?
                .map_err(Failure::Driver)
        }
        .await;
        let outcome = result.as_ref().map_or_else(Failure::kind, |_| "ok");
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
            Err(failure) => {
                let kind = failure.kind();
                let error = failure.into_message();
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
        let claim_ref = ClaimRef::from(&claim);
        let result = tokio::task::spawn_blocking(move || driver.unprepare(&claim_ref))
            .await
            .map_err(|e| Failure::Internal(format!("unprepare task failed: {e}")))
            .and_then(|r| r.map_err(Failure::Driver));
        let outcome = result.as_ref().map_or_else(Failure::kind, |_| "ok");
        self.metrics.observe_unprepare(started.elapsed(), outcome);
        self.update_prepared_devices();
        let error = match result {
            Ok(()) => {
                tracing::info!(claim = ?claim.uid, namespace = ?claim.namespace, name = ?claim.name, "unprepared");
                String::new()
            }
            Err(failure) => {
                let kind = failure.kind();
                let error = failure.into_message();
                tracing::warn!(claim = ?claim.uid, kind, ?error, "unprepare failed");
                error
            }
        };
        v1::NodeUnprepareResourceResponse { error }
    }

    /// Prepares every claim of one call; one answer per claim UID, its error text
    /// escaped for the kubelet ([`kubelet_error_text`]).
    pub async fn prepare(
        &self,
        claims: Vec<v1::Claim>,
    ) -> HashMap<String, v1::NodePrepareResourceResponse> {
        let started = Instant::now();
        let work = |claim| {
            let this = self.clone();
            async move { this.prepare_one(claim).await }
        };
        let failed = |error| v1::NodePrepareResourceResponse {
            devices: Vec::new(),
            error,
        };
        let (mut answers, late) = self.concurrency.run(claims, work, failed).await;
        for _ in 0..late {
            self.metrics.observe_prepare(started.elapsed(), "deadline");
        }
        for answer in answers.values_mut() {
            if !answer.error.is_empty() {
                answer.error = kubelet_error_text(&answer.error);
            }
        }
        answers
    }

    /// Unprepares every claim of one call; one answer per claim UID, its error text
    /// escaped for the kubelet.
    pub async fn unprepare(
        &self,
        claims: Vec<v1::Claim>,
    ) -> HashMap<String, v1::NodeUnprepareResourceResponse> {
        let started = Instant::now();
        let work = |claim| {
            let this = self.clone();
            async move { this.unprepare_one(claim).await }
        };
        let failed = |error| v1::NodeUnprepareResourceResponse { error };
        let (mut answers, late) = self.concurrency.run(claims, work, failed).await;
        for _ in 0..late {
            self.metrics
                .observe_unprepare(started.elapsed(), "deadline");
        }
        for answer in answers.values_mut() {
            if !answer.error.is_empty() {
                answer.error = kubelet_error_text(&answer.error);
            }
        }
        answers
    }
}

/// Waits for one claim task and files its answer under the claim's UID.
async fn join_one<T: 'static>(
    tasks: &mut JoinSet<T>,
    running: &mut HashMap<Id, v1::Claim>,
    out: &mut HashMap<String, T>,
    failed: fn(String) -> T,
) {
    if let Some(result) = tasks.join_next_with_id().await {
        file(result, running, out, failed);
    }
}

/// Files the answer of a finished claim task under the claim's UID.
fn file<T>(
    result: Result<(Id, T), JoinError>,
    running: &mut HashMap<Id, v1::Claim>,
    out: &mut HashMap<String, T>,
    failed: fn(String) -> T,
) {
    match result {
        Ok((id, answer)) => {
            if let Some(claim) = running.remove(&id) {
                out.insert(claim.uid, answer);
            }
        }
        // The kubelet retries a claim whose answer is an error.
        Err(e) => {
            let claim = running.remove(&e.id());
            let uid = claim.map(|c| c.uid);
            tracing::error!(claim = ?uid, error = %e, "claim task panicked");
            if let Some(uid) = uid {
                out.insert(uid, failed(format!("internal error: {e}")));
            }
        }
    }
}

/// Longest error text the kubelet gets for one claim: it goes into the pod's events
/// (whose message the API server cuts at 1 KiB) and `kubectl describe`.
pub const MAX_ERROR_LEN: usize = 1024;

/// An error text as the kubelet may show it: control characters (newlines, terminal
/// escapes) and the Unicode characters that break or reorder lines are escaped the
/// way Rust's `escape_debug` writes them, so a claim's opaque config (which error
/// messages quote) cannot start a new line or colour a terminal in the pod's events;
/// other text, non-ASCII included, is kept. Longer texts are cut at
/// [`MAX_ERROR_LEN`] bytes.
pub fn kubelet_error_text(error: &str) -> String {
    const CUT: &str = "… (cut)";
    let mut out = String::with_capacity(error.len());
    for c in error.chars() {
        let breaks_lines = c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if breaks_lines {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    if out.len() > MAX_ERROR_LEN {
        let mut end = MAX_ERROR_LEN - CUT.len();
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
        out.push_str(CUT);
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

#[cfg(test)]
mod tests;
