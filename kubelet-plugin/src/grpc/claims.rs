//! Reading a claim for prepare: one GET by namespace and name, never a list or watch.

use std::future::Future;
use std::pin::Pin;

use k8s_openapi::api::resource::v1::ResourceClaim;

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

/// Reads claims from the API server.
#[derive(Clone)]
pub(crate) struct ApiClaims {
    client: kube::Client,
}

impl ApiClaims {
    pub(crate) fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl ClaimReader for ApiClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, String>> {
        Box::pin(async move {
            kube::Api::<ResourceClaim>::namespaced(self.client.clone(), namespace)
                .get(name)
                .await
                .map_err(|e| format!("reading claim {namespace}/{name}: {e}"))
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
