//! A real OCI runtime (runc, or crun) runs a workload container with the CDI edits of
//! a claim the real plugin prepared. The plugin prepares two claims on a simulated
//! DGX H100 whose `/dev` holds fake NVIDIA character devices; `cdi-check` (the CDI Go
//! library containerd and CRI-O use) injects one claim's CDI ids into the runtime's
//! own default spec, seeing the fake nodes at `/dev` as a runtime on the host sees the
//! driver's; the runtime runs a busybox container with the result. What the container
//! reports is checked: exactly the claim's device nodes with the right numbers and the
//! host node's mode, the device cgroup open for them and closed for the other claim's
//! GPU, the driver files mounted read-only, and the topology hints in its environment.
//!
//! Needs root (device nodes, namespaces, cgroups), `cdi-check` (see cdi_runtime.rs),
//! a statically linked busybox (Debian `busybox-static`) and runc or crun on PATH
//! (`TOPODRA_OCI_RUNTIME` picks one binary). Without root it skips; without a tool it
//! skips, or fails under `TOPODRA_REQUIRE_TOOLS=1`; when the runtime cannot run even a
//! bare container here (a kernel or sandbox limit, not a tool missing) it skips with
//! the runtime's own error.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::json;
use support::cdi::*;
use support::oci::*;
use support::*;
use topodra_fake_nvml::Profile;
use topodra_mock_apiserver::MockApiServer;

/// Mode of the fake host nodes: the driver's `NVreg_DeviceFileMode=0660` setting, not
/// its 0666 default, because runc and crun make a node 0666 when the spec gives no
/// mode; a 0660 node in the container can only have come from the host's.
const HOST_NODE_MODE: u32 = 0o660;

/// Errno text of EPERM, which is what the device cgroup answers for a node it denies
/// (a node it allows reaches the driver, which says ENXIO when none is loaded).
const EPERM: &str = "Operation not permitted";

/// Makes the node's device nodes under its dev root, as the driver would under
/// `/dev`: every GPU's, the control node's and UVM's.
fn make_host_nodes(node: &NodeDirs, profile: &Profile) -> Vec<(String, u64, u64)> {
    let uvm = proc_major(node, "nvidia-uvm");
    let mut nodes: Vec<(String, u64, u64)> = profile
        .gpus
        .iter()
        .map(|g| {
            (
                format!("nvidia{}", g.minor),
                NVIDIA_MAJOR,
                u64::from(g.minor),
            )
        })
        .collect();
    nodes.push(("nvidiactl".into(), NVIDIA_MAJOR, NVIDIACTL_MINOR));
    nodes.push(("nvidia-uvm".into(), uvm, 0));
    nodes.push(("nvidia-uvm-tools".into(), uvm, 1));
    let dev = node.sim.dev_root.join("dev");
    for (name, major, minor) in &nodes {
        mknod(&dev.join(name), *major, *minor, HOST_NODE_MODE);
    }
    nodes
}

/// The container's script: one line per fact, keyed by its first word.
fn workload_script(mounts: &[String], denied: &str) -> String {
    format!(
        r#"nodes=$(find /dev -name 'nvidia*' | sort)
for n in $nodes; do
  if [ -c "$n" ]; then k=c; else k=other; fi
  echo "node $n $k $(stat -c '%t %T %a' "$n")"
done
for n in $nodes {denied}; do
  err=$( (: <> "$n") 2>&1 )
  echo "open $n ${{err:-ok}}"
done
for f in {mounts}; do
  if [ -f "$f" ]; then err=$( (: >> "$f") 2>&1 ); echo "mount $f ${{err:-writable}}"; else echo "mount $f missing"; fi
done
env | while IFS= read -r l; do echo "env $l"; done
echo done
"#,
        mounts = mounts.join(" "),
    )
}

/// The container's report, by key.
#[derive(Debug, Default)]
struct Report {
    /// Path to (kind, major, minor, mode).
    nodes: BTreeMap<String, (String, u64, u64, String)>,
    opens: BTreeMap<String, String>,
    mounts: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
    done: bool,
}

fn parse_report(stdout: &str) -> Report {
    let mut r = Report::default();
    for line in stdout.lines() {
        let (key, rest) = line.split_once(' ').unwrap_or((line, ""));
        match key {
            "node" => {
                let f: Vec<&str> = rest.split(' ').collect();
                let hex = |s: &str| u64::from_str_radix(s, 16).unwrap();
                r.nodes.insert(
                    f[0].to_owned(),
                    (f[1].to_owned(), hex(f[2]), hex(f[3]), f[4].to_owned()),
                );
            }
            "open" | "mount" => {
                let (path, what) = rest.split_once(' ').unwrap();
                let map = if key == "open" {
                    &mut r.opens
                } else {
                    &mut r.mounts
                };
                map.insert(path.to_owned(), what.to_owned());
            }
            "env" => {
                if let Some((k, v)) = rest.split_once('=') {
                    r.env.insert(k.to_owned(), v.to_owned());
                }
            }
            "done" => r.done = true,
            _ => panic!("unexpected line from the container: {line:?}\n{stdout}"),
        }
    }
    r
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_runs_a_workload_with_exactly_its_claims_devices_and_hints() {
    let Some(tools) = tools() else { return };
    let started = Instant::now();
    let runtime = &tools.runtime;
    eprintln!("running containers with {}", runtime.bin.display());

    let node = NodeDirs::profile("dgx-h100");
    let profile = Profile::from_yaml_str(
        &std::fs::read_to_string(topodra_fake_nvml::profiles_dir().join("dgx-h100.yaml")).unwrap(),
    )
    .unwrap();
    let host_nodes = make_host_nodes(&node, &profile);
    let api = MockApiServer::start().await.unwrap();
    api.add_node(&node.name, "node-uid-1");
    let kubeconfig = api.kubeconfig(node.root.path()).unwrap();
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(60)).await;

    // The workload's claim holds two GPUs on NUMA node 1; another claim holds GPU 0.
    api.put_claim(claim_json("c2", "node-a", &["gpu-4", "gpu-5"], None));
    api.put_claim(claim_json("other", "node-a", &["gpu-0"], None));
    let resp = prepare(&node, &["c2", "other"]).await;
    let ids = cdi_ids(&resp.claims["c2"]);
    assert_eq!(cdi_ids(&resp.claims["other"]).len(), 1);
    assert_eq!(ids.len(), 2, "{ids:?}");

    // The kubelet hands the runtime the ids; the runtime starts from its default spec.
    let dir = tempfile::tempdir().unwrap();
    let bundle = make_bundle(&dir.path().join("bundle"), &tools.busybox);
    let nvidia_files: Vec<String> = [
        "libcuda.so",
        "libnvidia-ml.so",
        "libnvidia-ptxjitcompiler.so",
    ]
    .iter()
    .map(|l| format!("/usr/lib/x86_64-linux-gnu/{l}.{}", profile.driver_version))
    .chain(["/usr/bin/nvidia-smi".to_owned()])
    .collect();
    // A node with the other claim's GPU's numbers, put there by some other means: the
    // device cgroup must still keep it shut.
    let denied = "/dev/denied-gpu0";
    let mut spec = base_spec(runtime, &bundle, &workload_script(&nvidia_files, denied)).unwrap();
    // A writable rootfs, so that only the mounts' own options can make them read-only.
    spec["root"]["readonly"] = json!(false);
    spec["linux"]["devices"] = json!([{
        "path": denied, "type": "c", "major": NVIDIA_MAJOR, "minor": 0, "fileMode": 0o666,
    }]);
    let config = inject_into_bundle(&tools.cdi_check, &node, &bundle, &spec, &ids);
    eprintln!(
        "config.json:\n{}",
        std::fs::read_to_string(&config).unwrap()
    );

    let out = runtime.run(&bundle);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} run: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        runtime.name(),
        out.status
    );
    eprintln!("the container reported:\n{stdout}");
    let report = parse_report(&stdout);
    assert!(
        report.done,
        "the script did not finish:\n{stdout}\n{stderr}"
    );

    // Exactly the claim's GPUs, the control node and UVM, as character devices with
    // the host's numbers and mode; none of the node's six other GPUs.
    let wanted = [
        "nvidia4",
        "nvidia5",
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
    ];
    let mode = format!("{HOST_NODE_MODE:o}");
    let want: BTreeMap<String, (String, u64, u64, String)> = host_nodes
        .iter()
        .filter(|(name, ..)| wanted.contains(&name.as_str()))
        .map(|(name, major, minor)| {
            (
                format!("/dev/{name}"),
                ("c".to_owned(), *major, *minor, mode.clone()),
            )
        })
        .collect();
    assert_eq!(want.len(), wanted.len(), "{host_nodes:?}");
    assert_eq!(report.nodes, want, "\n{stdout}");

    // The device cgroup lets the container open each of them (what answers is the
    // driver, or its absence), and refuses the other claim's GPU under any name.
    for path in want.keys() {
        let what = &report.opens[path];
        assert!(!what.contains(EPERM), "{path}: {what}\n{stdout}");
    }
    assert!(
        report.opens[denied].contains(EPERM),
        "{denied}: {}\n{stdout}",
        report.opens[denied]
    );

    // The driver's files are there, read-only.
    for f in &nvidia_files {
        assert!(
            report.mounts[f].contains("Read-only file system"),
            "{f}: {}\n{stdout}",
            report.mounts[f]
        );
    }

    // The topology hints, each once (the shell's environment is a map): the claim's
    // GPUs by UUID in allocation order, their NUMA node and its CPUs.
    let uuid = |minor: u32| {
        profile
            .gpus
            .iter()
            .find(|g| g.minor == minor)
            .unwrap()
            .uuid
            .clone()
    };
    let hints: BTreeMap<&str, &str> = report
        .env
        .iter()
        .filter(|(k, _)| k.starts_with("TOPODRA_") || k.starts_with("CUDA_"))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let visible = format!("{},{}", uuid(4), uuid(5));
    let cpus = profile
        .numa_nodes
        .iter()
        .find(|n| n.os_index == 1)
        .unwrap()
        .cpus
        .to_string();
    let want_hints: BTreeMap<&str, &str> = [
        ("TOPODRA_VISIBLE_GPUS", visible.as_str()),
        ("TOPODRA_NUMA_NODES", "1"),
        ("TOPODRA_CPUS", cpus.as_str()),
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
    ]
    .into();
    assert_eq!(hints, want_hints, "\n{stdout}");
    // And the runtime's own environment survived the injection.
    assert!(report.env.contains_key("PATH"), "\n{stdout}");

    assert!(plugin.terminate().success(), "{}", plugin.logs());
    let other: BTreeSet<&str> = host_nodes
        .iter()
        .map(|(n, ..)| n.as_str())
        .filter(|n| !wanted.contains(n))
        .collect();
    eprintln!(
        "{} ran the workload with {} of the node's {} NVIDIA nodes (not {other:?}) in {:?}",
        runtime.name(),
        want.len(),
        host_nodes.len(),
        started.elapsed()
    );
}
