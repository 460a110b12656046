//! `serve`: the DaemonSet entry point. Discovers the node, recovers prepared claims,
//! serves the kubelet over Unix sockets, publishes the ResourceSlices, and exposes
//! metrics and health, until SIGTERM.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use k8s_openapi::api::core::v1::ObjectReference;
use tokio::sync::watch;
use topodra_driver::cdi::{CdiConfig, DriverFiles};
use topodra_driver::checkpoint::read_boot_id;
use topodra_driver::discovery::{self, DiscoveryConfig, NvmlPolicy, TopologyInput};
use topodra_driver::prepare::{Preparer, PreparerConfig, StartupReport};
use topodra_driver::slice::{self, NumaNodeFormat};
use topodra_proto::dra::{v1, v1beta1};
use topodra_proto::pluginregistration::v1::registration_server::RegistrationServer;

use crate::grpc::claims::{ApiClaims, ReadPolicy};
use crate::grpc::dra::{ClaimConcurrency, DraService, DraServiceV1beta1};
use crate::grpc::registration::RegistrationService;
use crate::health::grpc::HealthService;
use crate::health::model::HealthState;
use crate::health::monitor::{HealthMonitor, MonitorConfig};
use crate::health::nvml::NvmlOpener;
use crate::health::policy::HealthPolicy;
use crate::health::taints::{TaintEffect, device_taints};
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::ownership;
use crate::publish::{DesiredPool, Publisher, PublisherConfig};
use crate::reconcile::{self, ReconcileConfig};
use crate::uds;
use topodra_ops::http::{Endpoints, HttpLimits};
use topodra_ops::requests::RequestCounter;

/// Turns each health change into the pool's taints; the publisher writes them.
async fn follow_health(
    mut health: watch::Receiver<HealthState>,
    desired: watch::Sender<DesiredPool>,
    inventory: Arc<topodra_driver::Inventory>,
    effect: TaintEffect,
) {
    loop {
        let taints = device_taints(
            &health.borrow_and_update(),
            std::time::SystemTime::now(),
            effect,
        );
        desired.send_if_modified(|pool| {
            if pool.device_taints == taints {
                return false;
            }
            *pool = DesiredPool {
                inventory: inventory.clone(),
                device_taints: taints,
            };
            true
        });
        if health.changed().await.is_err() {
            return;
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// This node's name: the pool name and the slices' nodeName.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,

    /// DRA driver name.
    #[arg(long, env = "TOPODRA_DRIVER_NAME", default_value = slice::DEFAULT_DRIVER_NAME)]
    driver_name: String,

    /// The kubelet's plugin registry directory, watched by its plugin manager.
    #[arg(
        long,
        env = "TOPODRA_KUBELET_REGISTRY_DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    kubelet_registry_dir: PathBuf,

    /// The kubelet's plugins directory; the DRA socket goes in `<dir>/<driver>/`.
    #[arg(
        long,
        env = "TOPODRA_KUBELET_PLUGINS_DIR",
        default_value = "/var/lib/kubelet/plugins"
    )]
    kubelet_plugins_dir: PathBuf,

    /// Where the checkpoint lives (default: the plugin's directory under the kubelet's).
    #[arg(long, env = "TOPODRA_STATE_DIR")]
    state_dir: Option<PathBuf>,

    /// The pod's UID, for socket names that let a new plugin pod register before the
    /// old one is gone (rolling update).
    #[arg(long, env = "POD_UID")]
    pod_uid: Option<String>,

    /// The CDI spec directory container runtimes read.
    #[arg(long, env = "TOPODRA_CDI_DIR", default_value = topodra_driver::cdi::DEFAULT_SPEC_DIR)]
    cdi_dir: PathBuf,

    /// Root of the NVIDIA driver installation as the host sees it (`/run/nvidia/driver`
    /// for a containerized driver).
    #[arg(long, env = "TOPODRA_DRIVER_ROOT", default_value = "/")]
    driver_root: PathBuf,

    /// Where this container sees the driver root, when it is mounted elsewhere.
    #[arg(long, env = "TOPODRA_DRIVER_ROOT_LOCAL")]
    driver_root_local: Option<PathBuf>,

    /// A toolkit-generated CDI spec whose mounts and hooks replace our own discovery.
    #[arg(long, env = "TOPODRA_TOOLKIT_CDI_SPEC")]
    toolkit_cdi_spec: Option<PathBuf>,

    /// The directory holding the host's `dev/`, as this container sees it.
    #[arg(long, env = "TOPODRA_DEV_ROOT", default_value = "/")]
    dev_root: PathBuf,

    /// The kernel's device registry, for device majors when a node is not in `/dev`.
    #[arg(long, env = "TOPODRA_PROC_DEVICES", default_value = "/proc/devices")]
    proc_devices: PathBuf,

    /// Where the NVIDIA driver lists the capability minors of MIG devices.
    #[arg(long, env = "TOPODRA_NVIDIA_CAPABILITIES_DIR", default_value = topodra_driver::cdi::DEFAULT_CAPABILITIES_DIR)]
    nvidia_capabilities_dir: PathBuf,

    /// NVML library to load.
    #[arg(long, env = "TOPODRA_NVML_LIB", default_value = discovery::nvml::DEFAULT_NVML_LIB)]
    nvml_lib: PathBuf,

    /// Read topology from this hwloc XML export instead of the live machine.
    #[arg(long, env = "TOPODRA_HWLOC_XML")]
    hwloc_xml: Option<PathBuf>,

    /// sysfs root for the topology fallback.
    #[arg(long, env = "TOPODRA_SYSFS_ROOT", default_value = "/sys")]
    sysfs_root: PathBuf,

    /// `int` or `list` form of `resource.kubernetes.io/numaNode`.
    #[arg(long, env = "TOPODRA_NUMA_NODE_FORMAT", default_value = "int")]
    numa_node_format: NumaNodeFormat,

    /// IP address the /metrics, /healthz and /readyz endpoint binds (IPv4 or IPv6,
    /// without brackets). The Helm chart sets the pod's IP.
    #[arg(long, env = "TOPODRA_HTTP_BIND_ADDRESS", default_value_t = IpAddr::V4(Ipv4Addr::UNSPECIFIED))]
    http_bind_address: IpAddr,

    /// Port of the /metrics, /healthz and /readyz endpoint.
    #[arg(long, env = "TOPODRA_HTTP_PORT", default_value_t = 9464)]
    http_port: u16,

    /// Address and port of the endpoint in one (`127.0.0.1:9464`, `[::1]:9464`);
    /// when set, it takes the place of --http-bind-address and --http-port.
    #[arg(long, env = "TOPODRA_HTTP_ADDR")]
    http_addr: Option<SocketAddr>,

    /// Seconds a client of the endpoint has to send a request's headers (and the
    /// longest an idle connection stays open); slower ones are disconnected.
    #[arg(
        long,
        env = "TOPODRA_HTTP_HEADER_READ_TIMEOUT_SECONDS",
        default_value_t = 5,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    http_header_read_timeout_seconds: u64,

    /// Open connections the endpoint serves at once; further ones are closed at once.
    #[arg(
        long,
        env = "TOPODRA_HTTP_MAX_CONNECTIONS",
        default_value_t = 32,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    http_max_connections: u32,

    /// Claims of one NodePrepareResources or NodeUnprepareResources call worked on at
    /// once (each prepare is one claim GET); the others wait their turn.
    #[arg(
        long,
        env = "TOPODRA_MAX_CONCURRENT_CLAIMS_PER_CALL",
        default_value_t = 16,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    max_concurrent_claims_per_call: u32,

    /// Limit on one GET of a claim on the prepare path.
    #[arg(
        long,
        env = "TOPODRA_CLAIM_READ_TIMEOUT_SECONDS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    claim_read_timeout_seconds: u64,

    /// Limit on reading a claim, retries included (jittered backoff from 200 ms);
    /// keep it under the kubelet's 45 s for a whole prepare call.
    #[arg(
        long,
        env = "TOPODRA_CLAIM_READ_DEADLINE_SECONDS",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=40)
    )]
    claim_read_deadline_seconds: u64,

    /// How often prepared claims are looked up in the API server (one GET each) to
    /// find those that no longer exist.
    #[arg(
        long,
        env = "TOPODRA_STALE_CLAIM_CHECK_INTERVAL_SECONDS",
        default_value_t = 600,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    stale_claim_check_interval_seconds: u64,

    /// How long a prepared claim must have been gone from the API server before the
    /// plugin unprepares it itself (the kubelet normally does it first).
    #[arg(long, env = "TOPODRA_STALE_CLAIM_GRACE_SECONDS", default_value_t = 300)]
    stale_claim_grace_seconds: u64,

    /// Claims worked on at once across all calls.
    #[arg(
        long,
        env = "TOPODRA_MAX_CONCURRENT_CLAIMS",
        default_value_t = 64,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    max_concurrent_claims: u32,

    /// File holding the kernel's boot id.
    #[arg(long, env = "TOPODRA_BOOT_ID_FILE", default_value = topodra_driver::checkpoint::DEFAULT_BOOT_ID_PATH)]
    boot_id_file: PathBuf,

    /// XIDs never treated as a GPU failure, on top of the built-in application errors
    /// (13, 31, 43, 45, 68, 109). Comma-separated.
    #[arg(long, env = "TOPODRA_IGNORED_XIDS", value_delimiter = ',')]
    ignored_xids: Vec<u64>,

    /// Seconds without a fatal XID before an unhealthy GPU may be healthy again.
    #[arg(
        long,
        env = "TOPODRA_HEALTH_QUIET_PERIOD_SECONDS",
        default_value_t = 300
    )]
    health_quiet_period_seconds: u64,

    /// Taint unhealthy GPUs `NoExecute` (evicting the pods using them) instead of
    /// `NoSchedule`.
    #[arg(long, env = "TOPODRA_EVICT_UNHEALTHY")]
    evict_unhealthy: bool,

    #[command(flatten)]
    crash: CrashArgs,
}

/// Fault injection for tests, only in builds with the `crash-points` feature: a
/// release binary has no such flag.
#[cfg(feature = "crash-points")]
#[derive(Debug, clap::Args)]
struct CrashArgs {
    /// Abort the process at this point of every prepare.
    #[arg(long, env = "TOPODRA_TEST_CRASH_AT", hide = true)]
    test_crash_at: Option<String>,
}

#[cfg(not(feature = "crash-points"))]
#[derive(Debug, clap::Args)]
struct CrashArgs {}

struct Sockets {
    registration: PathBuf,
    dra: PathBuf,
}

impl ServeArgs {
    fn sockets(&self) -> Sockets {
        let plugin_dir = self.kubelet_plugins_dir.join(&self.driver_name);
        match &self.pod_uid {
            Some(uid) => Sockets {
                registration: self
                    .kubelet_registry_dir
                    .join(format!("{}-{uid}-reg.sock", self.driver_name)),
                dra: plugin_dir.join(format!("dra-{uid}.sock")),
            },
            None => Sockets {
                registration: self
                    .kubelet_registry_dir
                    .join(format!("{}-reg.sock", self.driver_name)),
                dra: plugin_dir.join("dra.sock"),
            },
        }
    }

    fn http_addr(&self) -> SocketAddr {
        self.http_addr
            .unwrap_or(SocketAddr::new(self.http_bind_address, self.http_port))
    }

    fn state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| self.kubelet_plugins_dir.join(&self.driver_name))
    }
}

async fn shutdown_signal() {
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    return std::future::pending().await;
                }
            };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        }
    }
}

/// Records a Warning Event on this plugin's Node, where `kubectl describe node`
/// shows it; failing to record one is logged, never fatal.
async fn node_event(client: kube::Client, node: &str, reason: &str, action: &str, note: String) {
    let recorder = kube::runtime::events::Recorder::new(
        client,
        kube::runtime::events::Reporter {
            controller: "topodra-kubelet-plugin".into(),
            instance: Some(node.to_owned()),
        },
    );
    let event = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Warning,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    let node_ref = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_owned()),
        ..Default::default()
    };
    if let Err(e) = recorder.publish(&event, &node_ref).await {
        tracing::warn!(error = %e, reason, "could not record an event on the node");
    }
}

/// Warning Events on the Node for what recovery found wrong with the node's own
/// state, so an operator learns of it without reading logs.
async fn recovery_events(client: kube::Client, node: &str, report: &StartupReport) {
    if let Some(q) = &report.quarantined {
        let note = format!(
            "corrupt checkpoint ({}) moved to {}; rebuilt {} claim(s) from CDI specs",
            q.reason,
            q.path.display(),
            report.rebuilt.len()
        );
        node_event(
            client.clone(),
            node,
            "CheckpointQuarantined",
            "Recover",
            note,
        )
        .await;
    }
    for bad in &report.bad_records {
        node_event(
            client.clone(),
            node,
            "CheckpointRecordDropped",
            "Recover",
            bad.clone(),
        )
        .await;
    }
    if let Some(e) = &report.save_failed {
        let note = format!(
            "recovered state could not be saved ({e}); serving from memory, prepares fail until the disk accepts writes"
        );
        node_event(client, node, "CheckpointNotSaved", "Recover", note).await;
    }
}

/// One Event per GPU that discovery left out because of its MIG mode, so an
/// operator sees on the Node why it offers fewer devices than it has GPUs.
async fn mig_events(client: kube::Client, node: &str, inventory: &topodra_driver::Inventory) {
    for gpu in &inventory.gpus {
        let Some(warning) = topodra_driver::discovery::mig_warning(gpu) else {
            continue;
        };
        node_event(client.clone(), node, "GpuNotOffered", "Discover", warning).await;
    }
}

/// Why serving ended.
enum Stop {
    /// SIGTERM or SIGINT: the pod is being deleted.
    Terminate,
    /// Another instance (the new pod of a rolling update) asked for the node state.
    Handover(String),
}

/// The name this instance gives itself in takeover requests and the lock file.
/// How the API server's audit log and metrics name this program.
const USER_AGENT: &str = concat!("topodra-kubelet-plugin/", env!("CARGO_PKG_VERSION"));

fn instance_name(args: &ServeArgs) -> String {
    match &args.pod_uid {
        Some(uid) => format!("pod {uid}"),
        None => format!("process {}", std::process::id()),
    }
}

pub(crate) async fn run(args: ServeArgs) -> Result<()> {
    let inventory = discovery::discover(&DiscoveryConfig {
        nvml_lib: Some(args.nvml_lib.clone()),
        nvml: NvmlPolicy::Required,
        topology: match &args.hwloc_xml {
            Some(path) => TopologyInput::HwlocXml(path.clone()),
            None => TopologyInput::Live,
        },
        sysfs_root: args.sysfs_root.clone(),
    })
    .context("discovering GPUs")?;
    let devices = inventory.allocatable().len();
    tracing::info!(gpus = inventory.gpus.len(), devices, "discovered");

    let cdi = CdiConfig {
        spec_dir: args.cdi_dir.clone(),
        driver_root: args.driver_root.clone(),
        driver_root_local: args.driver_root_local.clone(),
        toolkit_spec: args.toolkit_cdi_spec.clone(),
        dev_root: args.dev_root.clone(),
        capabilities_dir: args.nvidia_capabilities_dir.clone(),
    };
    let files =
        DriverFiles::load(&cdi).context("finding the NVIDIA driver's files for CDI specs")?;
    let boot_id = read_boot_id(&args.boot_id_file).context("reading the boot id")?;

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
    let http_addr = args.http_addr();
    let listener = tokio::net::TcpListener::bind(http_addr)
        .await
        .with_context(|| format!("binding the HTTP endpoint to {http_addr}"))?;
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
        header_read_timeout: Duration::from_secs(args.http_header_read_timeout_seconds),
        max_connections: args.http_max_connections as usize,
    };
    let (http_stop_tx, http_stop_rx) = watch::channel(false);
    let http = tokio::spawn(topodra_ops::http::serve(listener, endpoints, limits, {
        let mut rx = http_stop_rx;
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }));

    // One instance owns the node's state at a time; a rolling update's new pod
    // waits here until the old one has handed over.
    let name = instance_name(&args);
    let state_dir = args.state_dir();
    let ownership = tokio::select! {
        owned = ownership::acquire(&state_dir, &name, ownership::Timing::default()) => {
            owned.context("taking ownership of the node state")?
        }
        () = shutdown_signal() => {
            tracing::info!("terminated while waiting for the node state");
            let _ = http_stop_tx.send(true);
            let _ = tokio::time::timeout(Duration::from_secs(1), http).await;
            return Ok(());
        }
    };

    tracing::info!(owner = ownership.name(), "owns the node state");
    let stop = serve(
        &args, inventory, cdi, files, boot_id, client, metrics, &lifecycle, &ownership,
    )
    .await?;
    if let Stop::Handover(to) = stop {
        // Serving has ended and its state is dropped; releasing the lock lets the
        // new owner read the checkpoint. Exiting would only restart this container.
        drop(ownership);
        lifecycle.handed_over(&to);
        tracing::info!(to = %to, "handed the node state over; idle until this pod is deleted");
        shutdown_signal().await;
    }
    let _ = http_stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(1), http).await;
    tracing::info!("stopped");
    Ok(())
}

/// Serves the kubelet from the node state this instance owns, until it is told to
/// stop or another instance asks for the state; then takes everything down in the
/// order that loses no work, and says why it stopped.
#[allow(clippy::too_many_arguments)]
async fn serve(
    args: &ServeArgs,
    inventory: topodra_driver::Inventory,
    cdi: CdiConfig,
    files: DriverFiles,
    boot_id: String,
    client: kube::Client,
    metrics: Arc<Metrics>,
    lifecycle: &Lifecycle,
    ownership: &ownership::Ownership,
) -> Result<Stop> {
    let (preparer, report) = Preparer::start(
        &PreparerConfig {
            driver_name: args.driver_name.clone(),
            node_name: args.node_name.clone(),
            state_dir: args.state_dir(),
            boot_id,
            cdi_spec_dir: args.cdi_dir.clone(),
        },
        &inventory,
        Box::new(cdi.device_nodes().with_proc_devices(&args.proc_devices)),
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
    let preparer = with_test_crash_at(preparer, &args.crash)?;
    let preparer = Arc::new(preparer);
    {
        let (client, node) = (client.clone(), args.node_name.clone());
        let inventory = inventory.clone();
        tokio::spawn(async move {
            recovery_events(client.clone(), &node, &report).await;
            mig_events(client, &node, &inventory).await;
        });
    }
    metrics.set_prepared_devices(preparer.prepared_devices());

    // Two stop signals: registration stops first, everything else after it.
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (unregister_tx, unregister_rx) = watch::channel(false);
    let stopped = |rx: &watch::Receiver<bool>| {
        let mut rx = rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let shutdown = || stopped(&shutdown_rx);

    let mut policy = HealthPolicy::default();
    policy
        .ignored_xids
        .extend(args.ignored_xids.iter().copied());
    policy.quiet_period = Duration::from_secs(args.health_quiet_period_seconds);
    let (health_task, health_rx) = HealthMonitor::spawn(
        &inventory,
        NvmlOpener::new(Some(args.nvml_lib.clone())),
        MonitorConfig {
            policy,
            ..MonitorConfig::default()
        },
        shutdown(),
    );
    let inventory = Arc::new(inventory);
    let (desired_tx, desired_rx) = watch::channel(DesiredPool::new(inventory.clone()));
    let effect = if args.evict_unhealthy {
        TaintEffect::NoExecute
    } else {
        TaintEffect::NoSchedule
    };
    let taints_task = tokio::spawn(follow_health(
        health_rx.clone(),
        desired_tx,
        inventory,
        effect,
    ));

    // The DRA socket first: the kubelet may call it as soon as registration succeeds.
    let sockets = args.sockets();
    remove_leftover_sockets(args, &sockets).await;
    let api_claims = Arc::new(ApiClaims::new(
        client.clone(),
        ReadPolicy {
            attempt_timeout: Duration::from_secs(args.claim_read_timeout_seconds),
            deadline: Duration::from_secs(args.claim_read_deadline_seconds),
            ..ReadPolicy::default()
        },
    ));
    let reconcile_task = {
        let (client, node) = (client.clone(), args.node_name.clone());
        tokio::spawn(reconcile::run(
            preparer.clone(),
            api_claims.clone(),
            ReconcileConfig {
                interval: Duration::from_secs(args.stale_claim_check_interval_seconds),
                grace: Duration::from_secs(args.stale_claim_grace_seconds),
            },
            move |record, why| {
                let note = format!(
                    "unprepared claim {}/{} (UID {}, devices {}): {why}",
                    record.namespace,
                    record.name,
                    record.uid,
                    record
                        .devices
                        .iter()
                        .map(|d| d.device.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                );
                let (client, node) = (client.clone(), node.clone());
                tokio::spawn(async move {
                    node_event(client, &node, "StaleClaimUnprepared", "Unprepare", note).await;
                });
            },
            shutdown(),
        ))
    };
    let dra = DraService::new(
        preparer.clone(),
        api_claims,
        metrics.clone(),
        ClaimConcurrency::new(
            args.max_concurrent_claims_per_call as usize,
            args.max_concurrent_claims as usize,
        ),
    );
    drop(preparer);
    let (mut dra_guard, dra_incoming) =
        uds::serve_uds(&sockets.dra).context("binding the DRA socket")?;
    let dra_server = tokio::spawn(
        grpc_server()
            .add_service(v1::dra_plugin_server::DraPluginServer::new(dra.clone()))
            .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(
                DraServiceV1beta1(dra),
            ))
            .add_service(HealthService::new(&args.node_name, health_rx.clone()).v1_server())
            .add_service(HealthService::new(&args.node_name, health_rx.clone()).v1alpha1_server())
            .serve_with_incoming_shutdown(dra_incoming, shutdown()),
    );

    let registered = Arc::new(AtomicBool::new(false));
    let registration = RegistrationService {
        driver_name: args.driver_name.clone(),
        endpoint: sockets.dra.display().to_string(),
        supported_versions: topodra_proto::DRA_SUPPORTED_SERVICES
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        registered: registered.clone(),
    };
    let (mut reg_guard, reg_incoming) =
        uds::serve_uds(&sockets.registration).context("binding the registration socket")?;
    let reg_server = tokio::spawn(
        grpc_server()
            .add_service(RegistrationServer::new(registration))
            .serve_with_incoming_shutdown(reg_incoming, stopped(&unregister_rx)),
    );
    tracing::info!(registration = %sockets.registration.display(), dra = %sockets.dra.display(), "serving the kubelet");

    let mut publisher_config = PublisherConfig::new(&args.driver_name, &args.node_name);
    publisher_config.numa_node_format = args.numa_node_format;
    let publisher = Publisher::new(client, publisher_config, desired_rx);
    let publish_status = publisher.status();
    let publisher_task = tokio::spawn(publisher.run(shutdown()));
    lifecycle.serving(
        sockets.registration.clone(),
        sockets.dra.clone(),
        registered,
        publish_status,
    );

    let stop = tokio::select! {
        () = shutdown_signal() => Stop::Terminate,
        who = ownership.handover_requested(ownership::Timing::default()) => {
            tracing::info!(to = %who, "handing the node state over to another instance");
            Stop::Handover(who)
        }
    };
    // Unregister first: with the registration socket gone the kubelet stops sending
    // new claims here, while prepares in flight finish on the DRA socket.
    let _ = unregister_tx.send(true);
    if let Err(e) = reg_guard.remove() {
        tracing::warn!(socket = %reg_guard.path().display(), error = %e, "removing the registration socket");
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), reg_server).await;
    let _ = shutdown_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(20), dra_server).await;
    if let Err(e) = dra_guard.remove() {
        tracing::warn!(socket = %dra_guard.path().display(), error = %e, "removing the DRA socket");
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), publisher_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), health_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), reconcile_task).await;
    taints_task.abort();
    Ok(stop)
}

/// Removes the registration and DRA sockets that killed instances of this driver
/// left (pod-UID names pile up otherwise, one per killed pod). Only the owner of the
/// node state calls this, so no other instance serves on them.
async fn remove_leftover_sockets(args: &ServeArgs, ours: &Sockets) {
    let driver = args.driver_name.clone();
    let registration = move |n: &str| {
        n == format!("{driver}-reg.sock")
            || (n.starts_with(&format!("{driver}-")) && n.ends_with("-reg.sock"))
    };
    let dra = |n: &str| n == "dra.sock" || (n.starts_with("dra-") && n.ends_with(".sock"));
    let mut removed =
        uds::remove_leftover_sockets(&args.kubelet_registry_dir, registration, &ours.registration)
            .await;
    if let Some(dir) = ours.dra.parent() {
        removed.extend(uds::remove_leftover_sockets(dir, dra, &ours.dra).await);
    }
    for path in removed {
        tracing::info!(socket = %path.display(), "removed a socket a killed instance left");
    }
}

/// A gRPC server with the header-list and frame-size limits the `:authority` shim
/// in front of it enforces, set here rather than left to defaults so the two cannot
/// drift apart.
fn grpc_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_max_header_list_size(uds::MAX_HEADER_LIST as u32)
        .max_frame_size(uds::MAX_FRAME_SIZE as u32)
}

#[cfg(feature = "crash-points")]
fn with_test_crash_at(mut preparer: Preparer, args: &CrashArgs) -> Result<Preparer> {
    use topodra_driver::prepare::CrashPoint;
    if let Some(point) = &args.test_crash_at {
        let point: CrashPoint = point.parse().map_err(anyhow::Error::msg)?;
        tracing::warn!(
            ?point,
            "fault injection: the process aborts there in every prepare"
        );
        preparer = preparer.with_crash_hook(Arc::new(move |at| {
            if at == point {
                std::process::abort();
            }
            false
        }));
    }
    Ok(preparer)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn http_addr(flags: &[&str]) -> Result<SocketAddr, clap::Error> {
        let argv = ["serve", "--node-name=node-a"].iter().chain(flags);
        Cli::try_parse_from(argv).map(|c| c.serve.http_addr())
    }

    #[test]
    fn http_endpoint_address_from_bind_address_and_port() {
        assert_eq!(http_addr(&[]).unwrap(), "0.0.0.0:9464".parse().unwrap());
        assert_eq!(
            http_addr(&["--http-bind-address=10.1.2.3", "--http-port=9000"]).unwrap(),
            "10.1.2.3:9000".parse().unwrap()
        );
        // A pod IP from the downward API is a bare IPv6 address, without brackets.
        assert_eq!(
            http_addr(&["--http-bind-address=fd00::12"]).unwrap(),
            "[fd00::12]:9464".parse().unwrap()
        );
        assert_eq!(
            http_addr(&["--http-bind-address=10.1.2.3", "--http-addr=127.0.0.1:0"]).unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        assert!(http_addr(&["--http-bind-address=node-a.local"]).is_err());
    }

    #[test]
    fn limits_of_zero_are_refused() {
        for flag in [
            "--http-max-connections=0",
            "--http-header-read-timeout-seconds=0",
            "--max-concurrent-claims-per-call=0",
            "--max-concurrent-claims=0",
        ] {
            assert!(http_addr(&[flag]).is_err(), "{flag}");
        }
    }
}
