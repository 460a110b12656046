//! The nvidia-cdi-hook the CDI specs name, through the real plugin binary: installed
//! at start into the plugin's directory under the kubelet's plugins directory (or a
//! hook on the host named as it is), and a hook that cannot be used stops the start
//! with an error that names it and the fix.
//!
//! The plugin is given NVIDIA's hook when `TOPODRA_NVIDIA_CDI_HOOK` names one (`make
//! test-unit` builds it), else a stand-in script that only answers `--version`
//! (tests/fake-nvml/src/cdi_hook.rs). The test of the real hook itself skips without
//! it, and fails under `TOPODRA_REQUIRE_TOOLS=1`.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::cdi::tools_required;
use support::*;
use topodra_fake_nvml::cdi_hook::{self, HookKind};
use topodra_mock_apiserver::MockApiServer;

async fn api_for(node: &NodeDirs) -> (MockApiServer, PathBuf) {
    let api = MockApiServer::start().await.unwrap();
    api.add_node(&node.name, "node-uid-1");
    let kubeconfig = api.kubeconfig(node.root.path()).unwrap();
    (api, kubeconfig)
}

/// The `path` of every hook in the claim's spec (top-level and per-device edits).
fn hook_paths(spec: &Path) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(spec).unwrap()).unwrap();
    let mut edits = vec![&v["containerEdits"]];
    edits.extend(
        v["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| &d["containerEdits"]),
    );
    edits
        .iter()
        .filter_map(|e| e["hooks"].as_array())
        .flatten()
        .map(|h| h["path"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn installs_the_hook_into_its_directory_and_names_it_in_specs() {
    let node = NodeDirs::profile("dgx-h100");
    let (api, kubeconfig) = api_for(&node).await;
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(60)).await;

    let installed = node.installed_hook();
    let meta = std::fs::metadata(&installed).unwrap();
    assert!(meta.is_file());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o755);
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(node.hook_source()).unwrap()
    );
    let logs = plugin.logs();
    assert!(logs.contains("nvidia-cdi-hook ready"), "{logs}");
    assert!(
        logs.contains(&format!("path={}", installed.display())),
        "{logs}"
    );
    assert!(logs.contains("action=Installed"), "{logs}");

    // Every hook of a prepared claim's spec runs the installed copy. (Which hooks a
    // spec has is the CDI code's business; this holds for any number of them.)
    api.put_claim(claim_json("u1", "node-a", &["gpu-0"], None));
    let resp = prepare(&node, &["u1"]).await;
    assert_eq!(resp.claims["u1"].error, "");
    let spec = node.cdi_dir().join("k8s.gpu.topodra.dev-claim_u1.json");
    for path in hook_paths(&spec) {
        assert_eq!(path, installed.display().to_string(), "{spec:?}");
    }

    // A restart with the same hook leaves the copy as it is (same inode).
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    plugin.terminate();
    let mut again = Plugin::start(&node, &kubeconfig, &[]);
    again.wait_live(Duration::from_secs(60)).await;
    assert!(
        again.logs().contains("action=Unchanged"),
        "{}",
        again.logs()
    );
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&installed).unwrap()),
        inode
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hook_on_the_host_is_named_and_nothing_is_installed() {
    let mut node = NodeDirs::profile("dgx-h100");
    let host_hook = node.sim.cdi_hook_source.take().unwrap();
    let (api, kubeconfig) = api_for(&node).await;
    let host = host_hook.display().to_string();
    let mut plugin = Plugin::start(
        &node,
        &kubeconfig,
        &[("TOPODRA_CDI_HOOK_HOST_PATH", host.as_str())],
    );
    plugin.wait_live(Duration::from_secs(60)).await;
    assert!(!node.installed_hook().exists());
    let logs = plugin.logs();
    assert!(logs.contains(&format!("path={host}")), "{logs}");
    assert!(logs.contains("action=HostHook"), "{logs}");

    api.put_claim(claim_json("u1", "node-a", &["gpu-1"], None));
    assert_eq!(prepare(&node, &["u1"]).await.claims["u1"].error, "");
    for path in hook_paths(&node.cdi_dir().join("k8s.gpu.topodra.dev-claim_u1.json")) {
        assert_eq!(path, host);
    }
}

/// Starts the plugin and expects it to exit at start with an error naming `want`.
async fn start_fails(node: &NodeDirs, env: &[(&str, &str)], want: &[&str]) {
    let (_api, kubeconfig) = api_for(node).await;
    let mut plugin = Plugin::start(node, &kubeconfig, env);
    let status = plugin.wait_exit(Duration::from_secs(60));
    assert!(!status.success());
    let logs = plugin.logs();
    for w in want {
        assert!(logs.contains(w), "want {w:?} in:\n{logs}");
    }
    // No socket: the kubelet never learned of an instance that cannot name a hook.
    assert!(!node.registration_socket().exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_or_unusable_hook_stops_the_start_with_the_fix() {
    // Missing: the default outside the image, when nobody passed a source.
    let mut node = NodeDirs::profile("dgx-h100");
    let missing = node.path("no/such/nvidia-cdi-hook");
    node.sim.cdi_hook_source = Some(missing.clone());
    start_fails(
        &node,
        &[],
        &[
            &missing.display().to_string(),
            "does not exist",
            "--cdi-hook-source",
        ],
    )
    .await;
    assert!(!node.installed_hook().exists());

    // Present but not executable.
    let plain = node.path("plain-hook");
    std::fs::write(&plain, "#!/bin/sh\necho hook\n").unwrap();
    node.sim.cdi_hook_source = Some(plain.clone());
    start_fails(&node, &[], &["not executable (mode 0644)"]).await;

    // Runs, but fails: as a hook for another C library does.
    let broken = node.path("broken-hook");
    std::fs::write(
        &broken,
        "#!/bin/sh\necho \"$0: version 'GLIBC_2.99' not found\" >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
    node.sim.cdi_hook_source = Some(broken);
    start_fails(&node, &[], &["exit status 1", "GLIBC_2.99"]).await;

    // A host path that is not there: the host toolkit is named as the fix.
    node.sim.cdi_hook_source = None;
    let host = node.path("usr/bin/nvidia-cdi-hook").display().to_string();
    start_fails(
        &node,
        &[("TOPODRA_CDI_HOOK_HOST_PATH", host.as_str())],
        &[&host, "NVIDIA Container Toolkit"],
    )
    .await;
}

/// NVIDIA's hook as built by tests/tools/build.sh: reports the pinned toolkit version
/// (the -X stamp of the toolkit's Makefile) and has every hook the specs use.
#[test]
fn the_real_hook_is_the_pinned_toolkit_release_with_the_hooks_specs_use() {
    let Some(hook) = cdi_hook::real_hook() else {
        let why = format!(
            "{} is not set (make test-unit builds the hook: tests/tools/build.sh nvidia-ctk)",
            cdi_hook::REAL_HOOK_ENV
        );
        assert!(!tools_required(), "TOPODRA_REQUIRE_TOOLS=1: {why}");
        eprintln!("SKIPPED: {why}");
        return;
    };
    let pinned = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tools/nvidia-ctk/go.mod"),
    )
    .unwrap()
    .lines()
    .find_map(|l| {
        l.trim()
            .strip_prefix("require github.com/NVIDIA/nvidia-container-toolkit v")
            .map(str::to_owned)
    })
    .unwrap();
    let out = Command::new(&hook).arg("--version").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(
        version.contains(&format!("version {pinned}")),
        "{} --version: {version}",
        hook.display()
    );
    let help = Command::new(&hook).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for sub in [
        "update-ldcache",
        "create-symlinks",
        "enable-cuda-compat",
        "disable-device-node-modification",
        "update-application-profile",
        "apply-cuda-memory-limits",
    ] {
        assert!(
            help.contains(sub),
            "no {sub} in {} --help:\n{help}",
            hook.display()
        );
    }

    // And NodeDirs hands it to the plugin.
    let node = NodeDirs::profile("dgx-h100");
    assert_eq!(node.hook, HookKind::Real);
    assert_eq!(node.hook_source(), hook);
}
