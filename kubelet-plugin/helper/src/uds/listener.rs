//! Binding the plugin sockets and cleaning them up.

use std::fs::{self, DirBuilder, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio_stream::Stream;
use tracing::{debug, warn};

use super::stream::ShimmedStream;

/// Group access lets a non-root kubelet group reach the socket; others never can.
pub(crate) const SOCKET_MODE: u32 = 0o660;
/// Mode for socket directories this module creates (the kubelet's usually exist).
const DIR_MODE: u32 = 0o750;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    #[error("refusing to replace {}: it is a {kind}, not a socket", path.display())]
    NotASocket { path: PathBuf, kind: &'static str },
    #[error("cannot inspect {}", path.display())]
    Inspect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot remove the stale socket {}", path.display())]
    RemoveStale {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create the socket directory {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot listen on {}", path.display())]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot set the mode of {}", path.display())]
    Permissions {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Unlinks the socket it was created for, on [`SocketGuard::remove`] or on drop.
///
/// Only that very socket (same device and inode) is removed: if another process
/// has since bound a new socket at the path, it is left alone.
#[derive(Debug)]
pub(crate) struct SocketGuard {
    path: PathBuf,
    identity: Option<(u64, u64)>,
    removed: bool,
}

impl SocketGuard {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the socket now, so the kubelet stops dialing it before the process
    /// exits (the SIGTERM path). Idempotent; drop does nothing afterwards.
    pub(crate) fn remove(&mut self) -> io::Result<()> {
        if self.removed {
            return Ok(());
        }
        self.removed = true;
        let metadata = match fs::symlink_metadata(&self.path) {
            Ok(metadata) => metadata,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        if self.identity != Some((metadata.dev(), metadata.ino())) {
            debug!(path = %self.path.display(), "socket was replaced by someone else; not removing it");
            return Ok(());
        }
        match fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        if let Err(error) = self.remove() {
            warn!(path = %self.path.display(), %error, "cannot remove socket");
        }
    }
}

/// Binds a listening unix socket at `path`, replacing a stale socket left by a
/// previous run but never any other kind of file. Needs a Tokio runtime.
pub(crate) fn bind(path: &Path) -> Result<(UnixListener, SocketGuard), BindError> {
    remove_stale(path)?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(parent)
            .map_err(|source| BindError::CreateDir {
                path: parent.to_owned(),
                source,
            })?;
    }
    let bind_error = |source| BindError::Bind {
        path: path.to_owned(),
        source,
    };
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(bind_error)?;
    // From here on the guard owns the file, so every error below cleans it up.
    let mut guard = SocketGuard {
        path: path.to_owned(),
        identity: None,
        removed: false,
    };
    let metadata = fs::symlink_metadata(path).map_err(|source| BindError::Inspect {
        path: path.to_owned(),
        source,
    })?;
    guard.identity = Some((metadata.dev(), metadata.ino()));
    fs::set_permissions(path, Permissions::from_mode(SOCKET_MODE)).map_err(|source| {
        BindError::Permissions {
            path: path.to_owned(),
            source,
        }
    })?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    let listener = UnixListener::from_std(listener).map_err(bind_error)?;
    Ok((listener, guard))
}

fn remove_stale(path: &Path) -> Result<(), BindError> {
    let metadata = match fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(BindError::Inspect {
                path: path.to_owned(),
                source,
            });
        }
    };
    let file_type = metadata.file_type();
    if !file_type.is_socket() {
        let kind = if file_type.is_dir() {
            "directory"
        } else if file_type.is_symlink() {
            "symbolic link"
        } else if file_type.is_file() {
            "regular file"
        } else {
            "special file"
        };
        return Err(BindError::NotASocket {
            path: path.to_owned(),
            kind,
        });
    }
    debug!(path = %path.display(), "removing stale socket");
    match fs::remove_file(path) {
        Err(source) if source.kind() != io::ErrorKind::NotFound => Err(BindError::RemoveStale {
            path: path.to_owned(),
            source,
        }),
        _ => Ok(()),
    }
}

/// Accepted connections, each wrapped in the `:authority` shim; feed it to
/// `tonic::transport::Server::serve_with_incoming`.
#[derive(Debug)]
pub(crate) struct Incoming {
    listener: UnixListener,
    /// One per connection served; see [`super::MAX_CONNECTIONS`].
    slots: Arc<Semaphore>,
}

impl Incoming {
    pub(crate) fn new(listener: UnixListener) -> Self {
        Self::with_max_connections(listener, super::MAX_CONNECTIONS)
    }

    pub(crate) fn with_max_connections(listener: UnixListener, max: usize) -> Self {
        Self {
            listener,
            slots: Arc::new(Semaphore::new(max.max(1))),
        }
    }
}

impl Stream for Incoming {
    type Item = io::Result<ShimmedStream>;

    /// Never ends. Accept errors (e.g. out of file descriptors) are yielded and the
    /// stream stays usable; tonic logs them and keeps accepting. A connection over
    /// the limit is closed at once: queueing it would still hold its socket, and
    /// its client learns immediately.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            let (stream, _) = ready!(this.listener.poll_accept(cx))?;
            match this.slots.clone().try_acquire_owned() {
                Ok(slot) => return Poll::Ready(Some(Ok(ShimmedStream::new(stream).holding(slot)))),
                Err(_) => debug!("plugin socket at its connection limit; closed a connection"),
            }
        }
    }
}

/// Removes the sockets other instances of this driver left in `dir`: those whose
/// file name `matches`, except `keep`. Called by the instance that owns the node's
/// state, so no other instance serves on them any more (one that handed over removed
/// its own); what is left was bound by a killed process, and the kubelet's plugin
/// watcher would keep failing to register it. A socket that still accepts a
/// connection is left alone, in case something else serves it. Returns the paths
/// removed.
pub(crate) async fn remove_leftover_sockets(
    dir: &Path,
    matches: impl Fn(&str) -> bool,
    keep: &Path,
) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if path == keep || !matches(name) {
            continue;
        }
        if !entry.file_type().is_ok_and(|t| t.is_socket()) {
            continue;
        }
        if tokio::net::UnixStream::connect(&path).await.is_ok() {
            warn!(path = %path.display(), "a socket of this driver that is not ours answers; leaving it");
            continue;
        }
        match fs::remove_file(&path) {
            Ok(()) => removed.push(path),
            Err(error) => warn!(path = %path.display(), %error, "cannot remove a leftover socket"),
        }
    }
    removed.sort();
    removed
}

#[cfg(test)]
mod tests;
