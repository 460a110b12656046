//! Liveness that exercises what the kubelet uses: a gRPC call on each socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use topodra_proto::dra::v1;
use topodra_proto::pluginregistration::v1::InfoRequest;
use topodra_proto::pluginregistration::v1::registration_client::RegistrationClient;

/// A gRPC channel over a Unix socket; the URI only feeds `:authority`.
pub(crate) async fn channel(path: &Path) -> Result<Channel, String> {
    let path: PathBuf = path.to_owned();
    Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .map_err(|e| e.to_string())
}

/// GetInfo on the registration socket and an empty NodePrepareResources on the DRA
/// socket: both servers accept connections and answer.
pub(crate) async fn check(registration: &Path, dra: &Path) -> Result<(), String> {
    let reg = channel(registration)
        .await
        .map_err(|e| format!("registration socket {}: {e}", registration.display()))?;
    RegistrationClient::new(reg)
        .get_info(InfoRequest {})
        .await
        .map_err(|e| {
            format!(
                "registration socket {}: GetInfo: {e}",
                registration.display()
            )
        })?;
    let dra_channel = channel(dra)
        .await
        .map_err(|e| format!("DRA socket {}: {e}", dra.display()))?;
    v1::dra_plugin_client::DraPluginClient::new(dra_channel)
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![] })
        .await
        .map_err(|e| format!("DRA socket {}: NodePrepareResources: {e}", dra.display()))?;
    Ok(())
}
