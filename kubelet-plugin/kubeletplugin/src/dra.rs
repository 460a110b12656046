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
use crate::driver::{ClaimRef, Driver};
use crate::metrics::ClaimMetrics;

/// By default a call is answered at most this long after it arrived: the kubelet
/// gives a NodePrepareResources call 45 s, and an answer after that is lost, so the
/// claims that were done would be redone and the others get no message at all.
pub const DEFAULT_CALL_DEADLINE: Duration = Duration::from_secs(30);

/// How many claims are worked on at once: at most `per_call` of one call, and at most
/// as many as `overall` has permits across all calls; and how long one call may take.
#[derive(Debug, Clone)]
pub struct ClaimConcurrency {
    per_call: usize,
    overall: Arc<Semaphore>,
    call_deadline: Duration,
}

impl ClaimConcurrency {
    /// Zero is taken as one: a bound of zero would answer nothing. Calls are answered
    /// within [`DEFAULT_CALL_DEADLINE`].
    pub fn new(per_call: usize, overall: usize) -> Self {
        Self {
            per_call: per_call.max(1),
            overall: Arc::new(Semaphore::new(overall.max(1))),
            call_deadline: DEFAULT_CALL_DEADLINE,
        }
    }

    /// Answers each call within `deadline` of its arrival: claims not done by then
    /// are answered with an error, which the kubelet retries.
    pub fn call_deadline(mut self, deadline: Duration) -> Self {
        self.call_deadline = deadline;
        self
    }

    /// Runs `work` for every claim of one call, each in a task of its own, within the
    /// bounds, and collects one answer per claim UID; a UID the call repeats is worked
    /// on once. A task that panics is answered with `failed`, so no claim goes without
    /// an answer; so are the claims not done when the call's deadline passes, whose
    /// number comes second.
    async fn run<T, W, F>(
        &self,
        claims: Vec<v1::Claim>,
        mut work: W,
        failed: fn(String) -> T,
    ) -> (HashMap<String, T>, usize)
    where
        T: Send + 'static,
        W: FnMut(v1::Claim) -> F,
        F: Future<Output = T> + Send + 'static,
    {
        let deadline = tokio::time::Instant::now() + self.call_deadline;
        // The answers are keyed by UID, so a repeated claim could only get one answer
        // anyway; working on it twice would read it twice and race with itself.
        let mut seen = HashSet::with_capacity(claims.len());
        let mut queue: VecDeque<v1::Claim> = claims
            .into_iter()
            .filter(|c| seen.insert(c.uid.clone()))
            .collect();
        drop(seen);
        let mut out = HashMap::with_capacity(queue.len());
        let mut tasks = JoinSet::new();
        let mut running: HashMap<Id, v1::Claim> = HashMap::new();
        let all = async {
            while !queue.is_empty() {
                if tasks.len() >= self.per_call {
                    join_one(&mut tasks, &mut running, &mut out, failed).await;
                }
                // Waiting for the permit here, before spawning, keeps the claims that
                // wait as plain data instead of as parked tasks. The semaphore is fair
                // (FIFO), so a call with many claims does not starve the calls that
                // come after it. (It is never closed, so `ok()` never drops the bound.)
                // The claim leaves the queue only once it has its permit, so a
                // deadline that cuts this wait short loses none.
                let permit = self.overall.clone().acquire_owned().await.ok();
                let Some(claim) = queue.pop_front() else {
                    break;
                };
                let job = work(claim.clone());
                let handle = tasks.spawn(async move {
                    let answer = job.await;
                    drop(permit);
                    answer
                });
                running.insert(handle.id(), claim);
            }
            while !tasks.is_empty() {
                join_one(&mut tasks, &mut running, &mut out, failed).await;
            }
        };
        if tokio::time::timeout_at(deadline, all).await.is_ok() {
            return (out, 0);
        }
        while let Some(result) = tasks.try_join_next_with_id() {
            file(result, &mut running, &mut out, failed);
        }
        // The claims still being worked on finish in the background, holding their
        // permits: a prepare cut off halfway would leave its CDI spec and checkpoint
        // for the retry to sort out, and the bound on work in flight would not hold.
        // The kubelet's retry finds them done (prepare is idempotent).
        tasks.detach_all();
        let limit = self.call_deadline;
        let late = running.len() + queue.len();
        for claim in running.into_values() {
            let error = format!(
                "claim {}/{}: still in progress when the call's time limit of {limit:?} ran out; the kubelet retries it",
                claim.namespace, claim.name
            );
            out.insert(claim.uid, failed(error));
        }
        for claim in queue {
            let error = format!(
                "claim {}/{}: not started within the call's time limit of {limit:?} ({late} of the call's claims were not done in time); the kubelet retries it",
                claim.namespace, claim.name
            );
            out.insert(claim.uid, failed(error));
        }
        tracing::warn!(
            late,
            ?limit,
            "a call was answered at its time limit; claims not done get an error and are retried by the kubelet"
        );
        (out, late)
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

    use k8s_openapi::api::resource::v1::ResourceClaim;

    use super::*;
    use crate::driver::{ClaimError, PreparedDevice};

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
        let (out, _) = limits.run(claims("c", 50), counted(&gauge), |e| e).await;
        assert_eq!(out.len(), 50);
        assert_eq!(out["c7"], "claim-c7");
        assert_eq!(gauge.peak.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn calls_together_run_at_most_overall_claims() {
        let limits = ClaimConcurrency::new(4, 6);
        let gauge = Arc::new(Gauge::default());
        let ((a, _), (b, _)) = tokio::join!(
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
        let (out, _) = limits.run(claims("c", 3), work, |e| e).await;
        assert_eq!(out.len(), 3);
        assert_eq!(out["c0"], "claim-c0");
        assert!(out["c1"].starts_with("internal error"), "{}", out["c1"]);
    }

    /// A claim reader that counts its calls and takes `delay` for each.
    struct SlowClaims {
        reads: AtomicUsize,
        delay: Duration,
    }

    impl ClaimReader for SlowClaims {
        fn get<'a>(
            &'a self,
            _namespace: &'a str,
            _name: &'a str,
        ) -> crate::claims::BoxFuture<'a, Result<ResourceClaim, crate::claims::ClaimReadError>>
        {
            self.reads.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                tokio::time::sleep(self.delay).await;
                Ok(ResourceClaim::default())
            })
        }
    }

    /// Prepares every claim with one device, unprepares everything, and counts both;
    /// a claim named `bad-config` fails with what a strict decoder of its opaque
    /// config says about a field named with a newline and a terminal escape.
    #[derive(Default)]
    struct CountingDriver {
        prepared: AtomicUsize,
        unprepared: AtomicUsize,
    }

    impl Driver for CountingDriver {
        fn prepare(
            &self,
            claim: &ClaimRef,
            _object: &ResourceClaim,
        ) -> Result<Vec<PreparedDevice>, ClaimError> {
            self.prepared.fetch_add(1, Ordering::SeqCst);
            if claim.name == "bad-config" {
                return Err(ClaimError::new(
                    "config",
                    "opaque config: unknown field `x\n\u{1b}[31mred`, expected one of\n  `sharing`",
                ));
            }
            Ok(vec![PreparedDevice {
                device: format!("dev-{}", claim.name),
                ..PreparedDevice::default()
            }])
        }

        fn unprepare(&self, _claim: &ClaimRef) -> Result<(), ClaimError> {
            self.unprepared.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    fn service(
        driver: &Arc<CountingDriver>,
        reads: &Arc<SlowClaims>,
        concurrency: ClaimConcurrency,
    ) -> DraService {
        DraService::new(driver.clone(), reads.clone(), Arc::default(), concurrency)
    }

    fn slow_claims(delay: Duration) -> Arc<SlowClaims> {
        Arc::new(SlowClaims {
            reads: AtomicUsize::new(0),
            delay,
        })
    }

    #[tokio::test]
    async fn a_claim_the_call_repeats_is_read_and_prepared_once() {
        let driver = Arc::new(CountingDriver::default());
        let reads = slow_claims(Duration::ZERO);
        let dra = service(&driver, &reads, ClaimConcurrency::new(4, 4));
        let mut call = claims("c", 3);
        call.extend(std::iter::repeat_n(call[1].clone(), 50));
        call.push(call[0].clone());
        let answers = dra.prepare(call.clone()).await;
        assert_eq!(answers.len(), 3);
        assert_eq!(answers["c1"].devices[0].device_name, "dev-claim-c1");
        assert_eq!(reads.reads.load(Ordering::SeqCst), 3);
        assert_eq!(driver.prepared.load(Ordering::SeqCst), 3);

        let answers = dra.unprepare(call).await;
        assert_eq!(answers.len(), 3);
        assert_eq!(driver.unprepared.load(Ordering::SeqCst), 3);
    }

    /// Claims that cannot be done within the call's deadline get an error each, and
    /// the call is answered at the deadline, not when the last claim would be done.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_is_answered_by_its_deadline_and_the_late_claims_say_so() {
        let driver = Arc::new(CountingDriver::default());
        // 40 claims of 100 ms, 2 at a time, would take 2 s.
        let reads = slow_claims(Duration::from_millis(100));
        let concurrency = ClaimConcurrency::new(2, 2).call_deadline(Duration::from_millis(350));
        let dra = service(&driver, &reads, concurrency);
        let started = Instant::now();
        let answers = dra.prepare(claims("c", 40)).await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(1000),
            "answered after {took:?}"
        );
        assert_eq!(answers.len(), 40);
        let done = answers.values().filter(|a| a.error.is_empty()).count();
        assert!((2..=8).contains(&done), "{done} done");
        let late = &answers["c39"].error;
        assert!(
            late.starts_with(
                "claim team-a/claim-c39: not started within the call's time limit of 350ms"
            ),
            "{late}"
        );
        let in_progress = answers
            .values()
            .filter(|a| a.error.contains("still in progress"))
            .count();
        assert!(in_progress <= 2, "{in_progress}");

        // The claims cut off in flight still finish, within the bound on work in
        // flight, and the next call gets its turn.
        let next = dra.prepare(claims("n", 1)).await;
        assert_eq!(next["n0"].error, "");
    }

    #[test]
    fn error_texts_for_the_kubelet_escape_what_breaks_lines() {
        assert_eq!(
            kubelet_error_text("unknown field `x\n\u{1b}[31my`,\r\texpected\u{7f}\u{85}"),
            "unknown field `x\\n\\u{1b}[31my`,\\r\\texpected\\u{7f}\\u{85}"
        );
        assert_eq!(
            kubelet_error_text("a\u{2028}b\u{202e}c"),
            "a\\u{2028}b\\u{202e}c"
        );
        // Other text, non-ASCII and quotes included, stays as it is.
        let kept = r#"claim "ä/ö" on GPU-0 — 3 × 80 GiB: \ 'x'"#;
        assert_eq!(kubelet_error_text(kept), kept);
    }

    #[test]
    fn error_texts_for_the_kubelet_are_cut_at_a_char_boundary() {
        let long = "é".repeat(2000);
        let cut = kubelet_error_text(&long);
        assert!(cut.len() <= MAX_ERROR_LEN, "{}", cut.len());
        assert!(cut.ends_with("… (cut)"));
        assert!(cut.starts_with("éé"));
        let fits = "x".repeat(MAX_ERROR_LEN);
        assert_eq!(kubelet_error_text(&fits), fits);
    }

    #[tokio::test]
    async fn the_errors_of_prepare_reach_the_kubelet_escaped() {
        let driver = Arc::new(CountingDriver::default());
        let dra = service(
            &driver,
            &slow_claims(Duration::ZERO),
            ClaimConcurrency::new(2, 2),
        );
        let mut call = claims("c", 1);
        call[0].name = "bad-config".to_owned();
        call.push(v1::Claim {
            namespace: "team-a".to_owned(),
            uid: "u2".to_owned(),
            name: "x\n\u{1b}[2J".to_owned(),
        });
        let answers = dra.prepare(call).await;
        for answer in answers.values() {
            assert!(!answer.error.is_empty());
            assert!(
                !answer.error.chars().any(char::is_control),
                "{:?}",
                answer.error
            );
        }
        assert!(
            answers["c0"].error.contains(r"`x\n\u{1b}[31mred`"),
            "{}",
            answers["c0"].error
        );
    }

    #[test]
    fn a_bound_of_zero_is_one() {
        let limits = ClaimConcurrency::new(0, 0);
        assert_eq!(limits.per_call, 1);
        assert_eq!(limits.overall.available_permits(), 1);
    }
}
