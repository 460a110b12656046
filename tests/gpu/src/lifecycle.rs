//! One claim's whole life on this node, as the kubelet and a runtime would live it,
//! with a verdict per step:
//!
//! 1. `plugin`: the real plugin binary serves against the mock API server and
//!    publishes this node's slices;
//! 2. `prepare`: a claim allocated one whole GPU of them is prepared through the
//!    DRA socket;
//! 3. `container-*`: its CDI spec, injected by the CDI library, runs in runc: the
//!    CUDA probe sees exactly the claim's GPU by UUID and runs a kernel, and
//!    `nvidia-smi -L` lists that GPU alone;
//! 4. `health`: the health monitor receives NVML's events for the node's GPUs;
//! 5. `unprepare` and `leftovers`: no CDI spec, checkpoint record, container or
//!    process of the claim is left;
//! 6. `plugin-stop`: the plugin ends cleanly on SIGTERM.
//!
//! The GPU's settings are only read: nothing here changes MIG or compute mode.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use topodra_mock_apiserver::MockApiServer;

use crate::container::{self, Seen, Tools};
use crate::dra::{self, ClaimRef};
use crate::verdict::Report;

const DRIVER: &str = "gpu.topodra.dev";
const NODE: &str = "gpu-check";

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    common: crate::Common,
    /// Scratch space: the kubelet's directories, the CDI specs, the bundle.
    #[arg(long)]
    work: PathBuf,
    /// The plugin binary.
    #[arg(long)]
    plugin: PathBuf,
    /// The directory holding the host's `dev/` (the plugin's `--dev-root`).
    #[arg(long, default_value = "/")]
    dev_root: PathBuf,
    #[command(flatten)]
    tools: Tools,
    /// Further `serve` flags: where the driver, NVML and the hook are.
    #[arg(last = true)]
    plugin_args: Vec<String>,
}

pub(crate) fn run(args: Args) -> anyhow::Result<bool> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(lifecycle(args))
}

async fn lifecycle(args: Args) -> anyhow::Result<bool> {
    let mut report = Report::new(&args.common.out, "lifecycle", args.common.dry_run)?;
    std::fs::create_dir_all(&args.work)?;
    let server = MockApiServer::start().await?;
    server.add_node(NODE, "6f0d4a8e-0000-4000-8000-000000000001");
    let kubeconfig = server.kubeconfig(&args.work)?;

    let mut plugin = PluginProcess::start(&args, &kubeconfig)?;
    let outcome = with_plugin(&args, &mut report, &server, &plugin).await;
    let status = plugin.stop();
    let log = std::fs::read_to_string(&plugin.log).unwrap_or_default();
    report.save("plugin.log", &log)?;
    if let Err(e) = outcome {
        report.check("aborted", false, format!("{e:#}"));
    } else {
        report.check(
            "plugin-stop",
            status.as_ref().is_ok_and(|s| s.success()),
            format!("{status:?} on SIGTERM"),
        );
    }
    report.finish()
}

/// Every step that needs the plugin running; an error ends the run early (its
/// verdict is the failing step's, then `aborted`).
async fn with_plugin(
    args: &Args,
    report: &mut Report,
    server: &MockApiServer,
    plugin: &PluginProcess,
) -> anyhow::Result<()> {
    // 1. The plugin serves and publishes.
    let (registration, slices) = match plugin.wait_serving(server, Duration::from_secs(90)).await {
        Ok(serving) => serving,
        Err(e) => {
            report.check("plugin", false, format!("{e:#}"));
            bail!("the plugin did not come up");
        }
    };
    report.save_json("slices.json", &slices)?;
    let gpus = whole_gpus(&slices);
    let Some(gpu) = gpus.first().cloned() else {
        report.check("plugin", false, "no whole GPU in the published slices");
        bail!("nothing to claim");
    };
    report.check(
        "plugin",
        true,
        format!(
            "registered ({registration}), ready; {} slice(s), {} whole GPU(s) published",
            slices.len(),
            gpus.len()
        ),
    );

    // 2. A claim for one GPU, prepared as the kubelet would.
    let claim = ClaimRef {
        namespace: "gpu-check".into(),
        name: "one-gpu".into(),
        uid: "5c1f6a2e-0000-4000-8000-00000000c1a1".into(),
    };
    server.put_claim(claim_object(&claim, &gpu));
    let cdi_before = list_dir(&plugin.cdi_dir)?;
    let prepared = dra::prepare(&plugin.dra_socket, &claim).await?;
    report.save_json("prepare.json", &prepared)?;
    let ids: Vec<String> = prepared
        .devices
        .iter()
        .flat_map(|d| d.cdi_ids.iter().cloned())
        .collect();
    let prepared_ok = prepared.error.is_empty()
        && prepared.devices.len() == 1
        && prepared.devices[0].device == gpu.device
        && !ids.is_empty();
    report.check(
        "prepare",
        prepared_ok,
        format!(
            "{} ({}): error {:?}, CDI ids {ids:?}",
            gpu.device, gpu.uuid, prepared.error
        ),
    );
    if !prepared_ok {
        bail!("the claim was not prepared");
    }
    for spec in list_dir(&plugin.cdi_dir)? {
        if !cdi_before.contains(&spec) {
            let text = std::fs::read(plugin.cdi_dir.join(&spec))?;
            report.save(&format!("cdi-{spec}"), text)?;
        }
    }

    // 3. The container.
    container_steps(args, report, &plugin.cdi_dir, &gpu, &ids)?;

    // 4. Health: the monitor receives NVML's event stream.
    let metrics = http_get(plugin.http, "/metrics").await.unwrap_or_default();
    report.save("metrics.txt", &metrics)?;
    let event_gpus = metric(&metrics, "topodra_health_event_gpus");
    let healthy = metric(&metrics, "topodra_device_health{state=\"healthy\"}");
    report.check(
        "health",
        event_gpus.is_some_and(|n| n >= gpus.len() as f64) && healthy.is_some_and(|n| n >= 1.0),
        format!(
            "NVML events received for {} of {} GPU(s); {} device(s) healthy",
            fmt_metric(event_gpus),
            gpus.len(),
            fmt_metric(healthy)
        ),
    );

    // 5. Unprepare, and nothing of the claim is left.
    let error = dra::unprepare(&plugin.dra_socket, &claim).await?;
    report.check("unprepare", error.is_empty(), format!("error {error:?}"));
    let cdi_after = list_dir(&plugin.cdi_dir)?;
    let checkpoint =
        std::fs::read_to_string(plugin.state_dir.join("checkpoint.json")).unwrap_or_default();
    report.save("checkpoint-after.json", &checkpoint)?;
    let containers = container::listed(&args.tools, &args.work.join("runc"))?;
    let probes = container_processes()?;
    report.check(
        "leftovers",
        cdi_after == cdi_before && !checkpoint.contains(&claim.uid) && containers.is_empty()
            && probes.is_empty(),
        format!(
            "CDI specs {cdi_after:?} (before the claim {cdi_before:?}); claim in the checkpoint: {}; \
             containers {containers:?}; container processes {probes:?}",
            checkpoint.contains(&claim.uid)
        ),
    );
    Ok(())
}

fn container_steps(
    args: &Args,
    report: &mut Report,
    cdi_dir: &Path,
    gpu: &Gpu,
    ids: &[String],
) -> anyhow::Result<()> {
    let bundle = args.work.join("bundle");
    let _ = std::fs::remove_dir_all(&bundle);
    std::fs::create_dir_all(&bundle)?;
    container::make_image(&args.tools, &bundle)?;
    let spec = container::base_spec(&args.tools, &bundle)?;
    let edits = container::inject(&args.tools, cdi_dir, &args.dev_root, &bundle, &spec, ids)?;
    report.save("cdi-edits.json", edits)?;
    report.save("config.json", std::fs::read(bundle.join("config.json"))?)?;
    let out = container::run(&args.tools, &args.work.join("runc"), &bundle, "gpu-check")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    report.save("container.stdout", &stdout)?;
    report.save("container.stderr", &out.stderr)?;
    let seen = Seen::parse(&stdout);
    report.save_json("container.json", &seen)?;
    report.check(
        "container-run",
        out.status.success() && seen.script_done,
        format!(
            "runc {}; the script finished: {}",
            out.status, seen.script_done
        ),
    );

    // Only the claim's GPU node is in the container.
    let gpu_nodes: Vec<&String> = seen
        .nodes
        .iter()
        .filter(|n| {
            n.strip_prefix("/dev/nvidia")
                .is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    let want_node = format!("/dev/nvidia{}", gpu.minor);
    report.check(
        "container-nodes",
        gpu_nodes.len() == 1 && *gpu_nodes[0] == want_node,
        format!("GPU nodes {gpu_nodes:?}, want [{want_node:?}]"),
    );

    // CUDA: loads, initialises, sees the claim's GPU and only it.
    let init = seen.cuda_field("init");
    let count = seen.cuda_field("count");
    report.check(
        "container-cuda",
        init == Some("0") && count == Some("1") && seen.probe_done,
        format!("{} (want init=0 count=1)", seen.cuda),
    );
    let uuids: Vec<&str> = seen.devices.iter().map(|(u, _)| u.as_str()).collect();
    report.check(
        "container-uuid",
        uuids == [gpu.uuid.as_str()],
        format!("CUDA sees {uuids:?}, the claim has {:?}", gpu.uuid),
    );
    report.check_real(
        "container-kernel",
        seen.kernel.starts_with("ok"),
        seen.kernel.clone(),
        "the simulated driver's libcuda cannot run PTX",
    );
    let smi_uuid = format!("(UUID: {})", gpu.uuid);
    let smi_ok = seen.smi_rc == Some(0)
        && seen.smi.len() == 1
        && seen.smi[0].starts_with("GPU 0:")
        && seen.smi[0].contains(&smi_uuid);
    if report.dry_run() {
        report.check(
            "container-nvidia-smi-ran",
            seen.smi_rc == Some(0),
            format!("exit {:?}", seen.smi_rc),
        );
    }
    report.check_real(
        "container-nvidia-smi",
        smi_ok,
        format!("exit {:?}: {:?}", seen.smi_rc, seen.smi),
        "the simulated driver's nvidia-smi prints only its banner",
    );
    Ok(())
}

/// A whole GPU of the published slices: what the claim is allocated.
#[derive(Debug, Clone)]
struct Gpu {
    pool: String,
    device: String,
    uuid: String,
    minor: i64,
}

fn whole_gpus(slices: &[Value]) -> Vec<Gpu> {
    let mut gpus = Vec::new();
    for slice in slices {
        let pool = slice["spec"]["pool"]["name"].as_str().unwrap_or_default();
        for d in slice["spec"]["devices"].as_array().into_iter().flatten() {
            let attr = &d["attributes"];
            if attr["type"]["string"] != "gpu" {
                continue;
            }
            gpus.push(Gpu {
                pool: pool.to_owned(),
                device: d["name"].as_str().unwrap_or_default().to_owned(),
                uuid: attr["uuid"]["string"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                minor: attr["minor"]["int"].as_i64().unwrap_or(-1),
            });
        }
    }
    gpus.sort_by_key(|g| g.minor);
    gpus
}

/// The claim as the scheduler leaves it: allocated `gpu` on this node.
fn claim_object(claim: &ClaimRef, gpu: &Gpu) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": claim.namespace, "name": claim.name, "uid": claim.uid},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": 1}}
        ]}},
        "status": {"allocation": {
            "devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": gpu.pool, "device": gpu.device}
            ]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}
            ]}]}
        }}
    })
}

/// The plugin process and where it serves.
struct PluginProcess {
    child: Child,
    log: PathBuf,
    http: SocketAddr,
    registration_socket: PathBuf,
    dra_socket: PathBuf,
    cdi_dir: PathBuf,
    state_dir: PathBuf,
}

impl PluginProcess {
    fn start(args: &Args, kubeconfig: &Path) -> anyhow::Result<Self> {
        let work = &args.work;
        let plugins = work.join("plugins");
        let cdi_dir = work.join("cdi");
        let state_dir = plugins.join(DRIVER);
        for d in [&plugins, &cdi_dir, &work.join("registry")] {
            std::fs::create_dir_all(d)?;
        }
        let http = free_port()?;
        let log = work.join("plugin.log");
        let child = Command::new(&args.plugin)
            .arg("serve")
            .arg(format!("--node-name={NODE}"))
            .arg(format!(
                "--kubelet-registry-dir={}",
                work.join("registry").display()
            ))
            .arg(format!("--kubelet-plugins-dir={}", plugins.display()))
            .arg(format!("--cdi-dir={}", cdi_dir.display()))
            .arg(format!("--dev-root={}", args.dev_root.display()))
            .arg(format!("--http-addr={http}"))
            .args(&args.plugin_args)
            .env("KUBECONFIG", kubeconfig)
            .env("TOPODRA_LOG", "info")
            .env_remove("POD_UID")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", args.plugin.display()))?;
        Ok(Self {
            child,
            log,
            http,
            registration_socket: work.join("registry").join(format!("{DRIVER}-reg.sock")),
            dra_socket: state_dir.join("dra.sock"),
            cdi_dir,
            state_dir,
        })
    }

    /// Registers the plugin as the kubelet would once its registration socket
    /// appears, then waits for `/readyz` (registered, slices in sync), the DRA
    /// socket, and this node's slices. Returns the registration and the slices.
    async fn wait_serving(
        &self,
        server: &MockApiServer,
        timeout: Duration,
    ) -> anyhow::Result<(String, Vec<Value>)> {
        let until = Instant::now() + timeout;
        let mut registered = None;
        loop {
            if registered.is_none() && self.registration_socket.exists() {
                registered = dra::register(&self.registration_socket).await.ok();
            }
            let ready = http_get(self.http, "/readyz").await.is_some();
            let slices: Vec<Value> = server
                .slices()
                .into_iter()
                .filter(|s| s["spec"]["nodeName"] == NODE)
                .collect();
            if let Some(info) = registered.as_ref().filter(|_| ready)
                && self.dra_socket.exists()
                && !slices.is_empty()
            {
                return Ok((info.clone(), slices));
            }
            if Instant::now() > until {
                bail!(
                    "not serving after {timeout:?}: registration {}, /readyz {}, DRA socket {}, \
                     {} slice(s); see plugin.log",
                    registered.as_deref().unwrap_or("not done"),
                    if ready { "200" } else { "not 200" },
                    if self.dra_socket.exists() {
                        "there"
                    } else {
                        "absent"
                    },
                    slices.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGTERM, then the exit status (SIGKILL after 30 s).
    fn stop(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let pid = libc::pid_t::try_from(self.child.id())?;
        // SAFETY: kill has no memory preconditions; the pid is our own child's,
        // not yet reaped, so it names no other process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.child.kill()?;
        bail!("still running 30 s after SIGTERM (killed)")
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> anyhow::Result<SocketAddr> {
    // Released before the plugin binds it; nothing else on this machine races for
    // loopback ports during the check.
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The body of a 200 answer to a plain HTTP/1 GET on loopback.
async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.split_whitespace()
        .nth(1)
        .is_some_and(|s| s == "200")
        .then(|| body.to_owned())
}

/// The value of the series `name` (with its labels, as exposed) in `text`.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

fn fmt_metric(v: Option<f64>) -> String {
    v.map_or_else(|| "(absent)".to_owned(), |v| v.to_string())
}

fn list_dir(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// Processes of the container still running: its probe or `nvidia-smi -L` (the
/// runtime's own record is checked apart, with `runc list`).
fn container_processes() -> anyhow::Result<Vec<String>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        if entry.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let ours = argv.first().is_some_and(|a| a == "/probe")
            || (argv.first().is_some_and(|a| a == "nvidia-smi")
                && argv.get(1).is_some_and(|a| a == "-L"));
        if ours {
            found.push(format!(
                "{}: {}",
                entry.file_name().to_string_lossy(),
                argv.join(" ")
            ));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_read_by_series() {
        let text = "# HELP x\ntopodra_health_event_gpus 8\n\
                    topodra_device_health{state=\"healthy\"} 7\n";
        assert_eq!(metric(text, "topodra_health_event_gpus"), Some(8.0));
        assert_eq!(
            metric(text, "topodra_device_health{state=\"healthy\"}"),
            Some(7.0)
        );
        assert_eq!(metric(text, "topodra_health"), None);
    }

    #[test]
    fn whole_gpus_skip_mig_devices_and_sort_by_minor() {
        let slices = vec![json!({"spec": {"pool": {"name": "n"}, "devices": [
            {"name": "gpu-1", "attributes": {"type": {"string": "gpu"},
                "uuid": {"string": "GPU-b"}, "minor": {"int": 1}}},
            {"name": "gpu-0-mig-1g", "attributes": {"type": {"string": "mig"},
                "uuid": {"string": "MIG-a"}, "minor": {"int": 0}}},
            {"name": "gpu-0", "attributes": {"type": {"string": "gpu"},
                "uuid": {"string": "GPU-a"}, "minor": {"int": 0}}}
        ]}})];
        let gpus = whole_gpus(&slices);
        assert_eq!(
            gpus.iter().map(|g| g.device.as_str()).collect::<Vec<_>>(),
            ["gpu-0", "gpu-1"]
        );
        assert_eq!(gpus[0].uuid, "GPU-a");
        assert_eq!(gpus[0].pool, "n");
    }
}
