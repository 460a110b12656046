//! Test helpers: a gRPC client over a unix socket, as the kubelet dials.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// A gRPC channel over a unix socket; the URI only feeds `:authority`.
pub(crate) async fn channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_owned();
    Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}
