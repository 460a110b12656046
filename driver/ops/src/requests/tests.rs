use super::*;

fn req(method: Method, uri: &str, content_type: Option<&str>) -> Request<()> {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(ct) = content_type {
        b = b.header(http::header::CONTENT_TYPE, ct);
    }
    b.body(()).unwrap()
}

#[test]
fn requests_are_classified_like_the_api_server_does() {
    let slices = "/apis/resource.k8s.io/v1/resourceslices";
    let cases = [
        (
            req(Method::GET, "/api/v1/nodes/n1", None),
            Verb::Get,
            "nodes",
        ),
        (req(Method::GET, slices, None), Verb::List, "resourceslices"),
        (
            req(
                Method::GET,
                &format!("{slices}?&watch=true&resourceVersion=5"),
                None,
            ),
            Verb::Watch,
            "resourceslices",
        ),
        (
            req(
                Method::GET,
                &format!("{slices}?watch=true&sendInitialEvents=true"),
                None,
            ),
            Verb::WatchList,
            "resourceslices",
        ),
        (
            req(
                Method::PATCH,
                &format!("{slices}/a?fieldManager=m&force=true"),
                Some("application/apply-patch+yaml"),
            ),
            Verb::Apply,
            "resourceslices",
        ),
        (
            req(
                Method::PATCH,
                "/api/v1/namespaces/ns/pods/p/status",
                Some("application/merge-patch+json"),
            ),
            Verb::Patch,
            "pods/status",
        ),
        (
            req(Method::POST, "/api/v1/namespaces/ns/events", None),
            Verb::Create,
            "events",
        ),
        (
            req(Method::PUT, &format!("{slices}/a"), None),
            Verb::Update,
            "resourceslices",
        ),
        (
            req(Method::DELETE, &format!("{slices}/a"), None),
            Verb::Delete,
            "resourceslices",
        ),
        (
            req(Method::DELETE, slices, None),
            Verb::DeleteCollection,
            "resourceslices",
        ),
        (
            req(Method::GET, "/api/v1/namespaces/kube-system", None),
            Verb::Get,
            "namespaces",
        ),
        (req(Method::GET, "/version", None), Verb::Other, "/version"),
    ];
    for (r, verb, resource) in cases {
        assert_eq!(classify(&r), (verb, resource.to_owned()), "{}", r.uri());
    }
}

fn status(code: u16) -> http::Response<()> {
    http::Response::builder().status(code).body(()).unwrap()
}

#[tokio::test]
async fn the_layer_counts_and_clones_share_counts() {
    use tower::ServiceExt;

    let counter = RequestCounter::new();
    let svc = counter
        .layer()
        .layer(tower::service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(status(200))
        }));
    for _ in 0..2 {
        svc.clone()
            .oneshot(req(Method::GET, "/api/v1/nodes/n1", None))
            .await
            .unwrap();
    }
    let reader = counter.clone();
    assert_eq!(reader.get(Verb::Get, "nodes"), 2);
    assert_eq!(reader.get(Verb::List, "nodes"), 0);
    assert_eq!(
        reader.snapshot(),
        BTreeMap::from([((Verb::Get, "nodes".to_owned()), 2)])
    );
}

/// A 200, a 404 and a transport error are counted apart, each when it ends;
/// snapshot() and get() still sum over the codes.
#[tokio::test]
async fn requests_are_counted_by_status_code_when_they_end() {
    use tower::ServiceExt;

    let counter = RequestCounter::new();
    let svc = counter
        .layer()
        .layer(tower::service_fn(|r: Request<()>| async move {
            match r.uri().path() {
                "/api/v1/nodes/n1" => Ok(status(200)),
                "/api/v1/nodes/gone" => Ok(status(404)),
                _ => Err("connection refused"),
            }
        }));
    for path in ["/api/v1/nodes/n1", "/api/v1/nodes/gone", "/api/v1/nodes/n2"] {
        let pending = svc.clone().oneshot(req(Method::GET, path, None));
        let _ = pending.await;
    }
    assert_eq!(
        counter.snapshot_by_code(),
        BTreeMap::from([
            ((Verb::Get, "nodes".to_owned(), Code::Status(200)), 1),
            ((Verb::Get, "nodes".to_owned(), Code::Status(404)), 1),
            ((Verb::Get, "nodes".to_owned(), Code::Error), 1),
        ])
    );
    assert_eq!(counter.get(Verb::Get, "nodes"), 3);
    assert_eq!(counter.get_code(Verb::Get, "nodes", Code::Status(404)), 1);

    let text = {
        let mut r = prometheus_client::registry::Registry::with_prefix("t");
        r.register_collector(Box::new(counter.clone()));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        out
    };
    for line in [
        "t_api_requests_total{verb=\"get\",resource=\"nodes\",code=\"200\"} 1",
        "t_api_requests_total{verb=\"get\",resource=\"nodes\",code=\"404\"} 1",
        "t_api_requests_total{verb=\"get\",resource=\"nodes\",code=\"error\"} 1",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
}

/// Nothing is counted while the response is outstanding; a request given up on
/// (its future dropped, as a caller's timeout does) counts as `error`.
#[tokio::test]
async fn an_unanswered_request_counts_as_error_when_dropped() {
    let counter = RequestCounter::new();
    let mut svc = counter.layer().layer(tower::service_fn(|_: Request<()>| {
        std::future::pending::<Result<http::Response<()>, std::convert::Infallible>>()
    }));
    let mut fut = svc.call(req(Method::GET, "/api/v1/nodes/n1", None));
    let waker = std::task::Waker::noop();
    assert!(
        fut.as_mut()
            .poll(&mut Context::from_waker(waker))
            .is_pending()
    );
    assert_eq!(counter.get(Verb::Get, "nodes"), 0);
    drop(fut);
    assert_eq!(counter.get_code(Verb::Get, "nodes", Code::Error), 1);
}
