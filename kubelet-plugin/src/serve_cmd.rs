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
use topodra_driver::cdi::{CdiConfig, NvidiaFiles};
use topodra_driver::checkpoint::read_boot_id;
use topodra_driver::discovery::{self, DiscoveryConfig, NvmlPolicy, TopologyInput};
use topodra_driver::health::{HealthPolicy, HealthState};
use topodra_driver::prepare::{Preparer, PreparerConfig};
use topodra_ops::http::{Endpoints, HttpLimits};
use topodra_ops::requests::RequestCounter;

pub(crate) use crate::args::ServeArgs;
use crate::events;
use crate::health::monitor::{HealthMonitor, MonitorConfig};
use crate::health::nvml::NvmlOpener;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::node_driver::NodeDriver;
use crate::ownership;
use crate::publish::{PoolBuilder, Publisher, PublisherConfig};
use crate::reconcile::{self, ReconcileConfig};
use crate::shutdown::{self, Stop};
use crate::taint_loop;

/// How the API server's audit log and metrics name this program.
const USER_AGENT: &str = concat!("topodra-kubelet-plugin/", env!("CARGO_PKG_VERSION"));

pub(crate) async fn run(args: ServeArgs) -> Result<()> {
    let d = &args.discovery;
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
    let devices = inventory.allocatable().len();
    tracing::info!(gpus = inventory.gpus.len(), devices, "discovered");

    let cdi = CdiConfig {
        spec_dir: args.cdi.cdi_dir.clone(),
        driver_root: args.cdi.driver_root.clone(),
        driver_root_local: args.cdi.driver_root_local.clone(),
        toolkit_spec: args.cdi.toolkit_cdi_spec.clone(),
        dev_root: args.cdi.dev_root.clone(),
        capabilities_dir: args.cdi.nvidia_capabilities_dir.clone(),
    };
    let files =
        NvidiaFiles::load(&cdi).context("finding the NVIDIA driver's files for CDI specs")?;
    let boot_id = read_boot_id(&args.cdi.boot_id_file).context("reading the boot id")?;

    let counter = RequestCounter::new();
    let kube_config = kube::Config::infer()
        .await
        .context("finding the API server (kubeconfig or in-cluster)")?;
    let client = topodra_ops::requests::counted_client(kube_config, &counter, USER_AGENT)
        .context("building the API client")?;
    let metrics = Arc::new(Metrics::new(&counter));
    metrics.set_devices(devices);

    // The HTTP endpoint first, and until the process exits: a pod waiting for the
    // node state, or done with it, must stay live. A bind address that is not the
    // pod's fails the start here, before the kubelet learns of this plugin.
    let lifecycle = Lifecycle::waiting();
    let http = HttpEndpoint::start(&args, &metrics, &lifecycle).await?;

    // One instance owns the node's state at a time; a rolling update's new pod
    // waits here until the old one has handed over.
    let name = args.instance_name();
    let state_dir = args.state_dir();
    let ownership = tokio::select! {
        owned = ownership::acquire(&state_dir, &name, ownership::Timing::default()) => {
            owned.context("taking ownership of the node state")?
        }
        () = shutdown::signal() => {
            tracing::info!("terminated while waiting for the node state");
            http.stop().await;
            return Ok(());
        }
    };

    tracing::info!(owner = ownership.name(), "owns the node state");
    let preparer = start_preparer(&args, &inventory, cdi, files, boot_id, &client)?;
    metrics
        .claims()
        .set_prepared_devices(preparer.prepared_devices());
    let stop = serve(
        &args, inventory, preparer, client, metrics, &lifecycle, &ownership,
    )
    .await?;
    if let Stop::Handover(to) = stop {
        // Serving has ended and its state is dropped; releasing the lock lets the
        // new owner read the checkpoint. Exiting would only restart this container.
        drop(ownership);
        lifecycle.handed_over(&to);
        tracing::info!(to = %to, "handed the node state over; idle until this pod is deleted");
        shutdown::signal().await;
    }
    http.stop().await;
    tracing::info!("stopped");
    Ok(())
}

/// The /metrics, /healthz and /readyz endpoint, served until [`HttpEndpoint::stop`].
struct HttpEndpoint {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl HttpEndpoint {
    async fn start(
        args: &ServeArgs,
        metrics: &Arc<Metrics>,
        lifecycle: &Lifecycle,
    ) -> Result<Self> {
        let addr = args.http.addr();
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the HTTP endpoint to {addr}"))?;
        let endpoints = Endpoints {
            metrics: {
                let metrics = metrics.clone();
                Arc::new(move || metrics.encode())
            },
            live: lifecycle.live_check(),
            ready: lifecycle.ready_check(),
            rejected: {
                let metrics = metrics.clone();
                Arc::new(move || metrics.connection_rejected())
            },
        };
        let limits = HttpLimits {
            header_read_timeout: Duration::from_secs(args.http.http_header_read_timeout_seconds),
            write_timeout: Duration::from_secs(args.http.http_write_timeout_seconds),
            max_connections: args.http.http_max_connections as usize,
            max_requests_per_connection: args.http.http_max_requests_per_connection as usize,
        };
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(topodra_ops::http::serve(
            listener,
            endpoints,
            limits,
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            },
        ));
        Ok(Self { stop, task })
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(1), self.task).await;
    }
}

/// Recovers the prepared claims from the checkpoint and CDI specs, and records on
/// the Node what recovery and discovery found wrong.
fn start_preparer(
    args: &ServeArgs,
    inventory: &topodra_driver::Inventory,
    cdi: CdiConfig,
    files: NvidiaFiles,
    boot_id: String,
    client: &kube::Client,
) -> Result<Arc<Preparer>> {
    let (preparer, report) = Preparer::start(
        &PreparerConfig {
            driver_name: args.discovery.driver_name.clone(),
            node_name: args.node_name.clone(),
            state_dir: args.state_dir(),
            boot_id,
            cdi_spec_dir: args.cdi.cdi_dir.clone(),
        },
        inventory,
        Box::new(cdi.device_nodes().with_proc_devices(&args.cdi.proc_devices)),
        files,
    )
    .context("starting the prepare state machine")?;
    tracing::info!(
        rebooted = report.rebooted,
        rolled_back = report.rolled_back.len(),
        orphan_specs_removed = report.orphan_specs_removed.len(),
        quarantined = report.quarantined.is_some(),
        bad_records = report.bad_records.len(),
        save_failed = report.save_failed.is_some(),
        "recovered prepared claims"
    );
    #[cfg(feature = "crash-points")]
    let preparer = crate::crash::with_test_crash_at(preparer, &args.crash)?;
    let (client, node, inventory) = (client.clone(), args.node_name.clone(), inventory.clone());
    tokio::spawn(async move {
        events::recovery_events(client.clone(), &node, &report).await;
        events::mig_events(client, &node, &inventory).await;
    });
    Ok(Arc::new(preparer))
}

/// Starts the health monitor: NVML events and probes, under the flags' policy.
fn start_health(
    args: &ServeArgs,
    inventory: &topodra_driver::Inventory,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (JoinHandle<()>, watch::Receiver<HealthState>) {
    let mut policy = HealthPolicy::default();
    policy
        .ignored_xids
        .extend(args.health.ignored_xids.iter().copied());
    policy.quiet_period = Duration::from_secs(args.health.health_quiet_period_seconds);
    HealthMonitor::spawn(
        inventory,
        NvmlOpener::new(Some(args.discovery.nvml_lib.clone())),
        MonitorConfig {
            policy,
            ..MonitorConfig::default()
        },
        shutdown,
    )
}

/// Serves the kubelet from the node state this instance owns, until it is told to
/// stop or another instance asks for the state; then takes everything down in the
/// order that loses no work, and says why it stopped.
async fn serve(
    args: &ServeArgs,
    inventory: topodra_driver::Inventory,
    preparer: Arc<Preparer>,
    client: kube::Client,
    metrics: Arc<Metrics>,
    lifecycle: &Lifecycle,
    ownership: &ownership::Ownership,
) -> Result<Stop> {
    // What stops after registration, with the plugin's DRA socket.
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shutdown = || {
        let mut rx = shutdown_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    let (health_task, health_rx) = start_health(args, &inventory, shutdown());
    let pool = PoolBuilder::new(
        Arc::new(inventory),
        &args.discovery.driver_name,
        &args.node_name,
        args.discovery.numa_node_format,
    );
    let (taints_task, desired_rx) =
        taint_loop::spawn(health_rx.clone(), pool, args.health.evict_unhealthy);

    let sockets = args.sockets();
    for path in sockets.remove_leftovers(&args.discovery.driver_name).await {
        tracing::info!(socket = %path.display(), "removed a socket a killed instance left");
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
        events::stale_claim_unprepared(client.clone(), args.node_name.clone()),
        shutdown(),
    ));
    let driver = Arc::new(NodeDriver::new(preparer, health_rx));
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
    let publisher = Publisher::new(client, publisher_config, desired_rx);
    let publish_status = publisher.status();
    let publisher_task = tokio::spawn(publisher.run(shutdown()));
    lifecycle.serving(
        plugin.sockets().registration.clone(),
        plugin.sockets().dra.clone(),
        plugin.registered(),
        publish_status,
    );

    let stop = tokio::select! {
        () = shutdown::signal() => Stop::Terminate,
        who = ownership.handover_requested(ownership::Timing::default()) => {
            tracing::info!(to = %who, "handing the node state over to another instance");
            Stop::Handover(who)
        }
    };
    // Unregister first: with the registration socket gone the kubelet stops sending
    // new claims here, while prepares in flight finish on the DRA socket.
    plugin.unregister().await;
    let _ = shutdown_tx.send(true);
    plugin.stop().await;
    let _ = tokio::time::timeout(Duration::from_secs(5), publisher_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), health_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), reconcile_task).await;
    taints_task.abort();
    Ok(stop)
}
