//! Reading a claim for prepare: one GET by namespace and name, never a list or watch.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::publish::Backoff;

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Refuses a claim reference that no ResourceClaim can have, before its namespace and
/// name go into an API path: kube-rs puts both into the URL as they are, so `..`, `/`,
/// `?` or `#` would send the GET (with the plugin's credentials) somewhere else.
/// Namespaces are DNS labels and claim names DNS subdomains, which leaves nothing to
/// escape. Values are quoted with Debug formatting: the message reaches logs and the
/// kubelet's events.
pub(crate) fn check_claim_ref(namespace: &str, name: &str) -> Result<(), String> {
    if !is_dns_label(namespace) {
        return Err(format!(
            "invalid claim reference: namespace {namespace:?} is not a DNS label \
             (lower-case letters, digits and '-', at most 63 characters)"
        ));
    }
    if !is_dns_subdomain(name) {
        return Err(format!(
            "invalid claim reference: name {name:?} in namespace {namespace:?} is not a DNS \
             subdomain (lower-case letters, digits, '-' and '.', at most 253 characters)"
        ));
    }
    Ok(())
}

/// RFC 1123 label, as Kubernetes checks namespace names.
fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && is_label(s)
}

/// RFC 1123 subdomain, as Kubernetes checks most object names: dot-separated labels,
/// none empty (so never `.` or `..`).
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label)
}

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            alnum(first) && alnum(last) && b.iter().all(|c| alnum(c) || *c == b'-')
        }
        _ => false,
    }
}

/// Where prepare gets a claim's current object.
pub(crate) trait ClaimReader: Send + Sync {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, String>>;
}

/// How claim reads on the prepare path retry and give up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadPolicy {
    /// Limit on one GET.
    pub(crate) attempt_timeout: Duration,
    /// Limit on all attempts together: well under the kubelet's 45 s for a whole
    /// NodePrepareResources call, so the answer is an error the kubelet can show
    /// rather than a timeout.
    pub(crate) deadline: Duration,
    /// First pause between attempts (doubling, jittered, at most 2 s).
    pub(crate) backoff_floor: Duration,
}

impl Default for ReadPolicy {
    fn default() -> Self {
        Self {
            attempt_timeout: Duration::from_secs(10),
            deadline: Duration::from_secs(30),
            backoff_floor: Duration::from_millis(200),
        }
    }
}

/// Whether a failed GET may succeed when repeated: throttling, server errors and
/// transport failures may; a 404 or 403 will not.
fn retryable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => matches!(status.code, 429 | 500 | 502 | 503 | 504),
        _ => true,
    }
}

/// Reads claims from the API server.
#[derive(Clone)]
pub(crate) struct ApiClaims {
    client: kube::Client,
    policy: ReadPolicy,
}

impl ApiClaims {
    pub(crate) fn new(client: kube::Client, policy: ReadPolicy) -> Self {
        Self { client, policy }
    }
}

impl ClaimReader for ApiClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, String>> {
        Box::pin(async move {
            let api = kube::Api::<ResourceClaim>::namespaced(self.client.clone(), namespace);
            let policy = self.policy;
            let deadline = tokio::time::Instant::now() + policy.deadline;
            let mut backoff = Backoff::new(policy.backoff_floor, Duration::from_secs(2));
            loop {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let error =
                    match tokio::time::timeout(policy.attempt_timeout.min(left), api.get(name))
                        .await
                    {
                        Ok(Ok(claim)) => return Ok(claim),
                        Ok(Err(e)) if !retryable(&e) => {
                            return Err(format!("reading claim {namespace}/{name}: {e}"));
                        }
                        Ok(Err(e)) => e.to_string(),
                        Err(_) => {
                            format!("no answer within {:?}", policy.attempt_timeout.min(left))
                        }
                    };
                let pause = backoff.next_delay();
                if tokio::time::Instant::now() + pause >= deadline {
                    return Err(format!(
                        "reading claim {namespace}/{name}: gave up after {} attempt(s) in {:?}: {error}",
                        backoff.attempts(),
                        policy.deadline
                    ));
                }
                tokio::time::sleep(pause).await;
            }
        })
    }
}

impl crate::reconcile::ClaimLookup for ApiClaims {
    fn uid_of<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, String>> {
        Box::pin(async move {
            check_claim_ref(namespace, name)?;
            let api = kube::Api::<ResourceClaim>::namespaced(self.client.clone(), namespace);
            match tokio::time::timeout(self.policy.attempt_timeout, api.get_opt(name)).await {
                Ok(Ok(claim)) => Ok(claim.map(|c| c.metadata.uid.unwrap_or_default())),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!(
                    "no answer within {:?}",
                    self.policy.attempt_timeout
                )),
            }
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn accepts_what_kubernetes_accepts() {
        for (ns, name) in [
            ("team-a", "claim-u1"),
            ("a", "b"),
            ("0", "pod-0-gpus-x7k2p"),
            ("kube-system", "a.b.c-d"),
        ] {
            assert_eq!(check_claim_ref(ns, name), Ok(()), "{ns}/{name}");
        }
        let long_label = "a".repeat(63);
        let long_name = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61),
        ]
        .join(".");
        assert_eq!(long_name.len(), 253);
        assert_eq!(check_claim_ref(&long_label, &long_name), Ok(()));
    }

    #[test]
    fn refuses_what_would_change_the_request_path() {
        for (ns, name) in [
            ("..", "claim"),
            ("team-a", ".."),
            ("team-a", "."),
            ("team-a/../kube-system", "claim"),
            ("team-a", "claim/../../../../api/v1/nodes"),
            ("team-a", "claim?watch=true"),
            ("team-a", "claim#x"),
            ("team-a", "claim%2F"),
            ("team-a", "a..b"),
            ("team-a", "-a"),
            ("team-a", "a-"),
            ("team-a", "Claim"),
            ("team-a", "claim\n"),
            ("team.a", "claim"),
            ("", "claim"),
            ("team-a", ""),
        ] {
            assert!(check_claim_ref(ns, name).is_err(), "{ns:?}/{name:?}");
        }
        assert!(check_claim_ref(&"a".repeat(64), "claim").is_err());
        assert!(check_claim_ref("team-a", &"a".repeat(254)).is_err());
    }

    #[test]
    fn the_error_quotes_and_escapes_the_value() {
        let err = check_claim_ref("team-a", "x\n\u{1b}[31my").unwrap_err();
        assert!(err.contains(r#""x\n\u{1b}[31my""#), "{err}");
        assert!(!err.contains('\n') && !err.contains('\u{1b}'), "{err}");
    }
}
