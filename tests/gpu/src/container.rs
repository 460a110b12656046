//! A container as a runtime makes it for a pod with a claim: runc's default spec,
//! edited by the CDI library (`cdi-check`, the registry code containerd and CRI-O
//! run) with the claim's CDI ids, over a small image.
//!
//! The image is busybox (for the script), a static `ldconfig` (the CDI spec's
//! `update-ldcache` hook runs the container's own), and the probe with the glibc
//! files it links against, copied from this host as `ldd` resolves them. The driver
//! itself comes only from the CDI spec: the image has no CUDA library at all.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context as _, bail, ensure};
use serde_json::{Value, json};

/// The busybox applets the script uses.
const APPLETS: &[&str] = &["sh", "cat", "find", "sort", "ls", "readlink", "grep"];

/// What runs in the container: the probe, then `nvidia-smi -L` (the driver's tool,
/// which the CDI spec mounts), then the device nodes the container has. One fact
/// per line, keyed by the first word.
const SCRIPT: &str = r#"/probe
nvidia-smi -L >/tmp/smi 2>&1; echo "smi-rc $?"
while IFS= read -r l; do echo "smi $l"; done </tmp/smi
for n in $(find /dev -name 'nvidia*' | sort); do echo "node $n"; done
echo "script done"
"#;

/// The programs the container needs, all on this host.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Tools {
    /// The OCI runtime.
    #[arg(long, default_value = "runc")]
    pub(crate) runtime: PathBuf,
    /// `cdi-check` (tests/cdi-check): the CDI library's injection.
    #[arg(long)]
    pub(crate) cdi_check: PathBuf,
    /// A statically linked busybox.
    #[arg(long)]
    pub(crate) busybox: PathBuf,
    /// A statically linked ldconfig (Ubuntu's /sbin/ldconfig is a shell wrapper).
    #[arg(long)]
    pub(crate) ldconfig: PathBuf,
    /// The CUDA probe (tests/gpu/cuda_probe.c, compiled against this host's glibc).
    #[arg(long)]
    pub(crate) probe: PathBuf,
}

/// Lays out the bundle's image under `bundle/rootfs`.
pub(crate) fn make_image(tools: &Tools, bundle: &Path) -> anyhow::Result<()> {
    let rootfs = bundle.join("rootfs");
    for d in ["bin", "sbin", "etc", "tmp", "dev", "proc", "sys"] {
        std::fs::create_dir_all(rootfs.join(d))?;
    }
    copy(&tools.busybox, &rootfs.join("bin/busybox"))?;
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    copy(&tools.ldconfig, &rootfs.join("sbin/ldconfig"))?;
    // What ldconfig reads to know a Debian-like image's own library path.
    std::fs::write(rootfs.join("etc/debian_version"), "12.0\n")?;
    copy(&tools.probe, &rootfs.join("probe"))?;
    for lib in needed_libraries(&tools.probe)? {
        let inside = lib.strip_prefix("/").unwrap_or(&lib);
        let dest = rootfs.join(inside);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        copy(&std::fs::canonicalize(&lib)?, &dest)?;
    }
    Ok(())
}

fn copy(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::copy(from, to)
        .map(drop)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))
}

/// The shared libraries `program` loads, as `ldd` resolves them here.
fn needed_libraries(program: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(program)
        .output()
        .context("running ldd")?;
    ensure!(
        out.status.success(),
        "ldd {}: {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let path = l.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// The runtime's default spec, running [`SCRIPT`] without a terminal in a
/// writable root (the hooks write the loader cache and links into it).
pub(crate) fn base_spec(tools: &Tools, bundle: &Path) -> anyhow::Result<Value> {
    let out = Command::new(&tools.runtime)
        .arg("spec")
        .arg("--bundle")
        .arg(bundle)
        .output()
        .with_context(|| format!("running {} spec", tools.runtime.display()))?;
    ensure!(
        out.status.success(),
        "{} spec: {}",
        tools.runtime.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let path = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    std::fs::remove_file(path)?;
    spec["process"]["terminal"] = json!(false);
    spec["process"]["args"] = json!(["/bin/sh", "-c", SCRIPT]);
    spec["process"]["env"] =
        json!(["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]);
    spec["root"]["readonly"] = json!(false);
    Ok(spec)
}

/// `cdi-check` applies `ids` from `cdi_dir` to `spec` and writes the bundle's
/// `config.json`; returns its stdout (the edits, as JSON). With a `dev_root` other
/// than `/`, it runs in a private mount namespace whose `/dev` is that root's: the
/// CDI library reads each device node's type and numbers from the host path.
pub(crate) fn inject(
    tools: &Tools,
    cdi_dir: &Path,
    dev_root: &Path,
    bundle: &Path,
    spec: &Value,
    ids: &[String],
) -> anyhow::Result<String> {
    let base = bundle.join("base.json");
    std::fs::write(&base, serde_json::to_vec_pretty(spec)?)?;
    let mut args: Vec<String> = vec![
        "--spec-dir".into(),
        cdi_dir.display().to_string(),
        "--oci-spec".into(),
        base.display().to_string(),
        "--oci-spec-out".into(),
        bundle.join("config.json").display().to_string(),
    ];
    args.extend(ids.iter().cloned());
    let mut cmd = if dev_root == Path::new("/") {
        Command::new(&tools.cdi_check)
    } else {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-ec"])
            .arg("mount --bind \"$1/dev\" /dev; shift; exec \"$@\"")
            .arg("sh")
            .arg(dev_root)
            .arg(&tools.cdi_check);
        cmd
    };
    let out = cmd.args(&args).output().context("running cdi-check")?;
    if !out.status.success() {
        bail!(
            "cdi-check {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs the bundle's container in the foreground with its state in `state`, and
/// removes it whatever happened: `timeout` ends a hung run.
pub(crate) fn run(tools: &Tools, state: &Path, bundle: &Path, id: &str) -> anyhow::Result<Output> {
    let out = Command::new("timeout")
        .args(["--kill-after=10", "120"])
        .arg(&tools.runtime)
        .arg("--root")
        .arg(state)
        .arg("run")
        .arg("--bundle")
        .arg(bundle)
        .arg(id)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", tools.runtime.display()))?;
    let _ = Command::new(&tools.runtime)
        .arg("--root")
        .arg(state)
        .args(["delete", "--force", id])
        .output();
    Ok(out)
}

/// The containers the runtime still knows in `state`.
pub(crate) fn listed(tools: &Tools, state: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new(&tools.runtime)
        .arg("--root")
        .arg(state)
        .args(["list", "--quiet"])
        .output()
        .context("runtime list")?;
    ensure!(
        out.status.success(),
        "{} list: {}",
        tools.runtime.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect())
}

/// What the container printed, by key.
#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct Seen {
    /// `cuda init=.. version=.. count=.. lib=..`, or why the probe could not start.
    pub(crate) cuda: String,
    /// `(uuid, name)` of each device CUDA enumerated.
    pub(crate) devices: Vec<(String, String)>,
    /// `ok n=..`, `fail ...` or `skipped ...`.
    pub(crate) kernel: String,
    pub(crate) smi_rc: Option<i32>,
    pub(crate) smi: Vec<String>,
    pub(crate) nodes: Vec<String>,
    pub(crate) probe_done: bool,
    pub(crate) script_done: bool,
}

impl Seen {
    pub(crate) fn parse(stdout: &str) -> Self {
        let mut s = Self::default();
        for line in stdout.lines() {
            let (key, rest) = line.split_once(' ').unwrap_or((line, ""));
            match key {
                "cuda" => s.cuda = rest.to_owned(),
                "device" => {
                    let field = |name: &str| {
                        rest.split_whitespace()
                            .find_map(|w| w.strip_prefix(name))
                            .unwrap_or_default()
                            .to_owned()
                    };
                    s.devices.push((field("uuid="), field("name=")));
                }
                "kernel" => s.kernel = rest.to_owned(),
                "smi-rc" => s.smi_rc = rest.trim().parse().ok(),
                "smi" => s.smi.push(rest.to_owned()),
                "node" => s.nodes.push(rest.to_owned()),
                "probe" if rest == "done" => s.probe_done = true,
                "script" if rest == "done" => s.script_done = true,
                _ => {}
            }
        }
        s
    }

    /// A field `name=value` of the `cuda` line.
    pub(crate) fn cuda_field(&self, name: &str) -> Option<&str> {
        self.cuda
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_container_lines_are_read_by_key() {
        let seen = Seen::parse(
            "cuda init=0 version=13000 count=1 lib=/lib64/libcuda.so.580.159.04\n\
             device 0 uuid=GPU-11f42855-bbc5-4b61-a0ae-9780bc370569 name=NVIDIA_H200\n\
             kernel ok n=256\nprobe done\nsmi-rc 0\n\
             smi GPU 0: NVIDIA H200 (UUID: GPU-11f42855-bbc5-4b61-a0ae-9780bc370569)\n\
             node /dev/nvidia0\nnode /dev/nvidiactl\nscript done\n",
        );
        assert_eq!(seen.cuda_field("count"), Some("1"));
        assert_eq!(seen.cuda_field("init"), Some("0"));
        assert_eq!(
            seen.devices,
            [(
                "GPU-11f42855-bbc5-4b61-a0ae-9780bc370569".to_owned(),
                "NVIDIA_H200".to_owned()
            )]
        );
        assert_eq!(seen.kernel, "ok n=256");
        assert_eq!(seen.smi_rc, Some(0));
        assert_eq!(seen.smi.len(), 1);
        assert_eq!(seen.nodes, ["/dev/nvidia0", "/dev/nvidiactl"]);
        assert!(seen.probe_done && seen.script_done);
    }
}
