//! `cdi-check` (tests/cdi-check): the CDI Go library that containerd and CRI-O use,
//! run over a simulated node's spec directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use topodra_proto::dra::v1;

use super::NodeDirs;

/// Major of `/dev/nvidia<N>` and `/dev/nvidiactl`.
pub const NVIDIA_MAJOR: u64 = 195;
pub const NVIDIACTL_MINOR: u64 = 255;

/// `TOPODRA_REQUIRE_TOOLS=1`: a missing tool fails a test instead of skipping it.
pub fn tools_required() -> bool {
    std::env::var("TOPODRA_REQUIRE_TOOLS").is_ok_and(|v| v == "1")
}

/// The `cdi-check` binary, or why there is none (built or looked up once per process).
pub fn cdi_check() -> Option<PathBuf> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found = BIN.get_or_init(locate_cdi_check);
    match found {
        Ok(bin) => Some(bin.clone()),
        Err(why) if tools_required() => {
            panic!("cdi-check is required (TOPODRA_REQUIRE_TOOLS=1): {why}")
        }
        Err(why) => {
            eprintln!(
                "SKIPPED: the CDI runtime check needs cdi-check: {why}\n\
                 (set TOPODRA_CDI_CHECK to a built binary, or put go on PATH; \
                 TOPODRA_REQUIRE_TOOLS=1 turns this skip into a failure)"
            );
            None
        }
    }
}

fn locate_cdi_check() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("TOPODRA_CDI_CHECK") {
        let path = PathBuf::from(path);
        // A path that was set but is wrong is a mistake, not a reason to skip.
        assert!(
            path.is_file(),
            "TOPODRA_CDI_CHECK={} is not a file",
            path.display()
        );
        return Ok(path);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/cdi-check/build.sh");
    let go_found = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !go_found {
        return Err("TOPODRA_CDI_CHECK is not set and go is not on PATH".into());
    }
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprint!("{stderr}");
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}):\n{stderr}",
            script.display(),
            out.status
        ));
    }
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_owned();
    if path.is_empty() || !Path::new(&path).is_file() {
        return Err(format!(
            "{} printed no binary path (stdout: {:?})",
            script.display(),
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    Ok(PathBuf::from(path))
}

/// `cdi-check` over the node's spec directory, not yet run.
pub fn cdi_check_command(bin: &Path, node: &NodeDirs, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("--spec-dir").arg(node.cdi_dir()).args(args);
    cmd
}

/// Runs `cdi-check` over the node's spec directory.
pub fn run_cdi_check(bin: &Path, node: &NodeDirs, args: &[&str]) -> Output {
    cdi_check_command(bin, node, args).output().unwrap()
}

/// The CDI device ids of a prepared claim, which must have prepared without error.
pub fn cdi_ids(ids: &v1::NodePrepareResourceResponse) -> Vec<String> {
    assert_eq!(ids.error, "", "{ids:?}");
    ids.devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.iter().cloned())
        .collect()
}

/// The major `/proc/devices` of the simulated node gives the driver `name`.
pub fn proc_major(node: &NodeDirs, name: &str) -> u64 {
    std::fs::read_to_string(&node.sim.proc_devices)
        .unwrap()
        .lines()
        .find_map(|l| {
            let (major, n) = l.trim().split_once(' ')?;
            (n == name).then(|| major.parse().unwrap())
        })
        .unwrap()
}
