//! The leader's writes: NodeResourceTopology applies and deletes, coalesced per node
//! and retried with backoff, and Events on waiting pods, best effort.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::nrt;
use crate::pending::EVENT_REASON;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::Value;
use tokio::sync::mpsc;
use topodra_ops::backoff::Backoff;
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
use crate::state::Write;

/// The field manager of our server-side applies.
pub(crate) const FIELD_MANAGER: &str = "topodra-controller";

/// What the run loop sends.
#[derive(Debug)]
pub(crate) enum Command {
    Writes(Vec<Write>),
    /// Leadership lost: drop what is queued.
    Drop,
}

pub(crate) fn nrt_api(client: kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(nrt::GROUP, nrt::VERSION, nrt::KIND);
    Api::all_with(
        client,
        &ApiResource::from_gvk_with_plural(&gvk, nrt::PLURAL),
    )
}

#[derive(Debug, Clone, PartialEq)]
enum NrtOp {
    Apply(Value),
    Delete,
}

/// Runs until the command channel closes.
pub(crate) async fn run(
    client: kube::Client,
    instance: String,
    metrics: Arc<Metrics>,
    mut commands: mpsc::Receiver<Command>,
) {
    let api = nrt_api(client.clone());
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "topodra-controller".into(),
            instance: Some(instance),
        },
    );
    // Per node, the newest operation not yet done, and how many times it failed.
    let mut queue: BTreeMap<String, (NrtOp, u32)> = BTreeMap::new();
    // Failed writes are retried after 1 s, 2 s, 4 s ... up to a minute, jittered so
    // that replicas (and the nodes' plugins) do not retry in step after an outage.
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
    let mut retry_in: Option<Duration> = None;
    loop {
        let command = match retry_in {
            None => commands.recv().await,
            Some(wait) => match tokio::time::timeout(wait, commands.recv()).await {
                Ok(c) => c,
                Err(_) => {
                    retry_in = drain(&api, &metrics, &mut queue, &mut backoff).await;
                    continue;
                }
            },
        };
        match command {
            None => return,
            Some(Command::Drop) => {
                queue.clear();
                backoff.reset();
                retry_in = None;
            }
            Some(Command::Writes(writes)) => {
                for w in writes {
                    match w {
                        Write::ApplyNrt { node, object } => {
                            queue.insert(node, (NrtOp::Apply(object), 0));
                        }
                        Write::DeleteNrt { node } => {
                            queue.insert(node, (NrtOp::Delete, 0));
                        }
                        Write::PodEvent {
                            namespace,
                            name,
                            uid,
                            message,
                        } => {
                            pod_event(&recorder, &metrics, namespace, name, uid, message).await;
                        }
                    }
                }
                if retry_in.is_none() {
                    retry_in = drain(&api, &metrics, &mut queue, &mut backoff).await;
                }
            }
        }
    }
}

/// Performs the queued operations; returns when to retry the ones that failed.
async fn drain(
    api: &Api<DynamicObject>,
    metrics: &Metrics,
    queue: &mut BTreeMap<String, (NrtOp, u32)>,
    backoff: &mut Backoff,
) -> Option<Duration> {
    let mut failed: BTreeMap<String, (NrtOp, u32)> = BTreeMap::new();
    for (node, (op, failures)) in std::mem::take(queue) {
        let result = match &op {
            NrtOp::Apply(object) => {
                let params = PatchParams::apply(FIELD_MANAGER).force();
                api.patch(&node, &params, &Patch::Apply(object))
                    .await
                    .map(|_| ())
            }
            NrtOp::Delete => match api.delete(&node, &DeleteParams::default()).await {
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                r => r.map(|_| ()),
            },
        };
        let operation = if matches!(op, NrtOp::Apply(_)) {
            "apply"
        } else {
            "delete"
        };
        metrics.write(operation, result.is_ok());
        match result {
            Ok(()) => debug!(node, operation, "NodeResourceTopology written"),
            Err(e) => {
                warn!(node, operation, error = %e, failures = failures.saturating_add(1), "writing the NodeResourceTopology failed; will retry");
                failed.insert(node, (op, failures.saturating_add(1)));
            }
        }
    }
    if failed.is_empty() {
        backoff.reset();
        return None;
    }
    *queue = failed;
    Some(backoff.next_delay())
}

async fn pod_event(
    recorder: &Recorder,
    metrics: &Metrics,
    namespace: String,
    name: String,
    uid: String,
    message: String,
) {
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.clone()),
        name: Some(name.clone()),
        uid: Some(uid),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: EVENT_REASON.into(),
        note: Some(message.clone()),
        action: "Explain".into(),
        secondary: None,
    };
    let result = recorder.publish(&event, &reference).await;
    metrics.write("event", result.is_ok());
    match result {
        Ok(()) => info!(namespace, pod = name, message, "explained a waiting pod"),
        Err(e) => {
            warn!(namespace, pod = name, error = %e, "could not record an Event on a waiting pod")
        }
    }
}
