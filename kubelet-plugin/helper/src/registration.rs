//! The plugin registration service the kubelet's plugin manager calls on the socket in
//! its registry directory.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tonic::{Request, Response, Status};
use topodra_proto::pluginregistration::v1::{
    DRA_PLUGIN_TYPE, InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    registration_server::Registration,
};

#[derive(Debug)]
pub struct RegistrationService {
    pub driver_name: String,
    /// The DRA socket, as the kubelet (on the host) sees it.
    pub endpoint: String,
    pub supported_versions: Vec<String>,
    pub registered: Arc<AtomicBool>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: DRA_PLUGIN_TYPE.to_owned(),
            name: self.driver_name.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: self.supported_versions.clone(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!("registered with the kubelet");
        } else {
            tracing::error!(error = %status.error, "the kubelet refused the registration");
        }
        self.registered
            .store(status.plugin_registered, Ordering::SeqCst);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
