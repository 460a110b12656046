use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use super::*;
use topodra_model::checkpoint::{self, ClaimIdentity};

fn claim(uid: &str) -> ClaimIdentity {
    ClaimIdentity {
        uid: uid.to_owned(),
        namespace: "ns".to_owned(),
        name: uid.to_owned(),
    }
}

fn begin(cp: &mut Checkpoint, uid: &str) -> Result<(), CheckpointError> {
    checkpoint::begin_prepare(cp, claim(uid), Vec::new(), None, 1)
        .map(|_| ())
        .map_err(|e| CheckpointError::SavedWithOthers(e.to_string()))
}

/// A save that waits for a go from the test each time, and tells what it saved.
struct Gate {
    go: Mutex<mpsc::Receiver<Result<(), ()>>>,
    saved: mpsc::Sender<Vec<String>>,
}

fn gated() -> (
    Committer,
    mpsc::Sender<Result<(), ()>>,
    mpsc::Receiver<Vec<String>>,
) {
    let (go_tx, go_rx) = mpsc::channel();
    let (saved_tx, saved_rx) = mpsc::channel();
    let gate = Gate {
        go: Mutex::new(go_rx),
        saved: saved_tx,
    };
    let save: Save = Box::new(move |cp| {
        let verdict = gate.go.lock().unwrap().recv().unwrap();
        gate.saved
            .send(cp.claims.keys().cloned().collect())
            .unwrap();
        verdict.map_err(|()| CheckpointError::Io {
            action: "write",
            path: "checkpoint.json".into(),
            source: std::io::Error::other("disk full"),
        })
    });
    (
        Committer::with_save(save, Checkpoint::new("boot")),
        go_tx,
        saved_rx,
    )
}

/// Waits until memory holds `n` claims (the callers' changes are applied).
fn wait_for_claims(c: &Committer, n: usize) {
    for _ in 0..500 {
        if c.read(|cp| cp.claims.len()) == n {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("changes never applied");
}

#[test]
fn changes_arriving_during_a_save_share_the_next_one() {
    let (c, go, saved) = gated();
    std::thread::scope(|s| {
        let first = s.spawn(|| c.update(Some("a"), |cp| begin(cp, "a")));
        wait_for_claims(&c, 1);
        let rest: Vec<_> = ["b", "c", "d"]
            .into_iter()
            .map(|uid| {
                let c = &c;
                s.spawn(move || c.update(Some(uid), |cp| begin(cp, uid)))
            })
            .collect();
        wait_for_claims(&c, 4);
        go.send(Ok(())).unwrap();
        go.send(Ok(())).unwrap();
        first.join().unwrap().unwrap();
        for r in rest {
            r.join().unwrap().unwrap();
        }
    });
    assert_eq!(saved.try_recv().unwrap(), ["a"]);
    assert_eq!(saved.try_recv().unwrap(), ["a", "b", "c", "d"]);
    assert!(saved.try_recv().is_err(), "two saves for four changes");
}

#[test]
fn a_failed_save_undoes_every_change_it_carried_and_fails_each_caller() {
    let (c, go, saved) = gated();
    c.in_memory(false, |cp| begin(cp, "x")).unwrap();
    std::thread::scope(|s| {
        let first = s.spawn(|| c.update(Some("a"), |cp| begin(cp, "a")));
        wait_for_claims(&c, 2);
        let added = s.spawn(|| c.update(Some("b"), |cp| begin(cp, "b")));
        let removed = s.spawn(|| {
            c.update(Some("x"), |cp| {
                cp.remove("x");
                Ok::<_, CheckpointError>(())
            })
        });
        // Both later changes are applied before the first save ends.
        for _ in 0..500 {
            if c.read(|cp| cp.get("b").is_some() && cp.get("x").is_none()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        go.send(Ok(())).unwrap();
        go.send(Err(())).unwrap();
        first.join().unwrap().unwrap();
        let errors = [added.join().unwrap(), removed.join().unwrap()];
        for e in errors {
            let e = e.unwrap_err().to_string();
            assert!(e.contains("disk full"), "{e}");
        }
    });
    assert_eq!(saved.try_recv().unwrap(), ["a", "x"]);
    assert_eq!(saved.try_recv().unwrap(), ["a", "b"]);
    // Memory is as the last good save left it.
    let keys: Vec<String> = c.read(|cp| cp.claims.keys().cloned().collect());
    assert_eq!(keys, ["a", "x"]);
}

#[test]
fn a_refused_change_saves_nothing_and_changes_nothing() {
    let saves = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = saves.clone();
    let c = Committer::with_save(
        Box::new(move |_| {
            counter.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }),
        Checkpoint::new("boot"),
    );
    c.update(Some("a"), |cp| begin(cp, "a")).unwrap();
    let refused = c.update(Some("a"), |cp| {
        cp.remove("a");
        Err::<(), _>(CheckpointError::SavedWithOthers("refused".into()))
    });
    assert!(refused.is_err());
    assert_eq!(saves.load(Ordering::Relaxed), 1);
    assert!(c.read(|cp| cp.get("a").is_some()));
}
