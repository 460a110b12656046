//! A state directory the plugin cannot use: its lock file a directory, the file
//! system read-only, the disk full. The plugin neither exits (its container would
//! restart into the same error, forever) nor prepares anything: it serves
//! read-only, with an Event and a metric, unprepares the claims it knows, and
//! serves from the state again once the directory is usable.
//!
//! In the chart's layout (no `--state-dir`) that directory is the plugin's own
//! directory under the kubelet's plugins directory, where the plugin also installs
//! `nvidia-cdi-hook` and binds its DRA socket: a read-only or full directory, or
//! something in the way of the hook, must not stop the start either. The plugin
//! then serves what it can (slices, its HTTP endpoint, the DRA socket where it can
//! bind one), says why it is not ready, and tries again.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
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
    /// The read-only gauge is set and a `StateDirUnusable` Event is on the Node.
    async fn assert_read_only_reported(&self, plugin: &Plugin) {
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
    }

    /// prepare, and the known claim unprepared.
    async fn assert_read_only(&self, plugin: &mut Plugin, cause: &str) {
        plugin.wait_live(Duration::from_secs(60)).await;
        let (status, body) = http_get(plugin.http, "/readyz").await.unwrap();
        assert_eq!(status, 503);
        assert!(body.contains("serving read-only"), "{body}");
        assert!(body.contains(cause), "{body}");
        self.assert_read_only_reported(plugin).await;

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

/// The chart's layout: no `--state-dir`, so the lock, the checkpoint, the
/// installed hook and the DRA socket all live in the plugin's directory.
const DEFAULT_LAYOUT: &[(&str, &str)] = &[("TOPODRA_STATE_RETRY_SECONDS", "1")];

impl Setup {
    fn plugin_dir(&self) -> PathBuf {
        self.node.path("plugins").join(DRIVER)
    }

    /// A plugin in the default layout that installed its hook, prepared a claim and
    /// stopped: a node that worked before its directory went bad.
    async fn worked_before(&self) {
        let mut plugin = Plugin::start(&self.node, &self.kubeconfig, DEFAULT_LAYOUT);
        plugin.wait_live(Duration::from_secs(60)).await;
        assert_eq!(
            prepare(&self.node, &["u-known"]).await.claims["u-known"].error,
            ""
        );
        assert!(plugin.terminate().success());
        assert!(self.node.installed_hook().is_file());
    }

    /// What a plugin that cannot serve from its state still does: it stays up, live
    /// and not ready with the reason, with the metric and the Event, and publishes
    /// the node's slices.
    async fn assert_serves_what_it_can(&self, plugin: &mut Plugin, causes: &[&str]) {
        plugin.wait_healthy(Duration::from_secs(60)).await;
        wait_readyz(plugin, "readyz names the cause", |status, body| {
            status == 503
                && body.contains("serving read-only")
                && causes.iter().all(|c| body.contains(c))
        })
        .await;
        self.assert_read_only_reported(plugin).await;
        wait_until(
            "the slices published",
            Duration::from_secs(30),
            plugin,
            || !self.api.slices().is_empty(),
        )
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            plugin.child.try_wait().unwrap().is_none(),
            "the plugin exited:\n{}",
            plugin.logs()
        );
    }

    /// Back to normal: serving from the state, not read-only, and preparing.
    async fn assert_serves_again(&self, plugin: &mut Plugin, dra: &Path) {
        wait_until(
            "serving from the state again",
            Duration::from_secs(60),
            plugin,
            || {
                plugin
                    .logs()
                    .contains("the node state directory is usable again")
            },
        )
        .await;
        plugin.dra = dra.to_owned();
        plugin.wait_live(Duration::from_secs(30)).await;
        let (_, ready) = http_get(plugin.http, "/readyz").await.unwrap();
        assert!(!ready.contains("read-only"), "{ready}");
        let (_, metrics) = http_get(plugin.http, "/metrics").await.unwrap();
        assert!(metrics.contains("topodra_state_read_only 0"), "{metrics}");
        let held = prepare_at(dra, &["u-new"]).await;
        assert_eq!(held.claims["u-new"].error, "");
    }
}

/// Waits until `/readyz` answers what `f` accepts; returns the body.
async fn wait_readyz(plugin: &Plugin, what: &str, f: impl Fn(u16, &str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let last = http_get(plugin.http, "/readyz").await;
        if let Some((status, body)) = &last
            && f(*status, body)
        {
            return body.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{what}: last {last:?}\n{}",
            plugin.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `mount`/`umount` arguments inside the plugin's mount namespace.
fn in_plugin_namespace(plugin: &Plugin, args: &[&str]) {
    let status = Command::new("nsenter")
        .arg(format!("--target={}", plugin.child.id()))
        .arg("--mount")
        .arg("--")
        .args(args)
        .status()
        .unwrap();
    assert!(status.success(), "nsenter {args:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_plugin_directory_serves_read_only_until_it_is_writable() {
    if !can_unshare_mounts() {
        eprintln!("skipped: cannot make a mount namespace here (needs root or CAP_SYS_ADMIN)");
        return;
    }
    let s = setup().await;
    s.worked_before().await;
    s.api.wipe_slices();
    let dir = s.plugin_dir().display().to_string();
    // Read-only for root too: a read-only bind mount, in the plugin's namespace.
    let mut plugin = Plugin::start_in_mount_namespace(
        &s.node,
        &s.kubeconfig,
        DEFAULT_LAYOUT,
        &format!("mount --bind '{dir}' '{dir}'\nmount -o remount,bind,ro '{dir}'"),
    );
    s.assert_serves_what_it_can(&mut plugin, &["Read-only file system"])
        .await;
    // No DRA socket can be bound there: the kubelet cannot reach it, and is not
    // told of it.
    assert!(!s.node.dra_socket().exists());
    assert!(!s.node.registration_socket().exists());
    let readyz = http_get(plugin.http, "/readyz").await.unwrap().1;
    assert!(readyz.contains("serving read-only"), "{readyz}");

    in_plugin_namespace(&plugin, &["umount", &dir]);
    s.assert_serves_again(&mut plugin, &s.node.dra_socket())
        .await;
    // The claim prepared before is still known.
    let un = unprepare(&s.node, &["u-known"]).await;
    assert_eq!(un.claims["u-known"].error, "");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_plugin_directory_that_needs_a_newer_hook_serves_read_only_until_space_is_freed() {
    if !can_unshare_mounts() {
        eprintln!("skipped: cannot make a mount namespace here (needs root or CAP_SYS_ADMIN)");
        return;
    }
    let s = setup().await;
    let dir = s.plugin_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display().to_string();
    // A small file system, with the hook an older image installed, then filled: the
    // new image's hook cannot be written. Room for the new hook (the toolkit's, some
    // megabytes, under `make test`) once the filler is gone.
    let hook_len = std::fs::metadata(s.node.hook_source()).unwrap().len();
    let size = hook_len + (1 << 20);
    let mut plugin = Plugin::start_in_mount_namespace(
        &s.node,
        &s.kubeconfig,
        DEFAULT_LAYOUT,
        &format!(
            "mount -t tmpfs -o size={size} tmpfs '{d}'\n\
             printf '#!/bin/sh\\necho \"NVIDIA CDI Hook version 0.0.1-older\"\\n' > '{d}/nvidia-cdi-hook'\n\
             chmod 0755 '{d}/nvidia-cdi-hook'\n\
             head -c {size} /dev/zero > '{d}/filler' || true"
        ),
    );
    s.assert_serves_what_it_can(&mut plugin, &["No space left on device", "nvidia-cdi-hook"])
        .await;
    // A socket needs no data block: the kubelet reaches it, and is refused.
    let dra = plugin.in_namespace(&s.node.dra_socket());
    plugin.dra = dra.clone();
    plugin.wait_live(Duration::from_secs(30)).await;
    let refused = prepare_at(&dra, &["u-new"]).await;
    let error = &refused.claims["u-new"].error;
    assert!(error.contains("No space left on device"), "{error}");

    std::fs::remove_file(plugin.in_namespace(&dir.join("filler"))).unwrap();
    s.assert_serves_again(&mut plugin, &dra).await;
    // The new image's hook is the one installed now.
    assert_eq!(
        std::fs::read(plugin.in_namespace(&s.node.installed_hook())).unwrap(),
        std::fs::read(s.node.hook_source()).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_directory_at_the_hook_path_serves_read_only_until_it_is_removed() {
    let s = setup().await;
    s.worked_before().await;
    s.api.wipe_slices();
    let hook = s.node.installed_hook();
    std::fs::remove_file(&hook).unwrap();
    std::fs::create_dir_all(hook.join("left-by-someone")).unwrap();

    let mut plugin = Plugin::start(&s.node, &s.kubeconfig, DEFAULT_LAYOUT);
    s.assert_serves_what_it_can(&mut plugin, &["Is a directory", "nvidia-cdi-hook"])
        .await;
    // The directory itself is writable: the DRA socket is there, prepares are
    // refused with the reason (no spec may name a hook that is not there), and the
    // claim prepared before can be unprepared.
    plugin.wait_live(Duration::from_secs(30)).await;
    let refused = prepare(&s.node, &["u-new"]).await;
    let error = &refused.claims["u-new"].error;
    assert!(error.contains("Is a directory"), "{error}");
    assert_eq!(
        unprepare(&s.node, &["u-known"]).await.claims["u-known"].error,
        ""
    );

    std::fs::remove_dir_all(&hook).unwrap();
    s.assert_serves_again(&mut plugin, &s.node.dra_socket())
        .await;
    assert!(hook.is_file());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dra_socket_that_cannot_be_bound_is_tried_again() {
    let s = setup().await;
    // Something that is not a socket where the DRA socket goes: the plugin refuses
    // to remove it, and owns a usable state directory (elsewhere) all the same.
    std::fs::create_dir_all(s.node.dra_socket()).unwrap();
    let mut plugin = s.start();
    plugin.wait_healthy(Duration::from_secs(60)).await;
    let body = wait_readyz(
        &plugin,
        "readyz says the socket cannot be bound",
        |status, body| status == 503 && body.contains("dra.sock"),
    )
    .await;
    assert!(!body.contains("read-only"), "{body}");
    assert!(!s.node.registration_socket().exists());
    wait_until(
        "the slices published",
        Duration::from_secs(30),
        &plugin,
        || !s.api.slices().is_empty(),
    )
    .await;

    std::fs::remove_dir(s.node.dra_socket()).unwrap();
    plugin.wait_live(Duration::from_secs(30)).await;
    let held = prepare(&s.node, &["u-new"]).await;
    assert_eq!(held.claims["u-new"].error, "");
}
