//! Unix sockets for the kubelet-facing gRPC servers (registration and DRA).
//!
//! The kubelet dials plugins with grpc-go, which, depending on how it dials, sends
//! the socket path as the HTTP/2 `:authority`. h2 (under tonic) rejects such a
//! request with RST_STREAM(PROTOCOL_ERROR) before any handler runs, so registration
//! would fail. Every accepted connection therefore goes through a small HTTP/2
//! shim (`authority`) that replaces an authority h2 cannot parse with
//! `localhost` and leaves everything else as it was.
//!
//! ```no_run
//! # async fn f(registration: topodra_proto::pluginregistration::v1::registration_server::RegistrationServer<dra_kubeletplugin::registration::RegistrationService>) -> Result<(), Box<dyn std::error::Error>> {
//! use dra_kubeletplugin::uds;
//! let (mut guard, incoming) = uds::serve_uds("/var/lib/kubelet/plugins_registry/x-reg.sock")?;
//! uds::grpc_server()
//!     .add_service(registration)
//!     .serve_with_incoming_shutdown(incoming, std::future::pending())
//!     .await?;
//! guard.remove()?;
//! # Ok(()) }
//! ```

mod authority;
pub use authority::{MAX_FRAME_SIZE, MAX_HEADER_LIST};
mod client;
pub use client::connect;
mod listener;
mod representation;
mod sockets;
mod stream;
#[cfg(test)]
mod tests;

use std::path::Path;

pub use listener::{BindError, Incoming, SocketGuard, remove_leftover_sockets};
pub use sockets::PluginSockets;
pub use stream::ShimmedStream;

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
pub fn serve_uds(path: impl AsRef<Path>) -> Result<(SocketGuard, Incoming), BindError> {
    let (listener, guard) = listener::bind(path.as_ref())?;
    Ok((guard, Incoming::new(listener)))
}

/// A gRPC server with the header-list and frame-size limits the `:authority` shim
/// in front of it enforces, set here rather than left to defaults so the two cannot
/// drift apart.
pub fn grpc_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_max_header_list_size(MAX_HEADER_LIST as u32)
        .max_frame_size(MAX_FRAME_SIZE as u32)
}
