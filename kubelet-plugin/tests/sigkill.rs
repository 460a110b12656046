//! SIGKILL at random moments: the real plugin serves prepares and unprepares from
//! several clients at once, is killed without warning, and restarted. Whatever the
//! moment, a claim the kubelet was told is prepared still has its CDI spec and still
//! holds its GPU after the restart, one it was told is unprepared has none, and no
//! GPU is ever held by two claims. This is what lets a prepare answer before its
//! completion is saved (`docs/design.md`, "Crash safety of prepare").
//!
//! The moments are random; the seed is printed, and `TOPODRA_SIGKILL_SEED` replays a
//! run.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::*;
use topodra_mock_apiserver::MockApiServer;
use topodra_proto::dra::v1;

const GPUS: usize = 8;
/// Each worker owns the GPUs `w, w + WORKERS, ...`, so what it was last told about
/// a claim is what the plugin last did with it.
const WORKERS: usize = 4;
const ROUNDS: usize = 12;

/// What the kubelet was last told about a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Told {
    Prepared,
    Unprepared,
    /// The call was under way when the process died.
    Unknown,
}

/// Two claims per GPU (`a<i>`, `b<i>`), rivals for it.
fn claims() -> Vec<(String, usize)> {
    (0..GPUS)
        .flat_map(|i| [(format!("a{i}"), i), (format!("b{i}"), i)])
        .collect()
}

/// xorshift64*: enough to pick operations and moments, and replayable from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn spec_name(uid: &str) -> String {
    format!("k8s.{DRIVER}-claim_{uid}.json")
}

/// One worker's calls until one fails (the process is gone); returns what it was
/// told, claim by claim.
async fn work(
    node: &NodeDirs,
    mine: Vec<String>,
    mut rng: Rng,
    mut told: BTreeMap<String, Told>,
) -> BTreeMap<String, Told> {
    let mut client = dra_client(node).await;
    loop {
        let uid = mine[rng.below(mine.len() as u64) as usize].clone();
        let claims = vec![claim_ref(&uid)];
        let prepare = rng.below(2) == 0;
        let result = if prepare {
            client
                .node_prepare_resources(v1::NodePrepareResourcesRequest { claims })
                .await
                .map(|r| r.into_inner().claims[&uid].error.clone())
        } else {
            client
                .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims })
                .await
                .map(|r| r.into_inner().claims[&uid].error.clone())
        };
        match result {
            Ok(error) if error.is_empty() => {
                told.insert(
                    uid,
                    if prepare {
                        Told::Prepared
                    } else {
                        Told::Unprepared
                    },
                );
            }
            // Refused (its rival holds the GPU): nothing changed.
            Ok(error) => assert!(
                prepare && error.contains("already prepared for claim"),
                "{uid}: {error}"
            ),
            Err(_) => {
                told.insert(uid, Told::Unknown);
                return told;
            }
        }
    }
}

async fn started(node: &NodeDirs, kubeconfig: &std::path::Path) -> Plugin {
    let mut plugin = Plugin::start(node, kubeconfig, &[]);
    plugin.wait_live(Duration::from_secs(60)).await;
    plugin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigkill_at_any_moment_loses_no_answered_prepare_and_holds_no_gpu_twice() {
    let seed = std::env::var("TOPODRA_SIGKILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("TOPODRA_SIGKILL_SEED={seed}");
    let mut rng = Rng(seed);

    let node = NodeDirs::profile("dgx-h100");
    let api = MockApiServer::start().await.unwrap();
    api.add_node(&node.name, "node-uid-1");
    let kubeconfig = api.kubeconfig(node.root.path()).unwrap();
    for (uid, gpu) in claims() {
        api.put_claim(claim_json(&uid, &node.name, &[&format!("gpu-{gpu}")], None));
    }
    let mut told: BTreeMap<String, Told> = claims()
        .into_iter()
        .map(|(uid, _)| (uid, Told::Unprepared))
        .collect();

    for round in 0..ROUNDS {
        let mut plugin = started(&node, &kubeconfig).await;
        let node_ref = &node;
        let seeds: Vec<u64> = (0..WORKERS).map(|_| rng.next() | 1).collect();
        let kill_after = Duration::from_millis(20 + rng.below(400));
        let workers = (0..WORKERS).zip(seeds).map(|(w, seed)| {
            let mine: Vec<String> = claims()
                .into_iter()
                .filter(|(_, gpu)| gpu % WORKERS == w)
                .map(|(uid, _)| uid)
                .collect();
            let theirs = told
                .iter()
                .filter(|(uid, _)| mine.contains(uid))
                .map(|(u, t)| (u.clone(), *t))
                .collect();
            work(node_ref, mine, Rng(seed), theirs)
        });
        let killer = async {
            tokio::time::sleep(kill_after).await;
            plugin.child.kill().unwrap();
            plugin.child.wait().unwrap();
        };
        let (results, ()) = tokio::join!(futures::future::join_all(workers), killer);
        for worker in results {
            told.extend(worker);
        }
        drop(plugin);

        // What the restart must have kept, before anyone asks again: the runtime
        // may restart a container of a prepared claim without a new prepare.
        let plugin = started(&node, &kubeconfig).await;
        let specs = node.cdi_specs();
        let context = format!("round {round}, killed after {kill_after:?}, seed {seed}");
        for (uid, gpu) in claims() {
            let has_spec = specs.contains(&spec_name(&uid));
            match told[&uid] {
                Told::Prepared => assert!(has_spec, "{uid} was prepared: {context}"),
                Told::Unprepared => assert!(!has_spec, "{uid} was unprepared: {context}"),
                Told::Unknown => {}
            }
            let rival = if uid.starts_with('a') { "b" } else { "a" };
            assert!(
                !(has_spec && specs.contains(&spec_name(&format!("{rival}{gpu}")))),
                "gpu-{gpu} prepared for two claims: {context}"
            );
        }
        // A prepared claim still holds its GPU: its rival is refused, and asking
        // again answers as before.
        for (uid, gpu) in claims() {
            if told[&uid] != Told::Prepared {
                continue;
            }
            let rival = format!("{}{gpu}", if uid.starts_with('a') { "b" } else { "a" });
            let resp = prepare(&node, &[&rival]).await;
            assert!(
                resp.claims[&rival]
                    .error
                    .contains("already prepared for claim"),
                "{rival} got gpu-{gpu} held by {uid}: {context}: {:?}",
                resp.claims[&rival]
            );
            let resp = prepare(&node, &[&uid]).await;
            assert_eq!(resp.claims[&uid].error, "", "{uid}: {context}");
        }
        // Settle what the kill left unknown, so the next round starts from facts.
        let unknown: Vec<&str> = told
            .iter()
            .filter(|(_, t)| **t == Told::Unknown)
            .map(|(u, _)| u.as_str())
            .collect();
        let resp = unprepare(&node, &unknown).await;
        for uid in &unknown {
            assert_eq!(resp.claims[*uid].error, "", "{uid}: {context}");
        }
        for t in told.values_mut() {
            if *t == Told::Unknown {
                *t = Told::Unprepared;
            }
        }
        drop(plugin);
    }

    // Nothing leaked over all the rounds: once every claim is unprepared, every GPU
    // is free and no spec of ours is left.
    let mut plugin = started(&node, &kubeconfig).await;
    let all: Vec<String> = claims().into_iter().map(|(u, _)| u).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let resp = unprepare(&node, &all).await;
    assert!(resp.claims.values().all(|c| c.error.is_empty()));
    assert!(node.cdi_specs().is_empty(), "{:?}", node.cdi_specs());
    let firsts: Vec<String> = (0..GPUS).map(|i| format!("b{i}")).collect();
    let firsts: Vec<&str> = firsts.iter().map(String::as_str).collect();
    let resp = prepare(&node, &firsts).await;
    assert!(
        resp.claims.values().all(|c| c.error.is_empty()),
        "{:?}",
        resp.claims
    );
    assert!(plugin.terminate().success());
}
