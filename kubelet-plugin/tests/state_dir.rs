//! A state directory the plugin cannot use: its lock file a directory, the file
//! system read-only, the disk full. The plugin neither exits (its container would
//! restart into the same error, forever) nor prepares anything: it serves
//! read-only, with an Event and a metric, unprepares the claims it knows, and
//! serves from the state again once the directory is usable.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::*;
use topodra_mock_apiserver::MockApiServer;

async fn wait_until(what: &str, timeout: Duration, plugin: &Plugin, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "{what}:\n{}", plugin.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Setup {
    node: NodeDirs,
    api: MockApiServer,
    kubeconfig: PathBuf,
    state: PathBuf,
}

async fn setup() -> Setup {
    let node = NodeDirs::profile("dgx-h100");
    let api = MockApiServer::start().await.unwrap();
    api.add_node(&node.name, "node-uid-1");
    for (uid, gpu) in [("u-known", "gpu-0"), ("u-new", "gpu-1")] {
        api.put_claim(claim_json(uid, "node-a", &[gpu], None));
    }
    let kubeconfig = api.kubeconfig(node.root.path()).unwrap();
    let state = node.path("state");
    Setup {
        node,
        api,
        kubeconfig,
        state,
    }
}

impl Setup {
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("TOPODRA_STATE_DIR", self.state.display().to_string()),
            ("TOPODRA_STATE_RETRY_SECONDS", "1".into()),
        ]
    }

    fn start(&self) -> Plugin {
        let env = self.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Plugin::start(&self.node, &self.kubeconfig, &env)
    }

    fn start_mounted(&self, setup: &str) -> Plugin {
        let env = self.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Plugin::start_in_mount_namespace(&self.node, &self.kubeconfig, &env, setup)
    }

    /// A claim prepared by a plugin that could use the directory, so that the
    /// read-only one has a claim it knows.
    async fn prepare_known_claim(&self) {
        let mut plugin = self.start();
        plugin.wait_live(Duration::from_secs(60)).await;
        assert_eq!(
            prepare(&self.node, &["u-known"]).await.claims["u-known"].error,
            ""
        );
        assert!(plugin.terminate().success());
        assert_eq!(
            self.node.cdi_specs(),
            ["k8s.gpu.topodra.dev-claim_u-known.json"]
        );
    }

    /// What a read-only plugin shows: live, not ready, the metric, the Event, no
    /// prepare, and the known claim unprepared.
    async fn assert_read_only(&self, plugin: &mut Plugin, cause: &str) {
        plugin.wait_live(Duration::from_secs(60)).await;
        let (status, body) = http_get(plugin.http, "/readyz").await.unwrap();
        assert_eq!(status, 503);
        assert!(body.contains("serving read-only"), "{body}");
        assert!(body.contains(cause), "{body}");
        let (_, metrics) = http_get(plugin.http, "/metrics").await.unwrap();
        assert!(metrics.contains("topodra_state_read_only 1"), "{metrics}");
        wait_until(
            "an Event on the Node",
            Duration::from_secs(10),
            plugin,
            || {
                self.api
                    .events_posted()
                    .iter()
                    .any(|e| e["reason"] == "StateDirUnusable")
            },
        )
        .await;

        let refused = prepare(&self.node, &["u-new"]).await;
        let error = &refused.claims["u-new"].error;
        assert!(error.contains("state directory is unusable"), "{error}");
        assert!(error.contains(cause), "{error}");
        let un = unprepare(&self.node, &["u-known"]).await;
        assert_eq!(un.claims["u-known"].error, "");
        assert!(self.node.cdi_specs().is_empty());
        assert!(
            plugin.child.try_wait().unwrap().is_none(),
            "the plugin exited"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lock_file_that_is_a_directory_serves_read_only_until_it_is_fixed() {
    let s = setup().await;
    s.prepare_known_claim().await;
    std::fs::remove_file(s.state.join("owner.lock")).unwrap();
    std::fs::create_dir(s.state.join("owner.lock")).unwrap();
    let mut plugin = s.start();
    s.assert_read_only(&mut plugin, "owner.lock").await;

    // Fixed by the operator: within the retry interval it serves from the state.
    // The claim it unprepared read-only is still recorded there (nothing was
    // written), and unpreparing it again finishes the job.
    std::fs::remove_dir(s.state.join("owner.lock")).unwrap();
    wait_until(
        "serving from the state again",
        Duration::from_secs(30),
        &plugin,
        || {
            plugin
                .logs()
                .contains("the node state directory is usable again")
        },
    )
    .await;
    plugin.wait_live(Duration::from_secs(30)).await;
    // Ready needs the kubelet's word on the registration, which no kubelet gives
    // here; what matters is that read-only is no longer the reason.
    let (_, ready) = http_get(plugin.http, "/readyz").await.unwrap();
    assert!(!ready.contains("read-only"), "{ready}");
    let (_, metrics) = http_get(plugin.http, "/metrics").await.unwrap();
    assert!(metrics.contains("topodra_state_read_only 0"), "{metrics}");
    let held = prepare(&s.node, &["u-new"]).await;
    assert_eq!(held.claims["u-new"].error, "");
    assert!(
        unprepare(&s.node, &["u-known"]).await.claims["u-known"]
            .error
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_state_dir_serves_read_only() {
    if !can_unshare_mounts() {
        eprintln!("skipped: cannot make a mount namespace here (needs root or CAP_SYS_ADMIN)");
        return;
    }
    let s = setup().await;
    s.prepare_known_claim().await;
    let dir = s.state.display().to_string();
    let mut plugin = s.start_mounted(&format!(
        "mount --bind '{dir}' '{dir}'\nmount -o remount,bind,ro '{dir}'"
    ));
    s.assert_read_only(&mut plugin, "Read-only file system")
        .await;
    // Nothing was written: the checkpoint still records the claim.
    let checkpoint = std::fs::read_to_string(s.state.join("checkpoint.json")).unwrap();
    assert!(checkpoint.contains("u-known"), "{checkpoint}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_with_no_lock_file_yet_serves_read_only() {
    if !can_unshare_mounts() {
        eprintln!("skipped: cannot make a mount namespace here (needs root or CAP_SYS_ADMIN)");
        return;
    }
    let s = setup().await;
    std::fs::create_dir_all(&s.state).unwrap();
    let dir = s.state.display().to_string();
    // A file system with no inode left: not even an empty lock file can be made.
    let mut plugin = s.start_mounted(&format!(
        "mount -t tmpfs -o size=16k,nr_inodes=2 tmpfs '{dir}'\n: > '{dir}/filler'"
    ));
    plugin.wait_live(Duration::from_secs(60)).await;
    let (status, body) = http_get(plugin.http, "/readyz").await.unwrap();
    assert_eq!(status, 503);
    assert!(body.contains("No space left on device"), "{body}");
    let refused = prepare(&s.node, &["u-new"]).await;
    assert!(
        refused.claims["u-new"]
            .error
            .contains("state directory is unusable"),
        "{:?}",
        refused.claims["u-new"]
    );
    assert!(s.node.cdi_specs().is_empty());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        plugin.child.try_wait().unwrap().is_none(),
        "the plugin exited:\n{}",
        plugin.logs()
    );
}
