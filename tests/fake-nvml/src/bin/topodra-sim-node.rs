//! `topodra-sim-node <profile> <dir>`: lays out a simulated GPU node and prints the
//! `topodra-kubelet-plugin` flags that point at it, one per line.

use std::path::PathBuf;
use std::process::ExitCode;

use topodra_fake_nvml::{CDYLIB_NAME, profiles_dir, sim};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [profile, dir] = args.as_slice() else {
        eprintln!("usage: topodra-sim-node <profile name or YAML path> <dir>");
        return ExitCode::from(2);
    };
    let path = if profile.ends_with(".yaml") {
        PathBuf::from(profile)
    } else {
        profiles_dir().join(format!("{profile}.yaml"))
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
    match sim::materialize(&PathBuf::from(dir), &yaml, &lib) {
        Ok(node) => {
            for arg in node.plugin_args() {
                println!("{arg}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("laying out the simulated node in {dir}: {e}");
            ExitCode::FAILURE
        }
    }
}
