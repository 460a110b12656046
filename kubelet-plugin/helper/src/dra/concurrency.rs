//! How many claims are worked on at once, and how long one call may take.

use super::*;

/// By default a call is answered at most this long after it arrived: the kubelet
/// gives a NodePrepareResources call 45 s, and an answer after that is lost, so the
/// claims that were done would be redone and the others get no message at all.
pub const DEFAULT_CALL_DEADLINE: Duration = Duration::from_secs(30);

/// How many claims are worked on at once: at most `per_call` of one call, and at most
/// as many as `overall` has permits across all calls; and how long one call may take.
#[derive(Debug, Clone)]
pub struct ClaimConcurrency {
    pub(super) per_call: usize,
    pub(super) overall: Arc<Semaphore>,
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
    pub(super) async fn run<T, W, F>(
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
