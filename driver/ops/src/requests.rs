//! Counting our own API requests by verb, resource and response status.
//!
//! The seed lesson is that control planes melt under LIST storms from node agents, so
//! the plugin counts what it sends, and the metrics module exports it: a LIST or a
//! WATCHLIST appearing in steady state is a bug to be seen, not guessed at. The status
//! code tells a server that throttles (429) or conflicts (409) from one that answers.
//!
//! The layer wraps the whole kube client stack, so it counts calls as the plugin makes
//! them; retries that kube's own stack performs on 429/503 are not counted twice. A
//! request is counted when its response arrives (for a watch: its headers, so a watch
//! is counted when it starts), or as `error` when none does.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use tower::{Layer, Service};

/// What a request does, in the API server's vocabulary (`apiserver_request_total`),
/// except that a streaming list (`sendInitialEvents=true`) is told apart from a
/// resumed watch: it costs the server a full read, like a LIST.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    Get,
    List,
    Watch,
    WatchList,
    Create,
    Update,
    /// A server-side apply patch.
    Apply,
    /// Any other patch (merge, strategic merge, JSON patch).
    Patch,
    Delete,
    DeleteCollection,
    Other,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
            Self::WatchList => "watchlist",
            Self::Create => "create",
            Self::Update => "update",
            Self::Apply => "apply",
            Self::Patch => "patch",
            Self::Delete => "delete",
            Self::DeleteCollection => "deletecollection",
            Self::Other => "other",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a request ended: the response's HTTP status, or no response at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Code {
    Status(u16),
    /// A transport error or a timeout below the layer, or a caller that gave up
    /// (dropped the request) before a response came.
    Error,
}

/// The `code` label: `200`, `404`, ..., or `error`.
impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Status(s) => write!(f, "{s}"),
            Self::Error => f.write_str("error"),
        }
    }
}

type Key = (Verb, String, Code);

/// Request counts shared between the client (which adds) and metrics (which read).
/// Cloning shares the counts.
#[derive(Debug, Clone, Default)]
pub struct RequestCounter {
    // A mutex is enough: a node agent sends a handful of requests a minute.
    counts: Arc<Mutex<BTreeMap<Key, u64>>>,
}

impl RequestCounter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts so far, keyed by verb and resource (`resourceslices`, `nodes`,
    /// `pods/status`; the path itself for non-resource URLs), whatever the response.
    pub fn snapshot(&self) -> BTreeMap<(Verb, String), u64> {
        let mut out = BTreeMap::new();
        for ((verb, resource, _), n) in self.lock().iter() {
            *out.entry((*verb, resource.clone())).or_insert(0) += n;
        }
        out
    }

    /// Counts so far, keyed by verb, resource and how the request ended.
    pub fn snapshot_by_code(&self) -> BTreeMap<(Verb, String, Code), u64> {
        self.lock().clone()
    }

    /// The count for one verb and resource, whatever the response.
    pub fn get(&self, verb: Verb, resource: &str) -> u64 {
        self.lock()
            .iter()
            .filter(|((v, r, _), _)| *v == verb && r == resource)
            .map(|(_, n)| n)
            .sum()
    }

    /// The count for one verb, resource and code.
    pub fn get_code(&self, verb: Verb, resource: &str, code: Code) -> u64 {
        self.lock()
            .get(&(verb, resource.to_owned(), code))
            .copied()
            .unwrap_or(0)
    }

    /// The layer that counts every request through the service it wraps.
    pub fn layer(&self) -> CountingLayer {
        CountingLayer {
            counter: self.clone(),
        }
    }

    /// Counts one request, classified as the API server would, that ended with `code`.
    pub fn record<B>(&self, req: &Request<B>, code: Code) {
        let (verb, resource) = classify(req);
        self.add((verb, resource, code));
    }

    fn add(&self, key: Key) {
        *self.lock().entry(key).or_insert(0) += 1;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, u64>> {
        // Counting never panics while holding the lock, and a count is still
        // meaningful after someone else's panic.
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A client whose requests are counted by `counter`, every one of them, sending
/// `user_agent` (`<program>/<version>`).
///
/// kube's own retry layer is turned off: it retries 429/503/504 up to 15 times from
/// 5 ms, below the counting layer and without the callers knowing, which multiplied
/// the load on a struggling API server while the request metric showed one call.
/// Each caller retries for itself instead, with jittered backoff and a floor: the
/// kubelet plugin's slice publisher and claim reads, and the controller's watches.
pub fn counted_client(
    mut config: kube::Config,
    counter: &RequestCounter,
    user_agent: &'static str,
) -> Result<kube::Client, kube::Error> {
    config.default_retry = false;
    // The API server's audit log and its metrics by client tell our components
    // apart by this, not by the ServiceAccount.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(user_agent),
    ));
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&counter.layer())
        .build())
}

/// Labels of `topodra_api_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ApiLabels {
    verb: &'static str,
    resource: String,
    code: String,
}

/// Exported as `api_requests_total{verb, resource, code}` (prefixed by the registry), read
/// from the counts at each scrape: the counter is the only record, nothing to keep in
/// step.
impl prometheus_client::collector::Collector for RequestCounter {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::MetricType;
        use prometheus_client::metrics::counter::ConstCounter;
        let mut family = encoder.encode_descriptor(
            "api_requests",
            "Requests to the Kubernetes API server by verb, resource and response status code (error: no response)",
            None,
            MetricType::Counter,
        )?;
        for ((verb, resource, code), n) in self.snapshot_by_code() {
            let labels = ApiLabels {
                verb: verb.as_str(),
                resource,
                code: code.to_string(),
            };
            ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// A tower layer for `kube::client::ClientBuilder::with_layer`.
#[derive(Debug, Clone)]
pub struct CountingLayer {
    counter: RequestCounter,
}

impl<S> Layer<S> for CountingLayer {
    type Service = CountingService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CountingService {
            inner,
            counter: self.counter.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct CountingService<S> {
    inner: S,
    counter: RequestCounter,
}

/// The future of a counted request. Boxed because naming the wrapping future would
/// take a pin-projection dependency, for a handful of requests a minute.
pub type CountingFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, B, RB> Service<Request<B>> for CountingService<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = CountingFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (verb, resource) = classify(&req);
        // Armed before the inner call: a request whose future is dropped unresolved
        // (the caller's timeout) still counts, as `error`.
        let pending = Pending {
            counter: self.counter.clone(),
            key: Some((verb, resource)),
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            pending.finish(match &res {
                Ok(resp) => Code::Status(resp.status().as_u16()),
                Err(_) => Code::Error,
            });
            res
        })
    }
}

/// A request sent and not counted yet; counted as `error` if dropped unfinished.
struct Pending {
    counter: RequestCounter,
    key: Option<(Verb, String)>,
}

impl Pending {
    fn finish(mut self, code: Code) {
        if let Some((verb, resource)) = self.key.take() {
            self.counter.add((verb, resource, code));
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some((verb, resource)) = self.key.take() {
            self.counter.add((verb, resource, Code::Error));
        }
    }
}

/// Verb and resource of a request to the API server.
pub fn classify<B>(req: &Request<B>) -> (Verb, String) {
    let query = req.uri().query().unwrap_or("");
    let param = |key: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .any(|(k, v)| k == key && (v == "true" || v == "1"))
    };
    let Some(target) = parse_path(req.uri().path()) else {
        return (Verb::Other, req.uri().path().to_owned());
    };
    let resource = match target.subresource {
        Some(sub) => format!("{}/{sub}", target.resource),
        None => target.resource.to_owned(),
    };
    let named = target.name.is_some();
    let verb = match *req.method() {
        Method::GET if named => Verb::Get,
        Method::GET if param("watch") && param("sendInitialEvents") => Verb::WatchList,
        Method::GET if param("watch") => Verb::Watch,
        Method::GET => Verb::List,
        Method::POST => Verb::Create,
        Method::PUT => Verb::Update,
        Method::PATCH if is_apply(req) => Verb::Apply,
        Method::PATCH => Verb::Patch,
        Method::DELETE if named => Verb::Delete,
        Method::DELETE => Verb::DeleteCollection,
        _ => Verb::Other,
    };
    (verb, resource)
}

fn is_apply<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/apply-patch"))
}

struct Target<'a> {
    resource: &'a str,
    name: Option<&'a str>,
    subresource: Option<&'a str>,
}

/// `/api/v1/...` or `/apis/<group>/<version>/...`, optionally namespaced.
fn parse_path(path: &str) -> Option<Target<'_>> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segs.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return None,
    };
    // `namespaces/<ns>/<resource>...` is namespaced; `namespaces[/<ns>]` alone is the
    // Namespace resource itself.
    let rest = match rest {
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail,
        _ => rest,
    };
    match rest {
        [resource] => Some(Target {
            resource,
            name: None,
            subresource: None,
        }),
        [resource, name] => Some(Target {
            resource,
            name: Some(name),
            subresource: None,
        }),
        [resource, name, sub, ..] => Some(Target {
            resource,
            name: Some(name),
            subresource: Some(sub),
        }),
        [] => None,
    }
}

#[cfg(test)]
mod tests;
