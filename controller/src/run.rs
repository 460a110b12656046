//! Wiring: the API client, the endpoint, leadership, the watches, and the loop that
//! feeds the state and hands its planned writes to the writer.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use futures::stream::{BoxStream, SelectAll};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector;
use kube::runtime::watcher::{self, watcher};
use tokio::sync::mpsc;
use tokio::time::Instant;
use topodra_model::capacity::Finding;
use topodra_ops::bounded::Bounded;
use topodra_ops::endpoint::Endpoint;
use topodra_ops::http::Endpoints;
use topodra_ops::requests::{RequestCounter, counted_client};
use tracing::{info, warn};

use crate::Args;
use crate::budget::{NodeInterval, WriteBudget};
use crate::leader::{Leadership, LeaseConfig};
use crate::metrics::Metrics;
use crate::nrt::{self, NrtOptions};
use crate::reconcile::{self, Reconciler};
use crate::state::{Input, Kind, State, Write};
use crate::writer::{self, PodEvent};

/// How the API server's audit log and metrics name this program.
const USER_AGENT: &str = concat!("topodra-controller/", env!("CARGO_PKG_VERSION"));

type Inputs = SelectAll<BoxStream<'static, Result<Input, (Kind, watcher::Error)>>>;

pub(crate) async fn run(cli: Args) -> Result<()> {
    let requests = RequestCounter::new();
    let config = kube::Config::infer()
        .await
        .context("finding the API server (kubeconfig or in-cluster)")?;
    let client =
        counted_client(config, &requests, USER_AGENT).context("building the API client")?;
    let metrics = Arc::new(Metrics::new(&requests).with_nrt_pacing(
        Duration::from_millis(cli.write_delay_milliseconds),
        Duration::from_secs(cli.nrt_node_interval_seconds),
        cli.nrt_writes_per_second,
    ));

    // Readiness: every watch has delivered its initial state.
    let unsynced: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(vec!["starting".into()]));
    let endpoints = Endpoints {
        metrics: {
            let m = metrics.clone();
            Arc::new(move || m.encode())
        },
        live: topodra_ops::http::always_ok(),
        ready: {
            let unsynced = unsynced.clone();
            Arc::new(move || {
                let waiting = unsynced
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                Box::pin(async move {
                    if waiting.is_empty() {
                        Ok(())
                    } else {
                        Err(format!(
                            "waiting for the initial state of: {}",
                            waiting.join(", ")
                        ))
                    }
                })
            })
        },
        rejected: {
            let m = metrics.clone();
            Arc::new(move || m.connection_rejected())
        },
    };
    let http = Endpoint::start(&cli.http, endpoints).await?;

    // What the server serves decides what to watch: DeviceTaintRules and the
    // NodeResourceTopology CRD are optional.
    let taint_rules = served(&client, "resource.k8s.io/v1", "devicetaintrules").await;
    if !taint_rules {
        warn!(
            "resource.k8s.io/v1 DeviceTaintRules are not served; GPUs are judged by their slices' taints only"
        );
    }
    let nrt_enabled = cli.node_resource_topology
        && served(
            &client,
            &format!("{}/{}", nrt::GROUP, nrt::VERSION),
            nrt::PLURAL,
        )
        .await;
    if cli.node_resource_topology && !nrt_enabled {
        warn!(
            "the NodeResourceTopology CRD ({}/{}) is not installed; not publishing NodeResourceTopology objects",
            nrt::GROUP,
            nrt::VERSION
        );
    }

    let identity = cli
        .identity
        .clone()
        .or_else(hostname)
        .unwrap_or_else(|| "topodra-controller".into());
    let mut leadership = if cli.leader_elect {
        let lease = LeaseConfig {
            namespace: cli.lease_namespace.clone(),
            name: cli.lease_name.clone(),
            identity: identity.clone(),
            duration_seconds: cli.lease_duration_seconds,
            grace_seconds: cli.lease_renew_before_seconds,
        };
        Leadership::elect(client.clone(), &lease).await?
    } else {
        Leadership::sole()
    };

    let mut watched: BTreeSet<Kind> = BTreeSet::from([
        Kind::Slices,
        Kind::Claims,
        Kind::Classes,
        Kind::Nodes,
        Kind::Pods,
    ]);
    // The Nodes' metadata, kept by the library's reflector: the store the per-node
    // reconciler reads its objects from.
    let (nodes, node_writer) = reflector::store();
    let mut inputs = inputs(&client, &cli.driver_name, &metrics, node_writer);
    if !cli.cpu_driver_name.is_empty() {
        watched.insert(Kind::CpuSlices);
        inputs.push(bounded::<ResourceSlice>(
            &client,
            watcher::Config::default().fields(&format!("spec.driver={}", cli.cpu_driver_name)),
            Input::CpuSlice,
            Kind::CpuSlices,
            &metrics,
        ));
    }
    if taint_rules {
        watched.insert(Kind::TaintRules);
        inputs.push(bounded::<DeviceTaintRule>(
            &client,
            watcher::Config::default(),
            Input::TaintRule,
            Kind::TaintRules,
            &metrics,
        ));
    }
    if nrt_enabled {
        watched.insert(Kind::Nrts);
        let selector = format!(
            "{}={}",
            topodra_model::slice::MANAGED_BY_LABEL,
            topodra_model::slice::MANAGED_BY
        );
        inputs.push(stream(
            nrt_api(client.clone()),
            watcher::Config::default().labels(&selector),
            Input::Nrt,
            Kind::Nrts,
        ));
    }

    let (events, events_rx) = mpsc::channel(64);
    let writer = tokio::spawn(writer::run(
        client.clone(),
        identity,
        metrics.clone(),
        events_rx,
    ));

    let opts = NrtOptions {
        resource_name: cli.nrt_resource_name.clone(),
        policy: cli.nrt_topology_manager_policy.clone(),
        scope: cli.nrt_topology_manager_scope.clone(),
    };
    let aliases: Vec<String> = cli
        .numa_node_aliases
        .iter()
        .map(ToString::to_string)
        .collect();
    let state = Arc::new(Mutex::new(
        State::new(&cli.driver_name, cli.device_classes.clone())
            .with_cpu_driver(&cli.cpu_driver_name, &aliases),
    ));
    let delay = Duration::from_millis(cli.write_delay_milliseconds);
    let (triggers, triggers_rx) = mpsc::unbounded_channel();
    let reconciler = nrt_enabled.then(|| {
        let ctx = Arc::new(Reconciler::new(
            nrt_api(client.clone()),
            state.clone(),
            opts,
            leadership.is_leader.clone(),
            WriteBudget::per_second(cli.nrt_writes_per_second),
            NodeInterval::new(Duration::from_secs(cli.nrt_node_interval_seconds)),
            metrics.clone(),
        ));
        tokio::spawn(reconcile::run(ctx, nodes.clone(), triggers_rx, delay))
    });
    let min_interval = Duration::from_secs(cli.pending_event_min_interval_seconds);
    let mut leader = *leadership.is_leader.borrow_and_update();
    metrics.set_leader(leader);
    // Checked: the delay is an operator's number, and `Instant + Duration` panics
    // past the clock's range.
    let after = |d: Duration| Instant::now().checked_add(d).unwrap_or_else(Instant::now);
    let mut flush_at: Option<Instant> = Some(after(delay));
    let mut synced = false;
    let shutdown = topodra_ops::signal::terminated();
    tokio::pin!(shutdown);
    info!(driver = %cli.driver_name, node_resource_topology = nrt_enabled, leader, "controller started");

    loop {
        tokio::select! {
            () = &mut shutdown => break,
            next = inputs.next() => match next {
                Some(Ok(input)) => {
                    metrics.watch_event(input.kind());
                    let mut state = lock(&state);
                    let applied = state.apply(input);
                    report_findings(&applied.findings, &metrics);
                    metrics.set_nrt_nodes_waiting(state.nodes_waiting());
                    if synced && nrt_enabled {
                        send_triggers(&mut state, &triggers);
                    }
                    // Nothing a pass acts on changed: no pass, and no wake-up for it.
                    if applied.pass_due && flush_at.is_none() {
                        flush_at = Some(after(delay));
                    }
                }
                Some(Err((kind, e))) => {
                    metrics.watch_error(kind);
                    warn!(resource = %kind, error = %e, "watch failed; resuming with backoff");
                }
                None => anyhow::bail!("the watches ended"),
            },
            changed = leadership.is_leader.changed() => {
                if changed.is_err() {
                    anyhow::bail!("leader election stopped");
                }
                let now = *leadership.is_leader.borrow_and_update();
                if now != leader {
                    leader = now;
                    metrics.set_leader(leader);
                    if leader {
                        info!("became the leader: writing from now on");
                        lock(&state).mark_all_dirty();
                        flush_at = Some(Instant::now());
                    } else {
                        // Reconciles already queued find they do not lead and write nothing.
                        warn!("lost leadership: writing stops");
                    }
                }
            }
            () = tokio::time::sleep_until(flush_at.unwrap_or_else(Instant::now)), if flush_at.is_some() => {
                flush_at = None;
                let (planned, again) = {
                    let mut state = lock(&state);
                    let waiting = state.unsynced(&watched);
                    if !synced && waiting.is_empty() {
                        synced = true;
                        info!("initial state complete");
                    }
                    *unsynced.lock().unwrap_or_else(PoisonError::into_inner) =
                        waiting.iter().map(ToString::to_string).collect();
                    metrics.observe_cluster(&state.cluster);
                    metrics.set_nrt_nodes_waiting(state.nodes_waiting());
                    // Writing before every watch is in could delete objects of nodes not seen yet.
                    if !(leader && synced) {
                        continue;
                    }
                    if nrt_enabled {
                        send_triggers(&mut state, &triggers);
                    }
                    let mut planned = Vec::new();
                    if cli.pending_pod_events && state.pods_dirty() {
                        planned = state.plan_events(std::time::Instant::now(), min_interval);
                    }
                    metrics.set_pending_pods(state.pending_pods());
                    (planned, cli.pending_pod_events && state.pods_dirty())
                };
                if again {
                    // An explanation changed too soon after the last Event: look again.
                    flush_at = Some(after(Duration::from_secs(1).max(delay)));
                }
                let batch: Vec<PodEvent> = planned.into_iter().filter_map(pod_event).collect();
                if !batch.is_empty() && events.send(batch).await.is_err() {
                    anyhow::bail!("the event writer stopped");
                }
            }
        }
    }

    info!("shutting down");
    drop(events);
    drop(triggers);
    let _ = tokio::time::timeout(Duration::from_secs(10), writer).await;
    if let Some(reconciler) = reconciler {
        reconciler.abort();
    }
    leadership.release().await;
    http.stop().await;
    Ok(())
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Hands the nodes that began to wait to the reconciler.
fn send_triggers(state: &mut State, triggers: &mpsc::UnboundedSender<String>) {
    for node in state.take_triggers() {
        // Closed only at shutdown.
        let _ = triggers.send(node);
    }
}

fn pod_event(w: Write) -> Option<PodEvent> {
    match w {
        Write::PodEvent {
            namespace,
            name,
            uid,
            message,
        } => Some(PodEvent {
            namespace,
            name,
            uid,
            message,
        }),
        #[cfg(test)]
        _ => None,
    }
}

/// The cluster's NodeResourceTopology objects (cluster-scoped), read and written as dynamic objects: the CRD has no Rust types.
pub(crate) fn nrt_api(client: kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(nrt::GROUP, nrt::VERSION, nrt::KIND);
    Api::all_with(
        client,
        &ApiResource::from_gvk_with_plural(&gvk, nrt::PLURAL),
    )
}

/// Logs and counts what the model did not take from the slices: ignored values and
/// skipped pools. Each is reported once, when it appears, so a relist does not repeat
/// them; the names in the message are quoted and escaped, since they come from slices.
fn report_findings(findings: &[Finding], metrics: &Metrics) {
    for finding in findings {
        metrics.finding(finding);
        warn!(%finding, "ResourceSlice content not taken into the capacity model");
    }
}

/// One streaming watch per resource: the initial state arrives as watch events, with
/// no LIST, and the watch resumes from its last resource version.
fn stream<K>(
    api: Api<K>,
    config: watcher::Config,
    wrap: fn(watcher::Event<K>) -> Input,
    kind: Kind,
) -> BoxStream<'static, Result<Input, (Kind, watcher::Error)>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher(api, config.streaming_lists())
        .default_backoff()
        .map_ok(wrap)
        .map_err(move |e| (kind, e))
        .boxed()
}

/// [`stream`] for objects whose writers choose their nesting (claims' opaque
/// parameters, and the `managedFields` that mirror any object): each is decoded with
/// bounded depth, so one object nested past serde_json's limit is pruned or, failing
/// that, dropped and counted, instead of failing the whole watch at every relist.
fn bounded<K>(
    client: &kube::Client,
    config: watcher::Config,
    wrap: fn(watcher::Event<K>) -> Input,
    kind: Kind,
    metrics: &Arc<Metrics>,
) -> BoxStream<'static, Result<Input, (Kind, watcher::Error)>>
where
    K: Watchable,
{
    bounded_events(client, config, kind, metrics)
        .map_ok(wrap)
        .boxed()
}

/// What [`bounded`] can watch: a cluster-wide API type that decodes, with a default
/// to stand for a deleted object that did not.
trait Watchable:
    kube::Resource<DynamicType = ()>
    + Clone
    + Default
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + 'static
{
}

impl<K> Watchable for K where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + Default
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static
{
}

/// The decoded events of [`bounded`], before they become inputs.
fn bounded_events<K>(
    client: &kube::Client,
    config: watcher::Config,
    kind: Kind,
    metrics: &Arc<Metrics>,
) -> BoxStream<'static, Result<watcher::Event<K>, (Kind, watcher::Error)>>
where
    K: Watchable,
{
    let metrics = metrics.clone();
    watcher(
        Api::<Bounded<K>>::all(client.clone()),
        config.streaming_lists(),
    )
    .default_backoff()
    .try_filter_map(move |event| {
        let event = decoded_event(event, kind, &metrics);
        async move { Ok(event) }
    })
    .map_err(move |e| (kind, e))
    .boxed()
}

/// The event with its object decoded; `None` for a new or changed object that could
/// not be decoded at all (what was known of it stays until it decodes or is gone).
/// A deleted object is deleted by its name, decoded or not.
fn decoded_event<K>(
    event: watcher::Event<Bounded<K>>,
    kind: Kind,
    metrics: &Metrics,
) -> Option<watcher::Event<K>>
where
    K: kube::Resource + Default,
{
    use watcher::Event;
    let object = |b: Bounded<K>, deleted: bool| -> Option<K> {
        match b {
            Bounded::Whole(o) => Some(o),
            Bounded::Pruned { object, paths } => {
                metrics.object_pruned(kind);
                warn!(
                    resource = %kind,
                    namespace = object.meta().namespace.as_deref().unwrap_or_default(),
                    name = object.meta().name.as_deref().unwrap_or_default(),
                    pruned = ?paths,
                    max_depth = topodra_ops::bounded::MAX_DEPTH,
                    "object nested too deep; taken without its deepest values"
                );
                Some(object)
            }
            Bounded::Undecodable(u) => {
                metrics.object_undecodable(kind);
                warn!(
                    resource = %kind,
                    namespace = u.metadata.namespace.as_deref().unwrap_or_default(),
                    name = u.metadata.name.as_deref().unwrap_or_default(),
                    error = %u.error,
                    "object not decodable; left out of the model"
                );
                deleted.then(|| {
                    let mut gone = K::default();
                    *gone.meta_mut() = u.metadata;
                    gone
                })
            }
        }
    };
    match event {
        Event::Apply(b) => object(b, false).map(Event::Apply),
        Event::InitApply(b) => object(b, false).map(Event::InitApply),
        Event::Delete(b) => object(b, true).map(Event::Delete),
        Event::Init => Some(Event::Init),
        Event::InitDone => Some(Event::InitDone),
    }
}

fn inputs(
    client: &kube::Client,
    driver: &str,
    metrics: &Arc<Metrics>,
    mut nodes: reflector::store::Writer<PartialObjectMeta<Node>>,
) -> Inputs {
    let c = client;
    let mut all = SelectAll::new();
    all.push(bounded::<ResourceSlice>(
        c,
        watcher::Config::default().fields(&format!("spec.driver={driver}")),
        Input::Slice,
        Kind::Slices,
        metrics,
    ));
    all.push(bounded::<ResourceClaim>(
        c,
        watcher::Config::default(),
        Input::Claim,
        Kind::Claims,
        metrics,
    ));
    all.push(bounded::<DeviceClass>(
        c,
        watcher::Config::default(),
        Input::Class,
        Kind::Classes,
        metrics,
    ));
    // The store sees each Node before the state does, so a node the state hands to
    // the reconciler is there to be reconciled.
    all.push(
        bounded_events::<PartialObjectMeta<Node>>(
            c,
            watcher::Config::default(),
            Kind::Nodes,
            metrics,
        )
        .map_ok(move |event| {
            nodes.apply_watcher_event(&event);
            Input::Node(event)
        })
        .boxed(),
    );
    // Only pods no node has taken yet: the ones that can be waiting for GPUs.
    all.push(bounded::<Pod>(
        c,
        watcher::Config::default().fields("spec.nodeName="),
        Input::Pod,
        Kind::Pods,
        metrics,
    ));
    all
}

/// Whether the API server serves `resource` in `group_version` (one discovery GET).
async fn served(client: &kube::Client, group_version: &str, resource: &str) -> bool {
    match client.list_api_group_resources(group_version).await {
        Ok(list) => list.resources.iter().any(|r| r.name == resource),
        Err(e) => {
            tracing::debug!(group_version, error = %e, "API group not served");
            false
        }
    }
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}
