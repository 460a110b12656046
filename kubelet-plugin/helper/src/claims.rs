//! Reading a claim for prepare: one GET by namespace and name, never a list or watch,
//! retried while the failure may pass.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;

use topodra_ops::backoff::Backoff;
use topodra_ops::bounded::Bounded;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Refuses a claim reference that no ResourceClaim can have, before its namespace and
/// name go into an API path: kube-rs puts both into the URL as they are, so `..`, `/`,
/// `?` or `#` would send the GET (with the plugin's credentials) somewhere else.
/// Namespaces are DNS labels and claim names DNS subdomains, which leaves nothing to
/// escape. Values are quoted with Debug formatting: the message reaches logs and the
/// kubelet's events.
pub fn check_claim_ref(namespace: &str, name: &str) -> Result<(), String> {
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

/// Why a claim could not be read. The message is what the kubelet shows for the
/// claim, so it names the claim.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimReadError {
    /// The claim is gone (404): deleted after the kubelet's call was made.
    #[error("reading claim {namespace}/{name}: {source}")]
    NotFound {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// The plugin may not read claims (401, 403): its RBAC or credentials are wrong,
    /// and retrying will not fix that.
    #[error("reading claim {namespace}/{name}: {source}")]
    Forbidden {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// The API server refused the request for another reason that retrying will not
    /// change (a 4xx other than 404, 403, 401 and 429).
    #[error("reading claim {namespace}/{name}: {source}")]
    Rejected {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// The claim's object could not be decoded, even without what lies nested past
    /// the decoder's depth limit. The same object decodes no better on a retry, so
    /// it is not retried: the kubelet's next call reads it again, changed or not.
    #[error("reading claim {namespace}/{name}: the object cannot be decoded: {error}")]
    Undecodable {
        namespace: String,
        name: String,
        error: String,
    },
    /// Every attempt within the deadline failed in a way that may pass: throttling,
    /// a 5xx, a timeout, a broken connection.
    #[error(
        "reading claim {namespace}/{name}: gave up after {attempts} attempt(s) in {deadline:?}: {last}"
    )]
    Transient {
        namespace: String,
        name: String,
        attempts: u32,
        deadline: Duration,
        #[source]
        last: TransientError,
    },
}

/// The last failure of a claim read that was retried until its deadline.
#[derive(Debug, thiserror::Error)]
pub enum TransientError {
    #[error(transparent)]
    Api(Box<kube::Error>),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Where prepare gets a claim's current object.
pub trait ClaimReader: Send + Sync {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, ClaimReadError>>;
}

/// How claim reads on the prepare path retry and give up.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ReadPolicy {
    /// Limit on one GET.
    pub attempt_timeout: Duration,
    /// Limit on all attempts together: well under the kubelet's 45 s for a whole
    /// NodePrepareResources call, so the answer is an error the kubelet can show
    /// rather than a timeout.
    pub deadline: Duration,
    /// First pause between attempts (doubling, jittered, at most 2 s).
    pub backoff_floor: Duration,
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

/// Sorts a failed GET: `Ok` with the error when repeating it may succeed
/// (throttling, server errors, transport failures), else the final error.
fn classify(
    namespace: &str,
    name: &str,
    source: kube::Error,
) -> Result<Box<kube::Error>, ClaimReadError> {
    let source = Box::new(source);
    let (namespace, name) = (namespace.to_owned(), name.to_owned());
    let code = match &*source {
        kube::Error::Api(status) => status.code,
        // The answer arrived and is not a claim: a retry gets the same bytes.
        kube::Error::SerdeError(e) => {
            return Err(ClaimReadError::Undecodable {
                namespace,
                name,
                error: e.to_string(),
            });
        }
        _ => return Ok(source),
    };
    Err(match code {
        429 | 500 | 502 | 503 | 504 => return Ok(source),
        404 => ClaimReadError::NotFound {
            namespace,
            name,
            source,
        },
        401 | 403 => ClaimReadError::Forbidden {
            namespace,
            name,
            source,
        },
        _ => ClaimReadError::Rejected {
            namespace,
            name,
            source,
        },
    })
}

/// Reads claims from the API server.
#[derive(Clone)]
pub struct ApiClaims {
    client: kube::Client,
    policy: ReadPolicy,
}

impl std::fmt::Debug for ApiClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClaims")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl ApiClaims {
    pub fn new(client: kube::Client, policy: ReadPolicy) -> Self {
        Self { client, policy }
    }

    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    pub fn policy(&self) -> ReadPolicy {
        self.policy
    }
}

impl ClaimReader for ApiClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, ClaimReadError>> {
        Box::pin(async move {
            // Bounded: another driver's opaque parameters may nest past serde_json's
            // limit; they are pruned, and none of ours can lie that deep and be valid
            // (topodra_ops::bounded).
            let api =
                kube::Api::<Bounded<ResourceClaim>>::namespaced(self.client.clone(), namespace);
            let policy = self.policy;
            let deadline = tokio::time::Instant::now() + policy.deadline;
            let mut backoff = Backoff::new(policy.backoff_floor, Duration::from_secs(2));
            loop {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let limit = policy.attempt_timeout.min(left);
                let last = match tokio::time::timeout(limit, api.get(name)).await {
                    Ok(Ok(Bounded::Whole(claim))) => return Ok(claim),
                    Ok(Ok(Bounded::Pruned { object, paths })) => {
                        tracing::warn!(
                            namespace,
                            name,
                            pruned = ?paths,
                            "claim nested too deep; read without its deepest values"
                        );
                        return Ok(object);
                    }
                    Ok(Ok(Bounded::Undecodable(u))) => {
                        return Err(ClaimReadError::Undecodable {
                            namespace: namespace.to_owned(),
                            name: name.to_owned(),
                            error: u.error,
                        });
                    }
                    Ok(Err(e)) => TransientError::Api(classify(namespace, name, e)?),
                    Err(_) => TransientError::Timeout(limit),
                };
                let pause = backoff.next_delay();
                if tokio::time::Instant::now() + pause >= deadline {
                    return Err(ClaimReadError::Transient {
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                        attempts: backoff.attempts(),
                        deadline: policy.deadline,
                        last,
                    });
                }
                tokio::time::sleep(pause).await;
            }
        })
    }
}

#[cfg(test)]
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

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: format!("status {code}"),
            ..Default::default()
        }))
    }

    #[test]
    fn failures_that_may_pass_are_retried_and_the_others_typed() {
        for code in [429, 500, 502, 503, 504] {
            assert!(classify("team-a", "c", api_error(code)).is_ok(), "{code}");
        }
        let final_error = |code| classify("team-a", "c", api_error(code)).unwrap_err();
        assert!(matches!(final_error(404), ClaimReadError::NotFound { .. }));
        assert!(matches!(final_error(403), ClaimReadError::Forbidden { .. }));
        assert!(matches!(final_error(401), ClaimReadError::Forbidden { .. }));
        assert!(matches!(final_error(422), ClaimReadError::Rejected { .. }));
        // A decode error is the answer itself, not a failure to get one.
        let garbled = serde_json::from_str::<ResourceClaim>("{").unwrap_err();
        assert!(matches!(
            classify("team-a", "c", kube::Error::SerdeError(garbled)),
            Err(ClaimReadError::Undecodable { .. })
        ));
        let e = final_error(404);
        assert!(e.to_string().starts_with("reading claim team-a/c: "), "{e}");
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn a_read_that_kept_failing_says_how_often_and_why() {
        let e = ClaimReadError::Transient {
            namespace: "team-a".to_owned(),
            name: "c".to_owned(),
            attempts: 3,
            deadline: Duration::from_secs(30),
            last: TransientError::Timeout(Duration::from_secs(10)),
        };
        assert_eq!(
            e.to_string(),
            "reading claim team-a/c: gave up after 3 attempt(s) in 30s: no answer within 10s"
        );
    }

    #[test]
    fn the_error_quotes_and_escapes_the_value() {
        let err = check_claim_ref("team-a", "x\n\u{1b}[31my").unwrap_err();
        assert!(err.contains(r#""x\n\u{1b}[31my""#), "{err}");
        assert!(!err.contains('\n') && !err.contains('\u{1b}'), "{err}");
    }
}
