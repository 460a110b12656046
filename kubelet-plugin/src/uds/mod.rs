//! Unix sockets for the kubelet-facing gRPC servers (registration and DRA).
//!
//! The kubelet dials plugins with grpc-go, which, depending on how it dials, sends
//! the socket path as the HTTP/2 `:authority`. h2 (under tonic) rejects such a
//! request with RST_STREAM(PROTOCOL_ERROR) before any handler runs, so registration
//! would fail. Every accepted connection therefore goes through a small HTTP/2
//! shim ([`authority`]) that replaces an authority h2 cannot parse with
//! `localhost` and leaves everything else as it was.
//!
//! ```ignore
//! let (mut guard, incoming) = uds::serve_uds(&socket_path)?;
//! tonic::transport::Server::builder()
//!     .add_service(registration)
//!     .serve_with_incoming_shutdown(incoming, sigterm)
//!     .await?;
//! guard.remove()?;
//! ```

mod authority;
pub(crate) use authority::{MAX_FRAME_SIZE, MAX_HEADER_LIST};
mod listener;
mod representation;
mod stream;
#[cfg(test)]
mod tests;

use std::path::Path;

pub(crate) use listener::{BindError, Incoming, SocketGuard, remove_leftover_sockets};

/// Listens on a unix socket at `path` for a gRPC server.
///
/// A stale socket at `path` is replaced; any other file there is an error, as is
/// a missing directory that cannot be created. The socket gets mode 0660. The
/// returned guard unlinks it when dropped or on [`SocketGuard::remove`]; keep it
/// alive as long as the server runs. The stream yields connections already wrapped
/// in the `:authority` shim and is meant for
/// `tonic::transport::Server::serve_with_incoming`.
///
/// Must be called from within a Tokio runtime.
pub(crate) fn serve_uds(path: impl AsRef<Path>) -> Result<(SocketGuard, Incoming), BindError> {
    let (listener, guard) = listener::bind(path.as_ref())?;
    Ok((guard, Incoming::new(listener)))
}
