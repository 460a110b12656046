//! The client side: a gRPC channel over a unix socket, dialled as the kubelet does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// Dials the gRPC server on the unix socket at `path`: 2 s to connect, 5 s per
/// request. The URI only feeds `:authority`; the connector ignores it.
pub async fn connect(path: impl AsRef<Path>) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.as_ref().to_owned();
    Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}
