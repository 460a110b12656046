//! Runs the real `topodra-kubelet-plugin serve` binary on a simulated node, against
//! the mock API server, and talks to it over its real Unix sockets.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use topodra_fake_nvml::cdi_hook::{self, HookKind};
use topodra_fake_nvml::sim::{self, SimNode};
use topodra_proto::dra::v1;

pub mod cdi;
pub mod oci;

pub const DRIVER: &str = "gpu.topodra.dev";

/// A node directory: the simulated hardware, the kubelet's directories, CDI and state.
pub struct NodeDirs {
    pub root: tempfile::TempDir,
    pub sim: SimNode,
    pub name: String,
    /// Whether the plugin gets NVIDIA's nvidia-cdi-hook (TOPODRA_NVIDIA_CDI_HOOK) or
    /// the stand-in script that only answers `--version`.
    pub hook: HookKind,
}

impl NodeDirs {
    pub fn new(profile_yaml: &str, name: &str) -> Self {
        let root = tempfile::tempdir().unwrap();
        let lib = topodra_fake_nvml::cdylib_path();
        let sim = sim::materialize(&root.path().join("sim"), profile_yaml, &lib).unwrap();
        let (hook_path, hook) = cdi_hook::real_or_stand_in(&root.path().join("hook")).unwrap();
        Self {
            root,
            sim: sim.with_cdi_hook(hook_path),
            name: name.to_owned(),
            hook,
        }
    }

    pub fn profile(name: &str) -> Self {
        let yaml =
            std::fs::read_to_string(topodra_fake_nvml::profiles_dir().join(format!("{name}.yaml")))
                .unwrap();
        Self::new(&yaml, "node-a")
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.path("registry").join(format!("{DRIVER}-reg.sock"))
    }

    pub fn dra_socket(&self) -> PathBuf {
        self.path("plugins").join(DRIVER).join("dra.sock")
    }

    pub fn cdi_dir(&self) -> PathBuf {
        self.path("cdi")
    }

    /// Where the plugin installs the nvidia-cdi-hook: its directory under the
    /// kubelet's plugins directory.
    pub fn installed_hook(&self) -> PathBuf {
        self.path("plugins").join(DRIVER).join("nvidia-cdi-hook")
    }

    /// The hook the plugin was given to install.
    pub fn hook_source(&self) -> &Path {
        self.sim.cdi_hook_source.as_deref().unwrap()
    }

    pub fn cdi_specs(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.cdi_dir())
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }
}

pub fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A running plugin process; killed on drop.
pub struct Plugin {
    pub child: Child,
    /// The HTTP endpoint: as asked until [`Plugin::wait_live`] reads the address the
    /// plugin bound from its log (`127.0.0.1:0` for [`Plugin::start`]).
    pub http: SocketAddr,
    pub log: PathBuf,
    /// The sockets this instance serves the kubelet on (named after `POD_UID`).
    pub registration: PathBuf,
    pub dra: PathBuf,
}

impl Plugin {
    /// Starts the plugin with its HTTP endpoint on a port the kernel picks when it
    /// binds: a port chosen here and released would be free for any concurrent test
    /// to take, and then another plugin would answer this one's probes.
    pub fn start(node: &NodeDirs, kubeconfig: &Path, env: &[(&str, &str)]) -> Self {
        Self::start_on(node, kubeconfig, env, "127.0.0.1:0".parse().unwrap())
    }

    /// Like [`Plugin::start`], with the HTTP endpoint on `http`.
    pub fn start_on(
        node: &NodeDirs,
        kubeconfig: &Path,
        env: &[(&str, &str)],
        http: SocketAddr,
    ) -> Self {
        let cmd = Command::new(env!("CARGO_BIN_EXE_topodra-kubelet-plugin"));
        Self::spawn(cmd, node, kubeconfig, env, http)
    }

    /// Like [`Plugin::start`], in a mount namespace of its own where the shell
    /// commands `setup` ran first (to mount a read-only or full file system over a
    /// directory, say). [`can_unshare_mounts`] says whether this works here.
    pub fn start_in_mount_namespace(
        node: &NodeDirs,
        kubeconfig: &Path,
        env: &[(&str, &str)],
        setup: &str,
    ) -> Self {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-ec"])
            .arg(format!("{setup}\nexec \"$@\""))
            .arg("sh")
            .arg(env!("CARGO_BIN_EXE_topodra-kubelet-plugin"));
        Self::spawn(cmd, node, kubeconfig, env, "127.0.0.1:0".parse().unwrap())
    }

    /// Like [`Plugin::start`], after the shell commands `setup` ran in the shell
    /// that then becomes the plugin (`exec`), so `$$` in them is the plugin's pid.
    pub fn start_after(
        node: &NodeDirs,
        kubeconfig: &Path,
        env: &[(&str, &str)],
        setup: &str,
    ) -> Self {
        let mut cmd = Command::new("sh");
        cmd.arg("-ec")
            .arg(format!("{setup}\nexec \"$@\""))
            .arg("sh")
            .arg(env!("CARGO_BIN_EXE_topodra-kubelet-plugin"));
        Self::spawn(cmd, node, kubeconfig, env, "127.0.0.1:0".parse().unwrap())
    }

    /// `path` as this process sees it inside the plugin's mount namespace (a file
    /// system mounted by [`Plugin::start_in_mount_namespace`]'s setup, say).
    pub fn in_namespace(&self, path: &Path) -> PathBuf {
        let inside = path.strip_prefix("/").unwrap_or(path);
        PathBuf::from(format!("/proc/{}/root", self.child.id())).join(inside)
    }

    fn spawn(
        mut cmd: Command,
        node: &NodeDirs,
        kubeconfig: &Path,
        env: &[(&str, &str)],
        http: SocketAddr,
    ) -> Self {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let log = node.path(&format!("plugin-{n}.log"));
        cmd.arg("serve")
            .arg(format!("--node-name={}", node.name))
            .arg(format!(
                "--kubelet-registry-dir={}",
                node.path("registry").display()
            ))
            .arg(format!(
                "--kubelet-plugins-dir={}",
                node.path("plugins").display()
            ))
            .arg(format!("--cdi-dir={}", node.cdi_dir().display()))
            .arg(format!("--http-addr={http}"))
            .arg(format!("--boot-id-file={}", node.path("boot_id").display()))
            .args(node.sim.plugin_args())
            .env("KUBECONFIG", kubeconfig)
            .env("TOPODRA_LOG", "info")
            // wait_live reads the bound address from the text log
            .env("TOPODRA_LOG_FORMAT", "text")
            .env_remove("TOPODRA_TEST_CRASH_AT")
            .env_remove("POD_UID")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if !node.path("boot_id").exists() {
            std::fs::write(node.path("boot_id"), "boot-1\n").unwrap();
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let (registration, dra) = match env.iter().find(|(k, _)| *k == "POD_UID") {
            Some((_, pod)) => (
                node.path("registry")
                    .join(format!("{DRIVER}-{pod}-reg.sock")),
                node.path("plugins")
                    .join(DRIVER)
                    .join(format!("dra-{pod}.sock")),
            ),
            None => (node.registration_socket(), node.dra_socket()),
        };
        let child = cmd.spawn().unwrap();
        Self {
            child,
            http,
            log,
            registration,
            dra,
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until this instance serves the kubelet: its HTTP endpoint is bound (the
    /// address read from its own log, so no other process answers for it),
    /// `/healthz` answers 200, and its registration and DRA sockets accept
    /// connections. `/healthz` alone is not enough: it answers 200 while the plugin
    /// waits to own the node state, before it creates the sockets.
    pub async fn wait_live(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("plugin exited with {status}:\n{}", self.logs());
            }
            if self.serving().await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "plugin not live in {timeout:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the HTTP endpoint is bound and `/healthz` answers 200, sockets
    /// or not (an instance that waits for the node state, or cannot bind them).
    pub async fn wait_healthy(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("plugin exited with {status}:\n{}", self.logs());
            }
            if let Some(addr) = self.bound_http() {
                self.http = addr;
                if http_get(addr, "/healthz").await.map(|(s, _)| s) == Some(200) {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "plugin not healthy in {timeout:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn serving(&mut self) -> bool {
        let Some(addr) = self.bound_http() else {
            return false;
        };
        self.http = addr;
        http_get(addr, "/healthz").await.map(|(s, _)| s) == Some(200)
            && UnixStream::connect(&self.registration).await.is_ok()
            && UnixStream::connect(&self.dra).await.is_ok()
    }

    /// The address the HTTP endpoint bound, from the plugin's log line
    /// `serving /metrics, /healthz and /readyz addr=127.0.0.1:PORT ...`.
    fn bound_http(&self) -> Option<SocketAddr> {
        self.logs()
            .lines()
            .filter(|l| l.contains("serving /metrics"))
            .find_map(|l| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix("addr=")?.parse().ok())
            })
    }

    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id() as i32;
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "plugin ignored SIGTERM:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the process to exit by itself (e.g. at a crash point).
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "plugin did not exit:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether this process may make a mount namespace and mount in it (root, or the
/// capability), as [`Plugin::start_in_mount_namespace`] needs.
pub fn can_unshare_mounts() -> bool {
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs -o size=4k tmpfs /mnt")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A plain HTTP/1 GET on loopback; `None` when nothing answers.
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((status, body))
}

pub async fn channel(path: &Path) -> Channel {
    let path = path.to_owned();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .unwrap()
}

pub async fn dra_client(node: &NodeDirs) -> v1::dra_plugin_client::DraPluginClient<Channel> {
    v1::dra_plugin_client::DraPluginClient::new(channel(&node.dra_socket()).await)
}

/// NodePrepareResources for the claims `uids` (see [`claim_ref`]), over a new connection.
pub async fn prepare(node: &NodeDirs, uids: &[&str]) -> v1::NodePrepareResourcesResponse {
    prepare_at(&node.dra_socket(), uids).await
}

/// [`prepare`] on the DRA socket at `socket`.
pub async fn prepare_at(socket: &Path, uids: &[&str]) -> v1::NodePrepareResourcesResponse {
    let claims = uids.iter().map(|u| claim_ref(u)).collect();
    v1::dra_plugin_client::DraPluginClient::new(channel(socket).await)
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
}

/// NodeUnprepareResources for the claims `uids`, over a new connection.
pub async fn unprepare(node: &NodeDirs, uids: &[&str]) -> v1::NodeUnprepareResourcesResponse {
    let claims = uids.iter().map(|u| claim_ref(u)).collect();
    dra_client(node)
        .await
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
}

pub fn claim_ref(uid: &str) -> v1::Claim {
    v1::Claim {
        namespace: "team-a".into(),
        uid: uid.into(),
        name: format!("claim-{uid}"),
    }
}

/// A ResourceClaim allocated on `node` with `devices`.
pub fn claim_json(uid: &str, node: &str, devices: &[&str], config: Option<Value>) -> Value {
    let results: Vec<Value> = devices
        .iter()
        .map(|d| json!({"request": "gpus", "driver": DRIVER, "pool": node, "device": d}))
        .collect();
    let mut allocation = json!({"devices": {"results": results}});
    if let Some(params) = config {
        allocation["devices"]["config"] =
            json!([{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}]);
    }
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "team-a", "name": format!("claim-{uid}"), "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": devices.len()}}]}},
        "status": {"allocation": allocation}
    })
}
