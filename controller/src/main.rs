//! topodra-controller: the cluster side of topodra.
//!
//! It watches our ResourceSlices, every ResourceClaim, DeviceTaintRules,
//! DeviceClasses, Nodes (metadata only) and unscheduled Pods, keeps the capacity
//! model of `topodra_driver::capacity` current from them, and, while it holds the
//! leader Lease, publishes what the old stack's node agents did: per-NUMA
//! NodeResourceTopology objects, plus Events that explain pods waiting for GPUs.
//! Metrics come from every replica.

#[cfg(test)]
mod fixtures;
mod leader;
mod metrics;
mod run;
mod state;
mod writer;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;

use clap::{ArgAction, Parser};
use topodra_driver::slice::DEFAULT_DRIVER_NAME;

#[derive(Debug, Parser)]
#[command(
    name = "topodra-controller",
    version = topodra_ops::version::long(),
    about = "topodra's cluster controller: GPU capacity by topology, NodeResourceTopology without a node agent, why-pending Events"
)]
pub(crate) struct Cli {
    /// DRA driver name of the kubelet plugins (their ResourceSlices' spec.driver).
    #[arg(long, env = "TOPODRA_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME)]
    driver_name: String,

    /// Device classes whose claims are ours besides those whose CEL selector compares
    /// `device.driver` with the driver name (comma-separated).
    #[arg(
        long = "device-class",
        env = "TOPODRA_DEVICE_CLASSES",
        value_delimiter = ','
    )]
    device_classes: Vec<String>,

    /// Driver name of the CPU DRA driver (dra-driver-cpu: `dra.cpu`) whose CPUs a
    /// claim can put on one NUMA node with our GPUs: its ResourceSlices are watched
    /// (one more watch, selected by `spec.driver`), and pending pods' explanations and
    /// NodeResourceTopology zones count its CPUs. Empty: no such watch.
    #[arg(long, env = "TOPODRA_CPU_DRIVER_NAME", default_value = "dra.cpu")]
    cpu_driver_name: String,

    /// The other drivers' names for the NUMA node that the kubelet plugins publish
    /// too (the same list as their --numa-node-aliases, comma-separated): a
    /// constraint on one of them aligns on the NUMA node.
    #[arg(long, env = "TOPODRA_NUMA_NODE_ALIASES", value_delimiter = ',')]
    numa_node_aliases: Vec<topodra_driver::slice::NumaNodeAlias>,

    /// Publish a NodeResourceTopology object per GPU node (the CRD must be installed;
    /// without it the controller warns once and goes on without them).
    #[arg(long, env = "TOPODRA_NODE_RESOURCE_TOPOLOGY", default_value_t = true, action = ArgAction::Set)]
    node_resource_topology: bool,

    /// Resource name of the GPUs in each NodeResourceTopology zone.
    #[arg(
        long,
        env = "TOPODRA_NRT_RESOURCE_NAME",
        default_value = "nvidia.com/gpu"
    )]
    nrt_resource_name: String,

    /// Topology Manager policy the NodeResourceTopology objects announce; consumers
    /// such as the topology-aware scheduler align by it.
    #[arg(long, env = "TOPODRA_NRT_POLICY", default_value = "single-numa-node",
          value_parser = ["none", "best-effort", "restricted", "single-numa-node"])]
    nrt_topology_manager_policy: String,

    /// Topology Manager scope the objects announce.
    #[arg(long, env = "TOPODRA_NRT_SCOPE", default_value = "pod", value_parser = ["container", "pod"])]
    nrt_topology_manager_scope: String,

    /// Record an Event on each unschedulable pod that waits for our GPUs, saying why
    /// in topology terms.
    #[arg(long, env = "TOPODRA_PENDING_POD_EVENTS", default_value_t = true, action = ArgAction::Set)]
    pending_pod_events: bool,

    /// The least time between two Events on one pod, however often its explanation
    /// changes.
    #[arg(
        long,
        env = "TOPODRA_PENDING_EVENT_MIN_INTERVAL_SECONDS",
        default_value_t = 30
    )]
    pending_event_min_interval_seconds: u64,

    /// Milliseconds to gather changes before writing: a burst of allocations on a
    /// node is one write, and no node's object is written more often than this.
    /// (The NFD topology updater writes every 60 s; 500 ms made 500 busy nodes
    /// about four writes per node per scheduling wave.)
    #[arg(
        long,
        env = "TOPODRA_WRITE_DELAY_MILLISECONDS",
        default_value_t = 10_000
    )]
    write_delay_milliseconds: u64,

    /// Elect a leader among replicas on a Lease; off for a single replica.
    #[arg(long, env = "TOPODRA_LEADER_ELECT", default_value_t = true, action = ArgAction::Set)]
    leader_elect: bool,

    /// Namespace of the leader Lease (the pod's own, from the downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "topodra")]
    lease_namespace: String,

    /// Name of the leader Lease.
    #[arg(long, env = "TOPODRA_LEASE_NAME", default_value = "topodra-controller")]
    lease_name: String,

    /// This replica's identity in the Lease; default: the pod name, else the host name.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,

    /// Seconds a leader that stopped renewing keeps the Lease.
    #[arg(long, env = "TOPODRA_LEASE_DURATION_SECONDS", default_value_t = 15)]
    lease_duration_seconds: u64,

    /// Seconds before expiry at which the leader renews.
    #[arg(long, env = "TOPODRA_LEASE_RENEW_BEFORE_SECONDS", default_value_t = 5)]
    lease_renew_before_seconds: u64,

    /// Address of the /metrics, /healthz and /readyz endpoint (the pod IP in the chart).
    #[arg(long, env = "TOPODRA_HTTP_BIND_ADDRESS", default_value_t = IpAddr::V4(Ipv4Addr::UNSPECIFIED))]
    http_bind_address: IpAddr,

    /// Port of the endpoint.
    #[arg(long, env = "TOPODRA_HTTP_PORT", default_value_t = 9465)]
    http_port: u16,

    /// Seconds a client of the endpoint has to send its request headers.
    #[arg(
        long,
        env = "TOPODRA_HTTP_HEADER_READ_TIMEOUT_SECONDS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    http_header_read_timeout_seconds: u64,

    /// Connections the endpoint serves at once; more are closed at once (a few more
    /// are kept for health probes).
    #[arg(
        long,
        env = "TOPODRA_HTTP_MAX_CONNECTIONS",
        default_value_t = 64,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    http_max_connections: u32,

    /// Seconds a client of the endpoint has to take a response that no longer fits
    /// into the socket; one that reads slower (or not at all) is disconnected.
    #[arg(
        long,
        env = "TOPODRA_HTTP_WRITE_TIMEOUT_SECONDS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    http_write_timeout_seconds: u64,

    /// Requests one keep-alive connection of the endpoint serves before it is closed.
    #[arg(
        long,
        env = "TOPODRA_HTTP_MAX_REQUESTS_PER_CONNECTION",
        default_value_t = 100,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    http_max_requests_per_connection: u32,

    #[command(flatten)]
    logging: topodra_ops::logging::LoggingArgs,
}

impl Cli {
    fn http_addr(&self) -> SocketAddr {
        SocketAddr::new(self.http_bind_address, self.http_port)
    }

    fn validate(&self) -> Result<(), String> {
        if self.lease_renew_before_seconds == 0
            || self.lease_renew_before_seconds >= self.lease_duration_seconds
        {
            return Err(format!(
                "--lease-renew-before-seconds ({}) must be above 0 and below --lease-duration-seconds ({})",
                self.lease_renew_before_seconds, self.lease_duration_seconds
            ));
        }
        if self.nrt_resource_name.trim().is_empty() {
            return Err("--nrt-resource-name must not be empty".into());
        }
        topodra_driver::slice::check_numa_node_aliases(&self.numa_node_aliases, &self.driver_name)
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = topodra_ops::logging::init(&cli.logging) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    if let Err(e) = cli.validate() {
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
    match runtime.block_on(run::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "topodra-controller failed");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_lease_timing_is_refused() {
        let cli = Cli::try_parse_from(["topodra-controller"]).unwrap();
        assert!(cli.validate().is_ok());
        assert_eq!(cli.http_addr(), "0.0.0.0:9465".parse().unwrap());
        let cli = Cli::try_parse_from([
            "topodra-controller",
            "--lease-duration-seconds=5",
            "--lease-renew-before-seconds=5",
        ])
        .unwrap();
        assert!(
            cli.validate()
                .unwrap_err()
                .contains("--lease-renew-before-seconds")
        );
        assert!(
            Cli::try_parse_from(["topodra-controller", "--nrt-topology-manager-policy=strict"])
                .is_err()
        );
    }

    #[test]
    fn http_limits_of_zero_are_refused() {
        for flag in [
            "--http-header-read-timeout-seconds=0",
            "--http-max-connections=0",
            "--http-write-timeout-seconds=0",
            "--http-max-requests-per-connection=0",
        ] {
            assert!(
                Cli::try_parse_from(["topodra-controller", flag]).is_err(),
                "{flag}"
            );
        }
    }

    #[test]
    fn classes_come_comma_separated() {
        let cli = Cli::try_parse_from(["topodra-controller", "--device-class=a,b"]).unwrap();
        assert_eq!(cli.device_classes, ["a", "b"]);
    }
}
