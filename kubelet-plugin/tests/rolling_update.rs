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

// Pod UIDs as the API server makes them: only UUID-shaped names are taken for the
// rolling-update sockets of this driver (and removed when a killed pod left them).
const OLD: &str = "00000000-0000-4000-8000-00000000001d";
const NEW: &str = "00000000-0000-4000-8000-00000000002e";
const KILLED: &str = "00000000-0000-4000-8000-0000000000de";

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
    drop(std::os::unix::net::UnixListener::bind(registration_socket(&node, KILLED)).unwrap());

    let mut old = Plugin::start(&node, &kubeconfig, &[("POD_UID", OLD)]);
    old.wait_live(Duration::from_secs(60)).await;
    let old_dra = dra_socket(&node, OLD);
    assert_eq!(prepare_on(&old_dra, "u-old").await.error, "");
    assert!(
        !registration_socket(&node, KILLED).exists(),
        "the owner removes sockets killed instances left"
    );

    // The new pod starts beside it: it is live (its HTTP endpoint answers) but not
    // ready, and asks the old one to hand over.
    let mut new = Plugin::start(&node, &kubeconfig, &[("POD_UID", NEW)]);
    let new_dra = dra_socket(&node, NEW);
    wait_for(
        "the new pod registers after the handover",
        Duration::from_secs(60),
        || registration_socket(&node, NEW).exists() && new_dra.exists(),
        || format!("old:\n{}\nnew:\n{}", old.logs(), new.logs()),
    )
    .await;
    // The old pod gave up its sockets and idles, alive, until it is deleted.
    assert!(!registration_socket(&node, OLD).exists());
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
    assert!(registration_socket(&node, NEW).exists());
    let logs = old.logs();
    assert!(logs.contains("handing the node state over"), "{logs}");
}

async fn try_prepare_on(
    socket: &Path,
    uid: &str,
) -> Result<v1::NodePrepareResourceResponse, String> {
    let mut dra = v1::dra_plugin_client::DraPluginClient::new(channel(socket).await);
    dra.node_prepare_resources(v1::NodePrepareResourcesRequest {
        claims: vec![claim_ref(uid)],
    })
    .await
    .map(|r| r.into_inner().claims[uid].clone())
    .map_err(|s| s.to_string())
}

/// The split brain of a slow handover: the old pod's prepare of claim A waits on
/// an API server that holds its answer past the handover drain, while the new pod
/// prepares claim B on the same GPU. When A's answer comes, the old pod must write
/// nothing: B's record and spec stay, and the GPU is still B's after a restart.
#[tokio::test(flavor = "multi_thread")]
async fn a_prepare_that_outlives_the_handover_writes_nothing() {
    let node = NodeDirs::profile("dgx-h100");
    // One API server per pod, with the same objects: only the old pod's answers are
    // held back, as a slow API server (or a proxy) would for one client.
    let (api_old, api_new) = (
        MockApiServer::start().await.unwrap(),
        MockApiServer::start().await.unwrap(),
    );
    let old_dir = node.root.path().join("old-kubeconfig");
    let new_dir = node.root.path().join("new-kubeconfig");
    std::fs::create_dir_all(&old_dir).unwrap();
    std::fs::create_dir_all(&new_dir).unwrap();
    for api in [&api_old, &api_new] {
        api.add_node(&node.name, "node-uid-1");
        for (uid, gpu) in [("u-a", "gpu-3"), ("u-b", "gpu-3"), ("u-c", "gpu-3")] {
            api.put_claim(claim_json(uid, "node-a", &[gpu], None));
        }
    }
    let old_kubeconfig = api_old.kubeconfig(&old_dir).unwrap();
    let new_kubeconfig = api_new.kubeconfig(&new_dir).unwrap();

    // One GET may take as long as the API server holds it (30 s): past the 20 s
    // drain, and with room for a slow start of the new pod.
    let mut old = Plugin::start(
        &node,
        &old_kubeconfig,
        &[
            ("POD_UID", OLD),
            ("TOPODRA_CLAIM_READ_TIMEOUT_SECONDS", "38"),
            ("TOPODRA_CLAIM_READ_DEADLINE_SECONDS", "40"),
            // Not answered "still in progress" first: the late prepare must run.
            ("TOPODRA_CALL_DEADLINE_SECONDS", "40"),
        ],
    );
    old.wait_live(Duration::from_secs(60)).await;
    api_old.set_claim_get_delay(Duration::from_secs(30));
    let old_dra = dra_socket(&node, OLD);
    let late = tokio::spawn(async move { try_prepare_on(&old_dra, "u-a").await });
    tokio::time::sleep(Duration::from_millis(500)).await;

    let started = Instant::now();
    let mut new = Plugin::start(&node, &new_kubeconfig, &[("POD_UID", NEW)]);
    new.wait_live(Duration::from_secs(60)).await;
    let new_dra = dra_socket(&node, NEW);
    let b = prepare_on(&new_dra, "u-b").await;
    assert_eq!(b.error, "", "{}", new.logs());
    assert!(
        started.elapsed() < Duration::from_secs(29),
        "B was prepared after A's answer came; the test proves nothing"
    );

    // A's answer comes after the handover: refused, or the connection is gone.
    let a = tokio::time::timeout(Duration::from_secs(60), late)
        .await
        .unwrap()
        .unwrap();
    if let Ok(a) = &a {
        assert!(
            a.error.contains("handed the node state over"),
            "{a:?}\nold:\n{}",
            old.logs()
        );
    }
    assert_eq!(checkpoint_claims(&node), ["u-b"], "old:\n{}", old.logs());
    assert_eq!(node.cdi_specs(), ["k8s.gpu.topodra.dev-claim_u-b.json"]);

    // The new pod's next start keeps B's spec, and gpu-3 stays B's.
    assert!(new.terminate().success());
    let mut again = Plugin::start(&node, &new_kubeconfig, &[("POD_UID", NEW)]);
    again.wait_live(Duration::from_secs(60)).await;
    assert_eq!(node.cdi_specs(), ["k8s.gpu.topodra.dev-claim_u-b.json"]);
    let c = prepare_on(&new_dra, "u-c").await;
    assert!(c.error.contains("u-b"), "{c:?}");
    drop(old);
}

/// A new pod that asks for the state and dies before it takes it leaves the old
/// one serving again within seconds.
#[tokio::test(flavor = "multi_thread")]
async fn a_handover_nobody_takes_comes_back_to_the_old_pod() {
    let node = NodeDirs::profile("dgx-h100");
    let api = MockApiServer::start().await.unwrap();
    api.add_node(&node.name, "node-uid-1");
    api.put_claim(claim_json("u-1", "node-a", &["gpu-0"], None));
    let kubeconfig = api.kubeconfig(node.root.path()).unwrap();
    let mut old = Plugin::start(&node, &kubeconfig, &[("POD_UID", OLD)]);
    old.wait_live(Duration::from_secs(60)).await;

    // What a pod killed right after asking leaves behind.
    let state = node.path("plugins").join(DRIVER);
    std::fs::write(state.join("takeover-request.tmp"), KILLED).unwrap();
    std::fs::rename(
        state.join("takeover-request.tmp"),
        state.join("takeover-request"),
    )
    .unwrap();
    let registration = registration_socket(&node, OLD);
    wait_for(
        "the old pod hands over",
        Duration::from_secs(30),
        || !registration.exists(),
        || old.logs(),
    )
    .await;
    let gone = Instant::now();
    old.wait_live(Duration::from_secs(30)).await;
    assert!(
        gone.elapsed() < Duration::from_secs(15),
        "the node had no owner for {:?}",
        gone.elapsed()
    );
    assert!(old.logs().contains("serving again"), "{}", old.logs());
    assert_eq!(prepare_on(&dra_socket(&node, OLD), "u-1").await.error, "");
    assert!(!state.join("takeover-request").exists());
}

/// A new pod that could take the node's lock but cannot write the state directory
/// (here: its probe file's path is taken by a directory, which fails only this
/// process's write) must not take the state from a live old pod: taking it, failing
/// and dropping it again would make the old pod hand over and take it back every
/// retry. It waits, not ready and saying why, while the old pod keeps serving; once
/// it can write, it takes over as usual.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_pod_that_cannot_write_leaves_the_state_with_the_old_one() {
    let node = NodeDirs::profile("dgx-h100");
    let api = MockApiServer::start().await.unwrap();
    api.add_node(&node.name, "node-uid-1");
    for (uid, gpu) in [("u-old", "gpu-0"), ("u-mid", "gpu-1"), ("u-new", "gpu-2")] {
        api.put_claim(claim_json(uid, "node-a", &[gpu], None));
    }
    let kubeconfig = api.kubeconfig(node.root.path()).unwrap();
    let retry = ("TOPODRA_STATE_RETRY_SECONDS", "1");
    let mut old = Plugin::start(&node, &kubeconfig, &[("POD_UID", OLD), retry]);
    old.wait_live(Duration::from_secs(60)).await;
    let old_dra = dra_socket(&node, OLD);
    assert_eq!(prepare_on(&old_dra, "u-old").await.error, "");

    // `.probe-<pid>` is the file the ownership probe writes (dra_kubeletplugin::
    // ownership::probe_writable); `$$` is the plugin's pid after the exec.
    let state = node.path("plugins").join(DRIVER);
    let probe_setup = format!("mkdir '{}/.probe-'$$", state.display());
    let mut new = Plugin::start_after(&node, &kubeconfig, &[("POD_UID", NEW), retry], &probe_setup);
    new.wait_healthy(Duration::from_secs(60)).await;
    let probe = state.join(format!(".probe-{}", new.child.id()));
    assert!(probe.is_dir());

    // Many retries' worth: the old pod never hands over, and keeps serving.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        !old.logs().contains("handing the node state over"),
        "{}",
        both_logs(&old, &new)
    );
    assert_eq!(
        prepare_on(&old_dra, "u-mid").await.error,
        "",
        "{}",
        both_logs(&old, &new)
    );
    assert!(
        !registration_socket(&node, NEW).exists(),
        "{}",
        both_logs(&old, &new)
    );
    let (status, body) = http_get(new.http, "/readyz").await.unwrap();
    assert_eq!(status, 503);
    assert!(body.contains(".probe-"), "{body}");
    assert_eq!(
        http_get(new.http, "/healthz").await.map(|(s, _)| s),
        Some(200)
    );

    // Fixed: the new pod asks, and takes over once.
    std::fs::remove_dir(&probe).unwrap();
    let new_dra = dra_socket(&node, NEW);
    wait_for(
        "the new pod takes over",
        Duration::from_secs(60),
        || registration_socket(&node, NEW).exists() && new_dra.exists(),
        || both_logs(&old, &new),
    )
    .await;
    new.wait_live(Duration::from_secs(30)).await;
    assert_eq!(prepare_on(&new_dra, "u-new").await.error, "");
    assert_eq!(checkpoint_claims(&node), ["u-mid", "u-new", "u-old"]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        old.logs().matches("handing the node state over").count(),
        1,
        "{}",
        both_logs(&old, &new)
    );
    new.wait_live(Duration::from_secs(5)).await;
}

fn both_logs(old: &Plugin, new: &Plugin) -> String {
    format!("old:\n{}\nnew:\n{}", old.logs(), new.logs())
}
