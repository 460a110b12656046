use super::*;

#[tokio::test]
async fn binds_with_mode_and_creates_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plugins/gpu.topodra.dev/dra.sock");
    let (_listener, guard) = bind(&path).unwrap();
    assert_eq!(guard.path(), path);
    let metadata = fs::symlink_metadata(&path).unwrap();
    assert!(metadata.file_type().is_socket());
    assert_eq!(metadata.permissions().mode() & 0o777, SOCKET_MODE);
    let parent = fs::metadata(path.parent().unwrap()).unwrap();
    assert_eq!(parent.permissions().mode() & 0o777, DIR_MODE);
}

#[tokio::test]
async fn replaces_a_stale_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x-reg.sock");
    // A socket file whose listener is gone, as after a crash.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let (_listener, _guard) = bind(&path).unwrap();
    tokio::net::UnixStream::connect(&path).await.unwrap();
}

#[tokio::test]
async fn refuses_to_replace_anything_but_a_socket() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file.sock");
    fs::write(&file, b"keep me").unwrap();
    let err = bind(&file).unwrap_err();
    assert!(
        matches!(
            err,
            BindError::NotASocket {
                kind: "regular file",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("file.sock"), "{err}");
    assert_eq!(fs::read(&file).unwrap(), b"keep me");

    let sub = dir.path().join("dir.sock");
    fs::create_dir(&sub).unwrap();
    let err = bind(&sub).unwrap_err();
    assert!(
        matches!(
            err,
            BindError::NotASocket {
                kind: "directory",
                ..
            }
        ),
        "{err}"
    );
    assert!(sub.is_dir());

    let link = dir.path().join("link.sock");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    assert!(matches!(
        bind(&link),
        Err(BindError::NotASocket {
            kind: "symbolic link",
            ..
        })
    ));
    assert!(file.exists());
}

#[tokio::test]
async fn guard_removes_the_socket_on_drop_and_on_demand() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.sock");
    let (listener, guard) = bind(&path).unwrap();
    drop(guard);
    assert!(!path.exists());
    drop(listener);

    let (_listener, mut guard) = bind(&path).unwrap();
    guard.remove().unwrap();
    assert!(!path.exists());
    guard.remove().unwrap();
}

#[tokio::test]
async fn guard_leaves_a_socket_that_replaced_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.sock");
    let (_old_listener, old_guard) = bind(&path).unwrap();
    // A newer instance takes over the path before the old one exits.
    let (_new_listener, _new_guard) = bind(&path).unwrap();
    drop(old_guard);
    assert!(path.exists());
    tokio::net::UnixStream::connect(&path).await.unwrap();
}

#[tokio::test]
async fn leftover_sockets_of_killed_instances_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let path = |n: &str| dir.path().join(n);
    // A killed instance's socket: bound, then the listener dropped without unlink.
    drop(std::os::unix::net::UnixListener::bind(path("gpu.topodra.dev-dead-reg.sock")).unwrap());
    drop(std::os::unix::net::UnixListener::bind(path("gpu.topodra.dev-reg.sock")).unwrap());
    // Ours, one that answers, another driver's, and a file that is no socket.
    let (_ours, _g) = bind(&path("gpu.topodra.dev-me-reg.sock")).unwrap();
    let (_live, _g2) = bind(&path("gpu.topodra.dev-live-reg.sock")).unwrap();
    drop(std::os::unix::net::UnixListener::bind(path("other.example.com-x-reg.sock")).unwrap());
    fs::write(path("gpu.topodra.dev-file-reg.sock"), "").unwrap();

    let ours = |n: &str| {
        n.starts_with("gpu.topodra.dev-") && n.ends_with("-reg.sock")
            || n == "gpu.topodra.dev-reg.sock"
    };
    let removed =
        remove_leftover_sockets(dir.path(), ours, &path("gpu.topodra.dev-me-reg.sock")).await;
    assert_eq!(
        removed,
        [
            path("gpu.topodra.dev-dead-reg.sock"),
            path("gpu.topodra.dev-reg.sock")
        ]
    );
    for kept in [
        "gpu.topodra.dev-me-reg.sock",
        "gpu.topodra.dev-live-reg.sock",
        "other.example.com-x-reg.sock",
        "gpu.topodra.dev-file-reg.sock",
    ] {
        assert!(path(kept).exists(), "{kept}");
    }
}
