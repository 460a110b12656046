//! A mocked API server for request-shape tests: it records every request and answers
//! the few the publisher makes (Node GET, ResourceSlice watch, apply and delete) the
//! way kube-apiserver does, including the parts that matter to the publisher: echoes
//! of writes on open watches, no new resourceVersion for an apply that changes
//! nothing, server-set metadata, a defaulted field, and watches that end after
//! `timeoutSeconds`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tower::BoxError;

use super::RequestCounter;

pub(super) const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

type Body = UnsyncBoxBody<Bytes, BoxError>;

#[derive(Debug, Clone)]
pub(super) struct Recorded {
    pub(super) method: Method,
    pub(super) path: String,
    pub(super) query: BTreeMap<String, String>,
    pub(super) content_type: Option<String>,
    pub(super) body: Option<Value>,
    /// Simulated time since the mock was made.
    pub(super) at: Duration,
}

impl Recorded {
    pub(super) fn is_watch(&self) -> bool {
        self.query.get("watch").map(String::as_str) == Some("true")
    }

    pub(super) fn is_slice_list(&self) -> bool {
        self.method == Method::GET && self.path == SLICES && !self.is_watch()
    }

    pub(super) fn is_apply(&self) -> bool {
        self.method == Method::PATCH && self.path.starts_with(SLICES)
    }

    pub(super) fn is_delete(&self) -> bool {
        self.method == Method::DELETE
    }
}

#[derive(Debug, Clone)]
pub(super) struct MockApi {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    node_name: String,
    node_uid: String,
    start: Instant,
    requests: Vec<Recorded>,
    /// Requests to fail with a connection error, whatever they are.
    unreachable: usize,
    /// Applies to answer with 500.
    failing_applies: usize,
    store: BTreeMap<String, Value>,
    rv: u64,
    watchers: Vec<mpsc::UnboundedSender<Bytes>>,
}

impl MockApi {
    pub(super) fn new(node_name: &str, node_uid: &str) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                node_name: node_name.to_owned(),
                node_uid: node_uid.to_owned(),
                start: Instant::now(),
                requests: Vec::new(),
                unreachable: 0,
                failing_applies: 0,
                store: BTreeMap::new(),
                rv: 100,
                watchers: Vec::new(),
            })),
        }
    }

    /// A kube client whose requests this mock answers, counted by `counter`.
    pub(super) fn client(&self, counter: &RequestCounter) -> kube::Client {
        let mock = self.clone();
        let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
            let mock = mock.clone();
            async move { mock.handle(req).await }
        });
        kube::Client::new(tower::Layer::layer(&counter.layer(), svc), "default")
    }

    /// Slices that exist before the publisher starts.
    pub(super) fn seed(&self, slices: &[ResourceSlice]) {
        let mut inner = self.lock();
        for s in slices {
            let mut v = serde_json::to_value(s).unwrap_or_default();
            inner.rv += 1;
            let rv = inner.rv;
            let name = v["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            v["metadata"]["resourceVersion"] = json!(rv.to_string());
            v["metadata"]["uid"] = json!(format!("uid-{name}-{rv}"));
            default_taints(&mut v);
            inner.store.insert(name, v);
        }
    }

    /// Deletes a slice behind the publisher's back, as the kubelet does when the
    /// plugin has been gone too long.
    pub(super) fn wipe(&self, name: &str) {
        let mut inner = self.lock();
        if let Some(mut obj) = inner.store.remove(name) {
            inner.rv += 1;
            obj["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
            inner.broadcast("DELETED", &obj);
        }
    }

    pub(super) fn make_unreachable_for(&self, requests: usize) {
        self.lock().unreachable = requests;
    }

    pub(super) fn fail_applies(&self, n: usize) {
        self.lock().failing_applies = n;
    }

    pub(super) fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    pub(super) fn resource_version(&self) -> String {
        self.lock().rv.to_string()
    }

    pub(super) fn stored(&self) -> BTreeMap<String, Value> {
        self.lock().store.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn handle(&self, req: Request<kube::client::Body>) -> Result<Response<Body>, BoxError> {
        let (parts, body) = req.into_parts();
        let bytes = body.collect().await?.to_bytes();
        let body: Option<Value> = (!bytes.is_empty())
            .then(|| serde_json::from_slice(&bytes))
            .transpose()?;
        let query: BTreeMap<String, String> = parts
            .uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), percent_decode(v)))
            .collect();
        let path = parts.uri.path().to_owned();
        let method = parts.method.clone();

        let mut inner = self.lock();
        let at = inner.start.elapsed();
        inner.requests.push(Recorded {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            body: body.clone(),
            at,
        });
        if inner.unreachable > 0 {
            inner.unreachable -= 1;
            return Err("connection refused".into());
        }

        let node_path = format!("/api/v1/nodes/{}", inner.node_name);
        let slice_name = path.strip_prefix(SLICES).and_then(|p| p.strip_prefix('/'));
        Ok(match (method, slice_name) {
            (Method::GET, _) if path == node_path => {
                let node = json!({
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": inner.node_name, "uid": inner.node_uid, "resourceVersion": "7"},
                });
                json_response(StatusCode::OK, &node)
            }
            (Method::GET, None)
                if path == SLICES && query.get("watch").map(String::as_str) == Some("true") =>
            {
                inner.watch(&query)
            }
            (Method::GET, None) if path == SLICES => {
                let items: Vec<Value> = inner.store.values().cloned().collect();
                let list = json!({
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSliceList",
                    "metadata": {"resourceVersion": inner.rv.to_string()},
                    "items": items,
                });
                json_response(StatusCode::OK, &list)
            }
            (Method::PATCH, Some(name)) => {
                if inner.failing_applies > 0 {
                    inner.failing_applies -= 1;
                    return Ok(status(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "etcdserver: leader changed",
                    ));
                }
                let manager = query.get("fieldManager").cloned().unwrap_or_default();
                inner.apply(name, body.unwrap_or_default(), &manager)
            }
            (Method::DELETE, Some(name)) => inner.delete(name, body.as_ref()),
            _ => status(StatusCode::NOT_FOUND, "not found"),
        })
    }
}

impl Inner {
    fn watch(&mut self, query: &BTreeMap<String, String>) -> Response<Body> {
        let (tx, rx) = mpsc::unbounded_channel();
        if query.get("sendInitialEvents").map(String::as_str) == Some("true") {
            for obj in self.store.values() {
                let _ = tx.send(event_line("ADDED", obj));
            }
            let bookmark = json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {
                    "resourceVersion": self.rv.to_string(),
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
                "spec": {"driver": "", "pool": {"name": "", "generation": 0, "resourceSliceCount": 0}},
            });
            let _ = tx.send(event_line("BOOKMARK", &bookmark));
        }
        self.watchers.push(tx);
        let timeout = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse().ok())
            .unwrap_or(1800);
        let deadline = Instant::now() + Duration::from_secs(timeout);
        let stream = futures::stream::unfold(rx, move |mut rx| async move {
            tokio::select! {
                line = rx.recv() => line.map(|l| (Ok::<_, BoxError>(Frame::data(l)), rx)),
                () = tokio::time::sleep_until(deadline) => None,
            }
        });
        Response::builder()
            .status(StatusCode::OK)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(StreamBody::new(stream).boxed_unsync())
            .unwrap_or_default()
    }

    fn apply(&mut self, name: &str, mut obj: Value, manager: &str) -> Response<Body> {
        let existing = self.store.get(name).cloned();
        default_taints(&mut obj);
        let meta = &mut obj["metadata"];
        meta["managedFields"] =
            json!([{"manager": manager, "operation": "Apply", "apiVersion": "resource.k8s.io/v1"}]);
        meta["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        match &existing {
            Some(old) => {
                meta["uid"] = old["metadata"]["uid"].clone();
                meta["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
                if *old == obj {
                    // Nothing changed: no new resourceVersion, no event.
                    return json_response(StatusCode::OK, &obj);
                }
            }
            None => meta["uid"] = json!(format!("uid-{name}-{}", self.rv + 1)),
        }
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.store.insert(name.to_owned(), obj.clone());
        let (kind, code) = match existing {
            Some(_) => ("MODIFIED", StatusCode::OK),
            None => ("ADDED", StatusCode::CREATED),
        };
        self.broadcast(kind, &obj);
        json_response(code, &obj)
    }

    fn delete(&mut self, name: &str, options: Option<&Value>) -> Response<Body> {
        let Some(obj) = self.store.get(name) else {
            return status(StatusCode::NOT_FOUND, "not found");
        };
        let want_uid = options.and_then(|o| o["preconditions"]["uid"].as_str());
        if want_uid.is_some_and(|uid| Some(uid) != obj["metadata"]["uid"].as_str()) {
            return status(StatusCode::CONFLICT, "precondition failed: uid");
        }
        let mut obj = obj.clone();
        self.store.remove(name);
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.broadcast("DELETED", &obj);
        json_response(StatusCode::OK, &obj)
    }

    fn broadcast(&mut self, kind: &str, obj: &Value) {
        let line = event_line(kind, obj);
        self.watchers.retain(|w| w.send(line.clone()).is_ok());
    }
}

/// What kube-apiserver defaults in a ResourceSlice: a taint's timeAdded.
fn default_taints(obj: &mut Value) {
    let Some(devices) = obj["spec"]["devices"].as_array_mut() else {
        return;
    };
    for d in devices {
        for t in d["taints"].as_array_mut().into_iter().flatten() {
            if t.get("timeAdded").is_none() {
                t["timeAdded"] = json!("2026-01-01T00:00:00Z");
            }
        }
    }
}

fn event_line(kind: &str, obj: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(
            Full::new(Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .unwrap_or_default()
}

fn status(code: StatusCode, message: &str) -> Response<Body> {
    let reason = code.canonical_reason().unwrap_or("").replace(' ', "");
    json_response(
        code,
        &json!({
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code.as_u16(),
        }),
    )
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
