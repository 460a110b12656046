use std::sync::Arc;
use std::sync::Mutex;

use super::*;

fn fast() -> Timing {
    let mut t = Timing::default();
    t.poll = Duration::from_millis(10);
    t.report = Duration::from_millis(50);
    t.abandoned = Duration::from_millis(100);
    t
}

const RETRY: Duration = Duration::from_millis(20);

/// Needs whose state check says what the test sets.
struct Fake {
    state: AtomicBool,
    other: Result<(), String>,
}

impl Fake {
    fn new(state: bool) -> Arc<Self> {
        Arc::new(Self {
            state: AtomicBool::new(state),
            other: Ok(()),
        })
    }
}

impl Needs for Fake {
    fn state(&self) -> Result<(), String> {
        if self.state.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err("cannot write: Read-only file system".to_owned())
        }
    }

    async fn others(&self) -> Result<(), String> {
        self.other.clone()
    }
}

/// Runs `take` for "pod-new" in the background; what it told `waiting` is kept.
fn take_in_background(
    dir: &Path,
    needs: &Arc<Fake>,
) -> (tokio::task::JoinHandle<Owner>, Arc<Mutex<Vec<String>>>) {
    let told = Arc::new(Mutex::new(Vec::new()));
    let (dir, needs, sink) = (dir.to_owned(), needs.clone(), told.clone());
    let task = tokio::spawn(async move {
        let waiting = move |told: Option<NotAsking<'_>>| {
            sink.lock().unwrap().push(match told {
                Some(n) => format!("{}: {}", n.owner, n.reason),
                None => "asking".to_owned(),
            });
        };
        take(&dir, "pod-new", fast(), RETRY, &*needs, &waiting).await
    });
    (task, told)
}

#[tokio::test]
async fn an_instance_that_cannot_use_the_state_does_not_ask_a_live_owner_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let old = ownership::acquire(dir.path(), "pod-old", fast())
        .await
        .unwrap();
    let needs = Fake::new(false);
    let (task, told) = take_in_background(dir.path(), &needs);

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished());
    assert!(
        !dir.path().join(ownership::TAKEOVER_FILE).exists(),
        "the owner was asked to hand over"
    );
    // Told once, with the owner and the reason, though it tried many times.
    let said = told.lock().unwrap().clone();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].starts_with("pod-old pid "), "{said:?}");
    assert!(said[0].contains("Read-only file system"), "{said:?}");

    // Once it can use the state it asks, as at any takeover.
    needs.state.store(true, Ordering::SeqCst);
    let who = tokio::time::timeout(Duration::from_secs(5), old.handover_requested(fast()))
        .await
        .unwrap();
    assert_eq!(who, "pod-new");
    assert_eq!(told.lock().unwrap().last().unwrap(), "asking");
    drop(old);
    let owner = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(owner, Owner::Owned(_)));
}

#[tokio::test]
async fn an_instance_that_took_the_state_and_cannot_use_it_keeps_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let old = ownership::acquire(dir.path(), "pod-old", fast())
        .await
        .unwrap();
    let needs = Fake::new(true);
    let (task, _) = take_in_background(dir.path(), &needs);
    tokio::time::timeout(Duration::from_secs(5), old.handover_requested(fast()))
        .await
        .unwrap();
    // The directory fails between the ask and the take.
    needs.state.store(false, Ordering::SeqCst);
    let released = old.release();
    let owner = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
    let Owner::ReadOnly { reason, lock } = owner else {
        panic!("owned a directory it cannot write");
    };
    assert!(reason.contains("Read-only file system"), "{reason}");
    assert!(lock.is_some(), "dropped the lock it took");
    // So the old owner does not take it back: the node does not go back and forth.
    let back = tokio::time::timeout(
        Duration::from_millis(500),
        released.reclaim_when_abandoned(fast()),
    )
    .await;
    assert!(back.is_err(), "the old owner took the state back");
    drop(lock);
}

#[tokio::test]
async fn a_free_lock_is_kept_while_the_state_is_unusable() {
    let dir = tempfile::tempdir().unwrap();
    let needs = Fake::new(false);
    let waiting = |_: Option<NotAsking<'_>>| panic!("nobody to wait for");
    let owner = take(dir.path(), "pod-a", fast(), RETRY, &*needs, &waiting).await;
    assert!(matches!(owner, Owner::ReadOnly { lock: Some(_), .. }));
    assert!(
        ownership::try_acquire(dir.path(), "pod-b")
            .unwrap()
            .is_none()
    );

    // It is usable again when the check passes; nothing else is asked for.
    needs.state.store(true, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(5), usable_again(RETRY, &*needs))
        .await
        .unwrap();
}

#[tokio::test]
async fn without_the_lock_the_reason_names_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(ownership::LOCK_FILE)).unwrap();
    let needs = Arc::new(Fake {
        state: AtomicBool::new(true),
        other: Err("cannot install nvidia-cdi-hook".to_owned()),
    });
    let waiting = |_: Option<NotAsking<'_>>| panic!("nobody to wait for");
    let owner = take(dir.path(), "pod-a", fast(), RETRY, &*needs, &waiting).await;
    let Owner::ReadOnly { reason, lock: None } = owner else {
        panic!("want read-only without the lock");
    };
    assert!(reason.contains("owner.lock"), "{reason}");
    assert!(reason.contains("nvidia-cdi-hook"), "{reason}");

    // Fixed: the lock is taken at the next try; another owner by then is left alone.
    std::fs::remove_dir(dir.path().join(ownership::LOCK_FILE)).unwrap();
    let other = ownership::try_acquire(dir.path(), "pod-b")
        .unwrap()
        .unwrap();
    let found = tokio::time::timeout(
        Duration::from_secs(5),
        retake(dir.path(), "pod-a", RETRY, &*needs),
    )
    .await
    .unwrap();
    assert!(matches!(found, Retaken::OwnedElsewhere));
    drop(other);
    let found = retake(dir.path(), "pod-a", RETRY, &*needs).await;
    assert!(matches!(
        found,
        Retaken::Owner(Owner::ReadOnly { lock: Some(_), .. })
    ));
}
