//! The real plugin binary on a simulated node: registration, prepare and unprepare
//! over its Unix sockets, claims read from a (mock) API server, restarts and crashes.

#![allow(clippy::unwrap_used)]

mod support;

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

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_at_each_prepare_step_then_a_restart_leaks_nothing() {
    for point in [
        "after-started-record",
        "after-cdi-write",
        "after-completed-record",
    ] {
        let node = NodeDirs::profile("dgx-h100");
        let (api, kubeconfig) = api_for(&node).await;
        api.put_claim(claim_json("u1", "node-a", &["gpu-0", "gpu-1"], None));
        let mut crashing = Plugin::start(&node, &kubeconfig, &[("TOPODRA_TEST_CRASH_AT", point)]);
        crashing.wait_live(Duration::from_secs(60)).await;
        let result = dra_client(&node)
            .await
            .node_prepare_resources(v1::NodePrepareResourcesRequest {
                claims: vec![claim_ref("u1")],
            })
            .await;
        assert!(result.is_err(), "{point}: the process aborted mid-call");
        assert!(!crashing.wait_exit(Duration::from_secs(10)).success());
        drop(crashing);

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
