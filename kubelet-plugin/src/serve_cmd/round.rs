//! One serving round: from owning the node state until told to stop or asked for
//! the state, then everything taken down in the order that loses no work.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use dra_kubeletplugin::PluginBuilder;
use dra_kubeletplugin::claims::{ApiClaims, ReadPolicy};
use dra_kubeletplugin::dra::ClaimConcurrency;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use topodra_node::prepare::Preparer;

use crate::events;
use crate::lifecycle::KubeletSockets;
use crate::node_driver::NodeDriver;
use crate::pool::PoolBuilder;
use crate::reconcile::{self, ReconcileConfig};
use crate::shutdown::Stop;
use crate::taint_loop;
use dra_kubeletplugin::publish::{Publisher, PublisherConfig};

use super::setup::{Setup, export_status, start_health};

/// Serves the kubelet from the node state this instance owns, until it is told to
/// stop or another instance asks for the state; then takes everything down in the
/// order that loses no work, and says why it stopped.
pub(super) async fn serve(
    ctx: &Setup<'_>,
    preparer: Arc<Preparer>,
    until: impl std::future::Future<Output = Stop>,
) -> Result<Stop> {
    let Setup {
        args,
        client,
        metrics,
        lifecycle,
        ..
    } = *ctx;
    let inventory = &*ctx.inventory();
    metrics.set_prepared_from(&preparer);
    metrics.set_read_only(preparer.read_only().is_some());
    // What stops after registration, with the plugin's DRA socket.
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shutdown = || {
        let mut rx = shutdown_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    let (health_task, health_rx) = start_health(args, inventory, metrics, shutdown());
    let mut pool = PoolBuilder::new(
        Arc::new(inventory.clone()),
        &args.discovery.driver_name,
        &args.node_name,
        args.discovery.numa_node_format,
        args.discovery.numa_node_aliases.clone(),
    )
    .with_attributes(args.discovery.attributes);
    if args.dynamic_mig {
        pool = pool.with_dynamic_mig(preparer.own_mig_instances().clone());
    }
    pool = pool.with_sharing(args.sharing.sharing());
    let (taints_task, desired_rx) =
        taint_loop::spawn(health_rx.clone(), pool, args.health.evict_unhealthy);

    let sockets = args.sockets();
    // Only an owner knows that no other instance serves on them.
    if preparer.read_only().is_none() {
        for path in sockets.remove_leftovers(&args.discovery.driver_name).await {
            tracing::info!(socket = %path.display(), "removed a socket a killed instance left");
        }
    }
    let api_claims = Arc::new(ApiClaims::new(client.clone(), {
        let mut policy = ReadPolicy::default();
        policy.attempt_timeout = Duration::from_secs(args.claims.claim_read_timeout_seconds);
        policy.deadline = Duration::from_secs(args.claims.claim_read_deadline_seconds);
        policy
    }));
    let reconcile_task = tokio::spawn(reconcile::run(
        preparer.clone(),
        api_claims.clone(),
        ReconcileConfig {
            interval: Duration::from_secs(args.claims.stale_claim_check_interval_seconds),
            grace: Duration::from_secs(args.claims.stale_claim_grace_seconds),
        },
        {
            let event = events::stale_claim_unprepared(client.clone(), args.node_name.clone());
            let (metrics, preparer) = (metrics.clone(), preparer.clone());
            // The kubelet's calls are not the only ones that free GPUs.
            move |record: &topodra_model::checkpoint::ClaimRecord, why: &str| {
                metrics.set_prepared_from(&preparer);
                event(record, why);
            }
        },
        shutdown(),
    ));
    let driver = Arc::new(NodeDriver::new(
        preparer.clone(),
        health_rx.clone(),
        metrics.clone(),
    ));
    let start_plugin = || {
        PluginBuilder::new(
            &args.discovery.driver_name,
            &args.node_name,
            sockets.clone(),
            driver.clone(),
            api_claims.clone(),
        )
        .metrics(metrics.claims().clone())
        .concurrency(
            ClaimConcurrency::new(
                args.claims.max_concurrent_claims_per_call as usize,
                args.claims.max_concurrent_claims as usize,
            )
            .call_deadline(Duration::from_secs(args.claims.call_deadline_seconds)),
        )
        .start()
        .map_err(|e| format!("{:#}", anyhow::Error::from(e)))
    };
    // A socket that cannot be bound (the plugin's directory read-only, full, or
    // something else at the socket's path) is no reason to exit: a restart finds
    // the same directory. What needs no socket goes on (slices, device health, the
    // HTTP endpoint), and binding is tried again.
    let mut plugin = start_plugin();
    if let Err(reason) = &plugin {
        tracing::error!(
            reason,
            "cannot serve the kubelet; publishing and health go on, binding is tried again"
        );
        let (client, node) = (client.clone(), args.node_name.clone());
        let note = format!(
            "the plugin cannot bind its sockets ({reason}); the kubelet cannot reach it until \
             they are, which it tries every {} s",
            args.kubelet.state_retry_seconds
        );
        tokio::spawn(async move {
            events::node_event(client, &node, "PluginSocketUnusable", "Start", note).await;
        });
    }

    let mut publisher_config = PublisherConfig::new(&args.discovery.driver_name, &args.node_name);
    // The allocator walks a pool's slices by name; topodra's device order is policy
    // (docs/benchmarks.md, "Dynamic MIG: device order and fragmentation").
    publisher_config.ordered_slice_names = true;
    let slices = match &*desired_rx.borrow() {
        dra_kubeletplugin::publish::DesiredPool::Slices(s) => s.len(),
        dra_kubeletplugin::publish::DesiredPool::Invalid(_) => 1,
    };
    let publisher = Publisher::new(client.clone(), publisher_config, desired_rx);
    let publish_status = publisher.status();
    let publisher_task = tokio::spawn(publisher.run(shutdown()));
    tokio::spawn(export_status(
        metrics.clone(),
        health_rx.clone(),
        publish_status.clone(),
    ));
    let (check_client, node, driver_name) = (
        client.clone(),
        args.node_name.clone(),
        args.discovery.driver_name.clone(),
    );
    tokio::spawn(async move {
        events::squatted_names(check_client, &node, &driver_name, slices).await;
    });
    let announce = |plugin: &Result<dra_kubeletplugin::Plugin, String>| {
        lifecycle.serving(
            plugin
                .as_ref()
                .map_err(Clone::clone)
                .map(|p| KubeletSockets {
                    registration: p.sockets().registration.clone(),
                    dra: p.sockets().dra.clone(),
                    registered: p.registered(),
                }),
            publish_status.clone(),
            preparer.read_only().map(str::to_owned),
        );
    };
    announce(&plugin);

    let retry = Duration::from_secs(args.kubelet.state_retry_seconds);
    let terminated = topodra_ops::signal::terminated();
    tokio::pin!(terminated, until);
    let stop = loop {
        tokio::select! {
            () = &mut terminated => break Stop::Terminate,
            stop = &mut until => break stop,
            () = tokio::time::sleep(retry), if plugin.is_err() => {
                plugin = start_plugin();
                match &plugin {
                    Ok(_) => tracing::info!("the sockets are bound; serving the kubelet"),
                    Err(reason) => tracing::info!(reason, "still cannot serve the kubelet"),
                }
                announce(&plugin);
            }
        }
    };
    let mut plugin = plugin.ok();
    // Unregister first: with the registration socket gone the kubelet stops sending
    // new claims here, while prepares in flight finish on the DRA socket.
    if let Some(plugin) = plugin.as_mut() {
        plugin.unregister().await;
    }
    let _ = shutdown_tx.send(true);
    if let Some(plugin) = plugin {
        plugin.stop().await;
    }
    // The drain is shorter than a claim read may take on a slow API server, so a
    // prepare can still be on its way to the state machine. The fence waits for
    // every call that is writing and refuses every later one: after it, this
    // process writes no checkpoint and no CDI spec.
    let to = match &stop {
        Stop::Handover(to) => to.clone(),
        Stop::Terminate | Stop::Usable | Stop::Retaken(_) => "the next instance".to_owned(),
    };
    let fencing = preparer.clone();
    if let Err(e) = tokio::task::spawn_blocking(move || fencing.fence(&to)).await {
        // Only a panic inside the fence gets here; it cannot have let a write through.
        tracing::error!(error = %e, "fencing the node state");
    }
    // Nor anything to the API server: tasks that did not stop in time are aborted.
    tokio::join!(
        stop_task("publisher", publisher_task),
        stop_task("health monitor", health_task),
        stop_task("stale-claim check", reconcile_task),
    );
    taints_task.abort();
    Ok(stop)
}

/// Waits a few seconds for `task` to end after its shutdown signal, then aborts it.
pub(super) async fn stop_task(what: &str, mut task: JoinHandle<()>) {
    if tokio::time::timeout(Duration::from_secs(5), &mut task)
        .await
        .is_err()
    {
        tracing::warn!(task = what, "did not stop within 5 s; aborted");
        task.abort();
        let _ = task.await;
    }
}
