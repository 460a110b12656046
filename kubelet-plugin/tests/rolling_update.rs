//! A rolling update with `maxSurge`: the old and the new plugin pod on one node at
//! once, on the same state directory, CDI directory and kubelet directories. The new
//! instance takes the node's state over from the live old one; claims prepared by
//! either are kept, and each can be unprepared by the new one.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::*;
use topodra_mock_apiserver::MockApiServer;
use topodra_proto::dra::v1;

fn dra_socket(node: &NodeDirs, pod: &str) -> PathBuf {
    node.path("plugins")
        .join(DRIVER)
        .join(format!("dra-{pod}.sock"))
}

fn registration_socket(node: &NodeDirs, pod: &str) -> PathBuf {
    node.path("registry")
        .join(format!("{DRIVER}-{pod}-reg.sock"))
}

async fn prepare_on(socket: &Path, uid: &str) -> v1::NodePrepareResourceResponse {
    let mut dra = v1::dra_plugin_client::DraPluginClient::new(channel(socket).await);
    let resp = dra
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![claim_ref(uid)],
        })
        .await
        .unwrap()
        .into_inner();
    resp.claims[uid].clone()
}

async fn unprepare_on(socket: &Path, uid: &str) -> String {
    let mut dra = v1::dra_plugin_client::DraPluginClient::new(channel(socket).await);
    let resp = dra
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![claim_ref(uid)],
        })
        .await
        .unwrap()
        .into_inner();
    resp.claims[uid].error.clone()
}

async fn wait_for(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> bool,
    logs: impl Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "{what}:\n{}", logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn checkpoint_claims(node: &NodeDirs) -> Vec<String> {
    let text =
        std::fs::read_to_string(node.path("plugins").join(DRIVER).join("checkpoint.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut uids: Vec<String> = v["data"]["claims"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    uids.sort();
    uids
}

#[tokio::test(flavor = "multi_thread")]
async fn the_new_pod_takes_over_from_the_live_old_one() {
    let node = NodeDirs::profile("dgx-h100");
    let api = MockApiServer::start().await.unwrap();
    api.add_node(&node.name, "node-uid-1");
    let kubeconfig = api.kubeconfig(node.root.path()).unwrap();
    for (uid, gpu) in [("u-old", "gpu-0"), ("u-new", "gpu-1"), ("u-late", "gpu-2")] {
        api.put_claim(claim_json(uid, "node-a", &[gpu], None));
    }

    // What a pod killed earlier left: its registration socket, bound and never
    // unlinked. The kubelet would keep trying to register it.
    std::fs::create_dir_all(node.path("registry")).unwrap();
    drop(std::os::unix::net::UnixListener::bind(registration_socket(&node, "killed")).unwrap());

    let mut old = Plugin::start(&node, &kubeconfig, &[("POD_UID", "old")]);
    old.wait_live(Duration::from_secs(60)).await;
    let old_dra = dra_socket(&node, "old");
    assert_eq!(prepare_on(&old_dra, "u-old").await.error, "");
    assert!(
        !registration_socket(&node, "killed").exists(),
        "the owner removes sockets killed instances left"
    );

    // The new pod starts beside it: it is live (its HTTP endpoint answers) but not
    // ready, and asks the old one to hand over.
    let mut new = Plugin::start(&node, &kubeconfig, &[("POD_UID", "new")]);
    let new_dra = dra_socket(&node, "new");
    wait_for(
        "the new pod registers after the handover",
        Duration::from_secs(60),
        || registration_socket(&node, "new").exists() && new_dra.exists(),
        || format!("old:\n{}\nnew:\n{}", old.logs(), new.logs()),
    )
    .await;
    // The old pod gave up its sockets and idles, alive, until it is deleted.
    assert!(!registration_socket(&node, "old").exists());
    assert!(!old_dra.exists());
    assert!(
        old.child.try_wait().unwrap().is_none(),
        "the old pod keeps running"
    );
    assert_eq!(
        http_get(old.http, "/healthz").await.map(|(s, _)| s),
        Some(200),
        "an idle old pod must not fail its liveness probe (a restart would ask for the state back)"
    );
    assert_ne!(
        http_get(old.http, "/readyz").await.map(|(s, _)| s),
        Some(200)
    );
    new.wait_live(Duration::from_secs(30)).await;

    // The new pod knows the old pod's claim: its GPU is taken, and it unprepares it.
    assert_eq!(prepare_on(&new_dra, "u-new").await.error, "");
    api.put_claim(claim_json("u-steal", "node-a", &["gpu-0"], None));
    let refused = prepare_on(&new_dra, "u-steal").await;
    assert!(refused.error.contains("u-old"), "{}", refused.error);
    assert_eq!(unprepare_on(&new_dra, "u-old").await, "");
    assert_eq!(checkpoint_claims(&node), ["u-new"]);
    assert_eq!(node.cdi_specs(), ["k8s.gpu.topodra.dev-claim_u-new.json"]);

    // Deleting the old pod (SIGTERM) changes nothing for the new owner.
    assert!(old.terminate().success());
    assert_eq!(prepare_on(&new_dra, "u-late").await.error, "");
    assert_eq!(checkpoint_claims(&node), ["u-late", "u-new"]);
    assert!(registration_socket(&node, "new").exists());
    let logs = old.logs();
    assert!(logs.contains("handing the node state over"), "{logs}");
}
