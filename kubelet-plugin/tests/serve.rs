//! The real plugin binary on a simulated node: registration, prepare and unprepare
//! over its Unix sockets, claims read from a (mock) API server, restarts and crashes.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;
use std::time::Duration;

use support::*;
use topodra_mock_apiserver::MockApiServer;
use topodra_proto::dra::v1;
use topodra_proto::pluginregistration::v1::InfoRequest;
use topodra_proto::pluginregistration::v1::registration_client::RegistrationClient;

async fn api_for(node: &NodeDirs) -> (MockApiServer, std::path::PathBuf) {
    let api = MockApiServer::start().await.unwrap();
    api.add_node(&node.name, "node-uid-1");
    let kubeconfig = api.kubeconfig(node.root.path()).unwrap();
    (api, kubeconfig)
}

#[tokio::test(flavor = "multi_thread")]
async fn registers_publishes_prepares_and_unprepares() {
    let node = NodeDirs::profile("dgx-h100");
    let (api, kubeconfig) = api_for(&node).await;
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(60)).await;

    let info = RegistrationClient::new(channel(&node.registration_socket()).await)
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.endpoint, node.dra_socket().display().to_string());
    assert_eq!(info.supported_versions[0], "v1.DRAPlugin");

    // The pool is published once, with the topology attributes.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while api.slices().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no slice:\n{}",
            plugin.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let slice = &api.slices()[0];
    assert_eq!(slice["spec"]["devices"].as_array().unwrap().len(), 8);
    assert_eq!(slice["metadata"]["ownerReferences"][0]["uid"], "node-uid-1");
    assert_eq!(
        slice["spec"]["devices"][0]["attributes"]["resource.kubernetes.io/numaNode"]["int"],
        0
    );

    api.put_claim(claim_json("u1", "node-a", &["gpu-0"], None));
    let all: Vec<String> = (0..8).map(|i| format!("gpu-{i}")).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    api.put_claim(claim_json("u8", "node-a", &all[..], None));
    let mut dra = dra_client(&node).await;
    let resp = dra
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![claim_ref("u1")],
        })
        .await
        .unwrap()
        .into_inner();
    let one = &resp.claims["u1"];
    assert_eq!(one.error, "");
    assert_eq!(
        one.devices[0].cdi_device_ids,
        vec!["k8s.gpu.topodra.dev/claim=u1-gpu-0"]
    );
    assert_eq!(one.devices[0].pool_name, "node-a");

    // Double prepare answers the same; an 8-GPU claim overlapping it is refused.
    let again = dra
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![claim_ref("u1"), claim_ref("u8")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(&again.claims["u1"], one);
    assert!(
        again.claims["u8"].error.contains("already prepared"),
        "{:?}",
        again.claims["u8"]
    );

    let un = dra
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![claim_ref("u1"), claim_ref("unknown")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims["u1"].error, "");
    assert_eq!(
        un.claims["unknown"].error, "",
        "unprepare of an unknown claim succeeds"
    );
    let eight = dra
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![claim_ref("u8")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        eight.claims["u8"].devices.len(),
        8,
        "{:?}",
        eight.claims["u8"]
    );
    assert_eq!(node.cdi_specs(), vec!["k8s.gpu.topodra.dev-claim_u8.json"]);

    // Metrics saw it, and the API traffic is GETs, one watch and applies: no LIST.
    let (_, metrics) = http_get(plugin.http, "/metrics").await.unwrap();
    assert!(
        metrics.contains("topodra_prepare_duration_seconds_count{outcome=\"ok\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("topodra_prepared_devices 8"), "{metrics}");
    // The slices are published (readiness waited for it) and every GPU answered NVML.
    for line in [
        "topodra_publish_in_sync 1",
        "topodra_publish_failures_total 0",
        "topodra_device_health{state=\"healthy\"} 8",
        "topodra_build_info{",
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }
    assert!(
        api.requests()
            .iter()
            .all(|r| r.method != "GET" || r.is_watch() || !r.path.ends_with("resourceslices"))
    );

    let status = plugin.terminate();
    assert!(status.success(), "{status}\n{}", plugin.logs());
    assert!(
        !node.registration_socket().exists(),
        "sockets removed on SIGTERM"
    );
    assert!(!node.dra_socket().exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn per_claim_errors_name_the_problem() {
    let node = NodeDirs::profile("dgx-h100");
    let (api, kubeconfig) = api_for(&node).await;
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(60)).await;
    api.put_claim(claim_json(
        "bad-config",
        "node-a",
        &["gpu-0"],
        Some(serde_json::json!({"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig", "numa": {"exportHint": true}})),
    ));
    api.put_claim(claim_json("other-node", "node-b", &["gpu-1"], None));
    api.put_claim(claim_json("good", "node-a", &["gpu-2"], None));
    let resp = prepare(&node, &["bad-config", "other-node", "missing", "good"]).await;
    assert!(
        resp.claims["bad-config"].error.contains("numa.exportHint"),
        "{:?}",
        resp.claims["bad-config"]
    );
    assert!(
        resp.claims["other-node"].error.contains("another node"),
        "{:?}",
        resp.claims["other-node"]
    );
    assert!(
        resp.claims["missing"].error.contains("not found"),
        "{:?}",
        resp.claims["missing"]
    );
    assert_eq!(resp.claims["good"].error, "");
    assert_eq!(
        node.cdi_specs(),
        vec!["k8s.gpu.topodra.dev-claim_good.json"]
    );
}

/// Issue 42, case 3: a claim whose config for another driver nests 150 objects
/// (past serde_json's 128 levels) once failed its every prepare as a transient read
/// error, 20 GETs in 30 s per kubelet retry. Now the other driver's deep parameters
/// are pruned and the claim prepares; a deep config of ours is refused as invalid;
/// an object that decodes in no way fails alone; and each is read once.
#[tokio::test(flavor = "multi_thread")]
async fn claims_nested_past_the_decoder_limit_are_read_once_and_fail_alone() {
    let node = NodeDirs::profile("dgx-h100");
    let (api, kubeconfig) = api_for(&node).await;
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(60)).await;
    let mut deep = serde_json::json!({"x": 1});
    for _ in 0..150 {
        deep = serde_json::json!({ "a": deep });
    }
    let mut other = claim_json("deep-other", "node-a", &["gpu-0"], None);
    other["status"]["allocation"]["devices"]["config"] = serde_json::json!([
        {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": deep.clone()}}
    ]);
    api.put_claim(other);
    api.put_claim(claim_json(
        "deep-ours",
        "node-a",
        &["gpu-1"],
        Some(serde_json::json!({"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig", "sharing": deep})),
    ));
    let mut shapeless = claim_json("shapeless", "node-a", &["gpu-2"], None);
    shapeless["spec"] = serde_json::json!(5);
    api.put_claim(shapeless);

    let resp = prepare(&node, &["deep-other", "deep-ours", "shapeless"]).await;
    assert_eq!(
        resp.claims["deep-other"].error,
        "",
        "{:?}\n{}",
        resp.claims["deep-other"],
        plugin.logs()
    );
    assert!(
        resp.claims["deep-ours"].error.contains("sharing"),
        "{:?}",
        resp.claims["deep-ours"]
    );
    assert!(
        resp.claims["shapeless"]
            .error
            .contains("the object cannot be decoded"),
        "{:?}",
        resp.claims["shapeless"]
    );
    for uid in ["deep-other", "deep-ours", "shapeless"] {
        let path = format!("/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/claim-{uid}");
        let gets = api
            .requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path == path)
            .count();
        assert_eq!(gets, 1, "{uid}: a decoded answer is final");
    }
    assert_eq!(
        node.cdi_specs(),
        vec!["k8s.gpu.topodra.dev-claim_deep-other.json"]
    );
}

/// Starts the plugin with `env` and the crash point `point`, sends it a prepare of
/// claim `u1`, and waits until the crash point has killed it mid-call.
async fn prepare_until_crash(
    node: &NodeDirs,
    kubeconfig: &std::path::Path,
    env: &[(&str, &str)],
    point: &str,
) {
    let mut env = env.to_vec();
    env.push(("TOPODRA_TEST_CRASH_AT", point));
    let mut crashing = Plugin::start(node, kubeconfig, &env);
    crashing.wait_live(Duration::from_secs(60)).await;
    let result = dra_client(node)
        .await
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![claim_ref("u1")],
        })
        .await;
    assert!(result.is_err(), "{point}: the process aborted mid-call");
    assert!(!crashing.wait_exit(Duration::from_secs(10)).success());
}

// The binary has `--test-crash-at` only when built with the crash-points feature; a
// bin-only crate cannot turn its own feature on for its tests, so `make test-unit`
// passes `--features topodra-kubelet-plugin/crash-points`.
#[cfg_attr(
    not(feature = "crash-points"),
    ignore = "needs --features topodra-kubelet-plugin/crash-points"
)]
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_at_each_prepare_step_then_a_restart_leaks_nothing() {
    for point in ["after-started-record", "after-cdi-write", "before-answer"] {
        let node = NodeDirs::profile("dgx-h100");
        let (api, kubeconfig) = api_for(&node).await;
        api.put_claim(claim_json("u1", "node-a", &["gpu-0", "gpu-1"], None));
        prepare_until_crash(&node, &kubeconfig, &[], point).await;

        let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
        plugin.wait_live(Duration::from_secs(60)).await;
        let resp = prepare(&node, &["u1"]).await;
        assert_eq!(resp.claims["u1"].error, "", "{point}");
        assert_eq!(
            node.cdi_specs(),
            vec!["k8s.gpu.topodra.dev-claim_u1.json"],
            "{point}"
        );
        let un = unprepare(&node, &["u1"]).await;
        assert_eq!(un.claims["u1"].error, "");
        assert!(
            node.cdi_specs().is_empty(),
            "{point}: {:?}",
            node.cdi_specs()
        );
        plugin.terminate();
    }
}

/// The simulated driver's MIG instances: (GPU UUID, start, size, compute instances).
fn mig_instances(node: &NodeDirs) -> Vec<(String, u32, u32, usize)> {
    topodra_fake_nvml::ffi::mig::state::read(&node.sim.nvml_state)
        .unwrap()
        .spans()
}

/// Dynamic MIG: the process killed after each step of making a partition's
/// instance; the next start rolls the half-made instance back by the placement its
/// record names, and the kubelet's retry makes it anew. No instance leaks.
#[cfg_attr(
    not(feature = "crash-points"),
    ignore = "needs --features topodra-kubelet-plugin/crash-points"
)]
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_at_each_dynamic_mig_step_then_a_restart_leaks_no_instance() {
    for point in [
        "after-started-record",
        "after-gpu-instance",
        "after-compute-instance",
        "before-spec",
        "after-cdi-write",
    ] {
        let node = NodeDirs::profile("dgx-h100-mig");
        let (api, kubeconfig) = api_for(&node).await;
        api.put_claim(claim_json("u1", "node-a", &["gpu-2-mig-1g-10gb-6"], None));
        let dynamic = ("TOPODRA_DYNAMIC_MIG", "true");
        prepare_until_crash(&node, &kubeconfig, &[dynamic], point).await;

        let mut plugin = Plugin::start(&node, &kubeconfig, &[dynamic]);
        plugin.wait_live(Duration::from_secs(60)).await;
        let resp = prepare(&node, &["u1"]).await;
        assert_eq!(resp.claims["u1"].error, "", "{point}");
        let made = mig_instances(&node);
        assert_eq!(made.len(), 1, "{point}: {made:?}");
        assert_eq!((made[0].1, made[0].2, made[0].3), (6, 1, 1), "{point}");
        let un = unprepare(&node, &["u1"]).await;
        assert_eq!(un.claims["u1"].error, "");
        assert!(mig_instances(&node).is_empty(), "{point}");
        assert!(node.cdi_specs().is_empty(), "{point}");
        plugin.terminate();
    }
}

/// A time-sliced share, the process killed after each step of its prepare: the
/// next start resets the GPU's interval where the crash left it set, the kubelet's
/// retry sets it again, and the last unprepare resets it. What the driver root's
/// nvidia-smi was told is checked after each step.
#[cfg_attr(
    not(feature = "crash-points"),
    ignore = "needs --features topodra-kubelet-plugin/crash-points"
)]
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_at_each_time_slice_step_then_a_restart_leaves_the_interval_as_the_shares_need() {
    let sharing = [
        ("TOPODRA_TIME_SLICING", "true"),
        ("TOPODRA_TIME_SLICE_INTERVAL", "Long"),
    ];
    for (point, set_before_restart) in [
        ("after-started-record", false),
        ("after-time-slice", true),
        ("after-cdi-write", true),
        ("before-answer", true),
    ] {
        let node = NodeDirs::profile("l40s-pcie");
        let (api, kubeconfig) = api_for(&node).await;
        let mut claim = claim_json("u1", "node-a", &["gpu-3-ts"], None);
        let result = &mut claim["status"]["allocation"]["devices"]["results"][0];
        result["shareID"] = "7f1e5d3c-0000-4000-8000-000000000001".into();
        result["consumedCapacity"] = serde_json::json!({"memory": "10Gi"});
        api.put_claim(claim);
        let calls =
            || topodra_fake_nvml::driver_root::nvidia_smi_calls(&node.sim.driver_root).unwrap();
        let uuid = "GPU-5c6d7e8f-9a0b-4c1d-8e2f-3a4b5c6d7e03";
        let set = |v: u32| topodra_fake_nvml::driver_root::set_timeslice_call(uuid, v);

        prepare_until_crash(&node, &kubeconfig, &sharing, point).await;
        let want: Vec<String> = if set_before_restart {
            vec![set(3)]
        } else {
            vec![]
        };
        assert_eq!(calls(), want, "{point}");

        let mut plugin = Plugin::start(&node, &kubeconfig, &sharing);
        plugin.wait_live(Duration::from_secs(60)).await;
        let resp = prepare(&node, &["u1"]).await;
        assert_eq!(resp.claims["u1"].error, "", "{point}");
        // Rolled back (reset) and set again, or rolled forward with it set.
        let after = calls();
        assert_eq!(after.last(), Some(&set(3)), "{point}: {after:?}");
        let un = unprepare(&node, &["u1"]).await;
        assert_eq!(un.claims["u1"].error, "");
        assert_eq!(calls().last(), Some(&set(0)), "{point}: {:?}", calls());
        assert!(node.cdi_specs().is_empty(), "{point}");
        plugin.terminate();
    }
}

/// An MPS share, the process killed after each step of its prepare: the next
/// start quits the daemon and puts the compute mode back where the crash left
/// them, the kubelet's retry sets both up again, and the last unprepare undoes
/// them; no daemon is left running.
#[cfg_attr(
    not(feature = "crash-points"),
    ignore = "needs --features topodra-kubelet-plugin/crash-points"
)]
#[tokio::test(flavor = "multi_thread")]
async fn a_crash_at_each_mps_step_then_a_restart_leaves_no_daemon() {
    let mps = [("TOPODRA_MPS", "true")];
    for point in ["after-compute-mode", "after-mps-daemon", "after-cdi-write"] {
        let node = NodeDirs::profile("l40s-pcie");
        let (api, kubeconfig) = api_for(&node).await;
        let mut claim = claim_json("u1", "node-a", &["gpu-4-mps"], None);
        let result = &mut claim["status"]["allocation"]["devices"]["results"][0];
        result["shareID"] = "7f1e5d3c-0000-4000-8000-000000000002".into();
        result["consumedCapacity"] = serde_json::json!({"memory": "4Gi", "compute": "20"});
        api.put_claim(claim);
        let uuid = "GPU-5c6d7e8f-9a0b-4c1d-8e2f-3a4b5c6d7e04";
        let mode = || {
            topodra_fake_nvml::ffi::mig::state::compute_mode(&node.sim.nvml_state, uuid).unwrap()
        };
        let pipe = node.path("plugins").join(DRIVER).join("mps/gpu-4/pipe");
        let daemon = || topodra_fake_nvml::driver_root::mps_daemon_pid(&pipe).unwrap();

        prepare_until_crash(&node, &kubeconfig, &mps, point).await;
        assert_eq!(mode(), 3, "{point}: EXCLUSIVE_PROCESS before the crash");

        let mut plugin = Plugin::start(&node, &kubeconfig, &mps);
        plugin.wait_live(Duration::from_secs(60)).await;
        let resp = prepare(&node, &["u1"]).await;
        assert_eq!(resp.claims["u1"].error, "", "{point}");
        assert_eq!(mode(), 3, "{point}");
        assert!(daemon().is_some(), "{point}: the daemon runs");
        let un = unprepare(&node, &["u1"]).await;
        assert_eq!(un.claims["u1"].error, "");
        assert_eq!(mode(), 0, "{point}");
        assert_eq!(daemon(), None, "{point}: the daemon quit");
        plugin.terminate();
    }
}

/// An XID that takes a time-sliced GPU down taints the GPU's exclusive device and
/// its shared one in the published slice, so no new share lands there, and the
/// other GPUs' shares stay untainted.
#[tokio::test(flavor = "multi_thread")]
async fn an_xid_on_a_time_sliced_gpu_taints_its_shared_device() {
    let mut yaml =
        std::fs::read_to_string(topodra_fake_nvml::profiles_dir().join("l40s-pcie.yaml")).unwrap();
    yaml.push_str("xid_events:\n  - {gpu_index: 3, xid: 79, after_ms: 500}\n");
    let node = NodeDirs::new(&yaml, "node-a");
    let (api, kubeconfig) = api_for(&node).await;
    let mut plugin = Plugin::start(&node, &kubeconfig, &[("TOPODRA_TIME_SLICING", "true")]);
    plugin.wait_live(Duration::from_secs(60)).await;
    let taints_of = |name: &str| -> Option<serde_json::Value> {
        api.slices()
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .find(|d| d["name"] == name)
            .map(|d| d["taints"].clone())
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ts = taints_of("gpu-3-ts");
        if ts
            .as_ref()
            .and_then(|t| t.as_array())
            .is_some_and(|t| !t.is_empty())
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "gpu-3-ts not tainted: {ts:?}\n{}",
            plugin.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(taints_of("gpu-3-ts"), taints_of("gpu-3"));
    assert_eq!(taints_of("gpu-2-ts"), Some(serde_json::Value::Null));
    plugin.terminate();
}

#[tokio::test(flavor = "multi_thread")]
async fn prepared_claims_survive_a_restart_and_a_corrupt_checkpoint() {
    let node = NodeDirs::profile("dgx-h100");
    let (api, kubeconfig) = api_for(&node).await;
    api.put_claim(claim_json("u1", "node-a", &["gpu-3"], None));
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(60)).await;
    let resp = prepare(&node, &["u1"]).await;
    assert_eq!(resp.claims["u1"].error, "");
    assert!(plugin.terminate().success());

    std::fs::write(
        node.path("plugins").join(DRIVER).join("checkpoint.json"),
        b"{\"version\":1,\"chec",
    )
    .unwrap();
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(60)).await;
    assert!(
        plugin.logs().contains("checkpoint was corrupt"),
        "{}",
        plugin.logs()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !api
        .events_posted()
        .iter()
        .any(|e| e["reason"] == "CheckpointQuarantined")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no event: {:?}",
            api.events_posted()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // `kubectl describe node` finds Events by the Node's uid, not by its name alone.
    let events = api.events_posted();
    let quarantined = events
        .iter()
        .find(|e| e["reason"] == "CheckpointQuarantined")
        .unwrap();
    assert_eq!(quarantined["regarding"]["kind"], "Node", "{quarantined}");
    assert_eq!(quarantined["regarding"]["name"], "node-a", "{quarantined}");
    assert_eq!(
        quarantined["regarding"]["uid"], "node-uid-1",
        "{quarantined}"
    );
    let un = unprepare(&node, &["u1"]).await;
    assert_eq!(un.claims["u1"].error, "");
    assert!(node.cdi_specs().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn api_server_down_at_start_then_back() {
    let node = NodeDirs::profile("l40s-pcie");
    let addr = free_port();
    let kubeconfig = topodra_mock_apiserver::write_kubeconfig(node.root.path(), addr).unwrap();
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    // Serving the kubelet does not wait for the API server.
    plugin.wait_live(Duration::from_secs(60)).await;
    let (status, body) = http_get(plugin.http, "/readyz").await.unwrap();
    assert_eq!(status, 503, "{body}");

    let api = MockApiServer::start_on(addr).await.unwrap();
    api.add_node("node-a", "node-uid-1");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while api.slices().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "never published:\n{}",
            plugin.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Wiped by the kubelet: published again.
    api.wipe_slices();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while api.slices().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "not republished:\n{}",
            plugin.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A synthetic node with `n` GPUs, each on a root complex of its own, all on one NUMA
/// node: enough devices for a hundred single-GPU claims.
fn many_gpus_profile(n: u32) -> String {
    let mut yaml = String::from(
        "name: many\ndescription: synthetic\nsources: synthetic\ndriver_version: \"550.90.07\"\n\
         cuda_driver_version: 12040\npackages:\n  - {os_index: 0}\nnuma_nodes:\n  - {os_index: 0, package: 0, cpus: \"0-7\", memory_gib: 64}\n\
         distances:\n  - [10]\npci:\n",
    );
    for i in 0..n {
        yaml.push_str(&format!(
            "  - bus: \"{:04x}:00\"\n    numa_node: 0\n    children:\n      - gpu: \"{:04x}:00:01.0\"\n",
            i + 1,
            i + 1
        ));
    }
    yaml.push_str("gpus:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  - {{index: {i}, minor: {i}, uuid: GPU-00000000-0000-0000-0000-{i:012}, name: \"NVIDIA L4\", brand: NVIDIA, \
             architecture: ada, compute_capability: \"8.9\", memory_mib: 23034, bus_id: \"{:04x}:00:01.0\", pci_device_id: 0x27b810de}}\n",
            i + 1
        ));
    }
    yaml
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_claims_in_one_call() {
    let node = NodeDirs::new(&many_gpus_profile(100), "node-a");
    let (api, kubeconfig) = api_for(&node).await;
    for i in 0..100 {
        api.put_claim(claim_json(
            &format!("c{i}"),
            "node-a",
            &[&format!("gpu-{i}")],
            None,
        ));
    }
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(60)).await;
    let claims: Vec<v1::Claim> = (0..100).map(|i| claim_ref(&format!("c{i}"))).collect();
    let resp = dra_client(&node)
        .await
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: claims.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.claims.len(), 100);
    assert!(
        resp.claims
            .values()
            .all(|c| c.error.is_empty() && c.devices.len() == 1)
    );
    assert_eq!(node.cdi_specs().len(), 100);
    let un = dra_client(&node)
        .await
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner();
    assert!(un.claims.values().all(|c| c.error.is_empty()));
    assert!(node.cdi_specs().is_empty());
    assert_eq!(
        api.requests()
            .iter()
            .filter(|r| r.path.contains("/resourceclaims/"))
            .count(),
        100,
        "one GET per claim, no list"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_calls_disjoint_all_succeed_overlapping_exactly_one() {
    let node = NodeDirs::profile("dgx-h100");
    let (api, kubeconfig) = api_for(&node).await;
    for i in 0..8 {
        api.put_claim(claim_json(
            &format!("d{i}"),
            "node-a",
            &[&format!("gpu-{i}")],
            None,
        ));
    }
    for i in 0..4 {
        api.put_claim(claim_json(
            &format!("o{i}"),
            "node-a",
            &["gpu-2", "gpu-3"],
            None,
        ));
    }
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(60)).await;

    // Eight calls at once, each on its own connection, each for a different GPU.
    let disjoint: Vec<_> = (0..8)
        .map(|i| {
            let uid = format!("d{i}");
            let node = &node;
            async move { prepare(node, &[&uid]).await.claims[&uid].clone() }
        })
        .collect();
    let answers = futures::future::join_all(disjoint).await;
    assert!(
        answers
            .iter()
            .all(|a| a.error.is_empty() && a.devices.len() == 1),
        "{answers:?}"
    );
    let uids: Vec<String> = (0..8).map(|i| format!("d{i}")).collect();
    let uids: Vec<&str> = uids.iter().map(String::as_str).collect();
    assert!(
        unprepare(&node, &uids)
            .await
            .claims
            .values()
            .all(|c| c.error.is_empty())
    );

    // Four calls at once for the same two GPUs: exactly one claim gets them.
    let overlapping: Vec<_> = (0..4)
        .map(|i| {
            let uid = format!("o{i}");
            let node = &node;
            async move { prepare(node, &[&uid]).await.claims[&uid].clone() }
        })
        .collect();
    let answers = futures::future::join_all(overlapping).await;
    let won = answers.iter().filter(|a| a.error.is_empty()).count();
    assert_eq!(won, 1, "{answers:?}");
    assert!(
        answers
            .iter()
            .filter(|a| !a.error.is_empty())
            .all(|a| a.error.contains("already prepared")),
        "{answers:?}"
    );
    assert_eq!(node.cdi_specs().len(), 1);
}

/// Claim references of claims the mock API server does not have: each is answered with
/// a per-claim "not found" error after one GET.
fn missing_claims(prefix: &str, n: usize) -> Vec<v1::Claim> {
    (0..n).map(|i| claim_ref(&format!("{prefix}{i}"))).collect()
}

async fn prepare_claims(
    node: &NodeDirs,
    claims: Vec<v1::Claim>,
) -> v1::NodePrepareResourcesResponse {
    dra_client(node)
        .await
        .max_decoding_message_size(64 << 20)
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread")]
async fn claim_gets_are_bounded_per_call_and_overall_and_every_claim_is_answered() {
    let node = NodeDirs::profile("dgx-h100");
    let (api, kubeconfig) = api_for(&node).await;
    for i in 0..8 {
        api.put_claim(claim_json(
            &format!("g{i}"),
            "node-a",
            &[&format!("gpu-{i}")],
            None,
        ));
    }
    // Slow GETs overlap, so the peak shows how many the plugin sends at once.
    api.set_claim_get_delay(Duration::from_millis(20));
    let mut plugin = Plugin::start(
        &node,
        &kubeconfig,
        &[
            ("TOPODRA_MAX_CONCURRENT_CLAIMS_PER_CALL", "8"),
            ("TOPODRA_MAX_CONCURRENT_CLAIMS", "12"),
        ],
    );
    plugin.wait_live(Duration::from_secs(60)).await;

    // One call: 8 claims that prepare and 392 that do not exist.
    let mut claims: Vec<v1::Claim> = (0..8).map(|i| claim_ref(&format!("g{i}"))).collect();
    claims.extend(missing_claims("m", 392));
    let resp = prepare_claims(&node, claims).await;
    assert_eq!(resp.claims.len(), 400, "every claim is answered");
    for i in 0..8 {
        let c = &resp.claims[&format!("g{i}")];
        assert!(c.error.is_empty() && c.devices.len() == 1, "{c:?}");
    }
    assert!(
        resp.claims
            .iter()
            .filter(|(uid, _)| uid.starts_with('m'))
            .all(|(_, c)| c.error.contains("not found")),
    );
    let peak = api.claim_gets_peak();
    eprintln!("one call of 400 claims, per-call bound 8: peak {peak} claim GETs at once");
    assert!(
        (2..=8).contains(&peak),
        "peak {peak} concurrent claim GETs, bound 8"
    );

    // Two calls at once: together they may have 12 in flight, more than one call's 8.
    api.reset_claim_gets_peak();
    let (a, b) = tokio::join!(
        prepare_claims(&node, missing_claims("a", 200)),
        prepare_claims(&node, missing_claims("b", 200)),
    );
    assert_eq!((a.claims.len(), b.claims.len()), (200, 200));
    let peak = api.claim_gets_peak();
    eprintln!("two calls of 200 claims, overall bound 12: peak {peak} claim GETs at once");
    assert!(
        (9..=12).contains(&peak),
        "peak {peak} concurrent claim GETs, bounds 8 per call, 12 overall"
    );
    assert_eq!(
        api.requests()
            .iter()
            .filter(|r| r.path.contains("/resourceclaims/"))
            .count(),
        800,
        "one GET per claim"
    );
}

/// The plugin's peak resident memory in kB.
fn vm_hwm_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_claims_in_one_call_with_the_default_bounds() {
    let node = NodeDirs::profile("dgx-h100");
    let (api, kubeconfig) = api_for(&node).await;
    api.set_claim_get_delay(Duration::from_millis(1));
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(60)).await;
    let before = vm_hwm_kb(plugin.child.id());
    let started = std::time::Instant::now();
    let resp = prepare_claims(&node, missing_claims("m", 10_000)).await;
    let elapsed = started.elapsed();
    assert_eq!(resp.claims.len(), 10_000, "every claim is answered");
    assert!(resp.claims.values().all(|c| c.error.contains("not found")));
    let peak = api.claim_gets_peak();
    let after = vm_hwm_kb(plugin.child.id());
    eprintln!(
        "10,000 claims: {elapsed:?}, peak {peak} claim GETs at once, plugin peak RSS {before} kB before, {after} kB after"
    );
    assert!(
        peak <= 16,
        "peak {peak} concurrent claim GETs, default bound 16 per call"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_claim_references_and_configs_stay_out_of_api_paths_and_log_lines() {
    let node = NodeDirs::profile("dgx-h100");
    let (api, kubeconfig) = api_for(&node).await;
    api.put_claim(claim_json("good", "node-a", &["gpu-0"], None));
    api.put_claim(claim_json(
        "bad-config",
        "node-a",
        &["gpu-1"],
        Some(
            serde_json::json!({"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig",
            "numa\n2099-01-01T00:00:00Z  INFO \u{1b}[31mFAKE-LINE": true}),
        ),
    ));
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(60)).await;
    let hostile = [
        ("..", "claim"),
        ("team-a", "../../../../api/v1/nodes/node-a"),
        ("team-a", ".."),
        ("team-a", "claim?watch=true"),
        ("team-a", "claim#fragment"),
        ("team-a", "a/b"),
        ("team-a", "claim%2F.."),
        (
            "team-a",
            "x\n2099-01-01T00:00:00Z  INFO \u{1b}[31mFAKE-NAME",
        ),
    ];
    let mut claims: Vec<v1::Claim> = hostile
        .iter()
        .enumerate()
        .map(|(i, (ns, name))| v1::Claim {
            namespace: (*ns).into(),
            uid: format!("h{i}"),
            name: (*name).into(),
        })
        .collect();
    claims.push(claim_ref("good"));
    claims.push(claim_ref("bad-config"));
    let before = api.requests().len();
    let resp = prepare_claims(&node, claims).await;
    for (i, (ns, name)) in hostile.iter().enumerate() {
        let c = &resp.claims[&format!("h{i}")];
        assert!(
            c.error.contains("invalid claim reference"),
            "{ns:?}/{name:?}: {c:?}"
        );
    }
    assert_eq!(resp.claims["good"].error, "");
    assert!(resp.claims["bad-config"].error.contains("FAKE-LINE"));
    let sent: Vec<_> = api.requests()[before..].to_vec();
    // Claim reads only for the two valid claims. The plugin's own start-up reads (the
    // Node's uid for its Events, the squatter check's slice GET) may fall in this
    // window too; they name no claim.
    assert!(
        sent.iter().all(|r| r.method != "GET"
            || !r.path.contains("/resourceclaims")
            || r.path == "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/claim-good"
            || r.path
                == "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/claim-bad-config"),
        "only the valid claims were read: {sent:?}"
    );

    // In the text log every hostile value stays on its event's line, escaped.
    let logs = plugin.logs();
    assert!(
        !logs.contains('\u{1b}'),
        "a raw ESC reached the log:\n{logs}"
    );
    for marker in ["FAKE-LINE", "FAKE-NAME"] {
        let lines: Vec<&str> = logs.lines().filter(|l| l.contains(marker)).collect();
        assert!(!lines.is_empty(), "{marker} not logged:\n{logs}");
        for line in lines {
            assert!(
                line.contains("prepare failed")
                    && line.contains(r"\n2099-01-01T00:00:00Z  INFO \u{1b}[31m"),
                "{marker} escaped onto its own event line: {line:?}\n{logs}"
            );
        }
    }
}

/// Opens a connection and sends half a request line, as a slowloris client does.
async fn half_request(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metr").await.unwrap();
    s
}

/// How long until the server closes `s` (reads to EOF or a reset), up to `limit`.
async fn closed_within(s: &mut tokio::net::TcpStream, limit: Duration) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let started = std::time::Instant::now();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_http_endpoint_cuts_off_slow_clients_and_caps_connections() {
    let node = NodeDirs::profile("l40s-pcie");
    let (_api, kubeconfig) = api_for(&node).await;
    let mut plugin = Plugin::start(
        &node,
        &kubeconfig,
        &[
            ("TOPODRA_HTTP_HEADER_READ_TIMEOUT_SECONDS", "1"),
            ("TOPODRA_HTTP_MAX_CONNECTIONS", "8"),
        ],
    );
    plugin.wait_live(Duration::from_secs(60)).await;
    let addr = plugin.http;

    // Six slow clients hold six of the eight slots; the endpoint still answers.
    let mut slow = Vec::new();
    for _ in 0..6 {
        slow.push(half_request(addr).await);
    }
    let started = std::time::Instant::now();
    assert_eq!(http_get(addr, "/healthz").await.map(|(s, _)| s), Some(200));
    assert_eq!(http_get(addr, "/metrics").await.map(|(s, _)| s), Some(200));
    // The probes' connections are gone once their slots are free again.
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Twelve more: two take the last slots, ten are closed as soon as accepted.
    let mut more = Vec::new();
    for _ in 0..12 {
        more.push(half_request(addr).await);
    }
    let mut rejected = 0;
    for s in &mut more {
        if closed_within(s, Duration::from_millis(300)).await.is_some() {
            rejected += 1;
        }
    }
    eprintln!("18 slow connections against a cap of 8: {rejected} closed at once");
    assert_eq!(rejected, 10, "connections over the cap are closed at once");

    // The eight that got a slot are cut off by the header read timeout (1 s).
    slow.extend(more);
    let mut cut = 0;
    for s in &mut slow {
        if closed_within(s, Duration::from_secs(3)).await.is_some() {
            cut += 1;
        }
    }
    let elapsed = started.elapsed();
    eprintln!("all slow connections closed {elapsed:?} after the first ones opened ({cut} of 18)");
    assert_eq!(cut, 18, "every slow connection is closed");
    assert!(
        elapsed >= Duration::from_millis(900),
        "cut off before the timeout: {elapsed:?}"
    );

    assert_eq!(http_get(addr, "/healthz").await.map(|(s, _)| s), Some(200));
    let (status, metrics) = http_get(addr, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(
        metrics.contains("topodra_http_connections_rejected_total 10"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http_address_it_cannot_bind_fails_the_start() {
    let node = NodeDirs::profile("l40s-pcie");
    let (_api, kubeconfig) = api_for(&node).await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let mut plugin = Plugin::start_on(&node, &kubeconfig, &[], addr);
    let status = plugin.wait_exit(Duration::from_secs(60));
    assert!(!status.success());
    assert!(
        plugin
            .logs()
            .contains(&format!("binding the HTTP endpoint to {addr}")),
        "{}",
        plugin.logs()
    );
    assert!(
        !node.registration_socket().exists(),
        "registered with the kubelet although it could not serve its probes"
    );
}

/// An API server that answers 503 to everything: the plugin retries on its own
/// jittered backoff, every request it sends shows in its request metric (kube's
/// hidden retry layer is off), and a prepare gives up with an error well inside the
/// kubelet's 45 s.
#[tokio::test(flavor = "multi_thread")]
async fn a_failing_api_server_sees_only_counted_and_paced_requests() {
    let node = NodeDirs::profile("l40s-pcie");
    let (api, kubeconfig) = api_for(&node).await;
    api.put_claim(claim_json("u1", "node-a", &["gpu-0"], None));
    api.set_failing(true);
    let mut plugin = Plugin::start(
        &node,
        &kubeconfig,
        &[
            ("TOPODRA_CLAIM_READ_TIMEOUT_SECONDS", "1"),
            ("TOPODRA_CLAIM_READ_DEADLINE_SECONDS", "3"),
        ],
    );
    plugin.wait_live(Duration::from_secs(60)).await;

    let started = std::time::Instant::now();
    let resp = prepare(&node, &["u1"]).await;
    let took = started.elapsed();
    let err = &resp.claims["u1"].error;
    assert!(err.contains("gave up after"), "{err}");
    assert!(took < Duration::from_secs(5), "answered after {took:?}");

    tokio::time::sleep(Duration::from_secs(2)).await;
    let count = |method: &str, prefix: &str| {
        api.requests()
            .iter()
            .filter(|r| r.method == method && r.path.starts_with(prefix))
            .count() as u64
    };
    let claim_gets = count(
        "GET",
        "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/",
    );
    let node_gets = count("GET", "/api/v1/nodes/");
    // Backoff from 200 ms doubling to 2 s within a 3 s deadline: a handful, not 15.
    assert!((2..=5).contains(&claim_gets), "{claim_gets} claim GETs");
    let (_, metrics) = http_get(plugin.http, "/metrics").await.unwrap();
    // GETs of `resource` answered with `code` (any code: None), summed over the
    // `code` label.
    let metric = |resource: &str, code: Option<&str>| -> u64 {
        let key =
            format!("topodra_api_requests_total{{verb=\"get\",resource=\"{resource}\",code=\"");
        metrics
            .lines()
            .filter_map(|l| l.strip_prefix(&key))
            .filter_map(|rest| rest.split_once("\"} "))
            .filter(|(c, _)| code.is_none_or(|want| *c == want))
            .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
            .sum()
    };
    // The metric is read after the mock's log, and a request counts when its answer
    // arrives: one the mock has just logged may be missing, one sent since may be
    // there.
    let claims_counted = metric("resourceclaims", None);
    assert!(
        (claim_gets.saturating_sub(1)..=claim_gets + 1).contains(&claims_counted),
        "{claim_gets} vs {metrics}"
    );
    let nodes_counted = metric("nodes", None);
    assert!(
        (node_gets.saturating_sub(1)..=node_gets + 1).contains(&nodes_counted),
        "{node_gets} vs {metrics}"
    );
    // Every answer was the 503 the failing API server gives.
    assert!(metric("resourceclaims", Some("503")) >= 1, "{metrics}");
    // The publisher's own backoff paces its Node GETs over these ~5 s.
    assert!(node_gets <= 6, "{node_gets} Node GETs");
}

/// A claim the API server no longer has (deleted while the kubelet could not
/// unprepare it) is unprepared by the plugin after the grace period, with an Event,
/// and its GPU is free again; a claim that still exists is left alone.
#[tokio::test(flavor = "multi_thread")]
async fn claims_gone_from_the_api_server_are_unprepared_after_a_grace_period() {
    let node = NodeDirs::profile("l40s-pcie");
    let (api, kubeconfig) = api_for(&node).await;
    api.put_claim(claim_json("u-gone", "node-a", &["gpu-0"], None));
    api.put_claim(claim_json("u-kept", "node-a", &["gpu-1"], None));
    let mut plugin = Plugin::start(
        &node,
        &kubeconfig,
        &[
            ("TOPODRA_STALE_CLAIM_CHECK_INTERVAL_SECONDS", "1"),
            ("TOPODRA_STALE_CLAIM_GRACE_SECONDS", "2"),
        ],
    );
    plugin.wait_live(Duration::from_secs(60)).await;
    let resp = prepare(&node, &["u-gone", "u-kept"]).await;
    assert!(resp.claims.values().all(|c| c.error.is_empty()), "{resp:?}");
    api.delete_claim("team-a", "claim-u-gone");

    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while node.cdi_specs().len() != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "stale claim not unprepared:\n{}",
            plugin.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(node.cdi_specs(), ["k8s.gpu.topodra.dev-claim_u-kept.json"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let events = api.events_posted();
        if events.iter().any(|e| e["reason"] == "StaleClaimUnprepared") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no event: {events:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // gpu-0 is free for a new claim.
    api.put_claim(claim_json("u-new", "node-a", &["gpu-0"], None));
    assert_eq!(prepare(&node, &["u-new"]).await.claims["u-new"].error, "");
    // Lookups are GETs of single claims, never lists.
    assert!(
        api.requests()
            .iter()
            .filter(|r| r.path.contains("resourceclaims"))
            .all(|r| r.method == "GET" && !r.path.ends_with("resourceclaims")),
        "{:?}",
        api.requests()
    );
}

/// A slice of another node under this node's old slice name (`<node>-<driver>-0`):
/// reported in an Event, never written to, and this node publishes its own.
#[tokio::test(flavor = "multi_thread")]
async fn a_slice_squatting_the_old_name_is_reported_and_ignored() {
    let node = NodeDirs::profile("dgx-h100");
    let (api, kubeconfig) = api_for(&node).await;
    let squatted = format!("{}-{DRIVER}-0", node.name);
    api.seed(&[serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": squatted},
        "spec": {
            "driver": DRIVER,
            "nodeName": "evil-node",
            "pool": {"name": "evil-node", "generation": 1, "resourceSliceCount": 1},
        },
    })]);
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(60)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ours = api
            .slices()
            .iter()
            .filter(|s| s["spec"]["nodeName"] == node.name.as_str())
            .count();
        let reported = api
            .events_posted()
            .iter()
            .any(|e| e["reason"] == "ResourceSliceNameSquatted");
        if ours == 1 && reported {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "ours {ours}, reported {reported}:\n{}",
            plugin.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let writes: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with(&squatted) && r.method != http::Method::GET)
        .collect();
    assert!(writes.is_empty(), "{writes:?}");
    assert_eq!(api.stored()[&squatted]["spec"]["nodeName"], "evil-node");
}

/// The versioned libcuda of the simulated node's driver root, as (host, container)
/// paths.
fn sim_libcuda(node: &NodeDirs) -> (String, String) {
    let root = &node.sim.driver_root;
    for dir in [
        "usr/lib/x86_64-linux-gnu",
        "usr/lib64",
        "usr/lib/aarch64-linux-gnu",
    ] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("libcuda.so.") && name.matches('.').count() >= 4 {
                let container = format!("/{dir}/{name}");
                return (e.path().display().to_string(), container);
            }
        }
    }
    panic!("no versioned libcuda under {}", root.display());
}

/// Issue 42, case 4, with the real plugin: the adopted toolkit spec is taken only as
/// far as driver files go (a mount of /etc/shadow and LD_PRELOAD stay out of claims'
/// specs), and when the file becomes a FIFO or a link to /dev/zero, a prepare that
/// reloads it is refused at once naming what it is (it once blocked every prepare and
/// SIGTERM, or grew the plugin by gigabytes), and SIGTERM still stops the plugin.
#[tokio::test(flavor = "multi_thread")]
async fn a_toolkit_spec_is_bounded_in_what_it_adds_and_in_how_it_is_read() {
    let node = NodeDirs::profile("l40s-pcie");
    let (api, kubeconfig) = api_for(&node).await;
    let (host, container) = sim_libcuda(&node);
    let spec = node.path("toolkit/nvidia.yaml");
    std::fs::create_dir_all(spec.parent().unwrap()).unwrap();
    std::fs::write(
        &spec,
        format!(
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ncontainerEdits:\n  env:\n  - LD_PRELOAD=/tmp/evil.so\n  mounts:\n  - hostPath: {host}\n    containerPath: {container}\n    options: [ro, nosuid, nodev, bind]\n  - hostPath: /etc/shadow\n    containerPath: /etc/shadow\n    options: [ro, bind]\n"
        ),
    )
    .unwrap();
    let spec_env = spec.display().to_string();
    let mut plugin = Plugin::start(
        &node,
        &kubeconfig,
        &[("TOPODRA_TOOLKIT_CDI_SPEC", spec_env.as_str())],
    );
    plugin.wait_live(Duration::from_secs(60)).await;
    api.put_claim(claim_json("u1", "node-a", &["gpu-0"], None));
    let resp = prepare(&node, &["u1"]).await;
    assert_eq!(resp.claims["u1"].error, "", "{}", plugin.logs());
    let written =
        std::fs::read_to_string(node.cdi_dir().join("k8s.gpu.topodra.dev-claim_u1.json")).unwrap();
    assert!(written.contains(&container), "{written}");
    assert!(
        !written.contains("/etc/shadow") && !written.contains("LD_PRELOAD"),
        "{written}"
    );
    assert!(plugin.logs().contains("not adopted"), "{}", plugin.logs());

    for (uid, gpu, make, what) in [
        ("u2", "gpu-1", "fifo", "it is a FIFO"),
        ("u3", "gpu-2", "zero", "it is a device"),
    ] {
        std::fs::remove_file(&spec).unwrap();
        match make {
            "fifo" => assert!(
                Command::new("mkfifo")
                    .arg(&spec)
                    .status()
                    .unwrap()
                    .success()
            ),
            _ => std::os::unix::fs::symlink("/dev/zero", &spec).unwrap(),
        }
        api.put_claim(claim_json(uid, "node-a", &[gpu], None));
        // Generous: without the bound the FIFO blocks the prepare for good.
        let resp = tokio::time::timeout(Duration::from_secs(30), prepare(&node, &[uid]))
            .await
            .unwrap_or_else(|_| panic!("{make}: no answer\n{}", plugin.logs()));
        assert!(
            resp.claims[uid].error.contains(what),
            "{make}: {:?}",
            resp.claims[uid]
        );
    }
    let status = plugin.terminate();
    assert!(status.success(), "{status}\n{}", plugin.logs());
}
