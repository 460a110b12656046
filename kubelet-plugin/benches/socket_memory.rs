//! What clients of the DRA socket can make the plugin hold in memory: the real
//! `topodra-kubelet-plugin serve` binary on a simulated DGX H100, and local clients
//! that open streams on its DRA socket and send most of a large NodePrepareResources
//! message without ever finishing it (the attack of the hardening review: 60 streams,
//! each 4 MiB - 1 byte of a declared 4 MiB message).
//!
//! Reported per scenario: the plugin's resident memory (VmRSS) idle, at the peak
//! (VmHWM) while the clients hold their streams, and after they close, with how many
//! calls were refused (RESOURCE_EXHAUSTED, or the stream or connection refused).
//! The reference is the idle plugin in the same run; the bound to compare with is
//! the chart's memory limit (256 Mi).
//!
//! `cargo bench -p topodra-kubelet-plugin --bench socket_memory` (or `make bench`)
//! runs it with the release binary and writes `target/bench/socket_memory.json`;
//! `cargo test --benches` runs a small smoke version.

#[path = "../tests/support/mod.rs"]
mod support;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use bytes::Bytes;
use support::*;
use tokio::net::UnixStream;
use topodra_mock_apiserver::MockApiServer;

const PATH: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
/// The largest message the plugin accepts; declared by every stream.
const MESSAGE: usize = 4 * 1024 * 1024;

struct Scenario {
    name: &'static str,
    connections: usize,
    streams_per_connection: usize,
}

struct Outcome {
    idle_kib: u64,
    peak_kib: u64,
    after_kib: u64,
    sent_mib: f64,
    /// Calls answered (refused) or never opened, of `streams` attempted.
    refused: usize,
    streams: usize,
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let scenarios: Vec<Scenario> = if full {
        vec![
            Scenario {
                name: "60 streams on 1 connection",
                connections: 1,
                streams_per_connection: 60,
            },
            Scenario {
                name: "60 streams on 4 connections",
                connections: 4,
                streams_per_connection: 15,
            },
            Scenario {
                name: "400 streams on 40 connections",
                connections: 40,
                streams_per_connection: 10,
            },
        ]
    } else {
        vec![Scenario {
            name: "smoke: 4 streams on 2 connections",
            connections: 2,
            streams_per_connection: 2,
        }]
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut report = String::new();
    let mut json = Vec::new();
    for s in &scenarios {
        let o = runtime.block_on(run(s));
        let _ = writeln!(
            report,
            "{:<34} idle {:>6.1} MiB  peak {:>6.1} MiB (+{:>5.1})  after {:>6.1} MiB  sent {:>7.1} MiB  refused {}/{}",
            s.name,
            mib(o.idle_kib),
            mib(o.peak_kib),
            mib(o.peak_kib.saturating_sub(o.idle_kib)),
            mib(o.after_kib),
            o.sent_mib,
            o.refused,
            o.streams,
        );
        json.push(serde_json::json!({
            "scenario": s.name,
            "connections": s.connections,
            "streams": o.streams,
            "idle_rss_kib": o.idle_kib,
            "peak_hwm_kib": o.peak_kib,
            "after_rss_kib": o.after_kib,
            "sent_mib": o.sent_mib,
            "refused": o.refused,
        }));
    }
    println!(
        "DRA socket memory (plugin binary, {} build)",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    print!("{report}");
    if full {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(
            dir.join("socket_memory.json"),
            serde_json::to_string_pretty(&json).unwrap_or_default(),
        );
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

async fn run(s: &Scenario) -> Outcome {
    let node = NodeDirs::profile("dgx-h100");
    let api = MockApiServer::start().await.expect("mock API server");
    api.add_node(&node.name, "node-uid-1");
    let kubeconfig = api.kubeconfig(node.root.path()).expect("kubeconfig");
    let mut plugin = Plugin::start(&node, &kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = plugin.child.id();
    let idle_kib = status_kib(pid, "VmRSS:");

    // Every stream: headers, the gRPC prefix declaring MESSAGE bytes, then all but
    // one byte of it, never the end. Sent as fast as flow control lets them through.
    let chunk = Bytes::from(vec![0u8; 64 * 1024]);
    let mut held = Vec::new();
    let mut refused = 0;
    let mut sent = 0usize;
    for _ in 0..s.connections {
        let Ok(io) = UnixStream::connect(node.dra_socket()).await else {
            refused += s.streams_per_connection;
            continue;
        };
        let Ok((client, conn)) = h2::client::handshake(io).await else {
            refused += s.streams_per_connection;
            continue;
        };
        tokio::spawn(conn);
        let Ok(mut client) = client.ready().await else {
            refused += s.streams_per_connection;
            continue;
        };
        for _ in 0..s.streams_per_connection {
            let request = http::Request::post(format!("http://localhost{PATH}"))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .expect("request");
            let (response, mut body) = match client.send_request(request, false) {
                Ok(r) => r,
                Err(_) => {
                    refused += 1;
                    continue;
                }
            };
            let mut prefix = vec![0u8];
            prefix.extend_from_slice(&(MESSAGE as u32).to_be_bytes());
            let mut left = MESSAGE - 1;
            let _ = body.send_data(Bytes::from(prefix), false);
            while left > 0 {
                let n = left.min(chunk.len());
                if body.send_data(chunk.slice(..n), false).is_err() {
                    break;
                }
                left -= n;
            }
            sent += MESSAGE - 1 - left;
            held.push((response, body));
            match client.clone().ready().await {
                Ok(c) => client = c,
                Err(_) => break,
            }
        }
    }
    // Give the server the time to read what flow control lets through, then see how
    // many calls were answered (refused) rather than left waiting for their bytes.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let peak_kib = status_kib(pid, "VmHWM:");
    for (response, _) in &mut held {
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(20), &mut *response).await {
            refused += 1;
        }
    }
    drop(held);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_kib = status_kib(pid, "VmRSS:");
    assert!(
        plugin.child.try_wait().ok().flatten().is_none(),
        "the plugin died:\n{}",
        plugin.logs()
    );
    plugin.terminate();
    Outcome {
        idle_kib,
        peak_kib,
        after_kib,
        sent_mib: sent as f64 / (1024.0 * 1024.0),
        refused,
        streams: s.connections * s.streams_per_connection,
    }
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
