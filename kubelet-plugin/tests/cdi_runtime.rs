//! The CDI specs the real plugin writes, read back by the CDI Go library that
//! containerd and CRI-O use (`tests/cdi-check`): the plugin prepares claims on a
//! simulated DGX H100, and `cdi-check` builds the library's cache over the plugin's
//! spec directory and injects the CDI ids the kubelet got back into an OCI spec, as a
//! runtime does when it creates the container.
//!
//! `cdi-check` comes from `$TOPODRA_CDI_CHECK`, or is built by
//! `tests/cdi-check/build.sh` (needs `go`). Without either the test prints why and
//! passes, unless `TOPODRA_REQUIRE_TOOLS=1`, when it fails.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::cdi::*;
use support::*;
use topodra_fake_nvml::Profile;
use topodra_mock_apiserver::MockApiServer;
use topodra_proto::dra::v1;

/// The injection result of `ids`, which must succeed.
fn inject(bin: &Path, node: &NodeDirs, ids: &[String]) -> Value {
    let args: Vec<&str> = ids.iter().map(String::as_str).collect();
    let out = run_cdi_check(bin, node, &args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cdi-check {ids:?} failed ({}):\n{}\nspecs: {:?}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        node.cdi_specs()
    );
    // Shown on failure, or with --nocapture.
    eprintln!("cdi-check {}:\n{stdout}", ids.join(" "));
    serde_json::from_str(&stdout).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

/// What a container that gets `minors` (and nothing else of ours) must receive.
fn check_edits(result: &Value, node: &NodeDirs, profile: &Profile, minors: &[u64], numa: &str) {
    let uvm = proc_major(node, "nvidia-uvm");

    // Device nodes: exactly the claim's GPUs, the control node and UVM, all char
    // devices with the numbers from the spec (no host node needed).
    let devices: BTreeSet<(String, String, u64, u64)> = result["linux"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["path"].as_str().unwrap().to_owned(),
                d["type"].as_str().unwrap().to_owned(),
                d["major"].as_u64().unwrap(),
                d["minor"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut want: BTreeSet<(String, String, u64, u64)> = minors
        .iter()
        .map(|m| (format!("/dev/nvidia{m}"), "c".into(), NVIDIA_MAJOR, *m))
        .collect();
    want.insert((
        "/dev/nvidiactl".into(),
        "c".into(),
        NVIDIA_MAJOR,
        NVIDIACTL_MINOR,
    ));
    want.insert(("/dev/nvidia-uvm".into(), "c".into(), uvm, 0));
    want.insert(("/dev/nvidia-uvm-tools".into(), "c".into(), uvm, 1));
    assert_eq!(devices, want, "{result:#}");
    assert_eq!(
        result["linux"]["devices"].as_array().unwrap().len(),
        want.len(),
        "a device node injected twice: {result:#}"
    );

    // The device cgroup allows each of them for read and write, nothing more.
    let rules = result["linux"]["resources"]["devices"].as_array().unwrap();
    assert_eq!(rules.len(), want.len(), "{result:#}");
    for rule in rules {
        assert_eq!(rule["allow"], true, "{rule}");
        assert_eq!(rule["type"], "c", "{rule}");
        assert_eq!(rule["access"], "rw", "{rule}");
    }

    // The driver's libraries and tools, bind-mounted read-only from the driver root.
    let version = &profile.driver_version;
    let driver_root = node.sim.driver_root.display().to_string();
    let mounts = result["mounts"].as_array().unwrap();
    let destinations: BTreeSet<&str> = mounts
        .iter()
        .map(|m| m["destination"].as_str().unwrap())
        .collect();
    for lib in [
        "libcuda.so",
        "libnvidia-ml.so",
        "libnvidia-ptxjitcompiler.so",
    ] {
        let dest = format!("/usr/lib/x86_64-linux-gnu/{lib}.{version}");
        assert!(destinations.contains(dest.as_str()), "{dest}: {result:#}");
    }
    assert!(destinations.contains("/usr/bin/nvidia-smi"), "{result:#}");
    for m in mounts {
        let dest = m["destination"].as_str().unwrap();
        let source = m["source"].as_str().unwrap();
        let options = strings(&m["options"]);
        if dest == "/var/run/nvidia-container-devices/void" {
            // The device list of nvidia-container-runtime's volume-mounts strategy,
            // emptied so that runtime adds no GPU of its own.
            assert_eq!(source, "/dev/null", "{m}");
            assert!(options.iter().any(|o| o == "ro"), "{m}");
            continue;
        }
        // Everything else from the driver root, where it resolved: a loader config
        // is at the place the image's loader looks, not where the host keeps it.
        assert!(source.starts_with(&driver_root), "{m}");
        let ipc = dest.ends_with("/socket") || dest == "/tmp/nvidia-mps";
        if ipc {
            // IPC endpoints are written to, and nothing in them runs.
            assert!(
                options.iter().any(|o| o == "noexec") && !options.iter().any(|o| o == "ro"),
                "{m}"
            );
        } else {
            assert!(options.iter().any(|o| o == "ro"), "{m}");
        }
        assert!(options.iter().any(|o| o.ends_with("bind")), "{m}");
    }

    // The hooks the runtime runs, all through the one nvidia-cdi-hook the plugin
    // named, and the environment that keeps nvidia-container-runtime out of it.
    let hooks = result["hooks"]["createContainer"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = hooks
        .iter()
        .filter_map(|h| h["args"].get(1).and_then(Value::as_str))
        .collect();
    for want in [
        "create-symlinks",
        "enable-cuda-compat",
        "update-ldcache",
        "disable-device-node-modification",
    ] {
        assert!(
            names.contains(&want),
            "{want} missing from {names:?}: {result:#}"
        );
    }
    let hook_paths: BTreeSet<&str> = hooks.iter().filter_map(|h| h["path"].as_str()).collect();
    assert_eq!(hook_paths.len(), 1, "{hook_paths:?}");
    assert!(
        strings(&result["process"]["env"]).contains(&"NVIDIA_VISIBLE_DEVICES=void".to_owned()),
        "{result:#}"
    );

    // The topology hints: the claim's GPUs by UUID in allocation order, its NUMA node.
    let env = strings(&result["process"]["env"]);
    let uuids: Vec<&str> = minors
        .iter()
        .map(|m| {
            profile
                .gpus
                .iter()
                .find(|g| u64::from(g.minor) == *m)
                .unwrap()
                .uuid
                .as_str()
        })
        .collect();
    let visible = format!("TOPODRA_VISIBLE_GPUS={}", uuids.join(","));
    let numa = format!("TOPODRA_NUMA_NODES={numa}");
    for want in [
        visible.as_str(),
        numa.as_str(),
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
    ] {
        assert!(env.iter().any(|e| e == want), "{want} not in {env:?}");
    }
    // Each key once: a container must not see two values.
    let keys: BTreeSet<&str> = env.iter().map(|e| e.split('=').next().unwrap()).collect();
    assert_eq!(keys.len(), env.len(), "{env:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn runtimes_resolve_and_inject_the_specs_of_prepared_claims() {
    let Some(bin) = cdi_check() else { return };
    let node = NodeDirs::profile("dgx-h100");
    let profile = Profile::from_yaml_str(
        &std::fs::read_to_string(topodra_fake_nvml::profiles_dir().join("dgx-h100.yaml")).unwrap(),
    )
    .unwrap();
    let api = MockApiServer::start().await.unwrap();
    api.add_node(&node.name, "node-uid-1");
    let kubeconfig = api.kubeconfig(node.root.path()).unwrap();
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(60)).await;

    // On the DGX H100, GPUs 0-3 hang off NUMA node 0 and 4-7 off NUMA node 1.
    api.put_claim(claim_json("c1", "node-a", &["gpu-5"], None));
    api.put_claim(claim_json(
        "c4",
        "node-a",
        &["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
        None,
    ));
    let mut dra = dra_client(&node).await;
    let resp = dra
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![claim_ref("c1"), claim_ref("c4")],
        })
        .await
        .unwrap()
        .into_inner();
    let one = cdi_ids(&resp.claims["c1"]);
    let four = cdi_ids(&resp.claims["c4"]);
    assert_eq!(one, vec!["k8s.gpu.topodra.dev/claim=c1-gpu-5"]);
    assert_eq!(four.len(), 4, "{four:?}");
    assert_eq!(node.cdi_specs().len(), 2, "{:?}", node.cdi_specs());

    // Both specs load without a single error, with exactly the claims' devices.
    let out = run_cdi_check(&bin, &node, &["--validate-only"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let loaded: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut all: Vec<String> = loaded["specs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| strings(&s["devices"]))
        .collect();
    all.sort();
    let mut want: Vec<String> = one.iter().chain(&four).cloned().collect();
    want.sort();
    assert_eq!(all, want);

    let result = inject(&bin, &node, &one);
    check_edits(&result, &node, &profile, &[5], "1");
    let result = inject(&bin, &node, &four);
    check_edits(&result, &node, &profile, &[0, 1, 2, 3], "0");
    // One memory-limit hook per whole GPU of the claim, at createRuntime, each
    // naming its GPU.
    let gpu_ids: BTreeSet<String> = result["hooks"]["createRuntime"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|h| h["args"][1] == "apply-cuda-memory-limits")
        .filter_map(|h| h["args"][5].as_str().map(str::to_owned))
        .collect();
    let want_ids: BTreeSet<String> = [0, 1, 2, 3]
        .iter()
        .map(|m| {
            profile
                .gpus
                .iter()
                .find(|g| g.minor == *m)
                .unwrap()
                .uuid
                .clone()
        })
        .collect();
    assert_eq!(gpu_ids, want_ids, "{result:#}");

    // Unprepared: the runtime can no longer resolve the claim's ids, and names them;
    // the other claim is untouched.
    let un = dra
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![claim_ref("c1")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims["c1"].error, "");
    let out = run_cdi_check(&bin, &node, &[one[0].as_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("unresolvable CDI devices {}", one[0])),
        "{stderr}"
    );
    check_edits(
        &inject(&bin, &node, &four),
        &node,
        &profile,
        &[0, 1, 2, 3],
        "0",
    );

    let un = dra
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![claim_ref("c4")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims["c4"].error, "");
    let args: Vec<&str> = four.iter().map(String::as_str).collect();
    let out = run_cdi_check(&bin, &node, &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("unresolvable CDI devices {}", four.join(", "))),
        "{stderr}"
    );
    assert!(plugin.terminate().success(), "{}", plugin.logs());

    // The check has teeth: one spec the library refuses anywhere in the directory
    // fails it, with the library's reason.
    let bad = node.cdi_dir().join("k8s.gpu.topodra.dev-claim_bad.json");
    std::fs::write(
        &bad,
        r#"{"cdiVersion": "0.5.0", "kind": "k8s.gpu.topodra.dev/claim", "annotations": {"a": "b"},
            "devices": [{"name": "bad-gpu-0", "containerEdits": {"env": ["A=1"]}}]}"#,
    )
    .unwrap();
    let out = run_cdi_check(&bin, &node, &["--validate-only"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&bad.display().to_string())
            && stderr.contains("the spec version must be at least v0.6.0"),
        "{stderr}"
    );
}
