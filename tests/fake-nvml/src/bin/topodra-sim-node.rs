//! `topodra-sim-node [--cdi-hook PATH] [--print-cpu-host-root] [--driver-root-device-nodes]
//! <profile> <dir>`: lays out a simulated GPU node and prints the
//! `topodra-kubelet-plugin` flags that point at it, one per line; with
//! `--print-cpu-host-root` also a last line `HOST_ROOT=<dir>/host-root`, the root of
//! the node's CPU sysfs for a CPU DRA driver (opt-in, so that callers that pass every
//! line to the plugin keep working).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use topodra_fake_nvml::{CDYLIB_NAME, cdi_hook, profiles_dir, sim};

#[derive(Debug, Parser)]
#[command(
    name = "topodra-sim-node",
    about = "Lay out a simulated GPU node and print the plugin flags that point at it"
)]
struct Args {
    /// A built-in profile name (tests/fake-nvml/profiles) or a profile YAML path.
    profile: String,

    /// Directory to lay the node out in.
    dir: PathBuf,

    /// NVIDIA's nvidia-cdi-hook, printed as the plugin's --cdi-hook-source. Without
    /// it, a stand-in script that only answers --version is written into DIR (and a
    /// note printed on stderr): enough to start the plugin, not to run a hook.
    #[arg(long, env = cdi_hook::REAL_HOOK_ENV)]
    cdi_hook: Option<PathBuf>,

    /// Also print `HOST_ROOT=<path>` after the plugin flags: the host root whose
    /// sys/devices/system/{cpu,node} describe the profile's CPUs (the environment
    /// variable kubernetes-sigs' dra-driver-cpu reads its topology under).
    #[arg(long)]
    print_cpu_host_root: bool,

    /// Also make the driver's device nodes (nvidiactl, nvidia<minor>, nvidia-uvm, ...)
    /// under <driver-root>/dev, where NVIDIA's GPU kubelet plugin looks for them when
    /// its driver root has a dev/. Needs CAP_MKNOD.
    #[arg(long)]
    driver_root_device_nodes: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let path = if args.profile.ends_with(".yaml") {
        PathBuf::from(&args.profile)
    } else {
        profiles_dir().join(format!("{}.yaml", args.profile))
    };
    let yaml = match std::fs::read_to_string(&path) {
        Ok(y) => y,
        Err(e) => {
            eprintln!("reading profile {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    // The library sits next to this binary in the target directory.
    let lib = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name(CDYLIB_NAME),
        Err(e) => {
            eprintln!("locating myself: {e}");
            return ExitCode::FAILURE;
        }
    };
    let options = sim::SimOptions {
        driver_root_device_nodes: args.driver_root_device_nodes,
    };
    let node = match sim::materialize_with(&args.dir, &yaml, &lib, options) {
        Ok(node) => node,
        Err(e) => {
            eprintln!(
                "laying out the simulated node in {}: {e}",
                args.dir.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let hook = match args.cdi_hook.filter(|p| !p.as_os_str().is_empty()) {
        // The plugin may run in another directory.
        Some(hook) => std::path::absolute(&hook).unwrap_or(hook),
        None => match cdi_hook::write_stand_in(&args.dir) {
            Ok(hook) => {
                eprintln!(
                    "topodra-sim-node: no nvidia-cdi-hook given (--cdi-hook or {}); the plugin \
                     gets the stand-in {}, which only answers --version",
                    cdi_hook::REAL_HOOK_ENV,
                    hook.display()
                );
                hook
            }
            Err(e) => {
                eprintln!("writing the stand-in nvidia-cdi-hook: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let host_root = node.cpu_host_root.clone();
    for arg in node.with_cdi_hook(hook).plugin_args() {
        println!("{arg}");
    }
    if args.print_cpu_host_root {
        let root = std::path::absolute(&host_root).unwrap_or(host_root);
        println!("HOST_ROOT={}", root.display());
    }
    ExitCode::SUCCESS
}
