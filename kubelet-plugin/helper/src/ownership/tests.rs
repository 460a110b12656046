use super::*;

fn fast() -> Timing {
    Timing {
        poll: Duration::from_millis(10),
        report: Duration::from_millis(50),
        abandoned: Duration::from_millis(100),
    }
}

#[tokio::test]
async fn a_second_instance_asks_and_gets_the_state_when_the_first_lets_go() {
    let dir = tempfile::tempdir().unwrap();
    let old = acquire(dir.path(), "pod-old", fast()).await.unwrap();
    assert_eq!(
        fs::read_to_string(dir.path().join(LOCK_FILE))
            .unwrap()
            .split(' ')
            .next(),
        Some("pod-old")
    );
    let path = dir.path().to_owned();
    let new = tokio::spawn(async move { acquire(&path, "pod-new", fast()).await.unwrap() });
    let who = tokio::time::timeout(Duration::from_secs(5), old.handover_requested(fast()))
        .await
        .unwrap();
    assert_eq!(who, "pod-new");
    assert!(!new.is_finished(), "the lock is still held");
    drop(old);
    let new = tokio::time::timeout(Duration::from_secs(5), new)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(new.name(), "pod-new");
    assert!(!dir.path().join(TAKEOVER_FILE).exists(), "request answered");
    assert!(
        fs::read_to_string(dir.path().join(LOCK_FILE))
            .unwrap()
            .starts_with("pod-new pid ")
    );
}

#[tokio::test]
async fn an_owner_does_not_answer_its_own_request() {
    let dir = tempfile::tempdir().unwrap();
    let owner = acquire(dir.path(), "pod-a", fast()).await.unwrap();
    write_atomic(&dir.path().join(TAKEOVER_FILE), "pod-a").unwrap();
    let r =
        tokio::time::timeout(Duration::from_millis(100), owner.handover_requested(fast())).await;
    assert!(r.is_err(), "no handover to itself");
}

#[tokio::test]
async fn a_dead_owner_never_blocks() {
    let dir = tempfile::tempdir().unwrap();
    // A stale request and an unlocked lock file, as a killed owner leaves them.
    fs::write(dir.path().join(LOCK_FILE), "pod-gone pid 1\n").unwrap();
    fs::write(dir.path().join(TAKEOVER_FILE), "pod-older").unwrap();
    let owner = tokio::time::timeout(Duration::from_secs(5), acquire(dir.path(), "pod-b", fast()))
        .await
        .unwrap()
        .unwrap();
    // The dead instances' request is cleared, not answered.
    let r =
        tokio::time::timeout(Duration::from_millis(100), owner.handover_requested(fast())).await;
    assert!(r.is_err(), "no handover to a stale request");
}

#[tokio::test]
async fn a_waiter_asks_again_when_its_request_is_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let owner = acquire(dir.path(), "pod-1", fast()).await.unwrap();
    let path = dir.path().to_owned();
    let waiter = tokio::spawn(async move { acquire(&path, "pod-3", fast()).await.unwrap() });
    tokio::time::timeout(Duration::from_secs(5), owner.handover_requested(fast()))
        .await
        .unwrap();
    // What a new owner does when it takes over in between.
    fs::remove_file(dir.path().join(TAKEOVER_FILE)).unwrap();
    let who = tokio::time::timeout(Duration::from_secs(5), owner.handover_requested(fast()))
        .await
        .unwrap();
    assert_eq!(who, "pod-3");
    drop(owner);
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.name(), "pod-3");
}

#[tokio::test]
async fn a_handover_nobody_takes_comes_back_to_the_old_owner() {
    let dir = tempfile::tempdir().unwrap();
    let old = acquire(dir.path(), "pod-old", fast()).await.unwrap();
    // The new pod asks, then is killed before it takes the lock.
    write_atomic(&dir.path().join(TAKEOVER_FILE), "pod-killed").unwrap();
    let who = old.handover_requested(fast()).await;
    assert_eq!(who, "pod-killed");
    let released = old.release();
    let back = tokio::time::timeout(
        Duration::from_secs(5),
        released.reclaim_when_abandoned(fast()),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(back.name(), "pod-old");
    assert!(
        !dir.path().join(TAKEOVER_FILE).exists(),
        "the dead pod's request is cleared, so the old owner does not hand over again"
    );
}

#[tokio::test]
async fn a_handover_that_is_taken_stays_taken() {
    let dir = tempfile::tempdir().unwrap();
    let old = acquire(dir.path(), "pod-old", fast()).await.unwrap();
    let path = dir.path().to_owned();
    let new = tokio::spawn(async move { acquire(&path, "pod-new", fast()).await.unwrap() });
    old.handover_requested(fast()).await;
    let released = old.release();
    let new = tokio::time::timeout(Duration::from_secs(5), new)
        .await
        .unwrap()
        .unwrap();
    // While the new owner lives, the old one never gets the state back.
    let reclaim = tokio::spawn(released.reclaim_when_abandoned(fast()));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !reclaim.is_finished(),
        "the old owner took a live owner's state"
    );
    // When the new owner dies, the old one serves again.
    drop(new);
    let back = tokio::time::timeout(Duration::from_secs(5), reclaim)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(back.name(), "pod-old");
}

#[test]
fn a_writable_dir_passes_the_probe_and_keeps_no_probe_file() {
    let dir = tempfile::tempdir().unwrap();
    probe_writable(dir.path(), &["checkpoint.json"]).unwrap();
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn a_lock_file_that_is_a_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join(LOCK_FILE)).unwrap();
    let err = acquire(dir.path(), "pod", fast()).await.unwrap_err();
    assert!(err.to_string().contains("owner.lock"), "{err}");
}

#[tokio::test]
async fn an_unusable_state_dir_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    fs::write(&file, "").unwrap();
    let err = acquire(&file.join("state"), "pod", fast())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not-a-dir"), "{err}");
}

#[tokio::test]
async fn try_acquire_takes_a_free_lock_and_never_asks() {
    let dir = tempfile::tempdir().unwrap();
    let owner = try_acquire(dir.path(), "pod-a").unwrap().expect("free");
    assert_eq!(
        named_owner(dir.path()).unwrap(),
        format!("pod-a pid {}", std::process::id())
    );
    assert!(try_acquire(dir.path(), "pod-b").unwrap().is_none(), "held");
    // No request was written: the owner is not asked to hand over.
    assert!(!dir.path().join(TAKEOVER_FILE).exists());
    let r =
        tokio::time::timeout(Duration::from_millis(100), owner.handover_requested(fast())).await;
    assert!(r.is_err());
    drop(owner);
    assert!(try_acquire(dir.path(), "pod-b").unwrap().is_some());
}

#[tokio::test]
async fn one_standing_by_takes_the_state_only_once_its_owner_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let owner = try_acquire(dir.path(), "pod-a").unwrap().unwrap();
    let path = dir.path().to_owned();
    let waiting = tokio::spawn(async move {
        Released::standing_by(&path, "pod-b")
            .reclaim_when_abandoned(fast())
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a live owner keeps it");
    assert!(!dir.path().join(TAKEOVER_FILE).exists(), "and is not asked");
    drop(owner);
    let taken = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(taken.name(), "pod-b");
}
