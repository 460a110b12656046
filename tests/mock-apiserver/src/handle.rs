//! Answering one request, whichever transport brought it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::{
    Body, BoxError, MockApi, Recorded, Shared, State, Watcher, event_line, field_selector, matches,
    parse_query,
};

/// Counts one claim GET as in flight until dropped.
struct InFlight<'a>(&'a Shared);

impl<'a> InFlight<'a> {
    fn enter(shared: &'a Shared) -> Self {
        let now = shared.claim_gets_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.claim_gets_peak.fetch_max(now, Ordering::SeqCst);
        Self(shared)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.claim_gets_in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl MockApi {
    pub(crate) async fn handle(
        &self,
        parts: http::request::Parts,
        body: Bytes,
    ) -> Result<Response<Body>, BoxError> {
        let query = parse_query(parts.uri.query().unwrap_or_default());
        let path = parts.uri.path().to_owned();
        let method = parts.method.clone();
        let json_body: Option<Value> = serde_json::from_slice(&body).ok();
        {
            let mut s = self.lock();
            let at = s.start.elapsed();
            s.requests.push(Recorded {
                method: method.clone(),
                path: path.clone(),
                query: query.clone(),
                content_type: parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
                body: json_body.clone(),
                at,
            });
            if s.unreachable > 0 {
                s.unreachable -= 1;
                return Err("connection refused".into());
            }
            if s.failing {
                return Ok(status(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "mock API server is failing",
                ));
            }
        }

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
        let _in_flight = claim_get.then(|| InFlight::enter(&self.shared));
        if claim_get {
            let delay =
                Duration::from_micros(self.shared.claim_get_delay_us.load(Ordering::SeqCst));
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        }

        let mut s = self.lock();
        Ok(match (method.clone(), parts.as_slice()) {
            (Method::GET, ["api", "v1", "nodes", name]) => match s.nodes.get(*name) {
                Some(n) => json_response(StatusCode::OK, n),
                None => status(
                    StatusCode::NOT_FOUND,
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
            ) => match s.claims.get(&((*ns).to_owned(), (*name).to_owned())) {
                Some(c) => json_response(StatusCode::OK, c),
                None => status(
                    StatusCode::NOT_FOUND,
                    &format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
                ),
            },
            (Method::GET, ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
                let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
                if watch {
                    s.watch(&query)
                } else {
                    let selector = field_selector(&query);
                    let items: Vec<&Value> = s
                        .slices
                        .values()
                        .filter(|o| matches(o, &selector))
                        .collect();
                    json_response(
                        StatusCode::OK,
                        &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                            "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
                    )
                }
            }
            (Method::GET, ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
                match s.slices.get(*name) {
                    Some(slice) => json_response(StatusCode::OK, slice),
                    None => status(
                        StatusCode::NOT_FOUND,
                        &format!("resourceslices.resource.k8s.io \"{name}\" not found"),
                    ),
                }
            }
            (Method::PATCH, ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
                if let Some(failed) = s.failing_write() {
                    return Ok(failed);
                }
                let Some(object) = json_body else {
                    return Ok(status(StatusCode::BAD_REQUEST, "apply body is not JSON"));
                };
                let manager = query.get("fieldManager").cloned().unwrap_or_default();
                s.apply(name, object, &manager)
            }
            (Method::POST, ["apis", "resource.k8s.io", "v1", "resourceslices"]) => {
                if let Some(failed) = s.failing_write() {
                    return Ok(failed);
                }
                let Some(object) = json_body else {
                    return Ok(status(StatusCode::BAD_REQUEST, "create body is not JSON"));
                };
                let manager = query.get("fieldManager").cloned().unwrap_or_default();
                s.create(object, &manager)
            }
            (Method::DELETE, ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
                s.delete(name, json_body.as_ref())
            }
            (Method::POST, ["apis", "events.k8s.io", "v1", "namespaces", _, "events"])
            | (Method::POST, ["api", "v1", "namespaces", _, "events"]) => {
                let object = json_body.unwrap_or(Value::Null);
                s.events_posted.push(object.clone());
                json_response(StatusCode::CREATED, &object)
            }
            _ => status(
                StatusCode::NOT_FOUND,
                &format!("mock API server has no {method} {path}"),
            ),
        })
    }
}

impl State {
    /// A watch of slices: the initial events and a bookmark when asked for, else the
    /// events since the given resourceVersion; then every change, until
    /// `timeoutSeconds`.
    fn watch(&mut self, query: &BTreeMap<String, String>) -> Response<Body> {
        let selector = field_selector(query);
        let (tx, rx) = mpsc::unbounded_channel();
        if query.get("sendInitialEvents").map(String::as_str) == Some("true") {
            for obj in self.slices.values().filter(|o| matches(o, &selector)) {
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
        } else if let Some(since) = query
            .get("resourceVersion")
            .and_then(|v| v.parse::<u64>().ok())
        {
            for ev in self
                .history
                .iter()
                .filter(|e| e.rv > since && matches(&e.object, &selector))
            {
                let _ = tx.send(event_line(ev.kind, &ev.object));
            }
        }
        self.watchers.push(Watcher { selector, tx });
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

    /// Server-side apply, as far as a publisher can tell: server-set metadata, a
    /// defaulted field, and no new resourceVersion (nor event) when nothing changed.
    fn apply(&mut self, name: &str, mut obj: Value, manager: &str) -> Response<Body> {
        let existing = self.slices.get(name).cloned();
        default_taints(&mut obj);
        let meta = &mut obj["metadata"];
        meta["name"] = json!(name);
        meta["managedFields"] =
            json!([{"manager": manager, "operation": "Apply", "apiVersion": "resource.k8s.io/v1"}]);
        meta["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        match &existing {
            Some(old) => {
                meta["uid"] = old["metadata"]["uid"].clone();
                meta["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
                if *old == obj {
                    return json_response(StatusCode::OK, &obj);
                }
            }
            None => meta["uid"] = json!(format!("uid-{name}-{}", self.rv + 1)),
        }
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.slices.insert(name.to_owned(), obj.clone());
        let (kind, code) = match existing {
            Some(_) => ("MODIFIED", StatusCode::OK),
            None => ("ADDED", StatusCode::CREATED),
        };
        self.emit(kind, obj.clone());
        json_response(code, &obj)
    }

    /// A 500 for this write when writes are set to fail (`fail_applies`).
    fn failing_write(&mut self) -> Option<Response<Body>> {
        (self.failing_applies > 0).then(|| {
            self.failing_applies -= 1;
            status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "etcdserver: leader changed",
            )
        })
    }

    /// POST: a new slice, named by `metadata.generateName` plus a suffix as the API
    /// server makes them (5 characters from its alphabet), or by `metadata.name`;
    /// 409 when the name is taken.
    fn create(&mut self, obj: Value, manager: &str) -> Response<Body> {
        let name = match (
            obj["metadata"]["name"].as_str(),
            obj["metadata"]["generateName"].as_str(),
        ) {
            (Some(name), _) => name.to_owned(),
            (None, Some(prefix)) => {
                self.generated += 1;
                format!("{prefix}{}", generated_suffix(self.generated))
            }
            (None, None) => {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "metadata.name: Required value: name or generateName is required",
                );
            }
        };
        if self.slices.contains_key(&name) {
            return status(
                StatusCode::CONFLICT,
                &format!("resourceslices.resource.k8s.io \"{name}\" already exists"),
            );
        }
        self.apply(&name, obj, manager)
    }

    /// DELETE, honouring a uid precondition in the options.
    fn delete(&mut self, name: &str, options: Option<&Value>) -> Response<Body> {
        let Some(obj) = self.slices.get(name) else {
            return status(StatusCode::NOT_FOUND, "not found");
        };
        let want_uid = options.and_then(|o| o["preconditions"]["uid"].as_str());
        if want_uid.is_some_and(|uid| Some(uid) != obj["metadata"]["uid"].as_str()) {
            return status(StatusCode::CONFLICT, "precondition failed: uid");
        }
        let Some(obj) = self.slices.remove(name) else {
            return status(StatusCode::NOT_FOUND, "not found");
        };
        let obj = self.deleted(obj);
        json_response(StatusCode::OK, &obj)
    }
}

/// What kube-apiserver defaults in a ResourceSlice: a taint's timeAdded.
pub(crate) fn default_taints(obj: &mut Value) {
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

fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(
            Full::new(Bytes::from(v.to_string()))
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .unwrap_or_default()
}

/// A `Status` object, as the API server sends with every error.
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

/// The `n`th generated name suffix: five characters of the API server's alphabet
/// (`k8s.io/apimachinery/pkg/util/rand`: no vowels, no confusable digits), in a
/// fixed order so tests are reproducible.
fn generated_suffix(mut n: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let base = ALPHABET.len() as u64;
    (0..5)
        .map(|_| {
            let c = ALPHABET[(n % base) as usize] as char;
            n /= base;
            c
        })
        .collect()
}
