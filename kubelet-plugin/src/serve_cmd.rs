//! `serve`: the DaemonSet entry point. Discovers the node, recovers prepared claims,
//! serves the kubelet over Unix sockets, publishes the ResourceSlices, and exposes
//! metrics and health, until SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use dra_kubeletplugin::PluginBuilder;
use dra_kubeletplugin::claims::{ApiClaims, ReadPolicy};
use dra_kubeletplugin::dra::ClaimConcurrency;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use topodra_driver::cdi::{CdiConfig, DriverFiles, HostNodeProblem, host_node_problems};
use topodra_driver::checkpoint::read_boot_id;
use topodra_driver::discovery::{self, DiscoveryConfig, NvmlPolicy, TopologyInput};
use topodra_driver::health::{HealthPolicy, HealthState};
use topodra_driver::prepare::{Preparer, PreparerConfig};
use topodra_ops::requests::RequestCounter;

pub(crate) use crate::args::ServeArgs;
use crate::cdi_hook;
use crate::events;
use crate::health::monitor::{HealthMonitor, MonitorConfig};
use crate::health::nvml::NvmlOpener;
use crate::http_endpoint::HttpEndpoint;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::node_driver::NodeDriver;
use crate::node_state::{self, Owner};
use crate::ownership;
use crate::publish::{PoolBuilder, Publisher, PublisherConfig};
use crate::reconcile::{self, ReconcileConfig};
use crate::shutdown::{self, Stop};
use crate::taint_loop;

/// How the API server's audit log and metrics name this program.
const USER_AGENT: &str = concat!("topodra-kubelet-plugin/", env!("CARGO_PKG_VERSION"));

pub(crate) async fn run(args: ServeArgs) -> Result<()> {
    let d = &args.discovery;
    d.checked_numa_node_aliases()
        .context("--numa-node-aliases")?;
    let inventory = discovery::discover(&DiscoveryConfig {
        nvml_lib: Some(d.nvml_lib.clone()),
        nvml: NvmlPolicy::Required,
        topology: match &d.hwloc_xml {
            Some(path) => TopologyInput::HwlocXml(path.clone()),
            None => TopologyInput::Live,
        },
        sysfs_root: d.sysfs_root.clone(),
    })
    .context("discovering GPUs")?;
    let devices = inventory.allocatable();
    tracing::info!(
        gpus = inventory.gpus.len(),
        devices = devices.len(),
        "discovered"
    );

    // Before any spec can name it: the nvidia-cdi-hook the runtime runs for the
    // specs' hooks, installed from the image into the plugin's host directory (or
    // the host's own), checked to run. Without one the plugin does not start.
    let setup = args.cdi_hook_setup();
    let hook = tokio::task::spawn_blocking(move || cdi_hook::prepare(&setup))
        .await
        .context("installing nvidia-cdi-hook")??;
    tracing::info!(
        path = %hook.path.display(),
        version = %hook.version,
        sha256 = %hook.sha256,
        action = ?hook.action,
        "nvidia-cdi-hook ready; the CDI specs' hooks name this path"
    );

    // Every field is set today; the default stays for the fields CdiConfig gains.
    #[allow(clippy::needless_update)]
    let cdi = CdiConfig {
        spec_dir: args.cdi.cdi_dir.clone(),
        driver_root: args.cdi.driver_root.clone(),
        driver_root_local: args.cdi.driver_root_local.clone(),
        toolkit_spec: args.cdi.toolkit_cdi_spec.clone(),
        dev_root: args.cdi.dev_root.clone(),
        capabilities_dir: args.cdi.nvidia_capabilities_dir.clone(),
        sysfs_root: d.sysfs_root.clone(),
        hook_path: hook.path,
        ..CdiConfig::default()
    };
    let files =
        DriverFiles::load(&cdi).context("finding the NVIDIA driver's files for CDI specs")?;
    if let Ok(now) = files.current() {
        tracing::info!(
            source = ?now.source,
            driver_version = now.driver_version(),
            files = now.file_count(),
            hook = %cdi.hook_path.display(),
            "driver files for CDI specs"
        );
    }
    let boot_id = read_boot_id(&args.cdi.boot_id_file).context("reading the boot id")?;

    let counter = RequestCounter::new();
    let kube_config = kube::Config::infer()
        .await
        .context("finding the API server (kubeconfig or in-cluster)")?;
    let client = topodra_ops::requests::counted_client(kube_config, &counter, USER_AGENT)
        .context("building the API client")?;
    let metrics = Arc::new(Metrics::new(&counter));
    host_node_check(&cdi, &inventory, &client, &args.node_name);
    metrics.set_devices(&devices);

    // The HTTP endpoint first, and until the process exits: a pod waiting for the
    // node state, or done with it, must stay live. A bind address that is not the
    // pod's fails the start here, before the kubelet learns of this plugin.
    let lifecycle = Lifecycle::waiting();
    let http = HttpEndpoint::start(&args, &metrics, &lifecycle).await?;

    // One instance owns the node's state at a time; a rolling update's new pod
    // waits here until the old one has handed over. A state directory that cannot
    // be used is no reason to exit (the container would only restart into the same
    // error): the instance serves read-only until it can take the state.
    let name = args.instance_name();
    let state_dir = args.state_dir();
    let timing = ownership::Timing::default();
    let mut owner = tokio::select! {
        owner = Owner::take(&state_dir, &name, timing) => owner,
        () = shutdown::signal() => {
            tracing::info!("terminated while waiting for the node state");
            http.stop().await;
            return Ok(());
        }
    };
    let ctx = Setup {
        args: &args,
        inventory: &inventory,
        cdi: &cdi,
        files: &files,
        boot_id: &boot_id,
        client: &client,
        metrics: &metrics,
        lifecycle: &lifecycle,
    };
    loop {
        let stop = match &owner {
            Owner::Owned(ownership) => {
                tracing::info!(owner = ownership.name(), "owns the node state");
                match ctx.start_preparer() {
                    Ok(preparer) => {
                        let until = async {
                            let who = ownership.handover_requested(timing).await;
                            tracing::info!(to = %who, "handing the node state over to another instance");
                            Stop::Handover(who)
                        };
                        serve(&ctx, preparer, until).await?
                    }
                    Err(e) => {
                        tracing::error!(
                            error = format!("{e:#}"),
                            "cannot start from the node state"
                        );
                        owner = Owner::ReadOnly(format!("{e:#}"));
                        continue;
                    }
                }
            }
            Owner::ReadOnly(reason) => {
                let preparer = ctx.start_read_only(reason);
                let until = async {
                    let retry = Duration::from_secs(args.kubelet.state_retry_seconds);
                    Stop::StateUsable(
                        node_state::usable_again(&state_dir, &name, timing, retry).await,
                    )
                };
                serve(&ctx, preparer, until).await?
            }
        };
        owner = match stop {
            Stop::Terminate => break,
            Stop::StateUsable(ownership) => {
                tracing::info!("the node state directory is usable again");
                Owner::Owned(ownership)
            }
            Stop::Handover(to) => {
                let Owner::Owned(ownership) = owner else {
                    unreachable!("only an owner is asked to hand over")
                };
                // Serving has ended and the state is fenced (nothing here writes it
                // any more); releasing the lock lets the new owner read the
                // checkpoint. Exiting would only restart this container.
                let released = ownership.release();
                lifecycle.handed_over(&to);
                tracing::info!(to = %to, "handed the node state over; idle until this pod is deleted");
                tokio::select! {
                    () = shutdown::signal() => break,
                    back = released.reclaim_when_abandoned(timing) => {
                        tracing::warn!(
                            to = %to,
                            "the instance the node state was handed to did not take it, or gave it up; serving again"
                        );
                        back.map_or_else(|e| Owner::ReadOnly(e.to_string()), Owner::Owned)
                    }
                }
            }
        };
    }
    http.stop().await;
    tracing::info!("stopped");
    Ok(())
}

/// What every serving round needs, from the start of the process.
struct Setup<'a> {
    args: &'a ServeArgs,
    inventory: &'a topodra_driver::Inventory,
    cdi: &'a CdiConfig,
    files: &'a DriverFiles,
    boot_id: &'a str,
    client: &'a kube::Client,
    metrics: &'a Arc<Metrics>,
    lifecycle: &'a Lifecycle,
}

impl Setup<'_> {
    fn preparer_config(&self) -> PreparerConfig {
        PreparerConfig {
            driver_name: self.args.discovery.driver_name.clone(),
            node_name: self.args.node_name.clone(),
            state_dir: self.args.state_dir(),
            boot_id: self.boot_id.to_owned(),
            cdi_spec_dir: self.args.cdi.cdi_dir.clone(),
        }
    }

    fn device_nodes(&self) -> Box<dyn topodra_driver::cdi::DeviceNodes + Send + Sync> {
        Box::new(
            self.cdi
                .device_nodes()
                .with_proc_devices(&self.args.cdi.proc_devices),
        )
    }

    /// Serves read-only: an Event on the Node, and a state machine that writes
    /// nothing to the state directory.
    fn start_read_only(&self, reason: &str) -> Arc<Preparer> {
        tracing::error!(
            reason,
            "serving read-only: the node state directory is unusable; no claim can be prepared until it is fixed"
        );
        let (client, node) = (self.client.clone(), self.args.node_name.clone());
        let note = format!(
            "the plugin cannot use its state directory {} ({reason}); it serves read-only: \
             prepared claims can be unprepared, no claim can be prepared until the directory is writable",
            self.args.state_dir().display()
        );
        tokio::spawn(async move {
            events::node_event(client, &node, "StateDirUnusable", "Start", note).await;
        });
        Arc::new(Preparer::start_read_only(
            &self.preparer_config(),
            self.inventory,
            self.device_nodes(),
            self.files.clone(),
            reason.to_owned(),
        ))
    }

    /// Recovers the prepared claims from the checkpoint and CDI specs, and records
    /// on the Node what recovery and discovery found wrong.
    fn start_preparer(&self) -> Result<Arc<Preparer>> {
        let (preparer, report) = Preparer::start(
            &self.preparer_config(),
            self.inventory,
            self.device_nodes(),
            self.files.clone(),
        )
        .context("starting the prepare state machine")?;
        tracing::info!(
            rebooted = report.rebooted,
            rolled_back = report.rolled_back.len(),
            rolled_forward = report.rolled_forward.len(),
            stale_specs_removed = report.stale_specs_removed.len(),
            orphan_specs_removed = report.orphan_specs_removed.len(),
            quarantined = report.quarantined.is_some(),
            bad_records = report.bad_records.len(),
            save_failed = report.save_failed.is_some(),
            "recovered prepared claims"
        );
        #[cfg(feature = "crash-points")]
        let preparer = crate::crash::with_test_crash_at(preparer, &self.args.crash)?;
        let (client, node, inventory) = (
            self.client.clone(),
            self.args.node_name.clone(),
            self.inventory.clone(),
        );
        tokio::spawn(async move {
            events::recovery_events(client.clone(), &node, &report).await;
            events::mig_events(client, &node, &inventory).await;
        });
        Ok(Arc::new(preparer))
    }
}

/// Warns, in the log and on the Node, about host device nodes that containers would
/// get wrong (see `topodra_driver::cdi::host_node_problems`); each with its fix.
fn host_node_check(
    cdi: &CdiConfig,
    inventory: &topodra_driver::Inventory,
    client: &kube::Client,
    node: &str,
) {
    let mut names: Vec<String> = inventory
        .gpus
        .iter()
        .filter_map(|g| g.minor)
        .map(|m| format!("nvidia{m}"))
        .collect();
    names.extend(["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"].map(String::from));
    let problems = host_node_problems(&cdi.device_nodes(), &cdi.dev_root, &names);
    if problems.is_empty() {
        return;
    }
    for p in &problems {
        tracing::warn!(problem = %p.message(), "host device node");
    }
    let note = problems
        .iter()
        .map(HostNodeProblem::message)
        .collect::<Vec<_>>()
        .join("; ");
    let (client, node) = (client.clone(), node.to_owned());
    tokio::spawn(async move {
        events::node_event(client, &node, "DeviceNodesIncomplete", "Start", note).await;
    });
}

/// Keeps the metrics of device health and publishing current from the monitor's and
/// the publisher's status; ends when both are gone.
async fn export_status(
    metrics: Arc<Metrics>,
    mut health: watch::Receiver<HealthState>,
    mut published: watch::Receiver<crate::publish::PublishStatus>,
) {
    let mut last = published.borrow_and_update().clone();
    metrics.set_publish(&crate::publish::PublishStatus::Starting, &last);
    metrics.set_health(&health.borrow_and_update());
    let (mut health_open, mut published_open) = (true, true);
    while health_open || published_open {
        tokio::select! {
            r = health.changed(), if health_open => match r {
                Ok(()) => metrics.set_health(&health.borrow_and_update()),
                Err(_) => health_open = false,
            },
            r = published.changed(), if published_open => match r {
                Ok(()) => {
                    let now = published.borrow_and_update().clone();
                    metrics.set_publish(&last, &now);
                    last = now;
                }
                Err(_) => published_open = false,
            },
        }
    }
}

/// Starts the health monitor: NVML events and probes, under the flags' policy.
fn start_health(
    args: &ServeArgs,
    inventory: &topodra_driver::Inventory,
    metrics: &Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (JoinHandle<()>, watch::Receiver<HealthState>) {
    let mut policy = HealthPolicy::default();
    policy
        .ignored_xids
        .extend(args.health.ignored_xids.iter().copied());
    policy.quiet_period = Duration::from_secs(args.health.health_quiet_period_seconds);
    let metrics = Arc::clone(metrics);
    HealthMonitor::spawn_observed(
        inventory,
        NvmlOpener::new(Some(args.discovery.nvml_lib.clone())),
        MonitorConfig {
            policy,
            ..MonitorConfig::default()
        },
        Arc::new(move |seen| metrics.observe_health(seen)),
        shutdown,
    )
}

/// Serves the kubelet from the node state this instance owns, until it is told to
/// stop or another instance asks for the state; then takes everything down in the
/// order that loses no work, and says why it stopped.
async fn serve(
    ctx: &Setup<'_>,
    preparer: Arc<Preparer>,
    until: impl std::future::Future<Output = Stop>,
) -> Result<Stop> {
    let Setup {
        args,
        inventory,
        client,
        metrics,
        lifecycle,
        ..
    } = *ctx;
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
    let pool = PoolBuilder::new(
        Arc::new(inventory.clone()),
        &args.discovery.driver_name,
        &args.node_name,
        args.discovery.numa_node_format,
        args.discovery.numa_node_aliases.clone(),
    );
    let (taints_task, desired_rx) =
        taint_loop::spawn(health_rx.clone(), pool, args.health.evict_unhealthy);

    let sockets = args.sockets();
    // Only an owner knows that no other instance serves on them.
    if preparer.read_only().is_none() {
        for path in sockets.remove_leftovers(&args.discovery.driver_name).await {
            tracing::info!(socket = %path.display(), "removed a socket a killed instance left");
        }
    }
    let api_claims = Arc::new(ApiClaims::new(
        client.clone(),
        ReadPolicy {
            attempt_timeout: Duration::from_secs(args.claims.claim_read_timeout_seconds),
            deadline: Duration::from_secs(args.claims.claim_read_deadline_seconds),
            ..ReadPolicy::default()
        },
    ));
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
            move |record: &topodra_driver::checkpoint::ClaimRecord, why: &str| {
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
    let mut plugin = PluginBuilder::new(
        &args.discovery.driver_name,
        &args.node_name,
        sockets,
        driver,
        api_claims,
    )
    .metrics(metrics.claims().clone())
    .concurrency(
        ClaimConcurrency::new(
            args.claims.max_concurrent_claims_per_call as usize,
            args.claims.max_concurrent_claims as usize,
        )
        .call_deadline(Duration::from_secs(args.claims.call_deadline_seconds)),
    )
    .start()?;

    let publisher_config = PublisherConfig::new(&args.discovery.driver_name, &args.node_name);
    let slices = match &*desired_rx.borrow() {
        crate::publish::DesiredPool::Slices(s) => s.len(),
        crate::publish::DesiredPool::Invalid(_) => 1,
    };
    let publisher = Publisher::new(client.clone(), publisher_config, desired_rx);
    let publish_status = publisher.status();
    let publisher_task = tokio::spawn(publisher.run(shutdown()));
    tokio::spawn(export_status(
        metrics.clone(),
        health_rx.clone(),
        publish_status.clone(),
    ));
    let (check_client, node, driver) = (
        client.clone(),
        args.node_name.clone(),
        args.discovery.driver_name.clone(),
    );
    tokio::spawn(async move { events::squatted_names(check_client, &node, &driver, slices).await });
    lifecycle.serving(
        plugin.sockets().registration.clone(),
        plugin.sockets().dra.clone(),
        plugin.registered(),
        publish_status,
        preparer.read_only().map(str::to_owned),
    );

    let stop = tokio::select! {
        () = shutdown::signal() => Stop::Terminate,
        stop = until => stop,
    };
    // Unregister first: with the registration socket gone the kubelet stops sending
    // new claims here, while prepares in flight finish on the DRA socket.
    plugin.unregister().await;
    let _ = shutdown_tx.send(true);
    plugin.stop().await;
    // The drain is shorter than a claim read may take on a slow API server, so a
    // prepare can still be on its way to the state machine. The fence waits for
    // every call that is writing and refuses every later one: after it, this
    // process writes no checkpoint and no CDI spec.
    let to = match &stop {
        Stop::Handover(to) => to.clone(),
        Stop::Terminate | Stop::StateUsable(_) => "the next instance".to_owned(),
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
async fn stop_task(what: &str, mut task: JoinHandle<()>) {
    if tokio::time::timeout(Duration::from_secs(5), &mut task)
        .await
        .is_err()
    {
        tracing::warn!(task = what, "did not stop within 5 s; aborted");
        task.abort();
        let _ = task.await;
    }
}
