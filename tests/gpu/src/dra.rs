//! The kubelet's calls on the plugin's DRA socket (`dra.v1`), made directly: the
//! check has no kubelet, and these two calls are all the kubelet makes for a claim.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use topodra_proto::dra::v1;
use topodra_proto::pluginregistration::v1 as registration;

/// The claim as the kubelet names it in its calls.
#[derive(Debug, Clone)]
pub(crate) struct ClaimRef {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
}

impl ClaimRef {
    fn proto(&self) -> v1::Claim {
        v1::Claim {
            namespace: self.namespace.clone(),
            uid: self.uid.clone(),
            name: self.name.clone(),
        }
    }
}

async fn channel(socket: &Path) -> anyhow::Result<Channel> {
    let path = socket.to_owned();
    let channel = Endpoint::from_static("http://localhost")
        .timeout(Duration::from_secs(60))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    Ok(channel)
}

async fn client(socket: &Path) -> anyhow::Result<v1::dra_plugin_client::DraPluginClient<Channel>> {
    Ok(v1::dra_plugin_client::DraPluginClient::new(
        channel(socket).await?,
    ))
}

/// What the kubelet's plugin manager does with a new registration socket: GetInfo,
/// then NotifyRegistrationStatus(registered). Returns the plugin's info (name,
/// type, endpoint, versions) as the kubelet logs it.
pub(crate) async fn register(socket: &Path) -> anyhow::Result<String> {
    let mut client =
        registration::registration_client::RegistrationClient::new(channel(socket).await?);
    let info = client
        .get_info(registration::InfoRequest {})
        .await
        .context("GetInfo")?
        .into_inner();
    client
        .notify_registration_status(registration::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .context("NotifyRegistrationStatus")?;
    Ok(format!(
        "{} {} at {} ({})",
        info.r#type,
        info.name,
        info.endpoint,
        info.supported_versions.join(", ")
    ))
}

/// NodePrepareResources for `claim`: its CDI device ids, or the plugin's error.
pub(crate) async fn prepare(socket: &Path, claim: &ClaimRef) -> anyhow::Result<Prepared> {
    let response = client(socket)
        .await?
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![claim.proto()],
        })
        .await
        .context("NodePrepareResources")?
        .into_inner();
    let answer = response
        .claims
        .get(&claim.uid)
        .context("NodePrepareResources answered nothing for the claim")?;
    Ok(Prepared {
        error: answer.error.clone(),
        devices: answer
            .devices
            .iter()
            .map(|d| PreparedDevice {
                pool: d.pool_name.clone(),
                device: d.device_name.clone(),
                cdi_ids: d.cdi_device_ids.clone(),
            })
            .collect(),
    })
}

/// NodeUnprepareResources for `claim`: the plugin's error, empty when none.
pub(crate) async fn unprepare(socket: &Path, claim: &ClaimRef) -> anyhow::Result<String> {
    let response = client(socket)
        .await?
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![claim.proto()],
        })
        .await
        .context("NodeUnprepareResources")?
        .into_inner();
    response
        .claims
        .get(&claim.uid)
        .map(|a| a.error.clone())
        .context("NodeUnprepareResources answered nothing for the claim")
}

#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Prepared {
    pub(crate) error: String,
    pub(crate) devices: Vec<PreparedDevice>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct PreparedDevice {
    pub(crate) pool: String,
    pub(crate) device: String,
    pub(crate) cdi_ids: Vec<String>,
}
