//! DRA v1beta1, served by the v1 service.

use super::*;

/// v1beta1 carries the same messages without `share_id`; it is served by converting
/// to v1 and back, so both versions run the same code.
#[derive(Debug, Clone)]
pub struct DraServiceV1beta1(pub DraService);

fn claims_to_v1(claims: Vec<v1beta1::Claim>) -> Vec<v1::Claim> {
    claims
        .into_iter()
        .map(|c| v1::Claim {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        })
        .collect()
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for DraServiceV1beta1 {
    async fn node_prepare_resources(
        &self,
        request: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let claims = self
            .0
            .prepare(claims_to_v1(request.into_inner().claims))
            .await;
        let claims = claims
            .into_iter()
            .map(|(uid, r)| {
                let devices = r
                    .devices
                    .into_iter()
                    .map(|d| v1beta1::Device {
                        request_names: d.request_names,
                        pool_name: d.pool_name,
                        device_name: d.device_name,
                        cdi_device_ids: d.cdi_device_ids,
                    })
                    .collect();
                (
                    uid,
                    v1beta1::NodePrepareResourceResponse {
                        devices,
                        error: r.error,
                    },
                )
            })
            .collect();
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let claims = self
            .0
            .unprepare(claims_to_v1(request.into_inner().claims))
            .await;
        let claims = claims
            .into_iter()
            .map(|(uid, r)| {
                (
                    uid,
                    v1beta1::NodeUnprepareResourceResponse { error: r.error },
                )
            })
            .collect();
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}
