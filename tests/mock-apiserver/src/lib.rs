//! A stand-in for the parts of the Kubernetes API server a DRA kubelet plugin talks
//! to, for tests and benchmarks.
//!
//! One [`MockApi`] holds the state and answers the requests; it is reached either in
//! process, through [`MockApi::client`] or [`MockApi::service`] (no sockets, so it
//! runs on tokio's paused clock and simulated time), or over loopback HTTP, through
//! [`MockApiServer`] and a kubeconfig (for tests of the plugin binary).
//!
//! It knows Nodes (GET), ResourceClaims (GET), ResourceSlices (LIST, server-side apply,
//! DELETE with a uid precondition, and watches with `sendInitialEvents` or resumed
//! from a resourceVersion, filtered by field selector and ended after
//! `timeoutSeconds`), and Events (POST). It behaves like kube-apiserver where a
//! publisher can tell: writes are echoed on open watches, an apply that changes
//! nothing keeps the resourceVersion and sends no event, the server sets metadata
//! (uid, resourceVersion, managedFields, creationTimestamp) and defaults a taint's
//! timeAdded. Every request is recorded, with its time on tokio's clock; requests can
//! be made to fail (connection errors, 500 on applies, 503 on everything), and claim
//! GETs slowed down with their concurrency measured. It is no substitute for a real
//! API server: no validation, no admission, no field ownership; the end-to-end suite
//! runs the real one.

mod handle;
mod server;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

pub use server::{MockApiServer, write_kubeconfig};

/// The ResourceSlice collection's path.
pub const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// The error of the in-process service: what a failed connection looks like.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response body of both transports.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub method: Method,
    pub path: String,
    /// Query parameters, percent-decoded.
    pub query: BTreeMap<String, String>,
    pub content_type: Option<String>,
    /// The body, when it is JSON.
    pub body: Option<Value>,
    /// Time since the mock was made, on tokio's clock (simulated when paused).
    pub at: Duration,
}

impl Recorded {
    /// Whether the query has `key=value` (value `*` matches any).
    pub fn has(&self, key: &str, value: &str) -> bool {
        self.query
            .get(key)
            .is_some_and(|v| value == "*" || v == value)
    }

    pub fn is_watch(&self) -> bool {
        self.has("watch", "true") || self.has("watch", "1")
    }

    /// A LIST of ResourceSlices (a GET of the collection that is no watch).
    pub fn is_slice_list(&self) -> bool {
        self.method == Method::GET && self.path == SLICES && !self.is_watch()
    }

    /// A server-side apply of a ResourceSlice.
    pub fn is_apply(&self) -> bool {
        self.method == Method::PATCH && self.path.starts_with(SLICES)
    }

    /// A POST of a new slice (`generateName`).
    pub fn is_create(&self) -> bool {
        self.method == Method::POST && self.path == SLICES
    }

    pub fn is_delete(&self) -> bool {
        self.method == Method::DELETE
    }
}

#[derive(Debug, Clone)]
struct WatchEvent {
    kind: &'static str,
    object: Value,
    rv: u64,
}

/// An open watch: the field selector it asked for and where its events go.
#[derive(Debug)]
struct Watcher {
    selector: Vec<(String, String)>,
    tx: mpsc::UnboundedSender<Bytes>,
}

#[derive(Debug)]
struct State {
    start: Instant,
    rv: u64,
    nodes: BTreeMap<String, Value>,
    claims: BTreeMap<(String, String), Value>,
    slices: BTreeMap<String, Value>,
    events_posted: Vec<Value>,
    requests: Vec<Recorded>,
    /// Every slice event, for watches resumed from a resourceVersion.
    history: Vec<WatchEvent>,
    watchers: Vec<Watcher>,
    /// Requests to fail with a connection error, whatever they are.
    unreachable: usize,
    /// Slice writes (applies and creates) to answer with 500.
    failing_applies: usize,
    /// Names made from `generateName` so far.
    generated: u64,
    /// Answer every request with 503 (an API server that is up but failing).
    failing: bool,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Claim GETs being answered right now, and the most there ever were at once.
    claim_gets_in_flight: AtomicUsize,
    claim_gets_peak: AtomicUsize,
    /// How long each claim GET takes, so that concurrent ones overlap.
    claim_get_delay_us: AtomicU64,
}

/// The mock API server's state, and the answers to requests. Cloning shares it.
#[derive(Debug, Clone)]
pub struct MockApi {
    shared: Arc<Shared>,
}

impl Default for MockApi {
    fn default() -> Self {
        Self::new()
    }
}

impl MockApi {
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    start: Instant::now(),
                    rv: 100,
                    nodes: BTreeMap::new(),
                    claims: BTreeMap::new(),
                    slices: BTreeMap::new(),
                    events_posted: Vec::new(),
                    requests: Vec::new(),
                    history: Vec::new(),
                    watchers: Vec::new(),
                    unreachable: 0,
                    failing_applies: 0,
                    generated: 0,
                    failing: false,
                }),
                claim_gets_in_flight: AtomicUsize::new(0),
                claim_gets_peak: AtomicUsize::new(0),
                claim_get_delay_us: AtomicU64::new(0),
            }),
        }
    }

    /// The mock as a service for kube's client stack, so a caller can add layers
    /// (request counting) before [`kube::Client::new`].
    pub fn service<B>(&self) -> tower::util::BoxCloneService<Request<B>, Response<Body>, BoxError>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let mock = self.clone();
        tower::util::BoxCloneService::new(tower::service_fn(move |req: Request<B>| {
            let mock = mock.clone();
            async move {
                let (parts, body) = req.into_parts();
                let body = body.collect().await.map_err(Into::into)?.to_bytes();
                mock.handle(parts, body).await
            }
        }))
    }

    /// A kube client whose requests this mock answers, in process.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.service::<kube::client::Body>(), "default")
    }

    pub fn add_node(&self, name: &str, uid: &str) {
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": uid, "resourceVersion": "7"}});
        self.lock().nodes.insert(name.to_owned(), node);
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
        self.lock().claims.insert((ns, name), claim);
    }

    /// Removes a claim, as deleting it in a real cluster would.
    pub fn delete_claim(&self, namespace: &str, name: &str) {
        self.lock()
            .claims
            .remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// Slices that exist before the plugin starts, stored as the server would.
    pub fn seed<T: serde::Serialize>(&self, slices: &[T]) {
        let mut s = self.lock();
        for slice in slices {
            let mut v = serde_json::to_value(slice).unwrap_or_default();
            s.rv += 1;
            let rv = s.rv;
            let name = v["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            v["metadata"]["resourceVersion"] = json!(rv.to_string());
            v["metadata"]["uid"] = json!(format!("uid-{name}-{rv}"));
            handle::default_taints(&mut v);
            s.slices.insert(name, v);
        }
    }

    /// The stored slices.
    pub fn slices(&self) -> Vec<Value> {
        self.lock().slices.values().cloned().collect()
    }

    /// The stored slices by name.
    pub fn stored(&self) -> BTreeMap<String, Value> {
        self.lock().slices.clone()
    }

    /// Deletes a slice behind the plugin's back, as the kubelet does when the plugin
    /// has been gone too long.
    pub fn wipe(&self, name: &str) {
        let mut s = self.lock();
        if let Some(object) = s.slices.remove(name) {
            s.deleted(object);
        }
    }

    /// Deletes every slice, as the kubelet does when a plugin is gone for 30 s.
    pub fn wipe_slices(&self) {
        let mut s = self.lock();
        for object in std::mem::take(&mut s.slices).into_values() {
            s.deleted(object);
        }
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> String {
        self.lock().rv.to_string()
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    pub fn events_posted(&self) -> Vec<Value> {
        self.lock().events_posted.clone()
    }

    /// Fails the next `requests` requests, whatever they are, as a refused
    /// connection.
    pub fn make_unreachable_for(&self, requests: usize) {
        self.lock().unreachable = requests;
    }

    /// Answers the next `n` applies with 500.
    pub fn fail_applies(&self, n: usize) {
        self.lock().failing_applies = n;
    }

    /// Answers every request with 503 while `failing`.
    pub fn set_failing(&self, failing: bool) {
        self.lock().failing = failing;
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

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl State {
    /// Records a slice's deletion: a new resourceVersion and a DELETED event.
    fn deleted(&mut self, mut object: Value) -> Value {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.emit("DELETED", object.clone());
        object
    }

    fn emit(&mut self, kind: &'static str, object: Value) {
        let ev = WatchEvent {
            kind,
            object,
            rv: self.rv,
        };
        let line = event_line(ev.kind, &ev.object);
        self.watchers
            .retain(|w| !matches(&ev.object, &w.selector) || w.tx.send(line.clone()).is_ok());
        self.history.push(ev);
    }
}

/// `spec.nodeName=a,spec.driver=b` as pairs.
fn field_selector(query: &BTreeMap<String, String>) -> Vec<(String, String)> {
    query
        .get("fieldSelector")
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

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

/// The query string as decoded pairs.
fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (percent_decode(k), percent_decode(v)))
        .collect()
}

/// `application/x-www-form-urlencoded` decoding: `%XX` escapes and `+` for space.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_decoded() {
        let q = parse_query(
            "fieldSelector=spec.nodeName%3Dn%2Cspec.driver%3Dd&watch=true&x=a+b&bad=%zz&end=%4",
        );
        assert_eq!(q["fieldSelector"], "spec.nodeName=n,spec.driver=d");
        assert_eq!(q["watch"], "true");
        assert_eq!(q["x"], "a b");
        assert_eq!(q["bad"], "%zz");
        assert_eq!(q["end"], "%4");
        assert_eq!(percent_decode("%41"), "A");
    }
}
