//! The prepare path, end to end: the real `topodra-kubelet-plugin serve` binary on a
//! simulated DGX H100 node (8 GPUs, fake NVML, matching hwloc topology), claims read
//! from the mock API server over loopback HTTP, NodePrepareResources and
//! NodeUnprepareResources called over the real DRA Unix socket.
//!
//! Every prepare includes the claim GET from the API server, one synced checkpoint
//! save (the started record: a temp file fsync, a rename and a directory fsync) and
//! the CDI spec write (temp file, rename, no fsync); its completion rides on the next
//! save (`docs/design.md`, "Crash safety of prepare"). Every unprepare removes the spec
//! and saves the checkpoint once.
//!
//! Speed is reported as ratios to references measured in the same run, so numbers stay
//! comparable across machines:
//! - an empty NodePrepareResourcesRequest (zero claims) on the same socket and
//!   connection: the floor of one gRPC call through the Unix-socket/`:authority` shim;
//! - a bare GET of the same claim from the mock API server over a kept-alive HTTP/1.1
//!   connection: the floor of the API read that each prepare makes.
//!
//! `cargo bench -p topodra-kubelet-plugin --bench prepare` (or `make bench`) runs it
//! with the release plugin binary and writes `target/bench/prepare.json`. Without
//! `--bench` (e.g. `cargo test --benches`) it runs a few iterations as a smoke test.
//! `TOPODRA_BENCH_ITERS` and `TOPODRA_BENCH_WARMUP` override the iteration counts
//! (1000 after 100 warm-up); measuring stops early after `TOPODRA_BENCH_BUDGET_S`
//! seconds (90), so a disk with slow fsyncs keeps the run short, with fewer samples.

#[path = "../tests/support/mod.rs"]
mod support;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use topodra_mock_apiserver::MockApiServer;
use topodra_proto::dra::v1;

const PLUGIN_BIN: &str = env!("CARGO_BIN_EXE_topodra-kubelet-plugin");
const PROFILE: &str = "dgx-h100";
const GPUS: usize = 8;

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (default_iters, default_warmup) = if full { (1000, 100) } else { (5, 1) };
    let iters = env_count("TOPODRA_BENCH_ITERS", default_iters);
    let warmup = env_count("TOPODRA_BENCH_WARMUP", default_warmup);
    let budget = Duration::from_secs(env_count("TOPODRA_BENCH_BUDGET_S", 90) as u64);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(full, iters, warmup, budget));
}

fn env_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a count")),
        Err(_) => default,
    }
}

/// The series measured, in the order of each iteration.
#[derive(Clone, Copy)]
enum Series {
    Empty,
    ClaimGet,
    Prepare1,
    Unprepare1,
    Prepare8,
    Unprepare8,
}

const SERIES: [(Series, &str, &str); 6] = [
    (Series::Empty, "empty_call", "empty NodePrepare (ref)"),
    (Series::ClaimGet, "claim_get", "bare claim GET (ref)"),
    (Series::Prepare1, "prepare_1gpu", "prepare 1 GPU"),
    (Series::Unprepare1, "unprepare_1gpu", "unprepare 1 GPU"),
    (Series::Prepare8, "prepare_8gpu", "prepare 8 GPUs"),
    (Series::Unprepare8, "unprepare_8gpu", "unprepare 8 GPUs"),
];

async fn run(full: bool, iters: usize, warmup: usize, budget: Duration) {
    let started = Instant::now();
    let node = NodeDirs::profile(PROFILE);
    let api = MockApiServer::start().await.expect("mock API server");
    api.add_node(&node.name, "node-uid-1");
    let kubeconfig = api.kubeconfig(node.root.path()).expect("kubeconfig");

    let total = warmup + iters;
    let all: Vec<String> = (0..GPUS).map(|i| format!("gpu-{i}")).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    for i in 0..total {
        api.put_claim(claim_json(&uid(1, i), &node.name, &all[..1], None));
        api.put_claim(claim_json(&uid(8, i), &node.name, &all, None));
    }

    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(120)).await;
    // Let the first publish finish so that it does not overlap the measurements.
    let deadline = Instant::now() + Duration::from_secs(30);
    while api.slices().is_empty() {
        assert!(
            Instant::now() < deadline,
            "no ResourceSlice:\n{}",
            plugin.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = plugin.child.id();
    let rss_idle = proc_status_kib(pid);

    let mut dra = dra_client(&node).await;
    let mut http = KeepAlive::connect(api.addr()).await;
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(iters); SERIES.len()];

    let measuring = Instant::now();
    for i in 0..total {
        if i > warmup && measuring.elapsed() > budget {
            println!(
                "time budget of {budget:?} spent: stopping after {} measured iterations",
                i - warmup
            );
            break;
        }
        let mut record = |series: Series, d: Duration| {
            if i >= warmup {
                samples[series as usize].push(d);
            }
        };

        let t = Instant::now();
        let resp = dra
            .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![] })
            .await
            .expect("empty NodePrepareResources")
            .into_inner();
        record(Series::Empty, t.elapsed());
        assert!(resp.claims.is_empty());

        let path = format!(
            "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/claim-{}",
            uid(1, i)
        );
        let t = Instant::now();
        let (code, len) = http.get(&path).await;
        record(Series::ClaimGet, t.elapsed());
        assert!(code == 200 && len > 0, "claim GET answered {code}");

        for (gpus, prep, unprep) in [
            (1, Series::Prepare1, Series::Unprepare1),
            (GPUS, Series::Prepare8, Series::Unprepare8),
        ] {
            let claim = claim_ref(&uid(gpus, i));
            let t = Instant::now();
            let resp = dra
                .node_prepare_resources(v1::NodePrepareResourcesRequest {
                    claims: vec![claim.clone()],
                })
                .await
                .expect("NodePrepareResources")
                .into_inner();
            record(prep, t.elapsed());
            let one = &resp.claims[&claim.uid];
            assert!(
                one.error.is_empty() && one.devices.len() == gpus,
                "prepare {}: {one:?}\n{}",
                claim.uid,
                plugin.logs()
            );

            let t = Instant::now();
            let resp = dra
                .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
                    claims: vec![claim.clone()],
                })
                .await
                .expect("NodeUnprepareResources")
                .into_inner();
            record(unprep, t.elapsed());
            let one = &resp.claims[&claim.uid];
            assert!(
                one.error.is_empty(),
                "unprepare {}: {one:?}\n{}",
                claim.uid,
                plugin.logs()
            );
        }
    }
    assert!(node.cdi_specs().is_empty(), "every spec was removed");

    let rss_after = proc_status_kib(pid);
    let (_, metrics) = http_get(plugin.http, "/metrics")
        .await
        .expect("the plugin's /metrics");
    let server_side = ServerSide {
        prepare: mean_of(&metrics, "topodra_prepare_duration_seconds"),
        unprepare: mean_of(&metrics, "topodra_unprepare_duration_seconds"),
    };
    let status = plugin.terminate();
    assert!(status.success(), "{status}\n{}", plugin.logs());

    let measured = samples[Series::Empty as usize].len();
    let stats: Vec<Stats> = samples.iter().map(|s| Stats::of(s)).collect();
    let env = Environment::probe(node.root.path());
    let report = Report {
        full,
        iters: measured,
        warmup,
        stats,
        rss_idle,
        rss_after,
        server_side,
        env,
        elapsed: started.elapsed(),
    };
    print!("{}", report.table());
    let out = target_dir().join("bench");
    std::fs::create_dir_all(&out).expect("create target/bench");
    let file = out.join(if full {
        "prepare.json"
    } else {
        "prepare-smoke.json"
    });
    let text = serde_json::to_string_pretty(&report.json()).expect("json");
    std::fs::write(&file, text + "\n").expect("write the report");
    println!("wrote {}", file.display());
}

fn uid(gpus: usize, i: usize) -> String {
    format!("bench{gpus}-{i:05}")
}

/// `target/`, from the plugin binary's path (`target/<profile>/topodra-kubelet-plugin`).
fn target_dir() -> PathBuf {
    Path::new(PLUGIN_BIN)
        .parent()
        .and_then(Path::parent)
        .map(Path::to_owned)
        .expect("the plugin binary lives under target/<profile>/")
}

/// A minimal HTTP/1.1 client on one kept-alive connection, as the plugin's client
/// keeps its connection to the API server.
struct KeepAlive {
    stream: TcpStream,
    host: SocketAddr,
    buf: Vec<u8>,
}

impl KeepAlive {
    async fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Self {
            stream,
            host: addr,
            buf: Vec::with_capacity(16 * 1024),
        }
    }

    /// Returns the status and the body's length; the body is read and dropped.
    async fn get(&mut self, path: &str) -> (u16, usize) {
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\n\r\n",
            self.host
        );
        self.stream.write_all(req.as_bytes()).await.expect("send");
        self.buf.clear();
        let head_end = loop {
            if let Some(at) = find(&self.buf, b"\r\n\r\n") {
                break at + 4;
            }
            self.fill().await;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        let code: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("status line");
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .expect("a Content-Length (the mock server sends whole bodies)");
        while self.buf.len() < head_end + len {
            self.fill().await;
        }
        (code, len)
    }

    async fn fill(&mut self) {
        let n = self.stream.read_buf(&mut self.buf).await.expect("read");
        assert!(n > 0, "the API server closed the connection");
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// VmHWM (peak resident set) and VmRSS of a process, in KiB.
#[derive(Clone, Copy, Default)]
struct Rss {
    hwm_kib: u64,
    rss_kib: u64,
}

fn proc_status_kib(pid: u32) -> Rss {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Rss {
        hwm_kib: field("VmHWM:"),
        rss_kib: field("VmRSS:"),
    }
}

/// The plugin's own view: mean time inside its prepare and unprepare handlers (claim
/// read and state machine; no gRPC framing), from its `/metrics` histograms. Over every
/// call, warm-up included, 1- and 8-GPU claims together.
#[derive(Clone, Copy)]
struct ServerSide {
    prepare: Option<(Duration, u64)>,
    unprepare: Option<(Duration, u64)>,
}

/// Mean and count of the `outcome="ok"` series of a histogram in Prometheus text.
fn mean_of(metrics: &str, name: &str) -> Option<(Duration, u64)> {
    let value = |suffix: &str| -> Option<f64> {
        let key = format!("{name}_{suffix}{{outcome=\"ok\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse().ok())
    };
    let (sum, count) = (value("sum")?, value("count")?);
    (count > 0.0).then(|| (Duration::from_secs_f64(sum / count), count as u64))
}

struct Stats {
    n: usize,
    p50: Duration,
    p90: Duration,
    p99: Duration,
    max: Duration,
    mean: Duration,
}

impl Stats {
    fn of(samples: &[Duration]) -> Self {
        let mut s = samples.to_vec();
        s.sort();
        // Nearest rank: the smallest sample with at least p% of samples at or below it.
        let pct = |p: f64| {
            if s.is_empty() {
                return Duration::ZERO;
            }
            let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
            s[rank.clamp(1, s.len()) - 1]
        };
        let sum: Duration = s.iter().sum();
        Self {
            n: s.len(),
            p50: pct(50.0),
            p90: pct(90.0),
            p99: pct(99.0),
            max: s.last().copied().unwrap_or_default(),
            mean: sum.checked_div(s.len().max(1) as u32).unwrap_or_default(),
        }
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() {
        f64::NAN
    } else {
        a.as_secs_f64() / b.as_secs_f64()
    }
}

/// Where and on what the run happened.
struct Environment {
    cpus: usize,
    temp_dir: PathBuf,
    temp_fs: String,
    temp_mount: String,
    plugin_bin: String,
    plugin_profile: String,
}

impl Environment {
    fn probe(temp: &Path) -> Self {
        let temp = temp.canonicalize().unwrap_or_else(|_| temp.to_owned());
        let (mount, fs) = mount_of(&temp);
        let profile = Path::new(PLUGIN_BIN)
            .parent()
            .and_then(Path::file_name)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Self {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            temp_dir: temp,
            temp_fs: fs,
            temp_mount: mount,
            plugin_bin: PLUGIN_BIN.to_owned(),
            plugin_profile: profile,
        }
    }
}

/// The mount point and filesystem type holding `path` (longest matching mount).
fn mount_of(path: &Path) -> (String, String) {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_dev, mount, fs) = (f.next()?, f.next()?, f.next()?);
            let mount = mount.replace("\\040", " ");
            path.starts_with(&mount).then(|| (mount, fs.to_owned()))
        })
        .max_by_key(|(m, _)| m.len())
        .unwrap_or_else(|| ("?".into(), "?".into()))
}

struct Report {
    full: bool,
    iters: usize,
    warmup: usize,
    stats: Vec<Stats>,
    rss_idle: Rss,
    rss_after: Rss,
    server_side: ServerSide,
    env: Environment,
    elapsed: Duration,
}

impl Report {
    fn get(&self, s: Series) -> &Stats {
        &self.stats[s as usize]
    }

    fn table(&self) -> String {
        let empty = self.get(Series::Empty);
        let claim_get = self.get(Series::ClaimGet);
        let mut t = String::new();
        let _ = writeln!(
            t,
            "\nprepare path: plugin `serve` ({} build) on a simulated {PROFILE} node ({GPUS} GPUs), \
             mock API server on loopback",
            self.env.plugin_profile
        );
        let _ = writeln!(
            t,
            "{} iterations after {} warm-up; {} CPUs; checkpoint and CDI dir on {} ({})",
            self.iters, self.warmup, self.env.cpus, self.env.temp_fs, self.env.temp_mount
        );
        let _ = writeln!(
            t,
            "\n| {:<24} | {:>4} | {:>9} | {:>9} | {:>9} | {:>9} | {:>10} | {:>10} | {:>10} |",
            "series",
            "n",
            "p50 µs",
            "p90 µs",
            "p99 µs",
            "max µs",
            "p50/empty",
            "p99/empty",
            "p50/GET"
        );
        let _ = writeln!(
            t,
            "|{:-<26}|{:->6}|{:->11}|{:->11}|{:->11}|{:->11}|{:->12}|{:->12}|{:->12}|",
            "", ":", ":", ":", ":", ":", ":", ":", ":"
        );
        for (series, _, label) in SERIES {
            let s = self.get(series);
            let _ = writeln!(
                t,
                "| {:<24} | {:>4} | {:>9.0} | {:>9.0} | {:>9.0} | {:>9.0} | {:>10.2} | {:>10.2} | {:>10.2} |",
                label,
                s.n,
                us(s.p50),
                us(s.p90),
                us(s.p99),
                us(s.max),
                ratio(s.p50, empty.p50),
                ratio(s.p99, empty.p99),
                ratio(s.p50, claim_get.p50),
            );
        }
        let _ = writeln!(
            t,
            "\nplugin RSS: peak (VmHWM) {} KiB after the runs; {} KiB peak before them; \
             current {} KiB",
            self.rss_after.hwm_kib, self.rss_idle.hwm_kib, self.rss_after.rss_kib
        );
        if let (Some((p, pn)), Some((u, un))) =
            (self.server_side.prepare, self.server_side.unprepare)
        {
            let _ = writeln!(
                t,
                "plugin-side mean (its /metrics, warm-up included, 1 and 8 GPUs): \
                 prepare {:.0} µs over {pn} calls, unprepare {:.0} µs over {un} calls",
                us(p),
                us(u)
            );
        }
        let _ = writeln!(t, "total wall time {:.1} s", self.elapsed.as_secs_f64());
        t
    }

    fn json(&self) -> Value {
        let empty = self.get(Series::Empty);
        let claim_get = self.get(Series::ClaimGet);
        let series: serde_json::Map<String, Value> = SERIES
            .iter()
            .map(|&(series, key, label)| {
                let s = self.get(series);
                (
                    key.to_owned(),
                    json!({
                        "label": label,
                        "n": s.n,
                        "p50_us": us(s.p50),
                        "p90_us": us(s.p90),
                        "p99_us": us(s.p99),
                        "max_us": us(s.max),
                        "mean_us": us(s.mean),
                        "p50_over_empty_p50": ratio(s.p50, empty.p50),
                        "p99_over_empty_p99": ratio(s.p99, empty.p99),
                        "p50_over_claim_get_p50": ratio(s.p50, claim_get.p50),
                    }),
                )
            })
            .collect();
        json!({
            "bench": "prepare",
            "mode": if self.full { "bench" } else { "smoke" },
            "node_profile": PROFILE,
            "gpus": GPUS,
            "iterations": self.iters,
            "warmup": self.warmup,
            "references": {
                "empty_call": "NodePrepareResources with zero claims, same socket and connection",
                "claim_get": "GET of the claim from the mock API server, kept-alive HTTP/1.1 on loopback",
            },
            "prepare_includes": "claim GET, checkpoint save x1 (file fsync + rename + dir fsync), CDI spec write (rename, no fsync)",
            "series": series,
            "plugin_rss_kib": {
                "peak_after_runs": self.rss_after.hwm_kib,
                "peak_before_runs": self.rss_idle.hwm_kib,
                "current_after_runs": self.rss_after.rss_kib,
            },
            "plugin_side_mean_us": {
                "prepare": self.server_side.prepare.map(|(d, _)| us(d)),
                "prepare_calls": self.server_side.prepare.map(|(_, n)| n),
                "unprepare": self.server_side.unprepare.map(|(d, _)| us(d)),
                "unprepare_calls": self.server_side.unprepare.map(|(_, n)| n),
            },
            "environment": {
                "cpus": self.env.cpus,
                "temp_dir": self.env.temp_dir.display().to_string(),
                "temp_fs": self.env.temp_fs,
                "temp_mount": self.env.temp_mount,
                "plugin_bin": self.env.plugin_bin,
                "plugin_profile": self.env.plugin_profile,
            },
            "wall_time_s": self.elapsed.as_secs_f64(),
        })
    }
}
