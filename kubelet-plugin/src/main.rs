//! `topodra-kubelet-plugin`: the node side of topodra.
//!
//! Today it runs discovery (`discover`); the kubelet-facing servers land on top of
//! the same inventory.

mod discover_cmd;
mod logging;
mod table;
// Wired into the gRPC servers by `serve`.
#[allow(dead_code)]
mod uds;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "topodra-kubelet-plugin",
    version,
    about = "topodra DRA kubelet plugin for NVIDIA GPUs"
)]
struct Cli {
    #[command(flatten)]
    logging: logging::LoggingArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Discover the node's GPUs and topology and print them, or the ResourceSlices
    /// that would be published.
    Discover(discover_cmd::DiscoverArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Err(e) = logging::init(&cli.logging) {
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

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Discover(args) => discover_cmd::run(&args, &mut std::io::stdout().lock()),
    }
}
