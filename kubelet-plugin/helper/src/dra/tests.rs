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
    ) -> crate::claims::BoxFuture<'a, Result<ResourceClaim, crate::claims::ClaimReadError>> {
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
