use std::cell::RefCell;

use kube::api::{ListMeta, TypeMeta};
use kube::core::Status;

use super::*;

fn page(items: &[u32], token: Option<&str>) -> ObjectList<u32> {
    ObjectList {
        types: TypeMeta::default(),
        metadata: ListMeta {
            continue_: token.map(str::to_owned),
            ..Default::default()
        },
        items: items.to_vec(),
    }
}

fn gone() -> kube::Error {
    kube::Error::Api(Box::new(
        Status::failure("continue token expired", "Expired").with_code(410),
    ))
}

#[tokio::test]
async fn pages_are_followed_to_the_end() {
    let asked = RefCell::new(Vec::new());
    let mut got = Vec::new();
    let pages = paginate(
        |token: Option<String>| {
            asked.borrow_mut().push(token.clone());
            let answer = match token.as_deref() {
                None => page(&[1, 2], Some("t1")),
                Some("t1") => page(&[3, 4], Some("t2")),
                _ => page(&[5], Some("")),
            };
            async move { Ok(answer) }
        },
        |i| got.push(i),
    )
    .await
    .unwrap();
    assert_eq!(got, [1, 2, 3, 4, 5]);
    assert_eq!(
        *asked.borrow(),
        [None, Some("t1".to_owned()), Some("t2".to_owned())]
    );
    assert_eq!(
        pages,
        Pages {
            pages: 3,
            items: 5,
            restarted: false
        }
    );
}

#[tokio::test]
async fn an_expired_token_restarts_the_list_once() {
    let calls = RefCell::new(0);
    let mut got = Vec::new();
    let pages = paginate(
        |token: Option<String>| {
            *calls.borrow_mut() += 1;
            let n = *calls.borrow();
            let answer = match (n, token) {
                (1, None) | (3, None) => Ok(page(&[1], Some("t"))),
                (2, Some(_)) => Err(gone()),
                _ => Ok(page(&[2], None)),
            };
            async move { answer }
        },
        |i| got.push(i),
    )
    .await
    .unwrap();
    assert_eq!(got, [1, 1, 2]);
    assert!(pages.restarted);
    // A second expiry is an error.
    let err = paginate(
        |token: Option<String>| {
            let answer = match token {
                None => Ok(page(&[1], Some("t"))),
                Some(_) => Err(gone()),
            };
            async move { answer }
        },
        |_: u32| {},
    )
    .await
    .unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 410));
}

#[test]
fn skipped_pools_and_ignored_values_are_reported_escaped() {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    let slice = |name: &str, node: &str, numa: serde_json::Value| -> ResourceSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"driver": "gpu.topodra.dev", "nodeName": node,
                "pool": {"name": "p\u{1b}[31m", "generation": 1, "resourceSliceCount": 2},
                "devices": [{"name": name, "attributes": {
                    "type": {"string": "gpu"},
                    "resource.kubernetes.io/numaNode": numa}}]}
        }))
        .unwrap()
    };
    let mut c = Cluster::new("gpu.topodra.dev");
    c.apply_slice(&slice("a", "node-a", serde_json::json!({"int": 0})));
    c.apply_slice(&slice(
        "b",
        "node-b\n",
        serde_json::json!({"string": "x\ny"}),
    ));
    let findings = c.take_findings();
    let quiet = findings_report(&findings, false);
    assert_eq!(
        quiet,
        [
            "warning: pool \"p\\u{1b}[31m\" skipped: its slices name more than one node: \
                 [\"node-a\", \"node-b\\n\"]",
            "warning: ignored 1 topology value in ResourceSlices that no topodra plugin \
                 publishes; those devices count as not carrying the attribute (-v lists them)",
        ]
    );
    let verbose = findings_report(&findings, true);
    assert_eq!(
        verbose[0],
        "warning: ResourceSlice \"b\", device \"b\": ignored numaNode string \"x\\ny\""
    );
    for line in quiet.iter().chain(&verbose) {
        assert!(!line.chars().any(char::is_control), "{line:?}");
    }
}

#[test]
fn api_errors_read_as_the_servers_message() {
    let e = kube::Error::Api(Box::new(
        Status::failure(
            "resourceslices.resource.k8s.io is forbidden: User \"alice\" cannot list resource \
                 \"resourceslices\" in API group \"resource.k8s.io\" at the cluster scope",
            "Forbidden",
        )
        .with_code(403),
    ));
    assert_eq!(
        describe(&e),
        "resourceslices.resource.k8s.io is forbidden: User \"alice\" cannot list resource \
             \"resourceslices\" in API group \"resource.k8s.io\" at the cluster scope (Forbidden)"
    );
}
