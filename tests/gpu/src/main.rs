//! `topodra-gpu-check`: the parts of `make gpu-check` (tests/gpu/gpu-check.sh) that
//! need more than a shell: one claim's whole life on this node, and the check that
//! discovery agrees with what the driver's own tool reports.
//!
//! - `lifecycle`: the real plugin binary against the mock API server, a claim for
//!   one whole GPU prepared through the DRA socket as the kubelet would, its CDI
//!   spec injected by the CDI library (`cdi-check`) into a runc container that runs
//!   a CUDA probe and `nvidia-smi -L`, the health monitor's NVML event stream read
//!   from the plugin's metrics, then the unprepare, and nothing left behind.
//! - `agree`: `discover -o inventory` against `nvidia-smi -q -x` and NVML's record.
//!
//! Each step prints one verdict line (`gpu-check: <step>: PASS|FAIL|SKIP ...`) and
//! leaves what it saw in the results folder, which is committed as the machine's
//! fixture. `--dry-run` runs the same steps on a simulated node, where a few facts
//! only a real GPU can give are SKIP, and nothing else is.

mod agree;
mod container;
mod dra;
mod lifecycle;
mod verdict;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "topodra-gpu-check", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Prepare, run and unprepare one claim for one whole GPU on this node.
    Lifecycle(lifecycle::Args),
    /// Check `discover -o inventory` against `nvidia-smi -q -x` and `discover -o nvml`.
    Agree(agree::Args),
}

/// Where every step's verdict line and files go.
#[derive(Debug, clap::Args)]
struct Common {
    /// The results folder (created).
    #[arg(long, env = "TOPODRA_GPU_CHECK_OUT")]
    out: PathBuf,
    /// A simulated node: facts only a real GPU gives are SKIP rather than FAIL.
    #[arg(long, env = "TOPODRA_GPU_CHECK_DRY_RUN")]
    dry_run: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Lifecycle(args) => lifecycle::run(args),
        Command::Agree(args) => agree::run(&args),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("topodra-gpu-check: {e:#}");
            ExitCode::from(2)
        }
    }
}
