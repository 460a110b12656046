use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Resource;
use kube::api::WatchEvent;
use kube::core::ObjectList;
use serde_json::json;

use super::*;

/// `depth` objects nested under key `a`, innermost `{"x": 1}`.
fn nested(depth: usize) -> String {
    let mut s = String::from(r#"{"x":1}"#);
    for _ in 0..depth {
        s = format!(r#"{{"a":{s}}}"#);
    }
    s
}

/// An allocated claim whose config for another driver carries `params` as its
/// opaque parameters.
fn claim_with(params: &str) -> String {
    let mut claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "deep", "namespace": "team-a", "uid": "u1", "resourceVersion": "7"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.topodra.dev"}}],
            "config": [{"opaque": {"driver": "other.example.com", "parameters": "PARAMS"}}]
        }},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.topodra.dev", "pool": "node-a", "device": "gpu-0"}
        ]}}}
    })
    .to_string();
    claim = claim.replace(r#""PARAMS""#, params);
    claim
}

fn results(c: &ResourceClaim) -> Vec<String> {
    c.status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .map(|r| format!("{}/{}/{}", r.driver, r.pool, r.device))
        .collect()
}

#[test]
fn a_plain_object_decodes_whole() {
    let text = claim_with(r#"{"k": "v"}"#);
    let b = Bounded::<ResourceClaim>::from_json(&text);
    assert!(matches!(b, Bounded::Whole(_)), "{b:?}");
    assert_eq!(b.meta().name.as_deref(), Some("deep"));
}

/// The case found: 150 nested objects in another driver's parameters. serde_json's
/// own decode refuses the claim; bounded, it decodes with its allocation whole.
#[test]
fn parameters_nested_past_the_recursion_limit_are_pruned_not_fatal() {
    let text = claim_with(&nested(150));
    let plain = serde_json::from_str::<ResourceClaim>(&text).unwrap_err();
    assert!(plain.to_string().contains("recursion limit"), "{plain}");

    let b = Bounded::<ResourceClaim>::from_json(&text);
    let Bounded::Pruned { object, paths } = &b else {
        panic!("expected Pruned, got {b:?}");
    };
    assert_eq!(results(object), ["gpu.topodra.dev/node-a/gpu-0"]);
    assert_eq!(paths.len(), 1);
    assert!(
        paths[0].starts_with("spec.devices.config[0].opaque.parameters.a.a"),
        "{paths:?}"
    );
    assert!(paths[0].ends_with('…'), "{paths:?}");
}

#[test]
fn any_depth_is_walked_without_recursion() {
    // Far past any stack: 200 000 levels of arrays (400 KB).
    let deep = format!("{}{}", "[".repeat(200_000), "]".repeat(200_000));
    let b = Bounded::<ResourceClaim>::from_json(&claim_with(&deep));
    assert_eq!(
        results(b.object().expect("decoded")),
        ["gpu.topodra.dev/node-a/gpu-0"]
    );
}

#[test]
fn what_does_not_decode_keeps_its_identity_and_fails_alone() {
    let text = json!({
        "metadata": {"name": "odd", "namespace": "team-a", "uid": "u2", "resourceVersion": "9",
                     "managedFields": [{"fieldsV1": serde_json::from_str::<serde_json::Value>(&nested(20)).unwrap()}]},
        "spec": 5
    })
    .to_string();
    let b = Bounded::<ResourceClaim>::from_json(&text);
    let Bounded::Undecodable(u) = &b else {
        panic!("expected Undecodable, got {b:?}");
    };
    assert_eq!(u.metadata.name.as_deref(), Some("odd"));
    assert_eq!(u.metadata.namespace.as_deref(), Some("team-a"));
    assert_eq!(u.metadata.resource_version.as_deref(), Some("9"));
    assert!(u.error.contains("invalid type"), "{}", u.error);
    assert!(b.object().is_none());
}

/// How kube-rs decodes: a watch event line, and a LIST page, one bad item among good.
#[test]
fn watch_events_and_list_pages_decode_through_kube_types() {
    let deep = claim_with(&nested(150));
    let line = format!(r#"{{"type":"ADDED","object":{deep}}}"#);
    let event: WatchEvent<Bounded<ResourceClaim>> = serde_json::from_str(&line).unwrap();
    let WatchEvent::Added(b) = event else {
        panic!("not Added")
    };
    assert!(matches!(b, Bounded::Pruned { .. }));

    let plain = claim_with("{}");
    let page = format!(
        r#"{{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaimList","metadata":{{"resourceVersion":"10"}},"items":[{plain},{deep},{plain}]}}"#
    );
    let list: ObjectList<Bounded<ResourceClaim>> = serde_json::from_str(&page).unwrap();
    let kinds: Vec<bool> = list
        .items
        .iter()
        .map(|b| matches!(b, Bounded::Whole(_)))
        .collect();
    assert_eq!(kinds, [true, false, true]);
}

#[test]
fn the_resource_is_the_wrapped_one() {
    assert_eq!(
        Bounded::<ResourceClaim>::url_path(&(), Some("team-a")),
        ResourceClaim::url_path(&(), Some("team-a"))
    );
    assert_eq!(Bounded::<ResourceClaim>::kind(&()), "ResourceClaim");
}
