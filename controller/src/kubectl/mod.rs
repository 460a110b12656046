//! `kubectl topodra`: GPU capacity by topology, why a pod waits for GPUs, and where a
//! claim would fit, read from the API server on demand (one LIST per resource).
//!
//! It shares the capacity model (`topodra_model::capacity`) and the reasoning of the
//! controller's Events ([`crate::pending`]), so `explain` prints the very message the
//! controller records on a waiting pod. The `kubectl-topodra` binary is
//! [`parse_and_run`].

mod explain;
mod fit;
mod load;
mod nodes;
mod table;
mod terminal;

#[cfg(test)]
pub(crate) mod fixtures;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::pending;
use anyhow::{Result, anyhow};
use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use topodra_model::capacity::{CpuPools, Level, ShareWant, amount};
use topodra_model::slice::attributes::NUMA_NODE;
use topodra_model::slice::{DEFAULT_DRIVER_NAME, NumaNodeAlias};

use load::{Connection, Target};

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-topodra",
    bin_name = "kubectl topodra",
    version = topodra_ops::version::long(),
    about = "GPU capacity by NUMA and interconnect topology, for the topodra DRA driver",
    long_about = "GPU capacity by NUMA and interconnect topology, for the topodra DRA driver.\n\n\
                  Reads ResourceSlices, ResourceClaims and DeviceTaintRules from the API server \
                  (one paginated LIST each) and reports, with the capacity model the controller uses, \
                  per node and NUMA node, how many GPUs are allocated, unhealthy and free, and the largest set \
                  one matchAttribute constraint could still take."
)]
struct Cli {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the
    /// in-cluster service account).
    #[arg(long, global = true, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use (default: the current context).
    #[arg(long, global = true, value_name = "NAME")]
    context: Option<String>,

    /// Namespace of the pod to explain (default: the context's namespace).
    #[arg(short = 'n', long, global = true, value_name = "NAME")]
    namespace: Option<String>,

    /// DRA driver name of the kubelet plugins (their ResourceSlices' spec.driver).
    #[arg(
        long = "driver-name",
        visible_alias = "driver",
        global = true,
        env = "TOPODRA_DRIVER_NAME",
        default_value = DEFAULT_DRIVER_NAME,
        value_name = "NAME"
    )]
    driver: String,

    /// Driver name of the CPU DRA driver whose CPUs a claim can put on one NUMA node
    /// with the GPUs (dra-driver-cpu).
    #[arg(
        long = "cpu-driver-name",
        global = true,
        env = "TOPODRA_CPU_DRIVER_NAME",
        default_value = "dra.cpu",
        value_name = "NAME"
    )]
    cpu_driver: String,

    /// Other drivers' names for the NUMA node that the plugins publish too
    /// (their --numa-node-aliases): a constraint on one aligns on the NUMA node.
    #[arg(
        long,
        global = true,
        env = "TOPODRA_NUMA_NODE_ALIASES",
        value_delimiter = ',',
        default_value = "dra.net/numaNode",
        value_name = "NAMES"
    )]
    numa_node_aliases: Vec<NumaNodeAlias>,

    /// How long to wait for each response of the API server: 30s, 2m; 0 waits forever.
    #[arg(long, global = true, value_name = "DURATION", default_value = "60s", value_parser = parse_timeout)]
    request_timeout: Duration,

    /// Say on stderr what was listed, and what was left out.
    #[arg(short = 'v', long, global = true)]
    verbose: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// GPUs of every node and NUMA node: total, allocated, unhealthy, free, and the
    /// largest free set aligned at one level.
    Nodes {
        /// The level of the LARGEST column (and of stranding with -o wide): numaNode,
        /// socket, pcieRoot, pcieSwitch or nvlinkDomain.
        #[arg(long, default_value = "numaNode", value_name = "LEVEL")]
        align: Level,

        /// wide: also the largest sets at the other levels, stranding and MIG devices;
        /// json: every figure at every level, as one document.
        #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
        output: Option<NodesFormat>,
    },

    /// Why a pod waits for GPUs (the message of the controller's WaitingForGPUs Event),
    /// and where each of its claims could go.
    Explain {
        /// The pod: NAME or pod/NAME.
        #[arg(value_name = "POD")]
        pod: String,

        /// Device classes of ours besides those whose selector names the driver
        /// (repeat, or separate with commas).
        #[arg(
            long = "device-class",
            env = "TOPODRA_DEVICE_CLASSES",
            value_delimiter = ',',
            value_name = "NAME"
        )]
        device_classes: Vec<String>,
    },

    /// Where a claim for COUNT GPUs (or MIG devices of a profile, or shares of a
    /// shared GPU), aligned at a level or anywhere on a node, fits now.
    Fit {
        /// How many GPUs (MIG devices with --profile; shares with --share-memory,
        /// --share-compute or --sharing, 1 by default).
        #[arg(
            long,
            value_parser = clap::value_parser!(u32).range(1..),
            value_name = "N",
            required_unless_present_any = ["share_memory", "share_compute", "sharing"]
        )]
        count: Option<u32>,

        /// MIG devices of this profile (`1g.10gb`, `7g.80gb`) instead of whole GPUs:
        /// static ones, or with dynamic MIG partitions whose placements are free.
        /// Aligns on numaNode only.
        #[arg(long, value_name = "PROFILE")]
        profile: Option<String>,

        /// Shares of a shared GPU, each with this much memory (`20Gi`), instead of
        /// whole GPUs; without it a share takes the default size the slices publish
        /// (memory / replicas). Aligns on numaNode only.
        #[arg(long, value_name = "SIZE", value_parser = parse_amount, conflicts_with = "profile")]
        share_memory: Option<u64>,

        /// Shares with this much compute, in percent of a GPU, where the devices
        /// publish it (MPS).
        #[arg(long, value_name = "PERCENT", value_parser = parse_amount, conflicts_with = "profile")]
        share_compute: Option<u64>,

        /// The sharing mode of the shares, as their devices' `sharing` attribute
        /// says it (default: TimeSlicing).
        #[arg(long, value_name = "MODE", conflicts_with = "profile")]
        sharing: Option<String>,

        /// Keep them on one numaNode, socket, pcieRoot, pcieSwitch or nvlinkDomain
        /// (default: anywhere on the node).
        #[arg(long, value_name = "LEVEL")]
        align: Option<Level>,

        /// json: the places and the model's explanation, as one document.
        #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
        output: Option<JsonFormat>,
    },
}

impl Cli {
    /// The names that align on the NUMA node: the standard one and the aliases.
    fn numa_names(&self) -> Vec<String> {
        std::iter::once(NUMA_NODE.to_owned())
            .chain(self.numa_node_aliases.iter().map(ToString::to_string))
            .collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum NodesFormat {
    Wide,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum JsonFormat {
    Json,
}

/// A positive quantity as Kubernetes writes one: `20Gi`, `20G`, `50`.
fn parse_amount(text: &str) -> Result<u64, String> {
    amount(&Quantity(text.to_owned()))
        .filter(|v| *v > 0)
        .ok_or_else(|| format!("{text:?} is not a positive quantity such as 20Gi or 50"))
}

/// `30s`, `2m`, `1h`, or seconds without a unit; `0` for no timeout.
fn parse_timeout(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 30s, 2m or 1h"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(format!("{text:?} is not a duration such as 30s, 2m or 1h")),
    };
    n.checked_mul(scale)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

async fn run(cli: Cli) -> Result<String> {
    let target = Target {
        kubeconfig: cli.kubeconfig.clone(),
        context: cli.context.clone(),
        request_timeout: (!cli.request_timeout.is_zero()).then_some(cli.request_timeout),
        verbose: cli.verbose,
    };
    let conn: Connection = load::connect(&target).await?;
    match cli.command {
        Command::Nodes { align, output } => {
            let (cluster, _) = conn.cluster(&cli.driver, None, None).await?;
            if cluster.nodes().next().is_none() && output != Some(NodesFormat::Json) {
                eprintln!(
                    "No node publishes GPUs of {} (no complete ResourceSlice pool).",
                    cli.driver
                );
            }
            Ok(match output {
                Some(NodesFormat::Json) => nodes::json(&cluster),
                Some(NodesFormat::Wide) => nodes::table(&cluster, align, true),
                None => nodes::table(&cluster, align, false),
            })
        }
        Command::Explain {
            ref pod,
            ref device_classes,
        } => {
            let name = explain::pod_name(pod).map_err(|e| anyhow!(e))?;
            let namespace = cli
                .namespace
                .clone()
                .unwrap_or_else(|| conn.namespace.clone());
            let pod = conn.pod(&namespace, name).await?;
            if let Some(text) = explain::scheduled(&pod) {
                return Ok(text);
            }
            let (classes, cpu_classes) = conn
                .classes(&cli.driver, device_classes, &cli.cpu_driver)
                .await?;
            let numa_names = cli.numa_names();
            let mut pools = CpuPools::new(cli.cpu_driver.clone(), numa_names.clone());
            let (cluster, claims) = conn
                .cluster(&cli.driver, Some(&namespace), Some(&mut pools))
                .await?;
            let cpus = pending::CpuSide {
                pools: &pools,
                classes: &cpu_classes,
                numa_names: &numa_names,
            };
            Ok(explain::explain_pod(
                &cluster, &cpus, &pod, &claims, &classes,
            ))
        }
        Command::Fit {
            count,
            profile,
            share_memory,
            share_compute,
            sharing,
            align,
            output,
        } => {
            let share = share_want(count, share_memory, share_compute, sharing);
            let count = count.unwrap_or(1);
            if let Some(l) = align.filter(|l| profile.is_some() && *l != Level::NumaNode) {
                anyhow::bail!("--profile aligns on numaNode only, not {l}");
            }
            if let Some(l) = align.filter(|l| share.is_some() && *l != Level::NumaNode) {
                anyhow::bail!("a share aligns on numaNode only, not {l}");
            }
            let (cluster, _) = conn.cluster(&cli.driver, None, None).await?;
            let f = match (&profile, &share) {
                (_, Some(w)) => fit::fit_share(&cluster, w, align).map_err(anyhow::Error::msg)?,
                (Some(p), None) => {
                    fit::fit_mig(&cluster, p, count, align).map_err(anyhow::Error::msg)?
                }
                (None, None) => fit::fit(&cluster, count, align),
            };
            Ok(match output {
                Some(JsonFormat::Json) => fit::json(&f),
                None => fit::text(&f),
            })
        }
    }
}

/// The shares `fit` asks for, when any of the share flags is given: `count` of them
/// (one by default), of the mode `sharing` (TimeSlicing by default), each with the
/// memory and compute given and the devices' defaults for the rest.
fn share_want(
    count: Option<u32>,
    memory: Option<u64>,
    compute: Option<u64>,
    sharing: Option<String>,
) -> Option<ShareWant> {
    if memory.is_none() && compute.is_none() && sharing.is_none() {
        return None;
    }
    let capacity = [("memory", memory), ("compute", compute)]
        .into_iter()
        .filter_map(|(name, v)| Some((name.to_owned(), v?)))
        .collect();
    Some(ShareWant {
        sharing: Some(sharing.unwrap_or_else(|| "TimeSlicing".to_owned())),
        count: count.unwrap_or(1),
        capacity,
    })
}

/// Parses `kubectl topodra`'s command line, runs it and prints its answer: the
/// whole of the `kubectl-topodra` binary.
pub fn parse_and_run() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(text) => {
            let mut out = std::io::stdout().lock();
            match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                // `kubectl topodra nodes | head` closes the pipe early: not an error.
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    eprintln!("error: cannot write the output: {e}");
                    ExitCode::FAILURE
                }
                _ => ExitCode::SUCCESS,
            }
        }
        Err(e) => {
            // API errors quote the server, and names from objects (a pod's).
            eprintln!("error: {}", terminal::escape(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "kubectl-topodra",
            "fit",
            "--count",
            "4",
            "--align",
            "numaNode",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            cli.command,
            Command::Fit {
                count: Some(4),
                profile: None,
                share_memory: None,
                align: Some(Level::NumaNode),
                output: None,
                ..
            }
        ));
        let cli = Cli::try_parse_from([
            "kubectl-topodra",
            "explain",
            "pod/a",
            "-n",
            "ml",
            "--device-class",
            "x,y",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.namespace.as_deref(), Some("ml"));
        assert!(
            matches!(cli.command, Command::Explain { ref device_classes, .. } if device_classes == &["x", "y"])
        );
        assert!(Cli::try_parse_from(["kubectl-topodra", "fit", "--count", "0"]).is_err());
        assert!(
            Cli::try_parse_from(["kubectl-topodra", "fit"]).is_err(),
            "no count"
        );
        let cli = Cli::try_parse_from(["kubectl-topodra", "fit", "--share-memory", "20Gi"])
            .unwrap_or_else(|e| panic!("{e}"));
        let Command::Fit {
            count,
            share_memory,
            share_compute,
            sharing,
            ..
        } = cli.command
        else {
            panic!("not fit");
        };
        assert_eq!(
            share_want(count, share_memory, share_compute, sharing),
            Some(ShareWant {
                sharing: Some("TimeSlicing".to_owned()),
                count: 1,
                capacity: [("memory".to_owned(), 20 << 30)].into(),
            })
        );
        for bad in [
            &["fit", "--share-memory", "lots"][..],
            &["fit", "--share-memory", "0"],
            &["fit", "--share-memory", "1Gi", "--profile", "1g.10gb"],
        ] {
            let args = std::iter::once("kubectl-topodra").chain(bad.iter().copied());
            assert!(Cli::try_parse_from(args).is_err(), "{bad:?}");
        }
        for flag in ["--driver", "--driver-name"] {
            let cli = Cli::try_parse_from(["kubectl-topodra", "nodes", flag, "gpu.example.com"])
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(cli.driver, "gpu.example.com");
        }
        assert!(Cli::try_parse_from(["kubectl-topodra", "nodes", "--align", "rack"]).is_err());
        assert!(
            Cli::try_parse_from([
                "kubectl-topodra",
                "nodes",
                "-o",
                "wide",
                "--align",
                "socket"
            ])
            .is_ok()
        );
    }

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_timeout("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_timeout("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_timeout("0"), Ok(Duration::ZERO));
        assert!(parse_timeout("1d").is_err());
        assert!(parse_timeout("s").is_err());
        assert!(parse_timeout("18446744073709551615h").is_err());
    }
}
