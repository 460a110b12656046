//! The leader's Events on waiting pods, best effort: one attempt each, since the next
//! change of a pod's explanation brings a new one. (NodeResourceTopology objects are
//! reconciled per node in `reconcile`.)

use std::sync::Arc;

use crate::pending::EVENT_REASON;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::metrics::Metrics;

/// An Event to record on a waiting pod.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PodEvent {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) message: String,
}

/// Runs until the channel closes.
pub(crate) async fn run(
    client: kube::Client,
    instance: String,
    metrics: Arc<Metrics>,
    mut events: mpsc::Receiver<Vec<PodEvent>>,
) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "topodra-controller".into(),
            instance: Some(instance),
        },
    );
    while let Some(batch) = events.recv().await {
        for e in batch {
            pod_event(&recorder, &metrics, e.namespace, e.name, e.uid, e.message).await;
        }
    }
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
