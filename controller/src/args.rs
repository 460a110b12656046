//! The controller's command line: every flag with its environment variable, checked
//! before anything starts.

use std::process::ExitCode;

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};
use topodra_model::slice::DEFAULT_DRIVER_NAME;
use topodra_ops::endpoint::HttpArgs;

/// The controller's endpoint port, beside the kubelet plugin's 9464 on the same host
/// network.
const HTTP_PORT: &str = "9465";

#[derive(Debug, Parser)]
#[command(
    name = "topodra-controller",
    version = topodra_ops::version::long(),
    about = "topodra's cluster controller: GPU capacity by topology, NodeResourceTopology without a node agent, why-pending Events"
)]
pub struct Args {
    /// DRA driver name of the kubelet plugins (their ResourceSlices' spec.driver).
    #[arg(long, env = "TOPODRA_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME)]
    pub(crate) driver_name: String,

    /// Device classes whose claims are ours besides those whose CEL selector compares
    /// `device.driver` with the driver name (comma-separated).
    #[arg(
        long = "device-class",
        env = "TOPODRA_DEVICE_CLASSES",
        value_delimiter = ','
    )]
    pub(crate) device_classes: Vec<String>,

    /// Driver name of the CPU DRA driver (dra-driver-cpu: `dra.cpu`) whose CPUs a
    /// claim can put on one NUMA node with our GPUs: its ResourceSlices are watched
    /// (one more watch, selected by `spec.driver`), and pending pods' explanations and
    /// NodeResourceTopology zones count its CPUs. Empty: no such watch.
    #[arg(long, env = "TOPODRA_CPU_DRIVER_NAME", default_value = "dra.cpu")]
    pub(crate) cpu_driver_name: String,

    /// The other drivers' names for the NUMA node that the kubelet plugins publish
    /// too (the same list as their --numa-node-aliases, comma-separated): a
    /// constraint on one of them aligns on the NUMA node.
    #[arg(long, env = "TOPODRA_NUMA_NODE_ALIASES", value_delimiter = ',')]
    pub(crate) numa_node_aliases: Vec<topodra_model::slice::NumaNodeAlias>,

    /// Publish a NodeResourceTopology object per GPU node (the CRD must be installed;
    /// without it the controller warns once and goes on without them).
    #[arg(long, env = "TOPODRA_NODE_RESOURCE_TOPOLOGY", default_value_t = true, action = ArgAction::Set)]
    pub(crate) node_resource_topology: bool,

    /// Resource name of the GPUs in each NodeResourceTopology zone.
    #[arg(
        long,
        env = "TOPODRA_NRT_RESOURCE_NAME",
        default_value = "nvidia.com/gpu"
    )]
    pub(crate) nrt_resource_name: String,

    /// Topology Manager policy the NodeResourceTopology objects announce; consumers
    /// such as the topology-aware scheduler align by it.
    #[arg(long, env = "TOPODRA_NRT_POLICY", default_value = "single-numa-node",
          value_parser = ["none", "best-effort", "restricted", "single-numa-node"])]
    pub(crate) nrt_topology_manager_policy: String,

    /// Topology Manager scope the objects announce.
    #[arg(long, env = "TOPODRA_NRT_SCOPE", default_value = "pod", value_parser = ["container", "pod"])]
    pub(crate) nrt_topology_manager_scope: String,

    /// Record an Event on each unschedulable pod that waits for our GPUs, saying why
    /// in topology terms.
    #[arg(long, env = "TOPODRA_PENDING_POD_EVENTS", default_value_t = true, action = ArgAction::Set)]
    pub(crate) pending_pod_events: bool,

    /// The least time between two Events on one pod, however often its explanation
    /// changes.
    #[arg(
        long,
        env = "TOPODRA_PENDING_EVENT_MIN_INTERVAL_SECONDS",
        default_value_t = 30
    )]
    pub(crate) pending_event_min_interval_seconds: u64,

    /// Milliseconds to gather changes before writing: a burst of allocations on a
    /// node is one write, and no node's object is written more often than this.
    /// (The NFD topology updater writes every 60 s; 500 ms made 500 busy nodes
    /// about four writes per node per scheduling wave.)
    #[arg(
        long,
        env = "TOPODRA_WRITE_DELAY_MILLISECONDS",
        default_value_t = 10_000
    )]
    pub(crate) write_delay_milliseconds: u64,

    /// NodeResourceTopology writes a second over the whole fleet, at most: nodes
    /// take turns in the order their objects fell behind. This keeps the
    /// controller's writes flat in the fleet's size; what grows with it is how long
    /// an object can trail its GPUs when every node changes (nodes waiting / this).
    /// While it binds, the writes a pod are this over the pods bound a second: half
    /// a write a second keeps them at a tenth of a write a pod down to five pods a
    /// second, which a 2,000-node control plane on two cores still binds.
    #[arg(long, env = "TOPODRA_NRT_WRITES_PER_SECOND", default_value_t = 0.5)]
    pub(crate) nrt_writes_per_second: f64,

    /// Seconds between two writes of one node's NodeResourceTopology, at least, so
    /// that a busy node cannot take the fleet's budget from the others (the NFD
    /// topology updater re-examines every 60 s).
    #[arg(long, env = "TOPODRA_NRT_NODE_INTERVAL_SECONDS", default_value_t = 60)]
    pub(crate) nrt_node_interval_seconds: u64,

    /// Elect a leader among replicas on a Lease; off for a single replica.
    #[arg(long, env = "TOPODRA_LEADER_ELECT", default_value_t = true, action = ArgAction::Set)]
    pub(crate) leader_elect: bool,

    /// Namespace of the leader Lease (the pod's own, from the downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "topodra")]
    pub(crate) lease_namespace: String,

    /// Name of the leader Lease.
    #[arg(long, env = "TOPODRA_LEASE_NAME", default_value = "topodra-controller")]
    pub(crate) lease_name: String,

    /// This replica's identity in the Lease; default: the pod name, else the host name.
    #[arg(long, env = "POD_NAME")]
    pub(crate) identity: Option<String>,

    /// Seconds a leader that stopped renewing keeps the Lease.
    #[arg(long, env = "TOPODRA_LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub(crate) lease_duration_seconds: u64,

    /// Seconds before expiry at which the leader renews.
    #[arg(long, env = "TOPODRA_LEASE_RENEW_BEFORE_SECONDS", default_value_t = 5)]
    pub(crate) lease_renew_before_seconds: u64,

    #[command(flatten)]
    pub(crate) http: HttpArgs,

    #[command(flatten)]
    pub(crate) logging: topodra_ops::logging::LoggingArgs,
}

impl Args {
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.lease_renew_before_seconds == 0
            || self.lease_renew_before_seconds >= self.lease_duration_seconds
        {
            return Err(format!(
                "--lease-renew-before-seconds ({}) must be above 0 and below --lease-duration-seconds ({})",
                self.lease_renew_before_seconds, self.lease_duration_seconds
            ));
        }
        // 1000 a second is past anything an API server should take from one client;
        // 1/3600 (one write an hour) is the least that still keeps objects moving.
        if !(self.nrt_writes_per_second.is_finite()
            && (1.0 / 3600.0..=1000.0).contains(&self.nrt_writes_per_second))
        {
            return Err(format!(
                "--nrt-writes-per-second must be between 0.0003 (one an hour) and 1000, not {}",
                self.nrt_writes_per_second
            ));
        }
        if self.nrt_resource_name.trim().is_empty() {
            return Err("--nrt-resource-name must not be empty".into());
        }
        topodra_model::slice::check_numa_node_aliases(&self.numa_node_aliases, &self.driver_name)
            .map_err(|e| format!("--numa-node-aliases: {e}"))?;
        if !self.cpu_driver_name.is_empty() && self.cpu_driver_name == self.driver_name {
            return Err(format!(
                "--cpu-driver-name {:?} is this controller's own --driver-name",
                self.cpu_driver_name
            ));
        }
        Ok(())
    }
}

impl Args {
    /// The command line, with the controller's endpoint port as its default.
    pub fn command() -> clap::Command {
        HttpArgs::with_default_port(<Self as CommandFactory>::command(), HTTP_PORT)
    }

    /// Parses the process's command line (exiting with clap's message when it is wrong).
    pub fn parse_args() -> Self {
        let matches = Self::command().get_matches();
        Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }

    /// Parses the command line, starts logging, checks the flags and runs the
    /// controller until SIGTERM: the whole of the `topodra-controller` binary.
    pub fn parse_and_run() -> ExitCode {
        let args = Self::parse_args();
        if let Err(e) = topodra_ops::logging::init(&args.logging) {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
        if let Err(e) = args.validate() {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: starting the async runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
        match runtime.block_on(crate::run::run(args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = format!("{e:#}"), "topodra-controller failed");
                ExitCode::FAILURE
            }
        }
    }
}

#[cfg(test)]
mod tests;
