//! NodeResourceTopology objects reconciled per node by kube-runtime's applier (the
//! engine under its `Controller`, fed here from the index in `state` rather than from
//! a watch of its own): the applier debounces a node's first change, runs one
//! reconcile per node at a time, and requeues on failure or while a node must wait.
//!
//! One reconcile: ask the index what the node's object needs; nothing, and the node is
//! settled without a request. Otherwise the node waits out its write interval (a
//! requeue), then its turn of the fleet's write budget, then takes the plan as the
//! index has it by then and writes it; a plan that needs nothing by then hands the
//! turn on unused. A failed write puts the node back to wait and
//! is retried with backoff; every retry takes a budget turn too, so an outage cannot
//! turn into a storm.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{self, Action, applier};
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::{mpsc, watch};
use topodra_ops::backoff::Backoff;
use tracing::{debug, warn};

use crate::budget::{NodeInterval, WriteBudget};
use crate::metrics::Metrics;
use crate::nrt::NrtOptions;
use crate::state::{NrtPlan, State};

/// The field manager of our server-side applies.
pub(crate) const FIELD_MANAGER: &str = "topodra-controller";

/// What a reconcile needs; one per controller.
pub(crate) struct Reconciler {
    pub(crate) api: Api<DynamicObject>,
    pub(crate) state: Arc<Mutex<State>>,
    pub(crate) opts: NrtOptions,
    pub(crate) leader: watch::Receiver<bool>,
    pub(crate) budget: WriteBudget,
    pub(crate) spacing: NodeInterval,
    pub(crate) metrics: Arc<Metrics>,
    /// Per node, the backoff of its failing writes.
    failures: Mutex<HashMap<String, Backoff>>,
}

/// A write the API server refused or did not answer.
#[derive(Debug, thiserror::Error)]
#[error("{operation} of the NodeResourceTopology of node {node}: {source}")]
pub(crate) struct WriteError {
    node: String,
    operation: &'static str,
    #[source]
    source: kube::Error,
}

impl Reconciler {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        api: Api<DynamicObject>,
        state: Arc<Mutex<State>>,
        opts: NrtOptions,
        leader: watch::Receiver<bool>,
        budget: WriteBudget,
        spacing: NodeInterval,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            api,
            state,
            opts,
            leader,
            budget,
            spacing,
            metrics,
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn leading(&self) -> bool {
        *self.leader.borrow()
    }
}

/// Runs until the trigger channel closes: each node name received is reconciled,
/// `debounce` after the first change of a node that was settled.
pub(crate) async fn run(
    ctx: Arc<Reconciler>,
    nodes: Store<PartialObjectMeta<Node>>,
    triggers: mpsc::UnboundedReceiver<String>,
    debounce: Duration,
) {
    let queue = futures::stream::unfold(triggers, |mut rx| async move {
        let node = rx.recv().await?;
        Some((
            Ok::<_, Infallible>(ObjectRef::<PartialObjectMeta<Node>>::new(&node)),
            rx,
        ))
    });
    // No limit on reconciles at once: every node that is due starts its reconcile
    // and waits in the budget's queue, which is first come, first served. Under a
    // limit, kube-runtime's runner holds the nodes beyond it in a hash set and takes
    // them in its iteration order, so a node could wait behind later ones for as long
    // as others kept coming (at 500 nodes and a limit of 16, writes trailed their
    // first change by over 1,024 s against a bound of 570 s). A waiting reconcile is
    // a small future and holds no request; writes stay one at a time by the budget.
    let config = controller::Config::default().debounce(debounce);
    applier(
        |node, ctx| Box::pin(reconcile(node, ctx)),
        error_policy,
        ctx,
        nodes,
        queue,
        config,
    )
    .for_each(|result| async move {
        match result {
            Ok(_) => {}
            // A look asked for before the Node arrived, or after it went: the Node's
            // arrival asks again, and its deletion takes the object with it.
            Err(controller::Error::ObjectNotFound(node)) => {
                debug!(node = %node.name, "no Node to reconcile");
            }
            // Logged by the error policy.
            Err(controller::Error::ReconcilerFailed(..)) => {}
            Err(e) => warn!(error = %e, "NodeResourceTopology reconciler"),
        }
    })
    .await;
}

async fn reconcile(
    node: Arc<PartialObjectMeta<Node>>,
    ctx: Arc<Reconciler>,
) -> Result<Action, WriteError> {
    let name = node.name_any();
    if !ctx.leading() {
        // A new leader looks at every node again.
        return Ok(Action::await_change());
    }
    {
        let mut state = ctx.state();
        match state.nrt_plan(&name, &ctx.opts) {
            NrtPlan::UpToDate => {
                state.settled(&name);
                ctx.metrics.set_nrt_nodes_waiting(state.nodes_waiting());
                ctx.metrics.write_skipped();
                return Ok(Action::await_change());
            }
            NrtPlan::Nothing => {
                state.settled(&name);
                ctx.metrics.set_nrt_nodes_waiting(state.nodes_waiting());
                return Ok(Action::await_change());
            }
            NrtPlan::Apply(_) | NrtPlan::Delete => {}
        }
    }
    if let Some(wait) = ctx.spacing.wait(&name) {
        return Ok(Action::requeue(wait));
    }
    // The plan as it stands at the node's turn: changes made while it waited are in
    // it. Where they undid what it waited for (its pods came and went), nothing is
    // written and the turn passes on at once, so the nodes behind it do not wait a
    // turn for a write that is never sent.
    let taken = ctx
        .budget
        .turn(|| {
            if !ctx.leading() {
                return None;
            }
            let mut state = ctx.state();
            let (plan, since) = state.take_nrt_plan(&name, &ctx.opts);
            ctx.metrics
                .set_cpu_numa_ignored(state.ignored_cpu_numa_nodes());
            ctx.metrics.set_nrt_nodes_waiting(state.nodes_waiting());
            match plan {
                NrtPlan::Apply(object) => Some((Some(object), since)),
                NrtPlan::Delete => Some((None, since)),
                NrtPlan::UpToDate => {
                    ctx.metrics.write_skipped();
                    None
                }
                NrtPlan::Nothing => None,
            }
        })
        .await;
    // The object to apply, or None to delete it.
    let Some((object, since)) = taken else {
        return Ok(Action::await_change());
    };
    let (operation, result) = match object {
        Some(object) => {
            let params = PatchParams::apply(FIELD_MANAGER).force();
            let r = ctx.api.patch(&name, &params, &Patch::Apply(object)).await;
            ("apply", r.map(|_| ()))
        }
        None => {
            let r = match ctx.api.delete(&name, &DeleteParams::default()).await {
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                r => r.map(|_| ()),
            };
            ("delete", r)
        }
    };
    ctx.metrics.write(operation, result.is_ok());
    match result {
        Ok(()) => {
            debug!(node = name, operation, "NodeResourceTopology written");
            if operation == "delete" {
                ctx.spacing.forget(&name);
            } else {
                ctx.spacing.wrote(&name);
            }
            if let Some(since) = since {
                ctx.metrics.observe_nrt_write_lag(since.elapsed());
            }
            ctx.failures
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&name);
            Ok(Action::await_change())
        }
        Err(source) => {
            let mut state = ctx.state();
            state.write_failed(&name, since);
            ctx.metrics.set_nrt_nodes_waiting(state.nodes_waiting());
            drop(state);
            Err(WriteError {
                node: name,
                operation,
                source,
            })
        }
    }
}

/// A failed write is retried after 1 s, 2 s, 4 s ... up to a minute per node,
/// jittered so that replicas and nodes do not retry in step after an outage.
fn error_policy(
    node: Arc<PartialObjectMeta<Node>>,
    error: &WriteError,
    ctx: Arc<Reconciler>,
) -> Action {
    let name = node.name_any();
    let mut failures = ctx.failures.lock().unwrap_or_else(PoisonError::into_inner);
    let backoff = failures
        .entry(name.clone())
        .or_insert_with(|| Backoff::new(Duration::from_secs(1), Duration::from_secs(60)));
    let delay = backoff.next_delay();
    warn!(node = name, error = %error, retry_in = ?delay, "writing the NodeResourceTopology failed; will retry");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use std::error::Error as StdError;

    use http_body_util::{BodyExt, Full};
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use serde_json::json;
    use tokio::time::Instant;
    use topodra_ops::requests::RequestCounter;

    use super::*;
    use crate::fixtures::{gpu_slice, nrt_options};
    use crate::run::nrt_api;
    use crate::state::Input;

    type Writes = Arc<Mutex<Vec<(String, Instant)>>>;

    /// kube's Client over a stand-in API server that records each write's object
    /// name and (paused) time, and answers with the object it was sent.
    fn recording_client(writes: Writes) -> kube::Client {
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let writes = writes.clone();
            async move {
                let name = req.uri().path().rsplit('/').next().unwrap_or("").to_owned();
                writes.lock().unwrap().push((name, Instant::now()));
                let body = req.into_body().collect().await?.to_bytes();
                Ok::<_, Box<dyn StdError + Send + Sync>>(http::Response::new(Full::new(body)))
            }
        });
        kube::Client::new(service, "default")
    }

    fn node(name: &str) -> PartialObjectMeta<Node> {
        serde_json::from_value(
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "uid": format!("uid-{name}")}}),
        )
        .unwrap()
    }

    /// A fleet of GPU nodes, each with its slice and Node and no
    /// NodeResourceTopology yet, and a reconciler over them that writes to a
    /// recording stand-in with a budget of one write a second and the default interval;
    /// it leads while the returned sender lives.
    fn fleet(
        names: &[String],
    ) -> (
        Arc<Reconciler>,
        Store<PartialObjectMeta<Node>>,
        Writes,
        watch::Sender<bool>,
    ) {
        let mut state = State::new("gpu.topodra.dev", vec!["gpu.topodra.dev".into()]);
        let (store, mut writer) = reflector::store::<PartialObjectMeta<Node>>();
        let _ = state.apply(Input::Slice(Event::Init));
        for n in names {
            let _ = state.apply(Input::Slice(Event::InitApply(gpu_slice(n))));
        }
        let _ = state.apply(Input::Slice(Event::InitDone));
        // The applier starts once the store has had its first list.
        for event in std::iter::once(Event::Init)
            .chain(names.iter().map(|n| Event::InitApply(node(n))))
            .chain(std::iter::once(Event::InitDone))
        {
            writer.apply_watcher_event(&event);
            let _ = state.apply(Input::Node(event));
        }
        let _ = state.apply(Input::Nrt(Event::Init));
        let _ = state.apply(Input::Nrt(Event::InitDone));

        let writes: Writes = Arc::default();
        let (leader_tx, leader) = watch::channel(true);
        let ctx = Arc::new(Reconciler::new(
            nrt_api(recording_client(writes.clone())),
            Arc::new(Mutex::new(state)),
            nrt_options(),
            leader,
            WriteBudget::per_second(1.0),
            NodeInterval::new(Duration::from_secs(60)),
            Arc::new(Metrics::new(&RequestCounter::new())),
        ));
        (ctx, store, writes, leader_tx)
    }

    /// A node whose object needs nothing by its turn (here its slices went while it
    /// waited) hands the turn on: the nodes behind it are written one a second after
    /// the writes before them, not after a turn for each node that dropped out. At
    /// 2,000 nodes most of the nodes still waiting when the waves ended had had their
    /// pods come and go, and each took a second of the budget for nothing.
    #[tokio::test(start_paused = true)]
    async fn a_node_with_nothing_left_to_write_passes_its_turn_on() {
        const NODES: usize = 40;
        let names: Vec<String> = (0..NODES).map(|i| format!("node-{i:02}")).collect();
        let (ctx, store, writes, _leader) = fleet(&names);
        let (triggers, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(ctx.clone(), store, rx, Duration::from_millis(10)));

        let start = Instant::now();
        for n in &names {
            triggers.send(n.clone()).unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Four and a half seconds in: nodes 00 to 04 are written, the rest wait. The
        // even ones among them lose their slices, so their objects need nothing.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let gone: Vec<&String> = names.iter().skip(6).step_by(2).collect();
        {
            let mut state = ctx.state();
            for n in &gone {
                let _ = state.apply(Input::Slice(Event::Delete(gpu_slice(n))));
            }
        }
        tokio::time::sleep(Duration::from_secs(NODES as u64 + 10)).await;

        let writes = writes.lock().unwrap().clone();
        let written: Vec<&str> = writes.iter().map(|(n, _)| n.as_str()).collect();
        let want: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| !gone.iter().any(|g| g.as_str() == *n))
            .collect();
        assert_eq!(written, want);
        // One a second from the first: 23 writes by 22 s, where a turn for each node
        // that dropped out would have put the last at 39 s.
        for (i, (name, at)) in writes.iter().enumerate() {
            let t = *at - start;
            assert!(
                t >= Duration::from_secs(i as u64)
                    && t <= Duration::from_secs(i as u64) + Duration::from_millis(100),
                "{name} written at {t:?}, write {i}"
            );
        }
    }

    /// Nodes that ask one after another are written in the order they asked, one a
    /// budget turn apart, however many wait: the budget's queue is first come, first
    /// served, and nothing ahead of it reorders them (under a limit on reconciles at
    /// once, kube-runtime's runner takes held nodes in hash-set order).
    #[tokio::test(start_paused = true)]
    async fn waiting_nodes_are_written_in_the_order_they_asked() {
        const NODES: usize = 40;
        let names: Vec<String> = (0..NODES).map(|i| format!("node-{i:02}")).collect();
        let (ctx, store, writes, _leader) = fleet(&names);
        let (triggers, rx) = mpsc::unbounded_channel();
        let debounce = Duration::from_millis(10);
        tokio::spawn(run(ctx, store, rx, debounce));

        // One node asks every 100 ms: all of them wait long before the last is written.
        let start = Instant::now();
        let mut asked = Vec::new();
        for n in &names {
            asked.push(Instant::now());
            triggers.send(n.clone()).unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(NODES as u64 + 10)).await;

        let writes = writes.lock().unwrap().clone();
        let order: Vec<&str> = writes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(order, names, "written out of the order asked");
        for (i, (name, at)) in writes.iter().enumerate() {
            // Its turn: the debounce, then one second for each node ahead of it.
            let bound = debounce + Duration::from_secs(i as u64) + Duration::from_millis(50);
            assert!(
                *at - asked[i] <= bound,
                "{name} written {:?} after it asked, bound {bound:?}",
                *at - asked[i]
            );
            assert!(
                *at - start >= Duration::from_secs(i as u64),
                "{name}: budget not kept"
            );
        }
    }
}
