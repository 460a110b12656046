//! A stand-in for the parts of the Kubernetes API server the kubelet plugin talks to,
//! served over real HTTP on loopback, for integration tests and benchmarks.
//!
//! It knows Nodes (GET), ResourceClaims (GET), ResourceSlices (server-side apply,
//! DELETE, and watches with `sendInitialEvents`), and Events (POST). Every request is
//! logged so tests can assert the shape of the plugin's traffic, and claim GETs can be
//! slowed down and their concurrency measured, for tests of the plugin's fan-out. It is no substitute
//! for a real API server: no validation, no admission, no field management; the
//! end-to-end suite runs the real one.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub query: String,
}

impl Logged {
    /// Whether the query has `key=value` (value `*` matches any).
    pub fn has(&self, key: &str, value: &str) -> bool {
        self.query.split('&').any(|kv| match kv.split_once('=') {
            Some((k, v)) => k == key && (value == "*" || v == value),
            None => false,
        })
    }

    pub fn is_watch(&self) -> bool {
        self.has("watch", "true") || self.has("watch", "1")
    }
}

#[derive(Debug, Clone)]
struct WatchEvent {
    kind: &'static str,
    object: Value,
    rv: u64,
}

#[derive(Default)]
struct State {
    rv: u64,
    nodes: BTreeMap<String, Value>,
    claims: BTreeMap<(String, String), Value>,
    slices: BTreeMap<String, Value>,
    events_posted: Vec<Value>,
    log: Vec<Logged>,
    history: Vec<WatchEvent>,
    /// Answer every request with 503 (an API server that is up but failing).
    failing: bool,
}

struct Shared {
    state: Mutex<State>,
    events: broadcast::Sender<WatchEvent>,
    /// Claim GETs being answered right now, and the most there ever were at once.
    claim_gets_in_flight: AtomicUsize,
    claim_gets_peak: AtomicUsize,
    /// How long each claim GET takes, so that concurrent ones overlap.
    claim_get_delay_us: AtomicU64,
}

/// Counts one claim GET as in flight until dropped.
struct InFlight(Arc<Shared>);

impl InFlight {
    fn enter(shared: &Arc<Shared>) -> Self {
        let now = shared.claim_gets_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.claim_gets_peak.fetch_max(now, Ordering::SeqCst);
        Self(shared.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.claim_gets_in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn emit(&self, state: &mut State, kind: &'static str, object: Value) {
        let rv = state.rv;
        let ev = WatchEvent { kind, object, rv };
        state.history.push(ev.clone());
        let _ = self.events.send(ev);
    }
}

/// A running mock API server.
#[allow(missing_debug_implementations)]
pub struct MockApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

type Body = BoxBody<Bytes, Infallible>;

fn full(status: StatusCode, body: Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *r.status_mut() = status;
    if let Ok(v) = "application/json".parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    full(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
               "message": message, "code": code.as_u16()}),
    )
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                    16,
                ) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `spec.nodeName=a,spec.driver=b` as pairs.
fn field_selector(query: &str) -> Vec<(String, String)> {
    query_param(query, "fieldSelector")
        .map(|s| {
            s.split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

fn matches(object: &Value, selector: &[(String, String)]) -> bool {
    selector.iter().all(|(path, want)| {
        let mut v = object;
        for part in path.split('.') {
            v = &v[part];
        }
        v.as_str() == Some(want.as_str())
    })
}

fn event_json(ev: &WatchEvent) -> Bytes {
    let mut line = json!({"type": ev.kind, "object": ev.object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn bookmark(rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let mut line = json!({"type": "BOOKMARK", "object": {"kind": "ResourceSlice",
        "apiVersion": "resource.k8s.io/v1", "metadata": meta}})
    .to_string();
    line.push('\n');
    Bytes::from(line)
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or_default().to_owned();
    {
        let mut s = shared.lock();
        s.log.push(Logged {
            method: method.to_string(),
            path: path.clone(),
            query: query.clone(),
        });
        if s.failing {
            return Ok(status(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "mock API server is failing",
            ));
        }
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Ok(status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "unreadable body",
            ));
        }
    };
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let claim_get = method == Method::GET
        && matches!(
            parts.as_slice(),
            [
                "apis",
                "resource.k8s.io",
                "v1",
                "namespaces",
                _,
                "resourceclaims",
                _
            ]
        );
    let _in_flight = claim_get.then(|| InFlight::enter(&shared));
    if claim_get {
        let delay = Duration::from_micros(shared.claim_get_delay_us.load(Ordering::SeqCst));
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
    Ok(match (method.clone(), parts.as_slice()) {
        (Method::GET, ["api", "v1", "nodes", name]) => match shared.lock().nodes.get(*name) {
            Some(n) => full(StatusCode::OK, n.clone()),
            None => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("nodes \"{name}\" not found"),
            ),
        },
        (
            Method::GET,
            [
                "apis",
                "resource.k8s.io",
                "v1",
                "namespaces",
                ns,
                "resourceclaims",
                name,
            ],
        ) => {
            match shared
                .lock()
                .claims
                .get(&((*ns).to_owned(), (*name).to_owned()))
            {
                Some(c) => full(StatusCode::OK, c.clone()),
                None => status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
                ),
            }
        }
        (Method::GET, ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
            if query
                .split('&')
                .any(|kv| kv == "watch=true" || kv == "watch=1")
            {
                watch(shared, &query)
            } else {
                let s = shared.lock();
                let selector = field_selector(&query);
                let items: Vec<Value> = s
                    .slices
                    .values()
                    .filter(|o| matches(o, &selector))
                    .cloned()
                    .collect();
                full(
                    StatusCode::OK,
                    json!({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                           "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
                )
            }
        }
        (Method::PATCH, ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
            let Ok(mut object) = serde_json::from_slice::<Value>(&body) else {
                return Ok(status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "apply body is not JSON",
                ));
            };
            let mut s = shared.lock();
            s.rv += 1;
            let existed = s.slices.contains_key(*name);
            let uid = s.slices.get(*name).map_or_else(
                || format!("uid-{name}"),
                |o| o["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
            );
            object["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            object["metadata"]["uid"] = json!(uid);
            object["metadata"]["name"] = json!(name);
            s.slices.insert((*name).to_owned(), object.clone());
            shared.emit(
                &mut s,
                if existed { "MODIFIED" } else { "ADDED" },
                object.clone(),
            );
            full(
                if existed {
                    StatusCode::OK
                } else {
                    StatusCode::CREATED
                },
                object,
            )
        }
        (Method::DELETE, ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
            let mut s = shared.lock();
            match s.slices.remove(*name) {
                Some(mut object) => {
                    s.rv += 1;
                    object["metadata"]["resourceVersion"] = json!(s.rv.to_string());
                    shared.emit(&mut s, "DELETED", object.clone());
                    full(StatusCode::OK, object)
                }
                None => status(StatusCode::NOT_FOUND, "NotFound", "not found"),
            }
        }
        (Method::POST, ["apis", "events.k8s.io", "v1", "namespaces", _, "events"])
        | (Method::POST, ["api", "v1", "namespaces", _, "events"]) => {
            let object: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            shared.lock().events_posted.push(object.clone());
            full(StatusCode::CREATED, object)
        }
        _ => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("mock API server has no {method} {path}"),
        ),
    })
}

fn watch(shared: Arc<Shared>, query: &str) -> Response<Body> {
    let selector = field_selector(query);
    let initial = query_param(query, "sendInitialEvents").as_deref() == Some("true");
    let since: Option<u64> = query_param(query, "resourceVersion").and_then(|v| v.parse().ok());
    let (mut first, rx) = {
        let s = shared.lock();
        let mut first: Vec<Bytes> = Vec::new();
        if initial {
            for o in s.slices.values().filter(|o| matches(o, &selector)) {
                first.push(event_json(&WatchEvent {
                    kind: "ADDED",
                    object: o.clone(),
                    rv: s.rv,
                }));
            }
            first.push(bookmark(s.rv, true));
        } else if let Some(since) = since {
            for ev in s
                .history
                .iter()
                .filter(|e| e.rv > since && matches(&e.object, &selector))
            {
                first.push(event_json(ev));
            }
        }
        (first, shared.events.subscribe())
    };
    let live = BroadcastStream::new(rx).filter_map(move |ev| {
        let selector = selector.clone();
        async move {
            match ev {
                Ok(ev) if matches(&ev.object, &selector) => Some(event_json(&ev)),
                _ => None,
            }
        }
    });
    let head = futures::stream::iter(std::mem::take(&mut first));
    let stream = head
        .chain(live)
        .map(|b| Ok::<_, Infallible>(Frame::data(b)));
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    if let Ok(v) = "application/json".parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

impl MockApiServer {
    /// Starts on a random loopback port.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on("127.0.0.1:0".parse().map_err(std::io::Error::other)?).await
    }

    /// Starts on `addr`, e.g. the port of a server that was stopped, to bring "the API
    /// server" back.
    pub async fn start_on(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (events, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                rv: 1,
                ..Default::default()
            }),
            events,
            claim_gets_in_flight: AtomicUsize::new(0),
            claim_gets_peak: AtomicUsize::new(0),
            claim_get_delay_us: AtomicU64::new(0),
        });
        let serving = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = serving.clone();
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |req| handle(shared.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, shared, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening and drops every connection (watches included).
    pub fn stop(self) {
        self.task.abort();
    }

    /// Writes a kubeconfig for this server into `dir` and returns its path.
    pub fn kubeconfig(&self, dir: &Path) -> std::io::Result<PathBuf> {
        write_kubeconfig(dir, self.addr)
    }

    pub fn add_node(&self, name: &str, uid: &str) {
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": uid, "resourceVersion": "1"}});
        self.shared.lock().nodes.insert(name.to_owned(), node);
    }

    /// Stores a claim object (any JSON with metadata.namespace and metadata.name).
    pub fn put_claim(&self, claim: Value) {
        let ns = claim["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let name = claim["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        self.shared.lock().claims.insert((ns, name), claim);
    }

    /// Removes a claim, as deleting it in a real cluster would.
    pub fn delete_claim(&self, namespace: &str, name: &str) {
        self.shared
            .lock()
            .claims
            .remove(&(namespace.to_owned(), name.to_owned()));
    }

    pub fn slices(&self) -> Vec<Value> {
        self.shared.lock().slices.values().cloned().collect()
    }

    /// Deletes every slice, as the kubelet does when a plugin is gone for 30 s.
    pub fn wipe_slices(&self) {
        let shared = &self.shared;
        let mut s = shared.lock();
        let names: Vec<String> = s.slices.keys().cloned().collect();
        for name in names {
            if let Some(mut object) = s.slices.remove(&name) {
                s.rv += 1;
                object["metadata"]["resourceVersion"] = json!(s.rv.to_string());
                shared.emit(&mut s, "DELETED", object);
            }
        }
    }

    /// Makes every claim GET take `delay` before it is answered.
    pub fn set_claim_get_delay(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.claim_get_delay_us.store(us, Ordering::SeqCst);
    }

    /// The most claim GETs that were being answered at the same time.
    pub fn claim_gets_peak(&self) -> usize {
        self.shared.claim_gets_peak.load(Ordering::SeqCst)
    }

    /// Starts measuring [`Self::claim_gets_peak`] afresh.
    pub fn reset_claim_gets_peak(&self) {
        self.shared.claim_gets_peak.store(0, Ordering::SeqCst);
    }

    pub fn set_failing(&self, failing: bool) {
        self.shared.lock().failing = failing;
    }

    pub fn requests(&self) -> Vec<Logged> {
        self.shared.lock().log.clone()
    }

    pub fn events_posted(&self) -> Vec<Value> {
        self.shared.lock().events_posted.clone()
    }
}

/// A kubeconfig pointing at `addr` over plain HTTP.
pub fn write_kubeconfig(dir: &Path, addr: SocketAddr) -> std::io::Result<PathBuf> {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: mock\n  cluster:\n    server: http://{addr}\n\
         users:\n- name: mock\n  user: {{}}\ncontexts:\n- name: mock\n  context:\n    cluster: mock\n    user: mock\n\
         current-context: mock\n"
    );
    std::fs::write(&path, text)?;
    Ok(path)
}
