//! Unix sockets for the kubelet-facing gRPC servers (registration and DRA).
//!
//! The kubelet dials plugins with grpc-go, which, depending on how it dials, sends
//! the socket path as the HTTP/2 `:authority`. h2 (under tonic) rejects such a
//! request with RST_STREAM(PROTOCOL_ERROR) before any handler runs, so registration
//! would fail. Every accepted connection therefore goes through a small HTTP/2
//! shim (`authority`) that replaces an authority h2 cannot parse with
//! `localhost` and leaves everything else as it was.
//!
//! [`PluginBuilder`](crate::PluginBuilder) serves the registration and DRA services
//! on these sockets; [`PluginSockets`] names them, [`connect`] dials one as the
//! kubelet does.

mod authority;
pub use frames::{MAX_FRAME_SIZE, MAX_HEADER_LIST};
mod budget;
pub(crate) use budget::RequestBudgetLayer;
mod client;
mod frames;
pub use client::connect;
mod listener;
mod representation;
mod sockets;
mod stream;
#[cfg(test)]
mod tests;

use std::path::Path;

pub use listener::BindError;
pub(crate) use listener::{Incoming, SocketGuard, remove_leftover_sockets};
pub use sockets::PluginSockets;

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

/// Calls one connection may have in flight at once. The kubelet sends one call per
/// pod's claims (and holds one health stream), and grpc-go queues calls over the
/// limit on its side rather than failing them; without a limit one client could
/// open thousands of streams, each holding a message of up to 4 MiB.
pub const MAX_CONCURRENT_STREAMS: u32 = 16;

/// HTTP/2 flow-control windows: what a client may have sent that the server has not
/// read yet, per stream and per connection. Fixed (no adaptive window), so that is
/// all one connection makes the server buffer below tonic.
pub const STREAM_WINDOW: u32 = 256 << 10;
pub const CONNECTION_WINDOW: u32 = 1 << 20;

/// Connections one socket serves at once; more are closed as soon as they are
/// accepted. The kubelet keeps one per socket, the plugin's own liveness check
/// opens one at a time.
pub const MAX_CONNECTIONS: usize = 16;

/// Bytes of request messages all calls of one server may hold together while they
/// are received and worked on (the request budget layer): eight calls of the largest
/// message tonic accepts (4 MiB, about 60,000 claims).
pub const REQUEST_BUDGET: usize = 32 << 20;

/// The longest a call may take, its message's upload included: the kubelet's own
/// deadline for a NodePrepareResources call, after which no answer counts. It also
/// ends a call whose client stopped sending halfway, which would otherwise hold its
/// share of the [`REQUEST_BUDGET`] until the connection closes. (A streaming call's
/// limit ends with its response headers, so health streams stay open.)
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(45);

/// The server [`grpc_server`] builds.
pub(crate) type GrpcServer = tonic::transport::Server<
    tower::layer::util::Stack<RequestBudgetLayer, tower::layer::util::Identity>,
>;

/// A gRPC server with the header-list and frame-size limits the `:authority` shim
/// in front of it enforces, set here rather than left to defaults so the two cannot
/// drift apart, and the bounds on what one client can make it hold:
/// [`MAX_CONCURRENT_STREAMS`], [`STREAM_WINDOW`], [`CONNECTION_WINDOW`],
/// [`CALL_TIMEOUT`] and a [`RequestBudgetLayer`] of [`REQUEST_BUDGET`].
pub(crate) fn grpc_server() -> GrpcServer {
    grpc_server_with_budget(REQUEST_BUDGET)
}

/// [`grpc_server`] with a request budget of `bytes`.
pub(crate) fn grpc_server_with_budget(bytes: usize) -> GrpcServer {
    tonic::transport::Server::builder()
        .http2_max_header_list_size(MAX_HEADER_LIST as u32)
        .max_frame_size(MAX_FRAME_SIZE as u32)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .http2_adaptive_window(Some(false))
        .timeout(CALL_TIMEOUT)
        .layer(RequestBudgetLayer::new(bytes))
}
