//! `topodra-kubelet-plugin`: the node side of topodra, as a library behind a thin
//! binary ([`Cli::parse_and_run`]).
//!
//! `discover` prints what this node would publish; `serve` is the DaemonSet's
//! process: the kubelet's DRA and registration services (through
//! `dra-kubeletplugin`), ResourceSlice publishing, health, metrics. What a GPU node
//! has and what preparing a claim on it means is `topodra-node`'s, on the model of
//! `topodra-model`; this crate wires them to the kubelet and the API server.

#![forbid(unsafe_code)]

mod args;
mod cdi_hook;
mod crash;
mod discover_cmd;
mod events;
mod http_endpoint;
mod lifecycle;
mod liveness;
mod metrics;
mod node_driver;
mod node_state;
mod pool;
mod reconcile;
mod serve_cmd;
mod shutdown;
mod table;
mod taint_loop;
mod yaml;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "topodra-kubelet-plugin",
    version = topodra_ops::version::long(),
    about = "topodra DRA kubelet plugin for NVIDIA GPUs"
)]
pub struct Cli {
    #[command(flatten)]
    logging: topodra_ops::logging::LoggingArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Discover the node's GPUs and topology and print them, or the ResourceSlices
    /// that would be published.
    Discover(discover_cmd::DiscoverArgs),
    /// Run the kubelet plugin: serve the kubelet's DRA calls and publish ResourceSlices.
    Serve(Box<serve_cmd::ServeArgs>),
}

impl Cli {
    /// Parses the command line, starts logging and runs the subcommand: the whole of
    /// the `topodra-kubelet-plugin` binary.
    pub fn parse_and_run() -> std::process::ExitCode {
        let cli = Cli::parse();
        if let Err(e) = topodra_ops::logging::init(&cli.logging) {
            eprintln!("error: {e:#}");
            return std::process::ExitCode::from(2);
        }
        match run(cli) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                std::process::ExitCode::FAILURE
            }
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Discover(args) => discover_cmd::run(&args, &mut std::io::stdout().lock()),
        Command::Serve(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(serve_cmd::run(*args)),
    }
}
