//! Liveness that exercises what the kubelet uses: a gRPC call on each socket.

use std::path::Path;

use dra_kubeletplugin::uds;
use topodra_proto::dra::v1;
use topodra_proto::pluginregistration::v1::InfoRequest;
use topodra_proto::pluginregistration::v1::registration_client::RegistrationClient;

/// GetInfo on the registration socket and an empty NodePrepareResources on the DRA
/// socket: both servers accept connections and answer.
pub(crate) async fn check(registration: &Path, dra: &Path) -> Result<(), String> {
    let reg = uds::connect(registration)
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
    let dra_channel = uds::connect(dra)
        .await
        .map_err(|e| format!("DRA socket {}: {e}", dra.display()))?;
    v1::dra_plugin_client::DraPluginClient::new(dra_channel)
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![] })
        .await
        .map_err(|e| format!("DRA socket {}: NodePrepareResources: {e}", dra.display()))?;
    Ok(())
}
